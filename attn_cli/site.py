"""The ``numpy-attn site`` command: a static site to study the operations from, one page per
operation in the reading order (numpy_attn's docstring, as ``show --list``).

Each page gives the module's equations typeset (MathML, from the docstring's formula lines),
its diagrams as written, the backward step by step (the backward's comments, each over the lines
it explains), the largest errors the parity suite measured between the operation and PyTorch
(parity_comparison says which comparisons those are), its pictures from
docs/images, and the NumPy file beside the torch file, lines paired as ``numpy-attn show`` pairs
them. The attention page also draws the walkthrough's worked example as heatmaps in inline SVG
(attn_cli/plots.py, heatmap_svg), each cell's value shown on hover.

Why a generator of our own rather than Sphinx or MkDocs: it is grown from ``show --html`` and
reuses its pairing, so the site and ``show`` cannot disagree; it needs no new dependency; and it
is offline by construction: no script at all, one local style sheet, the system's fonts, and
equations in MathML, which the browser typesets itself (no MathJax to fetch).

The errors come from ``test-errors.json``, which every run of the parity suite writes
(``parity_tests/conftest.py``, ERROR_JSON): run ``python -m pytest`` first. Without it, or for an
operation it does not cover, the page says so and a warning is printed; ``--strict`` turns
warnings into an error (CI builds with it).
"""

import argparse
import ast
import contextlib
import hashlib
import html
import json
import os
import re
import stat
import sys
from pathlib import Path

from attn_cli import mathml, plots, show, term, tokenizer, walk_steps, walkthrough
from attn_cli.checkpoint import (
    check_folder_path,
    file_sha256,
    signals_held,
    termination_raises,
    write_files,
    writer_lock,
)

ROOT = show.NUMPY_DIR.parent
IMAGES = ROOT / "docs" / "images"
DEFAULT_ERRORS = ROOT / "test-errors.json"   # where python -m pytest writes it in a checkout
MANIFEST = ".numpy-attn-site"        # in DIR: the files this command wrote there (see write_site)
MANIFEST_HEAD = "written by numpy-attn site; its files, which it alone replaces or removes:"
LEGACY_MARKER = b"written by numpy-attn site\n"   # the marker of versions without a manifest
_MANIFEST_BYTES = 1 << 20
# Pictures of docs/images that belong to an operation, beyond those named after it ("rope_*.png").
PICTURES = {"attention": ["walkthrough_step5_weights.png"], "multi_head": ["walkthrough_step7_heads.png"],
            "gpt": ["train_loss.png"], "flex_attention": ["flex_mask_*.png"],
            "flash_attention": ["flash_attention_*.png"], "softcap": ["attention_patterns.png"]}


# ---------------------------------------------------------------------------------------------
# What a page shows, read from the files.

def docstring_parts(op):
    """(summary, formula lines, diagrams, backward paragraphs) of the NumPy module's docstring. A
    formula line is a pre-formatted line with an "=" (not code); a diagram is a run of the other
    pre-formatted lines (code too), as (its text, its caption or None); a backward paragraph is one
    that starts with "Backward".

    A diagram's caption is the sentence that leads into it: the last of the paragraph just above
    the pre-formatted lines it stands in ("for T = 3 queries and S = 5 keys, 1 where a query may
    attend:"), given to the first diagram among them."""
    source = op.numpy_path.read_text(encoding="utf-8")
    lines, roles = source.splitlines(), show.line_roles(source)
    first = ast.parse(source).body[0]
    span = range(first.lineno - 1, first.end_lineno)
    formulas, diagrams, paragraphs = [], [], {}
    above, lead = (None, None), None        # the last line's (role, paragraph) that was not blank
    for k in span:
        role, number = roles[k]
        text = lines[k].strip().strip('"').strip()
        if role == "pre" and above[0] != "pre":
            lead = above[1] if above[0] == "prose" else None
        # A formula stands on one line; a line whose brackets do not close is a piece of a call
        # written over several lines (a usage example), so code.
        balanced = text.count("(") == text.count(")") and text.count("[") == text.count("]")
        if role == "pre" and "=" in text and "np." not in text and "#" not in text and balanced:
            formulas.append(text)
        elif role == "pre":
            if diagrams and diagrams[-1][1] == k - 1:
                diagrams[-1] = (diagrams[-1][0] + [lines[k]], k, diagrams[-1][2])
            else:
                diagrams.append(([lines[k]], k, lead))
                lead = None
        elif role == "prose":
            paragraphs.setdefault(number, []).append(text)
        if text:
            above = (role, number)
    texts = {number: " ".join(words) for number, words in paragraphs.items()}
    summary = next(iter(texts.values()), op.name)
    backward = [t[t.index("Backward"):] for t in texts.values() if "Backward" in t]     # from that word on
    blocks = []
    for block, _, number in diagrams:
        indent = min(len(x) - len(x.lstrip()) for x in block)
        caption = None if number is None else last_sentence(texts[number])
        blocks.append(("\n".join(x[indent:] for x in block), caption))
    return summary, formulas, blocks, backward


def last_sentence(paragraph):
    """The paragraph's last sentence (one starts after a full stop and a space, with a capital,
    a quote, a bracket or markup)."""
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`\"'(*])", paragraph)[-1]


def backward_steps(op):
    """For each ``*_backward`` function of the NumPy module: (name, docstring, steps), a step
    being (the comment's text, the code lines under it until the next comment)."""
    source = op.numpy_path.read_text(encoding="utf-8")
    lines = source.splitlines()
    out = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.FunctionDef) and node.name.endswith("_backward")):
            continue
        doc = ast.get_docstring(node) or ""
        start = node.body[0].end_lineno if doc else node.body[0].lineno - 1    # after the docstring
        steps, comment, code = [], [], []
        for line in lines[start:node.end_lineno]:
            stripped = line.strip()
            if stripped.startswith("#"):
                if code or not comment:
                    if comment or code:
                        steps.append((" ".join(comment), code))
                    comment, code = [], []
                comment.append(stripped.lstrip("#").strip())
            elif stripped:
                code.append(line)
        if comment or code:
            steps.append((" ".join(comment), code))
        out.append((node.name, " ".join(doc.split()), steps))
    return out


def read_errors(path):
    """The rows of a test-errors.json (parity_tests/conftest.py), checked; None if it is absent."""
    if path is None or not Path(path).is_file():
        return None
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"--errors {str(path)!r} is not a test-errors.json: {err}") from None
    keys = {"test_file", "name", "dtype", "max_abs_error", "tolerance_used"}
    if not isinstance(rows, list) or not all(isinstance(r, dict) and keys <= set(r) for r in rows):
        raise ValueError(f"--errors {str(path)!r} is not a test-errors.json: rows with {sorted(keys)} expected")
    return rows


# test-errors.json holds every comparison the suite made; an operation's largest errors are drawn
# from its parity comparisons only, those that set a result against PyTorch's. The suite's labels
# (parity_tests/helpers.py, assert_close) say which: a bare tensor path ("sdpa.dq", "mha.dparams.q.w",
# "flex.dk (alibi)") is NumPy's result against the twin's or against autograd's gradient through it,
# and a label with " vs " names its reference after it, PyTorch's where it starts with PYTORCH_REFERENCE.
# Any other comparison is with something that is not PyTorch (finite differences, a computation by
# hand, digits typed in from a tutorial, the float64 truth of a low-precision run, the same code run
# another way) or checks a property ("softmax row sums"): its error says nothing about agreeing with
# PyTorch, and its dtype is not always the computation's ("its truth within float32 noise": bfloat16
# results compared in float64). Unknown labels are left out rather than let in.
BARE_PATH = re.compile(r"[\w{}=.\-]+(\[[^\[\]]*\])?[\w{}=.\-]*")
PYTORCH_REFERENCE = re.compile(
    r"(the )?twin|autograd|builtins?|built-ins|builtin, .*"            # the twin; PyTorch's own function
    r"|F\.\w+.*|nn\.\w+|torch\.(?!rand|manual_seed)\w+.*|TransformerEncoderLayer|sdpa|flex_attention"
    r"|transformers\b.*|Gemma \d.*|gpt-oss eager|LlamaRotaryEmbedding|ROPE_INIT_FUNCTIONS|DynamicCache"
    r"|\w+ (causal_conv1d_fn|causal_conv1d_update|l2norm)")         # transformers' and fla's, by model


def parity_comparison(name):
    """Whether the comparison labelled ``name`` sets a result against PyTorch's (see above)."""
    _, vs, reference = name.rpartition(" vs ")
    if not vs:
        return BARE_PATH.fullmatch(re.sub(r" \([^()]*\)$", "", name)) is not None
    # The reference, or a tensor of it: "vs autograd.layers.0.w" (assert_tree_close), "vs DynamicCache.k[0] step 1".
    return re.match(rf"(?:{PYTORCH_REFERENCE.pattern})(?=$|[.\[ ,(])", reference) is not None


def errors_of(op, rows):
    """The parity comparisons measured by the operation's test file, closest to their tolerance
    first."""
    mine = [r for r in rows if Path(r["test_file"]).name == f"test_{op.name}.py" and parity_comparison(r["name"])]
    return sorted(mine, key=lambda r: -r["tolerance_used"])


def pictures_of(op, images=IMAGES):
    """docs/images files of the operation: named after it, or listed in PICTURES."""
    if not images.is_dir():
        return []
    patterns = [f"{op.name}_*.png"] + PICTURES.get(op.name, [])
    found = {p for pattern in patterns for p in images.glob(pattern)}
    return sorted(found)


def picture_caption(path):
    """The alt text the repository's Markdown gives the picture, else its name in words."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.is_file():
            match = re.search(r"!\[([^\]]+)\]\([^)]*" + re.escape(path.name) + r"\)", page.read_text(encoding="utf-8"))
            if match:
                return match.group(1)
    return path.stem.replace("_", " ")


# ---------------------------------------------------------------------------------------------
# Pages.

# The docstrings' inline reStructuredText: ``literal`` and `name` (the default role, which they use
# for names) as code, **strong**, *emphasis*. As in reStructuredText, markup starts after a space,
# an opening bracket or quote (or the start) and ends before a space, punctuation (or the end),
# with no space just inside it: so ``i*hs .. (i+1)*hs`` or ``2 * x`` stay as written.
_BEFORE, _AFTER = r"(?<![^\s'\"(\[{<\-/:])", r"(?=$|[\s'\")\]}>\-/:.,;!?])"
INLINE = re.compile(_BEFORE + r"(?:``(?P<literal>\S|\S.*?\S)``|`(?P<name>[^`\s]|[^`\s][^`]*?[^`\s])`"
                    r"|\*\*(?P<strong>[^*\s]|[^*\s][^*]*?[^*\s])\*\*|\*(?P<em>[^*\s]|[^*\s][^*]*?[^*\s])\*)" + _AFTER)
INLINE_TAGS = {"literal": "code", "name": "code", "strong": "strong", "em": "em"}


def inline(text):
    """Docstring prose as HTML: escaped, its inline markup (INLINE) as tags."""
    out, pos = [], 0
    for match in INLINE.finditer(text):
        kind = match.lastgroup
        tag = INLINE_TAGS[kind]
        out += [html.escape(text[pos:match.start()]), f"<{tag}>{html.escape(match.group(kind))}</{tag}>"]
        pos = match.end()
    return "".join(out) + html.escape(text[pos:])


CSS = """
body { margin: 0; color: #1f2328; background: #fff; font: 16px/1.55 system-ui, -apple-system,
       "Segoe UI", Roboto, "Noto Sans", sans-serif; }
a { color: #0b5cad; }
header.top { background: #24292f; color: #fff; padding: 0.6em 1.5em; display: flex; gap: 1.5em;
             align-items: baseline; flex-wrap: wrap; }
header.top a { color: #fff; text-decoration: none; } header.top .home { font-weight: 700; }
header.top .step { margin-left: auto; color: #d0d7de; }
div.layout { display: grid; grid-template-columns: 14em minmax(0, 1fr); }
nav.ops { border-right: 1px solid #d0d7de; padding: 1em 0.8em; font-size: 14px; }
nav.ops ol { margin: 0; padding-left: 1.8em; } nav.ops li { margin: 0.15em 0; }
nav.ops li.here a { font-weight: 700; color: #1f2328; text-decoration: none; }
main { padding: 1.2em 2em 3em 2em; max-width: 78em; }
h1 { margin: 0.2em 0 0.1em 0; font-size: 1.9em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #d0d7de; }
p.summary { font-size: 1.1em; color: #424a53; margin-top: 0.2em; }
table.eqs { border-collapse: collapse; margin: 0.5em 0; }
table.eqs td { padding: 0.25em 1em 0.25em 0; vertical-align: middle; }
table.eqs td.note { color: #57606a; font-size: 0.95em; } span.gap { display: inline-block; width: 1.5em; }
math { font-size: 1.15em; }
td.eq math { display: inline math; math-style: normal; }   /* left in its cell, sums full size */
pre.diagram, pre.code { background: #f6f8fa; padding: 0.6em 0.9em; border-radius: 6px;
                        overflow-x: auto; font: 13px/1.45 ui-monospace, Menlo, Consolas, monospace; }
ol.steps > li { margin-bottom: 0.8em; } ol.steps pre.code { margin: 0.3em 0 0 0; }
table.errors { border-collapse: collapse; font-size: 14px; }
table.errors th, table.errors td { border-bottom: 1px solid #d0d7de; padding: 0.3em 0.8em; text-align: left; }
table.errors td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.errors td code { overflow-wrap: anywhere; }   /* a long label wraps, the numbers never */
div.scroll { overflow-x: auto; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #d0d7de; }
figcaption { color: #57606a; font-size: 0.95em; }
figure.diagram pre.diagram { margin: 0.3em 0 0 0; }   /* under the sentence that leads into it */
div.heatmaps { display: flex; flex-wrap: wrap; gap: 0 2em; align-items: flex-start; }
div.heatmaps figure { flex: 0 1 24em; min-width: 0; }   /* side by side while they fit, else one a row */
ol.index > li { margin: 0.35em 0; } .muted { color: #57606a; }
footer.pager { display: flex; justify-content: space-between; margin-top: 2.5em; }
nav.ops summary { cursor: pointer; font-weight: 600; padding: 0.2em 0; }
nav.ops details[open] summary { margin-bottom: 0.5em; }
main { overflow-wrap: break-word; }   /* a long name (torch.nn.functional...) wraps on a phone */
@media (max-width: 900px) {
  div.layout { display: block; }
  nav.ops { border-right: none; border-bottom: 1px solid #d0d7de; padding: 0.6em 1em; }
  nav.ops ol { columns: 4; }
  main { padding: 1em; }
}
@media (max-width: 520px) {
  nav.ops ol { columns: 2; }
  table.errors th, table.errors td { padding: 0.3em 0.35em; }
  /* The header in two lines, not four: the name and the page's place, the motto under them. */
  header.top { padding: 0.5em 1em; gap: 0.2em 1em; }
  header.top .tagline { order: 1; flex-basis: 100%; font-size: 0.85em; color: #d0d7de; }
}
/* The menu is a <details>, closed: on a phone its 30-odd entries would fill the first screen. On
   a wide screen, where it stands beside the page, it is always open, its summary hidden; a
   browser that cannot style ::details-content keeps the summary to open it by. */
@supports selector(::details-content) {
  @media (min-width: 901px) {
    nav.ops summary { display: none; }
    nav.ops details::details-content { content-visibility: visible; display: block; }
  }
}
/* Narrow: each equation's note goes under it, the whole width, not in a column one word wide. */
@media (max-width: 700px) {
  table.eqs, table.eqs tbody, table.eqs tr, table.eqs td { display: block; }
  table.eqs tr { margin-bottom: 0.6em; }
  table.eqs td { padding: 0; }
  table.eqs td.eq { overflow-x: auto; }
  table.eqs td.note { padding-left: 1.5em; }
  table.eqs td.note:empty { display: none; }
}
""" + show.TWINS_CSS


def _page(title, body, ops, here=None, step=""):
    nav = "".join(f'<li{" class=here" if op.name == here else ""}><a href="{op.name}.html">{op.name}</a></li>'
                  for op in ops)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(title)}</title><link rel="stylesheet" href="style.css"></head><body>\n'
            '<header class="top"><a class="home" href="index.html">numpy-attn</a>'
            '<span class="tagline">every operation twice: NumPy with its backward by hand, PyTorch with autograd</span>'
            f'<span class="step">{step}</span></header>\n'
            f'<div class="layout"><nav class="ops"><details><summary>Menu: the {len(ops)} operations</summary>'
            f'<ol>{nav}</ol></details></nav>\n<main>\n{body}\n</main></div>\n'
            "</body></html>\n")


def _equations(formulas, warnings, op):
    """A table of the formula lines: the formulas typeset in the first column, notes in words in
    the second."""
    rows = []
    for line in formulas:
        maths, notes = [], []
        for text, is_math in mathml.segments(line):
            if not is_math:
                notes.append(inline(text))
                continue
            try:
                maths.append(mathml.to_mathml(text))
            except ValueError as err:
                warnings.append(f"{op.name}: a formula shown as text ({err})")
                maths.append(f"<code>{html.escape(text)}</code>")
        rows.append(f'<tr><td class="eq">{"<span class=gap></span>".join(maths)}</td>'
                    f'<td class="note">{"; ".join(notes)}</td></tr>')
    return f'<table class="eqs">{"".join(rows)}</table>' if rows else ""


def _errors_table(op, rows, warnings):
    if rows is None:   # build() has said so once
        return ('<p class="muted">Not measured: the site was built without <code>test-errors.json</code>; '
                "run <code>python -m pytest</code>, then build the site again.</p>")
    test_file = f"parity_tests/test_{op.name}.py"
    measured = sum(Path(r["test_file"]).name == f"test_{op.name}.py" for r in rows)
    mine = errors_of(op, rows)
    if not mine:
        if measured:
            warnings.append(f"{op.name}: test-errors.json holds no comparison with PyTorch from {test_file}")
            return (f'<p class="muted">Not measured in this run: <code>{test_file}</code> compared nothing '
                    "with PyTorch (run the whole file).</p>")
        warnings.append(f"{op.name}: test-errors.json holds nothing from {test_file}")
        return f'<p class="muted">Not measured in this run: <code>{test_file}</code> did not run.</p>'
    by_dtype = {}
    for r in mine:
        if r["max_abs_error"] >= by_dtype.get(r["dtype"], {"max_abs_error": -1})["max_abs_error"]:
            by_dtype[r["dtype"]] = r
    lead = "; ".join(f"{html.escape(dtype)}: <b>{r['max_abs_error']:.2e}</b> (<code>{html.escape(r['name'])}</code>)"
                     for dtype, r in sorted(by_dtype.items()))
    table = "".join(f"<tr><td><code>{html.escape(r['name'])}</code></td><td>{html.escape(r['dtype'])}</td>"
                    f'<td class="n">{r["max_abs_error"]:.2e}</td><td class="n">{r["tolerance_used"]:.1%}</td></tr>'
                    for r in mine[:8])
    others = measured - len(mine)
    return (f"<p>Largest absolute error against PyTorch, by dtype: {lead}.</p>"
            f"<p>The comparisons with PyTorch (its built-ins, the twin, autograd) of <code>{test_file}</code> "
            f"that came closest to their tolerance ({len(mine)} in all"
            + (f"; its {others} other comparisons, against finite differences, a computation by hand or a "
               "property, are not about agreeing with PyTorch and are left out" if others else "") + "):</p>"
            '<div class="scroll"><table class="errors"><tr><th>compared</th><th>dtype</th><th>largest |error|</th>'
            f"<th>share of its tolerance</th></tr>{table}</table></div>")


def _backward_section(op, paragraphs):
    parts = [f"<p>{inline(p)}</p>" for p in paragraphs]
    for name, doc, steps in backward_steps(op):
        parts.append(f"<h3><code>{name}</code></h3>")
        if doc:
            parts.append(f"<p>{inline(doc)}</p>")
        items = []
        for comment, code in steps:
            text = f"<p>{inline(comment)}</p>" if comment else ""
            indent = min((len(x) - len(x.lstrip()) for x in code), default=0)
            block = f'<pre class="code">{html.escape(chr(10).join(x[indent:] for x in code))}</pre>' if code else ""
            items.append(f"<li>{text}{block}</li>")
        parts.append(f'<ol class="steps">{"".join(items)}</ol>')
    if len(parts) == 0:
        parts.append(f'<p class="muted">{op.name} has no backward of its own here: its derivative is '
                     "taken where it is used, or it has no parameters to learn.</p>")
    return "".join(parts)


def worked_example(warnings):
    """The walkthrough's worked example (``walkthrough --example source``) as heatmaps in inline
    SVG, NumPy's numbers: step 5's weights, step 6's causal weights (the masked cells grey), each
    head of step 7, step 9's gradient dscores. Each cell gives its value on hover, written as the
    walkthrough prints it."""
    parser = argparse.ArgumentParser()
    walkthrough.add_arguments(parser)
    args = parser.parse_args(["--example", "source"])
    try:
        inputs = walk_steps.prepare(args)
    except tokenizer.TokenizerUnavailable as err:
        warnings.append(f"attention: no worked example ({err})")
        return ('<p class="muted">Not drawn: the worked example needs GPT-2\'s vocabulary '
                "(set <code>TIKTOKEN_CACHE_DIR</code>), then build the site again.</p>")
    r = walk_steps.pipeline(walk_steps.NumpySide(), inputs)
    tok, precision = inputs.labels, walkthrough.DECIMALS[inputs.dtype.name]
    hidden = ~r["s6_mask"]                                       # (T, T), True above the diagonal
    nh, hs = inputs.num_heads, inputs.C // inputs.num_heads
    figures = [(f"Step 5: weights = softmax(q k^T / sqrt({inputs.d_out}))", r["s5_weights"], None, False),
               ("Step 6: the causal mask, weights = softmax(masked scores)", r["s6_weights"], hidden, False),
               *((f"Step 7: head {h} of {nh}, causal weights", r["mh_weights"][0, h], hidden, False)
                 for h in range(nh)),
               ("Step 9: dscores = dL/d(scaled scores)", r["s9_dscores"], None, True)]
    svgs = "".join("<figure>" + _inline(plots.heatmap_svg(values, tok, tok, title=title, masked=masked,
                                                          signed=signed, precision=precision)) + "</figure>"
                   for title, values, masked, signed in figures)
    return (f"<p>The numbers of <code>numpy-attn walkthrough --example source</code>, {html.escape(repr(inputs.text))} "
            f"with the source's typed-in embeddings and weights, computed by <code>numpy_attn</code> "
            f"({inputs.dtype.name}). Rest the pointer on a cell for its value, with the {precision} decimals "
            "the walkthrough prints: a row is a query, a column the key it attends to. Weights run from 0 "
            "(dark) to 1 (yellow); grey cells are masked, keys after the query; the gradient is red where "
            f"positive and blue where negative. Step 7 splits the {inputs.C} channels into {nh} heads of size {hs}, "
            "each with its own weights.</p>"
            f'<div class="heatmaps">{svgs}</div>')


def _inline(svg):
    """An SVG document as an element of the page. Within HTML the parser puts <svg> in SVG's
    namespace, so the namespace's URI (a name, never fetched) is left out: no page names a URL."""
    return svg.replace(' xmlns="http://www.w3.org/2000/svg"', "", 1)


def op_page(op, ops, rows, warnings, images=IMAGES):
    """One operation's page, and the pictures it shows (to copy beside it)."""
    k = [o.name for o in ops].index(op.name)
    summary, formulas, diagrams, backward = docstring_parts(op)
    pictures = pictures_of(op, images)
    body = [f"<h1>{op.name}</h1>", f'<p class="summary">{inline(summary)}</p>',
            f"<p><code>{op.numpy_path.relative_to(ROOT)}</code>: {', '.join(op.numpy_functions)}<br>"
            f"<code>{op.torch_path.relative_to(ROOT)}</code>: {', '.join(op.torch_functions)} "
            "(autograd supplies the backward)</p>"]
    if formulas or diagrams:
        body.append("<h2>The equations</h2>" + _equations(formulas, warnings, op))
        body += [f'<figure class="diagram"><figcaption>{inline(caption)}</figcaption>'
                 f'<pre class="diagram">{html.escape(d)}</pre></figure>' if caption else
                 f'<pre class="diagram">{html.escape(d)}</pre>' for d, caption in diagrams]
    body.append("<h2>The backward, step by step</h2>" + _backward_section(op, backward))
    body.append("<h2>Measured by the parity suite</h2>" + _errors_table(op, rows, warnings))
    if op.name == "attention":
        body.append('<h2 id="worked-example">The worked example, cell by cell</h2>' + worked_example(warnings))
    if pictures:
        body.append("<h2>Pictures</h2>" + "".join(
            f'<figure><img src="images/{p.name}" alt="{html.escape(picture_caption(p))}">'
            f"<figcaption>{html.escape(picture_caption(p))}</figcaption></figure>" for p in pictures))
    body.append("<h2>NumPy beside torch</h2><p>Left, the NumPy file; right, its twin. <code>=</code>: the same "
                "line once NumPy's spellings are turned into torch's; <code>~</code>: a line that mirrors "
                "the other.</p>" + show.html_twins(op))
    previous = (f'<a href="{ops[k - 1].name}.html">&larr; {ops[k - 1].name}</a>' if k
                else '<a href="index.html">&larr; index</a>')
    following = f'<a href="{ops[k + 1].name}.html">{ops[k + 1].name} &rarr;</a>' if k + 1 < len(ops) else ""
    body.append(f'<footer class="pager">{previous}{following}</footer>')
    return _page(f"{op.name}: numpy-attn", "\n".join(body), ops, op.name, f"{k + 1} of {len(ops)}"), pictures


def index_page(ops, rows):
    described = dict(show.reading_list())
    items = []
    for op in ops:
        worst = ""
        if rows is not None and errors_of(op, rows):
            top = errors_of(op, rows)[0]
            worst = f' <span class="muted">(closest to its tolerance: {top["tolerance_used"]:.0%})</span>'
        items.append(f'<li><a href="{op.name}.html"><b>{op.name}</b></a>: '
                     f"{inline(described.get(op.name, ''))}{worst}</li>")
    body = ("<h1>The operations, leaf to root</h1>"
            "<p>Each building block of a Transformer is written twice: in <code>numpy_attn</code>, pure NumPy "
            "with a backward written by hand, and in <code>torch_attn</code>, plain PyTorch whose backward "
            "autograd supplies. The parity suite proves them equal. Read the pages in this order: each "
            "operation uses only those above it.</p>"
            "<p>On each page: the equations, the backward step by step, the largest errors the parity "
            "suite measured against PyTorch, pictures where there are some, and the two files side by side.</p>"
            f'<ol class="index">{"".join(items)}</ol>'
            '<p class="muted">Written by <code>numpy-attn site</code>; nothing on these pages is fetched '
            "from the network.</p>")
    return _page("numpy-attn: the operations", body, ops, step=f"{len(ops)} operations")


def build(errors_path=None, images=IMAGES):
    """The site as {relative path: bytes or source Path}, and the warnings met."""
    ops = show.operations()
    rows = read_errors(errors_path)
    warnings, files = [], {"style.css": CSS.encode()}
    if rows is None:   # said once for the site, not once per page
        warnings.append("no test-errors.json, so no page shows measured errors: run python -m pytest (the "
                        "whole suite, or the test files of the pages you want), then build the site again")
    files["index.html"] = index_page(ops, rows).encode()
    for op in ops:
        page, pictures = op_page(op, ops, rows, warnings, images)
        files[f"{op.name}.html"] = page.encode()
        files.update({f"images/{p.name}": p for p in pictures})
    return files, warnings


# ---------------------------------------------------------------------------------------------
# Writing. DIR is the user's folder: a new one, an earlier site, a published site's checkout with
# its .git, the current folder, a symlink to a folder elsewhere. So DIR itself is never renamed,
# replaced or removed (a symlink stays one: the site goes into its target), and the command owns
# only the files it wrote there, which the manifest DIR/.numpy-attn-site lists, one a line (the
# SHA-256 of its content, a space, its relative path) under a first line that says what it is:
#
# - a file the manifest lists, still holding what the site wrote (its SHA-256), is the site's:
#   it is replaced by the new page of its name, or removed when the new site has none (an
#   operation renamed), and nothing else ever is;
# - any other entry (a notes.txt, a .git, a page the user wrote or edited) is the user's: a DIR
#   holding one is refused without --force, and with --force the site is written beside them,
#   all kept;
# - a file the new site would write at a name the manifest does not list (the user's own
#   index.html), or a name the site needs that is a folder, a link, or under a linked folder, is
#   refused even with --force: move it away or choose another DIR;
# - an earlier site with the manifest-less marker of older versions (which wrote DIR whole and
#   refused any other folder) owns the files at the names the new site writes, no others.
#
# The files go in through attn_cli/checkpoint.py's write_files, as train's do: each written whole to
# a hidden file beside its name and flushed to disk, then renamed over its name with SIGINT,
# SIGTERM and SIGHUP held, the manifest last, every change undone if a step fails. So after any
# exception or signal the site's names hold the whole old site or the whole new one, and every
# entry of the user's is as it was. (A kill no code sees, SIGKILL, during the renames leaves new
# pages the old manifest does not list: the next run refuses them, as the user's, until removed.)
# A second writer of DIR is refused by train's lock (flock on DIR); a missing DIR is created, and
# removed again if nothing was written into it.

def _manifest(out):
    """{relative path: SHA-256} of the files DIR's manifest lists; None if it has no manifest;
    "legacy" for the marker of versions without one."""
    path = os.path.join(out, MANIFEST)
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MANIFEST_BYTES:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data == LEGACY_MARKER:
        return "legacy"
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None
    if not lines or lines[0] != MANIFEST_HEAD:
        return None
    listed = dict(line.partition(" ")[::2][::-1] for line in lines[1:])
    return {name: digest for name, digest in listed.items() if _is_relative(name)}


def _is_relative(name):
    """Whether ``name`` is a plain relative path inside DIR (no "..", no absolute path)."""
    parts = name.split("/")
    return bool(name) and all(p not in ("", ".", "..") for p in parts) and "\\" not in name


def _regular_inside(out, name):
    """Whether DIR/``name`` is a regular file whose folders below DIR are real folders (no link
    on the way: a link could lead out of DIR to files of the user's)."""
    path = out
    for part in name.split("/")[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path) or not os.path.isdir(path):
            return False
    try:
        return stat.S_ISREG(os.lstat(os.path.join(out, name)).st_mode)
    except OSError:
        return False


def _folders(names):
    """Every folder (relative path) that holds one of ``names``."""
    return {"/".join(n.split("/")[:k]) for n in names for k in range(1, n.count("/") + 1)}


def check_folder(out, names, force):
    """The files of DIR ``out`` that are the site's own (the manifest's, that exist) and that the
    new site (``names``) lacks, to remove; ValueError naming DIR if the site may not be written
    there (see above)."""
    if not check_folder_path(out, "DIR"):
        return []
    listed = _manifest(out)
    if listed == "legacy":
        own = {n for n in names if n != MANIFEST and _regular_inside(out, n)}
    else:
        own = {n for n, digest in (listed or {}).items()
               if _regular_inside(out, n) and file_sha256(os.path.join(out, n)) == digest}
    if listed is not None:
        own.add(MANIFEST)
    taken = [n for n in names if n not in own and _blocked(out, n)]
    if taken:
        raise ValueError(f"DIR {out} holds {', '.join(taken[:3])}{' and more' if len(taken) > 3 else ''}, "
                         "which numpy-attn site did not write (or which is not a regular file); it "
                         "never replaces such a file, even with --force: move it away or choose "
                         "another DIR (nothing was written)")
    others = _others(out, "", own, _folders([*own, *names]))
    if others and not force:
        raise ValueError(f"DIR {out} holds files numpy-attn site did not write ({len(others)}, such as "
                         f"{others[0]!r}); pass --force to write the site beside them (they are kept "
                         "as they are), or choose a new or empty folder (nothing was written)")
    return sorted(own - set(names))


def _blocked(out, name):
    """Whether writing DIR/``name`` would replace something: the name, or a folder on its way
    that is not a real folder, exists."""
    path = out
    for part in name.split("/")[:-1]:
        path = os.path.join(path, part)
        if os.path.lexists(path) and (os.path.islink(path) or not os.path.isdir(path)):
            return True
    return os.path.lexists(os.path.join(out, name))


def _others(out, prefix, own, folders):
    """Every entry under DIR/``prefix`` that is not the site's: not a file of ``own``, and not one
    of the site's ``folders`` (looked into instead)."""
    found = []
    for entry in sorted(os.listdir(os.path.join(out, prefix) if prefix else out)):
        name = f"{prefix}{entry}"
        path = os.path.join(out, name)
        if name in own:
            continue
        if name in folders and os.path.isdir(path) and not os.path.islink(path):
            found += _others(out, f"{name}/", own, folders)
        else:
            found.append(name)
    return found


def write_site(files, out, force=False):
    """Write the site ``files`` ({relative path: bytes, or a Path to copy}) into the folder ``out``
    as said above; never beside files of the user's without ``force``."""
    out = os.fspath(out)
    files = {name: content.read_bytes() if isinstance(content, Path) else content
             for name, content in files.items()}
    if MANIFEST in files or not all(map(_is_relative, files)):
        raise ValueError(f"a site's file names are plain relative paths, {MANIFEST} not among them")
    names = sorted(files) + [MANIFEST]
    check_folder(out, names, force)                          # before taking the lock
    with writer_lock(out, "numpy-attn site", "DIR"), signals_held():
        stale = check_folder(out, names, force)              # again, now that it is ours
        files[MANIFEST] = manifest(files)
        # The pages, then the old pages the new site lacks, then the manifest: a kill that no
        # code sees (SIGKILL) in the middle leaves a manifest listing only files the site wrote.
        write_files(out, files, [*(n for n in sorted(files) if n != MANIFEST), *stale, MANIFEST])
        for folder in sorted(_folders(stale) - _folders(files), reverse=True):
            with contextlib.suppress(OSError):               # emptied by the old pages' removal
                os.rmdir(os.path.join(out, *folder.split("/")))


def manifest(files):
    """The manifest of the site ``files`` ({relative path: bytes})."""
    lines = [f"{hashlib.sha256(data).hexdigest()} {name}" for name, data in sorted(files.items())]
    return "\n".join([MANIFEST_HEAD, *lines]).encode() + b"\n"


# ---------------------------------------------------------------------------------------------

HELP = "a static site of every operation, to study from offline"

EXAMPLES = """examples:
  python -m pytest && numpy-attn site site     the suite, then the site with its errors
  numpy-attn site site --strict                 warnings are errors (as in CI)
  numpy-attn site ../pages --force              into a published site's checkout; its .git is kept
  chromium site/index.html                      read it; nothing is fetched
"""


def add_arguments(p):
    term.describe(p, ("Write a static site to DIR: an index and one page per operation in the reading "
                     "order, each with the equations typeset, the backward step by step, the largest "
                     "errors the parity suite measured (test-errors.json, written by python -m pytest), "
                     "the pictures of docs/images (and on attention's page the worked example's heatmaps, "
                     "each value shown on hover), and the NumPy file beside the torch file. No script, no "
                     "font, nothing fetched. DIR is written into, never replaced: the command replaces "
                     "or removes only the files it wrote there (listed in DIR/.numpy-attn-site), all at "
                     "once, and keeps every other file."), EXAMPLES)
    p.add_argument("out", metavar="DIR", help="folder to write (new, empty, an earlier site, or with --force "
                   "one holding other files; a symlink's target)")
    p.add_argument("--force", action="store_true",
                   help="write the site into a DIR that holds files it did not write (a notes.txt, a "
                        "published site's .git); they are kept as they are, never replaced or removed")
    p.add_argument("--errors", metavar="FILE", default=None,
                   help="the parity suite's test-errors.json (default: the checkout's, written by python -m "
                        "pytest, if there is one)")
    p.add_argument("--strict", action="store_true",
                   help="treat warnings (no errors measured for an operation, a formula left as text) as errors")


def run(args, out=None):
    out = sys.stdout if out is None else out
    if args.errors is not None and not Path(args.errors).is_file():
        raise ValueError(f"--errors {args.errors!r}: no such file (python -m pytest writes test-errors.json)")
    check_folder(args.out, [MANIFEST], args.force)     # before the pages are built
    files, warnings = build(DEFAULT_ERRORS if args.errors is None else args.errors)
    for warning in warnings:
        print(f"numpy-attn site: warning: {warning}", file=sys.stderr)
    if warnings and args.strict:
        raise ValueError(f"{len(warnings)} warnings and --strict: nothing written")
    with termination_raises():                         # SIGTERM, SIGHUP: the lock released, all undone
        write_site(files, args.out, args.force)
    pages = sum(name.endswith(".html") for name in files)
    print(f"wrote {args.out} ({pages} pages; open {Path(args.out) / 'index.html'})", file=out)
    return 0
