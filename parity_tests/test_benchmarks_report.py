"""What ``python -m benchmarks`` prints can be trusted: no share of a peak above 100%, a result
file that names its machine, the load it ran under, ratios that say which way is faster, and
progress on a terminal only. Built from made-up results, nothing here times anything.
"""

import csv
import io
import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks import cli, machine, measure, report

ROOT = Path(__file__).resolve().parents[1]


def _row(op, impl, median, flops=2e9, mode="fwd", T=64, rounds=None, **more):
    """A timed row of ``median`` seconds for ``flops`` FLOPs."""
    time_s = dict(median=median, q25=median, q75=median, min=median, max=median, samples=3, number=1)
    if rounds:
        time_s["rounds"] = rounds
    return dict(dict(op=op, mode=mode, T=T, impl=impl, device="cpu", revision=None, status="ok", reason=None,
                     time_s=time_s, flops=flops, gflops=flops / median / 1e9, peak_mem_bytes=None,
                     numpy_over_this=None, parity=None), **more)


def _peak(library, gflops, dtype="float32"):
    """A peak record as the worker writes it: the fastest of its shapes."""
    shape = [4, 64, 16, 64]
    return dict(library=library, device="cpu", dtype=dtype, n=64, gflops=gflops, shape=shape,
                shapes=[dict(shape=shape, gflops=gflops, time_s={})])


def _results(rows, peaks):
    return dict(rows=rows, peaks=peaks, config=dict(ops=sorted({r["op"] for r in rows})))


def _shares(lines):
    """The '% peak' column of the table's lines: {(op, impl): text}."""
    titles = re.split(r"\s{2,}", lines[0].strip())
    column = titles.index("% peak")
    shares = {}
    for line in lines[1:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        shares[cells[0], cells[3]] = cells[column]
    return shares


def test_a_row_faster_than_the_peak_gets_no_share_above_100(tmp_path):
    """A row at 182 GFLOP/s against a 141 GFLOP/s peak (the user's case) prints 'over' and a line
    saying the peak is wrong, never 129; a row below it prints its share; the CSV leaves it empty."""
    results = _results([_row("flash_attention", "numpy", 1.0, flops=182e9),
                        _row("flash_attention", "builtin", 2.0, flops=141e9)],
                       [_peak("numpy", 141.0), _peak("torch", 65.3)])
    lines = report.table_lines(results)
    shares = _shares(lines)
    assert shares == {("flash_attention", "numpy"): "over", ("flash_attention", "builtin"): "50"}
    over = [line for line in lines if line.startswith("% peak 'over'")]
    assert len(over) == 1 and "flash_attention fwd T=64 numpy" in over[0] and "peak is wrong" in over[0]
    for text in shares.values():
        assert text == "over" or float(text) <= 100
    results["workers"] = []
    report.write_csv(results, tmp_path / "run.csv")
    with open(tmp_path / "run.csv", newline="") as f:
        fractions = [row["peak_fraction"] for row in csv.DictReader(f)]
    assert fractions == ["", "0.5"]


def test_the_peak_is_the_fastest_matmul_of_either_library_on_the_device():
    """torch's 65.3 GFLOP/s below NumPy's 156 on one CPU: both libraries' rows are measured
    against 156, the machine's; a float16 torch peak is not mixed with a float32 one."""
    rows = [_row("attention", "numpy", 1.0, flops=100e9), _row("attention", "builtin", 1.0, flops=100e9)]
    shares = _shares(report.table_lines(_results(rows, [_peak("numpy", 156.0), _peak("torch", 65.3)])))
    assert shares == {("attention", "numpy"): "64", ("attention", "builtin"): "64"}
    shares = _shares(report.table_lines(_results(rows, [_peak("numpy", 156.0), _peak("torch", 65.3, "float16")])))
    assert shares == {("attention", "numpy"): "64", ("attention", "builtin"): "over"}
    header = report.peak_lines([_peak("numpy", 156.0), _peak("torch", 65.3)])
    assert header[-1].endswith("cpu float32 156.0 GFLOP/s (numpy)")


def test_an_older_runs_peak_is_rederived_from_its_fastest_sample():
    """Runs before the shapes kept a square matmul's median: its fastest sample is the ceiling."""
    old = dict(library="numpy", device="cpu", dtype="float32", n=1000, gflops=100.0,
               time_s=dict(median=0.02, min=0.01))
    assert report.peak_lines([old])[0] == ("matmul peak numpy cpu: 100.0 GFLOP/s (1000x1000 float32, median; "
                                           "200.0 in its fastest sample)")
    assert report.peak_share(_row("attention", "numpy", 1.0, flops=100e9), [old]) == 0.5


def test_the_peak_times_the_matmul_shapes_of_the_run():
    """The square, then attention's two matmuls per head and the projections, at every T; none
    with an operand above GEMM_ELEMENTS, batches of heads cut to fit."""
    shapes = measure.gemm_shapes(dict(B=4, nh=8, hs=64), [128, 8192], 2048)
    assert shapes[0] == (1, 2048, 2048, 2048)
    assert (32, 128, 64, 128) in shapes and (32, 128, 128, 64) in shapes
    assert (1, 512, 512, 512) in shapes and (1, 512, 512, 2048) in shapes
    assert (1, 8192 * 4, 512, 512) in shapes and not any(s[1:] == (8192, 64, 8192) for s in shapes)
    assert all(max(m * k, k * n, m * n) <= measure.GEMM_ELEMENTS for _, m, k, n in shapes[1:])
    assert len(shapes) == len(set(shapes))
    peak = measure.matmul_peak("numpy", [(1, 16, 16, 16), (2, 8, 4, 8)], measure.np.dtype("float32"),
                               "cpu", 2, 0.0, 1)
    assert [s["shape"] for s in peak["shapes"]] == [[1, 16, 16, 16], [2, 8, 4, 8]]
    assert peak["gflops"] == max(s["gflops"] for s in peak["shapes"])
    best = next(s for s in peak["shapes"] if s["gflops"] == peak["gflops"])
    assert peak["shape"] == best["shape"]
    batch, m, k, n = best["shape"]
    assert peak["gflops"] == 2 * batch * m * k * n / best["time_s"]["min"] / 1e9


# -- the machine a result file names ----------------------------------------------------------

def _committed(name):
    return json.loads((ROOT / "benchmarks" / "results" / name).read_text())


def _drop_cpu(r):
    del r["machine"]["cpu"]


def _drop_vector_extensions(r):
    r["machine"]["vector_extensions"] = None
    for w in r["workers"]:
        w.pop("numpy_simd", None)
        w.pop("torch_cpu_capability", None)


def _drop_blas(r):
    for w in r["workers"]:
        w["threadpools"] = [p for p in w["threadpools"] if p["user_api"] != "blas"]


def _drop_threads(r):
    del r["config"]["threads"]


def _drop_load(r):
    del r["load_average"]


DROPS = {"CPU": _drop_cpu, "vector extensions": _drop_vector_extensions, "BLAS kernel": _drop_blas,
         "thread count": _drop_threads, "load": _drop_load}


@pytest.mark.parametrize("name", ["cpu-avx2.json", "cpu-decode-mla.json"])
@pytest.mark.parametrize("fact", DROPS)
def test_from_json_refuses_a_file_without_its_machine_naming_what_is_missing(tmp_path, capsys, name, fact):
    """An op sweep or a decode run without one part of its machine description: exit 2, one
    line naming the part; writing such results is refused too, and leaves no file."""
    results = _committed(name)
    assert report.missing_machine_facts(results) == []
    DROPS[fact](results)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(results))
    assert cli.main(["--from-json", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"does not name the machine it ran on: no {fact} " in err[0], err
    with pytest.raises(ValueError, match=f"machine's {fact}:"):
        report.write_json(results, tmp_path / "again.json")
    assert not (tmp_path / "again.json").exists()


def test_the_former_flash_kernel_files_and_breakdowns_name_theirs():
    former, breakdown = _committed("cpu-avx2-flash-kernel.json"), _committed("cpu-avx2-flash-breakdown.json")
    assert report.missing_machine_facts(former) == report.missing_machine_facts(breakdown) == []
    del former["environment"]["threads"]
    breakdown["load"] = []
    assert report.missing_machine_facts(former) == ["thread count"]
    assert report.missing_machine_facts(breakdown) == ["load"]


# -- load ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("before, during, after, others", [
    (0.4, [], 0.4, 0.2),                  # before the run, nobody else's
    (0.2, [3.0], 2.6, 0.5),               # this run's 2 threads and one more: 0.5 per CPU, no warning
    (0.2, [3.2, 2.0], 2.0, 0.6),          # during it, 1.2 threads of others on 2 CPUs
    (1.3, [2.0], 2.0, 0.65),              # before it
    (0.0, [], 3.4, 0.7),                  # after it (the minute's average still holds the run)
    (None, [], None, None),               # an OS without a load average: nothing to say
])
def test_the_load_of_other_processes_above_half_a_cpu_each_warns(before, during, after, others):
    load = machine.load_report(before, during, after, threads=2, cpus=2)
    assert load["others_per_cpu"] == others and load["threshold"] == 0.5
    assert (load["warning"] is not None) == (others is not None and others > 0.5)
    if load["warning"]:
        assert all(what in load["warning"] for what in ("--interleave", "fewer --threads", "quiet machine"))


MINI = ["--quick", "--ops", "softmax", "--impls", "numpy", "--modes", "fwd", "--seq-lens", "8", "--batch", "1",
        "--heads", "1", "--head-size", "4", "--repeats", "1", "--min-time", "0", "--peak-size", "16"]


def test_a_busy_machine_is_warned_of_once_and_recorded(tmp_path, monkeypatch, capsys):
    """A faked load average, 2.0 before the run, up to 7.0 during it: less this run's one thread,
    3 threads of other processes per CPU of 2. One warning on stderr, the readings and the warning
    in the JSON and in the report's header; and, stderr not being a terminal, no progress line
    (without --no-progress)."""
    readings = iter([2.0, 4.0, 7.0])
    monkeypatch.setattr(machine, "load_average", lambda: next(readings, 4.0))
    monkeypatch.setattr(machine, "LOAD_SAMPLE_S", 0.01)
    monkeypatch.setattr(machine, "USABLE_CPUS", 2)
    path = tmp_path / "run.json"
    assert cli.main(MINI + ["--json", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err.count("warning: the machine was busy") == 1, err
    assert err.strip().splitlines() == [line for line in err.strip().splitlines()
                                        if line.startswith(("python -m benchmarks: warning:", "wrote "))], err
    load = json.loads(path.read_text())["load_average"]
    assert load["before"] == 2.0 and max(load["during"]) == 7.0 and load["after"] == 4.0 and load["threads"] == 1
    assert load["others_per_cpu"] == 3.0 and "--interleave" in load["warning"]
    header = [line for line in out.splitlines() if line.startswith("warning: the machine was busy")]
    assert len(header) == 1 and "load average 2.0 before the run, 4.0-7.0 during it, 4.0 after" in out


# -- ratios say which way is faster ---------------------------------------------------------------

def test_every_ratio_line_says_which_way_is_faster():
    """A causal run 3x slower says 'slower', 2x faster says 'faster'; the np/this table says what
    above and below 1 mean; so do the other runs' ratio columns."""
    rows = [_row("attention", "numpy", 1.0), _row("attention_causal", "numpy", 3.0),
            _row("attention", "builtin", 2.0, numpy_over_this=0.5), _row("attention_causal", "builtin", 1.0,
                                                                         numpy_over_this=3.0)]
    lines = report.table_lines(_results(rows, [_peak("numpy", 100.0), _peak("torch", 100.0)]))
    causal = [line for line in lines if line.startswith("causal speed-up")]
    assert causal == [
        "causal speed-up: attention fwd T=64 numpy cpu: causal 3.00x slower than without the mask "
        "(time without / with 0.33, above 1: causal faster)",
        "causal speed-up: attention fwd T=64 builtin cpu: causal 2.00x faster than without the mask "
        "(time without / with 2.00, above 1: causal faster)"]
    title = next(line for line in lines if line.startswith("np/this by T"))
    assert "above 1: the row is faster than NumPy; below 1: slower" in title
    former = cli.render(_committed("cpu-avx2-flash-kernel.json"))
    assert "kernel/sdpa and new/old are times over times (above 1: the kernel, or the new one, is slower)" in former[-1]
    assert re.match(r"causal forward speed-up over non-causal: causal \d\.\d\dx faster \(non-causal", former[-2])
    decode_hf = cli.render(_committed("cpu-avx512-decode-hf.json"))
    assert any("/transformers: this row's time over transformers' (below 1: faster" in line for line in decode_hf)


# -- progress -----------------------------------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_drawn_on_a_terminal_only(monkeypatch):
    for stream, drawn in ((io.StringIO(), False), (_Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        bar = report.progress_bar(2, no_progress=False)
        bar.step("one")
        bar.step("two")
        assert ("2/2" in stream.getvalue()) == drawn
        assert report.progress_bar(2, no_progress=True).enabled is False
