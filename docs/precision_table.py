"""The table of docs/precision.md that says how close each operation comes to FlashAttention's rule.

Every low-precision test of the suite calls ``assert_error_budget(op, dtype, tensors)``
(parity_tests/helpers.py), directly or through a helper, and carries ``@pytest.mark.error_budget``
(the conftest fails a test that has one without the other). assert_error_budget records, per
(op, tensor, dtype), the largest multiple of PyTorch's own low-precision error ours reached; a
pytest run of every budget test writes them to test-precision.json, and checks that the page has a
row for each op and dtype recorded and none for another. This script renders that file into the
section of docs/precision.md between the two marker comments: one row per operation and dtype, in
the reading order of the test files that checked them, the forward's multiple and the largest over
its gradients, for numpy_attn (``op[numpy]``) and for its torch twin (``op[twin]``).

    python docs/precision_table.py [--run] [--json FILE] [--page FILE]

``--run`` first runs ``pytest -m error_budget`` in the derandomised ``ci`` profile with one thread,
which writes test-precision.json; then the section is rewritten.
Without it the section is rendered from the FILE a run left (default: test-precision.json in the
checkout). Nothing but the section changes, and the page is replaced whole or not at all.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "precision.md"
JSON = ROOT / "test-precision.json"
BEGIN = "<!-- precision-table: begin (written by docs/precision_table.py) -->"
END = "<!-- precision-table: end -->"
DTYPES = ("float16", "bfloat16")
HEADER = ("| op | dtype | numpy: out | numpy: largest gradient | twin: out | twin: largest gradient |\n"
          "|---|---|---|---|---|---|")
NONE = "—"          # no multiple: PyTorch's error was 0 in every drawn case (ours then within one ulp)
# The environment of the run the committed table comes from: the CI profile, one thread.
RUN_ENV = {"CI": "true", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class TableError(ValueError):
    """The run's records cannot make the table (a file unread, an op without rows)."""


# ---- the table -----------------------------------------------------------------------------------

def reading_order():
    """numpy_attn's file stems in the reading order its docstring gives."""
    text = (ROOT / "numpy_attn" / "__init__.py").read_text(encoding="utf-8")
    block = text.split("Reading order, leaf to root:", 1)[1].split("\n\n", 2)[1]
    return [line.split()[0] for line in block.splitlines() if line.strip()]


WHO = ("numpy", "twin")
_WHO_LABEL = re.compile(r"\[(numpy|twin)\]")
KEYS = {"op", "tensor", "dtype", "multiple", "test_file"}


def split_label(label):
    """"gelu[tanh][twin]" -> ("gelu[tanh]", "twin"): the op, and the implementation the label
    names in brackets (numpy_attn's where it names none)."""
    found = _WHO_LABEL.search(label)
    return " ".join(_WHO_LABEL.sub("", label, count=1).split()), found[1] if found else "numpy"


def read_records(path):
    """The rows test-precision.json holds: [{"op", "tensor", "dtype", "multiple", "test_file"}]."""
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise TableError(f"cannot read {path}: {err.strerror or err} (run the budget tests first: --run)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TableError(f"{path} is not JSON: {err}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(r) == KEYS for r in rows):
        raise TableError(f"{path} is not a list of {sorted(KEYS)} records, as the conftest writes")
    return rows


def ops_in_order(records):
    """The ops the records name, each once: in the reading order of the test file that checked
    each (test_<stem>.py; files of no stem after the others), then by name."""
    order = {stem: i for i, stem in enumerate(reading_order())}
    where = {}
    for r in records:
        stem = Path(r["test_file"]).stem.removeprefix("test_")
        key = (order.get(stem, len(order)), r["test_file"])
        op = split_label(r["op"])[0]
        where[op] = min(where.get(op, key), key)
    return sorted(where, key=lambda op: (where[op], op))


def _cell(found, gradients):
    """The largest multiple over the forward's outputs or over the gradients (tensors named d...),
    with the tensor that reached it (left out for the forward's usual "out")."""
    mine = {name: value for name, value in found.items() if name.startswith("d") == gradients and value is not None}
    if not mine:
        return NONE
    name = max(mine, key=mine.get)
    return f"{mine[name]:.2f}" + ("" if name == "out" else f" ({name})")


def render(records):
    """The section's table: a row per op the records name and dtype, in ops_in_order. TableError
    names the ops with no record in a dtype, and those with no multiple in one (PyTorch's error 0
    in every case: nothing to measure ours against)."""
    multiples = {}                                 # (op, dtype, who) -> {tensor: multiple or None}
    for r in records:
        op, who = split_label(r["op"])
        multiples.setdefault((op, r["dtype"], who), {})[r["tensor"]] = r["multiple"]
    ops = ops_in_order(records)
    missing = [f"{op} ({dtype})" for op in ops for dtype in DTYPES
               if not any((op, dtype, who) in multiples for who in WHO)]
    if missing:
        raise TableError(f"no records for: {', '.join(missing)} (did every budget test run?)")
    lines, unmeasured = [HEADER], []
    for op in ops:
        for dtype in DTYPES:
            cells = [_cell(multiples.get((op, dtype, who), {}), gradients)
                     for who in WHO for gradients in (False, True)]
            unmeasured += [f"{op} ({dtype})"] if set(cells) == {NONE} else []
            lines.append("| " + " | ".join([op, dtype] + cells) + " |")
    if unmeasured:
        raise TableError(f"PyTorch's error was 0 in every case of: {', '.join(unmeasured)} (no multiple to show)")
    return "\n".join(lines)


def page_rows(page):
    """The (op, dtype) of every row of ``page``'s section between BEGIN and END."""
    section = _section(page)[1]
    return [tuple(cell.strip() for cell in line.strip().split("|")[1:3]) for line in section.strip().splitlines()[2:]]


def page_problems(records, page):
    """What the section of ``page`` lacks for ``records`` (a run of every budget test), and the
    rows it holds of ops they do not name: "" where the rows are the records' ops and dtypes."""
    recorded = {(split_label(r["op"])[0], r["dtype"]) for r in records}
    shown = set(page_rows(page))
    missing, stale = sorted(recorded - shown), sorted(shown - recorded)
    return "; ".join([f"{what}: {', '.join(f'{op} ({dtype})' for op, dtype in rows)}" for what, rows in (
        ("no row for", missing), ("rows that no budget test records", stale)) if rows])


def _section(page):
    """(before, section, after): ``page`` split at BEGIN and END; TableError unless each marker
    appears once, BEGIN first."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise TableError(f"the page must hold {BEGIN!r} once, then {END!r} once")
    head, rest = page.split(BEGIN)
    section, tail = rest.split(END)
    return head, section, tail


def replace_section(page, table):
    """``page`` with the text between BEGIN and END replaced by ``table``; TableError unless
    each marker appears once, BEGIN first."""
    head, _, tail = _section(page)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def write_page(path, text):
    """Write ``text`` to ``path`` through a temporary file renamed over it: an interruption
    leaves the old page whole and no temporary behind."""
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(partial, path)
    finally:
        Path(partial).unlink(missing_ok=True)


def run_budget_tests():
    """Run every test marked error_budget in the ci profile on one thread; the exit status of
    pytest. Its conftest writes the records to test-precision.json in the checkout."""
    env = {**os.environ, **RUN_ENV}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "error_budget",
                           "--precision-table-run"], cwd=ROOT, env=env).returncode


def main(argv=None):
    parser = argparse.ArgumentParser(description="Render test-precision.json (the multiples of PyTorch's "
                                     "low-precision error the suite's budget tests reached) into docs/precision.md.")
    parser.add_argument("--run", action="store_true",
                        help="first run every budget test (CI profile, one thread), which writes --json")
    parser.add_argument("--json", type=Path, default=JSON, help=f"the records (default {JSON})")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page to rewrite (default {PAGE})")
    args = parser.parse_args(argv)
    if not args.page.is_file():
        parser.error(f"--page {str(args.page)!r}: no such file")
    if args.run and args.json != JSON:
        parser.error(f"--run writes {JSON}: --json names another file to read instead, so pass one of the two")
    if args.run:
        JSON.unlink(missing_ok=True)       # a run that writes none must not leave an older one read
        if run_budget_tests() != 0:
            sys.exit("the budget tests failed: the page is left as it was")
    try:
        page = replace_section(args.page.read_text(encoding="utf-8"), render(read_records(args.json)))
    except TableError as err:
        sys.exit(f"{err}; the page is left as it was")
    write_page(args.page, page)
    print(f"wrote the table of multiples into {args.page}")


if __name__ == "__main__":
    main()
