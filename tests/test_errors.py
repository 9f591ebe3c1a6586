"""Bad input to data.py (each run as a real process) and bench.py (in this process, and once as a real process):
exit code 2, one line on stderr, no traceback, and every file under the working folder (data_dir included) exactly
as it was. train.py's table is in test_train_errors.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import data
from conftest import ROOT, folder_snapshot, refused
from lab import bench

# a model no machine can hold: a bench case that gets past the check it names is refused by the memory check instead
HUGE = ["--vocab_size=2000000000", "--n_embd=1000000"]


@pytest.fixture
def corpora(tmp_path):
    (tmp_path / "corpus.txt").write_text("some text, enough for a split\n" * 10)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    (tmp_path / "blob.txt").write_bytes(b"valid UTF-8 with a NUL\x00 byte\n")
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "no_text").mkdir()
    (tmp_path / "no_text" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "nothing").mkdir()
    return tmp_path


@pytest.mark.parametrize("args, says", [
    (["--dataset="], "--dataset is empty"),
    (["--dataset=absent.txt"], "no such file"),
    (["--dataset=empty.txt"], "holds no text"),
    (["--dataset=latin1.txt"], "not UTF-8 text"),
    (["--dataset=blob.txt"], "not UTF-8 text"),
    (["--dataset=nothing"], "holds no text"),
    (["--dataset=no_text"], "holds no text"),
    (["--dataset=corpus.txt", "--tokenizer=bpe"], "--tokenizer=bpe is not allowed; choose one of byte, gpt2"),
    (["--dataset=corpus.txt", "--tokenizer="], "--tokenizer= is not allowed; choose one of byte, gpt2"),
    (["--dataset=corpus.txt", "--bogus=1"], "unknown flag --bogus"),
    (["corpus.txt"], "unexpected argument 'corpus.txt'"),
    (["--dataset"], "--dataset needs a value"),
    (["--dataset=corpus.txt", "--url=file:///x"], "--url only applies"),
    (["--dataset=shakespeare", "--url=file:///no/such/input.txt"], "could not download"),
    (["--dataset=corpus.txt", "--data_dir=a_file/data"], "a_file/data"),
    (["--dataset=corpus.txt", "--data_dir=a_file"], "--data_dir=a_file"),
])
def test_data_bad_input(corpora, args, says):
    if not any(arg.startswith("--data_dir") for arg in args):
        args = [*args, "--data_dir=data"]
    assert says in refused(corpora, "data.py", args)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_data_dir_not_writable(corpora):
    (corpora / "locked").mkdir(mode=0o555)
    assert "--data_dir=locked/data" in refused(corpora, "data.py", ["--dataset=corpus.txt", "--data_dir=locked/data"])


def damage_meta(edit):
    def damage(folder):
        meta = json.loads((folder / "meta.json").read_text())
        edit(meta)
        (folder / "meta.json").write_text(json.dumps(meta))
    return damage


def truncate(name, n_bytes):
    def damage(folder):
        path = folder / name
        path.write_bytes(path.read_bytes()[:n_bytes])
    return damage


def set_token(path, index, value):
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[index] = value
    tokens.tofile(path)


@pytest.mark.slow
@pytest.mark.parametrize("damage, says", [
    (truncate("train.bin", -2), "train.bin has"),
    (truncate("train.bin", -1), "train.bin has"),  # half a token
    (truncate("train.bin", 0), "train.bin has 0 bytes"),
    (lambda folder: (folder / "val.bin").unlink(), "val.bin is missing"),
    (lambda folder: (folder / "meta.json").write_bytes(b"\x00{garbage"), "meta.json is not JSON"),
    (lambda folder: (folder / "meta.json").write_text("[]"), "meta.json's tokenizer"),
    (damage_meta(lambda meta: meta.pop("dtype")), "meta.json's dtype is None"),
    (damage_meta(lambda meta: meta.update(train_tokens=str(meta["train_tokens"]))), "meta.json's train_tokens"),
    (damage_meta(lambda meta: meta.update(val_tokens=True)), "meta.json's val_tokens"),
    (damage_meta(lambda meta: meta.update(train_tokens=meta["train_tokens"] + 1)), "train.bin has"),
    (damage_meta(lambda meta: meta.update(val_tokens=meta["val_tokens"] - 1)), "val.bin has"),
    (damage_meta(lambda meta: meta.update(dtype="uint32")), "stored as uint16"),
    (damage_meta(lambda meta: meta.update(dtype="float16")), "stored as uint16"),
    (damage_meta(lambda meta: meta.update(vocab_size=300)), "vocab_size is 300, but the byte tokenizer's is 256"),
    (damage_meta(lambda meta: meta.update(tokenizer="bpe")), "meta.json's tokenizer is 'bpe', not one of byte, gpt2"),
    (lambda folder: set_token(folder / "train.bin", 5, 256), "train.bin holds token id 256, but the vocabulary has"),
    (lambda folder: set_token(folder / "val.bin", 0, 65535), "val.bin holds token id 65535"),
])
def test_damaged_prepared_dataset(corpora, damage, says):
    folder = Path(data.prepare(str(corpora / "corpus.txt"), "byte", str(corpora / "data")))
    damage(folder)
    err = refused(corpora, "data.py", ["--dataset=corpus.txt", "--data_dir=data"])
    assert says in err and "damaged" in err and str(folder.relative_to(corpora)) in err, err


@pytest.mark.parametrize("args, says", [
    (["--variants=everything"], "--variants=everything is not allowed; choose one of norms"),
    (["--variants="], "--variants= is not allowed"),
    (["--rounds=two"], "--rounds=two is not a valid int"),
    (["--steps=0"], "--steps=0 must be"),
    (["--part=layer"], "--part=layer is not allowed; choose one of step, norm"),
    (["--part=norm", "--variants=presets"], "--part=norm times the norms of --variants=norms"),
    (["--norm=groupnorm"], "--norm=groupnorm is not allowed"),
    (["--bogus=1"], "unknown flag --bogus"),
    (["--batch_size=0"], "--batch_size=0 must be"),
    (["--device=tpu"], "--device=tpu is not a device"),
    (["extra"], "unexpected argument 'extra'"),
    (["--variants=presets", "--layout=post", "--scale_resids"], "scale_resids"),
    pytest.param(["--device=cuda"], "CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_bench_bad_input(tmp_path, monkeypatch, capsys, args, says):
    """In this process (one real process below): bench.py's checks run before it allocates anything."""
    monkeypatch.chdir(tmp_path)
    before = folder_snapshot(tmp_path)
    assert bench.main([*HUGE, *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("bench.py: ") and captured.err.count("\n") == 1 and says in captured.err
    assert captured.out == "" and folder_snapshot(tmp_path) == before


@pytest.mark.slow
def test_bench_bad_input_from_the_shell(tmp_path):
    assert "unknown flag --bogus" in refused(tmp_path, "bench.py", [*HUGE, "--bogus=1"])


@pytest.mark.slow
@pytest.mark.parametrize("script", ["sweep.py", "plot.py"])
def test_sweep_and_plot_help(script):
    done = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--out" in done.stdout and not done.stderr
