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
`build(cls, given)` the dataclass of those that are its fields; FLOAT_RANGES the values each float flag of train.py
means something at (GPTConfig's and TrainConfig's: both read this one table, and configurable.txt says it), with
`out_of_range` to hold a value to it; `print_help` prints --help from a script's docstring
and its dataclass, or a catalog file (configurable.txt); `split` separates the flags of some dataclasses from the
rest, for a script that hands flags on to another's.
"""

import dataclasses
import difflib
import math
import os
import re
import sys
import typing
from typing import Literal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root, where configurable.txt is

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
    fits = type(value) in (int, float) and math.isfinite(value) if kind is float else type(value) is kind
    what = {bool: "a boolean", int: "an integer", float: "a finite number", str: "a string"}[kind]
    return None if fits else f"{name} is {value!r:.40}, not {what}"


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


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a float flag means something at: low to high, each end included or not; with off, 0 too (0 turns
    the feature off). why: what lies outside, for the one line that refuses it."""
    low: float
    high: float = math.inf
    low_in: bool = True
    high_in: bool = True
    off: bool = False
    why: str = ""

    def holds(self, value):
        above = self.low <= value if self.low_in else self.low < value
        below = value <= self.high if self.high_in else value < self.high
        return (self.off and value == 0) or (above and below)

    def text(self):
        """As configurable.txt's allowed column says it (after "float "): "in [0, 1)", "> 0", "0 (off) or >= 1"."""
        if self.high == math.inf:
            span = f"{'>=' if self.low_in else '>'} {self.low:g}"
        else:
            span = f"in {'[' if self.low_in else '('}{self.low:g}, {self.high:g}{']' if self.high_in else ')'}"
        return f"0 (off) or {span}" if self.off else span


# Every float flag of train.py (model.py's GPTConfig, configs.py's TrainConfig), bounded by what it means, so that
# a typo is one line and not a run that "diverges" at step 0 (a sweep would count it as a result) or learns nothing.
FLOAT_RANGES = {
    # model
    "dropout": Range(0, 1, high_in=False),
    "mix_ln_ratio": Range(0, 1, why=" (the share of Post-LN layers)"),
    # DyT (Zhu et al. 2025) uses alpha0 from 0.2 to 0.8 (LLaMA) and 0.5 elsewhere: past 10 tanh(alpha0 x) of an
    # activation of scale 1 is a sign function; below 1e-7 the branch it starts, about alpha in size, is lost in
    # float32 beside a residual of about 1 (2^-24 = 6e-8 of it)
    "dyt_alpha": Range(1e-7, 10, why=" (below 1e-7 its branch is lost in float32 beside the residual; past 10 "
                                     "tanh(alpha x) is a sign function)"),
    "dyt_alpha_attn": Range(1e-7, 10, why=" (below 1e-7 its branch is lost in float32 beside the residual; past 10 "
                                          "tanh(alpha x) is a sign function)"),
    # eps guards a variance that is about 1 at init (Ba et al. 2016); a larger one outweighs it, and every norm
    # output shrinks toward 0 (1e300 trains nothing). BERT's 1e-12 is the smallest in common use; 1e-300 is 0 in
    # float32, and a row (or channel) whose values are all equal is then 0 / 0
    "norm_eps": Range(1e-12, 1, why=" (eps guards a variance of about 1; a larger one shrinks every norm output "
                                    "toward 0, and below BERT's 1e-12 it guards nothing: 1e-300 is 0 in float32)"),
    # PowerNorm eq. (10) and (13): EMA factors, the weight of the past; at 0 the running statistic is the last
    # batch's (torch's BatchNorm momentum=1), at 1 it never moves
    "pn_alpha_fwd": Range(0, 1, high_in=False, why=" (an EMA factor: 0 keeps only the last batch, 1 never moves)"),
    "pn_alpha_bwd": Range(0, 1, high_in=False, why=" (an EMA factor: 0 keeps only the last batch, 1 never moves)"),
    # NormFormer §3 initializes ResScale's lambda at 1; CaiT's LayerScale starts near 0 (0.1 to 1e-6), so that each
    # block starts near the identity. Below 1e-7 what lambda scales is lost in float32 beside the other term of
    # the sum, of about 1 (2^-24 = 6e-8 of it): the residual, or the branch, is cut
    "scale_resids_init": Range(1e-7, 10, why=" (ResScale's lambda scales the residual; NormFormer starts it at 1, "
                                             "and below 1e-7 the residual is lost in float32 beside the branch)"),
    "layer_scale_init": Range(1e-7, 1, why=" (LayerScale starts each branch small: CaiT uses 0.1 to 1e-6; below "
                                          "1e-7 the branch is lost in float32 beside the residual)"),
    "embed_grad_scale": Range(0, 1, why=" (1 = off)"),
    # Gemma 2 §2 caps at 50 and 30: c * tanh(s / c) bounds the logits to +-c. Below 1e-3 every softmax is uniform
    # to within 0.1% (a subnormal c made s / c overflow); above 1e4 no logit of a training run reaches the cap, and
    # past float32's range c is infinite and the cap NaN
    "attn_softcap": Range(1e-3, 1e4, off=True, why=" (a cap bounds the logits to +-cap)"),
    "logit_softcap": Range(1e-3, 1e4, off=True, why=" (a cap bounds the logits to +-cap)"),
    # a weight std past 1 makes each layer's output sqrt(d) times its input or more (GPT-2 uses 0.02); below 1e-4 a
    # weight is under float16's smallest normal number, 6.1e-5, in a --dtype=float16 matmul (subnormal, and 0 under
    # 6e-8), and 1e-300 is 0 in float32: every unit of a layer starts the same and the run learns nothing
    "init_std": Range(1e-4, 1, why=" (GPT-2 uses 0.02; past 1 every layer multiplies its input, below 1e-4 a "
                                   "weight is subnormal or 0 in float16)"),
    # training
    # AdamW moves each weight by at most about the LR a step; a float32 weight of 1 (a norm's gain) moves only by
    # more than half its spacing, 2^-24 = 6e-8, so below 1e-7 the gains never move (and 1e-300 moves nothing)
    "lr": Range(1e-7, 1e3, why=" (AdamW moves every weight by about the LR each step; below 1e-7 a float32 norm "
                               "gain of 1 never moves)"),
    # 0 decays the LR to 0, a schedule of its own; at most --lr where the schedule decays (configs.check_train_config)
    "min_lr": Range(0, 1e3, why=" (0 decays the LR to 0)"),
    # AdamW multiplies each weight by 1 - lr * weight_decay a step (0.1 is usual): past 10 it is a typo
    "weight_decay": Range(0, 10, why=" (AdamW shrinks each weight by lr x weight_decay a step; 0.1 is usual)"),
    "beta1": Range(0, 1, high_in=False),
    "beta2": Range(0, 1, high_in=False),
    # GPT-3 clips at 1.0. A clipped gradient's entries are about grad_clip / sqrt(N): below 1e-3, with N up to 1e9
    # parameters, they fall to AdamW's eps (1e-8), which then shrinks every update (1e-300 makes them 0)
    "grad_clip": Range(1e-3, off=True, why=" (0 turns clipping off; below 1e-3 the clipped gradient falls to "
                                           "AdamW's eps of 1e-8 and the run learns little or nothing)"),
    # a run starts near the loss of a uniform guess, ln(vocabulary) >= ln 2 (two tokens): a bound below ln 2 is
    # crossed by the first steps of every run, which then "diverges" at step 2
    "diverge_loss": Range(math.log(2), why=" (every run starts at about ln(vocabulary) >= ln 2, so a bound below "
                                           "ln 2 is crossed by its first steps)"),
    "diverge_gap": Range(0, why=" (0 turns it off)"),
    # a z-score (in float64): 0 flags every step above the window's mean; below 0 a drop would be a spike
    "spike_z": Range(0, why=" (a z-score: below 0 a step below the window's mean would be a spike)"),
    # PaLM §5 uses 1e-4: at 1 the term weighs as much as the loss it regularizes
    "z_loss": Range(0, 1, why=" (0 turns it off; PaLM uses 1e-4)"),
    # in TFLOP/s: below 1e-3 (1 GFLOP/s, slower than any GPU) it is a typo of units, and a tiny one overflows the MFU
    "gpu_peak_tflops": Range(1e-3, why=" (in TFLOP/s: below 1e-3, 1 GFLOP/s, no GPU is that slow)"),
}


def out_of_range(name, value):
    """The one line refusing a float flag's value outside FLOAT_RANGES, or None (None itself, an Optional flag's
    default, is no value to hold)."""
    bounds = FLOAT_RANGES[name]
    if value is None or bounds.holds(value):
        return None
    return f"--{name}={value} must be {bounds.text()}{bounds.why}"


def first_out_of_range(config):
    """out_of_range's line for the first field of a config dataclass (in field order) that FLOAT_RANGES bounds and
    its value breaks, or None."""
    for name in (f.name for f in dataclasses.fields(config) if f.name in FLOAT_RANGES):
        problem = out_of_range(name, getattr(config, name))
        if problem:
            return problem
    return None


def build(cls, given):
    """cls with the given flags that are its fields; the others keep their defaults."""
    return cls(**{k: v for k, v in given.items() if k in cls.__dataclass_fields__})


def wants_help(argv):
    return "--help" in argv or "-h" in argv


def print_help(doc, *classes, catalog=None):
    """The script's docstring, then its flags: the lines of a catalog file (configurable.txt, whose first two
    lines say how it is checked), or a line per field with its name, default and meaning (help_of)."""
    print(doc.strip())
    if catalog:
        with open(os.path.join(ROOT, catalog)) as f:
            print("\n".join(f.read().splitlines()[2:]))
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
