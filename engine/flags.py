"""
The command line of every script: one parser and one UsageError. Each script declares its options as the fields
of a dataclass; a flag is --key=value, --key value, or a bare --key for True, and its text becomes a value of the
field's type: bool takes true/false/1/0/yes/no in any case and nothing else, int takes ASCII digits (at most
2^31 - 1 in size, a seed 2^63 - 1), float a finite number of ASCII digits (no underscores), a Literal (or a list
of choices the script gives) one of its values, and Optional[X] also None.
An unknown flag gets the nearest names as a hint (difflib). Bad input is a UsageError, which the script prints
as one line `script.py: what was wrong; what is allowed` on stderr before it exits with code 2 (`fail`).
Imports only the standard library: python data.py starts without loading torch.

`parse(argv, *classes, choices=..., positional=...)` gives {flag: value} for the flags a command line sets, each
checked against the fields of the dataclasses (positional: the key the other arguments are listed under), and
`build(cls, given)` the dataclass of those that are its fields; `print_help` prints --help from a script's docstring
and its dataclass, or a catalog's text (train.py's: configs.catalog); `split` separates the flags of some
dataclasses from the rest, for a script that hands flags on to another's. The ranges of train.py's flags are part of
their declarations (model.flag).
"""

import dataclasses
import difflib
import math
import re
import sys
import typing
from typing import Literal

BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


class UsageError(Exception):
    """Bad input from the command line (or a file it names): printed as one line, exit code 2."""


def help_of(meaning, **kwargs):
    """A dataclass field with its meaning for --help: `rounds: int = help_of("rounds to time", default=45)`."""
    return dataclasses.field(metadata={"help": meaning}, **kwargs)


def field_types(*classes):
    """{flag: type} of the fields of the dataclasses; where two share a name, the first class owns it."""
    types = {}
    for cls in reversed(classes):
        types.update(typing.get_type_hints(cls))
    return {name: types[name] for cls in classes for name in (f.name for f in dataclasses.fields(cls))}


def plain_type(kind):
    """(X, True) for Optional[X], else (kind, False)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Union and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return kind, False


def allowed_values(name, kind, choices=None):
    """The values a flag accepts, as a list, or None where any value of its type goes."""
    if choices and name in choices:
        return list(choices[name])
    if typing.get_origin(kind) is Literal:
        return list(typing.get_args(kind))
    return None


def convert(name, text, kind, choices=None):
    """The text of --name=text as a value of the field's type, or a UsageError saying what is allowed."""
    kind, optional = plain_type(kind)
    if optional and text == "None":
        return None
    allowed = allowed_values(name, kind, choices)
    if allowed is not None:
        if text not in allowed:
            raise UsageError(f"--{name}={text} is not allowed; choose one of {', '.join(allowed)}")
        return text
    if kind is bool:
        if text.lower() not in BOOLEANS:
            raise UsageError(f"--{name}={text} is not a boolean; use True or False (or 1/0, yes/no)")
        return BOOLEANS[text.lower()]
    if kind in (int, float):
        return number(name, text, kind)
    return kind(text)


def wrong_type(name, value, kind, choices=None):
    """What is wrong with a value of a field of this type that a file holds (a checkpoint's configs), such as
    "batch_size is 'x', not an int", or None: a file is held to what the command line allows."""
    kind, optional = plain_type(kind)
    if value is None:
        return None if optional else f"{name} is None, not {kind.__name__}"
    allowed = allowed_values(name, kind, choices)
    if allowed is not None:
        return None if value in allowed else f"{name} is {value!r:.40}, not one of {', '.join(map(str, allowed))}"
    fits = finite_number(value) if kind is float else type(value) is kind
    what = {bool: "a boolean", int: "an integer", float: "a finite number", str: "a string"}[kind]
    return None if fits else f"{name} is {value!r:.40}, not {what}"


def finite_number(value):
    """A finite int or float, not a bool (lab/tables.finite_number takes a bool as a number): what a file's float
    field, or AdamW's state (run_folder.optimizer_mismatch), may hold."""
    return type(value) in (int, float) and math.isfinite(value)


# int() and float() also take " 3", "1_0" and other scripts' digits (Arabic-Indic, fullwidth): a number on a command
# line is ASCII digits with an optional sign, point and exponent, the one grammar of every script's numbers
INT_TEXT = re.compile(r"[+-]?[0-9]+")
FLOAT_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
INT_LIMIT = 2 ** 31 - 1  # a C int: what torch, numpy and the OS take for a count, a size, an index or a length
SEED_LIMIT = 2 ** 63 - 1  # a seed goes to torch.manual_seed, which takes an int64's range (and nanonorm's >= 0)


def number(name, text, kind):
    """The text of --name=text as an int or a finite float of the one grammar (INT_TEXT, FLOAT_TEXT); an int is at
    most INT_LIMIT in size (SEED_LIMIT for a seed), so no huge count reaches a loop or an allocation."""
    if kind is float and text.lower().lstrip("+-") in ("inf", "infinity", "nan"):
        raise UsageError(f"--{name}={float(text)} is not a finite number")
    if not (INT_TEXT if kind is int else FLOAT_TEXT).fullmatch(text):
        what = "an int (ASCII digits)" if kind is int else "a number (ASCII digits, a point, an exponent: 3e-4)"
        raise UsageError(f"--{name}={text} is not a valid {kind.__name__}; give {what}")
    value = kind(text)
    limit = SEED_LIMIT if name.endswith("seed") else INT_LIMIT
    if kind is int and abs(value) > limit:
        raise UsageError(f"--{name}={text} is too large; an integer flag is at most {limit:,} in size")
    if kind is float and not math.isfinite(value):  # 1e999
        raise UsageError(f"--{name}={text} is not a finite number")
    return value


def items(argv, types):
    """(name, text, the argv entries it came from) for each flag, text None for a bare --name; (None, entry,
    [entry]) for an entry that is not a flag. A flag of these types takes the next entry as its value unless that
    is a flag too (then a bare boolean is True)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, has_value, text = arg[2:].partition("=")
        if not arg.startswith("--") or not name:
            yield None, arg, [arg]
        elif has_value:
            yield name, text, [arg]
        elif name in types and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            i += 1
            yield name, argv[i], [arg, argv[i]]
        else:
            yield name, None, [arg]
        i += 1


def replaced(argv, new):
    """argv less the flags that new names, then new: each flag once, as the parsers take them (they refuse a flag
    given twice). sweep.py puts a recipe's and a variant's flags over the common ones this way, and lab.device_check
    the GPU's over a recipe's."""
    names = {entry[2:].partition("=")[0] for entry in new if entry.startswith("--")}
    return [entry for entry in argv if not (entry.startswith("--") and entry[2:].partition("=")[0] in names)] + \
        list(new)


def split(argv, *classes):
    """argv's entries for the fields of these dataclasses, and the others as they were, in order."""
    types = field_types(*classes)
    own, rest = [], []
    for name, _, entries in items(argv, types):
        (own if name in types else rest).extend(entries)
    return own, rest


def parse(argv, *classes, choices=None, positional=None):
    """{flag: typed value} of the flags argv sets, for the fields of the dataclasses. choices: {flag: allowed
    values} beyond the Literal types. positional: the key under which other arguments are listed (plot.py's
    folders); without it an argument that is not a flag is bad input."""
    types = field_types(*classes)
    given = {positional: []} if positional else {}
    typed = {}  # the entries each flag came from, to name both where one is given twice
    for name, text, entries in items(argv, types):
        if name is None:
            if not positional:
                raise UsageError(f"unexpected argument {text!r}; flags look like --key=value")
            given[positional].append(text)
        elif name in typed:  # the last would win without a word (--lr=1e-3 --lr=2e-3 ran at 2e-3)
            raise UsageError(f"--{name} is given twice ({' '.join(typed[name])}, then {' '.join(entries)}); give each "
                             "flag once")
        elif name not in types:
            close = difflib.get_close_matches(name, list(types), n=3)
            hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
            raise UsageError(f"unknown flag --{name}{hint} (--help lists every flag)")
        elif text is None and plain_type(types[name])[0] is bool:
            given[name] = True
        elif text is None:
            raise UsageError(f"--{name} needs a value (--{name}=VALUE)")
        else:
            given[name] = convert(name, text, types[name], choices)
        if name is not None:
            typed[name] = entries
    return given


def build(cls, given):
    """cls with the given flags that are its fields; the others keep their defaults."""
    return cls(**{k: v for k, v in given.items() if k in cls.__dataclass_fields__})


def wants_help(argv):
    return "--help" in argv or "-h" in argv


def print_help(doc, *classes, catalog=None):
    """The script's docstring, then its flags: a catalog's text (train.py's every flag, configs.catalog), or a line
    per field with its name, default and meaning (help_of)."""
    print(doc.strip())
    if catalog:
        print(catalog, end="")
        return
    width = max(len(f.name) for cls in classes for f in dataclasses.fields(cls)) + 2  # the longest --name
    print(f"\n{'flag':<{width}} {'default':<9} meaning")
    for cls in classes:
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            shown = str(default) if default != "" else "(none)"
            if isinstance(default, str) and not default.isprintable():
                shown = repr(default)  # a newline or tab would break the table
            print(f"{'--' + f.name:<{width}} {shown:<9} {f.metadata.get('help', '')}")


def fail(script, error):
    """Bad input, as one line on stderr; returns the exit code, 2."""
    print(f"{script}: {' '.join(str(error).split())}", file=sys.stderr)
    return 2
