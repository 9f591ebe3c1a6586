"""configurable.txt agrees with the code, and train.py's flags parse (or fail with one line) as documented."""

import dataclasses
import math
import os
import re
import typing

import pytest

from engine import flags
import configs
from model import GPTConfig, PRESETS
from conftest import ROOT



def read_catalog():
    """{flag: (default, allowed)} from configurable.txt; columns are separated by two or more spaces."""
    rows = {}
    with open(os.path.join(ROOT, "configurable.txt")) as f:
        for line in f:
            if not line.strip() or line.startswith("#") or line.startswith("preset="):
                continue
            columns = re.split(r"\s{2,}", line.strip())
            assert len(columns) == 5, f"configurable.txt: expected 5 columns in {line!r}"
            name, default, allowed = columns[:3]
            assert name not in rows, f"configurable.txt lists {name} twice"
            rows[name] = (default, allowed)
    return rows


def code_flags():
    """{flag: (default, type)} from GPTConfig and TrainConfig."""
    types = flags.field_types(GPTConfig, configs.TrainConfig)
    defaults = {f.name: f.default for cls in (GPTConfig, configs.TrainConfig) for f in dataclasses.fields(cls)}
    return {name: (defaults[name], types[name]) for name in types}


def test_catalog_lists_exactly_the_flags_of_the_code():
    catalog, code = set(read_catalog()), set(code_flags())
    assert not code - catalog, f"flags missing from configurable.txt: {sorted(code - catalog)}"
    assert not catalog - code, f"configurable.txt lists flags the code lacks: {sorted(catalog - code)}"


def test_catalog_defaults_match_the_code():
    catalog = read_catalog()
    for name, (default, _) in code_flags().items():
        assert catalog[name][0] == str(default), f"{name}: catalog says {catalog[name][0]}, code says {default}"


def test_catalog_allowed_values_match_the_code():
    catalog = read_catalog()
    for name, (default, kind) in code_flags().items():
        allowed = catalog[name][1]
        optional = typing.get_origin(kind) is typing.Union
        if optional:
            assert "None" in allowed, f"{name} accepts None; configurable.txt should say so"
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        choices = flags.allowed_values(name, kind, configs.CHOICES)
        if choices is not None:
            values = [v for v in allowed.split("|") if not (optional and v == "None")]
            assert values == choices, f"{name}: catalog allows {allowed}, code allows {choices}"
        elif kind is bool:
            assert allowed == ("bool, or None" if optional else "bool") or allowed.startswith("bool, or None ("), name
        elif kind is float:
            # the range the checks read (flags.FLOAT_RANGES), as the catalog says it
            assert name in flags.FLOAT_RANGES, f"{name} is a float flag without a range in flags.FLOAT_RANGES"
            said = f"float {flags.FLOAT_RANGES[name].text()}"
            assert allowed.startswith(said), f"{name}: catalog allows {allowed}, FLOAT_RANGES allows {said}"
        elif kind is int:
            assert allowed.startswith("int"), f"{name}: allowed values should start with int"


@pytest.mark.parametrize("name", sorted(flags.FLOAT_RANGES))
def test_every_float_flag_is_refused_outside_its_range_and_taken_at_its_ends(name):
    """Each end of each range, and a value just past it, through the one resolution of the flags (configs.resolve):
    inside it builds, outside it is one line naming the flag and the range the catalog says."""
    bounds = flags.FLOAT_RANGES[name]
    ends = [bounds.low, *([bounds.high] if bounds.high != math.inf else [1e300])]
    inside = [v for v, included in zip(ends, (bounds.low_in, bounds.high_in or bounds.high == math.inf)) if included]
    outside = [v for v, included in zip(ends, (bounds.low_in, bounds.high_in)) if not included]
    outside += [bounds.low - max(abs(bounds.low), 1) / 2] + ([bounds.high * 2] if bounds.high != math.inf else [])
    outside += [bounds.low / 2] if bounds.low > 0 else []  # just below a floor above 0 (issue 46: 1e-300 passed)
    if bounds.off:
        inside.append(0.0)
        outside = [v for v in outside if v != 0] + [bounds.low / 2]
    base = {"init": "plain"} if name == "init_std" else {}
    for value in inside:
        configs.resolve({**base, "min_lr": 0.0, "lr": max(value, 1e-3) if name == "min_lr" else 4e-3, name: value},
                        machine=False)
    for value in outside:
        with pytest.raises(flags.UsageError) as error:
            configs.resolve({**base, name: value}, machine=False)
        assert str(error.value).startswith(f"--{name}={value} must be {bounds.text()}"), str(error.value)


@pytest.mark.parametrize("name", sorted(flags.FLOAT_RANGES))
def test_no_float_range_is_open_at_zero(name):
    """A range is closed at its lower end, or its floor is above 0 (issue 46): one open at 0 took 1e-300, which is 0
    in float32 (--lr=1e-300 learned nothing, --init_std=1e-300 ended at ln 256). 0 itself is allowed only where it
    means something (off, no decay, no memory)."""
    bounds = flags.FLOAT_RANGES[name]
    assert bounds.low_in, f"{name}: {bounds.text()} takes any value above {bounds.low:g}"


def read_catalog_presets():
    """{preset: {flag: text}} from the `preset=NAME  flags  source` lines of configurable.txt."""
    presets = {}
    with open(os.path.join(ROOT, "configurable.txt")) as f:
        for line in f:
            if line.startswith("preset="):
                name, settings, source = re.split(r"\s{2,}", line.strip())
                assert source, f"preset {name} needs a source"
                pairs = [] if settings.startswith("(none") else [kv.split("=") for kv in settings.split()]
                presets[name.removeprefix("preset=")] = dict(pairs)
    return presets


def test_catalog_presets_match_the_code():
    catalog = read_catalog_presets()
    assert list(catalog) == list(PRESETS)
    for name, preset in PRESETS.items():
        assert catalog[name] == {k: str(v) for k, v in preset.items()}, f"preset {name} differs from the catalog"


def test_every_preset_names_real_flags():
    names = set(GPTConfig.field_names())
    for preset, preset_flags in PRESETS.items():
        assert set(preset_flags) <= names, f"preset {preset} sets unknown flags {set(preset_flags) - names}"
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
