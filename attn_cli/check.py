"""``numpy-attn check``: check a function of one's own against numpy_attn's operation
(numpy_attn.testing.check), from the command line."""

import ast
import importlib.util
import sys
from pathlib import Path

from attn_cli import term

HELP = "check your own implementation of an operation, or a whole model, against numpy_attn's"

EXAMPLES = """examples:
  numpy-attn check ex/softmax.py      an exercise of numpy-attn exercise: its op and functions known
  numpy-attn check mine.py:softmax_forward --op softmax --backward softmax_backward
  numpy-attn check mine.py:softmax_forward --op softmax --option axis=-1 --option masked=False
  numpy-attn check mine.py:sdpa --op attention          a torch function: autograd's backward
  numpy-attn check mine.py:sdpa --op attention --examples 500 --seed 7
  numpy-attn check mine.py:layer_norm --op layer_norm --dtype float32
  numpy-attn check mine.py:forward --model llama       a whole model, layer by layer, on a small random llama
  numpy-attn check mine.py:forward --model llama --hf DIR   on the weights of a Hugging Face folder
  numpy-attn check mine.py:forward --model gpt2 --backward backward    a NumPy model and its backward
"""

DTYPES = ("float64", "float32", "float16", "bfloat16")


def add_arguments(p):
    term.describe(p, (
        "Draw inputs with Hypothesis, run FUNCTION of FILE on them and compare its output and every "
        "gradient with numpy_attn's forward and backward in float64, to the tolerance numpy_attn's own "
        "tests use (docs/testing.md). A NumPy forward returns (out, cache) and --backward names its "
        "backward(dout, cache); a torch function gets autograd's backward. With --model FAMILY, FUNCTION is "
        "a whole model, forward(ids, params) -> logits or (logits, hidden_states), compared with numpy_attn's "
        "model of that family on the same weights layer by layer, then its logits and every gradient; the "
        "report names the first layer and tensor that departs. Exit status 0 when everything agrees, 1 with "
        "the report when something does not, 2 on bad usage."),
        EXAMPLES)
    p.add_argument("target", metavar="FILE:FUNCTION",
                   help="the Python file and the name of the forward in it, e.g. mine.py:softmax_forward; or "
                        "an exercise file of numpy-attn exercise alone, e.g. ex/softmax.py")
    p.add_argument("--op", metavar="OP", default=None,
                   help="the operation it implements (this or --model is required): softmax, linear, layer_norm, "
                        "rms_norm, gelu, attention, flash_attention or multi_head")
    p.add_argument("--model", metavar="FAMILY", default=None,
                   help="FUNCTION is a whole model of this numpy_attn family (gpt2, llama, qwen3, gemma2, ...): "
                        "forward(ids, params) on a small random model of it, or on --hf's weights")
    p.add_argument("--hf", metavar="DIR", default=None,
                   help="with --model: the Hugging Face folder whose weights and config the model is checked on, "
                        "read in float64 (--model may then be left out)")
    p.add_argument("--backward", metavar="FUNCTION", default=None,
                   help="the NumPy backward(dout, cache) in the same file, backward(dlogits, cache) -> dparams "
                        "with --model (none: the forward alone, or autograd's for a torch function)")
    p.add_argument("--examples", type=int, default=50, metavar="N", help="inputs to draw (default 50)")
    p.add_argument("--dtype", choices=DTYPES, default="float64",
                   help="the inputs' dtype (default float64; float16 and bfloat16 are held to the 2x rule "
                        "of docs/precision.md)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="Hypothesis's seed, or with --model the random weights', ids' and dlogits' (default 0: the "
                        "same inputs every run)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="fix one of the operation's options (a Python literal: axis=-1, masks=\"('none',)\", "
                        "groups=1; docs/testing.md lists them), repeated for several")
    p.add_argument("--device", default="cpu", help="where a torch function's inputs go (default cpu)")


def load(target):
    """(the module of FILE, the FUNCTION named) of ``target`` "FILE:FUNCTION"; ValueError naming
    what is missing."""
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"expected FILE:FUNCTION, e.g. mine.py:softmax_forward, got {target!r} (or an "
                         "exercise file that numpy-attn exercise wrote, alone: it sets OPERATION)")
    return (module := load_file(path)), function(module, path, name)


def _is_exercise(path):
    """The OPERATION an exercise file ``path`` sets (read, not run), or None; raises nothing."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["OPERATION"] \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    return None


def load_exercise(path):
    """(operation, forward, backward) of the exercise file ``path`` that numpy-attn exercise wrote:
    its OPERATION and numpy_attn's names of the operation's functions; ValueError naming what is
    missing."""
    from numpy_attn.testing import OPERATIONS

    if not Path(path).is_file():
        raise ValueError(f"no file {path!r}" + ("" if Path(path).suffix == ".py" else " (give the .py file)"))
    op = _is_exercise(path)
    if op is None:
        raise ValueError(f"{path} sets no OPERATION: it is no exercise of numpy-attn exercise; give "
                         "FILE:FUNCTION and --op, e.g. mine.py:softmax_forward --op softmax")
    if op not in OPERATIONS:
        raise ValueError(f"{path} sets OPERATION = {op!r}, not an operation check knows: {', '.join(OPERATIONS)}")
    module = load_file(path)
    forward, backward = (function(module, path, f.__name__) for f in (OPERATIONS[op].forward, OPERATIONS[op].backward))
    return op, forward, backward


def load_file(path):
    """The module of the Python file ``path``, run; ValueError when it is missing or raises."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"no file {path!r}" + ("" if file.suffix == ".py" else " (give the .py file)"))
    spec = importlib.util.spec_from_file_location(f"numpy_attn_check_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))           # the file's own imports of its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as err:                                # the user's file: any error stops the check
        raise ValueError(f"{path} could not be run: {type(err).__name__}: {err}") from None
    finally:
        sys.path.remove(str(file.resolve().parent))
    return module


def function(module, path, name):
    """The function ``name`` of ``module`` (loaded from ``path``); ValueError listing the functions there."""
    found = getattr(module, name, None)
    if not callable(found):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ValueError(f"{path} has no function {name!r}" + (f" (it defines {', '.join(names)})" if names else ""))
    return found


def options(given):
    """{NAME: VALUE} of the --option NAME=VALUE texts, each VALUE a Python literal (or else the text)."""
    found = {}
    for text in given:
        name, sep, value = text.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--option must be NAME=VALUE, e.g. axis=-1, got {text!r}")
        try:
            found[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            found[name] = value
    return found


def run(args):
    """The command. Returns the exit status: 0 agrees, 1 a failing example, 2 bad usage."""
    from numpy_attn.testing import OPERATIONS, CheckFailure, check

    if args.model is not None or args.hf is not None:
        return run_model(args)
    exercise = ":" not in args.target and _is_exercise(args.target) is not None
    if exercise:                                    # an exercise file: its op and functions are known
        op, forward, backward = load_exercise(args.target)
        if args.op not in (None, op):
            raise ValueError(f"{args.target} is the exercise of {op}, not --op {args.op}: leave --op out")
        if args.backward is not None:
            raise ValueError(f"{args.target} is an exercise: its backward is {backward.__name__}; leave --backward out")
        args.op = op
    elif args.op is None:
        raise ValueError(f"give the operation FUNCTION implements: --op OP, one of {', '.join(OPERATIONS)}")
    if args.op not in OPERATIONS:
        raise ValueError(f"--op {args.op!r} is not an operation check knows: {', '.join(OPERATIONS)}")
    if args.examples < 1:
        raise ValueError(f"--examples must be a positive integer, got {args.examples}")
    if args.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {args.seed}")
    fixed = options(args.option)
    if not exercise:
        module, forward = load(args.target)
        backward = None if args.backward is None else function(module, args.target.rpartition(":")[0], args.backward)
    try:
        check(args.op, forward, backward, examples=args.examples, seed=args.seed, dtype=args.dtype,
              device=args.device, **fixed)
    except CheckFailure as failure:
        print(failure)
        return 1
    what = (f"{args.target}'s {forward.__name__} and {backward.__name__}" if exercise else
            f"{args.target}{' with ' + args.backward if args.backward else ''}")
    print(f"{args.op}: {what} agree{'' if exercise else 's'} with numpy_attn's on "
          f"{args.examples} examples ({args.dtype}, seed {args.seed})")
    return 0


def run_model(args):
    """``numpy-attn check FILE:FUNCTION --model FAMILY [--hf DIR]``: check_model. Returns the exit status."""
    from numpy_attn._family import families
    from numpy_attn.testing import CheckFailure, check_model

    if args.op is not None:
        raise ValueError(f"give --op (an operation) or --model (a whole model), not both: --op {args.op}, "
                         f"--model {args.model}")
    fixed = [name for name, value, default in (("--examples", args.examples, 50), ("--dtype", args.dtype, "float64"),
                                               ("--option", args.option, [])) if value != default]
    if fixed:
        raise ValueError(f"{', '.join(fixed)} apply to --op: a model is checked once, in float64, on its ids")
    if args.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {args.seed}")
    if args.model is not None and args.model not in families():
        raise ValueError(f"--model {args.model!r} is not a family numpy_attn has: {', '.join(families())}")
    config = params = None
    family = args.model
    if args.hf is not None:
        import numpy as np

        from attn_cli.hf import load_checkpoint

        kind, config, params = load_checkpoint(args.hf, np.float64)
        if family not in (None, kind):
            raise ValueError(f"{args.hf} holds a {kind} model, not --model {family}")
        family = kind
    module, forward = load(args.target)
    backward = None if args.backward is None else function(module, args.target.rpartition(":")[0], args.backward)
    try:
        check_model(family, forward, backward, params=params, config=config, seed=args.seed, device=args.device)
    except CheckFailure as failure:
        print(failure)
        return 1
    weights = args.hf if args.hf is not None else f"a random {family} model"
    print(f"{family}: {args.target}{' with ' + args.backward if args.backward else ''} agrees with numpy_attn's "
          f"layer by layer on {weights} (float64, seed {args.seed})")
    return 0
