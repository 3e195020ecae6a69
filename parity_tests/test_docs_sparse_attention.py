"""docs/sparse_attention.md and its script: the page's grids, scores and cache bytes are what the
code computes today (parsed and compared as numbers), and what its prose says of them holds."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import numpy_attn
from parity_tests.helpers import load_docs_script

ROOT = Path(numpy_attn.__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "sparse_attention.py"
PAGE = ROOT / "docs" / "sparse_attention.md"

sparse = load_docs_script(SCRIPT)


def page():
    return PAGE.read_text(encoding="utf-8")


def fenced(text):
    """The page's ```text blocks, in order."""
    return re.findall(r"```text\n(.*?)\n```", text, flags=re.S)


def parse_grid(block):
    """A grid block -> (column words, row words, cells as strings (T, T))."""
    header, *rows = block.splitlines()
    cells = [row.split() for row in rows]
    return header.split(), [row[0] for row in cells], [row[1:] for row in cells]


def test_the_page_shows_every_mask_as_the_code_computes_it():
    """Each 0/1 grid of the page equals its mask exactly, in the page's order."""
    blocks = fenced(page())
    masks = sparse.masks()
    grids = [b for b in blocks if "." not in b]   # the score grid has decimals
    assert len(grids) == len(masks), f"the page has {len(grids)} grids of 0/1, the script {len(masks)} masks"
    for (title, mask), block in zip(masks.items(), grids, strict=True):
        keys, queries, cells = parse_grid(block)
        assert keys == queries == list(sparse.WORDS), f"{title}: labels {keys} {queries}"
        shown = np.array([[int(c) for c in row] for row in cells])
        assert shown.shape == mask.shape and np.array_equal(shown, mask), \
            f"{title}: the page shows\n{shown}\nthe code computes\n{mask.astype(int)}"


def test_the_pages_indexer_scores_are_the_forwards():
    """Hidden cells are '-' exactly where the forward says -inf; the others within half their last
    printed digit of its float64 scores."""
    scores, _ = sparse.indexer_selection()
    block = [b for b in fenced(page()) if "." in b]
    assert len(block) == 1, "the page has no single score grid"
    keys, queries, cells = parse_grid(block[0])
    assert keys == queries == list(sparse.WORDS)
    hidden = np.array([[c == "-" for c in row] for row in cells])
    assert np.array_equal(hidden, np.isneginf(scores)), hidden
    shown = np.array([[np.nan if c == "-" else float(c) for c in row] for row in cells])
    visible = ~hidden
    assert np.all(np.abs(shown[visible] - scores[visible]) <= 0.005 + 1e-12), \
        f"the page's scores\n{shown}\nthe forward's\n{scores}"


def test_the_selection_keeps_the_top_k_the_prose_names():
    """Each row keeps its TOP_K largest visible scores, the k-th clear of the next by more than any
    rounding (so every machine selects the same keys), and the keys the page names."""
    scores, selected = sparse.indexer_selection()
    k = sparse.TOP_K
    for t, row in enumerate(scores):
        visible = np.sort(row[np.isfinite(row)])[::-1]
        assert selected[t].sum() == min(k, t + 1)
        if len(visible) > k:
            assert visible[k - 1] - visible[k] > 1e-6, f"row {t}: a near tie at the k-th place"
            assert row[selected[t]].min() == visible[k - 1]
    words = list(sparse.WORDS)
    kept = {words[t]: [words[s] for s in np.flatnonzero(selected[t])] for t in range(len(words))}
    assert kept["on"] == ["The", "cat"] and kept["mat"] == ["The", "sat"], kept
    assert scores[1, 0] == 0, "cat's score of The is no exact 0"


def test_the_pages_cache_table_is_the_cache_functions():
    sizes = sparse.cache_bytes()
    rows = re.findall(r"^\| ([a-z +]+) \| (\d+) \| (\d+) \| ([0-9.]+) \|$", page(), flags=re.M)
    assert [r[0] for r in rows] == list(sizes), rows
    full = sizes["full k and v"]
    for name, per_layer, all_layers, share in rows:
        assert int(per_layer) == sizes[name] and int(all_layers) == sizes[name] * sparse.RELEASED_LAYERS, name
        assert abs(float(share) - sizes[name] / full) <= 0.00005 + 1e-12, name
    # What the prose says: the latent is (512 + 64) bfloat16 numbers, about 1/71 of 128 heads x
    # (128 + 64 + 128); the indexer key (128 float32) adds under half of it again.
    assert sizes["mla latent"] == (512 + 64) * 2 and full == 128 * 320 * 2
    assert round(full / sizes["mla latent"]) == 71
    assert 0 < sizes["mla latent + indexer key"] - sizes["mla latent"] == 128 * 4 < sizes["mla latent"] / 2


def test_the_links_and_the_scripts_output():
    assert "(docs/sparse_attention.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(sparse_attention.md)" in (ROOT / "docs" / "attention_patterns.md").read_text(encoding="utf-8")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name, text in sparse.blocks().items():
        assert f"{name}:\n{text}\n" in done.stdout, name


@pytest.mark.parametrize("title", ["dense causal", "sliding window", "chunked"])
def test_the_fixed_patterns_are_what_the_page_says(title):
    """Sliding: t - w < s <= t; chunked: same chunk and s <= t; causal: s <= t."""
    T = len(sparse.WORDS)
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    expected = {"dense causal": s <= t, "sliding window": (s <= t) & (s > t - sparse.WINDOW),
                "chunked": (s <= t) & (s // sparse.CHUNK == t // sparse.CHUNK)}[title]
    mask = next(m for name, m in sparse.masks().items() if name.startswith(title))
    assert np.array_equal(mask, expected)
