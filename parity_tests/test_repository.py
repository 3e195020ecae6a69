"""The repository stands on its own: its text refers only to files a user of it can open."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Built from pieces so that this file does not match itself.
OUTSIDE = [
    re.compile(r"\.\./" + "shared"),                       # the workspace folder beside a clone
    re.compile("DESIGN" + r"\.md"),                          # a design page that is not in the repo
    re.compile(r"\b" + "issue" + r"s? #?\d+", re.IGNORECASE),   # tracker numbers
]


def _tracked_text_files():
    try:
        names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    # .ci/run is CI's own script: it is where the workspace's folders are legitimately named.
    return [ROOT / n for n in names
            if n.endswith((".py", ".md", ".sh", ".cfg", ".toml", ".txt")) and not n.startswith(".ci/")]


def test_text_refers_only_to_the_repository():
    found = []
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in OUTSIDE):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "text that points outside the repository:\n" + "\n".join(found)


def test_the_patterns_can_match():
    """Guard against a pattern that never fires (the test above would then pass vacuously)."""
    samples = ["see " + "../" + "shared/x", "DESIGN" + ".md section 6", "(issue" + " 3)"]
    for pattern, sample in zip(OUTSIDE, samples, strict=True):
        assert pattern.search(sample), (pattern.pattern, sample)
