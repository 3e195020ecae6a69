"""Tests of numpy_attn.testing.check_model: numpy_attn's own models and torch_attn's twins pass,
and bugs planted in a whole model written here are each named at the layer and tensor where the
model first departs; bad usage is refused, naming what is wrong."""

import contextlib
import dataclasses
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import numpy_attn
import torch_attn.gpt as tw_gpt
import torch_attn.llama as tw_llama
from attn_cli import cli
from numpy_attn._family import families
from numpy_attn.gpt import GPTConfig
from numpy_attn.llama import LlamaConfig, llama_backward, llama_forward
from numpy_attn.testing import CheckFailure, check_model
from parity_tests.model_kit import exact_hf_llama, hf_llama, hf_llama_model, save
from torch_attn.embedding import embedding
from torch_attn.rms_norm import rms_norm

# A Llama whose vocabulary is as wide as the model, so that a head weight (C, V) can be transposed
# by mistake and still multiply.
SQUARE = LlamaConfig(vocab_size=32, n_layer=4, n_embd=32, tie_weights=False)


def numpy_model(family, config, states=True):
    """numpy_attn's model of ``family`` as a user's NumPy (forward, backward): the forward returns
    (logits, each block's output, cache), read from the cache, or (logits, cache)."""
    row = families()[family]

    def forward(ids, params):
        logits, cache = row.forward(ids, params, config)
        return (logits, list(cache.hidden[1:]), cache) if states else (logits, cache)

    return forward, row.backward


def torch_llama(config, eps_at=None, no_residual_at=None, head_transposed=False, theta=None):
    """A Llama written here on torch_attn's block, returning (logits, each block's output), with a
    bug planted on request: block ``eps_at``'s RMS norms with eps 1e-5 for 1e-6, block
    ``no_residual_at`` without its skip connection, the head's weight transposed, RoPE with
    ``theta`` for 10000."""
    def forward(ids, params):
        x = embedding(ids, params["wte"])                                    # (B, T, C)
        positions = torch.arange(ids.shape[1])
        hidden = []
        for i in range(config.n_layer):
            block_config = dataclasses.replace(config, rms_eps=1e-5) if i == eps_at else config
            block_config = dataclasses.replace(block_config, rope_theta=theta) if theta else block_config
            out = tw_llama.llama_block(x, params["blocks"][str(i)], block_config, positions)
            x = out - x if i == no_residual_at else out                     # planted: the skip is lost
            hidden.append(x)
        x = rms_norm(x, params["norm"]["w"], config.rms_eps)
        w = params["head"]["w"]                                              # (C, V)
        return x @ (w.T if head_transposed else w), hidden

    return forward


def departs(report):
    """(the tensor a report says departs first, what it says agrees before it)."""
    first = re.search(r"^  first departs: ([\w.]+)", report, flags=re.M).group(1)
    before = re.search(r"^  agree before it: (.*)$", report, flags=re.M).group(1)
    return first, before


def failing(family, forward, backward=None, **kw):
    with pytest.raises(CheckFailure) as info:
        check_model(family, forward, backward, **kw)
    return str(info.value)


# -- numpy_attn's own models and torch_attn's twins pass ------------------------------------------

@pytest.mark.parametrize("family", sorted(families()))
def test_every_family_passes_as_its_own_numpy_model(family):
    forward, backward = numpy_model(family, families()[family].config())
    assert check_model(family, forward, backward) is None


@pytest.mark.parametrize("states", [True, False])
def test_the_llama_twin_passes(states):
    def forward(ids, params):
        logits = tw_llama.llama(ids, params, SQUARE)
        return (logits, torch_llama(SQUARE)(ids, params)[1]) if states else logits

    assert check_model("llama", forward, config=SQUARE, seed=3) is None


def test_the_gpt_twin_passes():
    config = GPTConfig(n_layer=3, tie_weights=False)
    assert check_model("gpt2", lambda ids, params: tw_gpt.gpt(ids, params, config), config=config) is None


def test_transformers_hidden_states_are_read_embedding_first_and_the_last_after_the_norm():
    """n_layer + 1 hidden states, as output_hidden_states: the embedding's output, blocks 0 .. n - 2,
    the final norm's output; a last state before the norm (the block's) is named "final norm"."""
    def forward(ids, params, last="norm"):
        logits, cache = llama_forward(ids, params, SQUARE)
        final = cache.head.linear.x if last == "norm" else cache.hidden[-1]
        return (logits, [*cache.hidden[:-1], final], cache)

    assert check_model("llama", forward, llama_backward, config=SQUARE) is None
    report = failing("llama", lambda ids, params: forward(ids, params, "block"), llama_backward, config=SQUARE)
    assert departs(report) == ("final", "embedding, blocks.0-2"), report
    assert "first at final norm" in report


def test_a_transformers_model_passes_layer_by_layer_and_a_changed_block_is_named():
    """LlamaForCausalLM holding the same weights (made to compute in float64 throughout), its output
    object read as it comes: .logits and .hidden_states, n_layer + 1 of them. Its weights are its
    own, so gradients=False; the nn.Module it calls makes it a torch function. Block 1's second
    norm with eps 1e-5 for 1e-6 is named there."""
    params = families()["llama"].init_params(SQUARE, np.random.default_rng(0), np.float64)
    model = exact_hf_llama(hf_llama(SQUARE, params), SQUARE)

    def forward(ids, params):
        with torch.no_grad():
            return model(ids, output_hidden_states=True)

    assert check_model("llama", forward, params=params, config=SQUARE, gradients=False) is None
    model.model.layers[1].post_attention_layernorm.variance_epsilon = 1e-5
    report = failing("llama", forward, params=params, config=SQUARE, gradients=False)
    assert departs(report) == ("blocks.1", "embedding, blocks.0"), report
    assert "gradients=False)" in report and "on cpu" in report, report


# -- planted bugs, each named where the model first departs ----------------------------------------

@pytest.mark.parametrize("bug, first, before", [
    (dict(eps_at=2), "blocks.2", "blocks.0-1"),                      # eps 1e-5 for 1e-6 in block 2's norms
    (dict(no_residual_at=1), "blocks.1", "blocks.0"),                # block 1 without its skip connection
    (dict(head_transposed=True), "logits", "blocks.0-3"),            # the head's weight transposed
    (dict(theta=500000.0), "blocks.0", "nothing (it is the first compared)"),   # RoPE's theta wrong
])
def test_a_planted_bug_is_named_at_its_layer(bug, first, before):
    report = failing("llama", torch_llama(SQUARE, **bug), config=SQUARE)
    assert departs(report) == (first, before), report
    assert "(torch, autograd's backward, on cpu; the reference on the cpu)" in report
    assert f"first at {first}" in report


def test_a_wrong_gradient_is_named_by_its_parameter():
    forward, backward = numpy_model("llama", SQUARE)

    def wrong_backward(dlogits, cache):
        dparams = backward(dlogits, cache)
        dparams["blocks"]["1"]["attn"]["o"]["w"] = 2 * dparams["blocks"]["1"]["attn"]["o"]["w"]
        return dparams

    report = failing("llama", forward, wrong_backward, config=SQUARE)
    assert departs(report) == ("dblocks.1.attn.o.w", "blocks.0-3, logits, 14 gradients (dwte .. "
                                                     "dblocks.1.attn.v.w)"), report
    assert "depart after it too" not in report                      # that gradient alone is wrong


def test_without_hidden_states_the_logits_depart_and_the_report_says_how_to_find_the_block():
    def forward(ids, params):
        return torch_llama(SQUARE, eps_at=2)(ids, params)[0]

    report = failing("llama", forward, config=SQUARE)
    assert departs(report) == ("logits", "nothing (it is the first compared)"), report
    assert "return (logits, hidden_states) to find the block" in report


def test_an_unused_parameter_is_named():
    def forward(ids, params):
        return tw_llama.llama(ids, {**params, "norm": {"w": params["norm"]["w"].detach()}}, SQUARE)

    report = failing("llama", forward, config=SQUARE)
    assert departs(report)[0] == "dnorm.w", report
    assert "dnorm.w: no gradient reached it" in report


def test_a_forward_that_raises_is_reported():
    def forward(ids, params):
        raise RuntimeError("not yet")

    report = failing("llama", forward, framework="numpy")
    assert "failed: forward raised RuntimeError: not yet" in report


def test_the_report_is_the_same_for_the_same_seed_and_ids_given_are_used():
    forward = torch_llama(SQUARE, eps_at=1)
    ids = np.array([[1, 2, 3]])
    first = failing("llama", forward, config=SQUARE, ids=ids, seed=5)
    assert first == failing("llama", forward, config=SQUARE, ids=ids, seed=5)
    assert "ids (1, 3)" in first and "seed 5" in first


# -- bad usage ------------------------------------------------------------------------------------

def llama_params(**changes):
    params = families()["llama"].init_params(LlamaConfig(), np.random.default_rng(0), np.float64)
    for path, value in changes.items():
        node = params
        *keys, last = path.split(".")
        for key in keys:
            node = node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return params


def twin(ids, params):
    return tw_llama.llama(ids, params, LlamaConfig())


@pytest.mark.parametrize("kw, error, message", [
    (dict(family="lama"), ValueError, "unknown family 'lama': check_model knows deepseek_v3"),
    (dict(config=GPTConfig()), TypeError, "config must be a LlamaConfig for llama, got GPTConfig"),
    (dict(params=llama_params(**{"blocks.1.attn.q": None})), ValueError,
     "params has no 'blocks.1.attn.q.w', which a llama model of this config has (shape (32, 32))"),
    (dict(params=llama_params(**{"blocks.0.attn.q.w": np.zeros((32, 16))})), ValueError,
     "params['blocks.0.attn.q.w'] has shape (32, 16); a llama model of this config needs (32, 32)"),
    (dict(params=llama_params(extra=np.zeros(3))), ValueError,
     "params has 'extra', which a llama model of this config has not"),
    (dict(params=llama_params(**{"norm.w": [1.0] * 32})), TypeError, "params['norm.w'] must be a float array"),
    (dict(forward=lambda ids, params: twin(ids, params)[:, :, :10]), ValueError,
     "the forward returned logits of shape (2, 8, 10), expected (2, 8, 64)"),
    (dict(forward=lambda ids, params: (twin(ids, params), [])), ValueError,
     "hidden_states must be a list of one per block (2), or of 3 as transformers' output_hidden_states, "
     "got list of 0 items"),
    (dict(forward=lambda ids, params: (twin(ids, params), [params["wte"][ids][:, :4]] * 2)), ValueError,
     "the forward returned hidden_states[0] (blocks.0) of shape (2, 4, 32), expected (2, 8, 32)"),
    (dict(forward=numpy_model("llama", LlamaConfig(), states=False)[0], backward=None), ValueError,
     "got DecoderCache of 7 items (a NumPy forward that returns its cache last needs its backward)"),
    (dict(backward=llama_backward, forward=lambda ids, params: llama_forward(ids, params, LlamaConfig())[0]),
     ValueError, "a NumPy forward with a backward must return (logits, cache) or (logits, hidden_states, cache), "
                 "got ndarray"),
    (dict(seed=-1), ValueError, "seed must be a non-negative integer or None, got -1"),
    (dict(gradients=False, backward=llama_backward, forward=numpy_model("llama", LlamaConfig())[0]), TypeError,
     "gradients=False compares no gradients: pass no backward"),
    (dict(gradients="no"), TypeError, "gradients must be True or False, got 'no'"),
    (dict(ids=np.zeros(4, int)), ValueError, "ids must be integer token ids of shape (B, T), got int64 (4,)"),
    (dict(config=GPTConfig(dropout=0.1), family="gpt2"), ValueError, "config.dropout must be 0"),
])
def test_bad_usage_is_refused_naming_it(kw, error, message):
    kw = {"family": "llama", "forward": twin, "backward": None, **kw}
    with pytest.raises(error) as info:
        check_model(kw.pop("family"), kw.pop("forward"), kw.pop("backward"), **kw)
    head, _, tail = message.partition(" ... ")
    assert head in str(info.value) and tail in str(info.value), str(info.value)


# -- numpy-attn check --model ----------------------------------------------------------------------

MODEL = """
import numpy as np
{config}
from numpy_attn.llama import llama_backward, llama_forward


def forward(ids, params):
    logits, cache = llama_forward(ids, params, CONFIG)
    hidden = list(cache.hidden[1:])
    if {bug} >= 0:                                       # planted: block {bug}'s output off by 0.1%
        hidden[{bug}] = hidden[{bug}] * 1.001
    return logits, hidden, cache


def backward(dlogits, cache):
    return llama_backward(dlogits, cache)
"""
RANDOM = "from numpy_attn.llama import LlamaConfig\nCONFIG = LlamaConfig()"
FOLDER = "from attn_cli.hf import load_checkpoint\n_, CONFIG, _ = load_checkpoint({folder!r}, np.float64)"


def run_model(tmp_path, *argv, config=RANDOM, bug=-1):
    """(exit status, stdout, stderr) of numpy-attn check on a file of a llama model."""
    (tmp_path / "model.py").write_text(MODEL.format(config=config, bug=bug))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(["check", *[a.replace("DIR", str(tmp_path)) for a in argv]])
        except SystemExit as exit_info:
            status = exit_info.code
    return status, out.getvalue(), err.getvalue()


def test_the_command_checks_a_model_and_names_the_layer_that_departs(tmp_path):
    status, out, err = run_model(tmp_path, "DIR/model.py:forward", "--model", "llama", "--backward", "backward")
    assert (status, err) == (0, ""), err
    assert out == (f"llama: {tmp_path}/model.py:forward with backward agrees with numpy_attn's layer by layer on "
                   "a random llama model (float64, seed 0)\n")
    status, out, err = run_model(tmp_path, "DIR/model.py:forward", "--model", "llama", "--backward", "backward",
                                 bug=1)
    assert (status, err) == (1, ""), err
    assert departs(out) == ("blocks.1", "blocks.0"), out


def test_the_command_checks_a_model_on_a_hugging_face_folder(tmp_path):
    folder = tmp_path / "hf"
    save(hf_llama_model({"rope_type": "default", "rope_theta": 10000.0}, tie=False, bias=False, dtype=np.float32),
         folder)
    config = FOLDER.format(folder=str(folder))
    status, out, err = run_model(tmp_path, "DIR/model.py:forward", "--hf", str(folder), "--backward", "backward",
                                 config=config)
    assert (status, err) == (0, ""), err
    assert out.startswith(f"llama: {tmp_path}/model.py:forward with backward agrees") and str(folder) in out, out
    status, out, err = run_model(tmp_path, "DIR/model.py:forward", "--hf", str(folder), "--model", "llama",
                                 "--backward", "backward", config=config, bug=0)
    assert status == 1 and departs(out) == ("blocks.0", "nothing (it is the first compared)"), out
    status, out, err = run_model(tmp_path, "DIR/model.py:forward", "--hf", str(folder), "--model", "gpt2",
                                 config=config)
    assert status == 2 and f"{folder} holds a llama model, not --model gpt2" in err, err


@pytest.mark.parametrize("argv, message", [
    (["--model", "lama"], "--model 'lama' is not a family numpy_attn has: deepseek_v3"),
    (["--model", "llama", "--op", "softmax"], "give --op (an operation) or --model (a whole model), not both"),
    (["--model", "llama", "--dtype", "float32"], "--dtype apply to --op: a model is checked once, in float64"),
    (["--model", "llama", "--examples", "5", "--option", "a=1"], "--examples, --option apply to --op"),
    (["--model", "llama", "--backward", "nothing"], "model.py has no function 'nothing' (it defines backward, "
                                                     "forward)"),
    (["--hf", "DIR/none"], "none"),
])
def test_bad_model_usage_exits_2_naming_it(tmp_path, argv, message):
    status, out, err = run_model(tmp_path, "DIR/model.py:forward", *argv)
    assert status == 2 and out == "" and message in err, err


# -- docs/testing.md's section ---------------------------------------------------------------------

SECTION = (Path(numpy_attn.__file__).resolve().parent.parent / "docs" / "testing.md").read_text(
    encoding="utf-8").split("\n## Checking a whole model", 1)[1]
NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"


def test_the_pages_model_example_runs_and_its_report_is_the_pages(tmp_path):
    """The section's example, run as a script: its own llama agrees, and the one with block 2's eps
    wrong raises the report the page shows, line for line, its figures within 1e-4 (they are printed
    to 6 and 3 digits)."""
    blocks = re.findall(r"```python\n(.*?)```", SECTION, flags=re.S)
    assert len(blocks) == 1
    (tmp_path / "mine.py").write_text(blocks[0], encoding="utf-8")
    result = subprocess.run([sys.executable, "mine.py"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 1 and result.stdout == "my llama agrees with numpy_attn's\n", result
    report = result.stderr.partition("numpy_attn.testing.CheckFailure: ")[2].rstrip("\n").splitlines()
    shown = SECTION.split("raises `CheckFailure`:\n\n```text\n", 1)[1].split("```", 1)[0].rstrip("\n").splitlines()
    assert len(report) == len(shown), report
    for got, want in zip(report, shown, strict=True):
        assert re.sub(NUMBER, "#", got) == re.sub(NUMBER, "#", want), (got, want)
        np.testing.assert_allclose([float(n) for n in re.findall(NUMBER, got)],
                                   [float(n) for n in re.findall(NUMBER, want)], rtol=1e-4, err_msg=got)
    assert departs("\n".join(shown)) == ("blocks.2", "blocks.0-1")
