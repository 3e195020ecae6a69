"""The README's Python examples run as written and show what they say: the first screen's check of a
softmax backward with a bug planted fails with the report shown, the hand-written backward equals
autograd's, and every name it states is importable where it says."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import numpy_attn
from attn_cli import show

ROOT = Path(numpy_attn.__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")

# float64 throughout, entries of order 1: the twins differ only in the order of sums of at most
# 8 terms (hs) and 5 (S) and in exp's last bit, a few times n * eps = 8 * 2.2e-16 ~ 2e-15 per
# entry, times |values| below 10. 1e-12 leaves a margin of about 50.
EXAMPLE_TOL = 1e-12


def python_example():
    section = README.split("## In Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "one Python example on the README's first screen"
    return blocks[0]


def test_the_examples_are_on_the_first_screen():
    """The check failing on purpose opens the first screen, the forward and backward follow it."""
    lines = README.splitlines()
    starts = [k for k, line in enumerate(lines) if line.startswith("```python")]
    assert starts[0] < 30, f"the check's example starts on line {starts[0] + 1}"
    assert starts[1] < 55, f"the forward and backward example starts on line {starts[1] + 1}"
    assert lines[starts[1] - 2].startswith("## In Python"), "the check's example is the first"


def check_example():
    """(code, report shown) of the first screen's check: what a user can check, a bug planted."""
    first = README.split("\n## In Python", 1)[0]
    assert "numpy_attn.testing.check" in first and "numpy-attn check" in first
    code, = re.findall(r"```python\n(.*?)```", first, flags=re.S)
    report, = re.findall(r"```text\n(.*?)```", first, flags=re.S)
    return code, report


# A number of the report: its text is rounded (3 to 6 significant digits), so the figures shown are
# held to the digits printed, as numbers; the bug it reports misses by orders of magnitude more.
NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?")


def same_line(shown, printed):
    """The same text, and the same numbers to the digits printed."""
    a, b = NUMBER.findall(shown), NUMBER.findall(printed)
    return NUMBER.split(shown) == NUMBER.split(printed) and len(a) == len(b) and all(
        math.isclose(float(x), float(y), rel_tol=1e-3) for x, y in zip(a, b, strict=True))


def assert_shows(shown, report):
    """Each line shown is the report's next line, or with "..." before it a later one; a last "..."
    stands for the rest."""
    lines = report.rstrip("\n").splitlines()
    i, gap = 0, False
    for want in shown.rstrip("\n").splitlines():
        if want.strip() == "...":
            gap = True
            continue
        while gap and i < len(lines) and not same_line(want, lines[i]):
            i += 1
        assert i < len(lines) and same_line(want, lines[i]), f"not the report's next line: {want!r}\n{report}"
        i, gap = i + 1, False
    assert gap or i == len(lines), f"the report goes on past the lines shown:\n{report}"


def test_the_check_example_fails_with_the_report_shown(tmp_path):
    code, shown = check_example()
    script = tmp_path / "check_example.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 1 and result.stdout == "", result.stderr
    report = result.stderr.partition("numpy_attn.testing.CheckFailure: ")[2]
    assert report, result.stderr
    assert_shows(shown, report)


def test_the_report_reading_can_fail():
    report = "a: 1 of 2\n  b 0.5\n  c\n"
    assert_shows("a: 1 of 2\n  ...\n  c", report)
    assert_shows("a: 1.0 of 2\n  ...", report)
    for shown in ("a: 2 of 2\n  ...", "a: 1 of 2\n  c", "a: 1 of 2\n  b 0.5", "  ...\n  b 0.7\n  ..."):
        with pytest.raises(AssertionError):
            assert_shows(shown, report)


def test_the_readme_example_runs_and_the_gradients_agree(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(python_example(), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    printed = dict(re.findall(r"^(\w+):\s+(\S+)$", result.stdout, flags=re.M))
    assert set(printed) == {"out", "weights", "dq", "dk", "dv"}, result.stdout
    for name, value in printed.items():
        assert float(value) < EXAMPLE_TOL, f"{name}: {value}"


def test_every_public_function_is_importable_from_the_package():
    """Each operation's public functions, but for those the README says stay in their module:
    erf, and flex_attention's mask and score modifiers (the functions its twin also has, but
    flex_attention itself)."""
    ops = {op.name: op for op in show.operations()}
    modifiers = set(ops["flex_attention"].torch_functions) - {"flex_attention"}
    assert {"causal", "sliding_window", "soft_cap"} <= modifiers
    for name in ("erf", "causal", "sliding_window"):
        assert f"`{name}`" in README.split("Every public NumPy function is importable", 1)[1][:400]
    missing = []
    for op in ops.values():
        module = __import__(f"numpy_attn.{op.name}", fromlist=["_"])
        for name in op.numpy_functions:
            stays = name == "erf" or (op.name == "flex_attention" and name in modifiers)
            if not stays and getattr(numpy_attn, name, None) is not getattr(module, name):
                missing.append(f"{op.name}.{name}")
    assert not missing, f"not importable from numpy_attn: {missing}"
    assert "softmax_forward" in dir(numpy_attn)


def test_the_first_screen_sets_up_runs_and_tests():
    """A newcomer's first screen: the set-up, the main job and the tests, each with its time,
    before the Python example that needs that environment."""
    first = "\n".join(README.splitlines()[:40])
    example = first.index("```python")
    for command in ("python3 -m venv .venv", "pip install -q -c constraints.txt -e '.[tests]'",
                    "numpy-attn train", "python -m pytest -m twin_parity", "-k "):
        assert 0 <= first.find(command) < example, f"{command!r} is not on the first screen before the example"
    commands = first.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert all(re.search(r"# .*~\d+ (s|min)", line) for line in commands), commands


def test_the_benchmarks_section_links_every_run():
    section = README.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    assert "(benchmarks/results/README.md)" in section
    assert (ROOT / "benchmarks" / "results" / "README.md").is_file()


def test_the_checkpoint_section_names_every_family_the_registry_reads():
    """README's "Real checkpoints" section keeps up with numpy_attn's family registry: every
    family's Hugging Face architecture is named there, and its heading names every family or none
    (a list in the heading went stale as families were added)."""
    from numpy_attn._family import families

    text = README
    start = text.index("### Real checkpoints")
    section = text[start:text.index("\n### ", start + 1)]
    missing = [a for f in families().values() for a in f.architectures if a not in section]
    assert not missing, f"README's checkpoint section does not name {missing}"
    heading = section.splitlines()[0]
    named = [f.title for f in families().values() if f.title in heading and f.name != "gpt2"]
    assert not named or len(named) == len(families()) - 1, f"the heading lists some families only: {named}"
