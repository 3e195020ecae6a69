"""The decode benchmarks: greedy generation with and without a key/value cache gives the same
tokens in both libraries, and ``python -m benchmarks --ops decode`` runs (benchmarks/decode.py);
``--ops decode_sliding`` and ``--ops decode_mla`` (benchmarks/decode_cache.py) run, their tokens
and outputs agree before anything is timed, their bytes are the caches' own, and their report
names the machine; ``--ops decode_hf`` (benchmarks/decode_hf.py) runs a Hugging Face folder in
numpy-attn and transformers, whose ids must agree before anything is timed."""

import contextlib
import io
import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import cli, decode, decode_cache, decode_hf, report
from benchmarks.decode import greedy_numpy, greedy_twin
from benchmarks.machine import machine as this_machine
from numpy_attn.gpt import GPTConfig, init_gpt_params
from numpy_attn.mla import MLAConfig, mla_cache_bytes_per_token
from parity_tests import strategies as S
from parity_tests.helpers import tree_map


@given(seed=st.integers(0, 2**32 - 1), P=S.dim(1, 4), new=S.dim(1, 4), n_kv_head=st.sampled_from([None, 1]))
def test_greedy_generation_with_cache_equals_without(seed, P, new, n_kv_head):
    """float64, so that no argmax can flip on a rounding difference between the paths."""
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_kv_head=n_kv_head, n_embd=8)
    rng = np.random.default_rng(seed)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_gpt_params(config, rng, np.float64))
    prompt = rng.integers(0, config.vocab_size, (1, P))
    cached = greedy_numpy(params, config, prompt, new, cache=True)
    np.testing.assert_array_equal(cached, greedy_numpy(params, config, prompt, new, cache=False),
                                  err_msg="greedy ids, cached vs uncached")
    assert cached.shape == (1, P + new) and np.array_equal(cached[:, :P], prompt), "prompt kept"
    twin = greedy_twin(tree_map(torch.from_numpy, params), config, torch.from_numpy(prompt), new, cache=True)
    np.testing.assert_array_equal(twin.numpy(), cached, err_msg="greedy ids, twin vs numpy")


@pytest.mark.slow
def test_decode_benchmark_runs(tmp_path):
    out = tmp_path / "decode.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = cli.main(["--ops", "decode", "--quick", "--seq-lens", "3", "--repeats", "1",
                           "--min-time", "0", "--no-progress", "--json", str(out)])
    assert status == 0, stdout.getvalue()
    results = json.loads(out.read_text())
    assert report.missing_machine_facts(results) == []             # --from-json reads it again
    rows = results["rows"]
    assert [(r["impl"], r["P"]) for r in rows] == [("numpy", 3), ("twin", 3)], rows
    assert all(r["same_tokens"] and r["cached_tokens_per_s"] > 0 for r in rows), rows
    assert "cached/uncached" in stdout.getvalue()


# -- decode_sliding and decode_mla (benchmarks/decode_cache.py) ----------------------------------

def _run_decode(tmp_path, name, *extra):
    """``--ops name --quick`` in-process, one round: (exit status, stdout, the saved results)."""
    out = tmp_path / f"{name}.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = cli.main(["--ops", name, "--quick", "--repeats", "1", "--no-progress", "--json", str(out), *extra])
    return status, stdout.getvalue(), json.loads(out.read_text()) if out.exists() else None


def _assert_names_the_machine(stdout, results):
    """The report's header: the CPU, its vector extensions, each worker's BLAS kernel and threads."""
    machine = this_machine()
    assert results["machine"] == machine, results["machine"]
    assert f"machine: {machine['cpu']}" in stdout and "vector extensions: " + " ".join(machine["vector_extensions"]) \
        in stdout, stdout
    assert "numpy cpu (CPUs" in stdout and "BLAS openblas" in stdout and "torch.get_num_threads() = 1" in stdout, stdout
    assert "threads: 1 per timed process" in stdout, stdout


@pytest.mark.slow
def test_decode_sliding_quick_rows_agree_and_count_the_caches_bytes(tmp_path, monkeypatch):
    """Both libraries, both caches: the same tokens, and each cache's bytes as its layers hold
    them: a global layer every token, a sliding layer (layers 0, 2, ...) its last W only. The
    parent prefills 5 tokens a forward, the workers (other processes) all 3W - 1 at once: their
    tokens must still agree."""
    monkeypatch.setattr(decode_cache, "PREFILL_CHUNK", 5)
    status, stdout, results = _run_decode(tmp_path, "decode_sliding")
    assert status == 0, stdout
    rows = results["rows"]
    assert sorted((r["impl"], r["cache"]) for r in rows) == [("numpy", "bounded"), ("numpy", "full"),
                                                             ("twin", "bounded"), ("twin", "full")], rows
    model = decode_cache.SLIDING["quick"]["model"]
    (W,) = decode_cache.SLIDING["quick"]["windows"]
    assert all(r["same_tokens"] and r["tokens"] == rows[0]["tokens"] and len(r["tokens"]) == W for r in rows), rows
    assert all(r["window"] == W and r["context"] == 4 * W and r["tokens_per_s"] > 0 for r in rows), rows
    # One token of one layer: a key and a value of n_kv_head heads of head_dim float32 numbers.
    layer = 2 * model["n_kv_head"] * model["head_dim"] * 4
    n_sliding = (model["n_layer"] + 1) // 2
    n_global = model["n_layer"] - n_sliding
    seen = 4 * W - 1                               # the last new token is never fed back
    expected = {"bounded": dict(bytes_per_token=n_global * layer, bytes_held=(n_global * seen + n_sliding * W) * layer,
                                nbytes=(n_global * 4 * W + n_sliding * W) * layer),
                "full": dict(bytes_per_token=model["n_layer"] * layer, bytes_held=model["n_layer"] * seen * layer,
                             nbytes=model["n_layer"] * 4 * W * layer)}
    for r in rows:
        assert {k: r[k] for k in expected[r["cache"]]} == expected[r["cache"]], r
    assert expected["bounded"]["bytes_held"] < expected["full"]["bytes_held"]
    _assert_names_the_machine(stdout, results)


@pytest.mark.slow
def test_decode_mla_quick_rows_count_each_caches_bytes(tmp_path):
    """Every variant at both contexts in both libraries; bytes per token as the caches hold them
    (and as mla_cache_bytes_per_token says), absorbed below naive."""
    status, stdout, results = _run_decode(tmp_path, "decode_mla")
    assert status == 0, stdout
    size = decode_cache.MLA["quick"]
    m, nkv = size["model"], size["n_kv_head"]
    rows = results["rows"]
    assert sorted((r["S"], r["variant"], r["impl"]) for r in rows) == sorted(
        (S, v, impl) for S in size["contexts"] for v in decode_cache.MLA_VARIANTS for impl in ("numpy", "twin")), rows
    dn, dr, dv = m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"]
    per_token = {"mla_absorbed": (m["kv_lora_rank"] + dr) * 4, "mla_naive": m["n_head"] * (dn + dr + dv) * 4,
                 "gqa": 2 * nkv * dv * 4, "mha": 2 * m["n_head"] * dv * 4}
    formula = mla_cache_bytes_per_token(MLAConfig(**m), np.float32, n_kv_head=nkv)
    for r in rows:
        assert r["bytes_per_token"] == per_token[r["variant"]] == formula[r["variant"]], r
        assert r["cache_bytes"] == r["bytes_per_token"] * r["S"] and r["tokens_per_s"] > 0, r
    assert per_token["mla_absorbed"] < per_token["mla_naive"]
    _assert_names_the_machine(stdout, results)


def test_decode_sliding_different_tokens_stop_before_timing(tmp_path, monkeypatch, capsys):
    """A twin that generated other tokens: exit status 1, no worker started, no file written."""
    def other_tokens(*args):
        ids = decode.greedy_torch(*args)
        ids[0, -1] = (ids[0, -1] + 1) % decode_cache.SLIDING["quick"]["model"]["vocab_size"]
        return ids

    def no_worker(*args, **kwargs):
        raise AssertionError("a timing worker was started")

    monkeypatch.setattr(decode_cache, "greedy_torch", other_tokens)
    monkeypatch.setattr(decode_cache, "Worker", no_worker)
    status, _, results = _run_decode(tmp_path, "decode_sliding")
    assert status == 1 and results is None
    assert "the generated tokens differ, nothing was timed" in capsys.readouterr().err


def test_decode_mla_twin_off_by_one_percent_stops_before_timing(tmp_path, monkeypatch, capsys):
    import torch_attn.mla

    absorbed = torch_attn.mla.mla_absorbed
    monkeypatch.setattr(torch_attn.mla, "mla_absorbed", lambda *args: absorbed(*args) * 1.01)
    monkeypatch.setattr(decode_cache, "Worker", None)          # calling it would raise
    status, _, results = _run_decode(tmp_path, "decode_mla")
    assert status == 1 and results is None
    assert "mla_absorbed: twin vs numpy, relative error" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--ops", "decode_sliding", "softmax"], "--ops decode_sliding runs alone"),
    (["--ops", "decode_mla", "decode"], "--ops decode runs alone"),
    (["--ops", "decode_mla", "--interleave", "3"], "--ops decode_mla takes neither"),
    (["--ops", "decode_hf"], "--ops decode_hf needs --hf DIR"),
    (["--ops", "decode", "--hf", "gpt2"], "--hf DIR goes with --ops decode_hf"),
    (["--ops", "decode_hf", "--hf", "gpt2", "--dtype", "float64"], "in float32 in both libraries, not --dtype float64"),
    (["--ops", "decode_hf", "--hf", "/nonexistent-folder"], "/nonexistent-folder has no model.safetensors"),
])
def test_decode_runs_refuse_company_in_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_list_names_the_decode_runs(capsys):
    assert cli.main(["--list"]) == 0
    listed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert listed[-4:] == ["decode", "decode_sliding", "decode_mla", "decode_hf"], listed


# -- decode_hf (benchmarks/decode_hf.py) -------------------------------------------------------------

def _tiny_gpt2_folder(folder):
    """A random GPT-2 of width 16, two layers, context 32, saved as save_pretrained writes it (offline)."""
    transformers = pytest.importorskip("transformers", reason="--ops decode_hf times transformers' generate")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.mark.slow
def test_decode_hf_quick_rows_of_a_tiny_gpt2_folder(tmp_path):
    """Both libraries at two prompt lengths (40 clipped to the context 32 less 6 new tokens): the
    same ids, positive times, per token and tokens/s one the inverse of the other, each process's
    peak RSS beside the checkpoint's bytes, and the machine named."""
    folder = _tiny_gpt2_folder(tmp_path / "gpt2")
    status, stdout, results = _run_decode(tmp_path, "decode_hf", "--hf", str(folder), "--seq-lens", "5", "40")
    assert status == 0, stdout
    rows = results["rows"]
    assert [(r["impl"], r["P"]) for r in rows] == [("numpy-attn", 5), ("transformers", 5),
                                                   ("numpy-attn", 26), ("transformers", 26)], rows
    n1, n2 = decode_hf.QUICK["new_tokens"]
    size = (folder / "model.safetensors").stat().st_size
    for r in rows:
        assert r["same_ids"] and r["new_tokens"] == [n1, n2], r
        assert r["ms_per_token"] > 0 and r["prefill_s"] > 0 and r["peak_rss_bytes"] > size, r
        assert r["tokens_per_s"] == pytest.approx(1e3 / r["ms_per_token"]), r
        assert r["checkpoint_bytes"] == size and r["peak_rss_over_checkpoint"] == r["peak_rss_bytes"] / size, r
        assert [len(r["time_s"][str(new)]) for new in (1, n1, n2)] == [1, 1, 1], r   # --repeats 1: one round
    assert all(r["per_token_over_transformers"]["median"] == 1.0 for r in rows if r["impl"] == "transformers"), rows
    model = results["config"]["model"]
    assert (model["family"], model["vocab_size"], model["block_size"]) == ("gpt2", 97, 32), model
    _assert_names_the_machine(stdout.replace("numpy-attn", "numpy cpu", 0), results)
    assert "numpy-attn" in stdout and "transformers" in stdout and "ms/token" in stdout, stdout


class _FakeWorker:
    """A timing worker in this process for decode_hf's parent: transformers generates other ids
    than numpy-attn; a request to time anything fails the test."""

    def __init__(self, job, pythonpath=None, label=None):
        self.label, self.records = label, [dict(kind="env", library=job["library"], device="cpu"),
                                           dict(kind="model", family="gpt2", vocab_size=9, block_size=16)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def read(self):
        return self.records.pop(0)

    def ask(self, request):
        assert request.get("check"), f"{self.label} was asked to time {request}"
        token = 1 if self.label == "numpy-attn" else 2
        return dict(kind="sample", seconds=0.0, ids=request["ids"] + [token] * request["new"], peak_rss_bytes=1)


def test_decode_hf_different_ids_stop_before_timing(tmp_path, monkeypatch, capsys):
    """Ids that differ: exit status 1, nothing timed, no file written."""
    folder = _tiny_gpt2_folder(tmp_path / "gpt2")
    monkeypatch.setattr(decode_hf, "Worker", _FakeWorker)
    status, _, results = _run_decode(tmp_path, "decode_hf", "--hf", str(folder))
    assert status == 1 and results is None
    assert "decode_hf: the generated ids differ, nothing was timed" in capsys.readouterr().err
