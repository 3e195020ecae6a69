"""The decoder shell every language model here shares, and the steps of its attention.

    x      = wte[ids]                          (times embed_scale: Gemma)
    x      = block_i(x)                        each family's block, i = 0 .. n_layer - 1
    x      = rms_norm(x)                       (scaling by 1 + w: Gemma)
    logits = x @ head.w                        head.w = wte^T with tied weights
    logits = c * tanh(logits / c)              (logit_softcap c: Gemma 2)

``decoder_forward`` runs that loop around a family's block and takes what differs as arguments;
each family's file (numpy_attn/llama.py, qwen3.py, ...) calls it with its own block and says
which of the bracketed steps it takes. The attention of those blocks is a short composition of
the steps below, each with its backward: ``heads_forward`` (project, split into heads),
``rotate_forward``, ``attend_forward`` (attention with the key/value cache, merge, project out);
a family inserts its own steps between them (Qwen3's QK-norm) or passes them to attention (Gemma
2's softcap, gpt-oss's sinks).

``logits_to_keep`` is transformers' keyword and means what it does there: an int N > 0 keeps the
last N positions' logits (all T when N >= T), 0 or None keeps all. Generation reads the last
position's logits only, and the head is the widest matmul of a small model (C x V, 768 x 50257 in
GPT-2): a 512-token prompt then costs one row of it instead of 512. The backward hands the dropped
positions a zero gradient, as the full forward's backward with zero dlogits there.

With tied weights (Press and Wolf, 2017) wte is used twice, as the embedding and (transposed) as
the output layer, so its gradient is the sum of the two uses: ``dwte = dwte_embedding + dwte_head``.
In float16 and bfloat16 each use's gradient comes rounded to wte's dtype and their sum is rounded
once more, as PyTorch's autograd accumulates the gradients of a tensor used twice.

``for_backward=False`` (every model's forward takes it) keeps nothing for a backward: each block's
cache, which holds that block's activations, is dropped as soon as the block returns, and the forward
returns ``(logits, None)``; what ``torch.no_grad()`` does for the twin. Generation runs so: a forward
over 256 prompt tokens of GPT-2 124M then holds one block's activations at a time, not twelve.

float16 and bfloat16: every operation computes in float32 and rounds its output once to the
params' dtype (docs/precision.md), so the residual stream, the keys and values a cache holds and
the logits are in that dtype, as in transformers' models run in bfloat16. Each residual add rounds
its float32 sum once (NumPy's add of two float16 or bfloat16 arrays, as PyTorch's add kernel), and
an embedding scale is rounded to the params' dtype first, then multiplied and rounded once.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import (
    check_dout,
    check_model_attn_mask,
    check_no_past,
    check_positions,
    check_rng,
    check_token_ids,
)
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_attn.attention_sinks import attention_sinks_backward, attention_sinks_forward
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.flex_attention import (
    FlexCache,
    create_block_mask,
    flex_attention_backward,
    flex_attention_forward,
    soft_cap,
)
from numpy_attn.kv_cache import KVCache, init_kv_cache, kv_cache_update
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.masks import causal_mask, sliding_window_mask
from numpy_attn.multi_head import merge_heads, split_heads
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.rope import rope_backward, rope_forward
from numpy_attn.softcap import logit_softcap_backward, logit_softcap_forward

# -- the decoder shell ----------------------------------------------------------------------------

def init_decoder_params(config, rng, dtype, init_block):
    """The shell's parameters around the blocks: {"wte": (V, C), "blocks": {"0": init_block(0), ...},
    "norm": {"w": (C,)}, ["head": {"w": (C, V)}]}. Embedding and head are drawn from N(0, 0.02^2), as
    Hugging Face's initializer_range, in the order wte, the blocks, head; the norm starts at 1; the
    head exists only without tied weights."""
    V, C = config.vocab_size, config.n_embd
    params = {"wte": rng.normal(0, 0.02, (V, C)).astype(dtype), "blocks": {}}          # (V, C)
    for i in range(config.n_layer):
        params["blocks"][str(i)] = init_block(i)
    params["norm"] = {"w": np.ones(C, dtype)}                                           # (C,)
    if not config.tie_weights:
        params["head"] = {"w": rng.normal(0, 0.02, (C, V)).astype(dtype)}               # (C, V)
    return params


def normal_init(rng, dtype):
    """The initialiser of a family's weights: shape -> an array of that shape drawn from N(0, 0.02^2)
    by ``rng``, in ``dtype`` (Hugging Face's initializer_range)."""
    return lambda *shape: rng.normal(0, 0.02, shape).astype(dtype)


class DecoderCache(NamedTuple):
    """The sub-caches in forward order."""

    wte: tuple
    blocks: list
    norm: tuple
    head: tuple                               # HeadCache
    embed_scale: np.floating | None = None    # the embedding's multiplier (Gemma), in its dtype
    logit_softcap: tuple | None = None        # the cap on the logits' cache (Gemma 2)
    hidden: tuple = ()                        # the residual stream: the embedding's output, each block's
                                              # (B, T, C), by reference (numpy_attn.testing.check_model)


def decoder_forward(ids, params, config, config_class, block_forward, *, positions, attn_mask, kv_cache, rng,
                    logits_to_keep=None, for_backward=True, embed_scale=None, norm_offset=0.0,
                    norm_round_xhat=True, logit_softcap=None, layer_options=None, padding_idx=None):
    """Logits for integer ``ids`` (B, T) -> (B, N, V), N = T unless logits_to_keep. Returns
    ``(logits, cache)``, or ``(logits, None)`` with ``for_backward=False``.

    ``config`` must be a ``config_class`` (each family's params differ); ``block_forward(x, params,
    config, positions, *, attn_mask, kv_cache, **layer_options(i))`` makes block i. What the
    families change around the blocks: ``embed_scale`` multiplies the embedding, ``norm_offset``
    and ``norm_round_xhat`` go to the final norm (rms_norm_forward's offset and round_xhat),
    ``logit_softcap`` caps the logits, ``padding_idx`` is the embedding row that gets no gradient
    (Llama 4's pad_token_id, as transformers' nn.Embedding). The keywords are llama_forward's.
    """
    ids = check_decoder_inputs(ids, config, config_class, positions, attn_mask, kv_cache, rng, logits_to_keep)
    check_for_backward(for_backward)
    B, T = ids.shape
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    positions = np.arange(past, past + T) if positions is None else np.asarray(positions)
    wte = params["wte"]
    # Causal, aligned bottom-right (the T new tokens follow the past ones); one mask with the caller's.
    attn_mask = None if attn_mask is None else attn_mask & causal_mask(T, past + T, "bottom_right")
    # 1: token embedding (positions enter through RoPE inside attention)
    x, wte_cache = embedding_forward(ids, wte, padding_idx)                   # (B, T) -> (B, T, C)
    if embed_scale is not None:   # Gemma: times sqrt(C), rounded to the model's dtype first
        # In the model's dtype even for float16 and bfloat16, as transformers' Gemma normalizer; the
        # product of two such numbers is exact in float32, so the multiply rounds once.
        embed_scale = x.dtype.type(embed_scale)
        x = x * embed_scale                                                   # (B, T, C)
    # 2: the blocks, in order; each reads and appends to its own layer of the cache
    block_caches, hidden = [], ([x] if for_backward else [])
    for i in range(config.n_layer):
        layer_cache = None if kv_cache is None else kv_cache.layer(i)
        options = {} if layer_options is None else layer_options(i)
        x, block_cache = block_forward(x, params["blocks"][str(i)], config, positions,
                                       attn_mask=attn_mask, kv_cache=layer_cache, **options)
        if for_backward:
            block_caches.append(block_cache)                                  # x: (B, T, C)
            hidden.append(x)
        del block_cache   # without for_backward its activations are freed now, not after the next block
    # 3: final RMS norm
    x, norm_cache = rms_norm_forward(x, params["norm"]["w"], config.rms_eps, norm_offset,
                                     norm_round_xhat)                         # (B, T, C)
    # 4: the output layer
    logits, head_cache = head_forward(x, params, config.tie_weights, logits_to_keep)   # (B, T, C) -> (B, N, V)
    softcap_cache = None
    if logit_softcap is not None:   # Gemma 2: c * tanh(logits / c), on the kept logits
        logits, softcap_cache = logit_softcap_forward(logits, logit_softcap)   # (B, N, V)
    if not for_backward:
        return logits, None
    cache = DecoderCache(wte_cache, block_caches, norm_cache, head_cache, embed_scale, softcap_cache, tuple(hidden))
    return logits, cache


def decoder_backward(op, dlogits, cache, block_backward):
    """Gradients: dlogits (B, N, V) -> dparams, with the nesting of the params; ``block_backward``
    undoes each block, ``op`` names the model in the message about a wrong dlogits."""
    if cache.logit_softcap is not None:   # undoes logits = c * tanh(logits / c)
        check_dout(op, dlogits, cache.head.shape, cache.head.dtype, name="dlogits")
        dlogits = logit_softcap_backward(dlogits, cache.logit_softcap)       # (B, N, V)
    # 4: undoes logits = x[:, -N:] @ head_w.
    dx, dhead = head_backward(op, dlogits, cache.head)                        # (B, N, V) -> (B, T, C)
    # 3: undoes x = rms_norm(x).
    dx, dnorm = rms_norm_backward(dx, cache.norm)                             # (B, T, C)
    # 2: undoes the blocks, the last one first.
    dx, dblocks = blocks_backward(dx, cache.blocks, block_backward)           # (B, T, C)
    if cache.embed_scale is not None:   # undoes x = x * embed_scale
        dx = dx * cache.embed_scale
    # 1: undoes x = wte[ids].
    dparams = {"wte": embedding_backward(dx, cache.wte), "blocks": dblocks, "norm": dnorm}
    return with_head(dparams, dhead, cache.head)


def decoder_backward_of(op, block_backward):
    """The backward of the model ``op`` (named so in messages), whose blocks ``block_backward``
    undoes: decoder_backward as a family's public ``<op>_backward(dlogits, cache)``."""
    def backward(dlogits, cache):
        return decoder_backward(op, dlogits, cache, block_backward)

    backward.__name__ = backward.__qualname__ = f"{op}_backward"
    backward.__doc__ = ("Gradients: dlogits (B, N, V) (N = T unless logits_to_keep) -> dparams, with the "
                        f"nesting of the params; undoes {op}_forward.")
    return backward


class Sublayer(NamedTuple):
    """A sublayer's forward and backward, for a block that takes its attention as an argument."""

    forward: object
    backward: object


# -- the steps of a decoder's attention -----------------------------------------------------------

class AttentionCache(NamedTuple):
    """The shared steps' caches, in forward order, then the family's QK-norm's (None without one)."""

    qkv: tuple
    rope: tuple
    attend: tuple                   # AttendCache: attention, the merge and the output projection
    qk_norm: tuple | None = None    # numpy_attn/qk_norm.py's QKNormCache (Qwen3, OLMo 2, Gemma 3)


def qkv_forward(x, params):
    """The three projections: x (B, T, C) -> ((q (B, T, nh*hs), k, v (B, T, nkv*hs)), cache)."""
    q, q_cache = linear_forward(x, **params["q"])                             # (B, T, C) -> (B, T, nh*hs)
    k, k_cache = linear_forward(x, **params["k"])                             # (B, T, C) -> (B, T, nkv*hs)
    v, v_cache = linear_forward(x, **params["v"])                             # (B, T, C) -> (B, T, nkv*hs)
    return (q, k, v), (q_cache, k_cache, v_cache)


def qkv_backward(dq, dk, dv, cache):
    """Undoes the three projections: x fed all of them, so their gradients add -> (dx, {"q", "k", "v"})."""
    q_cache, k_cache, v_cache = cache
    dx_v, dv_params = linear_backward(dv, v_cache)                            # (B, T, C)
    dx_k, dk_params = linear_backward(dk, k_cache)                            # (B, T, C)
    dx_q, dq_params = linear_backward(dq, q_cache)                            # (B, T, C)
    return dx_q + dx_k + dx_v, {"q": dq_params, "k": dk_params, "v": dv_params}


def heads_forward(x, params, nh, nkv):
    """The three projections, split into heads: x (B, T, C) -> (q (B, nh, T, hs), k, v (B, nkv, T, hs), cache)."""
    (q, k, v), qkv_cache = qkv_forward(x, params)                             # (B, T, C) -> (B, T, nh*hs | nkv*hs)
    return split_heads(q, nh), split_heads(k, nkv), split_heads(v, nkv), qkv_cache   # (B, nh | nkv, T, hs)


def heads_backward(dq, dk, dv, cache):
    """Undoes heads_forward: merges each gradient's heads, then the projections -> (dx, {"q", "k", "v"})."""
    return qkv_backward(merge_heads(dq), merge_heads(dk), merge_heads(dv), cache)   # (B, nh | nkv, T, hs) -> (B, T, C)


def rotate_forward(q, k, positions, theta, scaling, layout, rotary_dim=None):
    """RoPE on q (B, nh, T, hs) and k (B, nkv, T, hs) at ``positions`` (T,) or (B, T) -> (q, k, cache).

    ``rotary_dim`` r (even, <= hs; None means hs) rotates only the first r channels of each head, the
    frequencies those of a head of size r, and passes the others through (partial rotary: Qwen3.5)."""
    hs = q.shape[-1]
    r = hs if rotary_dim is None else rotary_dim
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    q_rot, q_cache = rope_forward(q[..., :r], pos, theta, layout, scaling)    # (B, nh, T, r)
    k_rot, k_cache = rope_forward(k[..., :r], pos, theta, layout, scaling)    # (B, nkv, T, r)
    if r < hs:   # the unrotated channels follow the rotated ones, as they came
        q_rot = np.concatenate([q_rot, q[..., r:]], axis=-1)                  # (B, nh, T, hs)
        k_rot = np.concatenate([k_rot, k[..., r:]], axis=-1)                  # (B, nkv, T, hs)
    return q_rot, k_rot, (q_cache, k_cache, r)


def rotate_backward(dq, dk, cache):
    """Undoes the two rotations -> (dq, dk); the channels past rotary_dim pass their gradient through."""
    q_cache, k_cache, r = cache
    dq_rot, dk_rot = rope_backward(dq[..., :r], q_cache), rope_backward(dk[..., :r], k_cache)
    if r < dq.shape[-1]:
        dq_rot = np.concatenate([dq_rot, dq[..., r:]], axis=-1)               # (B, nh, T, hs)
        dk_rot = np.concatenate([dk_rot, dk[..., r:]], axis=-1)               # (B, nkv, T, hs)
    return dq_rot, dk_rot


class CachedAttentionCache(NamedTuple):
    """Attention's cache, and how many of its keys came from a key/value cache."""

    sdpa: tuple              # scaled_dot_product_attention_forward's cache, flex_attention_forward's with a cap
    past: int                # keys read from a key/value cache (0 without one): no gradient reaches them
    sinks: tuple | None      # attention_sinks_forward's cache, None without sinks


def cached_attention_forward(q, k, v, kv_cache, attn_mask, *, window=None, sinks=None, softcap=None, **attention):
    """Causal attention of the T new queries q (B, nh, T, hs) over the past keys and values of
    ``kv_cache`` (this layer's, or None) and the new ones k, v (B, nkv, T, hs) -> (B, nh, T, hs).

    Query t sees keys 0..past+t (aligned bottom-right), only its last ``window`` of them on a
    sliding layer; ``attn_mask`` (bool, the caller's, causality included) restricts it further.
    ``sinks`` (nh,) (gpt-oss) scale each row by its sink's share (numpy_attn/attention_sinks.py);
    ``softcap`` c (Gemma 2) caps the scaled scores at c * tanh(s / c) before the mask: a score
    modifier, so that attention goes through flex attention with soft_cap(c) and the mask as its
    block mask. ``attention`` goes to scaled_dot_product_attention_forward (scale), or to flex
    attention with a cap. Returns ``(y, cache)``.
    """
    T = q.shape[2]
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    if kv_cache is not None:   # decoding: the past tokens' (rotated) keys and values come from the cache
        k, v = kv_cache_update(kv_cache, k, v)                                # (B, nkv, T, hs) -> (B, nkv, S, hs)
    S = k.shape[2]
    causal = causal_mask(T, S, "bottom_right") if window is None else sliding_window_mask(T, S, window,
                                                                                            "bottom_right")
    mask = causal if attn_mask is None else attn_mask & causal               # (T, S) or (B, nh, T, S)
    if softcap is None:
        y, sdpa_cache = scaled_dot_product_attention_forward(q, k, v, attn_mask=mask, **attention)   # (B, nh, T, hs)
        lse = sdpa_cache.lse                                                  # (B, nh, T)
    else:   # Gemma 2: c * tanh(s / c) modifies each score, the mask then drops some
        block_mask = mask_block_mask(mask, *q.shape[:2])
        (y, lse), sdpa_cache = flex_attention_forward(q, k, v, score_mod=soft_cap(softcap), block_mask=block_mask,
                                                      enable_gqa=True, return_lse=True, **attention)
    sinks_cache = None
    if sinks is not None:   # gpt-oss: y * sigmoid(lse - s_h), the share of each row its sink leaves
        y, sinks_cache = attention_sinks_forward(y, lse, sinks)               # (B, nh, T, hs)
    return y, CachedAttentionCache(sdpa_cache, past, sinks_cache)


def mask_block_mask(mask, B, nh):
    """flex attention's BlockMask of a bool ``mask`` (T, S) or (B, nh, T, S), True where a query
    may attend: its mask_mod reads the mask."""
    T, S = mask.shape[-2:]
    if mask.ndim == 2:   # the same for every sequence and head: one block mask serves them all
        return create_block_mask(lambda b, h, q_idx, kv_idx: mask[q_idx, kv_idx], None, None, T, S)
    mask = np.broadcast_to(mask, (B, nh, T, S))                               # (B, nh, T, S)
    return create_block_mask(lambda b, h, q_idx, kv_idx: mask[b, h, q_idx, kv_idx], B, nh, T, S)


def cached_attention_backward(dy, cache):
    """Undoes attention -> (dq, dk, dv[, dsinks]); refuses a forward that read from a key/value cache."""
    dlse, dsinks = None, ()
    if cache.sinks is not None:   # Undoes the sinks: dlse goes back into attention through its lse
        dy, dlse, dsink = attention_sinks_backward(dy, cache.sinks)          # (B, nh, T, hs), (B, nh, T), (nh,)
        dsinks = (dsink,)
    if isinstance(cache.sdpa, FlexCache):   # capped scores: flex attention's backward, soft_cap has no parameters
        dq, dk, dv, _ = flex_attention_backward(dy, cache.sdpa, dlse)
    else:
        dq, dk, dv = scaled_dot_product_attention_backward(dy, cache.sdpa, dlse)
    check_no_past("the model's backward", dk.shape[2], cache.past)   # cached past: inference only
    return (dq, dk, dv, *dsinks)


class AttendCache(NamedTuple):
    """attend_forward's caches, in forward order, and nh, to split dout into heads again."""

    attn: tuple              # CachedAttentionCache
    o: tuple
    num_heads: int


def attend_forward(q, k, v, o, kv_cache, attn_mask, **attention):
    """Attention with the cache, the heads merged, the output projection ``o`` ({"w", ["b"]}):
    q (B, nh, T, hs), k, v (B, nkv, T, hs) -> (B, T, C). ``kv_cache``, ``attn_mask`` and
    ``attention`` (window, sinks, softcap, scale) go to cached_attention_forward. Returns ``(out, cache)``."""
    y, attn_cache = cached_attention_forward(q, k, v, kv_cache, attn_mask, **attention)   # (B, nh, T, hs)
    out, o_cache = linear_forward(merge_heads(y), **o)                        # (B, nh, T, hs) -> (B, T, C)
    return out, AttendCache(attn_cache, o_cache, q.shape[1])


def attend_backward(dout, cache):
    """Undoes attend_forward: dout (B, T, C) -> (dq, dk, dv, do[, dsinks]), dk and dv for the nkv heads."""
    dy, do = linear_backward(dout, cache.o)                                   # (B, T, C) -> (B, T, nh*hs)
    dq, dk, dv, *dsinks = cached_attention_backward(split_heads(dy, cache.num_heads), cache.attn)   # dsinks (nh,)
    return (dq, dk, dv, do, *dsinks)


class HeadCache(NamedTuple):
    """The output layer's linear cache, whether its weight is wte^T, and the logits' shape and dtype."""

    linear: tuple
    tied: bool
    shape: tuple             # (B, N, V), N the positions kept (T without logits_to_keep)
    dtype: np.dtype
    T: int                   # the positions of x, N of them kept


def head_forward(x, params, tie_weights, logits_to_keep=None):
    """The output layer: x (B, T, C) -> logits (B, N, V), N = min(logits_to_keep, T), or T when
    logits_to_keep is None or 0. Returns ``(logits, cache)``."""
    T = x.shape[1]
    # The last N positions only (generation reads the last): the head's V-wide rows skip the rest.
    x = x[:, -logits_to_keep:] if logits_to_keep else x                  # (B, T, C) -> (B, N, C)
    head_w = params["wte"].T if tie_weights else params["head"]["w"]      # (C, V)
    logits, linear_cache = linear_forward(x, head_w)                      # (B, N, C) -> (B, N, V)
    return logits, HeadCache(linear_cache, tie_weights, logits.shape, logits.dtype, T)


def head_backward(op, dlogits, cache):
    """Undoes logits = x[:, -N:] @ head_w: dlogits (B, N, V) -> (dx (B, T, C), dhead {"w": (C, V)});
    ``op`` names the model in the message about a wrong dlogits."""
    check_dout(op, dlogits, cache.shape, cache.dtype, name="dlogits")
    dx, dhead = linear_backward(dlogits, cache.linear)                    # (B, N, V) -> (B, N, C)
    # Undoes x = x[:, -N:]: the T - N positions without logits get no gradient from the head.
    dx = np.pad(dx, ((0, 0), (cache.T - dx.shape[1], 0), (0, 0))) if dx.shape[1] < cache.T else dx   # (B, T, C)
    return dx, dhead


def blocks_backward(dx, caches, block_backward):
    """Undoes the blocks, the last one first: dx (B, T, C) -> (dx (B, T, C), dblocks), dblocks
    keyed "0", "1", ... in the params' order."""
    dblocks = {}
    for i in reversed(range(len(caches))):
        dx, dblocks[str(i)] = block_backward(dx, caches[i])              # (B, T, C)
    return dx, {str(i): dblocks[str(i)] for i in range(len(caches))}


def with_head(dparams, dhead, cache):
    """``dparams`` (whose "wte" is the embedding's gradient) with the output layer's gradient:
    added into "wte" with tied weights, as "head" without."""
    if cache.tied:
        # wte was used twice, as the embedding and (transposed) as the head: the uses add.
        dwte_head = dhead["w"].T                                          # (C, V) -> (V, C)
        dparams["wte"] = dparams["wte"] + dwte_head
    else:
        dparams["head"] = dhead
    return dparams


def check_for_backward(for_backward):
    """Raise unless ``for_backward`` is True or False, naming it."""
    if not isinstance(for_backward, bool | np.bool_):
        raise TypeError(f"for_backward must be True or False (whether the forward keeps its activations for a "
                        f"backward), got {for_backward!r} of type {type(for_backward).__name__}")


# -- sliding and full layers (Gemma 2 and 3, gpt-oss) ------------------------------------------------

LAYER_TYPES = ("sliding_attention", "full_attention")


def layer_types(config, pattern):
    """``config.layer_types`` as a tuple, or by default every ``pattern``-th layer full and the
    others sliding (Hugging Face's default); raise naming the config's field."""
    name = f"{type(config).__name__}.layer_types"
    types = config.layer_types
    if types is None:
        types = tuple(LAYER_TYPES[(i + 1) % pattern == 0] for i in range(config.n_layer))
    if isinstance(types, str) or not isinstance(types, tuple | list) or len(types) != config.n_layer:
        raise ValueError(f"{name} must list n_layer = {config.n_layer} entries, got {types!r}")
    for t in types:
        if t not in LAYER_TYPES:
            raise ValueError(f"{name}: each entry must be 'sliding_attention' or 'full_attention', got {t!r} "
                             f"({name} must list n_layer = {config.n_layer} entries, each 'sliding_attention' or "
                             "'full_attention')")
    return tuple(types)


def sliding_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default block_size)
    tokens: a full layer holds them all, a sliding layer (``config.window(i)`` not None) only its
    last window."""
    max_len = config.block_size if max_len is None else max_len
    windows = [config.window(i) for i in range(config.n_layer)]
    return init_kv_cache(config.n_layer, B, config.n_kv_head, max_len, config.hs, dtype, windows=windows)


def check_mask_with_windows(op, attn_mask, kv_cache):
    """Raise when an ``attn_mask`` comes with a ``kv_cache`` some of whose layers hold only their
    last keys (a sliding or chunked layer's window): the mask spans all past + T keys. ``op`` names the model."""
    if attn_mask is not None and kv_cache is not None and any(w is not None for w in kv_cache.windows):
        raise ValueError(f"{op}_forward: an attn_mask with a kv_cache whose sliding or chunked layers hold only "
                         "their last window is not supported (the mask spans all past + T keys): decode without "
                         "attn_mask, or with a cache whose layers hold every token (init_kv_cache without windows)")


def check_decoder_inputs(ids, config, config_class, positions, attn_mask, kv_cache, rng, logits_to_keep):
    """Return ids as an integer (B, T) array, or raise naming the argument at fault."""
    if type(config) is not config_class:    # each family's params differ: a Qwen3Config is no LlamaConfig here
        raise TypeError(f"config must be a {config_class.__name__}, got {type(config).__name__}")
    ids = check_token_ids(ids, config.block_size)
    B, T = ids.shape
    past = KVCache.check(kv_cache, config.n_layer, config.block_size, T,
                         "from the family's cache function, e.g. llama_kv_cache")
    check_positions(positions, B, T)                  # no table: RoPE rotates to any position
    check_model_attn_mask(attn_mask, (B, config.n_head, T, past + T))
    check_logits_to_keep(logits_to_keep)
    if rng is not None:
        check_rng(rng, "the model's forward")
    return ids


def check_logits_to_keep(logits_to_keep):
    """Raise unless ``logits_to_keep`` is None or an integer >= 0 (not a bool), naming it."""
    if logits_to_keep is None:
        return
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int | np.integer):
        raise TypeError(f"logits_to_keep must be None or an int >= 0 (how many of the last positions get "
                        f"logits; 0 keeps all), got {logits_to_keep!r} of type {type(logits_to_keep).__name__}")
    if logits_to_keep < 0:
        raise ValueError(f"logits_to_keep must be None or an int >= 0 (how many of the last positions get "
                         f"logits; 0 keeps all), got {logits_to_keep!r}")
