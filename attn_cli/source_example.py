"""The numbers of the source's worked example, typed in once for the walkthrough and its tests.

The source is a Chinese-language tutorial series on building a large language model from scratch:
reading notes on chapter 3 (attention) of Sebastian Raschka's "Build a Large Language Model (From
Scratch)". Its printed tables use the sentence below, 3-dimensional embeddings (in token order),
and W_query, W_key, W_value drawn by ``torch.manual_seed(123); torch.rand(3, 2)`` three times.
``numpy-attn walkthrough --example source`` reproduces those tables.
"""

SOURCE_DESCRIPTION = ("a Chinese-language tutorial series on building an LLM from scratch (reading "
                      "notes on chapter 3 of Sebastian Raschka's \"Build a Large Language Model "
                      "(From Scratch)\")")

SOURCE_EXAMPLE = {
    "text": "The cat sat on the mat",
    "embeddings": [[2.2315, -0.7460, -0.0614], [-0.1235, 0.4462, 0.7265],
                   [1.4900, -2.0396, 1.0440], [-0.6735, -0.5763, -0.9291],
                   [0.7707, 0.5180, 0.2458], [0.6508, 0.1164, -1.3904]],
    "w_query": [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]],
    "w_key": [[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]],
    "w_value": [[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274]],
}
