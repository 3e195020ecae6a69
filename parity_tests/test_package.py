"""Package-level tests: imports stay light, and the numpy-attn command works."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import numpy_attn
from attn_cli import cli
from parity_tests.helpers import needs_vocab


def test_import_leaves_torch_and_tiktoken_out():
    """Importing numpy_attn, every operation module and the command's entry point imports NumPy only."""
    code = (
        "import sys, pkgutil, importlib, numpy_attn\n"
        "for m in pkgutil.walk_packages(numpy_attn.__path__, 'numpy_attn.'):\n"
        "    importlib.import_module(m.name)\n"
        "importlib.import_module('attn_cli.cli')\n"
        "print(sorted(n for n in ('torch', 'tiktoken') if n in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"imported at module level: {result.stdout}"


def test_import_of_numpy_attn_leaves_hypothesis_out():
    """``import numpy_attn`` and every operation module imports neither Hypothesis nor torch: only
    numpy_attn.testing imports Hypothesis (docs/design.md's one exception), and importing it still
    leaves torch out (test_import_leaves_torch_and_tiktoken_out walks it with the rest)."""
    code = (
        "import sys, pkgutil, importlib, numpy_attn\n"
        "for m in pkgutil.walk_packages(numpy_attn.__path__, 'numpy_attn.'):\n"
        "    if m.name != 'numpy_attn.testing':\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(n for n in ('torch', 'hypothesis') if n in sys.modules))\n"
        "import numpy_attn.testing\n"
        "print(sorted(n for n in ('torch', 'hypothesis') if n in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[:2] == ["[]", "['hypothesis']"], f"imported: {result.stdout}"


# What a numpy_attn module may import: the standard library, NumPy and numpy_attn; numpy_attn.testing
# also Hypothesis, and torch and ml_dtypes inside functions only (when a torch function or bfloat16 is
# checked); _threads.py threadpoolctl inside its function, on first use (optional there).
ALLOWED_IMPORTS = {"numpy", "numpy_attn"} | set(sys.stdlib_module_names)
EXCEPTIONS = {"numpy_attn/testing.py": ({"hypothesis"}, {"torch", "ml_dtypes"}),
              "numpy_attn/_threads.py": (set(), {"threadpoolctl"})}


def test_numpy_attn_imports_numpy_alone():
    """Every import statement of numpy_attn, those inside functions included, names the standard
    library, NumPy or numpy_attn, but for EXCEPTIONS: numpy_attn/testing.py adds Hypothesis at the
    top and torch and ml_dtypes inside its functions."""
    import ast

    root = Path(numpy_attn.__file__).resolve().parent
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent).as_posix()
        top_extra, inner_extra = EXCEPTIONS.get(name, (set(), set()))
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            allowed = ALLOWED_IMPORTS | top_extra | (set() if id(node) in top else inner_extra)
            found += [f"{name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert not found, f"numpy_attn imports beyond NumPy: {found}"


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"numpy-attn {numpy_attn.__version__}"


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("numpy-attn")   # beside the interpreter in a venv
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and numpy_attn.__version__ in result.stdout, result


@needs_vocab
def test_tokenize_prints_ids_and_strings(capsys):
    assert cli.main(["tokenize", "The cat sat on the mat"]) == 0
    out = capsys.readouterr().out
    assert "6 GPT-2 tokens" in out
    assert "3797  ' cat'" in out


def test_no_subcommand_prints_help(capsys):
    assert cli.main([]) == 2
    assert "tokenize" in capsys.readouterr().out


@pytest.mark.parametrize("command", list(cli.COMMANDS) + [None])
def test_a_misspelt_option_names_the_nearest(command, capsys):
    """Every command answers an option with two letters swapped with its own usage and the option
    meant, exit status 2; an argument like no option gets no guess."""
    parser = cli.build_parser()
    own = parser.commands[command] if command else parser
    options = [s for a in own._actions for s in a.option_strings if s.startswith("--") and s != "--help"]
    # The command's own positional argument (site's DIR, tokenize's TEXT), so that only the option is wrong.
    lead = ([command] if command else []) + (["x"] if command and any(
        not a.option_strings for a in own._actions) else [])
    for option in options:
        if len(option) < 6:
            continue                  # too short to misspell this way ("--hf")
        misspelt = option[:3] + option[4] + option[3] + option[5:]      # "--version" -> "--evrsion"
        if misspelt == option or any(o.startswith(misspelt) for o in options):
            continue                  # the same letters, or an abbreviation argparse accepts
        with pytest.raises(SystemExit) as exit_info:
            cli.main(lead + [misspelt])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2
        assert f"numpy-attn{' ' + command if command else ''}: error: unrecognized arguments: {misspelt}" in err
        assert f"{misspelt!r}: did you mean {option!r}?" in err
    with pytest.raises(SystemExit):
        cli.main(lead + ["--zzzzzz-qqqq"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzz-qqqq" in err and "did you mean" not in err


def test_generate_help_names_every_family_it_reads():
    from numpy_attn._family import families

    text = " ".join(cli.build_parser().commands["generate"].format_help().split())
    for family in families().values():
        assert family.title in text, f"generate --help does not name {family.title}"


@pytest.mark.parametrize("command", list(cli.COMMANDS) + [None])
def test_help_is_wrapped_to_the_terminal(command):
    """At COLUMNS=80 every help line fits, the description refilled at word boundaries; only an
    example command too long for a line (no explanation beside it) stands whole, to be copied."""
    import os

    argv = [sys.executable, "-m", "attn_cli.cli"] + ([command] if command else []) + ["--help"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    too_long = [line for line in lines if len(line) > 80
                and not (line.startswith("  numpy-attn ") and "  " not in line.strip())]
    assert not too_long, too_long
    if command:
        parser = cli.build_parser()
        description = parser._subparsers._group_actions[0].choices[command].description
        words = " ".join(lines).split()
        assert " ".join(description.split()) in " ".join(words), "the description, every word whole"


# ---------------------------------------------------------------------------------------------
# The wheel holds what it offers.

def _dependency_farm(folder):
    """A folder of links to this environment's installed packages but ours, so that a fresh
    environment can use them without a download and without seeing this checkout."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir()
    ours = ("numpy_attn", "torch_attn", "attn_cli", "benchmarks", "__editable__")
    for entry in site.iterdir():
        if not entry.name.startswith(ours) and entry.suffix != ".pth" and entry.name != "__pycache__":
            (folder / entry.name).symlink_to(entry)
    return folder


@pytest.mark.slow
@pytest.mark.wheel
def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path):
    """pip wheel of a copy of the checkout, installed in a fresh venv whose other packages are this
    environment's (linked, not downloaded); from a folder outside the checkout, the installed
    packages answer: python -m benchmarks runs, numpy-attn runs (show, site, exercise and check of
    the exercise), and the metadata carries the project URLs and absolute image links. About 30 s
    here."""
    import email
    import os
    import shutil
    import zipfile

    root = Path(numpy_attn.__file__).resolve().parent.parent
    source = tmp_path / "source"
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".*_cache", "site"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=120)
    wheel, = (tmp_path / "dist").glob("numpy_attn-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        meta_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(archive.read(meta_name))
    assert {"numpy_attn", "torch_attn", "attn_cli", "benchmarks"} <= tops, tops
    urls = meta.get_all("Project-URL")
    assert urls and all(u.split(", ")[1].startswith("https://") for u in urls), urls
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", meta.get_payload())
    assert images and all(i.startswith("https://") for i in images), [i for i in images if "://" not in i]

    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=60)
    python = fresh / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=120)
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    (fresh_site / "_deps.pth").write_text(f"{_dependency_farm(tmp_path / 'deps')}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run_there(*argv):
        result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=elsewhere,
                                env=env, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    where = run_there(python, "-c", "import numpy_attn, torch_attn, benchmarks; "
                      "print(numpy_attn.__file__, benchmarks.__file__, torch_attn.__version__)").split()
    assert all(Path(p).is_relative_to(fresh) for p in where[:2]), where
    assert where[2] == numpy_attn.__version__
    out = run_there(python, "-m", "benchmarks", "--quick", "--ops", "softmax", "--seq-lens", "64",
                    "--modes", "fwd", "--no-progress")
    assert re.search(r"^softmax\s+fwd\s+64\s+numpy\s+cpu\s", out, flags=re.M), out
    assert numpy_attn.__version__ in run_there(fresh / "bin" / "numpy-attn", "--version")
    assert "def softmax_forward(" in run_there(fresh / "bin" / "numpy-attn", "show", "softmax")
    assert "wrote" in run_there(fresh / "bin" / "numpy-attn", "site", "site")   # no report there: warnings
    assert "<math" in (elsewhere / "site" / "softmax.html").read_text()
    # An exercise is written from the installed numpy_attn's source, and graded: its empty backward
    # gives exit status 1 and the report.
    assert "wrote ex/softmax.py" in run_there(fresh / "bin" / "numpy-attn", "exercise", "softmax", "ex")
    graded = subprocess.run([str(fresh / "bin" / "numpy-attn"), "check", "ex/softmax.py", "--examples", "5"],
                            capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert graded.returncode == 1 and graded.stdout.startswith("softmax: the backward is not written yet"), graded


def test_torch_attn_has_the_version_too():
    import torch_attn

    assert torch_attn.__version__ == numpy_attn.__version__


def test_shipped_packages_import_nothing_the_wheel_leaves_out():
    """Every import in the packages setup.cfg ships, including those inside functions, names a
    shipped package or a dependency: the wheel holds no parity_tests, docs or benchmarks results
    (benchmarks once imported a converter from parity_tests inside a function, which only a
    benchmark of multi_head reached, outside the repository)."""
    import ast
    import configparser

    root = Path(__file__).resolve().parent.parent
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    shipped = [p.strip() for p in config["options"]["packages"].split(",")]
    left_out = {"parity_tests", "docs"}
    found = []
    for package in shipped:
        for path in sorted((root / package.replace(".", "/")).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                found += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] in left_out]
    assert not found, f"shipped modules import what the wheel leaves out: {found}"
