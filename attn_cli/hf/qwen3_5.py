"""Qwen3_5ForCausalLM folders (the text model) -> numpy_attn.qwen3_5's Qwen3_5Config and params:
Llama's keys, the layer types, the partial rotary factor and Gated DeltaNet's sizes.

The rope object of a Qwen3.5 config.json carries ``partial_rotary_factor`` (the share of each
head that rotates) and, for the vision-language model, ``mrope_section`` and
``mrope_interleaved``: three rotations for time, height and width, which text positions make one
rotation (they are equal for every token), so those two are read and dropped. Layers: each entry
of ``layer_types``, or, without it, every ``full_attention_interval``-th layer (4) full, as
transformers reads them.
"""

from attn_cli.hf.config import Reader, context_length, read_layer_types, rope_settings
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.llama import LAYOUT_KEYS, read_linear, with_norm_and_head
from numpy_attn.qwen3_5 import LAYER_TYPES, Qwen3_5Config

KEYS = {**LAYOUT_KEYS, "linear_conv_kernel_dim": ("int", 1, False), "linear_key_head_dim": ("int", 1, False),
        "linear_value_head_dim": ("int", 1, False), "linear_num_key_heads": ("int", 1, False),
        "linear_num_value_heads": ("int", 1, False), "full_attention_interval": ("int", 1, False),
        "partial_rotary_factor": ("number", 0, False)}

# transformers' Qwen3_5TextConfig's values for keys left out, where they are not Llama's.
DEFAULTS = {"head_dim": 256, "num_key_value_heads": 4, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
            "linear_num_value_heads": 32}
MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def layer_types(hf, title="Qwen3.5"):
    """The layer types as transformers reads them: layer_types, else every full_attention_interval-th full."""
    types = read_layer_types(hf, title)
    if types is None:
        interval = hf.get("full_attention_interval", 4)
        types = tuple(LAYER_TYPES[(i + 1) % interval == 0] for i in range(hf["num_hidden_layers"]))
    bad = [t for t in types if t not in LAYER_TYPES]
    if bad:
        raise CheckpointError(f"{title} config.json: layer_types must list only 'linear_attention' and "
                              f"'full_attention', got {_short(bad[0])}")
    return types


def qwen3_5_config(hf, title="Qwen3.5", config_class=Qwen3_5Config, **fields):
    """Qwen3_5Config from a Qwen3.5 text config.json (dict); or, for a family built on it (Qwen3-Next),
    its ``config_class`` with its own ``fields`` too, ``title`` naming it in messages."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{title} config.json: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    rope = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    partial = rope.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
    for key in MROPE_KEYS:
        rope.pop(key, None)
    plain = {key: value for key, value in hf.items() if key not in ("rope_scaling", "partial_rotary_factor")}
    theta, scaling = rope_settings({**plain, "rope_parameters": rope}, title)
    n_head = hf["num_attention_heads"]
    return config_class(
        vocab_size=hf["vocab_size"], block_size=context_length(hf, scaling), n_layer=hf["num_hidden_layers"],
        n_head=n_head, n_kv_head=hf.get("num_key_value_heads") or n_head, n_embd=hf["hidden_size"],
        head_dim=hf["head_dim"], hidden=hf["intermediate_size"], rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta), rope_scaling=scaling, rope_layout="half",
        attn_bias=bool(hf.get("attention_bias", False)), tie_weights=bool(hf.get("tie_word_embeddings", False)),
        layer_types=layer_types(hf, title), partial_rotary_factor=float(partial),
        linear_k_heads=hf["linear_num_key_heads"], linear_v_heads=hf["linear_num_value_heads"],
        linear_k_dim=hf["linear_key_head_dim"], linear_v_dim=hf["linear_value_head_dim"],
        conv_kernel=hf["linear_conv_kernel_dim"], **fields)


def projections(tensors, a, config):
    """Gated DeltaNet's input projections under ``a`` (model.layers.i.linear_attn.): Qwen3.5's four."""
    C, nv, dv = config.n_embd, config.linear_v_heads, config.linear_v_dim
    return {"in_proj_qkv": read_linear(tensors, a + "in_proj_qkv", C, config.conv_dim),
            "in_proj_z": read_linear(tensors, a + "in_proj_z", C, nv * dv),
            "in_proj_b": read_linear(tensors, a + "in_proj_b", C, nv),
            "in_proj_a": read_linear(tensors, a + "in_proj_a", C, nv)}


def read_swiglu(tensors, name, C, H):
    """A SwiGLU network C -> H -> C under ``name`` (model.layers.i.mlp, or an expert): its three projections."""
    return {n: read_linear(tensors, f"{name}.{n}_proj", *((H, C) if n == "down" else (C, H)))
            for n in ("gate", "up", "down")}


def swiglu_params(tensors, p, config, i):
    """Block i's network under ``p`` (model.layers.i.): a SwiGLU network of width intermediate_size."""
    return read_swiglu(tensors, p + "mlp", config.n_embd, config.hidden)


def qwen3_5_params(tensors, config, projections=projections, mlp=swiglu_params):
    """The params from the tensors: nn.Linear's (C_out, C_in) transposed, the convolution's
    (conv_dim, 1, K) read as (conv_dim, K), the norms' weights as stored (they scale by 1 + w there too).
    A family built on Qwen3.5 brings its own Gated DeltaNet ``projections`` and block ``mlp``."""
    V, C, hs = config.vocab_size, config.n_embd, config.hs
    nh, nkv, nv, dv = config.n_head, config.n_kv_head, config.linear_v_heads, config.linear_v_dim

    def linear(name, C_in, C_out, bias=False):
        return read_linear(tensors, name, C_in, C_out, bias)

    params = {"wte": tensors.take("model.embed_tokens.weight", (V, C)), "blocks": {}}
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        if config.is_full(i):
            a, bias = p + "self_attn.", config.attn_bias
            attn = {"q": linear(a + "q_proj", C, nh * 2 * hs, bias), "k": linear(a + "k_proj", C, nkv * hs, bias),
                    "v": linear(a + "v_proj", C, nkv * hs, bias), "o": linear(a + "o_proj", nh * hs, C, bias),
                    "q_norm": {"w": tensors.take(a + "q_norm.weight", (hs,))},
                    "k_norm": {"w": tensors.take(a + "k_norm.weight", (hs,))}}
        else:
            a = p + "linear_attn."
            attn = {**projections(tensors, a, config),
                    "conv1d": {"w": tensors.take(a + "conv1d.weight", (config.conv_dim, 1, config.conv_kernel))[:, 0]},
                    "dt_bias": tensors.take(a + "dt_bias", (nv,)), "A_log": tensors.take(a + "A_log", (nv,)),
                    "norm": {"w": tensors.take(a + "norm.weight", (dv,))},
                    "out_proj": linear(a + "out_proj", nv * dv, C)}
        params["blocks"][str(i)] = {
            "attn_norm": {"w": tensors.take(p + "input_layernorm.weight", (C,))}, "attn": attn,
            "mlp_norm": {"w": tensors.take(p + "post_attention_layernorm.weight", (C,))},
            "mlp": mlp(tensors, p, config, i)}
    return with_norm_and_head(params, tensors, config)


def qwen3_5_parameter_count(hf):
    """A lower bound on the parameters config.json implies (Python integers: no size overflows): the
    embedding, the final norm and per layer its two norms, its MLP and its mixer's weight matrices."""
    hf = {**DEFAULTS, **hf}
    C, H, L = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
    nh = hf["num_attention_heads"]
    nkv, hs = hf.get("num_key_value_heads") or nh, hf.get("head_dim") or C // nh
    nk, nv = hf["linear_num_key_heads"], hf["linear_num_value_heads"]
    dk, dv = hf["linear_key_head_dim"], hf["linear_value_head_dim"]
    try:
        types = layer_types(hf)
    except CheckpointError:
        types = ("linear_attention",) * L      # refused later, by name; bound by the smaller mixer here
    full = 3 * C * nh * hs + 2 * C * nkv * hs                                  # q (query and gate), o, k, v
    linear = C * (2 * nk * dk + nv * dv) + 2 * C * nv * dv + 2 * C * nv         # in_proj_qkv, z, out_proj, b, a
    mixers = sum(full if t == "full_attention" else linear for t in types)
    return hf["vocab_size"] * C + mixers + L * (3 * C * H + 2 * C) + C


READER = Reader(KEYS, qwen3_5_config, qwen3_5_params, parameter_count=qwen3_5_parameter_count, defaults=DEFAULTS)
