"""The operations to benchmark, one entry each, named by the stem their files share.

An op's stem names ``numpy_attn/<stem>.py`` (the forward/backward pair), ``torch_attn/<stem>.py``
(the twin) and ``parity_tests/test_<stem>.py``. An op whose module or functions do not exist yet
is reported as not available, so ``python -m benchmarks`` works at every commit.

Adding an op is one ``Op(...)`` in ``OPS`` plus, at most, an inputs function and a builtin call:

    Op("layer_norm", stem="layer_norm", forward="layer_norm_forward",
       backward="layer_norm_backward", twin="layer_norm", builtin="F.layer_norm",
       inputs=_layer_norm_inputs, flops=lambda z: 8 * z.B * z.T * z.C, bwd_factor=1.0,
       call_builtin=lambda t, static: F.layer_norm(t["x"], t["x"].shape[-1:], t["w"], t["b"]))

This module imports NumPy only: the NumPy worker imports it and must never load torch.
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

IMPLS = ("numpy", "twin", "builtin")
MODES = ("fwd", "fwd+bwd")


class Size(NamedTuple):
    """Benchmark size (the dimension key of numpy_attn/__init__.py); self-attention, so S = T."""

    B: int
    nh: int
    T: int
    hs: int

    @property
    def S(self):
        return self.T

    @property
    def C(self):
        return self.nh * self.hs


@dataclass(frozen=True)
class Op:
    """One benchmarked operation.

    ``inputs(size, dtype, rng) -> (diff, static)``: ``diff`` holds the arrays (or nested parameter
    dicts) that gradients flow to, in the order the NumPy backward returns their gradients;
    ``static`` holds the other keyword arguments. Both twins are called as ``f(**diff, **static)``.
    ``flops(size)`` counts the forward; forward+backward counts ``1 + bwd_factor`` times that.
    ``call_builtin(tensors, static)`` runs the PyTorch built-in on torch tensors shaped like diff.
    ``numpy_module`` times a tuned kernel in place of ``numpy_attn/<stem>.py`` (e.g.
    ``numpy_attn.kernels.flash_attention``); the twin stays ``torch_attn/<stem>.py``.
    ``dense_scores``: numpy_attn and the twin hold every score, a (B, nh, T, S) array (False for
    the tiled paths, flash and flex, which hold a tile at a time).
    ``decode_step``: one new token over T = S tokens held (the plots' second axis), not a
    layer computing T tokens.
    """

    name: str
    stem: str
    forward: str | Callable
    backward: str | Callable
    twin: str | Callable
    builtin: str | None
    inputs: Callable
    flops: Callable
    call_builtin: Callable | None
    bwd_factor: float = 2.0
    numpy_module: str | None = None
    dense_scores: bool = True
    decode_step: bool = False

    def numpy_functions(self):
        """(forward, backward) from numpy_attn/<stem>.py; ImportError/AttributeError if absent.

        A callable forward/backward is a composite (e.g. model + loss) written below; the stem's
        module must still exist.
        """
        module = importlib.import_module(self.numpy_module or f"numpy_attn.{self.stem}")
        return tuple(f if callable(f) else getattr(module, f) for f in (self.forward, self.backward))

    def twin_function(self):
        """The forward from torch_attn/<stem>.py (imports torch)."""
        module = importlib.import_module(f"torch_attn.{self.stem}")
        return self.twin if callable(self.twin) else getattr(module, self.twin)

    def describe(self):
        """{"numpy", "twin", "builtin"}: where each implementation lives, for the report."""
        def label(f, path):
            return f"{path}:{f}" if isinstance(f, str) else f"benchmarks/registry.py:{f.__name__}"
        numpy_path = (self.numpy_module or f"numpy_attn.{self.stem}").replace(".", "/") + ".py"
        return dict(numpy=f"{label(self.forward, numpy_path)} + {label(self.backward, numpy_path)}",
                    twin=label(self.twin, f"torch_attn/{self.stem}.py"), builtin=self.builtin)

    def count_flops(self, size, mode):
        forward = self.flops(size)
        return forward if mode == "fwd" else round(forward * (1 + self.bwd_factor))

    def missing(self, impl):
        """Why ``impl`` cannot run yet (a sentence), or None when it can.

        Every impl needs the NumPy pair: it is the parity reference.
        """
        try:
            self.numpy_functions()
            if impl == "twin":
                self.twin_function()
        except (ImportError, AttributeError) as err:
            return f"not available: {err}"
        if impl == "builtin" and self.call_builtin is None:
            return f"PyTorch has no built-in {self.name}"
        return None


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# -- inputs -----------------------------------------------------------------------------------

def _scores_inputs(z, dtype, rng):
    return {"x": _normal(rng, (z.B, z.nh, z.T, z.S), dtype)}, {}     # attention scores


def _qkv_inputs(causal):
    def inputs(z, dtype, rng):
        diff = {
            "q": _normal(rng, (z.B, z.nh, z.T, z.hs), dtype),
            "k": _normal(rng, (z.B, z.nh, z.S, z.hs), dtype),
            "v": _normal(rng, (z.B, z.nh, z.S, z.hs), dtype),
        }
        return diff, {"is_causal": causal}
    return inputs


def _mha_inputs(z, dtype, rng):
    from numpy_attn.multi_head import init_multi_head_params

    x = _normal(rng, (z.B, z.T, z.C), dtype)
    params = init_multi_head_params(z.C, rng, bias=True, dtype=dtype)
    return {"x": x, "params": params}, {"num_heads": z.nh}


def _block_inputs(z, dtype, rng):
    from numpy_attn.block import init_block_params

    x = _normal(rng, (z.B, z.T, z.C), dtype)
    return {"x": x, "params": init_block_params(z.C, rng, bias=True, dtype=dtype)}, {"num_heads": z.nh}


# The GPT step: a small GPT-2 (learned positions, tied head, no dropout) at the sweep's B, T, nh,
# hs; the layer count and vocabulary are fixed here, small enough for T = 2048 on a laptop.
GPT_LAYERS, GPT_VOCAB = 2, 4096


def _gpt_config(z):
    from numpy_attn.gpt import GPTConfig

    return GPTConfig(vocab_size=GPT_VOCAB, block_size=z.T, n_layer=GPT_LAYERS, n_head=z.nh,
                     n_embd=z.C, dropout=0.0)


def _gpt_inputs(z, dtype, rng):
    from numpy_attn.gpt import init_gpt_params

    config = _gpt_config(z)
    params = init_gpt_params(config, rng, dtype=dtype)
    ids = rng.integers(0, GPT_VOCAB, (z.B, z.T + 1))               # next-token targets
    return {"params": params}, {"ids": ids[:, :-1], "targets": ids[:, 1:], "config": config}


def _gpt_step_forward(params, ids, targets, config):
    """Loss of one batch: gpt_forward then cross_entropy_forward -> (loss, caches)."""
    from numpy_attn.gpt import gpt_forward
    from numpy_attn.loss import cross_entropy_forward

    logits, gpt_cache = gpt_forward(ids, params, config)           # (B, T, V)
    loss, loss_cache = cross_entropy_forward(logits, targets)      # 0-d
    return loss, (gpt_cache, loss_cache)


def _gpt_step_backward(dloss, cache):
    """Gradients of the loss: the parameters' (the optimizer's update, O(parameters), is left out)."""
    from numpy_attn.gpt import gpt_backward
    from numpy_attn.loss import cross_entropy_backward

    gpt_cache, loss_cache = cache
    return gpt_backward(cross_entropy_backward(dloss, loss_cache), gpt_cache)


def _gpt_step_twin(params, ids, targets, config):
    from torch_attn.gpt import gpt
    from torch_attn.loss import cross_entropy

    return cross_entropy(gpt(ids, params, config), targets)


# -- PyTorch built-ins (torch is imported here, never at module level) ------------------------

def _builtin_softmax(t, static):
    import torch

    return torch.softmax(t["x"], dim=-1)


def _builtin_sdpa(t, static):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=static["is_causal"])


def _builtin_sdpa_decode(t, static):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(t["q"], t["k"], t["v"])


def _builtin_mha(t, static):
    """F.multi_head_attention_forward, the function behind nn.MultiheadAttention.

    Called functionally so that the gradients land on our parameter dict (for the parity check);
    nn.MultiheadAttention stores the transposed weights, q/k/v packed in one (3C, C) matrix.
    """
    import torch.nn.functional as F

    from benchmarks.convert import to_mha

    x, s = t["x"], to_mha(t["params"])
    C = x.shape[-1]
    x_tbc = x.transpose(0, 1)                      # (B, T, C) -> (T, B, C): sequence first
    out, _ = F.multi_head_attention_forward(
        x_tbc, x_tbc, x_tbc, C, static["num_heads"], s["in_proj_weight"], s["in_proj_bias"], None,
        None, False, 0.0, s["out_proj.weight"], s["out_proj.bias"], training=True, need_weights=False,
    )
    return out.transpose(0, 1)                     # (T, B, C) -> (B, T, C)


_ENCODER_LAYERS = {}     # (C, nh, dtype, device) -> nn.TransformerEncoderLayer, built once


def _builtin_block(t, static):
    """nn.TransformerEncoderLayer (pre-LN, GELU, causal) run on our parameters.

    torch.func.functional_call swaps our tensors in for the module's own, so the gradients land on
    our parameter dict; nn.Linear stores w transposed and packs q, k, v into one (3C, C) matrix.
    """
    import torch
    from torch import nn

    from benchmarks.convert import to_encoder_layer

    x, p = t["x"], t["params"]
    B, T, C = x.shape
    key = (C, static["num_heads"], x.dtype, x.device)
    if key not in _ENCODER_LAYERS:
        _ENCODER_LAYERS[key] = nn.TransformerEncoderLayer(
            C, static["num_heads"], dim_feedforward=4 * C, dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True, dtype=x.dtype, device=x.device)
    weights = to_encoder_layer(p)
    mask = nn.Transformer.generate_square_subsequent_mask(T, device=x.device, dtype=x.dtype)
    return torch.func.functional_call(_ENCODER_LAYERS[key], weights, (x,),
                                      {"src_mask": mask, "is_causal": True})


# -- FlexAttention: a block-sparse mask through the tiled path, the dense path and SDPA -------

FLEX_WINDOW = 256          # sliding-window width
FLEX_BLOCK = 128           # block mask tile (torch's default)


def flex_document_lengths(T):
    """Packed documents of T // 16 to T // 4 tokens (seeded by T, so every run packs the same)."""
    import numpy as np

    rng = np.random.default_rng([7, T])
    lengths = []
    while sum(lengths) < T:
        lengths.append(min(int(rng.integers(max(T // 16, 1), max(T // 4, 2))), T - sum(lengths)))
    return lengths


def _flex_mask_mod(lib, mask, T):
    """The row's mask_mod written with ``lib`` (numpy_attn's or torch_attn's flex_attention)."""
    if mask == "sliding_window":
        return lib.sliding_window(FLEX_WINDOW)
    return lib.and_masks(lib.document(flex_document_lengths(T)), lib.causal)


_FLEX_BLOCK_MASKS = {}     # (mask, T) -> numpy_attn BlockMask, built once (outside the timing)


def _flex_block_mask(mask, T):
    from numpy_attn import flex_attention as nf

    if (mask, T) not in _FLEX_BLOCK_MASKS:
        _FLEX_BLOCK_MASKS[(mask, T)] = nf.create_block_mask(_flex_mask_mod(nf, mask, T), None, None,
                                                            T, T, BLOCK_SIZE=FLEX_BLOCK)
    return _FLEX_BLOCK_MASKS[(mask, T)]


def _flex_inputs(mask):
    def inputs(z, dtype, rng):
        diff, _ = _qkv_inputs(False)(z, dtype, rng)
        return diff, {"mask": mask}
    return inputs


def _flex_tiled_forward(q, k, v, mask):
    """The tiled path: only the tiles the block mask lists."""
    from numpy_attn.flex_attention import flex_attention_forward

    return flex_attention_forward(q, k, v, block_mask=_flex_block_mask(mask, q.shape[2]))


def _flex_dense_forward(q, k, v, mask):
    """The dense path: every score, then mask_mod everywhere (its backward is dense too)."""
    from numpy_attn.flex_attention import dense_flex_attention_forward

    return dense_flex_attention_forward(q, k, v, block_mask=_flex_block_mask(mask, q.shape[2]))


def _flex_backward(dout, cache):
    """(dq, dk, dv): no score_mod, so no parameter gradients."""
    from numpy_attn.flex_attention import flex_attention_backward

    return flex_attention_backward(dout, cache)[:3]


def _flex_twin(q, k, v, mask):
    from torch_attn import flex_attention as tf

    class _Mask:           # the twin reads only a block mask's mask_mod
        mask_mod = _flex_mask_mod(tf, mask, q.shape[2])
    return tf.flex_attention(q, k, v, block_mask=_Mask)


def _builtin_sdpa_flex_mask(t, static):
    """F.scaled_dot_product_attention with the equivalent dense boolean mask (True = attend)."""
    import torch
    import torch.nn.functional as F

    from torch_attn import flex_attention as tf

    T = t["q"].shape[2]
    idx = torch.arange(T, device=t["q"].device)
    keep = _flex_mask_mod(tf, static["mask"], T)(0, 0, idx[:, None], idx[None, :])   # (T, T)
    return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=keep)


def _flex_kept_pairs(mask, T):
    """Query-key pairs the mask keeps: the useful work."""
    if mask == "sliding_window":
        return sum(min(t + 1, FLEX_WINDOW) for t in range(T))
    return sum(n * (n + 1) // 2 for n in flex_document_lengths(T))


def _flex_ops():
    """flex_<mask> (tiled) and flex_<mask>_dense for the sliding window and causal documents.

    FLOPs count only the kept pairs, 4 hs per pair, for both paths: the dense path's larger time
    for the same useful work is the point of the comparison.
    """
    for mask in ("sliding_window", "document"):
        for suffix, forward in (("", _flex_tiled_forward), ("_dense", _flex_dense_forward)):
            yield Op(f"flex_{mask}{suffix}", stem="flex_attention", forward=forward,
                     backward=_flex_backward, twin=_flex_twin,
                     builtin="F.scaled_dot_product_attention (dense bool mask)",
                     inputs=_flex_inputs(mask), call_builtin=_builtin_sdpa_flex_mask,
                     flops=lambda z, mask=mask: 4 * z.B * z.nh * z.hs * _flex_kept_pairs(mask, z.T),
                     dense_scores=suffix == "_dense")


# -- linear attention against softmax attention: prefill against T, one decode step against S ---

DELTA_CHUNK = 64           # the chunked delta rule's chunk (transformers' default)


def _unit_rows(rng, shape):
    """Rows of unit L2 norm, in float64: the models L2-normalise q and k before the delta rule."""
    import numpy as np

    x = rng.standard_normal(shape)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True))


def _delta_inputs(rng, B, nh, T, hs, dtype):
    """q, k (unit rows), v, g (log-decays in [log 0.6, log 0.99]) and beta in (0, 1), as a
    Gated DeltaNet hands them to the delta rule: each step's map of the state has norm <= 1."""
    import numpy as np

    return {
        "q": _unit_rows(rng, (B, nh, T, hs)).astype(dtype),
        "k": _unit_rows(rng, (B, nh, T, hs)).astype(dtype),
        "v": _normal(rng, (B, nh, T, hs), dtype),
        "g": np.log(rng.uniform(0.6, 0.99, (B, nh, T))).astype(dtype),   # one decay per head and step
        "beta": rng.uniform(0.05, 0.95, (B, nh, T)).astype(dtype),
    }


def _delta_prefill_inputs(z, dtype, rng):
    return _delta_inputs(rng, z.B, z.nh, z.T, z.hs, dtype), {}


def _delta_prefill_forward(q, k, v, g, beta):
    """The chunked delta rule from a zero state: the outputs (the final state is left to decoding)."""
    from numpy_attn.chunked_delta_rule import chunked_delta_rule_forward

    o, _, cache = chunked_delta_rule_forward(q, k, v, g, beta, chunk_size=DELTA_CHUNK)
    return o, cache


def _delta_prefill_backward(do, cache):
    """(dq, dk, dv, dg, dbeta): no gradient reaches the final state."""
    from numpy_attn.chunked_delta_rule import chunked_delta_rule_backward

    grads = chunked_delta_rule_backward(do, None, cache)
    return tuple(grads[name] for name in ("q", "k", "v", "g", "beta"))


def _delta_prefill_twin(q, k, v, g, beta):
    from torch_attn.chunked_delta_rule import chunked_delta_rule

    return chunked_delta_rule(q, k, v, g, beta, chunk_size=DELTA_CHUNK)[0]


def _delta_prefill_flops(z):
    """Per chunk of C steps and head (dk = dv = hs): the pairwise products A and P (2 C^2 hs each),
    the two unit triangular solves (C^2 hs each), P @ u (2 C^2 hs) and the three products with the
    state (2 C hs^2 each); the tail's padding counts, as it is computed."""
    C = DELTA_CHUNK
    steps = -(-z.T // C) * C
    return z.B * z.nh * steps * (8 * C * z.hs + 6 * z.hs * z.hs)


def _decode_attention_inputs(z, dtype, rng):
    """One new token's query and the S = T keys and values a key/value cache holds (its own
    included): what one decode step of softmax attention reads."""
    diff = {
        "q": _normal(rng, (z.B, z.nh, 1, z.hs), dtype),
        "k": _normal(rng, (z.B, z.nh, z.S, z.hs), dtype),
        "v": _normal(rng, (z.B, z.nh, z.S, z.hs), dtype),
    }
    return diff, {}


def _decode_attention_forward(q, k, v):
    """Attention of the new token over the held keys (the cache's write of one token is left out:
    it copies 2 hs numbers per head, against the 2 S hs this reads)."""
    from numpy_attn.attention import scaled_dot_product_attention_forward

    return scaled_dot_product_attention_forward(q, k, v)


def _decode_attention_backward(dout, cache):
    from numpy_attn.attention import scaled_dot_product_attention_backward

    return scaled_dot_product_attention_backward(dout, cache)


def _decode_attention_twin(q, k, v):
    from torch_attn.attention import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v)


def _decode_delta_inputs(z, dtype, rng):
    """One new token and the recurrent state (B, nh, hs, hs) left by the tokens before it: the
    same arrays whatever T, the tokens held (the state's values, a normal draw, do not matter to
    the time)."""
    diff = _delta_inputs(rng, z.B, z.nh, 1, z.hs, dtype)
    diff["initial_state"] = _normal(rng, (z.B, z.nh, z.hs, z.hs), dtype)
    return diff, {}


def _decode_delta_forward(q, k, v, g, beta, initial_state):
    """One step of the recurrence: the new token's output (the new state is kept in the cache)."""
    from numpy_attn.gated_delta_rule import gated_delta_rule_forward

    o, _, cache = gated_delta_rule_forward(q, k, v, g, beta, initial_state)
    return o, cache


def _decode_delta_backward(do, cache):
    """(dq, dk, dv, dg, dbeta, dinitial_state)."""
    from numpy_attn.gated_delta_rule import gated_delta_rule_backward

    grads = gated_delta_rule_backward(do, None, cache)
    return tuple(grads[name] for name in ("q", "k", "v", "g", "beta", "initial_state"))


def _decode_delta_twin(q, k, v, g, beta, initial_state):
    from torch_attn.gated_delta_rule import gated_delta_rule

    return gated_delta_rule(q, k, v, g, beta, initial_state)[0]


def _linear_attention_ops():
    """Prefill: the chunked delta rule against T, beside attention_causal (the same T, B, nh, hs).
    Decoding one token with T tokens held: softmax attention reads a cache of T keys and values,
    the delta rule steps a (hs, hs) state per head whatever T. Their fwd+bwd is the gradient
    through that one step."""
    yield Op("delta_rule", stem="chunked_delta_rule", forward=_delta_prefill_forward,
             backward=_delta_prefill_backward, twin=_delta_prefill_twin, builtin=None,
             inputs=_delta_prefill_inputs, call_builtin=None, flops=_delta_prefill_flops,
             dense_scores=False)
    yield Op("decode_step_attention", stem="kv_cache", forward=_decode_attention_forward,
             backward=_decode_attention_backward, twin=_decode_attention_twin,
             builtin="F.scaled_dot_product_attention", inputs=_decode_attention_inputs,
             call_builtin=_builtin_sdpa_decode, flops=lambda z: 4 * z.B * z.nh * z.S * z.hs,
             dense_scores=False, decode_step=True)
    # decay, read S^T k, write k u^T, read S^T q: 7 hs^2 per head
    yield Op("decode_step_delta_rule", stem="gated_delta_rule", forward=_decode_delta_forward,
             backward=_decode_delta_backward, twin=_decode_delta_twin, builtin=None,
             inputs=_decode_delta_inputs, call_builtin=None, flops=lambda z: 7 * z.B * z.nh * z.hs * z.hs,
             dense_scores=False, decode_step=True)


# -- learned sparse attention: MLA over every earlier key, and over the indexer's top-k (DSA) ---

DSA_TOPK = 64              # the keys each query keeps (DeepSeek-V3.2: 2048, at T up to 128K)


def _dsa_config(z):
    """One DeepSeek-V3.2 attention layer at the sweep's sizes: nh heads, C = nh hs, MLA's key and
    value heads of hs (hs / 2 of them rotated), latents of C / 2 (keys) and C (queries); an
    indexer of 4 heads of width hs keeping DSA_TOPK keys."""
    from numpy_attn.deepseek_v32 import DeepseekV32Config

    rope = max(2, z.hs // 2 // 2 * 2)
    return DeepseekV32Config(vocab_size=16, block_size=z.T, n_layer=1, n_embd=z.C, n_head=z.nh, n_kv_head=z.nh,
                             hidden=z.C, q_lora_rank=z.C, kv_lora_rank=max(z.C // 2, 1), qk_nope_head_dim=z.hs,
                             qk_rope_head_dim=rope, v_head_dim=z.hs, index_topk=DSA_TOPK,
                             index_head_dim=max(z.hs, rope), index_n_heads=4)


def _dsa_inputs(z, dtype, rng):
    """x and the layer's MLA parameters (differentiated), its indexer's parameters (not: the main
    loss gives them no gradient, the indexer is detached), the config and positions."""
    import numpy as np

    from numpy_attn.deepseek_v32 import init_deepseek_v32_params

    config = _dsa_config(z)
    attn = init_deepseek_v32_params(config, rng, dtype)["blocks"]["0"]["attn"]
    indexer = attn.pop("indexer")
    return ({"x": _normal(rng, (z.B, z.T, z.C), dtype), "params": attn},
            {"indexer": indexer, "config": config, "positions": np.arange(z.T)})


def _dsa_forward(x, params, indexer, config, positions):
    """MLA over each query's DSA_TOPK keys, the indexer's selection included in the time."""
    from numpy_attn.deepseek_v32 import deepseek_v32_attention_forward

    return deepseek_v32_attention_forward(x, {**params, "indexer": indexer}, config, positions)


def _dsa_backward(dout, cache):
    """(dx, dparams) of MLA's parameters: the indexer's (zeros, detached) are left out."""
    from numpy_attn.deepseek_v32 import deepseek_v32_attention_backward

    dx, dparams = deepseek_v32_attention_backward(dout, cache)
    dparams.pop("indexer")
    return dx, dparams


def _dsa_twin(x, params, indexer, config, positions):
    from torch_attn.deepseek_v32 import deepseek_v32_attention

    return deepseek_v32_attention(x, {**params, "indexer": indexer}, config, positions)


def _mla_forward(x, params, indexer, config, positions):
    """Dense causal MLA on the same layer (the indexer unused): every earlier key."""
    from numpy_attn.mla import mla_forward

    return mla_forward(x, params, config.mla, positions)


def _mla_backward(dout, cache):
    from numpy_attn.mla import mla_backward

    return mla_backward(dout, cache)


def _mla_twin(x, params, indexer, config, positions):
    from torch_attn.mla import mla

    return mla(x, params, config.mla, positions)


def _mla_projection_flops(z):
    """The projections of one MLA layer of _dsa_config, 2 FLOPs per multiply-add: q_a, q_b, kv_a,
    kv_b and o."""
    c = _dsa_config(z)
    nh, dn, dr, dv, C = c.n_head, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.n_embd
    per_token = (C * c.q_lora_rank + c.q_lora_rank * nh * (dn + dr) + C * (c.kv_lora_rank + dr)
                 + c.kv_lora_rank * nh * (dn + dv) + nh * dv * C)
    return 2 * z.B * z.T * per_token


def _mla_attention_flops(z, pairs):
    """q . k (dn + dr) and p . v (dv) for ``pairs`` query-key pairs per head."""
    c = _dsa_config(z)
    return 2 * z.B * z.nh * pairs * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)


def _dsa_ops():
    """One attention layer of DeepSeek-V3.2 against T: dense causal MLA (T (T + 1) / 2 pairs) and
    DSA (MLA over each query's min(t + 1, DSA_TOPK) keys). FLOPs count the useful work: for DSA
    the kept pairs, not the dense scores the reference computes and masks, plus the indexer's
    q . k over every earlier key (4 heads of width hs; its projections are left out). Every dtype runs: the
    layer's forward casts the indexer up to float32 for float16 and bfloat16 (as the model does,
    lightning_indexer_forward itself refusing them), and the indexer's parameters are ``static``,
    not differentiated: the main loss gives them no gradient (transformers detaches the indexer).
    """
    causal = lambda z: z.T * (z.T + 1) // 2   # noqa: E731
    kept = lambda z: sum(min(t + 1, DSA_TOPK) for t in range(z.T))   # noqa: E731
    common = dict(builtin=None, call_builtin=None, inputs=_dsa_inputs)
    yield Op("mla_dense", stem="mla", forward=_mla_forward, backward=_mla_backward, twin=_mla_twin,
             flops=lambda z: _mla_projection_flops(z) + _mla_attention_flops(z, causal(z)), **common)
    yield Op("dsa", stem="deepseek_v32", forward=_dsa_forward, backward=_dsa_backward, twin=_dsa_twin,
             flops=lambda z: _mla_projection_flops(z) + _mla_attention_flops(z, kept(z))
             + 2 * z.B * 4 * causal(z) * _dsa_config(z).index_head_dim, **common)


# -- the registry -----------------------------------------------------------------------------

def _attention_flops(z):
    return 4 * z.B * z.nh * z.T * z.S * z.hs       # q @ k^T and p @ v, 2 FLOPs per multiply-add


def _block_flops(z):
    # attention projections 8*B*T*C^2, feed-forward (C -> 4C -> C) 16*B*T*C^2, causal attention
    return 24 * z.B * z.T * z.C * z.C + _attention_flops(z) // 2


_SDPA = dict(
    stem="attention",
    forward="scaled_dot_product_attention_forward",
    backward="scaled_dot_product_attention_backward",
    twin="scaled_dot_product_attention",
    builtin="F.scaled_dot_product_attention",
    call_builtin=_builtin_sdpa,
)

OPS = {op.name: op for op in (
    Op("softmax", stem="softmax", forward="softmax_forward", backward="softmax_backward",
       twin="softmax", builtin="torch.softmax", inputs=_scores_inputs,
       # max, subtract, exp, sum, divide per element; the backward does 4 (dy*y, sum, -, *).
       # Softmax is memory-bound: its share of the matmul peak is only indicative.
       flops=lambda z: 5 * z.B * z.nh * z.T * z.S, bwd_factor=0.8,
       call_builtin=_builtin_softmax),
    Op("attention", inputs=_qkv_inputs(False), flops=_attention_flops, **_SDPA),
    # Causal: only the T*S/2 unmasked pairs count as useful work, although the reference code
    # computes the full score matrix and masks it.
    Op("attention_causal", inputs=_qkv_inputs(True), flops=lambda z: _attention_flops(z) // 2,
       **_SDPA),
    Op("multi_head", stem="multi_head", forward="multi_head_attention_forward",
       backward="multi_head_attention_backward", twin="multi_head_attention",
       builtin="nn.MultiheadAttention", inputs=_mha_inputs,
       # four (C, C) projections plus the attention itself
       flops=lambda z: 8 * z.B * z.T * z.C * z.C + _attention_flops(z),
       call_builtin=_builtin_mha),
    *(Op(f"flash_attention{suffix}", stem="flash_attention", forward="flash_attention_forward",
         backward="flash_attention_backward", twin="flash_attention",
         builtin="F.scaled_dot_product_attention", inputs=_qkv_inputs(causal),
         flops=lambda z, causal=causal: _attention_flops(z) // (2 if causal else 1),
         call_builtin=_builtin_sdpa, numpy_module="numpy_attn.kernels.flash_attention", dense_scores=False)
      for suffix, causal in (("", False), ("_causal", True))),
    Op("block", stem="block", forward="block_forward", backward="block_backward", twin="block",
       builtin="nn.TransformerEncoderLayer", inputs=_block_inputs,
       flops=_block_flops, call_builtin=_builtin_block),
    Op("gpt_step", stem="gpt", forward=_gpt_step_forward, backward=_gpt_step_backward,
       twin=_gpt_step_twin, builtin=None, inputs=_gpt_inputs, call_builtin=None,
       # forward: the loss; forward+backward: the loss and every parameter's gradient
       flops=lambda z: GPT_LAYERS * _block_flops(z) + 2 * z.B * z.T * z.C * GPT_VOCAB),
    *_flex_ops(),
    *_linear_attention_ops(),
    *_dsa_ops(),
)}


STEMS = list(dict.fromkeys(op.stem for op in OPS.values()))   # the file stems, in registry order


def select(names):
    """The ops named, in registry order; a stem selects every op built on it.

    Raises ValueError naming the unknown entries and the valid choices.
    """
    names = list(names) or list(OPS)
    unknown = [n for n in names if n not in OPS and n not in STEMS]
    if unknown:
        raise ValueError(f"unknown op {', '.join(map(repr, unknown))}; choose from: {', '.join(OPS)}")
    return [op for op in OPS.values() if op.name in names or op.stem in names]
