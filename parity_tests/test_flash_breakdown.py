"""The flash kernel's measuring tool at a tiny size: ``python -m benchmarks.flash_breakdown``
traces the kernel itself line by line, without changing what it computes, and its floor
comparison times every case. (The before/after comparison against a git revision is
``python -m benchmarks --against``, tested in test_benchmarks.py.)"""

import json
import math
import threading
from pathlib import Path

import pytest

import numpy_attn.kernels.flash_attention as fa
from benchmarks import cli, flash_breakdown

ROOT = Path(flash_breakdown.__file__).resolve().parent.parent


@pytest.fixture
def tiny(monkeypatch):
    """B=1, nh=2, T=96, hs=64: the tool's sizes are module constants."""
    for name, value in (("B", 1), ("NH", 2), ("T", 96)):
        monkeypatch.setattr(flash_breakdown, name, value)


@pytest.mark.parametrize("is_causal", [False, True])
def test_traced_kernel_computes_what_the_kernel_computes(tiny, is_causal):
    res = flash_breakdown.instrumented(is_causal, 32, 64)
    # T=96 in rows of 32 against keys in tiles of 64: 3 x 2 tiles per slice; causal, rows 0-31
    # and 32-63 see one tile of keys and rows 64-95 two.
    tiles_per_slice = 4 if is_causal else 6
    assert res["forward"]["tiles"] == 2 * tiles_per_slice
    assert max(res["max_abs_error_vs_kernel"].values()) < 1e-4
    for part in ("forward", "backward"):
        assert res[part]["total"] >= sum(res[part]["groups"].values())
    # Every line timed is a line of the kernel's file, as it reads there now.
    source = open(fa.__file__).read().splitlines()
    for part in ("forward", "forward_shifted", "backward"):
        for label, runs in res[part]["calls"].items():
            function, rest = label.split(":", 1)
            line, text = rest.split(" ", 1)
            assert source[int(line) - 1].strip() == text and runs >= 1, label
    # The forced fallback runs the running maximum, which the ordinary forward never does.
    assert any("_rows_shifted" in label for label in res["forward_shifted"]["groups"])
    assert not any("_rows_shifted" in label for label in res["forward"]["groups"])


class StepClock:
    """A clock for the tool's ``time``: it moves only when a call says it took some time, so a test
    of what the tool does with times reads no wall clock (which another process's load moves)."""

    def __init__(self):
        self.now = 0.0
        self._lock = threading.Lock()

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        with self._lock:
            self.now += seconds


def test_line_clock_gives_each_line_its_time(monkeypatch):
    """A line that takes time gets it; the caller's line does not get its callee's lines."""
    import types

    clock = StepClock()
    monkeypatch.setattr(flash_breakdown, "time", clock)
    module = types.ModuleType("timed")
    module.__file__ = "<timed>"
    code = ("def inner(time):\n"
            "    time.sleep(5.0)\n"
            "def outer(time):\n"
            "    inner(time)\n"
            "    time.sleep(2.0)\n")
    exec(compile(code, "<timed>", "exec"), module.__dict__)
    line_clock = flash_breakdown.LineClock(module)
    with line_clock.running():
        module.outer(clock)
    seconds = {(f, line): t for (f, line), t in line_clock.seconds.items()}
    assert seconds == {("inner", 2): 5.0, ("outer", 4): 0.0, ("outer", 5): 2.0}, \
        "each line its own time, the call itself none of inner's"
    assert dict(line_clock.count) == {("inner", 2): 1, ("outer", 4): 1, ("outer", 5): 1}


def test_floor_times_every_case_against_sdpa_in_the_same_rounds(tiny):
    res = flash_breakdown.floor(2, 32, 32)
    assert {"F.sdpa forward", "NumPy tiles, 2 matmuls", "kernel forward",
            "F.sdpa forward+backward", "kernel forward+backward"} <= set(res)
    for r in res.values():
        assert len(r["times_s"]) == 2 and min(r["times_s"]) > 0
        assert math.isfinite(r["over_sdpa"]) and r["over_sdpa"] > 0
    assert res["F.sdpa forward"]["over_sdpa"] == 1.0


def test_the_two_thread_floor_spreads_its_slices_as_the_kernel_does(tiny):
    """Two threads each: the kernel's pool of two, on which the bare loops' slices run too, then
    the kernel's thread count given back."""
    seen, started = set(), threading.Barrier(2, timeout=10)

    def body(n):
        seen.add(threading.get_ident())
        started.wait()          # both slices in flight at once, or the barrier times out
    count = fa._cpu_count
    with flash_breakdown.kernel_threads(2):
        assert fa._cpu_count() == 2
        fa._map_slices(body, 2, fa.PARALLEL_MIN_WORK)   # the pool the bare loops run on
    assert len(seen) == 2
    assert fa._cpu_count is count
    res = flash_breakdown.floor(2, 32, 32, threads=2)
    assert {"F.sdpa forward", "NumPy tiles, 2 matmuls + EXP (the floor)", "kernel forward",
            "kernel forward+backward"} <= set(res)
    assert all(len(r["times_s"]) == 2 and math.isfinite(r["over_sdpa"]) for r in res.values())


def test_a_saved_breakdown_prints_again(tiny, tmp_path, capsys):
    """The tool's --json is read back by python -m benchmarks --from-json."""
    path = tmp_path / "breakdown.json"
    assert flash_breakdown.main(["--repeats", "3", "--block", "32", "64", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert json.loads(path.read_text())["instrumented"]["forward"]["tiles"] == 12
    assert cli.main(["--from-json", str(path)]) == 0
    assert capsys.readouterr().out == printed


def test_two_thread_scaling_runs_the_calls_alone_then_on_two_threads_at_once(monkeypatch):
    """Each round runs fn(calls) on this thread, then on two threads that are both inside it at
    once (each waits at a barrier for the other: run one after the other, they would never meet);
    scaling is twice the first time over the second, call_s the first over calls, both medians over
    the rounds. The times come from a clock the calls move themselves, each of the pair by what it
    adds to the pair's time: 2 where the pair takes as long as the call alone (they overlap), 1
    where it takes twice as long (they take turns)."""
    clock = StepClock()
    monkeypatch.setattr(flash_breakdown, "time", clock)
    alone = iter([4.0, 1.0, 2.0])                  # the call on this thread, each round
    # What each of the pair adds, each round: together as long as the call alone (overlapping),
    # twice as long (taking turns), a quarter as long.
    each_of_pair = iter([2.0, 2.0, 1.0, 1.0, 0.25, 0.25])
    both_inside, take = threading.Barrier(2), threading.Lock()
    seen = []

    def fn(n):
        if threading.current_thread() is threading.main_thread():
            seen.append(("alone", n))
            clock.sleep(next(alone))
            return
        try:
            both_inside.wait(timeout=30)   # a pair run one after the other: fails in 30 s
            seen.append(("both inside", n))
        except threading.BrokenBarrierError:
            seen.append(("alone on a thread of the pair", n))
        with take:
            clock.sleep(next(each_of_pair))

    res = flash_breakdown.two_thread_scaling(fn, 10, 3)
    assert seen == [("alone", 10), ("both inside", 10), ("both inside", 10)] * 3, seen
    # Scalings 2 * 4 / (2 + 2) = 2, 2 * 1 / (1 + 1) = 1 and 2 * 2 / 0.5 = 8; calls 0.4, 0.1, 0.2 s.
    assert res == {"call_s": 0.2, "scaling": 2.0}, res


def test_the_tool_checks_its_scalings_against_calls_whose_answer_is_known(monkeypatch):
    """Its own run of a sleep (overlaps) and a Python loop (takes turns) through two_thread_scaling,
    which the report judges: the wall-clock check lives in the tool, where a busy machine makes it
    say so, not in this suite, where it would fail the run."""
    calls = []

    def scaling(fn, n, rounds):
        calls.append((fn, n, rounds))
        return {"call_s": 1.0, "scaling": 1.5}

    monkeypatch.setattr(flash_breakdown, "two_thread_scaling", scaling)
    check = flash_breakdown.scaling_check()
    assert [fn for fn, _, _ in calls] == [flash_breakdown._sleeps, flash_breakdown._spins]
    assert set(check) == {"sleep", "python loop"}

    def judged(sleep, loop):
        return flash_breakdown.scaling_check_line({"sleep": {"scaling": sleep}, "python loop": {"scaling": loop}})

    assert judged(1.95, 1.02).endswith("the scalings above tell the two apart"), judged(1.95, 1.02)
    for sleep, loop in ((1.56, 1.02), (1.95, 1.48)):           # measured on a loaded machine
        assert "NOT MET, the machine was too busy" in judged(sleep, loop), judged(sleep, loop)
    # The report prints the judgement under the scalings it judges; a run saved before has none.
    saved = json.loads((ROOT / "benchmarks" / "results" / "cpu-avx512-flash-breakdown-threads.json").read_text())
    before = flash_breakdown.report_lines(saved)
    last = max(i for i, line in enumerate(before) if ", scaling " in line)
    saved["scaling_check"] = {"sleep": {"scaling": 1.95}, "python loop": {"scaling": 1.02}}
    assert flash_breakdown.report_lines(saved) == before[:last + 1] + [judged(1.95, 1.02)] + before[last + 1:]


def test_call_scaling_times_the_kernels_own_calls(tiny):
    res = flash_breakdown.call_scaling(1, (32, 64))
    assert set(res) == {f"np.{fa.EXP.__name__} on ({fa.DIAG_ROWS}, 32)", f"matmul ({fa.DIAG_ROWS}, 65) @ (65, 32)",
                        f"np.{fa.EXP.__name__} on (32, 64)", "matmul (32, 65) @ (65, 64)"}
    for r in res.values():   # ratios of times, which another process's load moves: positive is all that holds
        assert r["call_s"] > 0 and 0 < r["scaling"] < math.inf


def test_an_existing_json_file_is_kept_unless_forced(tiny, tmp_path, capsys):
    """--json names a file that exists: refused before anything runs, the file as it was; with
    --force it is replaced."""
    path = tmp_path / "mine.json"
    path.write_text("the user's own file\n")
    with pytest.raises(SystemExit) as refused:
        flash_breakdown.main(["--repeats", "3", "--block", "32", "64", "--json", str(path)])
    assert refused.value.code == 2
    assert f"{path} exists; pass --force to overwrite it" in capsys.readouterr().err
    assert path.read_text() == "the user's own file\n"
    assert flash_breakdown.main(["--repeats", "3", "--block", "32", "64", "--json", str(path), "--force"]) == 0
    assert json.loads(path.read_text())["block"] == [32, 64]
