"""DeepSeek-V3: the Llama-style model (numpy_attn/llama.py) with multi-head latent attention and,
after its first dense layers, a mixture of experts in place of the SwiGLU network.

    x      = x + mla(rms_norm(x))             numpy_attn/mla.py: low-rank q, latent keys and values
    x      = x + swiglu(rms_norm(x))          in the first first_k_dense_replace blocks
    x      = x + moe(rms_norm(x))             in the others: numpy_attn/moe.py's DeepSeek-V3 routing

DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), section 2.1, in the form of Hugging Face's
``DeepseekV3ForCausalLM``: each block's attention is MLA (``blocks.i.attn`` holds mla.py's
parameters: q_a, q_a_norm, q_b or q, kv_a, kv_a_norm, kv_b, o), with YaRN's mscale in its score
scale; the first ``first_k_dense_replace`` blocks have a SwiGLU network of width ``hidden``
(intermediate_size), the others a mixture of ``n_routed_experts`` SwiGLU experts of width
``moe_hidden`` (moe_intermediate_size), ``num_experts_per_tok`` of them chosen per token among
``topk_group`` of ``n_group`` groups by sigmoid scores plus the selection bias (Hugging Face's
``e_score_correction_bias``), and a shared expert of width n_shared_experts x moe_hidden
(``blocks.i.mlp`` holds moe.py's router, selection_bias, experts and shared). The embedding, the
final norm and the untied head are llama.py's, and the loop is numpy_attn/_model.py's (``decoder_forward``); what
stands here is what DeepSeek-V3 changes.

Decoding. ``deepseek_v3_kv_cache(..., absorb=True)`` (the default) keeps per layer and token only
MLA's latent c_kv and its rotated shared key k_r, and the blocks decode with
``mla_absorbed_forward``; ``absorb=False`` keeps every head's key and value, as Hugging Face's
model attends over them, and the blocks decode with ``mla_forward``. The absorbed cache is a
KVCache (numpy_attn/kv_cache.py) of one head per layer whose keys are the latents (rkv) and whose
values are the k_r (dr), so the model's loop and checks take either. Both are for inference only.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import POSITIVE, check_config, check_rng
from numpy_attn._family import Family
from numpy_attn.kv_cache import KVCache, init_kv_cache
from numpy_attn.llama import SWIGLU_MLP, LlamaConfig, llama_block_backward, llama_block_forward
from numpy_attn.mla import (
    LatentCache,
    MLAConfig,
    init_mla_kv_cache,
    init_mla_params,
    mla_absorbed_forward,
    mla_backward,
    mla_forward,
)
from numpy_attn.moe import _check_k, deepseek_moe_backward, deepseek_moe_forward, init_deepseek_moe_params


@dataclass(frozen=True)
class DeepseekV3Config(LlamaConfig):
    """LlamaConfig's fields and checks (head_dim is the rotary width qk_rope_head_dim; n_kv_head,
    rope_layout and mlp_bias unused: MLA has its own heads and rotary layout, the networks no
    biases), and DeepSeek-V3's own under Hugging Face's names; a toy by default."""

    n_kv_head: int = 4                   # unused (Hugging Face's num_key_value_heads): MLA's heads are nh
    head_dim: int | None = None          # the rotary width: None (or qk_rope_head_dim, as Hugging Face sets it)
    q_lora_rank: int | None = 12         # rq; None: one projection q
    kv_lora_rank: int = 8                # rkv, the latent's width
    qk_nope_head_dim: int = 4            # dn
    qk_rope_head_dim: int = 4            # dr
    v_head_dim: int = 6                  # dv
    rope_interleave: bool = True         # DeepSeek's rotary pairs (2j, 2j+1)
    moe_hidden: int = 16                 # each routed expert's width (moe_intermediate_size)
    n_routed_experts: int = 8            # E
    n_shared_experts: int = 1            # the shared expert is this many experts wide
    num_experts_per_tok: int = 2         # k
    n_group: int = 2
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    first_k_dense_replace: int = 1       # the first blocks with a dense SwiGLU network

    def __post_init__(self):
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.qk_rope_head_dim)
        _ = self.mla                                       # MLA's checks first: ranks, widths, rope
        super().__post_init__()
        for name, value in check_config(self, {
                "moe_hidden": (int, 1), "n_routed_experts": (int, 1), "n_shared_experts": (int, 1),
                "num_experts_per_tok": (int, 1), "n_group": (int, 1), "topk_group": (int, 1),
                "norm_topk_prob": (bool, None), "routed_scaling_factor": (float, POSITIVE),
                "first_k_dense_replace": (int, 0)}).items():
            object.__setattr__(self, name, value)
        if self.head_dim != self.qk_rope_head_dim:
            raise ValueError(f"DeepseekV3Config.head_dim must be the rotary width qk_rope_head_dim = "
                             f"{self.qk_rope_head_dim}, got {self.head_dim}")
        E, G = self.n_routed_experts, self.n_group
        _check_k("DeepseekV3Config.n_group", G, 1, E, f"n_routed_experts = {E}")
        if E % G or E // G < 2:   # E // G is exact here (E % G == 0)
            raise ValueError(f"DeepseekV3Config.n_group = {G} must divide n_routed_experts = {E} into groups "
                             "of at least 2 experts (a group's score is the sum of its best 2)")
        _check_k("DeepseekV3Config.topk_group", self.topk_group, 1, G, f"n_group = {G}")
        _check_k("DeepseekV3Config.num_experts_per_tok", self.num_experts_per_tok, 1, self.topk_group * (E // G),
                 f"the {self.topk_group * (E // G)} experts of topk_group = {self.topk_group} groups of {E // G} "
                 f"(n_routed_experts = {E})")

    @cached_property
    def mla(self):
        """The attention's MLAConfig. Hugging Face's two latent norms have eps 1e-6 whatever
        rms_norm_eps says."""
        return MLAConfig(n_embd=self.n_embd, n_head=self.n_head, q_lora_rank=self.q_lora_rank,
                         kv_lora_rank=self.kv_lora_rank, qk_nope_head_dim=self.qk_nope_head_dim,
                         qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim, rms_eps=1e-6,
                         rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
                         rope_interleave=self.rope_interleave, attn_bias=self.attn_bias)

    @property
    def routing(self):
        """deepseek_moe_forward's keywords."""
        return {"k": self.num_experts_per_tok, "n_group": self.n_group, "topk_group": self.topk_group,
                "norm_topk_prob": self.norm_topk_prob, "routed_scaling_factor": self.routed_scaling_factor}

    def is_moe(self, i):
        """Whether block i's network is the mixture of experts (dense in the first first_k_dense_replace)."""
        return i >= self.first_k_dense_replace


def init_deepseek_v3_params(config, rng, dtype=np.float32):
    """{"wte": (V, C), "blocks": {"0": {"attn_norm", "attn", "mlp_norm", "mlp"}, ...}, "norm",
    "head"}: attn from init_mla_params, mlp a SwiGLU network (weights N(0, 0.02^2)) or from
    init_deepseek_moe_params; embedding and head (without tied weights) N(0, 0.02^2), norms at 1."""
    check_rng(rng, "init_deepseek_v3_params")
    C, H = config.n_embd, config.hidden
    def init_block(i):
        if config.is_moe(i):
            mlp = init_deepseek_moe_params(C, config.moe_hidden, config.n_routed_experts, rng,
                                           config.n_shared_experts, dtype)
        else:
            mlp = {name: {"w": rng.normal(0, 0.02, shape).astype(dtype)}
                   for name, shape in (("gate", (C, H)), ("up", (C, H)), ("down", (H, C)))}
        return {"attn_norm": {"w": np.ones(C, dtype)}, "attn": init_mla_params(config.mla, rng, dtype),
                "mlp_norm": {"w": np.ones(C, dtype)}, "mlp": mlp}

    return _model.init_decoder_params(config, rng, dtype, init_block)


# -- the block: Llama's, with MLA and a dense or a mixture-of-experts network ----------------------

def deepseek_v3_attention_forward(h, params, config, positions, *, attn_mask=None, kv_cache=None):
    """MLA: h (B, T, C) -> (B, T, C), ``kv_cache`` this block's layer of a deepseek_v3_kv_cache:
    absorbed decoding from a latent cache (no cache kept: inference only), mla_forward otherwise.
    Returns ``(out, cache)``. ``attn_mask`` must be None (the model takes none)."""
    if attn_mask is not None:
        raise ValueError("deepseek_v3_attention_forward: attn_mask is not supported (MLA attends causally)")
    if kv_cache is not None and isinstance(kv_cache.cache, LatentKVCache):   # absorbed decoding
        return _absorbed_attention(h, params, config.mla, positions, kv_cache), None
    return mla_forward(h, params, config.mla, positions, kv_cache=kv_cache)   # (B, T, C)


def _absorbed_attention(h, params, mla_config, positions, layer_cache, attn_mask=None):
    """mla_absorbed_forward over this layer's slots of a LatentKVCache: its keys (B, 1, S, rkv)
    are the latents, its values (B, 1, S, dr) the rotated shared keys (``attn_mask`` as mla_forward's)."""
    latent = LatentCache(layer_cache.k[:, 0], layer_cache.v[:, 0], layer_cache.length)   # views of the slots
    a = mla_absorbed_forward(h, params, mla_config, latent, positions, attn_mask)   # (B, T, C)
    layer_cache.cache.lengths[layer_cache.index] = latent.length             # the tokens it appended
    return a


def deepseek_v3_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams like MLA's params)."""
    if cache is None:
        raise ValueError("deepseek_v3_backward: the forward decoded from an absorbed latent cache, which is for "
                         "inference only")
    return mla_backward(dout, cache)


def deepseek_moe_mlp_forward(h, params, config):
    """The mixture of experts with the config's routing: h (B, T, C) -> (B, T, C)."""
    return deepseek_moe_forward(h, params, **config.routing)


DEEPSEEK_V3_ATTENTION = _model.Sublayer(deepseek_v3_attention_forward, deepseek_v3_attention_backward)
DEEPSEEK_MOE = _model.Sublayer(deepseek_moe_mlp_forward, deepseek_moe_backward)


def deepseek_v3_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, moe=False):
    """One block: x (B, T, C) -> (B, T, C), Llama's with MLA and, where ``moe``, the mixture of
    experts in place of the SwiGLU network. Returns ``(out, cache)``; llama_block_backward undoes it."""
    return llama_block_forward(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                               attention=DEEPSEEK_V3_ATTENTION, mlp=DEEPSEEK_MOE if moe else SWIGLU_MLP)


deepseek_v3_block_backward = llama_block_backward


# -- the model ------------------------------------------------------------------------------------

def deepseek_v3_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                        logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords) with
    DeepSeek-V3's blocks; ``kv_cache`` from deepseek_v3_kv_cache (absorbed or naive). MLA here is
    causal only: ``attn_mask`` is refused. Returns ``(logits, cache)``."""
    if attn_mask is not None:
        raise ValueError("deepseek_v3_forward: attn_mask is not supported (MLA here is causal only)")
    _check_deepseek_v3_kv_cache(kv_cache, config)
    return _model.decoder_forward(ids, params, config, DeepseekV3Config, deepseek_v3_block_forward, positions=positions,
                                  attn_mask=None, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                                  for_backward=for_backward, layer_options=lambda i: {"moe": config.is_moe(i)})


deepseek_v3_backward = _model.decoder_backward_of("deepseek_v3", deepseek_v3_block_backward)


@dataclass
class LatentKVCache(KVCache):
    """Every layer's absorbed-MLA cache in KVCache's layout: one head per layer, whose keys are
    the normed latents c_kv (rkv numbers a token) and whose values the rotated shared keys k_r (dr)."""


def deepseek_v3_kv_cache(config, B, dtype=np.float32, max_len=None, absorb=True):
    """An empty cache for decoding B sequences of up to ``max_len`` (default block_size) tokens:
    with ``absorb`` the latent c_kv and k_r of each layer and token (rkv + dr numbers), without
    every head's key and value (nh x (dn + dr + dv) numbers), as Hugging Face's model keeps them."""
    max_len = config.block_size if max_len is None else max_len
    if not absorb:
        return init_mla_kv_cache(config.mla, config.n_layer, B, max_len, dtype)
    cache = init_kv_cache(config.n_layer, B, 1, max_len, config.kv_lora_rank, dtype,
                          v_head_size=config.qk_rope_head_dim)
    return LatentKVCache(cache.buffer_k, cache.buffer_v, cache.lengths, cache.windows, cache.dims, cache.v_head_size)


def _check_deepseek_v3_kv_cache(kv_cache, config):
    """Raise unless ``kv_cache`` is None or a cache of deepseek_v3_kv_cache's two kinds (the layers
    check their sizes)."""
    if kv_cache is not None and type(kv_cache) not in (LatentKVCache, KVCache):
        raise TypeError(f"kv_cache must come from deepseek_v3_kv_cache, got {type(kv_cache).__name__}")
    if type(kv_cache) is LatentKVCache and kv_cache.dims[1:] != (1, kv_cache.max_len, config.kv_lora_rank):
        raise ValueError(f"kv_cache holds latents of width {kv_cache.dims[3]}, the config's kv_lora_rank is "
                         f"{config.kv_lora_rank}")


FAMILY = Family(name="deepseek_v3", title="DeepSeek-V3", architectures=("DeepseekV3ForCausalLM",),
                config=DeepseekV3Config, forward=deepseek_v3_forward, backward=deepseek_v3_backward,
                kv_cache=deepseek_v3_kv_cache, init_params=init_deepseek_v3_params, absorb=True)
