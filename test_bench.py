"""bench.py runs every variant of a group and reports each against the first; bad flags are one line."""

import bench
from norms import NORMS

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8", "--batch_size=2", "--vocab_size=64"]


def test_bench_times_every_norm_against_the_first(capsys):
    assert bench.main(["--rounds=1", "--steps=1", *TINY]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == [f"norm={kind}" for kind in NORMS]
    assert rows[0][2] == "1.00" and all(float(row[1]) > 0 for row in rows)


def test_bench_presets_with_an_explicit_override(capsys):
    assert bench.main(["--variants=presets", "--rounds=1", "--steps=1", *TINY, "--activation=geglu"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2 + len(bench.PRESETS)


def test_bench_bad_input_is_one_line(capsys):
    assert bench.main(["--variants=everything"]) == 2
    assert bench.main(["--steps=0"]) == 2
    assert bench.main(["--variants=presets", "--layout=post", "--scale_resids"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("bench.py: ") for line in err)
