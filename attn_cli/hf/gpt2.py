"""GPT2LMHeadModel folders -> numpy_attn.gpt's GPTConfig (with GPT-2's GELU and eps) and params.

GPT-2's Conv1D weights are already (C_in, C_out), as ours; its ``c_attn`` holds q, k and v side by
side in (C, 3C), split here into three. A tied head (``tie_word_embeddings``) is the token
embedding; a file may omit it or repeat it, and a head of other values in the file is read as an
untied head (transformers keeps it).
"""

from attn_cli.hf.config import Reader
from attn_cli.hf.files import CheckpointError
from numpy_attn.gpt import GPTConfig

GELUS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
# Buffers that older GPT-2 files store beside the weights: the causal mask, not parameters.
GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")
# The config.json keys read: key -> (what it must be, lowest value, required).
KEYS = {
    "vocab_size": ("int", 1, True), "n_positions": ("int", 1, True), "n_layer": ("int", 0, True),
    "n_head": ("int", 1, True), "n_embd": ("int", 1, True), "n_inner": ("int or null", 1, False),
    "layer_norm_epsilon": ("number", 0, False), "activation_function": ("str", None, False),
    "tie_word_embeddings": ("bool", None, False), "scale_attn_weights": ("bool", None, False),
    "scale_attn_by_inverse_layer_idx": ("bool", None, False),
    "reorder_and_upcast_attn": ("bool", None, False), "add_cross_attention": ("bool", None, False)}

# transformers' GPT2Config reads these names in place of its own (its attribute_map).
ALIASES = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
           "num_hidden_layers": "n_layer"}


def gpt2_parameter_count(hf):
    """A lower bound on the parameters a GPT-2 config.json implies (biases, an untied head and,
    without n_inner, the MLP left out), in Python integers."""
    C, L, H = hf["n_embd"], hf["n_layer"], hf.get("n_inner") or 0
    per_layer = 4 * C * C + 2 * C * H + 4 * C          # c_attn, c_proj, the MLP, two layer norms
    return hf["vocab_size"] * C + hf["n_positions"] * C + L * per_layer + 2 * C


def gpt2_config(hf):
    """GPTConfig from a GPT-2 config.json (dict); unsupported options are refused by name."""
    for key, supported in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                           ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
        if hf.get(key, supported) != supported:
            raise CheckpointError(f"GPT-2 config.json: {key} = {hf[key]!r} is not supported "
                                  f"(only {supported!r})")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GELUS:
        raise CheckpointError(f"GPT-2 config.json: activation_function {activation!r} is not supported "
                              f"(one of {sorted(GELUS)})")
    return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                     n_head=hf["n_head"], n_embd=hf["n_embd"], dropout=0.0, bias=True,
                     tie_weights=bool(hf.get("tie_word_embeddings", True)), positions="learned",
                     ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)), gelu=GELUS[activation])


def _gpt2_params(tensors, config):
    # Files written by GPT2LMHeadModel prefix "transformer."; the original release does not.
    prefix = "transformer." if any(k.startswith("transformer.") for k in tensors.left) else ""
    for name in list(tensors.left):
        if name.endswith(GPT2_BUFFERS):    # "h.0.attn.bias", never "h.0.attn.c_attn.bias"
            tensors.drop(name)
    V, C, T_max = config.vocab_size, config.n_embd, config.block_size
    fc = tensors.left.get(f"{prefix}h.0.mlp.c_fc.weight")          # no default array: C may be huge
    H = 4 * C if fc is None else fc.shape[-1]                         # n_inner's, checked by _gpt2_widths

    def take(name, shape):
        return tensors.take(prefix + name, shape)

    def layer_norm(name):
        return {"w": take(f"{name}.weight", (C,)), "b": take(f"{name}.bias", (C,))}

    params = {"wte": take("wte.weight", (V, C)), "wpe": take("wpe.weight", (T_max, C)), "blocks": {}}
    for i in range(config.n_layer):
        h = f"h.{i}."
        qkv_w = take(h + "attn.c_attn.weight", (C, 3 * C))                    # (C, 3C): q | k | v
        qkv_b = take(h + "attn.c_attn.bias", (3 * C,))
        # Contiguous copies, one layer at a time (c_attn is then dropped): a strided view would
        # save C x 3C floats while loading but make every pass over the weight slower (2.5x for
        # multi_head's finiteness check).
        attn = {name: {"w": qkv_w[:, j * C:(j + 1) * C].copy(), "b": qkv_b[j * C:(j + 1) * C].copy()}
                for j, name in enumerate("qkv")}
        attn["o"] = {"w": take(h + "attn.c_proj.weight", (C, C)), "b": take(h + "attn.c_proj.bias", (C,))}
        ffn = {"fc": {"w": take(h + "mlp.c_fc.weight", (C, H)), "b": take(h + "mlp.c_fc.bias", (H,))},
               "proj": {"w": take(h + "mlp.c_proj.weight", (H, C)), "b": take(h + "mlp.c_proj.bias", (C,))}}
        params["blocks"][str(i)] = {"ln1": layer_norm(h + "ln_1"), "attn": attn,
                                    "ln2": layer_norm(h + "ln_2"), "ffn": ffn}
    params["ln_f"] = layer_norm("ln_f")
    head = tensors.head("lm_head.weight", params["wte"], config.tie_weights)   # as llama.with_norm_and_head
    if head is not None:
        params["head"] = {"w": head}                                       # (C, V)
    return params


def _gpt2_widths(hf, tensors):
    """Refuse an MLP of another width than config.json's n_inner (absent or null: 4 n_embd), which
    transformers builds and so would not load the file's into."""
    H = hf.get("n_inner") or 4 * hf["n_embd"]
    for name, fc in tensors.left.items():
        if name.endswith("mlp.c_fc.weight") and fc.shape[-1:] != (H,):
            raise CheckpointError(f"{tensors.folder}: tensor {name!r} has shape {tuple(fc.shape)}, but config.json's "
                                  f"n_inner = {hf.get('n_inner')} asks for a width of {H} (4 n_embd where null "
                                  "or absent)")


READER = Reader(KEYS, gpt2_config, _gpt2_params, gpt2_parameter_count, aliases=ALIASES, layers_key="n_layer",
                check_tensors=_gpt2_widths)
