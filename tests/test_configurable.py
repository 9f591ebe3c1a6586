"""configurable.txt agrees with the code, and train.py's flags parse (or fail with one line) as documented."""

import dataclasses
import math
import os
import re
import subprocess
import sys
import typing

import pytest

from engine import flags
import configs
import norms
from model import GPTConfig, Range
from presets import PRESETS
from conftest import ROOT


def declared(*classes):
    """[(flag, field, type)] of every field of the config classes."""
    types = flags.field_types(*classes)
    return [(f.name, f, types[f.name]) for cls in classes for f in dataclasses.fields(cls)]


CONFIGS = (GPTConfig, configs.TrainConfig)
RANGES = {name: f.metadata["allowed"] for name, f, _ in declared(*CONFIGS) if isinstance(f.metadata["allowed"], Range)}


def test_catalog_is_generated_from_the_declarations_and_current():
    """configurable.txt is what `python configs.py` prints now: regenerate it after changing a declaration."""
    with open(os.path.join(ROOT, "configurable.txt")) as f:
        assert f.read() == configs.catalog(), "configurable.txt is stale: python configs.py > configurable.txt"
    result = subprocess.run([sys.executable, "configs.py"], cwd=ROOT, capture_output=True, text=True)
    assert result.stdout == configs.catalog()


@pytest.mark.parametrize("argv", [["foo"], ["--nosuch"], ["--n_layer=3"]])
def test_configs_py_takes_no_arguments(capsys, argv):
    """An argument is refused in one line (it printed the whole catalog, exit code 0, as if it were taken)."""
    assert configs.main(argv) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == (f"configs.py: {argv[0]} is not taken: configs.py takes no "
                                                 "arguments; run python configs.py > configurable.txt\n")


def test_catalog_fits_in_120_columns_and_lists_every_flag_and_preset_once():
    lines = configs.catalog().splitlines()
    assert max(map(len, lines)) <= 120
    named = [line.split()[0] for line in lines if line and not line[0].isspace() and not line.startswith("#")]
    expected = [name for name, _, _ in declared(*CONFIGS)] + [f"preset={name}" for name in PRESETS]
    assert named == expected


@pytest.mark.parametrize("name, field, kind", declared(*CONFIGS), ids=lambda v: v if isinstance(v, str) else "")
def test_every_flag_declares_its_meaning_source_and_range(name, field, kind):
    """A declaration says what the flag means and where it comes from; a number has a range (a Range, checked by
    GPTConfig and check_train_config, or the words of a rule between flags); an Optional says what None means."""
    meta = field.metadata
    assert meta["meaning"] and meta["source"], name
    plain, optional = flags.plain_type(kind)
    if plain in (int, float):
        assert isinstance(meta["allowed"], Range) or (plain is int and meta["allowed"]), name
    if plain is float:
        assert isinstance(meta["allowed"], Range), f"{name}: a float flag is held to a Range"
    if optional and name != "preset":
        assert meta["none"], f"{name}: say what None means"
    needs = meta["needs"]
    if needs is not None:
        other, values = needs if isinstance(needs, tuple) else (needs, None)
        assert other in dict((n, f) for n, f, _ in declared(*CONFIGS)), name
        assert values is None or set(values) <= set(typing.get_args(flags.field_types(*CONFIGS)[other])), name


def test_catalog_says_each_range_as_the_refusal_does():
    text = configs.catalog()
    for name, bounds in RANGES.items():
        kind = flags.plain_type(flags.field_types(*CONFIGS)[name])[0].__name__
        assert re.search(rf"^{name} +\S+ +{re.escape(kind + ' ' + bounds.text())}", text, re.M), name


def test_norm_flags_have_an_effect_only_with_the_norms_that_read_them():
    """The no-effect warning of a norm's flag comes from norms.TABLE (the arguments of each norm's class)."""
    fields = {f.name: f for f in dataclasses.fields(GPTConfig)}
    for name in norms.NORM_FLAGS:
        assert fields[name].metadata["needs"] == ("norm", norms.readers(name)), name
    assert norms.readers("pn_alpha_bwd") == ("powernorm",) and norms.readers("norm_eps") == tuple(
        kind for kind in norms.NORMS if kind not in ("dyt", "none"))


# where each flag that is not a norm's has an effect at all, as the papers and the schedule define it
GATES = {"mix_ln_ratio": ("layout", ("mix",)), "head_scale_at": "scale_heads", "scale_resids_init": "scale_resids",
         "layer_scale_init": "layer_scale", "embed_scale_learned": "embed_scale",
         "min_lr": ("lr_schedule", ("cosine", "linear")), "lr_decay_iters": ("lr_schedule", ("cosine", "linear")),
         "warmup_iters": ("lr_schedule", ("cosine", "linear", "constant")), "seq_warmup_start": "seq_warmup_iters",
         "wandb_project": "wandb", "wandb_run_name": "wandb", "wandb_group": "wandb", "wandb_tags": "wandb"}
UNMET = {"layout": "pre", "scale_heads": False, "scale_resids": False, "layer_scale": False, "embed_scale": False,
         "lr_schedule": "ramp", "seq_warmup_iters": 0, "wandb": False}
VALUES = {"mix_ln_ratio": 0.5, "head_scale_at": "after_proj", "scale_resids_init": 2.0, "layer_scale_init": 0.1,
          "embed_scale_learned": True, "min_lr": 0.0, "lr_decay_iters": 100, "warmup_iters": 10,
          "seq_warmup_start": 4, "wandb_project": "lab", "wandb_run_name": "run", "wandb_group": "arm",
          "wandb_tags": "a,b"}


def test_each_gated_flag_warns_where_its_gate_is_shut_and_not_where_it_is_open():
    """A declaration's `needs` is the no-effect warning: given where the gate is shut, it says so in one line naming
    the gate; where it is open, nothing."""
    declared_gates = {name: f.metadata["needs"] for name, f, _ in declared(*CONFIGS)
                      if f.metadata["needs"] and name not in norms.NORM_FLAGS}
    assert declared_gates == GATES
    for name, gate in GATES.items():
        other = gate[0] if isinstance(gate, tuple) else gate
        opened = {other: gate[1][0] if isinstance(gate, tuple) else 8 if other == "seq_warmup_iters" else True}
        for setting, warns in ((UNMET, True), (opened, False)):
            given = {other: setting[other], name: VALUES[name]}
            model_cfg, tc, _, _ = configs.resolve(given, machine=False)
            said = configs.no_effect_warnings(given, model_cfg, tc)
            assert said == ([f"train.py: warning: --{name} has no effect with --{other}={setting[other]}"]
                            if warns else []), (name, said)


@pytest.mark.parametrize("name", sorted(RANGES))
def test_every_ranged_flag_is_refused_outside_its_range_and_taken_at_its_ends(name):
    """Each end of each range, and a value just past it, through the one resolution of the flags (configs.resolve):
    inside it builds, outside it is one line naming the flag and the range the catalog says. An int's upper end,
    where it has none, is the parser's limit (engine/flags.INT_LIMIT)."""
    bounds = RANGES[name]
    kind = flags.plain_type(flags.field_types(*CONFIGS)[name])[0]
    top = 1e300 if kind is float else flags.INT_LIMIT
    ends = [bounds.low, bounds.high if bounds.high != math.inf else top]
    inside = [v for v, included in zip(ends, (bounds.low_in, bounds.high_in or bounds.high == math.inf)) if included]
    outside = [v for v, included in zip(ends, (bounds.low_in, bounds.high_in)) if not included]
    outside += [bounds.low - max(abs(bounds.low), 1) / 2 if kind is float else bounds.low - 1]
    outside += [bounds.high * 2] if bounds.high != math.inf else []
    outside += [bounds.low / 2] if kind is float and bounds.low > 0 else []  # below a floor above 0 (1e-300 passed)
    if bounds.off:
        inside.append(0.0)
        outside = [v for v in outside if v != 0] + [bounds.low / 2]
    if kind is int:
        # the model's sizes at the parser's limit are refused by the memory check, and a vocabulary of 1 by the
        # tokenizer's: their own rules, not the range's
        inside = [v for v in inside if v < 2 ** 20 and name != "vocab_size"]
    base = {"init": "plain"} if name == "init_std" else {"n_head": 1} if name == "n_embd" else {}
    for value in inside:
        configs.resolve({**base, "min_lr": 0.0, "lr": max(value, 1e-3) if name == "min_lr" else 4e-3, name: value},
                        machine=False)
    for value in outside:
        with pytest.raises(flags.UsageError) as error:
            configs.resolve({**base, name: value}, machine=False)
        assert str(error.value).startswith(f"--{name}={value} must be {bounds.said or bounds.text()}"), str(error.value)


FLOAT_RANGES = sorted(n for n in RANGES if flags.plain_type(flags.field_types(*CONFIGS)[n])[0] is float)


@pytest.mark.parametrize("name", FLOAT_RANGES)
def test_no_float_range_is_open_at_zero(name):
    """A range is closed at its lower end, or its floor is above 0: one open at 0 took 1e-300, which is 0 in float32
    (--lr=1e-300 learned nothing, --init_std=1e-300 ended at ln 256). 0 itself is allowed only where it means
    something (off, no decay, no memory)."""
    bounds = RANGES[name]
    assert bounds.low_in, f"{name}: {bounds.text()} takes any value above {bounds.low:g}"


def test_every_preset_names_real_flags():
    names = set(GPTConfig.field_names())
    for preset, preset_flags in PRESETS.items():
        assert set(preset_flags) <= names, f"preset {preset} sets unknown flags {set(preset_flags) - names}"
        assert preset_flags.source, preset
        GPTConfig(**preset_flags)


def test_flag_syntaxes_parse_to_typed_values():
    given = configs.parse_flags(["--norm=rmsnorm", "--n_layer", "3", "--scale_heads", "--bias=False",
                               "--lr=3e-4", "--init_std=None", "--compile"])
    assert given == {"norm": "rmsnorm", "n_layer": 3, "scale_heads": True, "bias": False, "lr": 3e-4,
                     "init_std": None, "compile": True}


def test_preset_applies_first_and_explicit_flags_override():
    model_cfg, _ = configs.build_configs(configs.parse_flags(["--preset=normformer", "--scale_heads=False"]))
    assert model_cfg.scale_attn and model_cfg.scale_fc and not model_cfg.scale_heads


@pytest.mark.parametrize("argv, expected", [
    (["--nrom=layernorm"], "unknown flag --nrom; did you mean --norm"),
    (["--norm=groupnorm"], "--norm=groupnorm is not allowed; choose one of layernorm, rmsnorm"),
    (["--n_layer=abc"], "--n_layer=abc is not a valid int"),
    (["--bias=maybe"], "--bias=maybe is not a boolean"),
    (["--lr"], "--lr needs a value"),
    (["norm=layernorm"], "unexpected argument"),
    (["--preset=gpt5"], "--preset=gpt5 is not allowed; choose one of baseline"),
])
def test_bad_flags_are_one_clear_line(argv, expected):
    with pytest.raises(flags.UsageError) as error:
        configs.build_configs(configs.parse_flags(argv))
    assert expected in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("argv, expected", [
    (["--n_embd=30", "--n_head=4"], "--n_embd=30 must be divisible by --n_head=4"),
    (["--layout=post", "--scale_resids"], "--scale_resids"),
    (["--init=xavier", "--init_std=0.1"], "--init_std"),
    (["--pn_alpha_fwd=1.5"], "--pn_alpha_fwd=1.5 must be in [0, 1)"),
])
def test_meaningless_combinations_fail_at_config_time(argv, expected):
    with pytest.raises(flags.UsageError) as error:
        configs.build_configs(configs.parse_flags(argv))
    assert expected in str(error.value)
