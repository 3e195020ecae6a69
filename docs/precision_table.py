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


WHO = ("numpy", "twin")
_WHO_LABEL = re.compile(r"\[(numpy|twin)\]")
# In an op name read from the source, the part no literal fixes (an f-string field drawn by
# Hypothesis, say): any text there. Alone in brackets it may also be the implementation's
# [numpy] or [twin], which a name leaves out, so the brackets may be absent too.
ANY, _ANY_BRACKETED = "\x00", "\x01"


def matches(pattern, op):
    """Whether the op name ``op`` of a run fits ``pattern``, an op name read from the source."""
    parts = re.split(f"({ANY}|{_ANY_BRACKETED})", pattern.replace(f"[{ANY}]", _ANY_BRACKETED))
    regex = "".join({ANY: ".*", _ANY_BRACKETED: r"(\[[^\]]*\])?"}.get(part, re.escape(part)) for part in parts)
    return re.fullmatch(regex, op) is not None


def shown(pattern):
    """An op name read from the source, for a message: "rope[*]"."""
    return pattern.replace(ANY, "*")


def split_label(label):
    """"gelu[tanh][twin]" -> ("gelu[tanh]", "twin"): the op, and the implementation the label
    names in brackets (numpy_attn's where it names none)."""
    found = _WHO_LABEL.search(label)
    return " ".join(_WHO_LABEL.sub("", label, count=1).split()), found[1] if found else "numpy"


def _assigned(name, module):
    """The value a module-level ``name = ...`` assigns, or None."""
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    return None


def _collection(expr, module, function=None):
    """The constants a literal collection (or a dict's keys, or sorted/list/tuple of one, or a
    name bound to one in ``function`` or the module) holds; None when it is not that. A dict bound
    in ``function`` also gets the constant keys the function stores into it (``d["k"] = ...``)."""
    if isinstance(expr, ast.Name):
        local = [node for node in ast.walk(function) if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == expr.id for t in node.targets)] if function else []
        bound = local[0].value if len(local) == 1 else None if local else _assigned(expr.id, module)
        found = None if bound is None else _collection(bound, module)
        if found is not None and local and isinstance(bound, ast.Dict):
            stored = [t.slice for node in ast.walk(function) if isinstance(node, ast.Assign) for t in node.targets
                      if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == expr.id]
            if not all(isinstance(key, ast.Constant) for key in stored):
                return None
            found += [key.value for key in stored if key.value not in found]
        return found
    if isinstance(expr, ast.Call) and getattr(expr.func, "id", None) in ("sorted", "list", "tuple") and expr.args:
        return _collection(expr.args[0], module, function)
    items = expr.keys if isinstance(expr, ast.Dict) else expr.elts if isinstance(
        expr, ast.Tuple | ast.List | ast.Set) else None
    if items is None or not all(isinstance(item, ast.Constant) for item in items):
        return None
    return [item.value for item in items]


def _strategy(expr, module):
    """The values of a ``st.sampled_from(collection)`` (or a module-level name bound to one)."""
    if isinstance(expr, ast.Name):
        bound = _assigned(expr.id, module)
        return None if bound is None else _strategy(bound, module)
    if isinstance(expr, ast.Call) and getattr(expr.func, "attr", getattr(expr.func, "id", None)) == "sampled_from":
        return _collection(expr.args[0], module) if expr.args else None
    return None


def _parametrized(name, function, module):
    """The values ``name`` takes from the function's loops, pytest parametrize and Hypothesis
    given decorators; None when none of them binds it."""
    for node in ast.walk(function):
        if isinstance(node, ast.For):
            names = [node.target] if isinstance(node.target, ast.Name) else getattr(node.target, "elts", [])
            index = next((i for i, t in enumerate(names) if isinstance(t, ast.Name) and t.id == name), None)
            if index is None:
                continue
            over = node.iter
            if isinstance(over, ast.Call) and getattr(over.func, "attr", None) == "items" and index == 0:
                return _collection(over.func.value, module, function)
            if isinstance(node.target, ast.Name):
                return _collection(over, module, function)
            rows = getattr(over, "elts", None)             # for a, b in ((1, 2), (3, 4))
            if rows is None or not all(isinstance(row, ast.Tuple) and len(row.elts) == len(names) for row in rows):
                return None
            cells = [row.elts[index] for row in rows]
            return [c.value for c in cells] if all(isinstance(c, ast.Constant) for c in cells) else None
    for decorator in function.decorator_list:
        if not isinstance(decorator, ast.Call):
            continue
        kind = getattr(decorator.func, "attr", getattr(decorator.func, "id", None))
        if kind == "parametrize" and len(decorator.args) == 2 and isinstance(decorator.args[0], ast.Constant):
            names = [n.strip() for n in decorator.args[0].value.split(",")]
            if name in names:
                rows = getattr(decorator.args[1], "elts", None)
                if rows is None:
                    return _collection(decorator.args[1], module) if len(names) == 1 else None
                cells = [row if len(names) == 1 else row.elts[names.index(name)] for row in rows]
                return [c.value for c in cells] if all(isinstance(c, ast.Constant) for c in cells) else None
        if kind == "given":
            drawn = next((k.value for k in decorator.keywords if k.arg == name), None)
            if drawn is not None:
                return _strategy(drawn, module)
    return None


def _values(expr, function, functions, module, depth=2):
    """Every value ``expr`` can take inside ``function``, as far as the source says; None when it
    cannot be read: constants, f-strings of readable parts, names bound by a loop over a literal,
    by parametrize or given, or a parameter every caller in the module passes a readable value."""
    if isinstance(expr, ast.Constant):
        return {expr.value}
    if isinstance(expr, ast.JoinedStr):
        texts = {""}
        for part in expr.values:
            if isinstance(part, ast.Constant):
                texts = {t + part.value for t in texts}
                continue
            spec = "".join(v.value for v in part.format_spec.values) if part.format_spec else ""
            found = _values(part.value, function, functions, module, depth)
            texts = {t + (ANY if found is None else format(value, spec)) for t in texts for value in found or [0]}
        # Only wildcards and punctuation left: nothing to match a table row by.
        return texts if all(re.search(r"\w", t.replace(ANY, "")) for t in texts) else None
    if not isinstance(expr, ast.Name) or function is None:
        return None
    found = _parametrized(expr.id, function, module)
    if found is not None:
        return set(found)
    params = [a.arg for a in function.args.posonlyargs + function.args.args]
    if expr.id not in params or depth == 0:
        return None
    index, names = params.index(expr.id), set()
    for caller in functions:
        for call in ast.walk(caller):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == function.name):
                continue
            passed = next((k.value for k in call.keywords if k.arg == expr.id), None)
            passed = passed if passed is not None else (call.args[index] if index < len(call.args) else None)
            found = None if passed is None else _values(passed, caller, functions, module, depth - 1)
            if found is None:
                return None
            names |= found
    return names or None


def budget_functions(folder=TESTS):
    """assert_error_budget and the helpers of ``folder``'s modules that pass their first parameter
    on to it as the op's name (a test file may import one from another), by name."""
    names = {"assert_error_budget"}
    for path in sorted(folder.glob("*.py")):
        names |= {node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if _passes_op_on(node)}
    return names


def _passes_op_on(function, names=("assert_error_budget",)):
    """Whether ``function`` calls one of ``names`` with its own first parameter as the op."""
    if not isinstance(function, ast.FunctionDef) or not function.args.args or function.name.startswith("test_"):
        return False
    first = function.args.args[0].arg
    return any(_calls(call, set(names)) and isinstance(_op_argument(call), ast.Name) and _op_argument(call).id == first
               for call in ast.walk(function))


def _calls(node, names):
    """Whether ``node`` is a call of a function called one of ``names`` that passes an op."""
    return isinstance(node, ast.Call) and _op_argument(node) is not None and getattr(
        node.func, "id", getattr(node.func, "attr", None)) in names


def _op_argument(call):
    """The op name a budget call passes: its first argument, or its keyword ``op``."""
    return call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "op"), None)


def budget_calls(folder=TESTS):
    """Every call of assert_error_budget (or of a shared helper that passes its op on to it) in
    ``folder``'s test files: [(op name or None, "file:line", node ids of the tests that make it)],
    in the reading order of the files and then by line. An op name is None where the call's first
    argument cannot be read from the source; ANY stands for a part of it the source leaves open."""
    order = {stem: i for i, stem in enumerate(reading_order())}
    files = sorted(folder.glob("test_*.py"), key=lambda p: (order.get(p.stem[5:], len(order)), p.name))
    wrappers, found = budget_functions(folder), []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
        for function in functions:
            for call in ast.walk(function):
                # A helper's own call with its parameter: counted at the helper's calls instead.
                if not _calls(call, wrappers) or function.name in wrappers and _passes_op_on(function, wrappers) \
                        and getattr(_op_argument(call), "id", None) == function.args.args[0].arg:
                    continue
                labels = _values(_op_argument(call), function, functions, tree)
                names = None if labels is None or not all(isinstance(label, str) for label in labels) else {
                    split_label(label)[0] for label in labels}
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


def _cell(found, gradients):
    """The largest multiple over the forward's outputs or over the gradients (tensors named d...),
    with the tensor that reached it (left out for the forward's usual "out")."""
    mine = {name: value for name, value in found.items() if name.startswith("d") == gradients}
    if not mine:
        return NONE
    name = max(mine, key=mine.get)
    return f"{mine[name]:.2f}" + ("" if name == "out" else f" ({name})")


def render(records, ops):
    """The section's table: a row per op and dtype, the ops the records name in the order of the
    patterns ``ops`` they match (budget_ops), then the others. TableError names the patterns no
    record matches and the ops with no record in a dtype."""
    multiples = {}                                 # (op, dtype, who) -> {tensor: multiple}
    for r in records:
        op, who = split_label(r["op"])
        multiples.setdefault((op, r["dtype"], who), {})[r["tensor"]] = r["multiple"]
    recorded = sorted({op for op, _, _ in multiples})
    unmatched = [f"{shown(pattern)} ({dtype})" for pattern in ops for dtype in DTYPES
                 if not any(matches(pattern, op) and d == dtype for op, d, _ in multiples)]
    named = list(dict.fromkeys([op for pattern in ops for op in recorded if matches(pattern, op)] + recorded))
    missing = unmatched + [f"{op} ({dtype})" for op in named for dtype in DTYPES
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
