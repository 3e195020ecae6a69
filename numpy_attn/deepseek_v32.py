"""DeepSeek-V3.2: DeepSeek-V3 (numpy_attn/deepseek_v3.py) whose attention sees only the keys its
lightning indexer selects (DeepSeek Sparse Attention).

    c_q      = rms_norm(h @ q_a.w)                  MLA's query latent (B, T, rq)
    selected = indexer(h, c_q)                      numpy_attn/lightning_indexer.py: top index_topk keys
    x        = x + mla(h, mask = selected)          numpy_attn/mla.py, h = rms_norm(x)
    x        = x + swiglu or moe(rms_norm(x))       as DeepSeek-V3's

DeepSeek-AI, the DeepSeek-V3.2 technical report (2025), in the form of Hugging Face's
``DeepseekV32ForCausalLM``: every block's MLA attends over the ``index_topk`` keys its indexer
(``blocks.i.attn.indexer``: wq_b, wk, k_norm, weights_proj; ``index_n_heads`` heads of width
``index_head_dim``, half-split rope on their first qk_rope_head_dim channels) scores highest among
the causal ones; a query with fewer visible keys attends to all of them. The indexer reads the
block's normed input h and MLA's query latent c_q, and runs without gradient, as transformers'
(``torch.no_grad``): the selection is piecewise constant, and the scores reach the output only
through it, so the model's gradient gives the indexer's parameters zeros. They learn from their
own loss instead: ``deepseek_v32_indexer_loss`` (the report's KL between the main attention's
distribution, summed over its heads, and the indexer's softmax over the selected keys), whose
backward reaches only the indexer's parameters. MLA here always pairs its rotary channels
interleaved (transformers' DeepSeek-V3.2 has no other layout), and needs the low-rank query.

Decoding (``deepseek_v32_kv_cache``): deepseek_v3's absorbed latent cache, and beside it each
layer's rotated indexer keys (index_head_dim numbers a token): a new token's indexer scores every
cached key, and MLA attends absorbed over the latents it selects. Inference only.

The indexer computes in float32 for float16 and bfloat16 models (transformers' scores are float32
whatever the model's dtype; the lightning indexer refuses a low dtype, its selection having no
error budget).
"""

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_config, check_dout, check_rng, opmath
from numpy_attn._family import Family
from numpy_attn.deepseek_v3 import (
    DEEPSEEK_MOE,
    DeepseekV3Config,
    LatentKVCache,
    _absorbed_attention,
    deepseek_v3_kv_cache,
    init_deepseek_v3_params,
)
from numpy_attn.lightning_indexer import (
    lightning_indexer_backward,
    lightning_indexer_forward,
    lightning_indexer_loss_backward,
    lightning_indexer_loss_forward,
)
from numpy_attn.linear import linear_forward
from numpy_attn.llama import SWIGLU_MLP, llama_block_backward, llama_block_forward
from numpy_attn.mla import mla_backward, mla_forward
from numpy_attn.rms_norm import rms_norm_forward


@dataclass(frozen=True)
class DeepseekV32Config(DeepseekV3Config):
    """DeepseekV3Config's fields and checks (q_lora_rank required: the indexer reads the query
    latent), and the indexer's sizes under Hugging Face's names; a toy by default."""

    INDEXER_ROPE_LAYOUT = "half"         # the indexer's rotary pairs (a class constant, not a field)
    index_topk: int = 4                  # the keys each query attends to
    index_head_dim: int = 6              # the indexer's D (>= qk_rope_head_dim: rope on its first dr channels)
    index_n_heads: int = 2               # the indexer's heads

    def __post_init__(self):
        super().__post_init__()
        for name, value in check_config(self, {"index_topk": (int, 1), "index_head_dim": (int, 1),
                                               "index_n_heads": (int, 1)}).items():
            object.__setattr__(self, name, value)
        if self.q_lora_rank is None:
            raise ValueError("DeepseekV32Config.q_lora_rank must be an int: the indexer reads MLA's query latent")
        if not self.rope_interleave:
            raise ValueError("DeepseekV32Config.rope_interleave must be True: DeepSeek-V3.2's MLA pairs its "
                             "rotary channels interleaved")
        if self.index_head_dim < self.qk_rope_head_dim:
            raise ValueError(f"DeepseekV32Config.index_head_dim = {self.index_head_dim} must be >= "
                             f"qk_rope_head_dim = {self.qk_rope_head_dim} (the indexer's rotated channels)")

    @cached_property
    def indexer(self):
        """lightning_indexer_forward's keywords: top_k, rope on the first dr channels, paired as
        INDEXER_ROPE_LAYOUT says."""
        return {"top_k": self.index_topk, "rope_dim": self.qk_rope_head_dim, "rope_theta": self.rope_theta,
                "rope_scaling": self.rope_scaling, "rope_layout": self.INDEXER_ROPE_LAYOUT}


def init_deepseek_v32_params(config, rng, dtype=np.float32):
    """init_deepseek_v3_params' tree with each block's indexer under attn.indexer: its projections
    N(0, 0.02^2), its key's LayerNorm at weight 1 and bias 0."""
    check_rng(rng, "init_deepseek_v32_params")
    params = init_deepseek_v3_params(config, rng, dtype)
    C, rq, nh, D = config.n_embd, config.q_lora_rank, config.index_n_heads, config.index_head_dim
    for block in params["blocks"].values():
        block["attn"]["indexer"] = {
            "wq_b": {"w": rng.normal(0, 0.02, (rq, nh * D)).astype(dtype)},
            "wk": {"w": rng.normal(0, 0.02, (C, D)).astype(dtype)},
            "k_norm": {"w": np.ones(D, dtype), "b": np.zeros(D, dtype)},
            "weights_proj": {"w": rng.normal(0, 0.02, (C, nh)).astype(dtype)}}
    return params


# -- the attention: MLA over the indexer's selection -----------------------------------------------

class DSACache(NamedTuple):
    """MLA's cache, and what the indexer's loss needs: its scores (B, T, S), selection and cache
    (scores and cache None in a block without an indexer)."""

    mla: tuple
    scores: np.ndarray
    selected: np.ndarray
    indexer: tuple


def _select(h, params, config, positions, past_keys=None):
    """The indexer on h (B, T, C) and MLA's query latent: (scores, selected (B, T, S), cache), in
    float32 for a float16 or bfloat16 h. ``past_keys`` (B, P, D) when decoding."""
    dt = opmath(h.dtype)
    def cast(layer):
        return {key: a.astype(dt, copy=False) for key, a in layer.items()}
    x = h.astype(dt, copy=False)
    # MLA's own query latent, recomputed: the indexer is detached, so nothing flows back through it.
    c_q, _ = linear_forward(x, **cast(params["q_a"]))                         # (B, T, C) -> (B, T, rq)
    c_q, _ = rms_norm_forward(c_q, cast(params["q_a_norm"])["w"], config.mla.rms_eps)   # (B, T, rq)
    indexer = {name: cast(layer) for name, layer in params["indexer"].items()}
    return lightning_indexer_forward(x, c_q, indexer, positions=positions, past_keys=past_keys, **config.indexer)


def deepseek_v32_attention_forward(h, params, config, positions, *, attn_mask=None, kv_cache=None, selection=None):
    """MLA over each query's selected keys: h (B, T, C) -> (B, T, C), ``kv_cache`` this block's
    layer of a deepseek_v32_kv_cache (absorbed decoding, inference only: no cache then). Returns
    ``(out, cache)``. ``attn_mask`` must be None (the model takes none). ``selection``, a dict the
    model's forward shares with its blocks: a block with an indexer leaves its selection there, a
    block without one (GLM-5's "shared" layers) attends over the last one left."""
    if attn_mask is not None:
        raise ValueError("deepseek_v32_attention_forward: attn_mask is not supported (the model attends causally)")
    mla_params = {name: layer for name, layer in params.items() if name != "indexer"}
    scores = indexer_cache = None
    if "indexer" in params:
        P, T = (0 if kv_cache is None else kv_cache.length), h.shape[1]
        keys = None if kv_cache is None else kv_cache.cache.index_keys[kv_cache.index]   # (B, max_len, D) its slots
        scores, selected, indexer_cache = _select(h, params, config, positions,
                                                  None if keys is None else keys[:, :P])   # (B, T, P + T)
        if keys is not None:   # decoding: the new tokens' keys join the cached ones
            keys[:, P:P + T] = indexer_cache.k_rot[:, P:]
        if selection is not None:
            selection["selected"] = selected
    elif selection is None or "selected" not in selection:
        raise ValueError("deepseek_v32_attention_forward: a block without an indexer attends over an earlier "
                         "block's selection, and no earlier block selected keys")
    else:
        selected = selection["selected"]                                      # (B, T, S) an earlier block's
    if kv_cache is not None:   # decoding: MLA absorbed over the latents
        return _absorbed_attention(h, mla_params, config.mla, positions, kv_cache, selected[:, None]), None
    out, mla_cache = mla_forward(h, mla_params, config.mla, positions, attn_mask=selected[:, None])   # (B, T, C)
    return out, DSACache(mla_cache, scores, selected, indexer_cache)


def deepseek_v32_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams like the params: the indexer's zeros,
    as transformers' no_grad gives it none)."""
    if cache is None:
        raise ValueError("deepseek_v32_backward: the forward decoded from a cache, which is for inference only")
    dx, dparams = mla_backward(dout, cache.mla)
    if cache.indexer is not None:
        dparams["indexer"] = _zeros_like_indexer(cache.indexer, dout.dtype)
    return dx, dparams


def _zeros_like_indexer(indexer_cache, dtype):
    """Zeros of the indexer's parameter shapes, read from its cache's linear and norm caches."""
    c = indexer_cache
    return {"wq_b": {"w": np.zeros(c.q.w.shape, dtype)}, "wk": {"w": np.zeros(c.k.w.shape, dtype)},
            "k_norm": {key: np.zeros(c.k_rot.shape[-1], dtype) for key in ("w", "b")},
            "weights_proj": {"w": np.zeros(c.w.w.shape, dtype)}}


DEEPSEEK_V32_ATTENTION = _model.Sublayer(deepseek_v32_attention_forward, deepseek_v32_attention_backward)


# -- the model ------------------------------------------------------------------------------------

def dsa_layer_options(config):
    """Block i's options for decoder_forward: DSA, sharing one forward's selection between the
    blocks, and a dense or a mixture-of-experts network."""
    selection = {}
    return lambda i: {"attention": DEEPSEEK_V32_ATTENTION, "selection": selection,
                      "mlp": DEEPSEEK_MOE if config.is_moe(i) else SWIGLU_MLP}


def deepseek_v32_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                         logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords) with
    DeepSeek-V3.2's blocks; ``kv_cache`` from deepseek_v32_kv_cache. Causal only: ``attn_mask``
    is refused. Returns ``(logits, cache)``."""
    return dsa_decoder_forward("deepseek_v32_forward", DeepseekV32Config, ids, params, config, positions=positions,
                               attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                               for_backward=for_backward)


def dsa_decoder_forward(name, config_class, ids, params, config, *, attn_mask, kv_cache, **keywords):
    """decoder_forward with DSA's blocks (dsa_layer_options) for the forward ``name`` of a family
    whose config is a ``config_class`` (DeepSeek-V3.2's, GLM-5's): attn_mask refused, the cache checked."""
    if attn_mask is not None:
        raise ValueError(f"{name}: attn_mask is not supported (the model here is causal only)")
    _check_deepseek_v32_kv_cache(kv_cache, config)
    return _model.decoder_forward(ids, params, config, config_class, llama_block_forward, attn_mask=None,
                                  kv_cache=kv_cache, layer_options=dsa_layer_options(config), **keywords)


def deepseek_v32_backward(dlogits, cache):
    """Gradients: dlogits (B, T, V) -> dparams, with the nesting of the params (the indexers' zeros)."""
    return _model.decoder_backward("deepseek_v32", dlogits, cache, llama_block_backward)


# -- the indexer's own loss -------------------------------------------------------------------------

def deepseek_v32_indexer_loss(cache):
    """The indexers' training loss from a forward's cache: per block, the sum over queries of
    KL(p || softmax(I)) over the selected keys (the report's sparse phase), p the block's attention
    probabilities summed over its heads, a constant. Returns ``(loss, loss_cache)``: loss () summed
    over the blocks."""
    losses, caches = [], []
    for i, block in enumerate(cache.blocks):
        dsa = block.attn
        if not isinstance(dsa, DSACache):
            raise ValueError("deepseek_v32_indexer_loss: the cache must come from deepseek_v32_forward without a "
                             "kv_cache")
        if dsa.indexer is None:   # a block without an indexer (GLM-5's shared layers)
            continue
        p = dsa.mla.sdpa.weights.sum(axis=1).astype(dsa.scores.dtype)              # (B, nh, T, S) -> (B, T, S)
        loss, loss_cache = lightning_indexer_loss_forward(dsa.scores, p, dsa.selected)
        losses.append(loss)
        caches.append((str(i), loss_cache, dsa.indexer))
    return np.asarray(sum(losses), dtype=caches[0][1].p.dtype), caches


def deepseek_v32_indexer_loss_backward(dloss, loss_cache):
    """Gradients of the indexers' loss: dloss () -> {"0": dparams of blocks.0.attn.indexer, ...};
    only the indexers' parameters get one (their inputs h and c_q are detached, as the report)."""
    grads = {}
    for i, kl_cache, indexer_cache in loss_cache:
        check_dout("deepseek_v32_indexer_loss_backward", dloss, (), kl_cache.p.dtype, name="dloss")
        dscores = lightning_indexer_loss_backward(dloss, kl_cache)            # (B, T, S)
        _, _, grads[i] = lightning_indexer_backward(dscores, indexer_cache)
    return grads


# -- decoding: the latent cache and the indexer's keys ------------------------------------------------

@dataclass
class DeepseekV32Cache(LatentKVCache):
    """deepseek_v3's absorbed latent cache, and each layer's rotated indexer keys beside it."""

    index_keys: np.ndarray | None = None   # (L, B, max_len, D)

    @property
    def bytes_per_token(self):
        """Bytes each further token of one sequence adds: the latents, shared keys and indexer keys."""
        L, B, max_len, D = self.index_keys.shape
        return super().bytes_per_token + L * D * self.index_keys.itemsize


def deepseek_v32_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty cache for decoding B sequences of up to ``max_len`` (default block_size) tokens:
    per layer and token the latent c_kv and k_r (rkv + dr numbers) and the indexer's key (D), the
    keys in float32 for a float16 or bfloat16 model (the indexer's dtype)."""
    latent = deepseek_v3_kv_cache(config, B, dtype, max_len)
    keys = np.zeros((config.n_layer, B, latent.max_len, config.index_head_dim), opmath(np.dtype(dtype)))
    return DeepseekV32Cache(latent.buffer_k, latent.buffer_v, latent.lengths, latent.windows, latent.dims,
                            latent.v_head_size, keys)


def _check_deepseek_v32_kv_cache(kv_cache, config):
    """Raise unless ``kv_cache`` is None or a deepseek_v32_kv_cache of this config's widths."""
    if kv_cache is None:
        return
    if type(kv_cache) is not DeepseekV32Cache:
        raise TypeError(f"kv_cache must come from deepseek_v32_kv_cache, got {type(kv_cache).__name__}")
    if kv_cache.dims[1:] != (1, kv_cache.max_len, config.kv_lora_rank) or \
            kv_cache.index_keys.shape[-1] != config.index_head_dim:
        raise ValueError(f"kv_cache holds latents of width {kv_cache.dims[3]} and indexer keys of width "
                         f"{kv_cache.index_keys.shape[-1]}, the config's kv_lora_rank is {config.kv_lora_rank} "
                         f"and index_head_dim {config.index_head_dim}")


FAMILY = Family(name="deepseek_v32", title="DeepSeek-V3.2", architectures=("DeepseekV32ForCausalLM",),
                config=DeepseekV32Config, forward=deepseek_v32_forward, backward=deepseek_v32_backward,
                kv_cache=deepseek_v32_kv_cache, init_params=init_deepseek_v32_params)
