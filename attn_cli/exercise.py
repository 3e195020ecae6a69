"""``numpy-attn exercise``: write an operation's forward and an empty backward to fill in, graded by
``numpy-attn check DIR/OP.py``.

The exercise file is made from numpy_attn's own source, so that it is the code the reader has been
reading and runs as is: the forward of ``numpy_attn/<op>.py``, with the cache NamedTuple and the
module's helpers it calls copied beside it (its input checks, ``_check_*``, and what comes from
other modules are imported from numpy_attn instead), then the backward's signature and docstring,
its unpacking of the cache, and as comments the forward line each step of numpy_attn's backward
undoes, inside the loops and conditions that hold it, ending in ``raise NotImplementedError``: graded
so, the report says that the backward is not written yet, where a backward returning zeros would
look like a wrong one. The names numpy_attn's backward uses are imported too, so that a complete
backward needs nothing more. ``OPERATION = "<op>"`` marks the file for ``numpy-attn check``.

Writing: DIR is created if it is missing (its parent must exist). An existing DIR/OP.py is the
learner's work and is never written over, but with ``--force``, and then through
checkpoint.replace_file (whole or not at all, signals held); a new one through
checkpoint.create_file (whole or not at all, never over a name that appeared meanwhile). A
symlinked DIR stays a link; its target gets the file.
"""

import ast
import contextlib
import importlib
import inspect
import io
import os
import re
import sys
import textwrap
import tokenize
from typing import NamedTuple

from attn_cli import checkpoint, term

HELP = "write an exercise: an operation's forward and an empty backward to fill in, graded by check"

# The ladder, in the order to climb it: operation -> numpy_attn's module of it.
LADDER = {
    "softmax": "softmax",
    "linear": "linear",
    "layer_norm": "layer_norm",
    "attention": "attention",
    "multi_head": "multi_head",
    "flash_attention": "flash_attention",
}

EXAMPLES = """examples:
  numpy-attn exercise softmax ex          writes ex/softmax.py to fill in
  numpy-attn check ex/softmax.py          grades it: exit status 0 once right
  numpy-attn exercise --list              the ladder
  numpy-attn exercise --list ex           the ladder, and which are done in ex
  numpy-attn exercise softmax ex --force  starts ex/softmax.py again
"""


def add_arguments(p):
    term.describe(p, (
        "Write DIR/OP.py: numpy_attn's forward of the operation OP, copied so that it runs as is, and "
        "its backward to write, with the shapes, what the cache holds and, step by step, which line of "
        "the forward each step undoes. Grade it with numpy-attn check DIR/OP.py. The exercises, in "
        f"the order to do them: {', '.join(LADDER)}. An existing DIR/OP.py is never written over "
        "without --force."), EXAMPLES)
    p.add_argument("op", metavar="OP", nargs="?", help=f"the operation: {', '.join(LADDER)}")
    p.add_argument("dir", metavar="DIR", nargs="?", help="the folder to write OP.py into (created if missing)")
    p.add_argument("--list", nargs="?", const=True, default=None, metavar="DIR",
                   help="list the exercises; given DIR, grade those written there and say which are done")
    p.add_argument("--force", action="store_true", help="write over an existing DIR/OP.py (your work there is lost)")


def run(args):
    """The command. Returns the exit status: 0 written (or listed), 2 bad usage."""
    if args.list is not None:
        if args.op is not None:
            raise ValueError(f"--list takes no OP ({args.op!r}): numpy-attn exercise --list [DIR]")
        print(listing(None if args.list is True else args.list))
        return 0
    if args.op is None or args.dir is None:
        raise ValueError(f"give the operation and the folder: numpy-attn exercise OP DIR, OP one of "
                         f"{', '.join(LADDER)} (--list shows them)")
    if args.op not in LADDER:
        raise ValueError(f"OP {args.op!r} is not an exercise: {', '.join(LADDER)}")
    path = write(args.op, args.dir, args.force)
    print(f"wrote {path}: fill in {names(args.op)[1]}, then run  numpy-attn check {path}")
    return 0


def names(op):
    """(forward's name, backward's name) of numpy_attn's operation ``op``: the exercise's too."""
    from numpy_attn.testing import OPERATIONS

    return OPERATIONS[op].forward.__name__, OPERATIONS[op].backward.__name__


# -- the exercise's text ---------------------------------------------------------------------------

def _loaded(tree):
    """The names ``tree`` reads (its own local names included: a superset, which is enough)."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _defines(node):
    """The names a top-level statement defines: a function's or class's, an assignment's targets."""
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return {node.name}
    return {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}


def _lines(text, node, comments_above=True):
    """The source lines of the top-level ``node``, from its decorators (and the comment lines just
    above it) to its end."""
    lines = text.splitlines()
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while comments_above and first > 0 and lines[first - 1].startswith("#"):
        first -= 1
    return lines[first:node.end_lineno]


class _Parts(NamedTuple):
    """What an exercise is made of, read from numpy_attn's module of the operation."""
    stem: str          # numpy_attn's module of it
    module: object
    text: str          # the module's source
    tree: ast.Module
    copied: set        # the top-level names copied beside the forward (the forward among them)
    imports: set       # the import lines of what the forward needs and is not copied
    helpers: set       # the import lines of the other names numpy_attn's backward uses
    needs: set         # the import lines of every name numpy_attn's backward uses (a notebook's cell)
    backward: ast.FunctionDef


def _parts(op):
    """The _Parts of the exercise of ``op`` (one of LADDER)."""
    stem = LADDER[op]
    module = importlib.import_module(f"numpy_attn.{stem}")
    text = inspect.getsource(module)
    tree = ast.parse(text)
    forward_name, backward_name = names(op)
    defined = {name: node for node in tree.body for name in _defines(node)}   # top-level name -> its node
    imported = {}                             # name -> its import line
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.update({a.asname or a.name: f"from {node.module} import {a.name}"
                             + (f" as {a.asname}" if a.asname else "") for a in node.names})
        elif isinstance(node, ast.Import):
            imported.update({(a.asname or a.name).split(".")[0]: f"import {a.name}" + (f" as {a.asname}" if a.asname
                                                                                       else "") for a in node.names})
    # What the forward needs, copied (but the input checks) or imported, followed to what it needs.
    copied, imports, todo = set(), set(), [forward_name]
    while todo:
        name = todo.pop()
        if name in copied:
            continue
        if name in defined and (name == forward_name or not name.startswith("_check")):
            copied.add(name)
            todo.extend(_loaded(defined[name]) - copied)
        elif name in defined:
            imports.add(f"from numpy_attn.{stem} import {name}")
        elif name in imported:
            imports.add(imported[name])
    backward = defined[backward_name]
    # What numpy_attn's backward uses besides: imported, so that a complete backward needs nothing more.
    needs = set()
    for name in sorted(_loaded(backward) - {backward_name}):
        if name in defined:
            needs.add(f"from numpy_attn.{stem} import {name}")
        elif name in imported:
            needs.add(imported[name])
    helpers = {line for line in needs if line.rpartition(" ")[2] not in copied}
    imports.add("import numpy as np")
    return _Parts(stem, module, text, tree, copied, imports, helpers - imports, needs, backward)


def _copied(parts):
    """(the names it defines, its source lines) of each top-level statement the exercise copies, in
    the module's order."""
    return [(_defines(node), _lines(parts.text, node)) for node in parts.tree.body if _defines(node) & parts.copied]


def forward_text(op):
    """numpy_attn's forward of ``op`` and what the exercise file copies beside it (its cache, its
    helpers), as one text: what a notebook shows of the rung."""
    return "\n\n\n".join("\n".join(lines) for _, lines in _copied(_parts(op))) + "\n"


def backward_cell(op):
    """The backward of ``op`` to write, as a notebook's cell: the imports of every name numpy_attn's
    backward uses (and NumPy), then the exercise file's skeleton, its error pointing to the grading cell
    below."""
    parts = _parts(op)
    return "\n".join([*_import_block(parts.needs | {"import numpy as np"}), "", "",
                      *_skeleton(parts.text, parts.backward, "run the next cell")]) + "\n"


def source(op):
    """The text of the exercise file of ``op`` (one of LADDER)."""
    parts = _parts(op)
    stem, module = parts.stem, parts.module
    forward_name, backward_name = names(op)
    rung = list(LADDER).index(op) + 1
    about = textwrap.fill(
        f"{forward_name} below is numpy_attn's own (numpy_attn/{stem}.py), copied so that it runs as is. "
        f"Write {backward_name} under it, undoing the forward's steps from its last to its first, then "
        "grade it:", 100)
    after = textwrap.fill(
        "It is right when its output and gradients agree with numpy_attn's on the inputs Hypothesis draws "
        f"(docs/testing.md). numpy_attn/{stem}.py holds numpy_attn's backward: read it after you try.", 100)
    out = [f'"""Exercise {rung} of {len(LADDER)}: the backward of {op}.', "",
           textwrap.fill(module.__doc__.strip().splitlines()[0], 100), "", about, "",
           f"    numpy-attn check {op}.py", "", after, '"""', ""]
    out += _import_block(parts.imports)
    if parts.helpers:
        out += ["# For the backward: what numpy_attn's uses (a lower rung's backward among them, or yours)",
                *_import_block(parts.helpers, groups=False)]
    out += ["", f'OPERATION = "{op}"   # what numpy-attn check grades this file as']
    for defines, lines in _copied(parts):
        out += ["", "", *lines]
        if forward_name in defines:
            out += ["", "", *_skeleton(parts.text, parts.backward, f"numpy-attn check {op}.py")]
    return "\n".join(out) + "\n"


def _import_block(lines, groups=True):
    """Import lines in the usual order: the standard library's, NumPy, numpy_attn (a blank line between
    the groups where ``groups``), names from one module on one line."""
    modules = {}
    for line in lines:
        if line.startswith("import "):
            modules.setdefault(line, [])
        else:
            module, name = line[len("from "):].split(" import ")
            modules.setdefault(module, []).append(name)

    def order(module):
        top = module.removeprefix("import ").split(".")[0].split(" ")[0]
        group = 0 if top in sys.stdlib_module_names else 1 if top == "numpy" else 2
        return group, module.startswith("import "), module

    out, last = [], None
    for module in sorted(modules, key=order):
        if groups and last is not None and order(module)[0] != last:
            out.append("")
        last = order(module)[0]
        out.append(module if module.startswith("import ") else
                   f"from {module} import {', '.join(sorted(modules[module]))}")
    return out


def _comments(text):
    """{line number: (the text of the comment on it, the column it starts at)} of a source text."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = (tok.string.lstrip("#").strip(), tok.start[1])
    return found


def _step(comment):
    """The step a comment names: from its "undoes" to the end of its first clause."""
    start = comment.lower().index("undoes")
    step = re.split(r"[:;] |\. |\.$", comment[start:], maxsplit=1)[0]
    return step[0].upper() + step[1:]


def _holders(node, lineno):
    """The loops and conditions of the function ``node`` whose body holds line ``lineno`` (or
    whose first line it is), outermost first."""
    found, nodes = [], node.body
    while True:
        inner = [n for n in nodes if isinstance(n, ast.For | ast.While | ast.If | ast.With)
                 and n.lineno <= lineno <= n.end_lineno]
        if not inner:
            return found
        found.append(inner[0])
        nodes = inner[0].body + inner[0].orelse if hasattr(inner[0], "orelse") else inner[0].body


def _skeleton(text, node, grading):
    """The backward to write: numpy_attn's signature, docstring and unpacking of the cache, then as
    comments the step each of its "Undoes" comments names, inside the loops and conditions that
    hold it, and ``raise NotImplementedError`` saying to write it, then ``grading``."""
    lines = text.splitlines()
    body = node.body
    indent = " " * body[0].col_offset
    out = lines[node.lineno - 1:body[0].lineno - 1]                      # the def, over its lines
    if ast.get_docstring(node) is not None:
        out += lines[body[0].lineno - 1:body[0].end_lineno]
        body = body[1:]
    for statement in body:                                              # the cache unpacked
        if not (isinstance(statement, ast.Assign) and "cache" in _loaded(statement.value)):
            break
        out += lines[statement.lineno - 1:statement.end_lineno]
    out.append(f"{indent}# To write: each step undoes a line of the forward, from its last line to its first.")
    comments = _comments(text)
    opened = []                                                          # the loops and conditions shown
    for lineno in range(node.lineno, node.end_lineno + 1):
        comment, column = comments.get(lineno, ("", 0))
        own_line = not lines[lineno - 1][:column].strip()
        if "undoes" not in comment.lower() or own_line and lineno - 1 in comments and \
                not lines[lineno - 2][:comments[lineno - 1][1]].strip():
            continue                                                     # none, or a comment's next line
        chain = _holders(node, lineno)
        while opened and (len(opened) > len(chain) or opened[-1] is not chain[len(opened) - 1]):
            opened.pop()
        for compound in chain[len(opened):]:
            header = lines[compound.lineno - 1]
            if compound.lineno in comments:
                header = header[:comments[compound.lineno][1]]
            out.append(f"{indent}# {'    ' * len(opened)}{header.strip()}")
            opened.append(compound)
        out.append(f"{indent}# {'    ' * len(chain)}{_step(comment)}")
    out.append(f'{indent}raise NotImplementedError("write this backward, then grade it: {grading}")')
    return out


# -- writing ---------------------------------------------------------------------------------------

def write(op, folder, force=False):
    """Write the exercise of ``op`` into ``folder`` as ``<op>.py`` (see the module docstring for
    what is refused); returns its path. ValueError naming the path and the way out."""
    data = source(op).encode("utf-8")
    path = os.path.join(folder, f"{op}.py")
    try:
        made = not checkpoint.check_folder_path(folder, "DIR")
    except ValueError as err:
        raise ValueError(f"{err}: choose another DIR") from None
    if not made and not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"DIR {folder} cannot be written: no permission to write in {os.path.abspath(folder)}")
    if os.path.lexists(path):
        if os.path.islink(path) and not os.path.exists(path):
            raise ValueError(f"{path} is a symlink to {os.readlink(path)}, which does not exist: remove the link "
                             "or choose another DIR")
        if not os.path.isfile(path):
            raise ValueError(f"{path} is not a file: numpy-attn exercise writes only a file there; move it away "
                             "or choose another DIR")
        if not force:
            raise ValueError(f"{path} exists (your work?): it is never written over; pass --force to start it "
                             "again, or choose another DIR")
        checkpoint.replace_file(path, data)
        return path
    if made:
        os.mkdir(folder)
    try:
        checkpoint.create_file(path, data)
    except FileExistsError:
        raise ValueError(f"{path} appeared while the exercise was written: it is left as it is; pass "
                         "--force to write over it") from None
    except BaseException:
        if made:                        # the folder made here, empty again
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise
    return path


# -- the ladder ------------------------------------------------------------------------------------

def listing(folder=None, examples=50, seed=0):
    """The text of --list: the ladder, and given ``folder`` the state of each exercise there, graded
    as numpy-attn check grades it (``examples`` inputs from ``seed``)."""
    if folder is not None and not os.path.isdir(folder):
        raise ValueError(f"--list {folder}: no such folder (numpy-attn exercise OP {folder} writes one there)")
    lines = ["The exercises, in the order to do them (numpy-attn exercise OP DIR writes DIR/OP.py):"]
    done, following = 0, None
    for rung, op in enumerate(LADDER, 1):
        _, backward = names(op)
        state = ""
        if folder is not None:
            path = os.path.join(folder, f"{op}.py")
            state, passed = grade(path, examples, seed)
            done += passed
            if not passed and following is None:
                following = (f"numpy-attn exercise {op} {folder}" if state == "not started" else
                             f"write {backward} in {path}, then numpy-attn check {path}")
        lines.append(f"  {rung}. {op:<16} {backward:<40} {state}".rstrip())
    if folder is not None:
        lines.append(f"{done} of {len(LADDER)} done in {folder}" + (f"; next: {following}" if following else ""))
    return "\n".join(lines)


def grade(path, examples=50, seed=0):
    """(a few words on the exercise file ``path``: not written, to do, done, wrong and what, or why it
    could not be graded; whether it is done)."""
    from attn_cli import check
    from numpy_attn.testing import NOT_WRITTEN, CheckFailure
    from numpy_attn.testing import check as check_op

    if not os.path.lexists(path):
        return "not started", False
    try:
        op, forward, backward = check.load_exercise(path)
        check_op(op, forward, backward, examples=examples, seed=seed)
    except CheckFailure as failure:
        report = str(failure)
        if f"failed: {NOT_WRITTEN}" in report:
            return "to do: the backward is not written yet", False
        wrong = re.findall(r"^  wrong: ([\w.]+):", report, flags=re.M)
        failed = re.findall(r"^  failed: (.*)$", report, flags=re.M)
        return f"wrong: {', '.join(wrong)}" if wrong else f"failed: {failed[0] if failed else report}", False
    except (ValueError, TypeError, OSError) as err:
        return f"cannot be graded: {err}", False
    return "done", True
