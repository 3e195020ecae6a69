"""Parity tests for numpy_attn/qwen3.py and torch_attn/qwen3.py, against Hugging Face's Qwen3.

Qwen3 is test_llama.py's model with QK-norm per head, so these are test_llama.py's kinds of test
run on it (the QK-norm pieces themselves are tested there, beside qk_norm_forward), plus cached
decoding and checkpoints saved by transformers. ``model_tests`` makes them for any family built on
Llama's model; parity_tests/test_olmo2.py runs them on OLMo 2.
"""

import copy
import json
from typing import NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import torch_attn.llama as tw_llama
import torch_attn.qwen3 as tw
from attn_cli import cli
from attn_cli.hf import CheckpointError, load_checkpoint
from numpy_attn.llama import LlamaConfig, init_llama_params, llama_forward, llama_kv_cache
from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward
from numpy_attn.qwen3 import Qwen3Config, init_qwen3_params, qwen3_backward, qwen3_forward
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_close,
    assert_tree_close,
    autograd,
    decode_in_steps,
    directional_derivative,
    directional_tol,
    layer_norm_tol,
    reorder_tol,
    round_to,
    to_numpy,
    to_torch,
    tree_dot,
    tree_map,
    tree_to_torch,
)
from parity_tests.test_gpt import assert_keeps_the_last_logits
from parity_tests.test_hf import _compare, _ids, _randomise, _save
from parity_tests.test_hf_generate import _hf_greedy
from parity_tests.test_llama import (
    _rstds,
    assert_family_meets_error_budget,
    assert_model_meets_error_budget,
    budget_models,
    exact_hf_llama,
    hf_llama,
    hf_logits_and_grads,
    init_params,
    models,
    round_tree,
    to_hf_names,
)


class Family(NamedTuple):
    """One model family built on numpy_attn/llama.py: its config class, its NumPy forward and
    backward, its torch twin, and its kind in attn_cli.hf (the cache is llama_kv_cache's)."""

    name: str
    title: str               # as messages name it
    config_class: type
    forward: object
    backward: object
    twin: object
    kind: str


QWEN3 = Family("qwen3", "Qwen3", Qwen3Config, qwen3_forward, qwen3_backward, tw.qwen3, "qwen3")


def _tol(cache, dtype):
    """RMS norms (QK-norms included) amplify rounding as layer norms do (see layer_norm_tol)."""
    return layer_norm_tol(_rstds(cache), dtype)


def _pinned(config_class):
    """The edge cases: one head of size 2 (so one key/value head), T = 1, one layer, float64."""
    config = config_class(vocab_size=5, block_size=3, n_layer=1, n_head=1, n_kv_head=1, n_embd=4, head_dim=2,
                          hidden=3)
    rng = np.random.default_rng(2)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_params(config, rng, np.float64))
    ids = np.array([[3]])
    return config, params, ids, None, rng.normal(size=ids.shape + (config.vocab_size,))


def assert_changed_config_refused(folder, capsys, changes, message):
    """The saved ``folder`` with config.json changed: load_checkpoint and generate --hf refuse it,
    naming the field (``message``, a pattern)."""
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(folder)
    assert cli.main(["generate", "--hf", str(folder), "--ids", "1,2"]) == 2
    assert message.replace("\\", "") in capsys.readouterr().err


def assert_checkpoint_meets_error_budget(name, dtype, model, folder, seed, forward, backward, twin, to_hf, exact,
                                         compared=None):
    """test_llama.assert_model_meets_error_budget for a model read from a checkpoint: transformers'
    float64 ``model`` gets its weights rounded to the low ``dtype`` (in place), is saved to ``folder``
    and loaded by attn_cli.hf, and ours (``forward``, ``backward``) and the twin run those weights in
    ``dtype``; transformers runs a copy cast to ``dtype``, and for the truth the float64 model made
    exact by ``exact(model, config, monkeypatch)`` (undone after). ids (2, 7) and dout drawn from
    ``seed``; ``to_hf(grads, config)`` names our gradients as transformers does. ``compared(ids,
    config, cache, lowp_model, truth_model)`` (``cache`` ours), if given, returns the (2, 7) tokens
    compared: the others' logits are set to 0 on every side and their dout to 0 (a routed model's
    tokens whose experts rounding chooses, decided_tokens). Returns what
    assert_model_meets_error_budget returns."""
    low = LOW_DTYPES[dtype][1]
    with torch.no_grad():   # what the checkpoint holds: the parameters and the saved buffers (a selection bias)
        for p in model.state_dict(keep_vars=True).values():
            p.copy_(p.to(low).to(p.dtype))
    _, config, params = load_checkpoint(_save(model, folder), np.float64)
    params = round_tree(params, dtype)          # exact: the weights hold low-precision values already
    lowp_model = copy.deepcopy(model).to(low)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, (2, 7))
    dout = round_to(rng.normal(size=(2, 7, config.vocab_size)), dtype)
    keep = np.ones(ids.shape, bool)[..., None]                                 # (2, 7, 1) the tokens compared
    if compared is not None:
        with pytest.MonkeyPatch.context() as monkeypatch:
            keep = compared(ids, config, forward(ids, params, config)[1], lowp_model,
                            exact(model, config, monkeypatch))[..., None]
    dout = np.where(keep, dout, 0).astype(dout.dtype)

    def hide(logits):
        """The logits of the tokens left out set to 0 (a torch tensor or an array)."""
        if isinstance(logits, torch.Tensor):
            return torch.where(torch.from_numpy(keep), logits, torch.zeros((), dtype=logits.dtype))
        return np.where(keep, logits, 0).astype(logits.dtype)

    def hidden(run):
        """``run`` (returning (logits, cache or gradients)) with hide()'s logits."""
        def run_hidden(arg):
            logits, rest = run(arg)
            return hide(logits), rest
        return run_hidden

    def truth(d):
        with pytest.MonkeyPatch.context() as monkeypatch:
            return hf_logits_and_grads(exact(model, config, monkeypatch), ids, None, d)

    return assert_model_meets_error_budget(
        name, dtype, hidden(lambda p: forward(ids, p, config)), backward,
        lambda params: hide(twin(to_torch(ids), params, config)), lambda g: to_hf(g, config), params, dout,
        hidden(lambda d: hf_logits_and_grads(lowp_model, ids, None, d)), hidden(truth))


def router_calls(model, router_class, ids):
    """{layer index: (module, input (N, C), output)} of every ``router_class`` module of ``model``
    (transformers names its layers model.layers.i...) in one call on ``ids``, in order."""
    calls, hooks = {}, []
    for name, module in model.named_modules():
        if type(module).__name__ == router_class:
            layer = int(name.split(".")[2])
            hooks.append(module.register_forward_hook(lambda m, inputs, output, layer=layer: calls.__setitem__(
                layer, (m, inputs[0].reshape(-1, inputs[0].shape[-1]), output))))
    with torch.no_grad():
        model(input_ids=to_torch(ids))
    for hook in hooks:
        hook.remove()
    return [calls[layer] for layer in sorted(calls)]


def decided_tokens(name, shape, truth, lowp, margins, experts):
    """The tokens (B, T) whose experts the model decides, not rounding. ``truth`` and ``lowp`` list
    per MoE layer, in order, the (N, E) values the router ranks (the truth's in float64,
    transformers' in the low dtype as it ranks them); ``margins(values)`` -> (N,) each token's
    smallest gap at its top-k boundaries in units of one value's error (a gap between sums of two
    values counts half). With e transformers' largest error of those values, a program within the
    error budget 2e of the truth's moves a gap by at most 2 (2e) (test_hf_generate._greedy_margin's
    rule without its ulp: no side rounds these values to the low dtype, bar gpt-oss's logits, whose
    rounding e holds): where the truth's margin is larger, it picks the truth's experts. Elsewhere
    rounding picks, and the program that follows is another one, not a rounding of it. A token
    counts when it is decided at the last MoE layer and it and every earlier token of its row at
    the others (causal attention carries an earlier layer's choice to every later token).
    ``experts`` {who: per MoE layer the (N, k) experts chosen}, "truth" among them: at the tokens
    decided every side chose the truth's (asserted). A draw where fewer than half the tokens are
    decided is discarded (hypothesis.assume)."""
    e = max(float(np.abs(low - true).max()) for true, low in zip(truth, lowp, strict=True))
    clear = [(margins(true) > 2 * (2 * e)).reshape(shape) for true in truth]
    keep = clear[-1]
    for before in clear[:-1]:
        keep = keep & np.cumprod(before, axis=1).astype(bool)                 # (B, T)
    assume(keep.mean() >= 0.5)
    chosen = {who: [np.sort(indices, axis=-1)[keep.ravel()] for indices in layers] for who, layers in experts.items()}
    for who, layers in chosen.items():
        for layer, (got, expected) in enumerate(zip(layers, chosen["truth"], strict=True)):
            assert np.array_equal(got, expected), f"{name} MoE layer {layer}: {who}'s experts are not the truth's"
    return keep


def model_tests(family):
    """The tests of one family (a Family), as a class for a Test... class to inherit: made anew for
    each family, so that Hypothesis sees one test function per family (its database keys on it)."""

    class ModelTests:
        """The tests of one family (``family``, a Family); subclasses named Test... run them."""

        def _models(self, **kw):
            return models(config_class=family.config_class, **kw)

        def _twin(self, config, ids, positions):
            """The torch twin as a function of its parameters only, for autograd()."""
            pos = None if positions is None else to_torch(positions)
            return lambda params: family.twin(to_torch(ids), params, config, positions=pos)

        # -- forward matches the twin; backward matches autograd -------------------------------------------

        @pytest.mark.twin_parity
        @given(case=models(config_class=family.config_class))
        @example(case=_pinned(family.config_class))
        def test_forward_and_backward_match_twin(self, case):
            """Logits against the twin's, every gradient (labelled by path) against autograd's."""
            config, params, ids, positions, dout = case
            f = family
            logits, cache = f.forward(ids, params, config, positions=positions)
            dparams = f.backward(dout, cache)
            twin_logits, grads = autograd(self._twin(config, ids, positions), {"params": params}, dout)
            assert_close(f"{f.name}.logits", logits, twin_logits, **_tol(cache, logits.dtype))
            assert_tree_close(f.name, dparams, grads["params"], **_tol(cache, dout.dtype))

        # -- the twin matches Hugging Face's model --------------------------------------------------------

        @given(data=st.data())
        def test_twin_matches_hugging_face(self, data):
            """The twin's logits and gradients against transformers' model holding the same weights:
            float64 with RMS norms and rotary angles in float64 (exact_hf_llama), float32 unchanged."""
            config, params, ids, positions, dout = data.draw(
                self._models(n_layer=1, rope_layout="half")
                | self._models(n_layer=2, dtype=np.float64, rope_layout="half"))
            model = hf_llama(config, params)
            if dout.dtype == np.float64:
                model = exact_hf_llama(model, config)
            twin_logits, twin_grads = autograd(self._twin(config, ids, positions), {"params": params}, dout)
            hf_logits, hf_grads = hf_logits_and_grads(model, ids, positions, dout)
            _, cache = family.forward(ids, params, config, positions=positions)
            tol = _tol(cache, dout.dtype)
            label = f"{family.name} vs {type(model).__name__}"
            assert_close(f"{label}.logits", twin_logits, hf_logits, **tol)
            assert_tree_close(label, to_hf_names(twin_grads["params"], config), hf_grads, **tol)

        # -- float16 and bfloat16: FlashAttention's error rule against transformers ---------------------

        # A model in the low dtype, the twin and transformers' model twice: a handful of examples
        # (test_llama.py's budget test says why).
        @pytest.mark.error_budget
        @pytest.mark.parametrize("dtype", LOW_DTYPES)
        @settings(max_examples=4)
        @given(case=budget_models(family.config_class))
        def test_low_precision_meets_the_error_budget(self, dtype, case):
            """Ours and the twin in float16 and bfloat16 against transformers' model in float64 on the
            same rounded weights, within twice the error of transformers' model in the low dtype."""
            f = family
            assert_family_meets_error_budget(f.name, dtype, case, f.forward, f.backward, f.twin)

        # -- finite differences (no torch) --------------------------------------------------------------

        @given(case=models(config_class=family.config_class, dtype=np.float64), seed=st.integers(0, 2**32 - 1))
        @example(case=_pinned(family.config_class), seed=0)
        def test_backward_matches_finite_differences(self, case, seed):
            """One directional derivative of sum(logits * dout) along a random direction in every parameter."""
            config, params, ids, positions, dout = case
            f = family
            rng = np.random.default_rng(seed)
            direction = tree_map(lambda p: rng.uniform(-1, 1, p.shape), params)
            _, cache = f.forward(ids, params, config, positions=positions)
            grads = f.backward(dout, cache)
            h = 1e-4 / max([1.0] + [float(r.max()) for r in _rstds(cache)])   # as test_llama.py
            numeric = directional_derivative(
                lambda p: np.sum(f.forward(ids, p, config, positions=positions)[0] * dout), params, direction, h=h)
            exact = np.float64(tree_dot(grads, direction))
            assert_close(f"{f.name} directional derivative vs finite differences", exact, np.float64(numeric),
                         **directional_tol(grads, direction))

        # -- cached decoding equals the full forward ------------------------------------------------------

        @given(data=st.data())
        def test_cached_decoding_equals_full_forward(self, data):
            """A prefill of P tokens, then one token at a time: every position's logits equal the full
            forward's (only the order of some sums differs: reorder_tol), and the twin decodes the same."""
            config, params, ids, _, _ = data.draw(self._models(n_layer=data.draw(st.integers(1, 2))))
            P = data.draw(st.integers(1, ids.shape[1]), label="prefill")
            sizes = [P] + [1] * (ids.shape[1] - P)
            f = family
            full, full_cache = f.forward(ids, params, config)
            kv_cache = llama_kv_cache(config, ids.shape[0], params["wte"].dtype)
            cached = decode_in_steps(lambda chunk: f.forward(chunk, params, config, kv_cache=kv_cache)[0], ids, sizes)
            assert_close(f"{f.name} decode.logits vs full forward", cached, full,
                         **reorder_tol(_rstds(full_cache), full.dtype))
            tparams = tree_map(to_torch, params)
            twin_cache = tw_llama.llama_kv_cache(config, ids.shape[0], tparams["wte"].dtype)
            twin = decode_in_steps(
                lambda chunk: to_numpy(f.twin(to_torch(chunk), tparams, config, kv_cache=twin_cache)), ids, sizes)
            assert_close(f"{f.name} decode twin.logits", twin, cached, **_tol(full_cache, full.dtype))

        # -- checkpoints saved by transformers --------------------------------------------------------------

        def hf_model(self, dtype, tie=False, bias=False):
            """A random transformers model of this family: grouped-query heads (4 on 2), head size 8
            for C = 16, two layers; every parameter far from its initialisation (test_hf._randomise)."""
            config = family.config_class(vocab_size=19, block_size=16, n_layer=2, n_head=4, n_kv_head=2,
                                              n_embd=16, head_dim=8, hidden=20, rms_eps=1e-5, attn_bias=bias,
                                              tie_weights=tie)
            params = init_params(config, np.random.default_rng(0), dtype)
            model = hf_llama(config, params)
            return _randomise(model, 0).to({np.float64: torch.float64, np.float32: torch.float32}[dtype]).eval()

        @pytest.mark.parametrize("dtype", [np.float64, np.float32])
        @pytest.mark.parametrize("tie, bias", [(False, False), (True, True)])
        def test_checkpoint_matches_transformers(self, tmp_path, tie, bias, dtype):
            """The folder save_pretrained writes, loaded by attn_cli.hf: logits, and every gradient of
            the next-token loss (our backward and the twin's autograd) against transformers' autograd,
            with test_hf.py's tolerances (its docstring gives the analysis)."""
            f = family
            model = self.hf_model(dtype, tie, bias)
            kind, config, params = load_checkpoint(_save(model, tmp_path), dtype)
            assert kind == f.kind and type(config) is f.config_class and config.tie_weights == tie, config
            if dtype == np.float64:
                model = exact_hf_llama(model, config)
            ids = _ids(config.vocab_size)
            logits, cache = f.forward(ids, params, config)
            rstds = _rstds(cache)
            _, loss_cache = cross_entropy_forward(logits[:, :-1], ids[:, 1:])
            dlogits = np.zeros_like(logits)
            dlogits[:, :-1] = cross_entropy_backward(np.ones((), logits.dtype), loss_cache)
            hf_logits, theirs = hf_logits_and_grads(model, ids, None, dlogits)
            label = f"{f.name} checkpoint (tied={tie}, bias={bias})"
            _compare(f"{label} logits", logits, hf_logits, dtype, rstds)
            tparams = tree_to_torch(params, requires_grad=True)
            (f.twin(to_torch(ids), tparams, config) * to_torch(dlogits)).sum().backward()
            twin = to_hf_names(tree_map(lambda t: to_numpy(t.grad), tparams), config)
            ours = to_hf_names(f.backward(dlogits, cache), config)
            assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
            scale = max(float(np.abs(g).max()) for g in theirs.values())
            for name, g in theirs.items():
                _compare(f"{label} d{name} (twin)", twin[name], g, dtype, rstds, scale)
                _compare(f"{label} d{name} (backward)", ours[name], g, dtype, rstds, scale)

        @pytest.mark.parametrize("cache", [[], ["--no-cache"]])
        def test_generate_hf_ids_equal_transformers_generate(self, tmp_path, capsys, cache):
            """``numpy-attn generate --hf DIR --ids``, with the key/value cache (the default) and
            without: the greedy ids of transformers' generate (use_cache=True)."""
            model = self.hf_model(np.float32)
            model.save_pretrained(tmp_path, safe_serialization=True)
            assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "3,1,4,1,5", "--max-new-tokens", "6",
                             "--temperature", "0", *cache]) == 0
            ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
            assert ours == _hf_greedy(model, [3, 1, 4, 1, 5], 6), f"{family.name}: greedy ids differ from transformers'"

        def test_generate_hf_without_ids_is_refused(self, tmp_path, capsys):
            self.hf_model(np.float32).save_pretrained(tmp_path, safe_serialization=True)
            assert cli.main(["generate", "--hf", str(tmp_path), "--prompt", "hello"]) == 2
            err = capsys.readouterr().err
            assert f"is a {family.title} checkpoint" in err and "--ids 1,2,3" in err, err

        # -- bad input ----------------------------------------------------------------------------------------

        def test_a_config_of_another_family_is_refused(self):
            """Each family's params differ (q and k norms, where the block's norms sit): its forward
            takes its own config class only, and Llama's takes no other."""
            f = family
            config = f.config_class(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=4)
            params = init_params(config, np.random.default_rng(0), np.float64)
            ids = np.zeros((1, 3), np.int64)
            with pytest.raises(TypeError, match=f"config must be a LlamaConfig, got {f.config_class.__name__}"):
                llama_forward(ids, params, config)
            llama_config = LlamaConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=4)
            with pytest.raises(TypeError, match=f"config must be a {f.config_class.__name__}, got LlamaConfig"):
                f.forward(ids, params, llama_config)
            _, cache = f.forward(ids, params, config)
            with pytest.raises(ValueError, match=rf"{f.name}: dlogits must have the shape .* \(1, 3, 7\), got "):
                f.backward(np.zeros((1, 3, 4)), cache)

        def _assert_bad_config_refused(self, tmp_path, capsys, changes, message):
            """The saved folder with config.json changed: load_checkpoint and generate --hf refuse it,
            naming the field."""
            assert_changed_config_refused(_save(self.hf_model(np.float32), tmp_path), capsys, changes, message)

        @pytest.mark.parametrize("changes, message", [
            ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}},
             "rope_type 'longrope' is not supported"),
            ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
            ({"attention_bias": "yes"}, "attention_bias must be a bool, got 'yes'"),
        ])
        def test_bad_config_is_refused_naming_the_field(self, tmp_path, capsys, changes, message):
            self._assert_bad_config_refused(tmp_path, capsys, changes, message)

    return ModelTests


class TestQwen3(model_tests(QWEN3)):

    @pytest.mark.parametrize("changes, message", [
        ({"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window = True is not supported"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types must list only 'full_attention'"),
        ({"layer_types": "full_attention"}, "layer_types must list only 'full_attention'"),
    ])
    def test_sliding_window_is_refused_naming_the_field(self, tmp_path, capsys, changes, message):
        """Qwen3's optional sliding window (off in the released models) is not implemented."""
        self._assert_bad_config_refused(tmp_path, capsys, changes, message)

    def test_qk_norm_is_per_head_before_the_rotation(self):
        """The q norm's weight has width hs and acts on each head alone: scaling one head's query
        projection columns by a constant leaves the logits unchanged (RMS norm removes the scale
        exactly with eps = 0), which a norm across heads (OLMo 2's) would not."""
        config = Qwen3Config(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=8, head_dim=4,
                             rms_eps=0.0)
        rng = np.random.default_rng(0)
        params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_params(config, rng, np.float64))
        assert params["blocks"]["0"]["attn"]["q_norm"]["w"].shape == (4,), "Qwen3's q norm is per head"
        ids = np.array([[1, 2, 3, 4]])
        logits, cache = qwen3_forward(ids, params, config)
        scaled = tree_map(lambda p: p.copy(), params)
        scaled["blocks"]["0"]["attn"]["q"]["w"][:, :4] *= 7.0                  # head 0's query only
        assert_close("qwen3.logits with head 0's query scaled", qwen3_forward(ids, scaled, config)[0], logits,
                     **_tol(cache, np.float64))


# -- logits_to_keep in every family built on numpy_attn/llama.py ------------------------------------

@pytest.fixture(scope="module")
def family_model():
    """``make(name, seed)`` -> (forward, backward, twin, config, params, rstds) of a small float64
    model of family ``name``, its parameters moved off their init by U(-0.5, 0.5): Gemma 2 with a
    final cap of 0.5, so that the cap after the head bends the logits, gpt-oss with sinks and
    experts, DeepSeek-V3 with MLA and a MoE block. A fixture: test_gemma2.py and test_deepseek_v3.py
    import this file (their rstds cannot be imported at its top), and Hypothesis refuses a test
    that imports a module defining tests (a nested @given)."""
    import numpy_attn.deepseek_v3 as deepseek_v3
    import numpy_attn.gemma2 as gemma2
    import numpy_attn.gemma3 as gemma3
    import numpy_attn.gpt_oss as gpt_oss
    import numpy_attn.llama as llama
    import numpy_attn.olmo2 as olmo2
    import torch_attn.deepseek_v3 as tw_deepseek_v3
    import torch_attn.gemma2 as tw_gemma2
    import torch_attn.gemma3 as tw_gemma3
    import torch_attn.gpt_oss as tw_gpt_oss
    import torch_attn.olmo2 as tw_olmo2
    from parity_tests import test_deepseek_v3, test_gemma2

    small = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_kv_head=1, n_embd=8, hidden=6)
    families = {   # name: (forward, backward, twin, config, init, rstds)
        "llama": (llama.llama_forward, llama.llama_backward, tw_llama.llama, llama.LlamaConfig(**small),
                  init_llama_params, _rstds),
        "qwen3": (qwen3_forward, qwen3_backward, tw.qwen3, Qwen3Config(**small), init_qwen3_params, _rstds),
        "olmo2": (olmo2.olmo2_forward, olmo2.olmo2_backward, tw_olmo2.olmo2, olmo2.Olmo2Config(**small),
                  olmo2.init_olmo2_params, _rstds),
        "gemma2": (gemma2.gemma2_forward, gemma2.gemma2_backward, tw_gemma2.gemma2,
                   gemma2.Gemma2Config(**small, sliding_window=2, final_logit_softcap=0.5),
                   gemma2.init_gemma2_params, test_gemma2._rstds),
        "gemma3": (gemma3.gemma3_forward, gemma3.gemma3_backward, tw_gemma3.gemma3,
                   gemma3.Gemma3Config(**small, sliding_window=2), gemma3.init_gemma3_params,
                   test_gemma2._rstds),
        "gpt_oss": (gpt_oss.gpt_oss_forward, gpt_oss.gpt_oss_backward, tw_gpt_oss.gpt_oss,
                    gpt_oss.GptOssConfig(**small, head_dim=4, n_experts=3, experts_per_token=2, sliding_window=2),
                    gpt_oss.init_gpt_oss_params, _rstds),
        "deepseek_v3": (deepseek_v3.deepseek_v3_forward, deepseek_v3.deepseek_v3_backward, tw_deepseek_v3.deepseek_v3,
                        deepseek_v3.DeepseekV3Config(**{**small, "n_kv_head": 2}, n_routed_experts=4, n_group=2,
                                                     topk_group=1, num_experts_per_tok=2, moe_hidden=3,
                                                     first_k_dense_replace=1),
                        deepseek_v3.init_deepseek_v3_params, test_deepseek_v3._rstds),
    }

    def make(name, seed):
        forward, backward, twin, config, init, rstds = families[name]
        rng = np.random.default_rng(seed)
        params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init(config, rng, np.float64))
        return forward, backward, twin, config, params, rstds

    return make


@pytest.mark.parametrize("name", ["llama", "qwen3", "olmo2", "gemma2", "gemma3", "gpt_oss", "deepseek_v3"])
@settings(max_examples=8)
@given(seed=st.integers(0, 2**32 - 1), B=st.integers(1, 2), T=st.integers(1, 6), N=st.integers(0, 7))
@example(seed=0, B=1, T=5, N=1)
def test_logits_to_keep_in_every_family(family_model, name, seed, B, T, N):
    """Each family's forward keeps the last N positions' logits (Gemma's cap applied to those),
    equal to its full forward's and its twin's, with the backward of test_gpt.py's
    assert_keeps_the_last_logits; and it refuses a bad logits_to_keep, naming it."""
    forward, backward, twin, config, params, rstds = family_model(name, seed)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, (B, T))
    dout = rng.normal(size=(B, T, config.vocab_size))
    assert_keeps_the_last_logits(name, lambda ids, p, **kw: forward(ids, p, config, **kw), backward,
                                 lambda p, **kw: twin(to_torch(ids), p, config, **kw), params, ids, N, dout, rstds)
    with pytest.raises(ValueError, match="logits_to_keep must be None or an int >= 0 .*, got -1$"):
        forward(ids, params, config, logits_to_keep=-1)
    with pytest.raises(TypeError, match="logits_to_keep must be None or an int >= 0 .*, got False of type bool"):
        forward(ids, params, config, logits_to_keep=False)
