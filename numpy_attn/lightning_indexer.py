"""DeepSeek Sparse Attention's lightning indexer: which keys each query attends to, and its loss.

    q        = c_q @ wq_b.w                         (B, T, nh, D)   from the query latent c_q (B, T, rq)
    k        = layer_norm(x @ wk.w)                 (B, S, D)       one key head, shared by the nh heads
    q, k     = rope on the first dr channels         half-split or interleaved pairs; the rest pass
    w        = (x @ weights_proj.w) / sqrt(nh)      (B, T, nh)      a weight per query and head
    I(t, s)  = sum_j w(t, j) relu(q(t, j) * k(s) / sqrt(D))          (B, T, S)
    I(t, s)  = -inf where key s is hidden from query t (causal, attn_mask)
    selected = the top_k keys of each row of I, visible ones only  (B, T, S) bool

DeepSeek-AI, the DeepSeek-V3.2 technical report (2025), its DeepSeek Sparse Attention (DSA) and
the index score it defines, in the form of Hugging Face's ``DeepseekV32Indexer``
(names: ``wq_b``, ``wk``, ``k_norm``, ``weights_proj``; ``nh = index_n_heads``, ``D =
index_head_dim``, ``dr = qk_rope_head_dim``, ``top_k = index_topk``). The query latent c_q is
MLA's normed low-rank query (numpy_attn/mla.py's ``rms_norm(x @ q_a.w)``), taken as an input.
The indexer's rotated channels come first, unlike MLA's (last), and DeepSeek-V3.2 pairs them
half-split (``rope_layout="half"``), unlike its MLA (interleaved); GLM-5 (transformers'
``GlmMoeDsaIndexer``, otherwise the same) pairs them interleaved (``rope_layout="interleaved"``).
The angles are MLA's, rope.py's for ``dr`` channels (``rope_theta``, ``rope_scaling``). k_norm
is a LayerNorm with weight and bias, eps 1e-6. The scale 1 / sqrt(D) is applied inside the ReLU
and 1 / sqrt(nh) to w, in transformers' order (ReLU is positively homogeneous, so only the
rounding depends on where they go).

What the released model does besides. Its reference kernel rotates q and k by a Hadamard
matrix H and quantises them to FP8 with one scale per block before the dot products. H is
orthogonal, so (H q) . (H k) = q . k in exact arithmetic: the scores, and so their order, are
unchanged but for rounding. FP8 is a rounding of q and k (3 mantissa bits, up to 6% each): it
moves each score by up to a few percent and can swap two nearly equal keys, so it is no part of
the function the indexer defines, only of one fast way to approximate it. Transformers leaves
both out and computes the scores in float32; here they are computed in x's dtype, and in
float64 their order is exact arithmetic's but between scores within about 1e-15 of each other.

Top-k and ties. Each row keeps its min(top_k, S) largest scores; of equal scores the one with the
lower key index is kept first (a stable sort, descending). torch.topk, which transformers calls,
does not say which of equal scores it returns (on a CPU it varies with the row's length); where no
tie straddles the k-th place both select the same keys, and otherwise they keep keys of equal
scores. Exact ties are common: a key whose every ReLU is 0 scores exactly 0. A row with fewer
than top_k visible keys keeps them all; hidden keys are never selected (transformers' topk
returns some of its -inf keys then, which its attention mask hides again).

Decoding. A key depends on its own token only, so a decoder caches the rotated keys k (B, S, D)
and passes those of the P earlier tokens as ``past_keys``: the T new queries score all P + T keys,
causality aligned bottom-right (query t sees keys 0..P+t), positions default P..P+T-1, and the
new keys are the cache's ``k_rot[:, P:]``. No gradient reaches the cached keys' tokens: a forward
with past keys is for inference only (the backward refuses it).

Backward. The selection is piecewise constant in every input (it changes only where two scores
cross): it has no gradient, and ``selected`` has none. The scores have one almost everywhere
(ReLU's derivative at 0 taken as 0, as torch's): lightning_indexer_backward gives the gradient
of the scores (B, T, S) with respect to x, c_q and every parameter; hidden entries (-inf, a
constant) pass none.

The indexer's loss (``lightning_indexer_loss_forward``, the report's continued pre-training): the
indexer learns to imitate the main attention. Its target p (B, T, S) is the main attention's
distribution summed over its heads; the loss sums over the queries

    L = sum_t KL(p(t, :) || softmax(I(t, :)))        over the keys of a mask, p renormalised there

In the dense warm-up the mask is every visible key (``mask=None``: the finite scores); in the
sparse phase it is the selection. p is a constant (the report freezes the main model in the
warm-up, then detaches the indexer's input from its graph), so the only gradient is dL/dI =
q - p, q = softmax(I), on the mask's keys and exactly 0 elsewhere. A row with no key in the mask
adds 0 and takes gradient 0; one with a single key adds 0 too (both distributions are 1 there).
The loss lives here, not in a file of its own: it has this one user and is read with it.

float16 and bfloat16 are refused: transformers computes the scores in float32 whatever the model
dtype (a low-precision model casts x and c_q up first), and the selection, a discrete output, has
no error budget: any rounding can swap two nearly equal keys.
"""

import numbers
from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_integer, check_no_past, check_same_dtype
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.rope import LAYOUTS, rope_backward, rope_forward
from numpy_attn.softmax import log_softmax_backward, log_softmax_forward

K_NORM_EPS = 1e-6   # transformers' DeepseekV32Indexer fixes its LayerNorm's eps


class LightningIndexerCache(NamedTuple):
    """What the backward needs: the sub-operations' caches, the rotated q and k for each other's
    gradient, the logits (ReLU's mask, and relu(logits) recomputed for w's gradient), w for the
    logits' gradient, and the visible keys."""

    q: tuple                # linear wq_b
    q_rope: tuple
    k: tuple                # linear wk
    k_norm: tuple
    k_rope: tuple
    w: tuple                # linear weights_proj
    q_rot: np.ndarray       # (B, nh, T, D) the rotated queries
    k_rot: np.ndarray       # (B, S, D) the rotated keys
    logits: np.ndarray      # (B, nh, T, S) q . k / sqrt(D), before the ReLU
    weights: np.ndarray     # (B, T, nh) w, scaled by 1 / sqrt(nh)
    visible: np.ndarray     # (B, T, S) bool
    rope_dim: int
    past: int = 0           # keys passed as past_keys (0 without): no gradient reaches them


def lightning_indexer_forward(x, q_latent, params, top_k, rope_dim, positions=None, attn_mask=None,
                              is_causal=True, rope_theta=10000.0, rope_scaling=None, rope_layout="half",
                              past_keys=None):
    """Index scores and the top-k keys of each query: x (B, T, C), q_latent (B, T, rq) ->
    scores (B, T, S) (-inf where hidden), selected (B, T, S) bool, and the cache; S = P + T with
    ``past_keys`` (B, P, D), the rotated keys of P earlier tokens (decoding), else S = T.

    ``params``: {"wq_b": {"w": (rq, nh*D)}, "wk": {"w": (C, D)}, "k_norm": {"w": (D,), "b": (D,)},
    "weights_proj": {"w": (C, nh)}}. ``positions`` (T,) or (B, T) integers (default 0..T-1) turn
    the first ``rope_dim`` channels of q and k, paired as ``rope_layout`` says (rope.py's
    "half" or "interleaved"); they default to P..P+T-1. ``attn_mask`` (bool, True where a query
    may attend, broadcast to (B, T, S)) hides keys besides causality (``is_causal``: key s > P + t
    is hidden).
    """
    _check_lightning_indexer(x, q_latent, params, top_k, rope_dim, positions, attn_mask, is_causal,
                             rope_layout, past_keys)
    B, T, C = x.shape
    nh, D = params["weights_proj"]["w"].shape[1], params["wk"]["w"].shape[1]
    P = 0 if past_keys is None else past_keys.shape[1]                    # keys of earlier tokens
    positions = np.arange(P, P + T) if positions is None else np.asarray(positions)
    q_pos = positions if positions.ndim == 1 else positions[:, None, :]   # (B, T) -> (B, 1, T): all heads
    # The queries: one projection of the latent, the first rope_dim channels of each head turned.
    q, q_cache = linear_forward(q_latent, params["wq_b"]["w"])            # (B, T, rq) -> (B, T, nh*D)
    q = q.reshape(B, T, nh, D).swapaxes(1, 2)                             # -> (B, nh, T, D)
    q_r, q_rope_cache = rope_forward(q[..., :rope_dim], q_pos, rope_theta, rope_layout, rope_scaling)
    q = np.concatenate([q_r, q[..., rope_dim:]], axis=-1)                 # (B, nh, T, D)
    # The keys: one head from x, layer-normed, then turned alike.
    k, (k_cache, k_norm_cache, k_rope_cache) = indexer_keys(x, params, rope_dim, positions, rope_theta,
                                                            rope_scaling, rope_layout)   # (B, T, D)
    if P:   # decoding: the earlier tokens' keys come first
        k = np.concatenate([past_keys, k], axis=1)                        # (B, P, D) + (B, T, D) -> (B, S, D)
    # Each head's ReLU'd scores, summed with the query's weight per head.
    logits = (q @ k[:, None].swapaxes(-1, -2)) * (D ** -0.5)   # (B, nh, T, D) @ (B, 1, D, S) -> (B, nh, T, S)
    relu = np.maximum(logits, 0)                                          # (B, nh, T, S)
    w, w_cache = linear_forward(x, params["weights_proj"]["w"])           # (B, T, C) -> (B, T, nh)
    w = w * (nh ** -0.5)                                                  # (B, T, nh)
    scores = np.einsum("bth,bhts->bts", w, relu)                          # (B, T, nh) x (B, nh, T, S) -> (B, T, S)
    # Hidden keys score -inf, below every visible one.
    visible = _visible(B, T, P, attn_mask, is_causal)                     # (B, T, S)
    scores = np.where(visible, scores, x.dtype.type(-np.inf))             # (B, T, S)
    # The top_k of each row; of equal scores the lower key index first (see the docstring).
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :min(top_k, P + T)]   # (B, T, S) -> (B, T, k)
    selected = np.zeros(scores.shape, dtype=bool)                         # (B, T, S)
    np.put_along_axis(selected, order, True, axis=-1)
    selected = selected & visible                                         # hidden keys never selected
    cache = LightningIndexerCache(q_cache, q_rope_cache, k_cache, k_norm_cache, k_rope_cache, w_cache,
                                  q, k, logits, w, visible, rope_dim, P)
    return scores, selected, cache


def lightning_indexer_backward(dscores, cache):
    """Gradient of the scores: dscores (B, T, S) -> (dx (B, T, C), dq_latent (B, T, rq), dparams),
    dparams with params' keys. The selection has no gradient (piecewise constant)."""
    c = cache
    B, nh, T, D = c.q_rot.shape
    check_dout("lightning_indexer_backward", dscores, c.visible.shape, c.q_rot.dtype, name="dscores")
    check_no_past("lightning_indexer_backward", c.visible.shape[2], c.past)   # cached keys: inference only
    dr = c.rope_dim
    # Undoes scores = where(visible, scores, -inf): a hidden entry is a constant.
    dscores = np.where(c.visible, dscores, 0)                                          # (B, T, S)
    # Undoes scores = einsum(w, relu).
    relu = np.maximum(c.logits, 0)                                                     # (B, nh, T, S)
    dw = np.einsum("bts,bhts->bth", dscores, relu)                                     # (B, T, nh)
    drelu = np.einsum("bth,bts->bhts", c.weights, dscores)                             # (B, nh, T, S)
    # Undoes w = w * nh^-0.5, then w = x @ weights_proj.w.
    dx_w, dweights_proj = linear_backward(dw * (nh ** -0.5), c.w)                      # (B, T, C)
    # Undoes relu = max(logits, 0): no gradient where the logit is <= 0.
    dlogits = np.where(c.logits > 0, drelu, 0)                                         # (B, nh, T, S)
    # Undoes logits = q k^T / sqrt(D): the key is shared, so its gradient sums over the heads.
    dq = (dlogits @ c.k_rot[:, None]) * (D ** -0.5)                    # (B, nh, T, S) @ (B, 1, S, D) -> (B, nh, T, D)
    dk = (dlogits.swapaxes(-1, -2) @ c.q_rot).sum(axis=1) * (D ** -0.5)                # (B, nh, S, D) -> (B, S, D)
    # Undoes k = [rope(k_r), k_pass], then the layer norm and k = x @ wk.w.
    dk = np.concatenate([rope_backward(dk[..., :dr], c.k_rope), dk[..., dr:]], axis=-1)   # (B, S, D)
    dk, dk_norm = layer_norm_backward(dk, c.k_norm)                                    # (B, S, D)
    dx_k, dwk = linear_backward(dk, c.k)                                               # (B, S, C)
    # Undoes q = [rope(q_r), q_pass], the split into heads and q = q_latent @ wq_b.w.
    dq = np.concatenate([rope_backward(dq[..., :dr], c.q_rope), dq[..., dr:]], axis=-1)   # (B, nh, T, D)
    dq = dq.swapaxes(1, 2).reshape(B, T, nh * D)                                       # -> (B, T, nh*D)
    dq_latent, dwq_b = linear_backward(dq, c.q)                                        # (B, T, rq)
    dx = dx_k + dx_w                                                                   # x feeds the keys and w
    dparams = {"wq_b": dwq_b, "wk": dwk, "k_norm": dk_norm, "weights_proj": dweights_proj}
    return dx, dq_latent, dparams


def indexer_keys(x, params, rope_dim, positions, rope_theta=10000.0, rope_scaling=None, rope_layout="half"):
    """The rotated keys of x's tokens: x (B, T, C) -> (B, T, D), what a decoder caches, and the
    caches of wk, k_norm and the rope (unchecked: lightning_indexer_forward checks its inputs)."""
    k, k_cache = linear_forward(x, params["wk"]["w"])                     # (B, T, C) -> (B, T, D)
    k, k_norm_cache = layer_norm_forward(k, params["k_norm"]["w"], params["k_norm"]["b"], K_NORM_EPS)
    k_r, k_rope_cache = rope_forward(k[..., :rope_dim], positions, rope_theta, rope_layout, rope_scaling)
    return np.concatenate([k_r, k[..., rope_dim:]], axis=-1), (k_cache, k_norm_cache, k_rope_cache)   # (B, T, D)


def _visible(B, T, P, attn_mask, is_causal):
    """Which keys each query sees: (B, T, S = P + T) bool, causal (bottom-right: key s <= P + t)
    and attn_mask."""
    visible = np.ones((B, T, P + T), dtype=bool)                          # (B, T, S)
    if is_causal:
        visible = visible & np.tri(T, P + T, P, dtype=bool)               # key s <= P + query t
    if attn_mask is not None:
        visible = visible & attn_mask                                     # broadcast to (B, T, S)
    return visible


# -- the indexer's training loss ------------------------------------------------------------------

class IndexerLossCache(NamedTuple):
    """The renormalised target p, the mask, and log-softmax's cache (it holds q = softmax(I))."""

    p: np.ndarray           # (B, T, S), 0 outside the mask
    mask: np.ndarray        # (B, T, S) bool
    log_q: tuple


def lightning_indexer_loss_forward(scores, p, mask=None):
    """sum over the rows of KL(p || softmax(scores)) over the keys of ``mask``: scores (B, T, S)
    (-inf allowed outside the mask), p (B, T, S) >= 0 the target, mask (B, T, S) bool (None: where
    the scores are finite) -> loss (), and the cache. p is renormalised over the mask per row."""
    mask = _check_indexer_loss(scores, p, mask)
    p = np.where(mask, p, 0)                                              # (B, T, S)
    mass = p.sum(axis=-1, keepdims=True)                                  # (B, T, 1)
    p = p / np.where(mass > 0, mass, 1)                                   # renormalised over the mask
    log_p = np.log(np.where(p > 0, p, 1))                                 # 0 log 0 = 0
    # softmax(I) over the mask's keys: -inf elsewhere, an empty row all -inf (log-softmax's zeros).
    log_q, log_q_cache = log_softmax_forward(np.where(mask, scores, scores.dtype.type(-np.inf)))
    log_q = np.where(mask, log_q, 0)                                      # no -inf meets p's zeros
    loss = np.sum(p * (log_p - log_q))                                    # (B, T, S) -> ()
    cache = IndexerLossCache(p, mask, log_q_cache)
    return np.asarray(loss, dtype=scores.dtype), cache


def lightning_indexer_loss_backward(dloss, cache):
    """Gradient of the loss: dloss () -> dscores (B, T, S): dloss (q - p) on the mask, 0 elsewhere."""
    check_dout("lightning_indexer_loss_backward", dloss, (), cache.p.dtype, name="dloss")
    # Undoes loss = sum p (log p - log q): p is a constant, so only log q has a gradient.
    dlog_q = np.where(cache.mask, -dloss * cache.p, 0)                    # (B, T, S)
    # Undoes log_q = log_softmax(...): -p + q sum(p) = q - p on a row with a key, 0 on an empty one;
    # a hidden key has dlog_q = 0 and q = 0, so exactly 0 too.
    dscores = log_softmax_backward(dlog_q, cache.log_q)                   # (B, T, S)
    return dscores


# -- input checks ---------------------------------------------------------------------------------

_PARAM_SHAPES = (("wq_b", "w"), ("wk", "w"), ("k_norm", "w"), ("k_norm", "b"), ("weights_proj", "w"))


def _check_lightning_indexer(x, q_latent, params, top_k, rope_dim, positions, attn_mask, is_causal, rope_layout,
                             past_keys=None):
    """Raise unless x (B, T, C) and q_latent (B, T, rq) are float32 or float64 arrays of one dtype,
    params holds the four layers with shapes that agree, top_k and rope_dim are valid integers, and
    positions, attn_mask, is_causal and past_keys are as documented, naming the value at fault."""
    for name, a in (("x", x), ("q_latent", q_latent)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"lightning_indexer: {name} must be a NumPy array, got {type(a).__name__}")
        if a.dtype not in (np.float32, np.float64):
            raise TypeError(f"lightning_indexer: {name} must be float32 or float64 (the scores only "
                            f"order keys), got {a.dtype}")
        if a.ndim != 3:
            raise ValueError(f"lightning_indexer: {name} must have 3 dimensions (B, T, ...), got shape {a.shape}")
    if q_latent.shape[:2] != x.shape[:2]:
        raise ValueError(f"lightning_indexer: q_latent {q_latent.shape} must have x's (B, T) = {x.shape[:2]}")
    if not isinstance(params, dict) or not all(isinstance(params.get(layer), dict) and isinstance(
            params[layer].get(leaf), np.ndarray) for layer, leaf in _PARAM_SHAPES):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError("lightning_indexer: params must hold wq_b {w}, wk {w}, k_norm {w, b} and "
                         f"weights_proj {{w}}, each a NumPy array, got {got}")
    check_same_dtype(x=x, q_latent=q_latent, **{f"{layer}.{leaf}": params[layer][leaf]
                                                for layer, leaf in _PARAM_SHAPES})
    B, T, C = x.shape
    rq = q_latent.shape[-1]
    wk, wp = params["wk"]["w"], params["weights_proj"]["w"]
    if wk.ndim != 2 or wk.shape[0] != C or wp.ndim != 2 or wp.shape[0] != C:
        raise ValueError(f"lightning_indexer: params['wk']['w'] {wk.shape} and params['weights_proj']['w'] "
                         f"{wp.shape} must be (C, D) and (C, nh) with x's C = {C}")
    D, nh = wk.shape[1], wp.shape[1]
    expected = {("wq_b", "w"): (rq, nh * D), ("k_norm", "w"): (D,), ("k_norm", "b"): (D,)}
    for (layer, leaf), shape in expected.items():
        if params[layer][leaf].shape != shape:
            raise ValueError(f"lightning_indexer: params['{layer}']['{leaf}'] must have shape {shape} "
                             f"(rq = {rq}, nh = {nh}, D = {D}), got {params[layer][leaf].shape}")
    for name, value in (("top_k", top_k), ("rope_dim", rope_dim)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"lightning_indexer: {name} must be an int, got {type(value).__name__} {value!r}")
    if top_k < 1:
        raise ValueError(f"lightning_indexer: top_k must be >= 1, got {top_k}")
    if not 2 <= rope_dim <= D or rope_dim % 2:
        raise ValueError(f"lightning_indexer: rope_dim must be even and in [2, D = {D}], got {rope_dim}")
    P = 0
    if past_keys is not None:
        if not isinstance(past_keys, np.ndarray) or past_keys.dtype != x.dtype:
            got = past_keys.dtype if isinstance(past_keys, np.ndarray) else type(past_keys).__name__
            raise TypeError(f"lightning_indexer: past_keys must be a NumPy array of x's dtype {x.dtype}, got {got}")
        if past_keys.ndim != 3 or past_keys.shape[0] != B or past_keys.shape[2] != D:
            raise ValueError(f"lightning_indexer: past_keys must have shape (B, P, D) = ({B}, P, {D}), "
                             f"got {past_keys.shape}")
        if not np.isfinite(past_keys).all():
            raise ValueError(f"lightning_indexer: past_keys of shape {past_keys.shape} holds NaN or inf")
        P = past_keys.shape[1]
    if positions is not None:
        positions = np.asarray(positions)
        check_integer("positions", positions)
        if positions.shape not in ((T,), (B, T)):
            raise ValueError(f"lightning_indexer: positions must have shape ({T},) or ({B}, {T}), "
                             f"got {positions.shape}")
    if attn_mask is not None:
        if not isinstance(attn_mask, np.ndarray) or attn_mask.dtype != np.bool_:
            raise TypeError("lightning_indexer: attn_mask must be a bool NumPy array (True where a query "
                            f"may attend), got {getattr(attn_mask, 'dtype', type(attn_mask).__name__)}")
        try:
            fits = np.broadcast_shapes(attn_mask.shape, (B, T, P + T)) == (B, T, P + T)
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"lightning_indexer: attn_mask of shape {attn_mask.shape} does not broadcast "
                             f"to the scores' (B, T, S) = {(B, T, P + T)}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"lightning_indexer: is_causal must be a bool, got {type(is_causal).__name__}")
    if rope_layout not in LAYOUTS:
        raise ValueError(f"lightning_indexer: rope_layout must be 'half' or 'interleaved', got {rope_layout!r}")
    for name, a in (("x", x), ("q_latent", q_latent)):
        if not np.isfinite(a).all():
            raise ValueError(f"lightning_indexer: {name} of shape {a.shape} holds NaN or inf")


def _check_indexer_loss(scores, p, mask):
    """Return the mask (the finite scores when None); raise unless scores and p are float32 or
    float64 arrays (B, T, S) of one dtype, p finite and >= 0 with mass on every row's mask, the
    scores finite on the mask, and mask a bool array of their shape."""
    for name, a in (("scores", scores), ("p", p)):
        if not isinstance(a, np.ndarray) or a.dtype not in (np.float32, np.float64):
            got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
            raise TypeError(f"lightning_indexer_loss: {name} must be a float32 or float64 NumPy array, got {got}")
    if scores.ndim != 3 or p.shape != scores.shape:
        raise ValueError(f"lightning_indexer_loss: scores must be (B, T, S) and p of its shape, got scores "
                         f"{scores.shape} and p {p.shape}")
    check_same_dtype(scores=scores, p=p)
    if mask is None:
        mask = np.isfinite(scores)
    elif not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != scores.shape:
        got = f"{mask.dtype} {mask.shape}" if isinstance(mask, np.ndarray) else type(mask).__name__
        raise TypeError(f"lightning_indexer_loss: mask must be a bool NumPy array of the scores' shape "
                        f"{scores.shape}, got {got}")
    if not np.isfinite(scores[mask]).all():
        raise ValueError("lightning_indexer_loss: scores must be finite on the mask's keys")
    if not np.isfinite(p).all() or (p < 0).any():
        raise ValueError("lightning_indexer_loss: p must be finite and >= 0 (a distribution over keys)")
    mass = np.where(mask, p, 0).sum(axis=-1)                              # (B, T)
    empty = mask.any(axis=-1) & ~(mass > 0)
    if empty.any():
        b, t = map(int, np.argwhere(empty)[0])
        raise ValueError(f"lightning_indexer_loss: p has no mass on the mask's keys of row (b={b}, t={t}): "
                         "a target needs some")
    return mask
