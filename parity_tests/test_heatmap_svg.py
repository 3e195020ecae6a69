"""Tests for ``attn_cli.plots.heatmap_svg``, the heatmaps the site inlines and notebooks show: the SVG
parses as XML, one rect and one title per cell, in its place, each title giving its query, key and
value as the walkthrough prints it; masked cells grey and said to be; colours that follow the
values; accessible text; a figure that scales; nothing to fetch; bad input named."""

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from attn_cli import plots, term
from parity_tests.helpers import heatmap_cells

SVG = "{http://www.w3.org/2000/svg}"
QUERIES = ["The", "cat", "sat"]
KEYS = ["The", "cat", "sat", "on", "mat"]


def drawn(R=3, S=5, seed=0, low=0.0):
    """(R, S) float32 values in [low, 1), no two alike: a transposed or shifted cell shows."""
    return np.random.default_rng(seed).uniform(low, 1.0, (R, S)).astype(np.float32)


def rgb(fill):
    return tuple(int(fill[k:k + 2], 16) for k in (1, 3, 5))


def test_one_rect_and_one_title_per_cell_in_its_place():
    v = drawn()
    svg = plots.heatmap_svg(v, QUERIES, KEYS, title="weights")
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    cells = heatmap_cells(svg)
    titled = [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]
    assert len(cells) == len(titled) == v.size, "one rect with a title per cell"
    assert all(len(r.findall(f"{SVG}title")) == 1 for r in titled), "one title per rect"
    assert sorted((q, k) for q, k, *_ in cells) == sorted((q, k) for q in QUERIES for k in KEYS)
    place = {}
    for query, key, number, masked, x, y, _, _ in cells:
        i, j = QUERIES.index(query), KEYS.index(key)
        assert not masked
        assert re.fullmatch(r"\d\.\d{4}", number), f"({query}, {key}): {number!r} has not 4 decimals"
        # Written with 4 decimals: at most half a unit of the last decimal from the value.
        assert abs(float(number) - float(v[i, j])) <= 0.5e-4 * (1 + 1e-9), (query, key, number, v[i, j])
        place[i, j] = (x, y)
    # Row i at one height, column j at one abscissa, in the order of the labels.
    assert all(place[i, j][1] == place[i, 0][1] and place[i, j][0] == place[0, j][0] for i, j in place)
    assert [place[i, 0][1] for i in range(3)] == sorted({y for _, y in place.values()})
    assert [place[0, j][0] for j in range(5)] == sorted({x for x, _ in place.values()})


def test_the_numbers_are_written_as_the_walkthrough_prints_them():
    """term.fmt's rules (no "-0.00", -inf spelled out, the decimals asked for), in the titles and,
    up to 12 x 12, in the cells; beyond, in the titles only."""
    v = np.array([[-0.00001, 0.5], [1.0, -0.25]], dtype=np.float64)
    svg = plots.heatmap_svg(v, ["a", "b"], ["a", "b"], title="g", signed=True, precision=2)
    numbers = {(q, k): n for q, k, n, *_ in heatmap_cells(svg)}
    assert numbers == {("a", "a"): "0.00", ("a", "b"): "0.50", ("b", "a"): "1.00", ("b", "b"): "-0.25"}
    written = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
    assert all(n in written for n in numbers.values()), "the numbers in the cells"
    big = drawn(13, 13, seed=1)
    labels = [f"t{k}" for k in range(13)]
    svg = plots.heatmap_svg(big, labels, labels, title="big")
    assert len(heatmap_cells(svg)) == 169
    assert not any(t.text == term.fmt(big[0, 0], 4) for t in ET.fromstring(svg).iter(f"{SVG}text"))


def test_masked_cells_are_grey_and_say_so():
    T = 4
    masked = ~np.tri(T, dtype=bool)                     # True above the diagonal: the keys after the query
    scores = np.where(masked, -np.inf, drawn(T, T, seed=2, low=-1.0))
    labels = ["The", "cat", "sat", "on"]
    svg = plots.heatmap_svg(scores, labels, labels, title="masked scores", masked=masked)
    for query, key, number, said, _, _, fill, cls in heatmap_cells(svg):
        i, j = labels.index(query), labels.index(key)
        assert said == masked[i, j] and (cls == "masked") == masked[i, j], (query, key)
        assert (fill == plots.MASKED_FILL) == masked[i, j], (query, key, fill)
        assert (number == "-inf") == masked[i, j], (query, key, number)
    assert not any(t.text == "-inf" for t in ET.fromstring(svg).iter(f"{SVG}text")), "no number on a masked cell"
    assert "6 cells masked" in ET.fromstring(svg).get("aria-label")


def test_colours_follow_the_values():
    """Weights on viridis, 0 and 1 at its ends, brighter as they grow; gradients red where positive
    and blue where negative, the largest magnitude at the scale's end."""
    v = np.array([[0.0, 0.25, 0.5, 0.75, 1.0]], dtype=np.float32)
    fills = [c[6] for c in heatmap_cells(plots.heatmap_svg(v, ["q"], list("abcde"), title="w"))]
    assert rgb(fills[0]) == plots.SEQUENTIAL[0] and rgb(fills[-1]) == plots.SEQUENTIAL[-1]
    light = [0.2126 * r + 0.7152 * g + 0.0722 * b for r, g, b in map(rgb, fills)]
    assert light == sorted(light) and len(set(light)) == 5, fills
    g = np.array([[-2.0, -0.5, 0.0, 0.5, 1.0]])
    cells = heatmap_cells(plots.heatmap_svg(g, ["q"], list("abcde"), title="g", signed=True))
    colours = [rgb(c[6]) for c in cells]
    assert colours[0] == plots.DIVERGING[0], "the largest magnitude at the end of the scale"
    assert all(b > r for r, _, b in colours[:2]) and all(r > b for r, _, b in colours[3:]), colours


def test_accessible_and_scales_to_its_container():
    svg = plots.heatmap_svg(drawn(), QUERIES, KEYS, title="Step 5: weights")
    root = ET.fromstring(svg)
    assert root.get("role") == "img"
    assert root.get("aria-label").startswith("Step 5: weights: heatmap of 3 queries by 5 keys")
    assert root[0].tag == f"{SVG}title" and root[0].text == "Step 5: weights"
    assert re.fullmatch(r"0 0 [\d.]+ [\d.]+", root.get("viewBox")) and root.get("width") == "100%"
    assert root.get("height") is None, "the height follows the width"
    texts = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "key (attended to)" in texts and "query (attending)" in texts


def test_nothing_is_fetched_and_labels_stay_text():
    labels = ["<b>", "a&b", "it's", '"q"', "$x$"]
    svg = plots.heatmap_svg(drawn(5, 5), labels, labels, title="<script>alert(1)</script> & co")
    root = ET.fromstring(svg)
    assert {(q, k) for q, k, *_ in heatmap_cells(svg)} == {(q, k) for q in labels for k in labels}
    assert root[0].text == "<script>alert(1)</script> & co"
    assert not [e.tag for e in root.iter() if e.tag.rpartition("}")[2] in ("script", "foreignObject", "image",
                                                                           "a", "use", "style")]
    assert re.findall(r"https?://\S*", svg) == ['http://www.w3.org/2000/svg"'], "only the namespace's name"
    assert not re.search(r"\b(href|src)=|url\(", svg)


@pytest.mark.parametrize("call, error, message", [
    (lambda: plots.heatmap_svg(np.zeros(3), ["a"], ["a"], title="t"), ValueError, r"values must be .*\(3,\)"),
    (lambda: plots.heatmap_svg(np.zeros((2, 2), dtype=complex), ["a", "b"], ["a", "b"], title="t"), TypeError,
     "values must be an array of numbers, got dtype complex128"),
    (lambda: plots.heatmap_svg(np.zeros((2, 3)), ["a", "b"], ["a", "b"], title="t"), ValueError,
     r"col_labels must give one label per column \(3\), got \['a', 'b'\]"),
    (lambda: plots.heatmap_svg(np.zeros((2, 2)), "ab", ["a", "b"], title="t"), ValueError, "row_labels"),
    (lambda: plots.heatmap_svg(np.zeros((2, 2)), ["a", "b"], ["a", "b"], title=3), TypeError, "title must be a str"),
    (lambda: plots.heatmap_svg(np.zeros((2, 2)), ["a", "b"], ["a", "b"], title="t", masked=np.zeros((2, 2))),
     TypeError, "masked must be booleans"),
    (lambda: plots.heatmap_svg(np.zeros((2, 2)), ["a", "b"], ["a", "b"], title="t", masked=np.zeros(2, bool)),
     ValueError, r"masked must have the shape of values \(2, 2\), got \(2,\)"),
    (lambda: plots.heatmap_svg(np.array([[0.0, -np.inf]]), ["a"], ["a", "b"], title="t"), ValueError,
     r"values\[0, 1\] is -inf: only a masked cell"),
    (lambda: plots.heatmap_svg(np.array([[np.nan]]), ["a"], ["a"], title="t"), ValueError, r"values\[0, 0\] is nan"),
    (lambda: plots.heatmap_svg(np.zeros((1, 1)), ["a"], ["a"], title="t", precision=-1), ValueError,
     "precision must be an integer in 0..12, got -1"),
    (lambda: plots.heatmap_svg(np.zeros((1, 1)), ["a"], ["a"], title="t", precision=2.0), ValueError, "precision"),
])
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
