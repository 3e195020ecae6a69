"""Kimi Linear's language model: DeepSeek-V3's blocks (numpy_attn/deepseek_v3.py), most of them
with Kimi Delta Attention in place of multi-head latent attention, and its backward.

    x      = wte[ids]
    x      = x + mixer_i(rms_norm(x))       mixer_i: KDA or MLA without positions, by layer_types[i]
    x      = x + mlp_i(rms_norm(x))         mlp_i: SwiGLU or DeepSeek's mixture of experts, by mlp_layer_types[i]
    x      = rms_norm(x)
    logits = x @ head.w

Kimi Team, "Kimi Linear: An Expressive, Efficient Attention Architecture" (2025), in the form of
Hugging Face's ``KimiLinearForCausalLM``: three Kimi Delta Attention layers
(numpy_attn/kimi_delta_attention.py, "linear_attention") to each MLA layer ("full_attention"),
``layer_types`` listing them (by default layers 4, 8, ... full, counted from 0, as Hugging Face).
The MLA layers are numpy_attn/mla.py's with no positions at all (NoPE): the query's and the
shared key's "rotary" parts pass unrotated, which rope at position 0 is exactly (cos 0 = 1,
sin 0 = 0), so the layers run MLA with every position 0; the score scale is 1 / sqrt(dn + dr).
The networks are DeepSeek-V3's: a SwiGLU network of width ``hidden`` where ``mlp_layer_types``
says "dense" (the first ``first_k_dense_replace`` by default), the mixture of experts where it
says "sparse". Every RMS norm scales by w. Parameters: ``blocks.i.attn`` holds mla.py's on a full
layer, KDA's (named as Hugging Face's) on a linear one; ``pad_token_id`` names the embedding row
that gets no gradient (transformers' padding_idx).

Decoding (``kimi_linear_kv_cache``): a full layer keeps MLA's latent c_kv and its shared key k_r
per token (absorbed decoding, as deepseek_v3's LatentKVCache), a linear layer KDA's state {"conv",
"recurrent"}, whose size does not grow with the text. ``attn_mask`` marks padding for the KDA
layers too: a token whose own key it masks is read as zeros by them (qwen3_5's state_sublayer), so
that it never reaches their state.

float16 and bfloat16 as the other families (Kimi Delta Attention computes them in float32), float32, float64.
"""

from dataclasses import dataclass

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_config, check_rng
from numpy_attn._family import Family
from numpy_attn.deepseek_v3 import (
    DEEPSEEK_MOE,
    DeepseekV3Config,
    LatentKVCache,
    _absorbed_attention,
    deepseek_v3_attention_backward,
    init_deepseek_v3_params,
)
from numpy_attn.kimi_delta_attention import (
    kimi_delta_attention_backward,
    kimi_delta_attention_forward,
    kimi_delta_attention_param_shapes,
)
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.llama import SWIGLU_MLP, llama_block_backward, llama_block_forward
from numpy_attn.mla import mla_forward
from numpy_attn.qwen3_5 import LAYER_TYPES, Qwen3_5Cache, state_sublayer

MLP_TYPES = ("dense", "sparse")


@dataclass(frozen=True)
class KimiLinearConfig(DeepseekV3Config):
    """DeepseekV3Config's fields and checks (MLA's sizes, the experts and their routing; rope_theta,
    rope_interleave unused: no positions), and the layer types and KDA's sizes."""

    layer_types: tuple | None = None       # n_layer of LAYER_TYPES; None: layers 4, 8, ... full, as Hugging Face
    mlp_layer_types: tuple | None = None   # n_layer of "dense", "sparse"; None: the first first_k_dense_replace dense
    linear_num_heads: int = 2              # nh of KDA
    linear_head_dim: int = 4               # d, KDA's key and value width
    conv_kernel: int = 4                   # K, its convolution's taps (linear_conv_kernel_dim)
    pad_token_id: int | None = None        # the embedding row that gets no gradient

    def __post_init__(self):
        super().__post_init__()
        for name, value in _check_kimi_linear_config(self).items():
            object.__setattr__(self, name, value)

    def is_full(self, i):
        """Whether layer i is an MLA layer (else KDA)."""
        return self.layer_types[i] == "full_attention"

    def is_moe(self, i):
        """Whether block i's network is the mixture of experts (mlp_layer_types[i] == "sparse")."""
        return self.mlp_layer_types[i] == "sparse"


def init_kimi_linear_params(config, rng, dtype=np.float32):
    """init_deepseek_v3_params' tree with KDA's params on the linear layers: projections and the
    convolution from N(0, 0.02^2), A_log at log U(1, 16), dt_bias the inverse softplus of
    exp(U(log 1e-3, log 1e-1)), the gated norm at 1 (Hugging Face's initialisation)."""
    check_rng(rng, "init_kimi_linear_params")
    params = init_deepseek_v3_params(config, rng, dtype)
    shapes = kimi_delta_attention_param_shapes(config.n_embd, config.linear_num_heads, config.linear_head_dim,
                                               config.conv_kernel)
    for i, block in params["blocks"].items():
        if config.is_full(int(i)):
            continue
        attn = {}
        for path, shape in shapes.items():
            name, _, key = path.partition(".")
            value = rng.normal(0, 0.02, shape)
            if name == "A_log":
                value = np.log(rng.uniform(1, 16, shape))
            elif name == "dt_bias":
                dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
                value = dt + np.log(-np.expm1(-dt))                           # softplus(value) = dt
            elif name == "o_norm":
                value = np.ones(shape)
            if key:
                attn[name] = {key: value.astype(dtype)}
            else:
                attn[name] = value.astype(dtype)
        block["attn"] = attn
    return params


# -- the mixers ------------------------------------------------------------------------------------

def kimi_attention_forward(h, params, config, positions, *, attn_mask=None, kv_cache=None):
    """MLA without positions: mla.py's with every position 0, where rope is the identity; absorbed
    from this layer's latents when decoding (inference only: no cache then). Returns ``(out, cache)``."""
    nope = np.zeros_like(positions)
    if kv_cache is not None:
        return _absorbed_attention(h, params, config.mla, nope, kv_cache, attn_mask), None
    return mla_forward(h, params, config.mla, nope, attn_mask=attn_mask)   # (B, T, C)


def _kda(x, params, config, state, mask):
    """Kimi Delta Attention with the config's sizes."""
    return kimi_delta_attention_forward(x, params, config.linear_num_heads, config.linear_head_dim, config.rms_eps,
                                        state=state, mask=mask)


KIMI_ATTENTION = _model.Sublayer(kimi_attention_forward, deepseek_v3_attention_backward)
KIMI_DELTA_ATTENTION = state_sublayer(_kda, kimi_delta_attention_backward)


# -- the model -------------------------------------------------------------------------------------

def _layer_options(config):
    """Block i's options for decoder_forward: its mixer and its network."""
    return lambda i: {"attention": KIMI_ATTENTION if config.is_full(i) else KIMI_DELTA_ATTENTION,
                      "mlp": DEEPSEEK_MOE if config.is_moe(i) else SWIGLU_MLP}


def kimi_linear_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                        logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords; ``kv_cache``
    from kimi_linear_kv_cache; ``positions`` unused: no layer reads them). Returns ``(logits, cache)``."""
    if kv_cache is not None and not isinstance(kv_cache, KimiLinearCache):
        raise TypeError(f"kv_cache must be a KimiLinearCache (from kimi_linear_kv_cache), "
                        f"got {type(kv_cache).__name__}")
    return _model.decoder_forward(ids, params, config, KimiLinearConfig, llama_block_forward, positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                                  for_backward=for_backward, layer_options=_layer_options(config),
                                  padding_idx=getattr(config, "pad_token_id", None))   # another class: refused there


kimi_linear_backward = _model.decoder_backward_of("kimi_linear", llama_block_backward)


# -- decoding: latents on the MLA layers, KDA's state on the linear ones ----------------------------

@dataclass
class KimiLinearCache(Qwen3_5Cache, LatentKVCache):
    """Qwen3_5Cache's hybrid layout whose full layers keep MLA's latents: per full layer and token
    one "head" whose key is the normed latent c_kv (rkv) and whose value the shared key k_r (dr),
    as deepseek_v3's LatentKVCache (so the MLA layers decode absorbed); per linear layer KDA's state."""


def kimi_linear_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty cache for decoding B sequences of up to ``max_len`` (default block_size) tokens: the
    full layers' latents (rkv + dr numbers a token), each linear layer's state at zeros
    ({"conv": (B, 3 nh d, K-1), "recurrent": (B, nh, d, d)})."""
    max_len = config.block_size if max_len is None else max_len
    full = [i for i in range(config.n_layer) if config.is_full(i)]
    kv = init_kv_cache(max(len(full), 1), B, 1, max_len, config.kv_lora_rank, dtype,
                       v_head_size=config.qk_rope_head_dim)
    if not full:   # no MLA layer: an empty latent part (init_kv_cache wants a layer)
        kv = type(kv)(kv.buffer_k[:0], kv.buffer_v[:0], kv.lengths[:0], (), kv.dims, kv.v_head_size)
    dt = kv.buffer_k.dtype
    nh, d, K = config.linear_num_heads, config.linear_head_dim, config.conv_kernel
    states = [None if config.is_full(i) else
              {"conv": np.zeros((B, 3 * nh * d, K - 1), dt), "recurrent": np.zeros((B, nh, d, d), dt)}
              for i in range(config.n_layer)]
    full_index = tuple(full.index(i) if i in full else None for i in range(config.n_layer))
    return KimiLinearCache(kv.buffer_k, kv.buffer_v, kv.lengths, kv.windows, kv.dims, kv.v_head_size,
                           tuple(config.layer_types), full_index, states, np.zeros(config.n_layer, np.int64))


def _check_kimi_linear_config(config):
    """Return the new fields as Python values, or raise naming the field (numpy_attn/_checks.py)."""
    values = check_config(config, {"linear_num_heads": (int, 1), "linear_head_dim": (int, 1),
                                   "conv_kernel": (int, 1), "pad_token_id": (int | None, 0)})
    name = "KimiLinearConfig"
    if config.rope_scaling is not None:
        raise ValueError(f"{name}.rope_scaling must be None (Kimi Linear's attention has no positions), "
                         f"got {config.rope_scaling!r}")
    if values["pad_token_id"] is not None and values["pad_token_id"] >= config.vocab_size:
        raise ValueError(f"{name}.pad_token_id = {values['pad_token_id']} must be below vocab_size = "
                         f"{config.vocab_size}")
    L = config.n_layer
    defaults = {"layer_types": tuple(LAYER_TYPES[bool(i and i % 4 == 0)] for i in range(L)),
                "mlp_layer_types": tuple(MLP_TYPES[i >= config.first_k_dense_replace] for i in range(L))}
    for field, allowed in (("layer_types", LAYER_TYPES), ("mlp_layer_types", MLP_TYPES)):
        types = getattr(config, field)
        types = defaults[field] if types is None else types
        if isinstance(types, str) or not isinstance(types, tuple | list) or len(types) != L:
            raise ValueError(f"{name}.{field} must list n_layer = {L} entries, got {types!r}")
        for t in types:
            if t not in allowed:
                raise ValueError(f"{name}.{field}: each entry must be one of {allowed}, got {t!r}")
        values[field] = tuple(types)
    return values


FAMILY = Family(name="kimi_linear", title="Kimi Linear", architectures=("KimiLinearForCausalLM",),
                config=KimiLinearConfig, forward=kimi_linear_forward, backward=kimi_linear_backward,
                kv_cache=kimi_linear_kv_cache, init_params=init_kimi_linear_params)
