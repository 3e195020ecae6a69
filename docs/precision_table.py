"""The table of docs/precision.md that says how close each operation comes to FlashAttention's rule.

Every low-precision test of the suite calls ``assert_error_budget(op, dtype, tensors)``
(parity_tests/helpers.py), which records, per (op, tensor, dtype), the largest multiple of
PyTorch's own low-precision error ours reached; the conftest writes them to test-precision.json
at the end of a pytest run. This script renders that file into the section of docs/precision.md
between the two marker comments: one row per operation and dtype, the forward's multiple and the
largest over its gradients, for numpy_attn (``op[numpy]``) and for its torch twin (``op[twin]``).

    python docs/precision_table.py [--run] [--json FILE] [--page FILE]

``--run`` first runs every test that calls assert_error_budget (found in parity_tests/*.py), in
the derandomised ``ci`` profile with one thread, which writes test-precision.json; then the
section is rewritten.
Without it the section is rendered from the FILE a run left (default: test-precision.json in the
checkout). Nothing but the section changes, and the page is replaced whole or not at all.
"""

import argparse
import ast
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
TESTS = ROOT / "parity_tests"
BEGIN = "<!-- precision-table: begin (written by docs/precision_table.py) -->"
END = "<!-- precision-table: end -->"
DTYPES = ("float16", "bfloat16")
WHO = ("numpy", "twin")
HEADER = ("| op | dtype | numpy: out | numpy: largest gradient | twin: out | twin: largest gradient |\n"
          "|---|---|---|---|---|---|")
NONE = "—"          # no multiple: PyTorch's error was 0 in every drawn case (ours then within one ulp)
# The environment of the run the committed table comes from: the CI profile, one thread.
RUN_ENV = {"CI": "true", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class TableError(ValueError):
    """The run's records cannot make the table (a file unread, an op without rows)."""


# ---- the op names the suite passes to assert_error_budget, from its sources ----------------

def reading_order():
    """numpy_attn's file stems in the reading order its docstring gives."""
    text = (ROOT / "numpy_attn" / "__init__.py").read_text(encoding="utf-8")
    block = text.split("Reading order, leaf to root:", 1)[1].split("\n\n", 2)[1]
    return [line.split()[0] for line in block.splitlines() if line.strip()]


def _label_prefix(text):
    """"softcap[numpy]" -> "softcap": the op, without the implementation in brackets."""
    return text.split("[", 1)[0].strip()


def _resolve(expr, function, functions, depth=2):
    """The op names ``expr`` (the first argument of an assert_error_budget call inside
    ``function``) can take: a string, an f-string that starts with one, or a parameter of
    ``function`` whose callers in the module pass one of those. None when it cannot be read."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {_label_prefix(expr.value)}
    if isinstance(expr, ast.JoinedStr) and expr.values:
        head = expr.values[0]
        if isinstance(head, ast.Constant) and "[" in head.value:
            return {_label_prefix(head.value)}
        if isinstance(head, ast.FormattedValue) and len(expr.values) > 1 and isinstance(expr.values[1], ast.Constant) \
                and expr.values[1].value.startswith("["):
            return _resolve(head.value, function, functions, depth)
        return None
    if isinstance(expr, ast.Name) and function is not None and depth > 0:
        params = [a.arg for a in function.args.posonlyargs + function.args.args]
        if expr.id not in params:
            return None
        index, names = params.index(expr.id), set()
        callers = [(caller, call) for caller in functions for call in ast.walk(caller)
                   if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == function.name]
        for caller, call in callers:
            passed = next((k.value for k in call.keywords if k.arg == expr.id), None)
            passed = passed if passed is not None else (call.args[index] if index < len(call.args) else None)
            found = _resolve(passed, caller, functions, depth - 1) if passed is not None else None
            if found is None:
                return None
            names |= found
        return names or None
    return None


def budget_calls(folder=TESTS):
    """Every assert_error_budget call in ``folder``'s test files: [(op name or None, "file:line",
    node ids of the tests that make it)], in the reading order of the files and then by line. An
    op name is None where the call's first argument cannot be read from the source."""
    order = {stem: i for i, stem in enumerate(reading_order())}
    files = sorted(folder.glob("test_*.py"), key=lambda p: (order.get(p.stem[5:], len(order)), p.name))
    found = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
        for function in functions:
            for call in ast.walk(function):
                if not (isinstance(call, ast.Call) and call.args and getattr(call.func, "id", getattr(
                        call.func, "attr", None)) == "assert_error_budget"):
                    continue
                names = _resolve(call.args[0], function, functions)
                where = f"{path.relative_to(folder.parent)}:{call.lineno}"
                tests = _tests_reaching(function, functions, path.relative_to(folder.parent))
                found += [(name, where, tests) for name in sorted(names)] if names else [(None, where, tests)]
    return found


def _tests_reaching(function, functions, path):
    """Node ids of the module's test functions that are ``function`` or call it (through its
    other functions)."""
    reached, todo = set(), [function.name]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo += [f.name for f in functions for call in ast.walk(f)
                 if isinstance(call, ast.Call) and getattr(call.func, "id", None) == name]
    return sorted(f"{path}::{name}" for name in reached if name.startswith("test_"))


def budget_ops(folder=TESTS):
    """The op names passed to assert_error_budget, in reading order, each once."""
    return list(dict.fromkeys(name for name, _, _ in budget_calls(folder) if name))


# ---- the table -----------------------------------------------------------------------------------

def read_records(path):
    """The rows test-precision.json holds: [{"op", "tensor", "dtype", "multiple"}]."""
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise TableError(f"cannot read {path}: {err.strerror or err} (run the budget tests first: --run)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TableError(f"{path} is not JSON: {err}") from None
    keys = {"op", "tensor", "dtype", "multiple"}
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(r) == keys for r in rows):
        raise TableError(f"{path} is not a list of {sorted(keys)} records, as the conftest writes")
    return rows


def _split_label(label):
    """"softcap[twin]" -> ("softcap", "twin"); a label without brackets is numpy_attn's."""
    match = re.fullmatch(r"(.*)\[(\w+)\]", label)
    return (match[1], match[2]) if match else (label, "numpy")


def _cell(found, gradients):
    """The forward's multiple, or the largest over the gradients with the tensor that reached it."""
    if not gradients:
        return f"{found['out']:.2f}" if "out" in found else NONE
    grads = {name: value for name, value in found.items() if name != "out"}
    if not grads:
        return NONE
    name = max(grads, key=grads.get)
    return f"{grads[name]:.2f} ({name})"


def render(records, ops):
    """The section's table: a row per op of ``ops`` (in that order, then any other op the
    records name) and dtype. TableError names the ops with no record in a dtype."""
    multiples = {}                                 # (op, dtype, who) -> {tensor: multiple}
    for r in records:
        op, who = _split_label(r["op"])
        multiples.setdefault((op, r["dtype"], who), {})[r["tensor"]] = r["multiple"]
    named = list(dict.fromkeys([*ops, *sorted({op for op, _, _ in multiples})]))
    missing = [f"{op} ({dtype})" for op in named for dtype in DTYPES
               if not any((op, dtype, who) in multiples for who in WHO)]
    if missing:
        raise TableError(f"no records for: {', '.join(missing)} (did every budget test run?)")
    lines = [HEADER]
    for op in named:
        for dtype in DTYPES:
            cells = [op, dtype] + [_cell(multiples.get((op, dtype, who), {}), gradients)
                                   for who in WHO for gradients in (False, True)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_section(page, table):
    """``page`` with the text between BEGIN and END replaced by ``table``; ValueError unless
    each marker appears once, BEGIN first."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise TableError(f"the page must hold {BEGIN!r} once, then {END!r} once")
    head, rest = page.split(BEGIN)
    return f"{head}{BEGIN}\n{table}\n{END}{rest.split(END, 1)[1]}"


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
    """Run every test that calls assert_error_budget in the ci profile on one thread; the exit
    status of pytest. Its conftest writes the records to test-precision.json in the checkout."""
    tests = sorted({test for _, _, ids in budget_calls() for test in ids})
    env = {**os.environ, **RUN_ENV}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                          env=env).returncode


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
    unread = [where for name, where, _ in budget_calls() if name is None]
    if unread:
        sys.exit("cannot read the op name of assert_error_budget at " + ", ".join(unread)
                 + ": pass a string, an f-string starting with the op, or a parameter given one")
    if args.run and args.json != JSON:
        parser.error(f"--run writes {JSON}: --json names another file to read instead, so pass one of the two")
    if args.run and run_budget_tests() != 0:
        sys.exit("the budget tests failed: the page is left as it was")
    try:
        page = replace_section(args.page.read_text(encoding="utf-8"), render(read_records(args.json), budget_ops()))
    except TableError as err:
        sys.exit(f"{err}; the page is left as it was")
    write_page(args.page, page)
    print(f"wrote the table of multiples into {args.page}")


if __name__ == "__main__":
    main()
