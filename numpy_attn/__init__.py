"""numpy_attn: the building blocks of a Transformer in pure NumPy, each with a hand-written backward.

Every operation is a pair of pure functions in its own module:

    out, cache = <op>_forward(inputs..., params..., hyper...)
    grads      = <op>_backward(dout, cache)

Its twin in ``torch_attn/<op>.py`` is the same forward in plain PyTorch, whose backward autograd
supplies; ``parity_tests/test_<op>.py`` proves the two agree.

Reading order, leaf to root:

    embedding        token lookup and its scatter-add backward
    positional       sinusoidal position encoding (and learned positions as an embedding)
    softmax          softmax and log-softmax, stable and mask-aware
    linear           x @ w + b with w stored (C_in, C_out)
    attention        scaled dot-product attention: masks, causal, dropout, grouped-query heads
    masks            causal (both alignments), key padding and packed-sequence masks
    multi_head       split/merge heads and multi-head (self- or cross-) attention
    small_gpt        the smallest model: embedding + sinusoidal encoding + attention + linear head
    layer_norm       layer normalisation, biased variance, eps inside the square root
    erf              the error function in pure NumPy, to float64 precision
    gelu             GELU, exact (with erf) and tanh-approximated
    dropout          inverted dropout with an explicit random generator
    feed_forward     linear C -> 4C, GELU, linear 4C -> C
    block            the pre-LayerNorm transformer block
    gpt              GPT (GPT-2's architecture): embeddings, blocks, final layer norm, LM head
    kv_cache         the keys and values of past tokens, for decoding
    loss             cross-entropy on log-softmax
    optim            AdamW and SGD over nested parameter dicts
    flash_attention  tiled attention with online softmax: no T x S matrix
    flex_attention   score and mask modifiers, block masks that skip empty tiles
    rope             rotary position embedding: half-split or interleaved, linear or llama3 scaling
    rms_norm         root-mean-square norm (no centring, no bias), as in Llama
    swiglu           SiLU-gated feed-forward: (silu(x @ gate) * (x @ up)) @ down
    llama            a Llama-style model: RMS norm, RoPE, grouped-query heads, SwiGLU
    qwen3            Qwen3: Llama with QK-norm per head
    olmo2            OLMo 2: Llama with the norms after the sublayers, QK-norm over the projection

Tuned versions of an operation (no twin, tested against the readable one) live in
``numpy_attn/kernels/``. The ``numpy-attn`` command (walkthrough, show, tokenize, train, generate)
lives in the sibling package ``attn_cli``, which imports this one, never the reverse.

Dimension key (the same in torch_attn and the README):

    B   batch                 T   query length          S   key length
    C   model width           nh  heads                 hs  head size (C = nh * hs)
    V   vocabulary size

Importing this package imports NumPy only, never torch (the tokenizer lives in attn_cli).
"""

__version__ = "0.1.0"
