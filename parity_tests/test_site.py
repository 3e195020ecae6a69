"""Tests for ``numpy-attn site`` (attn_cli/site.py, attn_cli/mathml.py): one page per operation in
the reading order, readable offline, equations as MathML, the backward step by step, the errors
of the suite's report, the pictures, the two files side by side; DIR is written into, never
replaced: the site's own files (its manifest's) are replaced all or none, whatever is interrupted
when, and every file of the user's there is kept."""

import argparse
import ast
import contextlib
import hashlib
import html
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import numpy_attn
from attn_cli import checkpoint, cli, mathml, show, site, walk_steps, walkthrough
from numpy_attn.softmax import softmax_forward
from parity_tests.helpers import heatmap_cells, needs_vocab
from parity_tests.interrupt_kit import Interrupter, default_signals, snapshot

ROOT = Path(numpy_attn.__file__).resolve().parent.parent


def docstring_order():
    lines = numpy_attn.__doc__.split("Reading order, leaf to root:")[1].split("\n\n")[1].splitlines()
    return [line.split()[0] for line in lines]


def fake_report(path, rows=None):
    """A test-errors.json with one row per operation's test file (or the rows given)."""
    rows = rows if rows is not None else [
        dict(test_file=f"parity_tests/test_{name}.py", name=f"{name}.out", dtype="float64",
             max_abs_error=1e-15 * (k + 1), tolerance_used=0.01 * (k + 1))
        for k, name in enumerate(docstring_order())]
    path.write_text(json.dumps(rows))
    return path


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["site", *argv])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The site built once, strictly, from a report that covers every operation. Without GPT-2's
    vocabulary (never in CI) the attention page cannot draw the worked example: the site is built
    without --strict, and that is its one warning."""
    tmp = tmp_path_factory.mktemp("site")
    vocab_missing = needs_vocab.mark.args[0]
    strict = [] if vocab_missing else ["--strict"]
    status, out, err = run(str(tmp / "site"), "--errors", str(fake_report(tmp / "errors.json")), *strict)
    assert status == 0, err
    assert "wrote" in out, err
    assert err.count("warning") == 1 and "no worked example" in err if vocab_missing else not err, err
    return tmp / "site"


def page(built, name):
    return (built / f"{name}.html").read_text(encoding="utf-8")


def test_one_page_per_operation_in_the_reading_order(built):
    order = docstring_order()
    assert sorted(p.stem for p in built.glob("*.html")) == sorted(order + ["index"])
    index = page(built, "index")
    assert re.findall(r'<li><a href="(\w+)\.html"><b>', index) == order, "the index's order"
    for name in order:
        nav = page(built, name).split('<nav class="ops">')[1].split("</nav>")[0]
        assert re.findall(r'href="(\w+)\.html"', nav) == order, f"{name}: the side list's order"
    assert [op.name for op in show.operations()] == order


def test_nothing_is_fetched_when_reading(built):
    """No script, no font, no style sheet from elsewhere: every reference is a file of the site."""
    for path in built.rglob("*"):
        if path.suffix not in (".html", ".css"):
            continue
        text = path.read_text(encoding="utf-8")
        assert "<script" not in text.lower() and "@import" not in text and "@font-face" not in text
        assert not re.search(r"https?://", text), f"{path.name} names a URL"
        for ref in re.findall(r'(?:src|href)="([^"#]+)', text) + re.findall(r"url\(([^)]*)\)", text):
            assert (path.parent / ref).is_file(), f"{path.name}: {ref} is not in the site"


def formula_lines(op_name):
    """Lines of the module docstring indented four or more that hold an "=" (not code: code calls
    np., carries a # comment, or is one line of a call whose brackets close on another): found
    here by reading the file, independently of the site."""
    source = (ROOT / "numpy_attn" / f"{op_name}.py").read_text()
    first = ast.parse(source).body[0]
    lines = source.splitlines()[first.lineno - 1:first.end_lineno]

    def code(line):
        return ("np." in line or "#" in line or line.count("(") != line.count(")")
                or line.count("[") != line.count("]"))

    return [line for line in lines if line.startswith("    ") and "=" in line and not code(line)]


def test_equations_are_typeset_as_mathml(built):
    counted = 0
    for name in docstring_order():
        text = page(built, name)
        for line in formula_lines(name):
            counted += 1
            first = mathml.segments(line)[0][0]
            assert mathml.to_mathml(first) in text, f"{name}: {line.strip()!r} not typeset"
        if formula_lines(name):
            assert "<math" in text and "<code>" not in text.split("The equations")[1].split("</table>")[0]
    assert counted >= 40


def test_mathml_of_a_formula():
    m = mathml.to_mathml("softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m)")
    assert m.startswith('<math display="block">') and m.count("<msub>") == 3
    assert '<munder><mo movablelimits="false">∑</mo><mi>j</mi></munder>' in m
    assert "<msqrt><mi>hs</mi></msqrt>" in mathml.to_mathml("scale = 1 / sqrt(hs)")
    assert "<msup><mi>k</mi><mi>T</mi></msup>" in mathml.to_mathml("q @ k^T")
    assert "<mtext>\u00a0unless given\u00a0</mtext>" in mathml.to_mathml("1 / sqrt(hs) unless given")
    with pytest.raises(ValueError, match="no closing"):
        mathml.to_mathml("exp(x")


def test_the_backward_step_by_step(built):
    """softmax's backward: each comment of the function above the lines it explains, in order."""
    text = html.unescape(page(built, "softmax"))
    steps = text.split("<h3><code>softmax_backward</code></h3>")[1].split("</ol>")[0]
    comment = steps.index("Undoes y = e / s")
    code = steps.index("dx = y * (dy - (dy * y).sum(axis=axis, keepdims=True))")
    assert comment < code
    assert "<h3><code>log_softmax_backward</code></h3>" in text
    assert "Backward: dx = y * (dy - sum(dy * y)) for softmax" in text, "the module docstring's derivation"


def test_errors_come_from_the_report(tmp_path):
    rows = [dict(test_file="parity_tests/test_softmax.py", name="softmax.dx", dtype="float32",
                 max_abs_error=1.234e-07, tolerance_used=0.0421),
            dict(test_file="parity_tests/test_linear.py", name="linear.dw", dtype="float64",
                 max_abs_error=9.876e-15, tolerance_used=0.5)]
    status, _, err = run(str(tmp_path / "s"), "--errors", str(fake_report(tmp_path / "e.json", rows)))
    assert status == 0
    softmax = page(tmp_path / "s", "softmax")
    assert "1.23e-07" in softmax and "4.2%" in softmax and "softmax.dx" in softmax
    assert "9.88e-15" not in softmax, "linear's error is linear's"
    assert "9.88e-15" in page(tmp_path / "s", "linear")
    assert "Not measured in this run" in page(tmp_path / "s", "rope")
    assert "warning: rope: test-errors.json holds nothing from parity_tests/test_rope.py" in err


PARITY = ["sdpa.dq", "mha.dparams.q.w", "feed_forward[gelu].dx", "flex.dk (alibi)", "softmax.y with dtype= vs the twin",
          "worked (b).context vs twin", "sdpa.dk bottom-right vs builtin", "gelu[tanh].dx vs F.gelu",
          "sdpa[softcap].out vs Gemma 2", "gpt2.logits vs transformers", "erf vs torch.erf (sweep)",
          "llama: backward vs autograd.layers.0.attn.q.w", "kv_cache twin vs DynamicCache.k[0] step 1"]
NOT_PARITY = ["worked W_key vs torch.rand", "sdpa.dq vs finite differences", "worked (a).weights vs hand",
              "attention[numpy] dk (bfloat16), its truth within float32 noise", "softmax row sums",
              "sdpa.out gqa vs repeated heads", "erf(0.5)", "log_softmax.y vs log(softmax.y)",
              "sdpa.dk after permuting keys", "gpt.logits vs float64", "flash.out vs reference",
              "x vs torch.randn draws", "kv_cache.k[0] step 1", "adamw params.lin.w", "out vs twinned heads"]


def test_the_largest_errors_are_the_parity_comparisons(tmp_path):
    """The attention page was led by "float64: 4.67e-05 (worked W_key vs torch.rand)": a tutorial's
    typed-in weights against torch.rand's draws, a float32 draw under float64. A page's largest errors
    and its table are drawn from its comparisons with PyTorch only (the twin, autograd, a built-in,
    transformers), each under the dtype it was computed in; the others are counted, not shown."""
    for name in PARITY:
        assert site.parity_comparison(name), name
    for name in NOT_PARITY:
        assert not site.parity_comparison(name), name

    def row(name, dtype, err, used):
        return dict(test_file="parity_tests/test_attention.py", name=name, dtype=dtype, max_abs_error=err,
                    tolerance_used=used)
    rows = [row("worked W_key vs torch.rand", "float64", 4.67e-05, 0.935),
            row("attention[numpy] dq (bfloat16), its truth within float32 noise", "float64", 7.2e-07, 0.9),
            row("sdpa.dq vs finite differences", "float64", 3.5e-09, 0.8),
            row("worked (a).weights vs hand", "float32", 6.1e-08, 0.7),
            row("sdpa.dq", "float64", 4.4e-16, 0.25), row("sdpa.dq", "float32", 2.4e-07, 0.31),
            row("sdpa.out vs builtin", "float64", 2.2e-16, 0.05),
            row("worked (b).context vs twin", "float32", 3e-08, 0.01)]
    status, _, err = run(str(tmp_path / "s"), "--errors", str(fake_report(tmp_path / "e.json", rows)))
    assert status == 0, err
    section = page(tmp_path / "s", "attention").split("Measured by the parity suite")[1].split("<h2>")[0]
    lead = re.search(r"Largest absolute error[^:]*, by dtype: (.*?)\.</p>", section).group(1)
    assert re.sub(r"<[^>]+>", "", lead) == "float32: 2.40e-07 (sdpa.dq); float64: 4.40e-16 (sdpa.dq)", lead
    table = re.findall(r"<tr><td><code>(.*?)</code></td><td>(\w+)</td><td class=\"n\">(.*?)</td>", section)
    assert table == [("sdpa.dq", "float32", "2.40e-07"), ("sdpa.dq", "float64", "4.40e-16"),
                     ("sdpa.out vs builtin", "float64", "2.20e-16"),
                     ("worked (b).context vs twin", "float32", "3.00e-08")]
    for name in NOT_PARITY:
        assert html.escape(name) not in section, name
    assert "its 4 other comparisons" in section
    index = page(tmp_path / "s", "index")
    assert "attention</b></a>: " in index and "(closest to its tolerance: 31%)" in index
    only_others = [row("worked W_key vs torch.rand", "float64", 4.67e-05, 0.935)]
    status, _, err = run(str(tmp_path / "t"), "--errors", str(fake_report(tmp_path / "f.json", only_others)))
    assert status == 0 and "attention: test-errors.json holds no comparison with PyTorch" in err
    assert "torch.rand" not in page(tmp_path / "t", "attention")


def test_every_twin_parity_comparison_is_one_with_pytorch():
    """The comparisons of each operation's twin_parity test (the one that proves NumPy equal to the
    twin and autograd) are labelled as parity comparisons, so that its page shows them: read here
    from each test file's source (a label built in a kit is not seen), placeholders as words."""
    counted = 0
    for path in sorted((ROOT / "parity_tests").glob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and any("twin_parity" in ast.unparse(d) for d in node.decorator_list):
                body = ast.get_source_segment(source, node)
                for label in re.findall(r'assert_(?:tree_)?close\(\s*f?"([^"]*)"', body):
                    counted += 1
                    name = re.sub(r"\{[^{}]*\}", "x", label)
                    assert site.parity_comparison(name), f"{path.name}::{node.name}: {label!r}"
    assert counted >= 60


@pytest.mark.slow
def test_without_a_report_strict_refuses_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(site, "DEFAULT_ERRORS", tmp_path / "none.json")    # a checkout never tested
    status, _, err = run(str(tmp_path / "s"), "--strict")
    assert status == 2 and "warnings and --strict: nothing written" in err
    assert not (tmp_path / "s").exists()
    status, _, err = run(str(tmp_path / "s"))
    assert status == 0 and "no test-errors.json" in err
    assert err.count("no test-errors.json") == 1, "said once for the site, not once per page"
    assert "Not measured: the site was built without" in page(tmp_path / "s", "softmax")
    status, _, err = run(str(tmp_path / "t"), "--errors", str(tmp_path / "none.json"))
    assert status == 2 and f"--errors '{tmp_path / 'none.json'}': no such file" in err
    assert not (tmp_path / "t").exists()


def test_a_bad_report_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    status, _, err = run(str(tmp_path / "s"), "--errors", str(bad))
    assert status == 2 and f"--errors '{bad}' is not a test-errors.json" in err
    bad.write_text("{not json")
    status, _, err = run(str(tmp_path / "s"), "--errors", str(bad))
    assert status == 2 and "is not a test-errors.json" in err


def test_pictures_are_copied_beside_their_page(built):
    text = page(built, "flex_attention")
    for picture in sorted((ROOT / "docs" / "images").glob("flex_mask_*.png")):
        assert f'src="images/{picture.name}"' in text
        assert (built / "images" / picture.name).read_bytes() == picture.read_bytes()
    assert 'src="images/rope_rotation.png"' in page(built, "rope")
    assert "<figcaption>" in text


def lead_ins(op_name):
    """(the end of the paragraph, the first line of the diagram) for each run of lines indented
    four or more in the module docstring that follows a paragraph and holds a line that is not a
    formula: found here by reading the file, independently of the site."""
    source = (ROOT / "numpy_attn" / f"{op_name}.py").read_text()
    first = ast.parse(source).body[0]
    doc = "\n".join(source.splitlines()[first.lineno - 1:first.end_lineno]).strip('"')
    formulas = {line.strip() for line in formula_lines(op_name)}
    found, above = [], None
    for block in re.split(r"\n\s*\n", doc):
        lines = [line for line in block.splitlines() if line.strip()]
        pre = all(line.startswith("    ") for line in lines)
        diagram = [line.strip() for line in lines if line.strip() not in formulas]
        if pre and diagram and above is not None:
            found.append((" ".join(above.replace("`", "").split()[-4:]), diagram[0]))
        above = None if pre else block
    return found


def test_every_picture_keeps_its_caption(built):
    """A diagram of a docstring is shown under the sentence that leads into it (attention's masks:
    "for T = 3 queries and S = 5 keys, 1 where a query may attend:"); a picture of docs/images under
    the caption the repository's Markdown gives it."""
    attention = html.unescape(page(built, "attention"))
    assert re.search(r"<figcaption><code>is_causal</code> is True .*for T = 3 queries and S = 5 keys, 1 where a "
                     r'query may attend:</figcaption><pre class="diagram">top-left \(True, "top_left"\)', attention)
    counted = 0
    for name in docstring_order():
        text = page(built, name)
        figures = [(re.sub(r"<[^>]+>", "", html.unescape(caption)), html.unescape(pre)) for caption, pre in
                   re.findall(r'<figure class="diagram"><figcaption>(.*?)</figcaption><pre class="diagram">(.*?)</pre>',
                              text, flags=re.S)]
        for end, line in lead_ins(name):
            counted += 1
            assert any(caption.endswith(end) and line in pre for caption, pre in figures), (name, end, line)
        for alt, caption in re.findall(r'<figure><img src="[^"]+" alt="([^"]*)"><figcaption>(.*?)</figcaption>', text):
            assert alt == caption and caption, (name, alt)
        for picture in re.findall(r'<img src="images/([^"]+)"', text):
            caption = site.picture_caption(ROOT / "docs" / "images" / picture)
            assert caption != Path(picture).stem.replace("_", " "), f"{name}: {picture} has no caption"
    assert counted >= 4


def worked_example_truth():
    """walkthrough --example source's inputs, and what the attention page's heatmaps should show,
    computed here in float64 from them: {figure title: (values (T, T), masked or None)}."""
    parser = argparse.ArgumentParser()
    walkthrough.add_arguments(parser)
    inputs = walk_steps.prepare(parser.parse_args(["--example", "source"]))
    x = inputs.wte[inputs.ids].astype(np.float64)                      # (T, C)
    q, k, v = (x @ w.astype(np.float64) for w in (inputs.w_query, inputs.w_key, inputs.w_value))
    T, d, nh = len(inputs.ids), inputs.d_out, inputs.num_heads
    after = np.triu(np.ones((T, T), dtype=bool), 1)                    # the keys after each query
    weights = softmax_forward(q @ k.T / np.sqrt(d))[0]
    truth = {f"Step 5: weights = softmax(q k^T / sqrt({d}))": (weights, None),
             "Step 6: the causal mask, weights = softmax(masked scores)":
                 (softmax_forward(np.where(after, -np.inf, q @ k.T / np.sqrt(d)))[0], after)}
    p = {name: {key: a.astype(np.float64) for key, a in inputs.params[name].items()} for name in ("q", "k", "v")}
    hs = inputs.C // nh
    qh, kh = ((x @ p[name]["w"] + p[name]["b"]).reshape(T, nh, hs).swapaxes(0, 1) for name in ("q", "k"))
    for h in range(nh):
        scores = np.where(after, -np.inf, qh[h] @ kh[h].T / np.sqrt(hs))
        truth[f"Step 7: head {h} of {nh}, causal weights"] = (softmax_forward(scores)[0], after)
    dweights = inputs.upstream.astype(np.float64) @ v.T                 # dL/dweights, L = sum(context * G)
    dscores = weights * (dweights - (weights * dweights).sum(axis=1, keepdims=True))
    truth["Step 9: dscores = dL/d(scaled scores)"] = (dscores, None)
    return inputs, truth


@needs_vocab
def test_the_worked_example_shows_each_value_on_hover(built):
    """The attention page draws the worked example as inline SVG: step 5's weights, step 6's causal
    mask, each head of step 7, step 9's dscores; each cell's title gives its query, its key and the
    value the walkthrough prints, here computed independently; masked cells are the keys after
    their query; nothing names a URL, not even SVG's namespace."""
    text = page(built, "attention")
    section = text.split('<h2 id="worked-example">')[1].split("<h2")[0]
    svgs = re.findall(r"<svg\b.*?</svg>", section, flags=re.S)
    inputs, truth = worked_example_truth()
    titles = [ET.fromstring(svg).find("title").text for svg in svgs]
    assert titles == list(truth), titles
    assert inputs.num_heads == 3 and sum("head" in t for t in titles) == 3
    tok = inputs.labels
    assert tok == ["The", "cat", "sat", "on", "the", "mat"]
    for svg, (title, (values, masked)) in zip(svgs, truth.items(), strict=True):
        cells = heatmap_cells(svg)
        assert sorted((q, k) for q, k, *_ in cells) == sorted((q, k) for q in tok for k in tok), title
        for query, key, number, said, *_ in cells:
            i, j = tok.index(query), tok.index(key)
            assert re.fullmatch(r"-?\d\.\d{4}", number), (title, query, key, number)
            # Printed with 4 decimals (half a unit of the last), from float32 numbers: their error
            # against this float64 truth is a few float32 ulps of scores of order 1 (the inputs are
            # the same float32 numbers), below 1e-6, and dscores' factors (G, v) are below 10.
            assert abs(float(number) - values[i, j]) <= 0.5e-4 + 1e-5, (title, query, key, number, values[i, j])
            assert said == (masked is not None and masked[i, j]), (title, query, key)
    assert "xmlns" not in section and "<script" not in section


def test_both_files_side_by_side(built):
    text = {html.unescape(re.sub(r"<[^>]+>", "", line)) for line in page(built, "attention").splitlines()}
    for folder in ("numpy_attn", "torch_attn"):
        for line in (ROOT / folder / "attention.py").read_text().splitlines():
            if line.strip():
                assert line in text, f"{folder}/attention.py: {line!r} missing"


def test_the_page_prose_is_wrapped_by_the_browser(built):
    """Docstring paragraphs are one cell each (wrapped at word boundaries), never one line a cell."""
    text = page(built, "softmax")
    cells = re.findall(r'<td class="code prose">(.*?)</td>', text, flags=re.S)
    assert any("Subtracting the row maximum m" in c and "for log-softmax." in c for c in cells)


def prose_of(text):
    """A page's own prose: without its two files side by side (the source as written), its
    pre-formatted blocks and its code elements."""
    text = text.split('<table class="twins">')[0]
    return re.sub(r"<pre\b.*?</pre>|<code>.*?</code>|<math\b.*?</math>", "", text, flags=re.S)


def test_inline_markup_of_the_docstrings_is_rendered(built):
    """``literal`` and `name` as code, *emphasis*, **strong**, escaped; no backquote left in any
    page's prose; a "*" that is arithmetic stays as written."""
    assert site.inline("learned: ``attn_mask_grad=True``); k") == "learned: <code>attn_mask_grad=True</code>); k"
    assert site.inline("the `selected` rows, a ``<b> & c`` <i>") == \
        "the <code>selected</code> rows, a <code>&lt;b&gt; &amp; c</code> &lt;i&gt;"
    assert site.inline("the root *mean* square, **not** the sum") == \
        "the root <em>mean</em> square, <strong>not</strong> the sum"
    for plain in ("channels i*hs .. (i+1)*hs", "2 * x * y", "a*b and c*d", "x``y``", "`` x``", "* a *"):
        assert site.inline(plain) == html.escape(plain), plain
    assert "the forward had <code>attn_mask_grad=True</code>" in page(built, "attention")
    for path in built.glob("*.html"):
        prose = prose_of(path.read_text(encoding="utf-8"))
        assert "`" not in prose, f"{path.name}: {prose[max(prose.index('`') - 80, 0):prose.index('`') + 80]!r}"


def css_rules(css, within=()):
    """(the at-rules a rule stands in, its selector, its declarations {property: value}) for every
    rule of the style sheet ``css``, comments left out."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules, stack, start = [], [], 0
    for k, char in enumerate(css):
        if char == "{":
            stack.append((css[start:k].strip(), k + 1))
            start = k + 1
        elif char == "}":
            head, body_start = stack.pop()
            if not head.startswith("@"):
                body = css[body_start:k]
                declarations = dict(d.split(":", 1) for d in body.split(";") if ":" in d)
                rules.append((tuple(h for h, _ in stack), head,
                              {name.strip(): value.strip() for name, value in declarations.items()}))
            start = k + 1
    return rules


def narrowest(condition):
    """The width a media condition "(max-width: N px)" applies up to; None if it is not one."""
    match = re.fullmatch(r"@media \(max-width: (\d+)px\)", condition)
    return int(match.group(1)) if match else None


def test_on_a_phone_each_equation_has_its_note_under_it():
    """At 390 px the notes column would be a word wide: below some width each row of the
    equations' table is a block, the note under its formula across the whole width."""
    phone = [(selector, declarations) for within, selector, declarations in css_rules(site.CSS)
             if within and all((narrowest(c) or 0) >= 390 for c in within)]
    blocks = {part.strip() for selector, declarations in phone if declarations.get("display") == "block"
              for part in selector.split(",")}
    assert {"table.eqs", "table.eqs tr", "table.eqs td"} <= blocks, blocks
    wide = [(within, selector) for within, selector, declarations in css_rules(site.CSS)
            if "table.eqs" in selector and declarations.get("display") == "block"]
    assert all(within and all((narrowest(c) or 10**6) < 1000 for c in within) for within, _ in wide), \
        "on a wide screen the notes stay beside their formulas"


def test_the_menu_folds_away_on_a_phone(built):
    """The list of operations is a <details> with a summary that says what it holds, closed in the
    HTML (on a phone it would fill the first screen), the same list of links inside; on a wide
    screen the style sheet shows it open without the summary, where the browser can."""
    count = len(docstring_order())
    for path in built.glob("*.html"):
        nav = path.read_text(encoding="utf-8").split('<nav class="ops">')[1].split("</nav>")[0]
        assert nav.startswith("<details><summary>") and nav.endswith("</ol></details>"), path.name
        summary = nav.split("<summary>")[1].split("</summary>")[0]
        assert f"{count} operations" in summary and "Menu" in summary, summary
        assert len(re.findall(r"<li\b", nav)) == count
    rules = css_rules(site.CSS)
    wide = [(within, selector, declarations) for within, selector, declarations in rules
            if any(c.startswith("@media (min-width") for c in within)]
    assert all("@supports selector(::details-content)" in within for within, _, _ in wide), \
        "a browser without ::details-content keeps the summary"
    assert any(selector == "nav.ops summary" and declarations.get("display") == "none"
               for _, selector, declarations in wide)
    assert any(selector == "nav.ops details::details-content" and declarations.get("content-visibility") == "visible"
               for _, selector, declarations in wide)


# ---------------------------------------------------------------------------------------------
# Writing the folder: DIR is the user's (the module's "Writing" comment says how it is written).

OLD = {"index.html": b"index old", "a.html": b"a old", "style.css": b"css old", "images/p.png": b"png old"}
NEW = {"index.html": b"index new", "b.html": b"b new", "style.css": b"css new", "images/p.png": b"png new",
       "images/q.png": b"png q new"}          # a.html gone (an operation renamed), b.html and q.png new
SITE_NAMES = {*OLD, *NEW, site.MANIFEST}


def manifest_of(files):
    """The manifest a site of ``files`` ({name: bytes}) writes: each file's SHA-256 and name."""
    lines = [f"{hashlib.sha256(files[name]).hexdigest()} {name}" for name in sorted(files)]
    return ("\n".join([site.MANIFEST_HEAD, *lines]) + "\n").encode()


def site_files(folder):
    """{name: bytes} of the site's names present in ``folder`` (the manifest included)."""
    return {n: (Path(folder) / n).read_bytes() for n in SITE_NAMES if (Path(folder) / n).is_file()}


def users_files(folder):
    """What a user keeps in a site's folder: notes, a published site's .git, a file in the site's
    own images folder, one named like the writer's hidden files, a link, an empty folder."""
    folder = Path(folder)
    (folder / "notes.txt").write_text("mine")
    (folder / ".git" / "objects").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/gh-pages\n")
    (folder / ".git" / "objects" / "ab").write_bytes(b"an object")
    (folder / "images").mkdir(exist_ok=True)
    (folder / "images" / "mine.png").write_bytes(b"the user's picture")
    (folder / ".index.html.0123abcd.new").write_text("named like a new file of the writer")
    (folder / "empty").mkdir()
    os.symlink("notes.txt", folder / "notes-link")


def users_part(snap):
    return {p: v for p, v in snap.items() if p not in SITE_NAMES}


def test_a_folder_holding_the_users_files_needs_force_and_keeps_them(tmp_path):
    """The review's case: a notes.txt and a .git added to an earlier site. Refused without
    --force, nothing touched; with --force the site is replaced and every file of the user's kept."""
    out = tmp_path / "site"
    site.write_site(OLD, out)
    assert site_files(out) == {**OLD, site.MANIFEST: manifest_of(OLD)}
    users_files(out)
    before, before_out = snapshot(tmp_path), snapshot(out)
    with pytest.raises(ValueError, match=r"holds files numpy-attn site did not write \(6, such as "
                                         r"'\.git'\); pass --force to write the site beside them"):
        site.write_site(NEW, out)
    assert snapshot(tmp_path) == before
    site.write_site(NEW, out, force=True)
    assert site_files(out) == {**NEW, site.MANIFEST: manifest_of(NEW)}, "a.html, the old site's, is removed"
    assert users_part(snapshot(out)) == users_part(before_out), "a file of the user's changed"
    assert set(snapshot(tmp_path)) - set(before) == {"site/b.html", "site/images/q.png"}


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "index.html").write_text("my own page"), "holds index.html, which numpy-attn site did not write"),
    (lambda d: (d / "images").write_text("a file"), "holds images/p.png, images/q.png, which"),
    (lambda d: os.symlink("elsewhere", d / "b.html"), "holds b.html, which"),
    (lambda d: (d / "style.css").mkdir(), "holds style.css, which"),
    (lambda d: (d / site.MANIFEST).write_text("my notes"), f"holds {site.MANIFEST}, which"),
])
def test_a_file_the_site_did_not_write_is_never_replaced(tmp_path, make, message):
    """At a name the site writes: a file, a folder or a link of the user's is refused even with
    --force; nothing is written."""
    out = tmp_path / "mine"
    out.mkdir()
    make(out)
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match=message + ".*even with --force"):
        site.write_site(NEW, out, force=True)
    assert snapshot(tmp_path) == before


def test_a_file_the_site_wrote_is_not_the_users(tmp_path):
    """A listed page the user put a link or a folder in place of is refused too; a manifest entry
    leading out of DIR (by "..", or through a linked folder) removes nothing."""
    out, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    site.write_site(OLD, out)
    elsewhere.mkdir()
    (elsewhere / "p.png").write_text("the user's, elsewhere")
    (tmp_path / "secret.txt").write_text("the user's, beside")
    (out / site.MANIFEST).write_bytes(manifest_of({**OLD, "../secret.txt": b"the user's, beside",
                                                   "linked/p.png": b"the user's, elsewhere"}))
    os.symlink(elsewhere, out / "linked")
    site.write_site(NEW, out, force=True)
    assert (elsewhere / "p.png").read_text() == "the user's, elsewhere"
    assert (tmp_path / "secret.txt").read_text() == "the user's, beside"
    assert os.readlink(out / "linked") == str(elsewhere)


def test_a_page_the_user_edited_is_the_users(tmp_path):
    """A listed page whose content is no longer what the site wrote (its SHA-256 differs) is the
    user's: refused at a name the new site writes, even with --force; elsewhere kept, with --force."""
    out = tmp_path / "site"
    site.write_site(OLD, out)
    (out / "a.html").write_text("my notes on a")                # a.html: the new site has none
    with pytest.raises(ValueError, match=r"did not write \(1, such as 'a.html'\); pass --force"):
        site.write_site(NEW, out)
    site.write_site(NEW, out, force=True)
    assert (out / "a.html").read_text() == "my notes on a"
    (out / "index.html").write_text("my own index")
    with pytest.raises(ValueError, match="holds a.html, index.html, which numpy-attn site did not write.*"
                                         "even with --force"):
        site.write_site(OLD, out, force=True)
    assert (out / "index.html").read_text() == "my own index"


@pytest.mark.parametrize("where, message", [
    ("file", "is a file, not a folder"), ("dangling link", "is a symlink to .*gone, which does not exist"),
    ("no parent", "DIR .*no/such: the folder .* does not exist"),
])
def test_a_dir_that_cannot_be_a_site_is_named(tmp_path, where, message):
    out = tmp_path / ("no/such" if where == "no parent" else "out")
    if where == "file":
        out.write_text("mine")
    elif where == "dangling link":
        os.symlink(tmp_path / "gone", out)
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match=message):
        site.write_site(NEW, out, force=True)
    assert snapshot(tmp_path) == before


def test_an_earlier_sites_marker_without_a_manifest(tmp_path):
    """An older version's site (its marker lists nothing): the files at the new site's names are
    its own; any other file is kept, and makes --force needed."""
    out = tmp_path / "site"
    out.mkdir()
    for name, data in OLD.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(data)
    (out / site.MANIFEST).write_bytes(site.LEGACY_MARKER)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"did not write \(2, such as 'a.html'\)"):
        site.write_site(NEW, out)
    site.write_site(NEW, out, force=True)
    assert site_files(out) == {**NEW, "a.html": b"a old", site.MANIFEST: manifest_of(NEW)}
    assert (out / "notes.txt").read_text() == "mine"


def test_a_symlinked_dir_stays_a_link(tmp_path):
    real = tmp_path / "store" / "real"
    real.mkdir(parents=True)
    site.write_site(OLD, real)
    os.symlink(real, tmp_path / "link")
    site.write_site(NEW, tmp_path / "link")
    assert os.readlink(tmp_path / "link") == str(real)
    assert sorted(os.listdir(tmp_path)) == ["link", "store"], "nothing left beside the link"
    assert site_files(real) == {**NEW, site.MANIFEST: manifest_of(NEW)}


def test_site_dot_writes_into_the_current_folder(tmp_path, monkeypatch):
    """`numpy-attn site .` (the review's "[Errno 16] Device or resource busy"): the current folder
    is written into, never renamed; one holding other files needs --force, and keeps them."""
    monkeypatch.setattr(site, "build", lambda errors: (NEW, []))
    monkeypatch.chdir(tmp_path)
    ino = os.stat(".").st_ino
    (tmp_path / "notes.txt").write_text("mine")
    status, _, err = run(".")
    assert status == 2 and err == ("numpy-attn site: error: DIR . holds files numpy-attn site did not "
                                   "write (1, such as 'notes.txt'); pass --force to write the site beside "
                                   "them (they are kept as they are), or choose a new or empty folder "
                                   "(nothing was written)\n")
    assert sorted(os.listdir(".")) == ["notes.txt"]
    status, out, err = run(".", "--force")
    assert status == 0 and "wrote ." in out, err
    assert os.stat(os.getcwd()).st_ino == ino and (tmp_path / "notes.txt").read_text() == "mine"
    assert site_files(".") == {**NEW, site.MANIFEST: manifest_of(NEW)}
    status, _, err = run(".")
    assert status == 2 and "such as 'notes.txt'" in err, "an earlier site with the user's files"


def test_the_help_names_force():
    parser = cli.build_parser()
    text = parser._subparsers._group_actions[0].choices["site"].format_help()
    assert "--force" in text and "kept as they are" in " ".join(text.split())


CASES = ["earlier site", "symlinked DIR", "DIR .", "first site", "no hard links", "no earlier site"]


def _no_links(src, dst):
    raise PermissionError(1, "this file system has no hard links")


def _setup(base, case):
    """(the DIR argument, the folder it is, the site's files there before) for ``case``."""
    real = base / "store" / "real"
    real.parent.mkdir(parents=True)
    (base / "store" / "beside.txt").write_text("beside the site's folder")
    if case == "first site":
        return str(real), real, {}
    real.mkdir()
    if case != "no earlier site":
        site.write_site(OLD, real)
    users_files(real)
    if case == "symlinked DIR":
        os.symlink(real, base / "link")
    out = {"symlinked DIR": str(base / "link"), "DIR .": "."}.get(case, str(real))
    return out, real, site_files(real)


def _check_after(base, real, before, old, hit, where, cwd=None):
    """The site's names hold ``old`` or the new site whole; every other entry under ``base`` is
    as in ``before``, but the one thing an interrupted clean-up (unlink, rmdir) was to remove
(``hit``'s path, relative to ``cwd`` where it is relative)."""
    new = {**NEW, site.MANIFEST: manifest_of(NEW)}
    got = site_files(real) if real.is_dir() else {}
    assert got in (old, new), f"{where}: a mixture {sorted(got)}"
    prefix = os.path.relpath(real, base)
    after = {p: v for p, v in snapshot(base).items()
             if os.path.relpath(p, prefix).replace(os.sep, "/") not in SITE_NAMES or not p.startswith(prefix)}
    before = {p: v for p, v in before.items()
              if os.path.relpath(p, prefix).replace(os.sep, "/") not in SITE_NAMES or not p.startswith(prefix)}
    left = {p: v for p, v in after.items() if before.get(p) != v}
    cut = hit is not None and hit[0] in ("unlink", "rmdir")
    if cut:
        path = os.path.realpath(os.path.join(cwd or base, hit[1][0]))
        left.pop(os.path.relpath(path, os.path.realpath(base)), None)
    for folder in (prefix, os.path.join(prefix, "images")):
        # The site's folders, made for the first site: there with it, or where their removal was cut.
        if folder in left and left[folder][0] == "folder" and (got or cut):
            del left[folder]
    assert not left, f"{where}: entries added or changed: {sorted(left)}"
    assert not set(before) - set(after), f"{where}: the user's entries {sorted(set(before) - set(after))} are gone"


@pytest.mark.parametrize("case", CASES)
def test_an_interruption_at_every_step_keeps_every_file(tmp_path, monkeypatch, case):
    """KeyboardInterrupt instead of the k-th file-system call of a write, for every k until one
    completes: the user's files are untouched, and the site is the old one or the new one whole."""
    k = 0
    while True:
        k += 1
        base = tmp_path / str(k)
        out, real, old = _setup(base, case)
        before = snapshot(base)
        with monkeypatch.context() as m:
            m.chdir(real if case == "DIR ." else base)
            if case == "no hard links":
                m.setattr(os, "link", _no_links)
            interrupter = Interrupter(m, k)
            try:
                site.write_site(NEW, out, force=True)
                done = True
            except KeyboardInterrupt:
                done = False
        where = f"{case}, interrupted at call {k} ({interrupter.hit and interrupter.hit[0]})"
        _check_after(base, real, before, old, interrupter.hit, where, real if case == "DIR ." else base)
        if case == "symlinked DIR":
            assert os.readlink(base / "link") == str(real), where
        if not done:
            site.write_site(NEW, real, force=True)             # and the next write works
            assert site_files(real) == {**NEW, site.MANIFEST: manifest_of(NEW)}, where
        if done:
            break
    kinds = {name for name, _ in interrupter.calls}
    assert {"open", "write", "fsync", "replace", "close"} <= kinds, kinds
    assert "link" in kinds or case in ("first site", "no hard links", "no earlier site"), kinds
    assert k > 20, f"only {k - 1} file-system calls: the harness does not see the write"


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_at_every_step_is_held_until_the_site_is_whole(tmp_path, monkeypatch, signame):
    """The signal sent at the k-th file-system call, for every k: held from the first file written
    to the manifest's rename, then acting (Ctrl-C raises KeyboardInterrupt, SIGTERM and SIGHUP
    SystemExit, as `numpy-attn site` sets them); sent before, the old site stays whole."""
    signum = getattr(signal, signame)
    exc = KeyboardInterrupt if signame == "SIGINT" else SystemExit
    real_kill = os.kill
    k, held, calls = 0, [], []
    with default_signals():
        while True:
            k += 1
            base = tmp_path / str(k)
            out, real, old = _setup(base, "earlier site")
            before = snapshot(base)
            raised = None
            with monkeypatch.context() as m, checkpoint.termination_raises():
                unheld = signal.getsignal(signum)

                def send(unheld=unheld):
                    held.append(signal.getsignal(signum) != unheld)
                    real_kill(os.getpid(), signum)

                interrupter = Interrupter(m, k, act=send)
                try:
                    site.write_site(NEW, out, force=True)
                    time.sleep(0.05)                    # a signal sent arrives by now at the latest
                except exc as err:
                    raised = err
            if interrupter.hit is None:
                assert raised is None
                break
            calls.append(interrupter.hit[0])
            where = f"{signame} before call {k} ({interrupter.hit[0]})"
            assert raised is not None, f"{where} was lost"
            new = {**NEW, site.MANIFEST: manifest_of(NEW)}
            assert site_files(real) == new if held[-1] else site_files(real) in (old, new), where
            _check_after(base, real, before, old, None, where)
    # Held from the first file written to the last rename: unheld are only the checks' reads and
    # the lock before (its mkdir of DIR, which exists), and the lock's release after.
    pattern = "".join("h" if h else "-" for h in held)
    assert k > 20 and re.fullmatch("-+h+-?", pattern), pattern
    assert {calls[i] for i in range(pattern.index("h"))} <= {"builtin open", "mkdir", "open"}, calls


SUBPROCESS = """
import os, signal, sys
from attn_cli import cli, site
site.build = lambda errors: ({new!r}, [])
calls, real_replace = [], os.replace
def replace(src, dst):
    calls.append(dst)
    if len(calls) == int(sys.argv[2]):
        os.kill(os.getpid(), getattr(signal, sys.argv[3]))
    return real_replace(src, dst)
os.replace = replace
sys.exit(cli.main(["site", sys.argv[1], "--force"]))
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_to_numpy_attn_site_between_its_renames(tmp_path, signame):
    """A real process sent the signal at each of its renames in turn: it ends by the signal once
    the new site is whole (status 128 + the signal; Ctrl-C as Python ends on KeyboardInterrupt),
    nothing left beside DIR or in it, the user's files kept."""
    signum = getattr(signal, signame)
    renames = len(NEW) + 1                          # the pages and the manifest (a.html is unlinked)
    for k in range(1, renames + 1):
        base = tmp_path / str(k)
        out, real, old = _setup(base, "earlier site")
        before = snapshot(base)
        with default_signals():
            result = subprocess.run([sys.executable, "-c", SUBPROCESS.format(new=NEW), out, str(k), signame],
                                    capture_output=True, text=True, cwd=ROOT, timeout=120,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
        status = -signal.SIGINT if signame == "SIGINT" else 128 + signum
        assert result.returncode == status, (k, result.returncode, result.stderr[-2000:])
        assert site_files(real) == {**NEW, site.MANIFEST: manifest_of(NEW)}, k
        _check_after(base, real, before, old, None, f"{signame} at rename {k}")


@pytest.mark.slow
def test_the_suite_writes_the_report_the_site_reads():
    """A run of the suite (here one test of test_softmax.py) writes test-errors.json, whose rows
    name their test file: the softmax page shows them. The run replaces the rows of the files it
    measured and keeps the others' (a partial run never erases the site's measurements), dropping
    rows of test files that no longer exist. The checkout's own reports are put back afterwards,
    byte for byte."""
    import os
    import subprocess
    import sys

    reports = {name: (ROOT / name).read_bytes() if (ROOT / name).is_file() else None
               for name in ("test-errors.json", "test-errors.txt")}
    earlier = [dict(test_file="parity_tests/test_linear.py", name="linear.marker", dtype="float64",
                    max_abs_error=1.5e-300, tolerance_used=0.25),
               dict(test_file="parity_tests/test_softmax.py", name="softmax.stale", dtype="float64",
                    max_abs_error=2.5e-300, tolerance_used=0.5),
               dict(test_file="parity_tests/test_gone.py", name="gone.x", dtype="float64",
                    max_abs_error=1e-16, tolerance_used=0.1)]
    try:
        (ROOT / "test-errors.json").write_text(json.dumps(earlier))
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 "parity_tests/test_softmax.py", "-k", "test_forward_matches_twin"],
                                capture_output=True, text=True, cwd=ROOT, timeout=300,
                                env={**os.environ, "HYPOTHESIS_PROFILE": "default"})
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        rows = site.read_errors(ROOT / "test-errors.json")
    finally:
        for name, content in reports.items():
            if content is None:
                (ROOT / name).unlink(missing_ok=True)
            else:
                (ROOT / name).write_bytes(content)
    softmax = [r for r in rows if r["test_file"] == "parity_tests/test_softmax.py"]
    assert softmax and earlier[1] not in softmax, "the run's rows replace the file's earlier ones"
    assert [r for r in rows if r["test_file"] != "parity_tests/test_softmax.py"] == [earlier[0]], \
        "another file's row is kept as it was, a vanished file's dropped"
    op = next(o for o in show.operations() if o.name == "softmax")
    assert site.errors_of(op, softmax)[0]["name"].startswith(("softmax", "log_softmax"))
