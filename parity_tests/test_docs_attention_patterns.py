"""docs/attention_patterns.md and its script: the script runs without touching the committed
picture, the page shows an image that exists and the script's table, and the panels' numbers
obey what the page says of them."""

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import numpy_attn
from attn_cli import show, site
from parity_tests.helpers import load_docs_script, needs_vocab

ROOT = Path(numpy_attn.__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "attention_patterns.py"
PAGE = ROOT / "docs" / "attention_patterns.md"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Float64 rows of at most 19 weights, each exp(s - max) / sum: the sum of a row is 1 up to the
# rounding of 19 divisions and 18 additions, under 40 * 1.1e-16 = 4.4e-15; 1e-14 leaves a margin.
ROW_SUM_TOL = 1e-14


patterns = load_docs_script(SCRIPT)


@pytest.fixture(scope="module")
def result():
    ids = np.array(patterns.tokenizer.encode(patterns.SENTENCE))
    return ids, patterns.panels(ids)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_page_links_pictures_that_exist():
    page = PAGE.read_text(encoding="utf-8")
    linked = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", page)
    assert "images/attention_patterns.png" in linked, f"the page's images: {linked}"
    for link in linked:
        path = PAGE.parent / link
        assert path.is_file(), f"{PAGE.name} links {link}, which does not exist"
        assert path.read_bytes().startswith(PNG_SIGNATURE), f"{link} is not a PNG"


def test_the_readme_links_the_page():
    assert "(docs/attention_patterns.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_site_shows_the_picture_on_the_attention_and_softcap_pages():
    ops = {op.name: op for op in show.operations()}
    for name in ("attention", "softcap"):
        assert patterns.IMAGE in site.pictures_of(ops[name]), f"the site's {name} page lacks the picture"


@needs_vocab
def test_the_script_writes_only_its_out_and_prints_the_pages_table(tmp_path):
    committed = digest(patterns.IMAGE)
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's own file\n")
    out = tmp_path / "picture.png"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes().startswith(PNG_SIGNATURE), "--out holds no PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "picture.png"]
    assert mine.read_text() == "the user's own file\n"
    assert digest(patterns.IMAGE) == committed, "the script rewrote the committed picture despite --out"
    table = done.stdout.split("\n\n", 1)[1].strip()
    assert table.startswith("| query |") and table in PAGE.read_text(encoding="utf-8"), \
        f"the page's table differs from the script's:\n{table}"


# The page's table is compared with the script's as text. Its numbers are float64 results of fixed
# inputs printed to 2 or 3 decimals; another BLAS kernel or vector width sums them in another order,
# which moves a value of at most about 25 (the scores) by a few hundred float64 roundings: under
# 1e-12. A value at least 1e-9 from the point where its last printed digit changes prints the same
# on every machine.
PRINTED_MARGIN = 1e-9


@needs_vocab
def test_the_pages_table_prints_the_same_on_every_machine(result):
    """Every number table() prints lies PRINTED_MARGIN or more from a rounding boundary of its
    decimals, so the text comparison above holds on any machine (the closest: 14.786, 1.9e-5)."""
    ids, panels = result
    printed = [(panel.weights[i].max(), 2) for panel in panels.values() for i in range(len(ids))]
    printed += [(panel.weights.max(axis=-1).mean(), 2) for panel in panels.values()]
    printed += [(np.abs(panel.scores[panel.visible]).max(), 3) for panel in panels.values()]
    assert len(printed) == 4 * (len(ids) + 2)
    for value, decimals in printed:
        scaled = value * 10**decimals
        margin = abs(scaled - np.floor(scaled) - 0.5) / 10**decimals
        assert margin >= PRINTED_MARGIN, f"{value!r} lies {margin:.1e} from where its {decimals} decimals change"


def test_an_out_in_no_folder_is_refused_by_name(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "none" / "p.png")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--out" in done.stderr and "none" in done.stderr, done.stderr
    assert not (tmp_path / "none").exists()


class FakeFigure:
    """savefig writes ``content``, or half of it and then is interrupted."""

    def __init__(self, content, interrupt=False):
        self.content, self.interrupt = content, interrupt

    def savefig(self, path, format, dpi):
        Path(path).write_bytes(self.content[: len(self.content) // 2] if self.interrupt else self.content)
        if self.interrupt:
            raise KeyboardInterrupt


@pytest.mark.parametrize("step", ["savefig", "replace", "unlink"])
def test_an_interrupted_save_leaves_the_old_picture_or_the_new_one_whole(tmp_path, monkeypatch, step):
    path = tmp_path / "picture.png"
    path.write_bytes(b"the user's old picture")
    (tmp_path / "notes.txt").write_text("the user's own file\n")
    new = PNG_SIGNATURE + b"new picture" * 100

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if step == "replace":
        monkeypatch.setattr(patterns.os, "replace", interrupt)
    if step == "unlink":   # after the rename: the clean-up of a temporary that is no longer there
        monkeypatch.setattr(Path, "unlink", interrupt)
    with pytest.raises(KeyboardInterrupt):
        patterns.save_png(FakeFigure(new, interrupt=step == "savefig"), path)
    monkeypatch.undo()
    expected = new if step == "unlink" else b"the user's old picture"
    assert path.read_bytes() == expected, f"interrupted at {step}: the picture is neither old nor new"
    assert (tmp_path / "notes.txt").read_text() == "the user's own file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "picture.png"], f"left behind at {step}"


def test_a_save_replaces_the_picture(tmp_path):
    path = tmp_path / "picture.png"
    path.write_bytes(b"old")
    patterns.save_png(FakeFigure(PNG_SIGNATURE + b"new"), path)
    assert path.read_bytes() == PNG_SIGNATURE + b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["picture.png"]


# -- what the page says of the panels -----------------------------------------------------------

@needs_vocab
def test_every_row_is_a_distribution_over_the_keys_it_may_see(result):
    _, panels = result
    assert list(panels) == ["plain", "softcap", "window", "qk_norm"]
    for name, panel in panels.items():
        T = panel.weights.shape[0]
        np.testing.assert_allclose(panel.weights.sum(axis=-1), np.ones(T), rtol=0, atol=ROW_SUM_TOL,
                                   err_msg=f"{name}: row sums")
        future = np.triu(np.ones((T, T), dtype=bool), 1)
        assert (panel.weights[future] == 0).all(), f"{name}: weight on a later key"
        assert (panel.weights >= 0).all(), f"{name}: a negative weight"


@needs_vocab
def test_the_window_zeroes_keys_older_than_w_and_leaves_the_first_w_rows(result):
    _, panels = result
    w, window = patterns.WINDOW, panels["window"].weights
    i, j = np.indices(window.shape)
    assert (window[i - j >= w] == 0).all(), "window: weight on a key older than w"
    assert (window[(i - j < w) & (j <= i)] > 0).all(), "window: a key inside the window has no weight"
    # The first w rows see the same keys as without the window: the same arithmetic on the same
    # numbers; the tolerance only allows a vectorised exp that rounds by position, a few ulps of 1.
    np.testing.assert_allclose(window[:w], panels["plain"].weights[:w], rtol=0, atol=1e-15,
                               err_msg="window: the first w rows")
    assert (window.max(axis=-1) != panels["plain"].weights.max(axis=-1)).any(), \
        "window: no row changed, so the picture shows nothing"
    # A key inside the window keeps its score and gains weight: the same exponentials over a
    # smaller sum (up to the softmax's rounding, see ROW_SUM_TOL).
    inside = (i - j < w) & (j <= i)
    assert (window[inside] >= panels["plain"].weights[inside] - ROW_SUM_TOL).all(), \
        "window: a key inside the window lost weight"


@needs_vocab
def test_the_capped_scores_stay_inside_the_cap_and_no_row_gets_sharper(result):
    _, panels = result
    c, plain, capped = patterns.SOFTCAP, panels["plain"], panels["softcap"]
    seen = plain.visible
    assert (np.abs(capped.scores[seen]) < c).all(), "softcap: a score outside (-c, c)"
    assert np.abs(plain.scores[seen]).max() > 2 * c, "the plain scores never reach the cap: it shows nothing"
    np.testing.assert_allclose(capped.scores, c * np.tanh(plain.scores / c), rtol=1e-15, atol=0,
                               err_msg="softcap: the capped scores are c tanh(plain / c)")
    # The cap is increasing with slope <= 1, so it never widens a gap to the row's largest score:
    # each row's largest weight can only fall. Both sides carry a softmax's rounding, a few ulps
    # of numbers <= 1 (see ROW_SUM_TOL).
    assert (capped.weights.max(axis=-1) <= plain.weights.max(axis=-1) + ROW_SUM_TOL).all(), \
        "softcap: a row's largest weight rose"
    np.testing.assert_array_equal(capped.weights.argmax(axis=-1), plain.weights.argmax(axis=-1),
                                  err_msg="softcap: the cap changed which key leads a row")


@needs_vocab
def test_qk_norm_bounds_the_scores_by_the_norms_weights_whatever_the_projections(result):
    ids, panels = result
    bound = patterns.qk_norm_bound(ids)
    assert bound == np.sqrt(patterns.CONFIG.hs), "the norms' weights start at 1: the bound is sqrt(hs)"
    normed, plain = panels["qk_norm"], panels["plain"]
    assert (np.abs(normed.scores[normed.visible]) <= bound).all(), "QK-norm: a score above its bound"
    assert np.abs(plain.scores[plain.visible]).max() > 2 * bound, "the plain scores never pass the bound"
    # Without the growth factor the norms see rows 16 times smaller: the same picture, but for eps.
    # rms_norm divides by sqrt(ms + eps): for a row of mean square ms, eps shrinks its length by
    # eps / (2 ms) relatively (the grown rows' ms is 256 times larger: negligible), so a score
    # moves by at most bound * (eps / (2 ms_q) + eps / (2 ms_k)), and a weight by at most half of
    # that: softmax's Jacobian, diag(p) - p p^T, has rows of absolute sum 2 p (1 - p) <= 1/2.
    # Twice that bound covers the second-order terms and rounding (~1e-15).
    q, k, _, _ = patterns.head_inputs(ids, growth=1.0)
    eps = patterns.CONFIG.rms_eps
    score_moves = bound * (eps / (2 * (q * q).mean(axis=-1).min()) + eps / (2 * (k * k).mean(axis=-1).min()))
    weight_moves = score_moves / 2
    ungrown = patterns.panels(ids, growth=1.0)
    np.testing.assert_allclose(ungrown["qk_norm"].weights, normed.weights, rtol=0, atol=2 * weight_moves,
                               err_msg="QK-norm: the weights depend on the projections' size")
    assert np.abs(ungrown["plain"].weights - plain.weights).max() > 0.5, \
        "the plain weights do depend on the projections' size: the comparison above says something"


def test_the_script_uses_numpy_only():
    """Everything computed with numpy_attn: the script imports no torch (matplotlib only to draw)."""
    imports = re.findall(r"^\s*(?:from|import) (\w+)", SCRIPT.read_text(encoding="utf-8"), flags=re.M)
    assert "torch" not in imports and "torch_attn" not in imports, imports
    assert "numpy_attn" in imports
