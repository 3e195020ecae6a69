"""Parity tests for numpy_attn/moe.py and torch_attn/moe.py, against transformers' GptOssMLP and
DeepseekV3MoE."""

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from transformers import DeepseekV3Config, GptOssConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

from numpy_attn._tree import tree_map
from numpy_attn.moe import (
    clamped_glu_backward,
    clamped_glu_forward,
    deepseek_moe_backward,
    deepseek_moe_forward,
    deepseek_router_forward,
    gpt_oss_expert_forward,
    gpt_oss_moe_backward,
    gpt_oss_moe_forward,
    gpt_oss_router_forward,
    init_deepseek_moe_params,
    init_gpt_oss_moe_params,
    top_k,
)
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_close,
    assert_tree_close,
    assert_tree_error_budget,
    autograd,
    directional_derivative,
    directional_tol,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
    tree_dot,
    tree_leaves,
    ulp,
)
from torch_attn import moe as twin


def _expert_shapes(E, C, H, bias):
    shapes = {"gate": {"w": (E, C, H)}, "up": {"w": (E, C, H)}, "down": {"w": (E, H, C)}}
    if bias:
        shapes = {"gate": {"w": (E, C, H), "b": (E, H)}, "up": {"w": (E, C, H), "b": (E, H)},
                  "down": {"w": (E, H, C), "b": (E, C)}}
    return shapes


def _draw_tree(draw, shapes, dtype, bound=1.0):
    return tree_map(lambda shape: draw(S.arrays(dtype, shape, bound=bound)), shapes, check=None)


@st.composite
def gpt_oss_cases(draw, dtype=None, max_C=5, max_H=4, max_E=6, max_dims=2, x_bound=4.0):
    """(x, params, hyper, dout): x (..., C); hyper {"k", "limit"}. |x| up to 4 with |w| <= 1 reaches
    the limit 7 of the clamps; a drawn limit of 1 reaches it more often."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes(max_dims=max_dims, max_side=3))
    C, H, E = draw(S.dim(1, max_C)), draw(S.dim(1, max_H)), draw(S.dim(1, max_E))
    shapes = {"router": {"w": (C, E), "b": (E,)}, "experts": _expert_shapes(E, C, H, bias=True)}
    params = _draw_tree(draw, shapes, dtype)
    hyper = {"k": draw(st.integers(1, E)), "limit": draw(st.sampled_from([7.0, 1.0]))}
    return draw(S.arrays(dtype, lead + (C,), bound=x_bound)), params, hyper, draw(S.arrays(dtype, lead + (C,)))


@st.composite
def deepseek_cases(draw, dtype=None, max_C=5, max_H=3, max_dims=2, x_bound=4.0):
    """(x, params, hyper, dout): E = n_group * (2 or 3) experts, topk_group <= n_group groups,
    k <= the experts in them, with or without normalised weights, a scaling factor, a shared
    expert 1 or 2 experts wide."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes(max_dims=max_dims, max_side=3))
    C, H = draw(S.dim(1, max_C)), draw(S.dim(1, max_H))
    n_group, per_group = draw(st.integers(1, 3)), draw(st.integers(2, 3))
    E, topk_group = n_group * per_group, draw(st.integers(1, n_group))
    Hs = H * draw(st.integers(1, 2))
    shapes = {"router": {"w": (C, E)}, "experts": _expert_shapes(E, C, H, bias=False),
              "shared": {"gate": {"w": (C, Hs)}, "up": {"w": (C, Hs)}, "down": {"w": (Hs, C)}}}
    params = _draw_tree(draw, shapes, dtype)
    params["selection_bias"] = draw(S.arrays(dtype, (E,), bound=0.5))
    hyper = {"k": draw(st.integers(1, topk_group * per_group)), "n_group": n_group, "topk_group": topk_group,
             "norm_topk_prob": draw(st.booleans()), "routed_scaling_factor": draw(st.sampled_from([1.0, 2.5]))}
    return draw(S.arrays(dtype, lead + (C,), bound=x_bound)), params, hyper, draw(S.arrays(dtype, lead + (C,)))


def _ramp_case(kind, N, C, H, E, dtype=np.float64, **hyper):
    """A hand-written case for @example: distinct values from S.ramp, routing away from ties."""
    rng = np.random.default_rng(N * 100 + E)
    init = init_gpt_oss_moe_params if kind == "gpt_oss" else init_deepseek_moe_params
    params = init(C, H, E, rng, dtype=dtype)
    x, dout = S.ramp(N, C, dtype=dtype) * 3, S.ramp(N, C, dtype=dtype)[::-1].copy()
    return x, params, hyper, dout


# An expert that no token chooses: one token, k = 1 of 3 experts.
ONE_TOKEN_GPT_OSS = _ramp_case("gpt_oss", 1, 3, 2, 3, k=1, limit=7.0)
ALL_EXPERTS_GPT_OSS = _ramp_case("gpt_oss", 4, 3, 2, 3, k=3, limit=1.0)
ONE_TOKEN_DEEPSEEK = _ramp_case("deepseek", 1, 3, 2, 4, k=1, n_group=2, topk_group=1, norm_topk_prob=True,
                                routed_scaling_factor=2.5)
ALL_EXPERTS_DEEPSEEK = _ramp_case("deepseek", 3, 3, 2, 4, k=4, n_group=2, topk_group=2, norm_topk_prob=False,
                                  routed_scaling_factor=1.0)

LAYERS = {
    "gpt_oss": (gpt_oss_moe_forward, gpt_oss_moe_backward, twin.gpt_oss_moe),
    "deepseek": (deepseek_moe_forward, deepseek_moe_backward, twin.deepseek_moe),
}


def _run(kind, x, params, hyper, dout):
    forward, backward, _ = LAYERS[kind]
    out, cache = forward(x, params, **hyper)
    dx, grads = backward(dout, cache)
    return out, cache, dx, grads


def _twin(kind, x, params, hyper, dout):
    return autograd(lambda x, params: LAYERS[kind][2](x, params, **hyper), {"x": x, "params": params}, dout)


def _terms_tol(x, params, hyper, dout, base=None):
    """The dtype's tolerance with atol scaled by the largest sum of absolute terms behind any compared
    value (as test_swiglu.py does for one SwiGLU network). Each expert's g, u sum |x| |w| + |b|;
    its hidden a is at most min(|g|, limit) (min(|u|, limit) + 1) (gpt-oss's (up + 1) * gate *
    sigmoid(alpha * gate), whose gate term stays below 0.3 for a negative gate) or |g| (|u| + 1);
    y sums |a| |down.w|; out adds k weighted y (each weight at most routed_scaling_factor, a
    sigmoid or a softmax entry being at most 1) and the shared expert's like terms. Gradients carry
    |dout| back through |down.w|, then the gate's slope (gate * sigmoid(alpha * gate) and SiLU
    rise at most 1.1) times |u| + 1, or |g|, then |gate.w| + |up.w| or |x|; the routing weights'
    gradients are dot products of |dout| with |y|, which the softmax (or the normalisation times
    the sigmoid's slope, s / sum s <= 1) at most doubles before the router's |x| and |router.w|.
    Rounding each such sum of n <= 50 terms costs at most n eps of it, far below atol times it.
    One tolerance per compared group: "out", "x", and each parameter group ("router", "experts",
    "shared", "selection_bias"), each from the largest sum behind a value of that group."""
    C = x.shape[-1]
    xs = np.abs(x).reshape(-1, C).astype(np.float64)                      # (N, C)
    d = np.abs(dout).reshape(-1, C).astype(np.float64)                    # (N, C)
    A = tree_map(lambda a: np.abs(a).astype(np.float64), params)
    wmax = max(1.0, hyper.get("routed_scaling_factor", 1.0))
    scale = {"out": 0.0, "x": 0.0}
    experts = [("experts", A["experts"])] + ([("shared", {n: {"w": A["shared"][n]["w"][None]} for n in A["shared"]})]
                                             if "shared" in A else [])
    dlogits = 0.0
    limit = hyper.get("limit", np.inf)
    for name, ex in experts:
        w = wmax if name == "experts" else 1.0
        g = np.einsum("nc,ech->enh", xs, ex["gate"]["w"]) + ex["gate"].get("b", np.zeros(1))[:, None]
        u = np.einsum("nc,ech->enh", xs, ex["up"]["w"]) + ex["up"].get("b", np.zeros(1))[:, None]
        g, u = np.minimum(g, limit), np.minimum(u, limit)                 # past the clamps, slope 0
        a = g * (u + 1)                                                   # (E, N, H)
        y = np.einsum("enh,ehc->enc", a, ex["down"]["w"]) + ex["down"].get("b", np.zeros(1))[:, None]
        da = w * np.einsum("nc,ehc->enh", d, ex["down"]["w"])             # (E, N, H)
        dgu = da * (1.1 * (u + 1) + g)                                    # (E, N, H)
        scale["out"] += (hyper["k"] * w if name == "experts" else 1.0) * y.max(initial=0)
        scale["x"] += np.einsum("enh,ech->nc", dgu, ex["gate"]["w"] + ex["up"]["w"]).max(initial=0)
        scale[name] = max(np.einsum("nc,enh->ech", xs, dgu).max(initial=0), dgu.sum(axis=1).max(initial=0),
                          w * np.einsum("enh,nc->ehc", a, d).max(initial=0), w * d.sum(axis=0).max(initial=0))
        if name == "experts":
            dlogits = 2 * wmax * np.einsum("nc,enc->n", d, y)             # (N,) all experts' terms
    scale["x"] += (dlogits[:, None] * A["router"]["w"].sum(axis=1)).max(initial=0)
    scale["router"] = scale["selection_bias"] = max((xs.T * dlogits).max(initial=0), dlogits.max(initial=0))
    tol = TOLERANCES[np.dtype(x.dtype)] if base is None else base
    return {name: dict(rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(value))) for name, value in scale.items()}


def _assert_grads(label, grads, expected, tols):
    """assert_tree_close on each parameter group (router, experts, ...) with its own tolerance."""
    assert grads.keys() == expected.keys(), f"{label}: keys {sorted(grads)} != {sorted(expected)}"
    for key in grads:
        assert_tree_close(label, {key: grads[key]}, {key: expected[key]}, **tols[key])


def _margin(kind, x, params, hyper):
    """The smallest gap, in float64, between what was chosen and what was not: between a row's
    k-th and (k+1)-th logit (gpt-oss) or choice value, and between its last chosen and first
    left-out group score (DeepSeek). inf where everything is chosen."""
    C = x.shape[-1]
    xs = x.reshape(-1, C).astype(np.float64)
    p = tree_map(lambda a: a.astype(np.float64), params)
    k = hyper["k"]
    if kind == "gpt_oss":
        logits = xs @ p["router"]["w"] + p["router"]["b"]
        return _gap(logits, k)
    G, topk_group = hyper["n_group"], hyper["topk_group"]
    choice = 1 / (1 + np.exp(-(xs @ p["router"]["w"]))) + p["selection_bias"]     # (N, E)
    grouped = choice.reshape(len(xs), G, -1)
    group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)                  # (N, G)
    keep = np.argsort(-group_scores, axis=-1, kind="stable")[:, :topk_group]
    mask = np.repeat((keep[..., None] == np.arange(G)).any(axis=-2), grouped.shape[-1], axis=-1)
    return min(_gap(group_scores, topk_group), _gap(np.where(mask, choice, -np.inf), k))


def _gap(values, k):
    """The smallest gap between the k-th and (k+1)-th largest value of each row (inf if none left)."""
    ordered = -np.sort(-values, axis=-1)
    if k >= values.shape[-1] or len(values) == 0 or not np.isfinite(ordered[:, k]).any():
        return np.inf
    gaps = ordered[:, k - 1] - ordered[:, k]
    return float(np.min(gaps[np.isfinite(gaps)], initial=np.inf))


# -- forward matches the twin -----------------------------------------------------------------

def _kind(case):
    return "deepseek" if "shared" in case[1] else "gpt_oss"


EXAMPLES = (ONE_TOKEN_GPT_OSS, ALL_EXPERTS_GPT_OSS, ONE_TOKEN_DEEPSEEK, ALL_EXPERTS_DEEPSEEK)


def _with_examples(test):
    for case in EXAMPLES:
        test = example(case=case)(test)
    return test


@given(case=gpt_oss_cases() | deepseek_cases())
@_with_examples
def test_forward_matches_twin(case):
    kind = _kind(case)
    x, params, hyper, dout = case
    out, _ = LAYERS[kind][0](x, params, **hyper)
    twin_out, _ = _twin(kind, *case)
    assert_close(f"{kind}_moe.out", out, twin_out, **_terms_tol(*case)["out"])


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=gpt_oss_cases() | deepseek_cases())
@_with_examples
def test_backward_matches_autograd(case):
    kind = _kind(case)
    _, _, dx, grads = _run(kind, *case)
    _, twin_grads = _twin(kind, *case)
    tol = _terms_tol(*case)
    assert_close(f"{kind}_moe.dx", dx, twin_grads["x"], **tol["x"])
    _assert_grads(f"{kind}_moe", grads, twin_grads["params"], tol)


# -- the twin matches transformers' modules -----------------------------------------------------

def _gpt_oss_module(params, hyper, dtype):
    """GptOssMLP holding params: gate_up_proj interleaves gate (even columns) and up (odd ones)."""
    C, E = params["router"]["w"].shape
    H = params["experts"]["gate"]["w"].shape[-1]
    config = GptOssConfig(hidden_size=C, intermediate_size=H, num_local_experts=E, num_experts_per_tok=hyper["k"],
                          swiglu_limit=hyper["limit"], num_attention_heads=1, num_key_value_heads=1, head_dim=2)
    config._experts_implementation = "eager"                        # the loop over experts, on CPU
    mlp = GptOssMLP(config).to(dtype)
    ex = params["experts"]
    with torch.no_grad():
        mlp.router.weight.copy_(to_torch(params["router"]["w"].T))   # nn.Linear's (C_out, C_in)
        mlp.router.bias.copy_(to_torch(params["router"]["b"]))
        mlp.experts.gate_up_proj[..., 0::2] = to_torch(ex["gate"]["w"])
        mlp.experts.gate_up_proj[..., 1::2] = to_torch(ex["up"]["w"])
        mlp.experts.gate_up_proj_bias[..., 0::2] = to_torch(ex["gate"]["b"])
        mlp.experts.gate_up_proj_bias[..., 1::2] = to_torch(ex["up"]["b"])
        mlp.experts.down_proj.copy_(to_torch(ex["down"]["w"]))
        mlp.experts.down_proj_bias.copy_(to_torch(ex["down"]["b"]))
    return mlp


def _gpt_oss_module_grads(mlp):
    ex = mlp.experts
    gate_up, gate_up_b = to_numpy(ex.gate_up_proj.grad), to_numpy(ex.gate_up_proj_bias.grad)
    return {"router": {"w": to_numpy(mlp.router.weight.grad).T, "b": to_numpy(mlp.router.bias.grad)},
            "experts": {"gate": {"w": gate_up[..., 0::2], "b": gate_up_b[..., 0::2]},
                        "up": {"w": gate_up[..., 1::2], "b": gate_up_b[..., 1::2]},
                        "down": {"w": to_numpy(ex.down_proj.grad), "b": to_numpy(ex.down_proj_bias.grad)}}}


def _deepseek_module(params, hyper, dtype):
    """DeepseekV3MoE holding params: gate_up_proj (E, 2H, C) is gate then up, transposed."""
    C, E = params["router"]["w"].shape
    H, Hs = params["experts"]["gate"]["w"].shape[-1], params["shared"]["gate"]["w"].shape[-1]
    config = DeepseekV3Config(hidden_size=C, moe_intermediate_size=H, n_routed_experts=E, n_shared_experts=Hs // H,
                              num_experts_per_tok=hyper["k"], n_group=hyper["n_group"],
                              topk_group=hyper["topk_group"], norm_topk_prob=hyper["norm_topk_prob"],
                              routed_scaling_factor=hyper["routed_scaling_factor"], hidden_act="silu")
    config._experts_implementation = "eager"
    moe = DeepseekV3MoE(config).to(dtype)
    ex = params["experts"]
    with torch.no_grad():
        moe.gate.weight.copy_(to_torch(params["router"]["w"].T))
        moe.gate.e_score_correction_bias.copy_(to_torch(params["selection_bias"]))
        gate_up = np.concatenate([ex["gate"]["w"], ex["up"]["w"]], axis=-1)          # (E, C, 2H)
        moe.experts.gate_up_proj.copy_(to_torch(gate_up.transpose(0, 2, 1)))
        moe.experts.down_proj.copy_(to_torch(ex["down"]["w"].transpose(0, 2, 1)))
        for name in ("gate", "up", "down"):
            getattr(moe.shared_experts, f"{name}_proj").weight.copy_(to_torch(params["shared"][name]["w"].T))
    return moe


def _deepseek_module_grads(moe, H):
    gate_up = to_numpy(moe.experts.gate_up_proj.grad).transpose(0, 2, 1)            # (E, C, 2H)
    return {"router": {"w": to_numpy(moe.gate.weight.grad).T},
            "experts": {"gate": {"w": gate_up[..., :H]}, "up": {"w": gate_up[..., H:]},
                        "down": {"w": to_numpy(moe.experts.down_proj.grad).transpose(0, 2, 1)}},
            "shared": {name: {"w": to_numpy(getattr(moe.shared_experts, f"{name}_proj").weight.grad).T}
                       for name in ("gate", "up", "down")}}


# Where the choice is this close to a tie, the twin and transformers may choose differently: the
# logits differ by a few float32 ulps (1e-6 here), and torch.topk breaks exact ties its own way.
TIE_MARGIN = 1e-4


def _module_run(module, x, dout):
    """(out, dx) of a transformers module on x (..., C), fed as the (B, T, C) = (1, N, C) it takes."""
    C = x.shape[-1]
    xt = to_torch(x.reshape(1, -1, C), requires_grad=True)
    out = module(xt)
    (out * to_torch(dout.reshape(1, -1, C))).sum().backward()
    return to_numpy(out).reshape(x.shape), to_numpy(xt.grad).reshape(x.shape)


@given(case=gpt_oss_cases() | deepseek_cases())
@_with_examples
def test_twin_matches_transformers(case):
    """The twins against GptOssMLP and DeepseekV3MoE, forward and every gradient."""
    kind = _kind(case)
    x, params, hyper, dout = case
    assume(_margin(kind, x, params, hyper) > TIE_MARGIN)
    twin_out, twin_grads = _twin(kind, *case)
    if kind == "gpt_oss":
        name, tol = "GptOssMLP", _terms_tol(*case)
        mlp = _gpt_oss_module(params, hyper, to_torch(x).dtype)
        out, dx = _module_run(lambda xt: mlp(xt)[0], x, dout)       # [1] is the router's scores
        grads = _gpt_oss_module_grads(mlp)
    else:
        # DeepseekV3TopkRouter casts x and its weight to float32 whatever the module's dtype, so its
        # routing weights, and every gradient through them, carry float32's rounding in float64 too:
        # float32's tolerance then, on the same sums of terms.
        name, tol = "DeepseekV3MoE", _terms_tol(*case, base=TOLERANCES[np.dtype(np.float32)])
        moe = _deepseek_module(params, hyper, to_torch(x).dtype)
        out, dx = _module_run(moe, x, dout)
        grads = _deepseek_module_grads(moe, params["experts"]["gate"]["w"].shape[-1])
        del twin_grads["params"]["selection_bias"]                   # a buffer there, no gradient
    assert_close(f"{kind}_moe.out vs {name}", twin_out, out, **tol["out"])
    assert_close(f"{kind}_moe.dx vs {name}", twin_grads["x"], dx, **tol["x"])
    _assert_grads(f"{kind}_moe vs {name}", twin_grads["params"], grads, tol)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

def _choice_scale(kind, x, params):
    """The largest |value| the choice ranks, in float64: the router's logits (gpt-oss), or 2 for
    DeepSeek's group scores (two sigmoid scores plus a selection bias in [0, 1))."""
    if kind == "deepseek":
        return 2.0
    xs = x.reshape(-1, x.shape[-1]).astype(np.float64)
    return float(np.max(np.abs(xs @ params["router"]["w"].astype(np.float64) + params["router"]["b"]), initial=1.0))


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=gpt_oss_cases(dtype=np.float64) | deepseek_cases(dtype=np.float64))
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth (the twin in float64 on the rounded inputs), within
    twice the error of transformers' GptOssMLP or DeepseekV3MoE in the low dtype: out, dx and every
    parameter's gradient. The top-k choice must be the same on all sides for the errors to compare:
    the drawn cases keep their choice unambiguous, a gap of 8 low-precision ulps of the largest
    value ranked between what is chosen and what is not (PyTorch's logits in bfloat16 are off by up
    to an ulp each; inside that gap a different choice would be rounding, not a defect)."""
    kind = _kind(case)
    x, params, hyper, dout = case
    x, dout, params = round_to(x, dtype), round_to(dout, dtype), tree_map(lambda p: round_to(p, dtype), params)
    assume(_margin(kind, x, params, hyper) > 8 * ulp(_choice_scale(kind, x, params), dtype))
    # One normalised weight is s / (s + 1e-20) = 1, its router gradient 1e-20 / s^2, nothing: the
    # twin's autograd of the quotient leaves float32's cancellation of two terms (3.1e-7 against a
    # truth of 1e-38 on x = [3], router.w = [0.25, 0]) where PyTorch's and NumPy's give 0. That is
    # float32's, not the low dtype's, rounding: left to the float32 tests.
    assume(not (kind == "deepseek" and hyper["norm_topk_prob"] and hyper["k"] == 1))
    out, _, dx, grads = _run(kind, x, params, hyper, dout)
    twin_out, twin_grads = _twin(kind, x, params, hyper, dout)
    truth_out, truth_grads = _twin(kind, x.astype(np.float64), tree_map(lambda p: p.astype(np.float64), params),
                                   hyper, dout.astype(np.float64))
    if kind == "gpt_oss":
        mlp = _gpt_oss_module(params, hyper, LOW_DTYPES[dtype][1])
        torch_out, torch_dx = _module_run(lambda xt: mlp(xt)[0], x, dout)
        torch_grads = _gpt_oss_module_grads(mlp)
    else:
        moe = _deepseek_module(params, hyper, LOW_DTYPES[dtype][1])
        torch_out, torch_dx = _module_run(moe, x, dout)
        torch_grads = _deepseek_module_grads(moe, params["experts"]["gate"]["w"].shape[-1])
        for g in (grads, twin_grads["params"], truth_grads["params"]):
            del g["selection_bias"]                                   # a buffer there, no gradient
    for who, (o, g) in {"numpy": (out, {"x": dx, "params": grads}), "twin": (twin_out, twin_grads)}.items():
        assert_tree_error_budget(f"{kind}_moe[{who}]", dtype, {"out": o, "d": g},
                                 {"out": torch_out, "d": {"x": torch_dx, "params": torch_grads}},
                                 {"out": truth_out, "d": truth_grads})


@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("kind", ["gpt_oss", "deepseek"])
def test_mixed_low_precision_dtypes_are_refused(kind, dtype):
    """A low-precision x with one float32 parameter is a mix, refused before anything is cast up."""
    x, params, hyper, _ = {"gpt_oss": ONE_TOKEN_GPT_OSS, "deepseek": ONE_TOKEN_DEEPSEEK}[kind]
    x, params = round_to(x, dtype), tree_map(lambda p: round_to(p, dtype), params)
    params["router"]["w"] = params["router"]["w"].astype(np.float32)
    with pytest.raises(TypeError, match=f"x is {dtype}, router.w is float32"):
        LAYERS[kind][0](x, params, **hyper)


@given(values=hnp.arrays(np.float64, (3, 5), elements=S.floats(np.float64), unique=True), k=st.integers(1, 5))
def test_top_k_equals_torch_topk(values, k):
    """On distinct values (torch.topk orders ties its own way) the same experts in the same order."""
    expected = torch.topk(to_torch(values), k, dim=-1).indices
    assert np.array_equal(to_numpy(twin.top_k(to_torch(values), k)), to_numpy(expected)), "top_k vs torch.topk"


# -- properties ---------------------------------------------------------------------------------

@given(case=deepseek_cases(dtype=np.float64))
def test_deepseek_weights_are_scores_and_groups_are_limited(case):
    """The selection bias chooses but does not weight: the weights are the chosen experts' plain
    sigmoid scores (normalised, scaled); the chosen experts lie in at most topk_group groups."""
    x, params, hyper, _ = case
    tokens = x.reshape(-1, x.shape[-1])
    weights, indices, _ = deepseek_router_forward(tokens, params["router"], params["selection_bias"], **hyper)
    scores = 1 / (1 + np.exp(-(tokens @ params["router"]["w"])))
    chosen = np.take_along_axis(scores, indices, axis=-1)
    if hyper["norm_topk_prob"]:
        chosen = chosen / (chosen.sum(axis=-1, keepdims=True) + 1e-20)
    assert_close("deepseek routing weights vs sigmoid scores", weights, chosen * hyper["routed_scaling_factor"])
    per_group = params["selection_bias"].shape[0] // hyper["n_group"]
    for row in indices:
        assert len(set(row // per_group)) <= hyper["topk_group"], f"experts {row} span too many groups"
        assert len(set(row)) == hyper["k"], f"experts {row} repeat"


@given(case=gpt_oss_cases(dtype=np.float64) | deepseek_cases(dtype=np.float64))
@example(case=ONE_TOKEN_GPT_OSS)
@example(case=ONE_TOKEN_DEEPSEEK)
def test_unchosen_experts_get_no_gradient(case):
    kind = _kind(case)
    _, cache, _, grads = _run(kind, *case)
    chosen = set(np.unique(cache.router.indices))
    for e in range(case[1]["experts"]["down"]["w"].shape[0]):
        if e not in chosen:
            for path, leaf in tree_leaves(grads["experts"]):
                assert not leaf[e].any(), f"expert {e} chose no token, yet its {path} gradient is nonzero"
    if kind == "deepseek":
        assert not grads["selection_bias"].any(), "selection_bias only chooses: its gradient is 0"


@given(case=gpt_oss_cases(dtype=np.float64) | deepseek_cases(dtype=np.float64), data=st.data())
def test_choice_is_piecewise_constant(case, data):
    """Away from ties a tiny change of x and of the router's weights chooses the same experts, and the
    hand-written gradient there still equals autograd's and the finite difference along it (taken
    away from the clamps' corners too, as test_backward_matches_finite_differences is)."""
    kind = _kind(case)
    x, params, hyper, dout = case
    assume(_margin(kind, x, params, hyper) > 1e-2)
    direction = {"x": data.draw(S.arrays(np.float64, x.shape, bound=1.0)),
                 "router": {key: data.draw(S.arrays(np.float64, w.shape, bound=1.0))
                            for key, w in params["router"].items()}}
    step = 1e-7                                               # moves a logit by at most 1e-7 (|x| + 1) C
    moved_x = x + step * direction["x"]
    moved = {**params, "router": tree_map(lambda w, d: w + step * d, params["router"], direction["router"])}
    _, cache, _, _ = _run(kind, *case)
    if kind == "gpt_oss":   # and away from the clamps' corners, where the finite difference averages two slopes
        for glu in (c.glu for c in cache.experts.expert_caches):
            assume(np.all(np.abs(glu.g - glu.limit) > 1e-2) and np.all(np.abs(np.abs(glu.u) - glu.limit) > 1e-2))
    _, moved_cache, dx, grads = _run(kind, moved_x, moved, hyper, dout)
    # The same experts per token (their order among tied chosen ones may change, which changes nothing).
    assert np.array_equal(np.sort(moved_cache.router.indices), np.sort(cache.router.indices)), \
        "a tiny change moved the choice"
    _, twin_grads = _twin(kind, moved_x, moved, hyper, dout)
    tol = _terms_tol(moved_x, moved, hyper, dout)
    assert_close(f"{kind}_moe.dx after a tiny change", dx, twin_grads["x"], **tol["x"])
    assert_tree_close(f"{kind}_moe.router after a tiny change", grads["router"], twin_grads["params"]["router"],
                      **tol["router"])

    def f(tree):
        out, _ = LAYERS[kind][0](tree["x"], {**moved, "router": tree["router"]}, **hyper)
        return float(np.sum(out * dout))

    # h = 1e-4 moves each logit by at most 2e-4 (|x| + |w| + 1) C < 1e-2 / 2: the choice holds.
    expected = directional_derivative(f, {"x": moved_x, "router": moved["router"]}, direction, h=1e-4)
    ours = {"x": dx, "router": grads["router"]}
    assert_close(f"{kind}_moe router and x gradients vs a finite difference", np.float64(tree_dot(ours, direction)),
                 np.float64(expected), **directional_tol(ours, direction))


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_init_shapes_and_dtype(dtype):
    rng = np.random.default_rng(0)
    gpt_oss = init_gpt_oss_moe_params(4, 3, 5, rng, dtype=dtype)
    deepseek = init_deepseek_moe_params(4, 3, 6, rng, n_shared=2, dtype=dtype)
    assert {p: a.shape for p, a in tree_leaves(gpt_oss)} == {
        "router.w": (4, 5), "router.b": (5,), "experts.gate.w": (5, 4, 3), "experts.gate.b": (5, 3),
        "experts.up.w": (5, 4, 3), "experts.up.b": (5, 3), "experts.down.w": (5, 3, 4), "experts.down.b": (5, 4)}
    assert {p: a.shape for p, a in tree_leaves(deepseek)} == {
        "router.w": (4, 6), "experts.gate.w": (6, 4, 3), "experts.up.w": (6, 4, 3), "experts.down.w": (6, 3, 4),
        "shared.gate.w": (4, 6), "shared.up.w": (4, 6), "shared.down.w": (6, 4), "selection_bias": (6,)}
    for path, leaf in tree_leaves(gpt_oss) + tree_leaves(deepseek):
        assert leaf.dtype == dtype, f"{path} dtype {leaf.dtype}"
    one_shared = init_deepseek_moe_params(4, 3, 6, rng, dtype=dtype)["shared"]   # n_shared = 1, as DeepSeek-V3
    assert {p: a.shape for p, a in tree_leaves(one_shared)} == {"gate.w": (4, 3), "up.w": (4, 3), "down.w": (3, 4)}


def test_init_draws_uniform_within_one_over_sqrt_fan_in():
    """Every leaf U(-1/sqrt(C_in), 1/sqrt(C_in)) as nn.Linear's default: the router and gate read C = 64
    inputs (bound 1/8), down reads H = 16 (bound 1/4); 4096 draws or more each, so the largest |w|
    lies within 1% of the bound and the std within 5% of bound / sqrt(3)."""
    params = init_deepseek_moe_params(64, 16, 8, np.random.default_rng(0), dtype=np.float64)
    for path, bound in (("router.w", 1 / 8), ("experts.gate.w", 1 / 8), ("experts.down.w", 1 / 4),
                        ("shared.down.w", 1 / 4)):
        w = dict(tree_leaves(params))[path]
        assert 0.99 * bound < np.abs(w).max() <= bound, f"{path}: max |w| {np.abs(w).max():.4g}, bound {bound}"
        assert abs(w.std() - bound / np.sqrt(3)) < 0.05 * bound / np.sqrt(3), f"{path}: std {w.std():.4g}"


def test_clamp_edges_pass_the_gradient_as_torch_clamp():
    """At g = limit and u = +-limit exactly, the clamps pass the gradient (torch.clamp's rule, which
    transformers' GptOssExperts uses); just past them it is 0 (float64, against autograd)."""
    alpha, limit = 1.702, 7.0
    g = np.array([limit, limit, np.nextafter(limit, 8.0), 1.0])
    u = np.array([limit, -limit, 1.0, np.nextafter(-limit, -8.0)])
    dout = np.array([0.5, -1.5, 2.0, 1.0])
    out, cache = clamped_glu_forward(g, u, alpha, limit)
    dg, du = clamped_glu_backward(dout, cache)

    def hf(g, u):
        gate, up = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    tg, tu = to_torch(g).requires_grad_(), to_torch(u).requires_grad_()
    (hf(tg, tu) * to_torch(dout)).sum().backward()
    assert_close("clamped_glu dg at the clamp's edges", dg, to_numpy(tg.grad), **TOLERANCES[np.dtype(np.float64)])
    assert_close("clamped_glu du at the clamp's edges", du, to_numpy(tu.grad), **TOLERANCES[np.dtype(np.float64)])


def test_router_weights_stay_positive_when_the_scores_underflow():
    """Router logits of -100 give sigmoid scores of 4e-44: the normalising sum's + 1e-20 (transformers'
    DeepseekV3MoE) keeps every weight positive and small instead of dividing by a vanishing sum, and
    equal to transformers' chosen / (sum + 1e-20)."""
    x = np.ones((2, 4))
    router = {"w": np.full((4, 4), -25.0)}
    weights, indices, _ = deepseek_router_forward(x, router, np.zeros(4), 2)
    assert np.all(weights > 0) and np.all(weights < 1e-20), f"weights {weights}"
    chosen = torch.sigmoid(to_torch(x) @ to_torch(router["w"])).gather(-1, to_torch(indices))
    expected = to_numpy(chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20))
    # As ratios: the weights (4e-24) lie far below any absolute tolerance.
    assert_close("deepseek_router weights of underflowing scores / transformers'", weights / expected,
                 np.ones_like(weights), **TOLERANCES[np.dtype(np.float64)])


def test_a_group_scores_its_best_two():
    """A hand-worked routing case (transformers' DeepseekV3MoE): two groups of three experts, one
    group kept. Every sigmoid score is 0.5 (router w = 0), so the selection bias alone chooses:
    group A (0.9, 0.9, 0.0) sums 1.8 over its best two, group B (0.8, 0.8, 0.8) 1.6 (2.4 over all
    three). The best two decide, so group A is kept and its experts 0 and 1 are chosen."""
    bias = np.array([0.4, 0.4, -0.5, 0.3, 0.3, 0.3])
    _, indices, _ = deepseek_router_forward(np.ones((1, 2)), {"w": np.zeros((2, 6))}, bias, 2, n_group=2,
                                            topk_group=1)
    assert indices.tolist() == [[0, 1]], f"chose {indices.tolist()}, not group A's experts 0 and 1"


def test_defaults_are_the_models():
    """gpt-oss's gated unit, expert and mixture default to transformers' GptOssConfig's swiglu_alpha
    and swiglu_limit (inputs past the limit, so that it matters); DeepSeek's router defaults to
    plain routing: no group limit, each token's k weights normalised to sum to 1, unscaled."""
    hf = GptOssConfig()
    alpha, limit = hf.swiglu_alpha, hf.swiglu_limit
    rng = np.random.default_rng(0)
    g, u = rng.uniform(-4 * limit, 4 * limit, (2, 40))
    assert np.array_equal(clamped_glu_forward(g, u)[0], clamped_glu_forward(g, u, alpha, limit)[0]), "clamped_glu"
    params = init_gpt_oss_moe_params(4, 3, 3, rng, dtype=np.float64)
    x = rng.normal(0, 10 * limit, (5, 4))
    assert np.array_equal(gpt_oss_moe_forward(x, params, 2)[0], gpt_oss_moe_forward(x, params, 2, alpha, limit)[0]), \
        "gpt_oss_moe"
    experts = {name: {key: w[0] for key, w in p.items()} for name, p in params["experts"].items()}
    assert np.array_equal(gpt_oss_expert_forward(x, experts)[0], gpt_oss_expert_forward(x, experts, alpha, limit)[0]), \
        "gpt_oss_expert"
    deepseek = init_deepseek_moe_params(4, 3, 6, rng, dtype=np.float64)
    weights, _, _ = deepseek_router_forward(x, deepseek["router"], deepseek["selection_bias"], 2)
    assert_close("deepseek_router weights' row sums", weights.sum(axis=-1), np.ones(5))
    plain = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0)
    assert np.array_equal(deepseek_moe_forward(x, deepseek, 2)[0], deepseek_moe_forward(x, deepseek, 2, **plain)[0]), \
        "deepseek_moe"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=gpt_oss_cases(dtype=np.float64, max_C=2, max_H=2, max_E=3, max_dims=1, x_bound=1.0)
       | deepseek_cases(dtype=np.float64, max_C=2, max_H=2, max_dims=1, x_bound=1.0))
@example(case=ONE_TOKEN_GPT_OSS)
@example(case=ALL_EXPERTS_DEEPSEEK)
def test_backward_matches_finite_differences(case):
    """Every gradient against finite differences, away from ties and from the clamps' corners: the
    stencil's 4h = 4e-3 moves a logit or a gate by at most 4e-3 (|x| + |w| + 1) C < 0.05."""
    kind = _kind(case)
    x, params, hyper, dout = case
    assume(_margin(kind, x, params, hyper) > 0.1)
    _, cache, dx, grads = _run(kind, *case)
    if kind == "gpt_oss":
        for glu in (c.glu for c in cache.experts.expert_caches):
            assume(np.all(np.abs(glu.g - glu.limit) > 0.05) and np.all(np.abs(np.abs(glu.u) - glu.limit) > 0.05))
    forward = LAYERS[kind][0]
    expected = {"x": numerical_grad(lambda x: forward(x, params, **hyper)[0], x.copy(), dout)}
    flat = dict(tree_leaves(params))
    for path, leaf in flat.items():
        def f(value, path=path):
            return forward(x, _replace(params, path, value), **hyper)[0]
        expected[path] = numerical_grad(f, leaf.copy(), dout)
    ours = {"x": dx, **dict(tree_leaves(grads))}
    assert_tree_close(f"{kind}_moe vs finite differences", ours, expected, **FD_TOL)


def _replace(params, path, value):
    """params with the leaf at the dotted ``path`` replaced (the rest shared)."""
    head, _, rest = path.partition(".")
    return {**params, head: _replace(params[head], rest, value) if rest else value}


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(kind, dtype):
    case = ONE_TOKEN_GPT_OSS if kind == "gpt_oss" else ALL_EXPERTS_DEEPSEEK
    x, params, hyper, dout = (case[0].astype(dtype), tree_map(lambda a: a.astype(dtype), case[1]), case[2],
                              case[3].astype(dtype))
    # NumPy float64 hyper-parameters (limit, routed_scaling_factor) must not promote float32 results.
    hyper = {key: np.float64(value) if isinstance(value, float) else value for key, value in hyper.items()}
    out, _, dx, grads = _run(kind, x, params, hyper, dout)
    assert out.dtype == dtype, f"{kind}_moe.out dtype {out.dtype}"
    assert dx.dtype == dtype, f"{kind}_moe.dx dtype {dx.dtype}"
    for path, leaf in tree_leaves(grads):
        assert leaf.dtype == dtype, f"{kind}_moe.{path} gradient dtype {leaf.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    x, params, hyper, _ = ONE_TOKEN_GPT_OSS                          # C = 3, H = 2, E = 3
    with pytest.raises(ValueError, match=r"^k = 4 must lie in \[1, 3\]: n_experts = 3 \(router.w \(3, 3\)\)$"):
        gpt_oss_moe_forward(x, params, k=4)
    with pytest.raises(ValueError, match=r"k = 0 must lie in \[1, 3\]"):
        gpt_oss_moe_forward(x, params, k=0)
    with pytest.raises(TypeError, match="k must be an integer, got float 1.0"):
        gpt_oss_moe_forward(x, params, k=1.0)
    with pytest.raises(TypeError, match="x must be float16, bfloat16, float32 or float64, got dtype int64"):
        gpt_oss_moe_forward(np.zeros((1, 3), np.int64), params, k=1)
    with pytest.raises(TypeError, match="x must be a NumPy array, got list"):
        gpt_oss_moe_forward([[0.0, 0.0, 0.0]], params, k=1)
    with pytest.raises(ValueError, match=r"x of shape \(1, 3\) holds NaN or inf"):
        gpt_oss_moe_forward(np.full((1, 3), np.nan), params, k=1)
    with pytest.raises(ValueError, match=r"router.w must have shape \(4, 3\) for x \(1, 4\), got \(3, 3\)"):
        gpt_oss_moe_forward(np.zeros((1, 4)), params, k=1)
    bad = {**params, "experts": {**params["experts"], "down": {"w": np.zeros((3, 5, 3)), "b": np.zeros((3, 3))}}}
    with pytest.raises(ValueError, match=r"experts.down.w must have shape \(3, 2, 3\) for x \(1, 3\), got \(3, 5, 3\)"):
        gpt_oss_moe_forward(x, bad, k=1)
    with pytest.raises(ValueError, match=r"params must hold .*got \['experts.down.b', .*'router.w'\]"):
        gpt_oss_moe_forward(x, {**params, "router": {"w": params["router"]["w"]}}, k=1)
    with pytest.raises(TypeError, match="x is float32, router.w is float64"):
        gpt_oss_moe_forward(x.astype(np.float32), params, k=1)
    with pytest.raises(ValueError, match="limit must be > 0, got 0.0"):
        gpt_oss_moe_forward(x, params, k=1, limit=0.0)
    with pytest.raises(TypeError, match="alpha must be a finite real number, got float nan"):
        gpt_oss_moe_forward(x, params, k=1, alpha=float("nan"))
    with pytest.raises(TypeError, match="rng must be a np.random.Generator, got int"):
        init_gpt_oss_moe_params(3, 2, 3, 0)
    _, cache = gpt_oss_moe_forward(x, params, k=1)
    with pytest.raises(ValueError, match=r"gpt_oss_moe: dout must have the shape .* \(1, 3\), got \(3,\)"):
        gpt_oss_moe_backward(np.zeros(3), cache)
    with pytest.raises(ValueError, match=r"^router.w must have shape \(C, E\) = \(3, n_experts\), got list$"):
        gpt_oss_moe_forward(x[None], {**params, "router": {**params["router"], "w": [[0.0] * 3] * 3}}, k=1)
    with pytest.raises(TypeError, match=r"^params must be a dict, got list$"):
        gpt_oss_moe_forward(x, [params], k=1)
    with pytest.raises(ValueError, match=r"^x must have shape \(\.\.\., C\), got \(\)$"):
        gpt_oss_moe_forward(np.array(1.0), params, k=1)
    no_gate = {**params, "experts": {k: v for k, v in params["experts"].items() if k != "gate"}}
    with pytest.raises(ValueError, match=r"^params must hold .*, got \['experts.down.b', 'experts.down.w', 'exp"):
        gpt_oss_moe_forward(x, no_gate, k=1)
    down = {**params["experts"]["down"], "b": np.zeros((3, 3), int)}
    ints = {**params, "experts": {**params["experts"], "down": down}}
    with pytest.raises(TypeError, match=r"^experts.down.b must be float16, bfloat16, float32 or float64, got dtype "):
        gpt_oss_moe_forward(x, ints, k=1)
    _, cache = clamped_glu_forward(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"^clamped_glu: dout must have the shape .*\(2, 3\).*got \(3,\)"):
        clamped_glu_backward(np.zeros(3), cache)

    x, params, hyper, _ = ALL_EXPERTS_DEEPSEEK                       # E = 4
    kw = dict(n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0)
    with pytest.raises(ValueError, match=r"k = 5 must lie in \[1, 4\]: n_experts = 4"):
        deepseek_moe_forward(x, params, k=5, **kw)
    with pytest.raises(ValueError, match=r"^k = 3 must lie in \[1, 2\]: the 2 experts in topk_group = 1 groups of 2$"):
        deepseek_moe_forward(x, params, k=3, **kw)
    with pytest.raises(ValueError, match=r"topk_group = 3 must lie in \[1, 2\]: n_group = 2"):
        deepseek_moe_forward(x, params, k=1, **{**kw, "topk_group": 3})
    with pytest.raises(ValueError, match="n_experts = 4 is not divisible by n_group = 3"):
        deepseek_moe_forward(x, params, k=1, **{**kw, "n_group": 3})
    with pytest.raises(ValueError, match="^n_group = 4 leaves 1 expert per group of n_experts = 4; a group's score is "
                                         "the sum of its best 2$"):
        deepseek_moe_forward(x, params, k=1, **{**kw, "n_group": 4})
    with pytest.raises(TypeError, match="norm_topk_prob must be a bool, got str 'yes'"):
        deepseek_moe_forward(x, params, k=1, **{**kw, "norm_topk_prob": "yes"})
    with pytest.raises(TypeError, match="routed_scaling_factor must be a finite real number, got float inf"):
        deepseek_moe_forward(x, params, k=1, **{**kw, "routed_scaling_factor": float("inf")})
    with pytest.raises(TypeError, match="^routed_scaling_factor must be a finite real number, got str '2'$"):
        deepseek_moe_forward(x, params, k=1, **{**kw, "routed_scaling_factor": "2"})   # not read as 2.0
    with pytest.raises(ValueError, match=r"selection_bias must have shape \(4,\) for x \(3, 3\), got \(3,\)"):
        deepseek_moe_forward(x, {**params, "selection_bias": np.zeros(3)}, k=1, **kw)
    with pytest.raises(ValueError, match=r"shared.down.w must have shape \(2, 3\) for x \(3, 3\), got \(3, 3\)"):
        deepseek_moe_forward(x, {**params, "shared": {**params["shared"], "down": {"w": np.zeros((3, 3))}}}, k=1, **kw)
    no_shared_gate = {**params, "shared": {k: v for k, v in params["shared"].items() if k != "gate"}}
    with pytest.raises(ValueError, match=r"^params must hold .*'shared.gate.w'.*, got \['experts"):
        deepseek_moe_forward(x, no_shared_gate, k=1, **kw)
    _, cache = deepseek_moe_forward(x, params, k=1, **kw)
    with pytest.raises(TypeError, match="deepseek_moe: dout must have the dtype of the forward's output, float64"):
        deepseek_moe_backward(np.zeros((3, 3), np.float32), cache)


def test_top_k_refuses_k_beyond_the_experts():
    """torch.topk refuses k > E; argsort would quietly return all E indices."""
    with pytest.raises(RuntimeError):
        torch.topk(torch.arange(4.0), 5)
    with pytest.raises(ValueError,
                       match=r"^k = 5 must lie in \[1, 4\]: E = 4 scores along the last axis \(scores \(4,\)\)$"):
        top_k(np.arange(4.0), 5)
    with pytest.raises(ValueError, match=r"^k = 0 must lie in \[1, 4\]"):
        top_k(np.arange(4.0), 0)
    with pytest.raises(ValueError, match=r"^scores of shape \(4,\) hold NaN or \+inf"):
        top_k(np.array([0.0, np.nan, 1.0, 2.0]), 2)
    assert np.array_equal(top_k(np.array([0.0, -np.inf, 1.0, 2.0]), 4), [3, 2, 0, 1]), "-inf is chosen last"


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_routers_are_refused(bad):
    """A NaN in one router weight would quietly never choose its expert (argsort puts NaN last) and
    the output would stay finite: each router array is refused by name, through the layer and
    through the router alone."""
    x, params, hyper, _ = ONE_TOKEN_GPT_OSS
    for key in ("w", "b"):
        router = {**params["router"], key: params["router"][key].copy()}
        router[key].flat[1] = bad
        with pytest.raises(ValueError, match=rf"^router.{key} of shape .* holds NaN or inf"):
            gpt_oss_moe_forward(x, {**params, "router": router}, **hyper)
        with pytest.raises(ValueError, match=rf"^router.{key} of shape .* holds NaN or inf"):
            gpt_oss_router_forward(x, router, 1)
    x, params, hyper, _ = ALL_EXPERTS_DEEPSEEK
    router = {"w": params["router"]["w"].copy()}
    router["w"][0, 1] = bad
    with pytest.raises(ValueError, match=r"^router.w of shape .* holds NaN or inf"):
        deepseek_moe_forward(x, {**params, "router": router}, **hyper)
    with pytest.raises(ValueError, match=r"^router.w of shape .* holds NaN or inf"):
        deepseek_router_forward(x, router, params["selection_bias"], 1)
    bias = params["selection_bias"].copy()
    bias[2] = bad
    with pytest.raises(ValueError, match=r"^selection_bias of shape \(4,\) holds NaN or inf"):
        deepseek_moe_forward(x, {**params, "selection_bias": bias}, **hyper)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_overflowing_router_logits_are_refused():
    """Finite float32 weights whose logits overflow to inf would give a NaN routing weight."""
    x, params, hyper, _ = ONE_TOKEN_GPT_OSS
    x, params = x.astype(np.float32), tree_map(lambda p: p.astype(np.float32), params)
    router = {"w": np.full_like(params["router"]["w"], 3e38), "b": params["router"]["b"]}
    with pytest.raises(ValueError, match=r"^scores of shape \(1, 3\) hold NaN or \+inf"):
        gpt_oss_moe_forward(np.abs(x) + 1, {**params, "router": router}, **hyper)


def test_n_group_below_one_is_refused():
    """n_group = 0 divides by zero where the experts are split into groups."""
    x, params, hyper, _ = ALL_EXPERTS_DEEPSEEK                       # E = 4
    for n_group in (0, -2):
        match = rf"^n_group = {n_group} must lie in \[1, 4\]: n_experts = 4$"
        with pytest.raises(ValueError, match=match):
            deepseek_moe_forward(x, params, k=1, n_group=n_group, topk_group=1)
        with pytest.raises(ValueError, match=match):
            deepseek_router_forward(x, params["router"], params["selection_bias"], 1, n_group=n_group)


def test_numbers_lost_in_float32_are_refused():
    """alpha, limit and routed_scaling_factor of 1e300 are finite in float64 but inf in float32,
    where float32 (and float16, bfloat16) layers compute: sigmoid(inf * 0) and inf * weight are NaN."""
    for kind, name in (("gpt_oss", "alpha"), ("gpt_oss", "limit"), ("deepseek", "routed_scaling_factor")):
        x, params, hyper, _ = {"gpt_oss": ONE_TOKEN_GPT_OSS, "deepseek": ONE_TOKEN_DEEPSEEK}[kind]
        x, params = x.astype(np.float32), tree_map(lambda p: p.astype(np.float32), params)
        with pytest.raises(ValueError, match=rf"^{name} must be finite .* in float32, the dtype it is computed in: "
                                             rf"{name} = 1e\+300 overflows to inf$"):
            LAYERS[kind][0](x, params, **{**hyper, name: 1e300})


@pytest.mark.parametrize("kind", LAYERS)
def test_leading_axes_are_tokens_alike(kind):
    """x (B, T, C) is routed as its B * T tokens (C,) each: out, dx and every gradient equal those
    of the flattened (B * T, C) input, bit for bit (the router picks along the experts' axis)."""
    x, params, hyper, dout = ALL_EXPERTS_GPT_OSS if kind == "gpt_oss" else ALL_EXPERTS_DEEPSEEK
    forward, backward, _ = LAYERS[kind]
    x3, dout3 = np.stack([x, x[::-1]]), np.stack([dout, dout[::-1]])         # (2, N, C)
    out3, cache3 = forward(x3, params, **hyper)
    out2, cache2 = forward(x3.reshape(-1, x.shape[-1]), params, **hyper)
    dx3, grads3 = backward(dout3, cache3)
    dx2, grads2 = backward(dout3.reshape(-1, x.shape[-1]), cache2)
    assert out3.shape == x3.shape and np.array_equal(out3.reshape(out2.shape), out2), f"{kind} out"
    assert np.array_equal(dx3.reshape(dx2.shape), dx2), f"{kind} dx"
    for (path, g3), (_, g2) in zip(tree_leaves(grads3), tree_leaves(grads2), strict=True):
        assert np.array_equal(g3, g2), f"{kind} {path}"
