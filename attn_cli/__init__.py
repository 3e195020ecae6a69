"""attn_cli: the ``numpy-attn`` command (walkthrough, show, tokenize, train, generate, site).

The commands import the operations of ``numpy_attn`` and, where they compare with PyTorch, of
``torch_attn``; the operations never import the commands.
"""
