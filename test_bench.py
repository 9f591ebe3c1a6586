"""bench.py runs every variant of a group and reports each against the first (bad input: test_errors.py)."""

import bench
from norms import NORMS

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8", "--batch_size=2", "--vocab_size=64"]


def test_bench_times_every_norm_against_the_first(capsys):
    assert bench.main(["--rounds=1", "--steps=1", *TINY]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == [f"norm={kind}" for kind in NORMS]
    assert rows[0][2] == "1.00" and all(float(row[1]) > 0 for row in rows)


def test_bench_presets_with_an_explicit_override(capsys):
    assert bench.main(["--variants", "presets", "--rounds", "1", "--steps=1", *TINY, "--activation=geglu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(bench.PRESETS) and "1 rounds x 1 steps" in lines[0]


def test_bench_help_lists_its_flags_with_the_defaults_it_uses(capsys):
    assert bench.main(["--steps=2", "--help"]) == 0
    out = capsys.readouterr().out
    _, rounds, steps, _, _ = bench.parse(["--variants", "norms"])
    defaults = {"variants": "norms", "rounds": str(rounds), "steps": str(steps)}
    for name, default in defaults.items():
        assert any(line.split()[:2] == [f"--{name}", default] for line in out.splitlines()), (name, out)
    assert "python train.py --help" in out and "configurable.txt" in out
    assert all(group in out for group in bench.VARIANTS)
