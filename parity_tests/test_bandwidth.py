"""``python -m benchmarks.bandwidth`` at a tiny size: one figure per library and thread count,
the per-token floor from them, and its options refused by name."""

import re

import pytest

from benchmarks import bandwidth, machine


def test_prints_a_rate_per_library_and_thread_count_and_the_token_floor(capsys):
    assert bandwidth.main(["--mib", "4", "--threads", "1", "2", "--rounds", "2", "--per-token-mib", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("machine: ") and "BLAS " in out[0] and "load average" in out[0]
    assert out[1] == "x (1, 1024) @ W (1024, 1024) float32, W 4 MiB, median of 2 rounds"
    rows = {m["name"]: (float(m["gbs"]), float(m["ms"])) for m in (
        re.match(r"  (?P<name>\w+, \d thread\(s\)) +(?P<gbs>[\d.]+) GB/s   a token reading 8 MiB: at least "
                 r"(?P<ms>[\d.]+) ms$", line) for line in out[2:]) if m}
    assert set(rows) == {f"{lib}, {t} thread(s)" for lib in ("numpy", "torch") for t in (1, 2)}, out
    for gbs, ms in rows.values():
        # ms x GB/s is the bytes read, to the rounding of both printed figures (0.05 each at most)
        assert gbs > 0 and abs(ms * gbs - 8 * 2**20 / 1e6) <= 0.05 * (ms + gbs) + 0.0025, (gbs, ms)


@pytest.mark.parametrize("argv, message", [
    (["--mib", "0"], "argument --mib: must be a positive integer, got 0"),
    (["--threads", "0"], "argument --threads: must be a positive integer, got 0"),
    (["--rounds", "-1"], "argument --rounds: must be a positive integer, got -1"),
])
def test_bad_options_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        bandwidth.main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_buffer_past_half_the_memory_is_refused_before_it_is_allocated(capsys, monkeypatch):
    monkeypatch.setattr(machine, "machine", lambda: {"memory_gib": 1.0})
    monkeypatch.setattr(bandwidth, "measure", lambda *a: pytest.fail("measured"))
    with pytest.raises(SystemExit):
        bandwidth.main(["--mib", "513"])
    assert "--mib 513 asks for more than half of this machine's 1.0 GiB of memory" in capsys.readouterr().err
