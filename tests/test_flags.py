"""flags.py: one parser and one UsageError for every script; the same syntax and the same answers everywhere."""

import ast
import glob
import os
import re
from dataclasses import dataclass
from typing import Literal, Optional

import pytest

from lab import bench
import data
from engine import flags
import plot
import sweep
import configs
import train
from conftest import ROOT

SCRIPTS = ("train.py", "data.py", "sweep.py", "plot.py", "lab/bench.py", "sample.py")


@dataclass
class Options:
    name: str = "x"
    count: int = 1
    rate: float = 0.5
    on: bool = False
    maybe: Optional[bool] = None
    limit: Optional[int] = 3
    kind: Literal["a", "b"] = "a"
    seed: int = 0


def test_each_syntax_gives_a_typed_value():
    given = flags.parse(["--name", "y", "--count=7", "--rate", "-2.5", "--on", "--maybe", "--limit=None", "--kind=b"],
                        Options)
    assert given == {"name": "y", "count": 7, "rate": -2.5, "on": True, "maybe": True, "limit": None, "kind": "b"}
    assert flags.build(Options, given) == Options("y", 7, -2.5, True, True, None, "b")
    assert flags.parse(["--on", "no", "--maybe=False"], Options) == {"on": False, "maybe": False}
    assert flags.parse(["--name="], Options) == {"name": ""}


@pytest.mark.parametrize("text, value", [("true", True), ("True", True), ("YES", True), ("1", True),
                                         ("false", False), ("No", False), ("0", False)])
def test_booleans_are_read_alike_in_every_script(text, value):
    assert configs.parse_flags([f"--bias={text}"]) == {"bias": value}
    assert sweep.parse_args(["--variants=baseline", "--lrs=1e-2", f"--dry_run={text}"]).dry_run is value
    assert flags.parse([f"--on={text}"], Options) == {"on": value}


@pytest.mark.parametrize("script, main, argv", [
    ("train.py", train.main, ["--bias=maybe"]),
    ("sweep.py", sweep.main, ["--variants=baseline", "--lrs=1e-2", "--dry_run=maybe"]),
    ("bench.py", bench.main, ["--bias=maybe"]),
])
def test_a_bad_boolean_is_the_same_line_in_every_script(capsys, script, main, argv):
    assert main(argv) == 2
    name = argv[-1].split("=")[0]
    assert capsys.readouterr().err == f"{script}: {name}=maybe is not a boolean; use True or False (or 1/0, yes/no)\n"


@pytest.mark.parametrize("argv, expected", [
    (["--count=1_0"], "--count=1_0 is not a valid int"),
    (["--count=\u0663"], "is not a valid int"),  # an Arabic-Indic 3: int() would take it
    (["--count= 3"], "is not a valid int"),
    (["--count=2.0"], "--count=2.0 is not a valid int"),
    (["--rate=inf"], "--rate=inf is not a finite number"),
    (["--rate=nan"], "--rate=nan is not a finite number"),
    (["--rate=fast"], "--rate=fast is not a valid float"),
    (["--rate=1_0e-3"], "--rate=1_0e-3 is not a valid float"),  # float() reads it as 0.01
    (["--rate=\u0661.5"], "is not a valid float"),  # an Arabic-Indic 1: float() would take it
    (["--rate= 1"], "is not a valid float"),
    (["--count=2147483648"], "--count=2147483648 is too large; an integer flag is at most 2,147,483,647 in size"),
    (["--count=-2147483648"], "is too large"),
    (["--seed=9223372036854775808"], "--seed=9223372036854775808 is too large"),
    (["--on=2"], "--on=2 is not a boolean"),
    (["--kind=c"], "--kind=c is not allowed; choose one of a, b"),
    (["--limit"], "--limit needs a value (--limit=VALUE)"),
    (["--cuont=2"], "unknown flag --cuont; did you mean --count?"),
    (["loose"], "unexpected argument 'loose'"),
    (["--"], "unexpected argument '--'"),
])
def test_bad_input_is_one_line(argv, expected):
    with pytest.raises(flags.UsageError) as error:
        flags.parse(argv, Options)
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_the_number_grammar_and_bounds_take_what_they_should():
    given = flags.parse(["--rate=-.5e+3", "--count=-2147483647", "--seed=9223372036854775807"], Options)
    assert given == {"rate": -500.0, "count": -2147483647, "seed": 2 ** 63 - 1}
    assert flags.parse(["--rate=3", "--count=+7"], Options) == {"rate": 3.0, "count": 7}


def test_choices_and_positionals():
    assert flags.parse(["--name=q"], Options, choices={"name": ["p", "q"]}) == {"name": "q"}
    with pytest.raises(flags.UsageError, match="--name=r is not allowed; choose one of p, q"):
        flags.parse(["--name=r"], Options, choices={"name": ["p", "q"]})
    assert flags.parse(["a", "--count", "2", "b"], Options, positional="folders") == {"folders": ["a", "b"], "count": 2}
    paths, opts = plot.parse_args(["run", "--out", "png", "sweep", "--op=q"])
    assert paths == ["run", "sweep"] and (opts["out"], opts["op"]) == ("png", "q")


def test_split_keeps_what_is_not_its_own_as_given():
    own, rest = flags.split(["--n_layer", "3", "--count", "2", "--on", "--compile", "False", "x", "--rate=1"], Options)
    assert own == ["--count", "2", "--on", "--rate=1"]
    assert rest == ["--n_layer", "3", "--compile", "False", "x"]


def test_replaced_puts_each_named_flag_once_and_last():
    # a bare boolean and a --name=value flag are one name; a flag of the same prefix is another
    argv = ["--compile", "--lr=1e-3", "--lr_schedule=ramp", "--seed=1", "--device=cpu"]
    new = ["--lr=3e-3", "--compile=False", "--device=cuda"]
    assert flags.replaced(argv, new) == ["--lr_schedule=ramp", "--seed=1", *new]
    assert flags.replaced(argv, []) == argv


def test_the_first_class_owns_a_shared_name():
    @dataclass
    class Other:
        count: str = "many"
    assert flags.field_types(Options, Other)["count"] is int and flags.field_types(Other, Options)["count"] is str
    assert sweep.parse_args(["--variants=b", "--lrs=1", "--out_dir=grid"]).out_dir == "grid"  # not train.py's


def test_there_is_one_usage_error():
    assert configs.flags.UsageError is data.UsageError is sweep.UsageError is plot.UsageError is bench.UsageError
    for script in SCRIPTS:
        with open(os.path.join(ROOT, script)) as f:
            tree = ast.parse(f.read())
        classes = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
        assert "UsageError" not in classes, f"{script} defines a UsageError of its own"


@dataclass
class HelpOptions:
    start: str = flags.help_of("the text to continue", default="\n")
    max_new_tokens: int = flags.help_of("tokens to add", default=200)
    out: str = flags.help_of("a folder", default="")


def test_help_is_a_table_whatever_the_names_and_defaults(capsys):
    flags.print_help("A script.", HelpOptions)
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index("") + 1:]
    # a newline default is shown escaped, not as a break in the table; every default starts in one column
    assert [line.split()[:2] for line in table] == [["flag", "default"], ["--start", "'\\n'"],
                                                    ["--max_new_tokens", "200"], ["--out", "(none)"]]
    assert len({line.index(line.split()[1]) for line in table}) == 1


def plain_docstrings_with_a_joined_line():
    """"path:line" of each docstring of the house that is no raw string and ends a line with one backslash: Python
    joins that line to the next, the next one's indent included."""
    found = []
    for path in sorted([*glob.glob(os.path.join(ROOT, "*.py")), *glob.glob(os.path.join(ROOT, "*", "*.py"))]):
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = node.body[0] if node.body else None
            if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                continue
            text = ast.get_source_segment(source, first.value)
            if not text.lower().startswith(("r", "br")) and re.search(r"(?<!\\)(?:\\\\)*\\\n", text):
                found.append(f"{os.path.relpath(path, ROOT)}:{first.lineno}")
    return found


def test_a_docstring_keeps_its_line_breaks():
    """sweep.py --help showed its example command as one line with a run of spaces inside: a shell's line
    continuation (a backslash at a line's end) in a plain docstring joins the lines. Such a docstring is raw."""
    assert plain_docstrings_with_a_joined_line() == []


def test_sweep_help_shows_its_example_command_on_two_lines(capsys):
    assert sweep.main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, line in enumerate(lines) if "--mode=lr" in line)
    assert lines[first].endswith("--mode=lr \\")
    assert lines[first + 1] == "        --jobs=2 --out_dir=sweeps/lr --max_iters=300"
