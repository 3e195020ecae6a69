"""LlamaForCausalLM folders -> numpy_attn.llama's LlamaConfig and params, and the reading that the
families built on Llama's layout share: its config.json keys, llama_config and llama_params.

Llama's nn.Linear weights are (C_out, C_in) and are transposed to our (C_in, C_out). A tied head
(``tie_word_embeddings``) is the token embedding; a file may omit it or repeat it, and a head of
other values in the file is read as an untied head (transformers keeps it). Hugging Face's
Llama rotates q and k in the "half" layout, so the config says so.
"""

from attn_cli.hf.config import Reader, context_length, rope_settings
from attn_cli.hf.files import CheckpointError
from numpy_attn.llama import LlamaConfig

# The config.json keys read: key -> (what it must be, lowest value, required).
KEYS = {
    "vocab_size": ("int", 1, True), "hidden_size": ("int", 1, True),
    "intermediate_size": ("int", 1, True), "num_hidden_layers": ("int", 0, True),
    "num_attention_heads": ("int", 1, True), "num_key_value_heads": ("int or null", 1, False),
    "head_dim": ("int or null", 1, False), "max_position_embeddings": ("int", 1, False),
    "rms_norm_eps": ("number", 0, False), "rope_theta": ("number", 0, False),
    "rope_parameters": ("object or null", None, False), "rope_scaling": ("object or null", None, False),
    "attention_bias": ("bool", None, False), "mlp_bias": ("bool", None, False),
    "tie_word_embeddings": ("bool", None, False), "hidden_act": ("str", None, False)}
# The families built on Llama's layout read its keys but mlp_bias (their MLPs have none).
LAYOUT_KEYS = {key: rule for key, rule in KEYS.items() if key != "mlp_bias"}


def llama_config(hf, config_class=LlamaConfig):
    """LlamaConfig (or ``config_class``, a family built on it) from a Llama config.json (dict):
    rope settings from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (transformers 4), every kind numpy_attn/rope.py implements (config.rope_settings)."""
    family = config_class.__name__.removesuffix("Config")         # "Llama", "Qwen3", "Olmo2"
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{family} config.json: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    theta, scaling = rope_settings(hf, family)
    n_head = hf["num_attention_heads"]
    return config_class(
        vocab_size=hf["vocab_size"], block_size=context_length(hf, scaling),
        n_layer=hf["num_hidden_layers"], n_head=n_head,
        n_kv_head=hf.get("num_key_value_heads") or n_head, n_embd=hf["hidden_size"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_head, hidden=hf["intermediate_size"],
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=float(theta), rope_scaling=scaling,
        rope_layout="half", attn_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)) and family == "Llama",   # the others' MLPs have none
        tie_weights=bool(hf.get("tie_word_embeddings", False)))


def llama_params(tensors, config, norms=("input_layernorm", "post_attention_layernorm"), mlp=None, qk_norm=None):
    """The params of a Llama (or a family on its layout) from its tensors; ``norms`` names the
    block's two norms, our attn_norm and mlp_norm; ``mlp(tensors, prefix, config)``, if given, reads
    the block's "mlp" in place of Llama's SwiGLU; ``qk_norm`` (q's width, k's width), if given,
    reads the q_norm and k_norm weights of QK-norm (Qwen3, OLMo 2, Gemma 3)."""
    V, C, H, hs = config.vocab_size, config.n_embd, config.hidden, config.hs
    nh, nkv = config.n_head, config.n_kv_head

    def linear(name, C_in, C_out, bias):
        return read_linear(tensors, name, C_in, C_out, bias)

    params = {"wte": tensors.take("model.embed_tokens.weight", (V, C)), "blocks": {}}
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        bias = config.attn_bias
        attn = {"q": linear(p + "self_attn.q_proj", C, nh * hs, bias),
                "k": linear(p + "self_attn.k_proj", C, nkv * hs, bias),
                "v": linear(p + "self_attn.v_proj", C, nkv * hs, bias),
                "o": linear(p + "self_attn.o_proj", nh * hs, C, bias)}
        if qk_norm:
            attn["q_norm"] = {"w": tensors.take(p + "self_attn.q_norm.weight", (qk_norm[0],))}
            attn["k_norm"] = {"w": tensors.take(p + "self_attn.k_norm.weight", (qk_norm[1],))}
        mlp_params = mlp(tensors, p + "mlp.", config) if mlp else {
            "gate": linear(p + "mlp.gate_proj", C, H, config.mlp_bias),
            "up": linear(p + "mlp.up_proj", C, H, config.mlp_bias),
            "down": linear(p + "mlp.down_proj", H, C, config.mlp_bias)}
        params["blocks"][str(i)] = {
            "attn_norm": {"w": tensors.take(f"{p}{norms[0]}.weight", (C,))}, "attn": attn,
            "mlp_norm": {"w": tensors.take(f"{p}{norms[1]}.weight", (C,))}, "mlp": mlp_params}
    return with_norm_and_head(params, tensors, config)


def read_linear(tensors, name, C_in, C_out, bias=False):
    """The linear layer ``name`` {"w": (C_in, C_out)[, "b": (C_out,)]}: nn.Linear's (C_out, C_in) weight transposed."""
    layer = {"w": tensors.take(f"{name}.weight", (C_out, C_in)).T.copy()}   # (C_out, C_in) -> (C_in, C_out)
    if bias:
        layer["b"] = tensors.take(f"{name}.bias", (C_out,))
    return layer


def with_norm_and_head(params, tensors, config):
    """``params`` with the final norm and the head the file holds (_Tensors.head: none where a
    tied config's file omits it or repeats the embedding; load_checkpoint unties a config whose
    params hold one)."""
    params["norm"] = {"w": tensors.take("model.norm.weight", (config.n_embd,))}
    head = tensors.head("lm_head.weight", params["wte"], config.tie_weights)
    if head is not None:
        params["head"] = {"w": head}                                       # (C, V)
    return params


READER = Reader(KEYS, llama_config, llama_params)
