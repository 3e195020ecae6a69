"""numpy_attn: the building blocks of a Transformer in pure NumPy, each with a hand-written backward.

Every operation is a pair of pure functions in its own module:

    out, cache = <op>_forward(inputs..., params..., hyper...)
    grads      = <op>_backward(dout, cache)

Its twin in ``torch_attn/<op>.py`` is the same forward in plain PyTorch, whose backward autograd
supplies; ``parity_tests/test_<op>.py`` proves the two agree.

Reading order, leaf to root:

    embedding   token lookup and its scatter-add backward
    positional  sinusoidal position encoding (and learned positions as an embedding)
    softmax     softmax and log-softmax, stable and mask-aware
    linear      x @ w + b with w stored (C_in, C_out)

Dimension key (the same in torch_attn and the README):

    B   batch                 T   query length          S   key length
    C   model width           nh  heads                 hs  head size (C = nh * hs)
    V   vocabulary size

Importing this package imports NumPy only: never torch, and tiktoken only when a tokenizer
function is first called.
"""

__version__ = "0.1.0"
