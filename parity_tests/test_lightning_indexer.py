"""Parity tests for numpy_attn/lightning_indexer.py and torch_attn/lightning_indexer.py: DeepSeek
Sparse Attention's indexer (scores, top-k selection, their gradient) and its KL loss, against
Hugging Face's DeepseekV32Indexer, the twin, finite differences, and attention over the selection."""

from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from transformers.models.deepseek_v32.configuration_deepseek_v32 import DeepseekV32Config
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer
from transformers.models.glm_moe_dsa.configuration_glm_moe_dsa import GlmMoeDsaConfig
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaIndexer

from numpy_attn.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from numpy_attn.lightning_indexer import (
    lightning_indexer_backward,
    lightning_indexer_forward,
    lightning_indexer_loss_backward,
    lightning_indexer_loss_forward,
)
from parity_tests import strategies as S
from parity_tests.helpers import (
    TOLERANCES,
    assert_bad_dout_refused,
    assert_close,
    assert_tree_close,
    directional_derivative,
    directional_tol,
    to_numpy,
    to_torch,
    tree_dot,
    tree_map,
)
from torch_attn.lightning_indexer import lightning_indexer, lightning_indexer_loss

MASK_KINDS = ("causal", "causal+padding", "bool")
POSITION_KINDS = ("default", "offset", "per-row")


def random_params(rng, C, rq, nh, D, dtype=np.float64):
    """The four layers at the scale of a model's (1 / sqrt(fan-in)), k_norm moved off 1 and 0."""
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)
    return {"wq_b": {"w": w(rq, nh * D)}, "wk": {"w": w(C, D)},
            "k_norm": {"w": (1 + 0.3 * rng.standard_normal(D)).astype(dtype),
                       "b": (0.3 * rng.standard_normal(D)).astype(dtype)},
            "weights_proj": {"w": w(C, nh)}}


@st.composite
def cases(draw, dtype=None, max_T=6):
    """A dict of the forward's arguments (x, q_latent, params, top_k, rope_dim, positions,
    attn_mask, is_causal, rope_layout) and dscores (B, T, T). Sizes by construction (D >= rope_dim, even);
    values from a drawn seed, standard normal: exact zeros (ReLU's kink) have probability 0."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    B, T, C, rq, nh = draw(S.dim(1, 2)), draw(S.dim(1, max_T)), draw(S.dim(1, 6)), draw(S.dim(1, 5)), draw(S.dim(1, 3))
    rope_dim = 2 * draw(S.dim(1, 2))
    D = rope_dim + draw(st.integers(0, 3))
    top_k = draw(S.dim(1, T + 1))
    mask_kind, pos_kind = draw(st.sampled_from(MASK_KINDS)), draw(st.sampled_from(POSITION_KINDS))
    rope_layout = draw(st.sampled_from(["half", "interleaved"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    attn_mask, is_causal = None, mask_kind != "bool"
    if mask_kind == "causal+padding":   # left padding: keys before each row's start hidden, whole rows too
        start = rng.integers(0, T, B)
        attn_mask = (np.arange(T)[None, :] >= start[:, None])[:, None, :]          # (B, 1, S)
    elif mask_kind == "bool":           # any pattern, not causal
        attn_mask = rng.random((B, T, T)) < 0.7
    positions = {"default": None, "offset": np.arange(3, 3 + T),
                 "per-row": np.stack([np.arange(T) + int(rng.integers(0, 9)) for _ in range(B)])}[pos_kind]
    return dict(x=rng.standard_normal((B, T, C)).astype(dtype), q_latent=rng.standard_normal((B, T, rq)).astype(dtype),
                params=random_params(rng, C, rq, nh, D, dtype), top_k=top_k, rope_dim=rope_dim, positions=positions,
                attn_mask=attn_mask, is_causal=is_causal, rope_layout=rope_layout), \
        rng.standard_normal((B, T, T)).astype(dtype)


def run_twin(case):
    """The twin's scores and selection, and tensors of x, q_latent and params that require grad."""
    inputs = {"x": to_torch(case["x"], True), "q_latent": to_torch(case["q_latent"], True),
              "params": tree_map(lambda a: to_torch(a, True), case["params"])}
    extra = {k: None if v is None else torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v
             for k, v in case.items() if k not in inputs}
    scores, selected = lightning_indexer(**inputs, **extra)
    return scores, selected, inputs


def _tol(case, cache):
    """Two programs that sum a score's nh * D products in different orders differ by about
    (nh + D) ulps of the sum of the products' magnitudes (here at most 10 + 3 terms per sum, so a
    few tens of ulps), and the key's LayerNorm multiplies its input's rounding by its rstd. The
    dtype's tolerance (rtol 1e-10 float64, 1e-4 float32: hundreds of times that) is applied
    relative to the products' scale, times the largest rstd."""
    tol = TOLERANCES[np.dtype(case["x"].dtype)]
    rstd = max(1.0, float(cache.k_norm[1].max()))
    terms = np.einsum("bth,bhts->bts", np.abs(cache.weights), np.abs(cache.logits))
    scale = max(1.0, float(terms.max()))
    return dict(rtol=tol["rtol"] * rstd, atol=tol["atol"] * rstd * scale)


def assert_same_selection(name, ours, theirs, scores, atol):
    """Two selections (B, T, S) of one row's top keys agree: as many keys per row, and the scores
    they keep, sorted, within ``atol`` (keys may differ only where scores tie or nearly do)."""
    assert ours.shape == theirs.shape, f"{name}: shape {ours.shape} != {theirs.shape}"
    np.testing.assert_array_equal(ours.sum(-1), theirs.sum(-1), err_msg=f"{name}: keys per row")
    for b, t in np.ndindex(ours.shape[:2]):
        kept = np.sort(scores[b, t][ours[b, t]]), np.sort(scores[b, t][theirs[b, t]])
        np.testing.assert_allclose(*kept, rtol=0, atol=atol, err_msg=f"{name}: kept scores of row ({b}, {t})")


# -- forward and backward match the twin and autograd ------------------------------------------------

@pytest.mark.twin_parity
@given(case=cases())
def test_matches_twin_and_autograd(case):
    """The scores, the selection and every gradient of sum(scores * dscores) over the visible keys
    (hidden ones hold -inf, a constant) against the twin and autograd."""
    case, dscores = case
    scores, selected, cache = lightning_indexer_forward(**case)
    dx, dq_latent, dparams = lightning_indexer_backward(dscores, cache)
    twin_scores, twin_selected, inputs = run_twin(case)
    visible = torch.isfinite(twin_scores)
    (torch.where(visible, twin_scores, 0) * to_torch(dscores)).sum().backward()
    tol = _tol(case, cache)
    np.testing.assert_array_equal(np.isfinite(scores), to_numpy(visible), err_msg="lightning_indexer: hidden keys")
    assert_close("lightning_indexer.scores", scores, to_numpy(twin_scores), **tol)
    assert_same_selection("lightning_indexer.selected", selected, to_numpy(twin_selected), scores,
                          tol["atol"] + tol["rtol"] * np.abs(np.where(np.isfinite(scores), scores, 0)).max())
    assert_close("lightning_indexer.dx", dx, to_numpy(inputs["x"].grad), **tol)
    assert_close("lightning_indexer.dq_latent", dq_latent, to_numpy(inputs["q_latent"].grad), **tol)
    assert_tree_close("lightning_indexer.dparams", dparams, tree_map(lambda t: to_numpy(t.grad), inputs["params"]),
                      **tol)


# -- against Hugging Face's DeepseekV32Indexer -----------------------------------------------------

def hf_indexer(case):
    """transformers' indexer with the case's weights, in float64 (nn.Linear stores w transposed):
    DeepSeek-V3.2's for half-split rotary pairs, GLM-5's (GlmMoeDsaIndexer) for interleaved ones.
    GLM-5's writes its rotated pairs back de-interleaved, evens then odds: q and k alike, so the
    dot products, and the scores, are those of rope.py's interleaved layout."""
    p = case["params"]
    (rq, _), (C, D), nh = p["wq_b"]["w"].shape, p["wk"]["w"].shape, p["weights_proj"]["w"].shape[1]
    Config, Indexer = ((DeepseekV32Config, DeepseekV32Indexer) if case.get("rope_layout", "half") == "half"
                       else (GlmMoeDsaConfig, GlmMoeDsaIndexer))
    config = Config(hidden_size=C, q_lora_rank=rq, index_n_heads=nh, index_head_dim=D,
                    qk_rope_head_dim=case["rope_dim"], index_topk=case["top_k"], num_hidden_layers=1)
    module = Indexer(config, layer_idx=0).double()
    with torch.no_grad():
        module.wq_b.weight.copy_(to_torch(p["wq_b"]["w"].T))
        module.wk.weight.copy_(to_torch(p["wk"]["w"].T))
        module.k_norm.weight.copy_(to_torch(p["k_norm"]["w"]))
        module.k_norm.bias.copy_(to_torch(p["k_norm"]["b"]))
        module.weights_proj.weight.copy_(to_torch(p["weights_proj"]["w"].T))
    return module


def hf_scores_and_selection(case, visible, in_float32=False):
    """transformers' index scores (B, T, S) and its top-k keys as a mask (B, T, S), visible ones.

    Its forward casts q, k and the head weights to float32 (``.float()``) before the scores, its
    only float32 steps; during the call ``Tensor.float`` keeps float64 (unless ``in_float32``), so
    that the formula is read in float64. Its rotary tables (cos, sin) are an input, computed here in float64 from the
    rotary embedding's formula (inv_freq = theta^(-2j / dr), angles cat(f, f)) as
    DeepseekV32RotaryEmbedding's are in float32 (test_rope.py checks those frequencies). It returns
    top-k indices only: the scores are read from the tensor its ``topk`` is called on.
    """
    x, q_latent, dr = case["x"], case["q_latent"], case["rope_dim"]
    B, T, _ = x.shape
    positions = np.arange(T) if case["positions"] is None else case["positions"]
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, dr, 2) / dr)                       # (dr/2,)
    angles = np.broadcast_to(positions, (B, T))[..., None] * inv_freq              # (B, T, dr/2)
    cos, sin = (to_torch(np.concatenate([f(angles)] * 2, axis=-1)) for f in (np.cos, np.sin))
    seen = {}
    topk = torch.Tensor.topk

    def keep_scores(self, *args, **kwargs):
        seen["scores"] = self.detach().clone()
        return topk(self, *args, **kwargs)

    float_cast = torch.Tensor.float if in_float32 else (lambda self: self)
    with mock.patch.object(torch.Tensor, "float", float_cast), mock.patch.object(torch.Tensor, "topk", keep_scores):
        indices = hf_indexer(case)(to_torch(x), to_torch(q_latent), (cos, sin), torch.from_numpy(visible),
                                   torch.from_numpy(np.broadcast_to(positions, (B, T)).copy()))
    selected = np.zeros((B, T, T), dtype=bool)
    np.put_along_axis(selected, to_numpy(indices).astype(np.int64), True, axis=-1)
    return to_numpy(seen["scores"]).astype(np.float64), selected & visible   # its topk may return hidden keys


@settings(deadline=None)
@given(case=cases(dtype=np.float64, max_T=9))
def test_matches_transformers(case):
    """Scores and selected keys equal DeepseekV32Indexer's (half-split pairs) and GlmMoeDsaIndexer's
    (interleaved) with the same weights (float64).

    Selection: equal keys wherever no tie straddles the k-th place; where one does, torch.topk's
    choice among the equal scores is its own (see the module's docstring), so the kept scores are
    compared. Scores: the same sums in another order, _tol's bound."""
    case, _ = case
    scores, selected, cache = lightning_indexer_forward(**case)
    visible = np.isfinite(scores)
    hf_scores, hf_selected = hf_scores_and_selection(case, visible)
    np.testing.assert_array_equal(np.isfinite(hf_scores), visible, err_msg="transformers' hidden keys")
    tol = _tol(case, cache)
    assert_close("lightning_indexer.scores vs transformers", scores, hf_scores, **tol)
    assert_same_selection("lightning_indexer.selected vs transformers", selected, hf_selected, scores,
                          tol["atol"] + tol["rtol"] * np.abs(np.where(visible, scores, 0)).max())


@settings(deadline=None)
@given(case=cases(dtype=np.float64, max_T=9))
def test_matches_transformers_in_float32(case):
    """The module as it runs, its scores in float32: q, k and w rounded to float32 (u = 2^-24 each),
    a float32 dot product of D terms, the scale, and a float32 sum of nh terms. Each score is then
    off by at most about (D + nh + 4) u times its products' magnitudes, sum_j |w_j| |q_j| . |k| /
    sqrt(D) (the bound of any summation order); a factor 2 covers the second-order terms."""
    case, _ = case
    scores, selected, cache = lightning_indexer_forward(**case)
    visible = np.isfinite(scores)
    hf_scores, hf_selected = hf_scores_and_selection(case, visible, in_float32=True)
    B, nh, T, D = cache.q_rot.shape
    products = np.abs(cache.q_rot) @ np.abs(cache.k_rot)[:, None].swapaxes(-1, -2) / np.sqrt(D)   # (B, nh, T, S)
    bound = 2 * (D + nh + 4) * 2.0**-24 * np.einsum("bth,bhts->bts", np.abs(cache.weights), products)
    ours = np.where(visible, scores, 0)
    assert_close("lightning_indexer.scores vs transformers' float32", ours, np.where(visible, hf_scores, 0),
                 rtol=0, atol=float(bound.max()))
    assert np.all(np.abs(ours - np.where(visible, hf_scores, 0)) <= bound), "a score beyond its own bound"
    assert_same_selection("lightning_indexer.selected vs transformers' float32", selected, hf_selected, scores,
                          atol=2 * float(bound.max()))


def test_a_tie_keeps_the_lower_key_index():
    """Zero head weights make every visible score exactly 0, one tie per row: each row keeps its
    first min(top_k, t + 1) keys; and three tie groups per row keep the lower indices of the group
    the k-th place cuts. torch.topk keeps equal scores too, but which is its own (five
    zeros, k = 2, on a CPU: keys 2 and 4), so against it only the kept scores are compared."""
    rng = np.random.default_rng(0)
    B, T, top_k = 2, 5, 2
    params = random_params(rng, 4, 3, 2, 4)
    params["weights_proj"]["w"][:] = 0.0
    case = dict(x=rng.standard_normal((B, T, 4)), q_latent=rng.standard_normal((B, T, 3)), params=params,
                top_k=top_k, rope_dim=2, positions=None, attn_mask=None, is_causal=True)
    scores, selected, _ = lightning_indexer_forward(**case)
    expected = np.tri(T, dtype=bool) & (np.arange(T) < top_k)[None, :]                 # keys 0 .. k-1 of the visible
    np.testing.assert_array_equal(selected, np.broadcast_to(expected, (B, T, T)))
    np.testing.assert_array_equal(scores[np.isfinite(scores)], 0.0)
    hf_scores, hf_selected = hf_scores_and_selection(case, np.isfinite(scores))
    assert_same_selection("tied selection vs transformers", selected, hf_selected, scores, atol=0.0)
    # Ties among nonzero scores: three tokens repeated at position 0 (no rotation), so equal keys;
    # not causal, every key visible. Each row keeps its top_k by (score descending, key index).
    T, top_k = 9, 4
    params = random_params(rng, 4, 3, 2, 4)
    tokens = rng.standard_normal((3, 4))[[0, 1, 0, 2, 1, 0, 2, 1, 2]]                     # (T, C)
    case.update(x=np.stack([tokens] * B), q_latent=rng.standard_normal((B, T, 3)), params=params, top_k=top_k,
                positions=np.zeros(T, dtype=np.int64), is_causal=False)
    scores, selected, _ = lightning_indexer_forward(**case)
    assert len(np.unique(scores[0, 0])) == 3, "three distinct scores, each tied"
    for b, t in np.ndindex(B, T):
        kept = sorted(range(T), key=lambda s, row=scores[b, t]: (-row[s], s))[:top_k]
        np.testing.assert_array_equal(np.flatnonzero(selected[b, t]), sorted(kept), err_msg=f"row ({b}, {t})")
    hf_scores, hf_selected = hf_scores_and_selection(case, np.isfinite(scores))
    assert_same_selection("tied selection vs transformers", selected, hf_selected, scores, atol=0.0)


# -- properties -------------------------------------------------------------------------------------

@given(case=cases(dtype=np.float64))
def test_selection_is_the_top_k_of_the_visible_keys(case):
    """Each row keeps min(top_k, its visible keys) keys, visible ones, none scoring below a key it
    drops; and a future token's x or latent does not move a row's scores (causality)."""
    case, _ = case
    scores, selected, _ = lightning_indexer_forward(**case)
    visible = np.isfinite(scores)
    np.testing.assert_array_equal(selected.sum(-1), np.minimum(case["top_k"], visible.sum(-1)))
    assert not (selected & ~visible).any(), "a hidden key was selected"
    for b, t in np.ndindex(scores.shape[:2]):
        kept, dropped = scores[b, t][selected[b, t]], scores[b, t][visible[b, t] & ~selected[b, t]]
        assert kept.size == 0 or dropped.size == 0 or kept.min() >= dropped.max(), f"row ({b}, {t})"
    if case["is_causal"]:
        T = scores.shape[1]
        later = dict(case, x=case["x"].copy(), q_latent=case["q_latent"].copy())
        later["x"][:, T - 1] += 1.0
        later["q_latent"][:, T - 1] -= 1.0
        moved, _, _ = lightning_indexer_forward(**later)
        np.testing.assert_array_equal(moved[:, :T - 1], scores[:, :T - 1])


@given(case=cases(), data=st.data())
def test_past_keys_score_as_the_full_forward(case, data):
    """Decoding: the last T - P queries, with the first P tokens' rotated keys (the full forward's
    cache.k_rot) as past_keys, score and select as the full forward's last rows, in NumPy and the
    twin; their new keys are the full forward's; the backward refuses a forward with past keys."""
    case, _ = case
    B, T = case["x"].shape[:2]
    P = data.draw(st.integers(0, T - 1), label="P")
    scores, selected, full = lightning_indexer_forward(**case)
    step = dict(case, x=case["x"][:, P:], q_latent=case["q_latent"][:, P:],
                past_keys=full.k_rot[:, :P] if P else None)
    if case["positions"] is not None:
        step["positions"] = case["positions"][..., P:]
    if case["attn_mask"] is not None:
        step["attn_mask"] = np.broadcast_to(case["attn_mask"], (B, T, T))[:, P:]
    ours, ours_selected, cache = lightning_indexer_forward(**step)
    tol = _tol(case, full)
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(scores[:, P:]), err_msg="hidden keys")
    assert_close("lightning_indexer past_keys scores", ours, scores[:, P:], **tol)
    atol = tol["atol"] + tol["rtol"] * np.abs(np.where(np.isfinite(scores), scores, 0)).max(initial=0)
    assert_same_selection("lightning_indexer past_keys selected", ours_selected, selected[:, P:], scores[:, P:], atol)
    assert_close("lightning_indexer past_keys new keys", cache.k_rot[:, P:], full.k_rot[:, P:], **tol)
    twin_scores, twin_selected, _ = run_twin(step)
    assert_close("lightning_indexer past_keys twin scores", ours, to_numpy(twin_scores.detach()), **tol)
    assert_same_selection("lightning_indexer past_keys twin selected", ours_selected, to_numpy(twin_selected),
                          ours, atol)
    if P:
        with pytest.raises(ValueError, match="inference only"):
            lightning_indexer_backward(np.zeros_like(ours), cache)


def test_a_row_with_no_visible_key_selects_none_and_passes_no_gradient():
    """Left padding hides every key from the padded queries (causal: their keys are all padding):
    such a row scores -inf throughout, selects nothing, and takes gradient 0 (no NaN), ours and
    autograd's; T = 1 keeps its one key whatever top_k."""
    rng = np.random.default_rng(3)
    B, T = 2, 4
    case = dict(x=rng.standard_normal((B, T, 4)), q_latent=rng.standard_normal((B, T, 3)),
                params=random_params(rng, 4, 3, 2, 4), top_k=2, rope_dim=2, positions=None,
                attn_mask=np.array([[True] * 4, [False, False, True, True]])[:, None, :], is_causal=True)
    scores, selected, cache = lightning_indexer_forward(**case)
    assert np.isneginf(scores[1, :2]).all() and not selected[1, :2].any()
    dscores = rng.standard_normal(scores.shape)
    dx, dq_latent, dparams = lightning_indexer_backward(dscores, cache)
    twin_scores, _, inputs = run_twin(case)
    (torch.where(torch.isfinite(twin_scores), twin_scores, 0) * to_torch(dscores)).sum().backward()
    for who, g in (("ours", dq_latent), ("autograd", to_numpy(inputs["q_latent"].grad)),
                   ("ours", dx), ("autograd", to_numpy(inputs["x"].grad))):   # x[1, :2]: hidden keys, hidden rows
        np.testing.assert_array_equal(g[1, :2], 0.0, err_msg=f"{who}: a padded token's gradient")
    assert not any(np.isnan(g).any() for g in [dx, dq_latent] + [leaf for d in dparams.values() for leaf in d.values()])
    one = dict(case, x=case["x"][:, :1], q_latent=case["q_latent"][:, :1], attn_mask=None, top_k=5)
    scores, selected, _ = lightning_indexer_forward(**one)
    assert selected.all() and np.isfinite(scores).all()


# -- finite differences (no torch) ------------------------------------------------------------------

def _kinks_stay_put(case, direction, h):
    """Whether every logit keeps its sign at the stencil's five points: the scores are smooth
    (ReLU's linear pieces) along the segment only then."""
    signs = []
    for step in (-2 * h, -h, 0.0, h, 2 * h):
        moved = tree_map(lambda a, d, step=step: a + step * d, _tree(case), direction)
        signs.append(np.sign(lightning_indexer_forward(**dict(case, **moved))[2].logits))
    return all(np.array_equal(s, signs[0]) for s in signs)


def _tree(case):
    return {"x": case["x"], "q_latent": case["q_latent"], "params": case["params"]}


@given(case=cases(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
def test_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(scores * dscores) over the visible keys along a random
    direction in x, q_latent and every parameter."""
    case, dscores = case
    rng = np.random.default_rng(seed)
    tree = _tree(case)
    direction = tree_map(lambda a: rng.uniform(-1, 1, a.shape), tree)
    scores, _, cache = lightning_indexer_forward(**case)
    dx, dq_latent, dparams = lightning_indexer_backward(dscores, cache)
    grads = {"x": dx, "q_latent": dq_latent, "params": dparams}
    h = 1e-4 / max(1.0, float(cache.k_norm[1].max()))   # a narrow key row varies faster (layer_norm_tol)
    assume(_kinks_stay_put(case, direction, h))

    def f(t):
        s = lightning_indexer_forward(**dict(case, **t))[0]
        return np.sum(np.where(np.isfinite(s), s, 0) * dscores)

    assert_close("lightning_indexer directional derivative vs finite differences",
                 np.float64(tree_dot(grads, direction)), np.float64(directional_derivative(f, tree, direction, h=h)),
                 **directional_tol(grads, direction))


# -- the indexer's loss -------------------------------------------------------------------------------

@st.composite
def loss_cases(draw, dtype=None):
    """(scores (B, T, S) with -inf outside a causal mask, p (B, T, S) >= 0, mask or None): None is
    the dense warm-up (the finite scores), a mask the sparse phase (a subset of the visible keys)."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    B, T = draw(S.dim(1, 2)), draw(S.dim(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    visible = np.broadcast_to(np.tri(T, dtype=bool), (B, T, T))
    scores = np.where(visible, 3 * rng.standard_normal((B, T, T)), -np.inf).astype(dtype)
    p = np.where(visible, rng.random((B, T, T)) ** 3, 0).astype(dtype)               # some near 0
    p[..., 0] += dtype(0.1)                                                             # every row: mass on key 0
    mask = None
    if draw(st.booleans()):
        mask = visible & (rng.random((B, T, T)) < 0.6)
        mask[..., 0] = True                                                             # key 0 kept: p has mass
    return scores, p, mask


@given(case=loss_cases())
def test_loss_matches_twin_and_autograd(case):
    """The loss and its gradient to the scores against the twin and autograd, and the twin
    against F.kl_div(log q, p, reduction="sum") on the mask. float32: a sum of B T S terms of
    O(10) (log q down to -30), rtol 1e-4 with room."""
    scores, p, mask = case
    loss, cache = lightning_indexer_loss_forward(scores, p, mask)
    dloss = np.asarray(0.7, dtype=scores.dtype)
    dscores = lightning_indexer_loss_backward(dloss, cache)
    t_scores = to_torch(scores, True)
    t_mask = None if mask is None else torch.from_numpy(mask)
    twin = lightning_indexer_loss(t_scores, to_torch(p), t_mask)
    (twin * 0.7).backward()
    tol = dict(rtol=TOLERANCES[np.dtype(scores.dtype)]["rtol"], atol=TOLERANCES[np.dtype(scores.dtype)]["atol"] * 30)
    assert_close("lightning_indexer_loss", loss, to_numpy(twin), **tol)
    assert_close("lightning_indexer_loss.dscores", dscores, to_numpy(t_scores.grad), **tol)
    m = np.isfinite(scores) if mask is None else mask
    t_m = torch.from_numpy(m)
    log_q = torch.log_softmax(to_torch(scores).masked_fill(~t_m, float("-inf")), dim=-1)
    target = torch.where(t_m, to_torch(p), 0)
    target = target / target.sum(-1, keepdim=True).clamp_min(torch.finfo(target.dtype).tiny)
    builtin = F.kl_div(torch.where(t_m, log_q, 0), target, reduction="sum")
    assert_close("lightning_indexer_loss vs F.kl_div", to_numpy(twin), to_numpy(builtin), **tol)


@given(case=loss_cases(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
def test_loss_backward_matches_finite_differences(case, seed):
    """One directional derivative of the loss along a random direction in the mask's scores."""
    scores, p, mask = case
    m = np.isfinite(scores) if mask is None else mask
    direction = np.where(m, np.random.default_rng(seed).uniform(-1, 1, scores.shape), 0)
    _, cache = lightning_indexer_loss_forward(scores, p, mask)
    dscores = lightning_indexer_loss_backward(np.asarray(1.0), cache)

    def f(s):
        return float(lightning_indexer_loss_forward(np.where(m, s, scores), p, mask)[0])

    numeric = directional_derivative(f, np.where(m, scores, 0), direction)
    assert_close("lightning_indexer_loss directional derivative vs finite differences",
                 np.float64(np.sum(dscores * direction)), np.float64(numeric),
                 **directional_tol({"s": dscores}, {"s": direction}))


@given(case=cases(), seed=st.integers(0, 2**32 - 1), sparse=st.booleans())
def test_loss_through_the_indexer_matches_autograd(case, seed, sparse):
    """The loss of the indexer's scores, dense or over the selection, and its gradient to x,
    q_latent and every parameter through both hand-written backwards, against autograd through
    both twins. dL/dI = q - p is O(1), so the scores' bound (_tol) carries over; the loss sums
    B T S terms of O(10), hence its atol 30 times the dtype's."""
    case, _ = case
    rng = np.random.default_rng(seed)
    scores, selected, cache = lightning_indexer_forward(**case)
    mask = selected if sparse else None
    p = np.where(np.isfinite(scores), rng.random(scores.shape) + 0.01, 0).astype(scores.dtype)
    loss, loss_cache = lightning_indexer_loss_forward(scores, p, mask)
    dloss = np.asarray(1.0, dtype=scores.dtype)
    dx, dq_latent, dparams = lightning_indexer_backward(lightning_indexer_loss_backward(dloss, loss_cache), cache)
    twin_scores, _, inputs = run_twin(case)   # our selection on both sides: a float32 near-tie may split them
    twin_loss = lightning_indexer_loss(twin_scores, to_torch(p), None if mask is None else torch.from_numpy(mask))
    twin_loss.backward()
    tol = _tol(case, cache)
    base = TOLERANCES[np.dtype(scores.dtype)]
    assert_close("lightning_indexer_loss of the indexer", loss, to_numpy(twin_loss), rtol=base["rtol"],
                 atol=30 * base["atol"])
    assert_close("lightning_indexer_loss of the indexer.dx", dx, to_numpy(inputs["x"].grad), **tol)
    assert_close("lightning_indexer_loss of the indexer.dq_latent", dq_latent, to_numpy(inputs["q_latent"].grad),
                 **tol)
    assert_tree_close("lightning_indexer_loss of the indexer.dparams", dparams,
                      tree_map(lambda t: to_numpy(t.grad), inputs["params"]), **tol)


@given(case=cases(dtype=np.float64), seed=st.integers(0, 2**32 - 1), sparse=st.booleans())
def test_loss_through_the_indexer_matches_finite_differences(case, seed, sparse):
    """The loss of the indexer's scores (dense: its visible keys; sparse: its selection, held fixed)
    differentiated by hand through both backwards, against finite differences in every input."""
    case, _ = case
    rng = np.random.default_rng(seed)
    scores, selected, cache = lightning_indexer_forward(**case)
    mask = selected if sparse else None
    p = np.where(np.isfinite(scores), rng.random(scores.shape), 0)
    keys = np.isfinite(scores) if mask is None else mask
    assume(np.all((np.where(keys, p, 0).sum(-1) > 0) | ~keys.any(-1)))
    loss, loss_cache = lightning_indexer_loss_forward(scores, p, mask)
    dx, dq_latent, dparams = lightning_indexer_backward(lightning_indexer_loss_backward(np.asarray(1.0), loss_cache),
                                                        cache)
    grads = {"x": dx, "q_latent": dq_latent, "params": dparams}
    tree = _tree(case)
    direction = tree_map(lambda a: rng.uniform(-1, 1, a.shape), tree)
    h = 1e-4 / max(1.0, float(cache.k_norm[1].max()))
    assume(_kinks_stay_put(case, direction, h))

    def f(t):
        return float(lightning_indexer_loss_forward(lightning_indexer_forward(**dict(case, **t))[0], p, mask)[0])

    assert_close("lightning_indexer_loss through the indexer vs finite differences",
                 np.float64(tree_dot(grads, direction)), np.float64(directional_derivative(f, tree, direction, h=h)),
                 **directional_tol(grads, direction))


@example(T=1)
@given(T=S.dim(1, 5))
def test_loss_gives_hidden_keys_exactly_zero_and_no_nan(T):
    """Keys outside the mask take gradient exactly 0 (numpy and autograd), with no NaN: a row with
    one key (the first under causality, every row of a diagonal mask), and a row with none."""
    rng = np.random.default_rng(T)
    visible = np.broadcast_to(np.tri(T, dtype=bool), (1, T, T))
    scores = np.where(visible, rng.standard_normal((1, T, T)), -np.inf)
    p = np.where(visible, rng.random((1, T, T)), 0.0)
    diagonal = np.broadcast_to(np.eye(T, dtype=bool), (1, T, T)).copy()
    empty_row = diagonal.copy()
    empty_row[0, -1] = False   # the last row has no key at all
    for mask in (None, diagonal, empty_row):
        m = visible if mask is None else mask
        loss, cache = lightning_indexer_loss_forward(scores, p, mask)
        dscores = lightning_indexer_loss_backward(np.asarray(1.0), cache)
        t_scores = to_torch(scores, True)
        lightning_indexer_loss(t_scores, to_torch(p), None if mask is None else torch.from_numpy(mask)).backward()
        for who, grad in (("ours", dscores), ("autograd", to_numpy(t_scores.grad))):
            assert not np.isnan(grad).any(), f"{who}: NaN in the gradient"
            np.testing.assert_array_equal(grad[~m], 0.0, err_msg=f"{who}: a hidden key's gradient")
            single = m.sum(-1) == 1
            np.testing.assert_array_equal(grad[single], 0.0, err_msg=f"{who}: a row of one key")
        assert np.isfinite(loss)
        if mask is not None:
            assert loss == 0.0, "one key per row: both distributions are 1 there"


@given(case=cases(dtype=np.float64))
def test_sparse_loss_over_every_key_is_the_dense_loss(case):
    """With top_k >= T the selection is every visible key, and both phases give one loss."""
    case, _ = case
    case = dict(case, top_k=case["x"].shape[1])
    scores, selected, _ = lightning_indexer_forward(**case)
    np.testing.assert_array_equal(selected, np.isfinite(scores))
    p = np.where(np.isfinite(scores), np.random.default_rng(1).random(scores.shape) + 0.01, 0)
    assert_close("dense loss vs sparse loss over every key", lightning_indexer_loss_forward(scores, p, selected)[0],
                 lightning_indexer_loss_forward(scores, p)[0])


# -- attention over the selected keys -----------------------------------------------------------------

def _sparse_attention(x, case, w_qkv, nh):
    """Attention of q, k, v = x @ w_qkv (split into nh heads) over the indexer's selection of x:
    out (B, nh, T, hs), its cache and the selection (B, T, S)."""
    B, T, _ = x.shape
    _, selected, _ = lightning_indexer_forward(**dict(case, x=x))
    qkv = (x @ w_qkv).reshape(B, T, 3, nh, -1).transpose(2, 0, 3, 1, 4)        # (B, T, 3*nh*hs) -> (3, B, nh, T, hs)
    out, cache = scaled_dot_product_attention_forward(*qkv, attn_mask=selected[:, None])   # mask (B, 1, T, S)
    return out, cache, selected


@settings(deadline=None)
@given(case=cases(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
def test_attention_over_the_selection(case, seed):
    """attention.py with the selection as its boolean mask (True = may attend) is sparse attention:
    a query's output moves with its selected keys and values only (their gradient elsewhere is
    exactly 0); and along a perturbation of x that keeps the selection (x feeds both the indexer
    and q, k, v), the backward with the selection held fixed equals finite differences of the
    whole, selection recomputed at every point: piecewise constant, it adds no gradient."""
    case, _ = case
    rng = np.random.default_rng(seed)
    B, T, C = case["x"].shape
    nh, hs = 2, 3
    w_qkv = rng.standard_normal((C, 3 * nh * hs)) / np.sqrt(C)
    out, cache, selected = _sparse_attention(case["x"], case, w_qkv, nh)
    dout = rng.standard_normal(out.shape)
    b, t = int(rng.integers(0, B)), int(rng.integers(0, T))
    one_query = np.zeros_like(out)
    one_query[b, :, t] = dout[b, :, t]
    _, dk, dv = scaled_dot_product_attention_backward(one_query, cache)
    np.testing.assert_array_equal(dk[b][:, ~selected[b, t]], 0.0, err_msg="a key the query did not select")
    np.testing.assert_array_equal(dv[b][:, ~selected[b, t]], 0.0, err_msg="a value the query did not select")
    dqkv = np.stack(scaled_dot_product_attention_backward(dout, cache))          # (3, B, nh, T, hs)
    dx = dqkv.transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * nh * hs) @ w_qkv.T      # (B, T, C)
    direction = rng.uniform(-1, 1, case["x"].shape)
    h = 1e-4
    assume(all(np.array_equal(_sparse_attention(case["x"] + step * direction, case, w_qkv, nh)[2], selected)
               for step in (-2 * h, -h, h, 2 * h)))

    def f(x):
        return np.sum(_sparse_attention(x, case, w_qkv, nh)[0] * dout)

    assert_close("sparse attention directional derivative vs finite differences", np.float64(np.sum(dx * direction)),
                 np.float64(directional_derivative(f, case["x"], direction, h=h)),
                 **directional_tol({"x": dx}, {"x": direction}))


# -- bad input ----------------------------------------------------------------------------------------

def _good():
    rng = np.random.default_rng(0)
    return dict(x=rng.standard_normal((2, 3, 4)), q_latent=rng.standard_normal((2, 3, 5)),
                params=random_params(rng, 4, 5, 2, 6), top_k=2, rope_dim=4)


def _with(layer, leaf, value):
    case = _good()
    case["params"][layer][leaf] = value
    return case


BAD = [
    (dict(top_k=0), ValueError, r"^lightning_indexer: top_k must be >= 1, got 0$"),
    (dict(top_k=-3), ValueError, r"top_k must be >= 1, got -3$"),
    (dict(top_k=2.0), TypeError, r"^lightning_indexer: top_k must be an int, got float 2\.0$"),
    (dict(top_k=True), TypeError, r"top_k must be an int, got bool True$"),
    (dict(rope_dim=3), ValueError, r"^lightning_indexer: rope_dim must be even and in \[2, D = 6\], got 3$"),
    (dict(rope_dim=8), ValueError, r"rope_dim must be even and in \[2, D = 6\], got 8$"),
    (dict(rope_dim=0), ValueError, r"rope_dim must be even and in \[2, D = 6\], got 0$"),
    (dict(x=np.zeros((2, 3, 4), np.float16)), TypeError,
     r"^lightning_indexer: x must be float32 or float64 \(the scores only order keys\), got float16$"),
    (dict(x=np.zeros((2, 3, 4), np.int64)), TypeError, r"x must be float32 or float64 .*got int64$"),
    (dict(x=[[[0.0] * 4] * 3] * 2), TypeError, r"^lightning_indexer: x must be a NumPy array, got list$"),
    (dict(x=np.zeros((3, 4))), ValueError,
     r"^lightning_indexer: x must have 3 dimensions \(B, T, \.\.\.\), got shape \(3, 4\)$"),
    (dict(q_latent=np.zeros((2, 4, 5))), ValueError,
     r"^lightning_indexer: q_latent \(2, 4, 5\) must have x's \(B, T\) = \(2, 3\)$"),
    (dict(q_latent=np.zeros((2, 3, 5), np.float32)), TypeError, r"q_latent is float32"),
    (dict(params={"wq_b": {}}), ValueError, r"^lightning_indexer: params must hold wq_b \{w\}, wk \{w\}, "
     r"k_norm \{w, b\} and weights_proj \{w\}, each a NumPy array, got \['wq_b'\]$"),
    (dict(positions=np.arange(4)), ValueError, r"^lightning_indexer: positions must have shape \(3,\) or \(2, 3\), "
     r"got \(4,\)$"),
    (dict(positions=np.arange(3.0)), TypeError, r"^positions must be integers, got dtype float64$"),
    (dict(attn_mask=np.ones((2, 3, 3))), TypeError, r"^lightning_indexer: attn_mask must be a bool NumPy array "
     r"\(True where a query may attend\), got float64$"),
    (dict(attn_mask=np.ones((2, 3, 4), bool)), ValueError,
     r"^lightning_indexer: attn_mask of shape \(2, 3, 4\) does not broadcast to the scores' "
     r"\(B, T, S\) = \(2, 3, 3\)$"),
    (dict(is_causal=1), TypeError, r"^lightning_indexer: is_causal must be a bool, got int$"),
    (dict(rope_layout="neox"), ValueError,
     r"^lightning_indexer: rope_layout must be 'half' or 'interleaved', got 'neox'$"),
    (dict(x=np.full((2, 3, 4), np.nan)), ValueError, r"^lightning_indexer: x of shape \(2, 3, 4\) holds NaN or inf$"),
    (dict(past_keys=np.zeros((2, 1, 6), np.float32)), TypeError,
     r"^lightning_indexer: past_keys must be a NumPy array of x's dtype float64, got float32$"),
    (dict(past_keys=np.zeros((2, 1, 5))), ValueError,
     r"^lightning_indexer: past_keys must have shape \(B, P, D\) = \(2, P, 6\), got \(2, 1, 5\)$"),
    (dict(past_keys=np.full((2, 1, 6), np.inf)), ValueError,
     r"^lightning_indexer: past_keys of shape \(2, 1, 6\) holds NaN or inf$"),
    (dict(past_keys=np.zeros((2, 1, 6)), attn_mask=np.ones((2, 3, 3), bool)), ValueError,
     r"\(B, T, S\) = \(2, 3, 4\)$"),
]


@pytest.mark.parametrize(("change", "error", "message"), BAD)
def test_bad_input_is_refused(change, error, message):
    with pytest.raises(error, match=message):
        lightning_indexer_forward(**{**_good(), **change})


@pytest.mark.parametrize(("case", "message"), [
    (_with("wq_b", "w", np.zeros((5, 11))), r"^lightning_indexer: params\['wq_b'\]\['w'\] must have shape \(5, 12\) "
     r"\(rq = 5, nh = 2, D = 6\), got \(5, 11\)$"),
    (_with("k_norm", "b", np.zeros(5)), r"params\['k_norm'\]\['b'\] must have shape \(6,\) .*got \(5,\)$"),
    (_with("k_norm", "w", np.zeros(7)), r"params\['k_norm'\]\['w'\] must have shape \(6,\) .*got \(7,\)$"),
    (_with("wk", "w", np.zeros((3, 6))), r"^lightning_indexer: params\['wk'\]\['w'\] \(3, 6\) and "
     r"params\['weights_proj'\]\['w'\] \(4, 2\) must be \(C, D\) and \(C, nh\) with x's C = 4$"),
    (_with("weights_proj", "w", np.zeros(4)), r"params\['weights_proj'\]\['w'\] \(4,\) must be"),
])
def test_bad_params_are_named(case, message):
    with pytest.raises(ValueError, match=message):
        lightning_indexer_forward(**case)
    with pytest.raises(TypeError, match=r"wk\.w is float32"):
        lightning_indexer_forward(**_with("wk", "w", np.zeros((4, 6), np.float32)))


def test_bad_dscores_is_refused():
    scores, _, cache = lightning_indexer_forward(**_good())
    assert_bad_dout_refused("lightning_indexer_backward", scores, lightning_indexer_backward, cache,
                            dout_name="dscores")


def test_bad_loss_input_is_refused():
    scores = np.where(np.tri(3, dtype=bool), 1.0, -np.inf)[None]
    p = np.ones((1, 3, 3))
    for args, error, message in [
        ((np.ones((1, 3, 3), np.int64), p), TypeError,
         r"^lightning_indexer_loss: scores must be a float32 or float64 NumPy "
         r"array, got int64$"),
        ((scores, p.tolist()), TypeError, r"p must be a float32 or float64 NumPy array, got list$"),
        ((scores, p[:, :2]), ValueError, r"^lightning_indexer_loss: scores must be \(B, T, S\) and p of its shape, "
         r"got scores \(1, 3, 3\) and p \(1, 2, 3\)$"),
        ((scores[0], p[0]), ValueError, r"scores must be \(B, T, S\)"),
        ((scores, p.astype(np.float32)), TypeError, r"scores is float64, p is float32"),
        ((scores, p, np.ones((1, 3, 3))), TypeError, r"^lightning_indexer_loss: mask must be a bool NumPy array of "
         r"the scores' shape \(1, 3, 3\), got float64 \(1, 3, 3\)$"),
        ((scores, p, np.ones((1, 3, 2), bool)), TypeError, r"mask must be .*got bool \(1, 3, 2\)$"),
        ((scores, p, np.ones((1, 3, 3), bool)), ValueError, r"^lightning_indexer_loss: scores must be finite on the "
         r"mask's keys$"),
        ((scores, -p), ValueError, r"^lightning_indexer_loss: p must be finite and >= 0 \(a distribution over keys\)$"),
        ((scores, np.triu(p, 1)), ValueError, r"^lightning_indexer_loss: p has no mass on the mask's keys of row "
         r"\(b=0, t=0\): a target needs some$"),
        # two queries over three keys (T != S): the row found is a query's, the sum over its keys
        ((np.where(np.tri(2, 3, 1, dtype=bool), 1.0, -np.inf)[None], np.eye(2, 3)[None] * [[1], [0]]), ValueError,
         r"^lightning_indexer_loss: p has no mass on the mask's keys of row \(b=0, t=1\): a target needs some$"),
    ]:
        with pytest.raises(error, match=message):
            lightning_indexer_loss_forward(*args)
    loss, cache = lightning_indexer_loss_forward(scores, p)
    assert_bad_dout_refused("lightning_indexer_loss_backward", loss, lightning_indexer_loss_backward, cache,
                            dout_name="dloss")
