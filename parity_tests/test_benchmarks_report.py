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


def test_plot_together_puts_the_layers_on_one_panel_and_the_decode_steps_on_another():
    """Prefill ops share the T panel; decode_step_* ops, one token over S held, the S panel; each
    line is one (op, implementation, device, mode) with its medians in T order."""
    rows = [_row(op, impl, t, mode=mode, T=T) for op, impl, mode, points in [
        ("attention_causal", "numpy", "fwd", {256: 0.01, 1024: 0.2}),
        ("delta_rule", "numpy", "fwd", {256: 0.1, 1024: 0.4}),
        ("delta_rule", "numpy", "fwd+bwd", {256: 0.3}),
        ("decode_step_attention", "builtin", "fwd", {256: 1e-4, 16384: 1e-2}),
        ("decode_step_delta_rule", "numpy", "fwd", {256: 2e-3, 16384: 2e-3})] for T, t in points.items()]
    panels = report.time_lines(_results(rows, []))
    assert panels == {
        "sequence length T (= S)": {
            ("attention_causal", "numpy", "cpu", "fwd"): [(256, 0.01), (1024, 0.2)],
            ("delta_rule", "numpy", "cpu", "fwd"): [(256, 0.1), (1024, 0.4)],
            ("delta_rule", "numpy", "cpu", "fwd+bwd"): [(256, 0.3)]},
        "tokens held S (one decode step)": {
            ("decode_step_attention", "builtin", "cpu", "fwd"): [(256, 1e-4), (16384, 1e-2)],
            ("decode_step_delta_rule", "numpy", "cpu", "fwd"): [(256, 2e-3), (16384, 2e-3)]}}


def test_two_lines_cross_where_their_log_log_segments_meet():
    """T^2 from 1 ms and T from 10 ms at T = 256 meet at 10x the T (2560, 100 ms) on the log-log
    plot; lines that never change order, or share fewer than two T, do not cross."""
    quadratic = [(256, 1e-3), (1024, 16e-3), (4096, 256e-3)]
    linear = [(256, 10e-3), (1024, 40e-3), (4096, 160e-3)]
    [(T, t)] = report.crossings(quadratic, linear)
    assert T == pytest.approx(2560) and t == pytest.approx(0.1)
    assert report.crossings(linear, quadratic) == [(pytest.approx(2560), pytest.approx(0.1))]
    assert report.crossings(quadratic, [(T, 10 * t) for T, t in quadratic]) == []
    assert report.crossings(quadratic, [(256, 10e-3), (16384, 1.0)]) == []


def test_plot_together_draws_from_a_saved_run_and_needs_plot(tmp_path, capsys):
    """--from-json with --plot --plot-together writes one PNG of two panels side by side (wider
    than tall); --plot-together alone is refused, naming --plot."""
    rows = [_row("attention_causal", "numpy", 1e-3 * (T / 256) ** 2, T=T) for T in (256, 1024, 4096)]
    rows += [_row("delta_rule", "numpy", 1e-2 * T / 256, T=T) for T in (256, 1024, 4096)]
    rows += [_row("decode_step_delta_rule", "numpy", 2e-3, T=T) for T in (256, 4096)]
    results = dict(_results(rows, [_peak("numpy", 100.0)]), workers=[], machine=dict(cpu="test CPU"),
                   config=dict(ops=["attention_causal", "delta_rule", "decode_step_delta_rule"], threads=1,
                               dtype="float32", batch=1, heads=4, head_size=64))
    png = tmp_path / "together.png"
    report.write_plot(results, png, together=True)
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(png).shape
    assert png.read_bytes().startswith(b"\x89PNG") and width > 1.8 * height
    with pytest.raises(SystemExit):
        cli.main(["--from-json", str(tmp_path / "none.json"), "--plot-together"])
    assert "--plot-together says how --plot draws: give --plot FILE.png" in capsys.readouterr().err


def test_dense_max_seq_len_leaves_out_the_score_holding_rows_past_it_naming_their_bytes(monkeypatch):
    """attention_causal (a (B, nh, T, S) array) stops at --dense-max-seq-len; the delta rule and
    the flash kernel go on; each row left out names its T, the bound and its score array's bytes;
    the memory check sizes the score array at the bound, not at the longest T."""
    from benchmarks import registry
    from benchmarks.registry import Size

    args = cli.build_parser().parse_args(["--ops", "attention_causal", "delta_rule", "flash_attention_causal",
                                          "--seq-lens", "256", "16384", "--dense-max-seq-len", "4096",
                                          "--batch", "1", "--heads", "4"])
    targets = [("numpy", "cpu"), ("builtin", "cpu")]
    runnable = dict.fromkeys(["attention_causal", "delta_rule", "flash_attention_causal"], targets)
    sizes = {T: Size(B=1, nh=4, T=T, hs=64) for T in (256, 16384)}
    cases, skipped = cli._cases(runnable, sizes, args)
    assert set(cases) == {(op, T) for op in runnable for T in (256, 16384)} - {("attention_causal", 16384)}
    assert [(r["op"], r["impl"], r["T"], r["status"]) for r in skipped] == [
        ("attention_causal", "numpy", 16384, "not available"), ("attention_causal", "builtin", 16384, "not available")]
    assert skipped[0]["reason"] == ("T = 16384 is past --dense-max-seq-len 4096: one (B, nh, T, S) score array "
                                    "is 4,294,967,296 bytes (4.0 GiB)")            # 4 x 16384^2 x 4 bytes
    ops = registry.select(["attention_causal"])
    monkeypatch.setattr(cli, "memory_limits", lambda: {"the memory left under this cgroup's limit": 2**30})
    cli.check_scores_fit(ops, args)                                    # 4096: 256 MiB of 1 GiB
    with pytest.raises(ValueError, match="--seq-lens 16384 x 16384"):
        cli.check_scores_fit(ops, cli.build_parser().parse_args(["--seq-lens", "256", "16384", "--heads", "4",
                                                                 "--batch", "1"]))
