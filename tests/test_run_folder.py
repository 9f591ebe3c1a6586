"""Nothing lost: Ctrl-C, kill -9 at several points, failed checkpoint writes, kept checkpoints, inconsistent
resumes, and exact resume under torchrun with gradient accumulation and dropout."""

import dataclasses
import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import types

import pytest
import torch

from engine import run_folder
from engine import run_reader
import configs
import model
import sample
import train
from conftest import (PAUSED_TRAIN, ROOT, events, folder_snapshot, prepared, resumed_line, save_checkpoint, tiny,
                      torchrun, train_argv)

TINY = tiny(dropout="0.1")


def flags(corpus, out, *more):
    """A tiny run in out on corpus, whose data is prepared once beside it."""
    return train_argv(corpus, prepared(corpus), out, *TINY, *more)


def losses(out):
    return [(e["step"], e["loss"]) for e in events(out, "train")]


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An uninterrupted 9-step run: what every interrupted, killed or resumed run must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "out"
    assert train.main(flags(corpus, out, "--max_iters=9", "--eval_interval=3")) == 0
    return out


def signal_at(monkeypatch, step, times):
    """Send this process SIGINT `times` times while it computes training step `step` (0-based)."""
    generator = train.batch_generator

    def hooked(*stream):
        if stream[2:] == (step, 0):
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
        return generator(*stream)

    monkeypatch.setattr(train, "batch_generator", hooked)


def test_ctrl_c_stops_after_the_step_saves_and_resumes_exactly(corpus, tmp_path, reference, monkeypatch, capsys):
    out = tmp_path / "out"
    handler = signal.getsignal(signal.SIGINT)  # the default, or SIG_IGN where pytest runs in the background
    signal_at(monkeypatch, 4, times=1)
    assert train.main(flags(corpus, out, "--max_iters=9", "--eval_interval=3")) == 130
    assert "--resume" in capsys.readouterr().out
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 5  # step 5 finished, then it stopped
    assert events(out)[-1] == {"event": "interrupted", "step": 5}
    monkeypatch.undo()
    assert train.main(flags(corpus, out, "--resume")) == 0
    assert losses(out) == losses(reference)
    assert signal.getsignal(signal.SIGINT) is handler  # main gives the handler back


def test_a_second_ctrl_c_stops_at_once_in_one_line(corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    signal_at(monkeypatch, 4, times=2)
    assert train.main(flags(corpus, out, "--max_iters=9", "--eval_interval=3")) == 130
    assert capsys.readouterr().err == "train.py: stopped at once by a second Ctrl-C; the checkpoints written so far " \
                                      "are kept\n"
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 3  # no checkpoint of the unfinished step
    assert not [e for e in events(out) if e["event"] == "interrupted"]


def test_a_failed_checkpoint_write_keeps_the_previous_one_and_stops(corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=2", "--eval_interval=2")) == 0
    good = (out / "ckpt.pt").read_bytes()
    capsys.readouterr()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    assert train.main(flags(corpus, out, "--resume", "--max_iters=8")) == 1
    assert capsys.readouterr().err.splitlines() == [
        resumed_line(2, 8, 2),
        f"train.py: cannot write {out / 'ckpt.pt'} (No space left on device); the previous checkpoint is kept"]
    assert (out / "ckpt.pt").read_bytes() == good
    assert not (out / "ckpt.pt.tmp").exists()
    assert max(s for s, _ in losses(out)) == 4  # it stopped at the failed save, not trained on without one


def test_keep_checkpoints_keeps_the_last_k_and_the_best(tmp_path):
    for step in (2, 4, 6, 8):
        run_folder.save_checkpoint(str(tmp_path), {"step": step, "best_step": 4}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-4.pt", "ckpt-6.pt", "ckpt-8.pt", "ckpt.pt"]
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 8
    assert torch.load(tmp_path / "ckpt-6.pt", weights_only=True)["step"] == 6


def test_only_ckpt_and_ascii_digits_are_a_numbered_checkpoint(tmp_path):
    # "²" is a digit to str.isdigit(), not to int(): a file of that name stopped a resume with a traceback
    for name in ("ckpt-2.pt", "ckpt-10.pt", "ckpt-\u00b2.pt", "ckpt-\u0663.pt", "ckpt-.pt", "ckpt-3.pt.tmp",
                 "xckpt-4.pt"):
        (tmp_path / name).write_bytes(b"")
    assert run_reader.numbered_checkpoints(str(tmp_path)) == {2: str(tmp_path / "ckpt-2.pt"),
                                                              10: str(tmp_path / "ckpt-10.pt")}


def test_resume_falls_back_to_the_newest_loadable_checkpoint(corpus, tmp_path, reference, capsys):
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=9", "--eval_interval=3", "--keep_checkpoints=2")) == 0
    assert sorted(p.name for p in out.glob("ckpt*")) == ["ckpt-6.pt", "ckpt-9.pt", "ckpt.pt"]
    # damage the newest, ckpt.pt (so also ckpt-9.pt, its hard link), and a ckpt-7.pt between it and ckpt-6.pt
    shutil.copy(out / "ckpt-6.pt", out / "ckpt-7.pt")
    for name in ("ckpt.pt", "ckpt-7.pt"):
        with open(out / name, "r+b") as f:
            f.truncate(100)
    capsys.readouterr()
    assert train.main(flags(corpus, out, "--resume", "--max_iters=12")) == 0
    *notes, changed = capsys.readouterr().err.splitlines()
    assert changed == resumed_line(6, 12, 9)
    assert len(notes) == 2 and all("resuming from" in n and n.endswith("ckpt-6.pt") for n in notes)
    steps = [s for s, _ in losses(out)]
    assert steps == list(range(1, 13))  # steps 7..9 of the first run were dropped from the log, not repeated
    assert losses(out)[:9] == losses(reference)


def test_the_printed_resume_command_is_quoted_for_a_shell(corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "my run's $HOME"
    signal_at(monkeypatch, 1, times=1)
    assert train.main(flags(corpus, out, "--max_iters=3", "--eval_interval=3")) == 130
    command = capsys.readouterr().out.split("To continue: ")[1]
    assert shlex.split(command) == ["python", "train.py", f"--out_dir={out}", "--resume"]


def test_a_finished_run_ends_on_its_checkpoint_and_the_command_that_samples_it(corpus, tmp_path, capsys):
    out = tmp_path / "my run's $HOME"
    assert train.main(flags(corpus, out, "--max_iters=4", "--eval_interval=2")) == 0
    where, command = capsys.readouterr().out.splitlines()[-1].split(". To let the model write: ")
    assert where == f"done at step 4; the checkpoint of step 4 is {out / 'ckpt.pt'}"
    argv = shlex.split(command)
    assert argv == ["python", "sample.py", f"--out_dir={out}"]
    assert sample.main([*argv[2:], "--num_samples=1", "--max_new_tokens=2"]) == 0  # the command works as printed


def test_a_finished_run_that_wrote_no_checkpoint_says_so(tmp_path, capsys):
    """--always_save_checkpoint=False and no evaluation better than step 0's: no checkpoint to name (saved_at None)."""
    tc, log = types.SimpleNamespace(out_dir=str(tmp_path)), str(tmp_path / "log.jsonl")
    assert run_folder.finished(2, 5.5, None, tc, types.SimpleNamespace(master=True), log) == 0
    assert capsys.readouterr().out == (
        "done at step 2; no checkpoint was written: the validation loss never improved on step 0's\n")
    assert events(tmp_path) == [{"event": "done", "step": 2, "val_loss": 5.5}]
    assert run_folder.finished(2, 5.5, None, tc, types.SimpleNamespace(master=False), log) == 0  # process 1 and on
    assert capsys.readouterr().out == "" and len(events(tmp_path)) == 1


def test_extending_a_finished_run_keeps_its_schedule(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=4", "--eval_interval=2", "--min_lr=1e-4")) == 0
    capsys.readouterr()
    assert train.main(flags(corpus, out, "--resume")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "at step 4" in err and "raise --max_iters" in err
    assert train.main(flags(corpus, out, "--resume", "--max_iters=6")) == 0
    assert "--lr_decay_iters" in capsys.readouterr().out
    lrs = {e["step"]: e["lr"] for e in events(out, "train")}
    assert lrs[5] == lrs[6] == 1e-4  # the decay ended at step 4; it does not start over
    assert json.loads((out / "config.json").read_text())["train"]["lr_decay_iters"] == 4


def test_a_run_stopped_in_its_last_evaluation_resumes_to_finish_it(corpus, tmp_path, monkeypatch):
    """Ctrl-C during the evaluation at --max_iters: the checkpoint of that step owes the evaluation, and --resume
    (no other flag) does it and writes the run's "done" line, rather than refusing a run with nothing left to do."""
    out, evaluate, calls = tmp_path / "out", train.evaluate, []

    def stopped_in_the_last(*args, **kwargs):
        calls.append(len(calls))
        if len(calls) == 3:  # the evaluations of steps 0, 2 and then 4, the last
            os.kill(os.getpid(), signal.SIGINT)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(train, "evaluate", stopped_in_the_last)
    assert train.main(flags(corpus, out, "--max_iters=4", "--eval_interval=2")) == 130
    monkeypatch.undo()
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    assert checkpoint["step"] == 4 and checkpoint["evaluated"] is False
    assert train.main(flags(corpus, out, "--max_iters=4", "--eval_interval=2", "--resume")) == 0
    assert [(e["event"], e["step"]) for e in events(out)][-2:] == [("eval", 4), ("done", 4)]


@pytest.fixture
def checkpointed(corpus, tmp_path):
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=2", "--eval_interval=2")) == 0
    return out


def edit_checkpoint(out, change):
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    save_checkpoint(change(checkpoint), out / "ckpt.pt")


def other_shapes(checkpoint):
    wider = model.GPT(model.GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32))
    return {**checkpoint, "model": wider.state_dict()}


def drop(key):
    return lambda checkpoint: {k: v for k, v in checkpoint.items() if k != key}


FOREIGN = [
    ("weights only", lambda c: c["model"], "is not a nanonorm checkpoint (it lacks model, optimizer"),
    ("no optimizer", drop("optimizer"), "is not a nanonorm checkpoint (it lacks optimizer)"),
    ("no model_config", drop("model_config"), "(it lacks model_config)"),
    # torch's error names the key (its first line alone said "Error(s) in loading state_dict for GPT:")
    # issue 55: weights its own model_config does not make were blamed on a flag, or loaded into the model's dtype
    ("other shapes", other_shapes, "(model.wte.weight has shape (256, 64), where its model_config makes (256, 32))"),
    ("weights cast to bfloat16", lambda c: {**c, "model": {k: v.bfloat16() if v.is_floating_point() else v
                                                           for k, v in c["model"].items()}},
     "(model.wte.weight is bfloat16, where its model_config makes float32 (a cast copy: a resume would not be exact))"),
    ("a model_config edited away from its weights", lambda c: {**c, "model_config": {**c["model_config"],
                                                                                     "block_size": 4096}},
     "(model.wpe.weight has shape (32, 32), where its model_config makes (4096, 32))"),
    ("a weight its model_config has no place for", lambda c: {**c, "model": {**c["model"], "extra": torch.zeros(2)}},
     "(model.extra is no weight of the model its model_config makes)"),
    ("foreign model_config", lambda c: {**c, "model_config": {**c["model_config"], "n_expert": 8}},
     "(model_config.n_expert is not a flag of this model.py)"),
    ("a list", lambda c: [1, 2, 3], "is not a nanonorm checkpoint"),
    ("two processes", lambda c: {**c, "rng": c["rng"] * 2}, "written by 2 processes, this run has 1"),
    # values, not only keys: each is read before log.jsonl is cut back to the checkpoint's step
    ("a negative step", lambda c: {**c, "step": -5}, "(step is -5, not an integer >= 0)"),
    ("a step as text", lambda c: {**c, "step": "2"}, "(step is '2', not an integer >= 0)"),
    ("best_val as text", lambda c: {**c, "best_val": "x"}, "(best_val is 'x', not a number)"),
    ("train_config as text", lambda c: {**c, "train_config": "oops"}, "(train_config is a str, not a dict)"),
    ("no RNG states", lambda c: {**c, "rng": []}, "(rng is not a list of each process's RNG states)"),
    ("a config value of another type", lambda c: {**c, "train_config": {**c["train_config"], "batch_size": "4"}},
     "(train_config.batch_size is '4', not an integer)"),
    ("a model config value of another type", lambda c: {**c, "model_config": {**c["model_config"], "norm": 3}},
     "(model_config.norm is 3, not one of layernorm"),
    # a value out of its flag's range names the checkpoint's field, not a flag the user never gave
    ("a config value out of range", lambda c: {**c, "train_config": {**c["train_config"], "lr": -5.0}},
     "(train_config.lr=-5.0 must be in [1e-07, 1000]"),
    ("configs that do not fit", lambda c: {**c, "model_config": {**c["model_config"], "n_head": 3}},
     "(model_config.n_embd=32 must be divisible by model_config.n_head=3)"),
    # the instruments' state and the data's sha256, which a resume reads on
    ("spike monitor as text", lambda c: {**c, "spike_monitor": "junk"}, "(spike_monitor is a string, not an object)"),
    ("an empty divergence state", lambda c: {**c, "divergence": {}}, "(divergence.max_loss is missing)"),
    ("a tensor in the spike window", lambda c: {**c, "spike_monitor": {**c["spike_monitor"], "losses": [
        torch.tensor(1.0)]}}, "(spike_monitor.losses[0] is a Tensor, not a number)"),
    # issue 46: NaN weights were a run that "diverged" (exit code 3, which a sweep counts as a result), and an empty
    # optimizer state was "('param_groups')"
    ("NaN weights", lambda c: {**c, "model": {k: v * float("nan") if v.is_floating_point() else v
                                              for k, v in c["model"].items()}},
     "is not a nanonorm checkpoint (it holds non-finite weights (wte.weight and others)); it is damaged"),
    ("an empty optimizer state", lambda c: {**c, "optimizer": {}},
     "(optimizer is not AdamW's state (a dict of state and a list of param_groups))"),
    ("data_sha256 as a number", lambda c: {**c, "data_sha256": 5},
     "(data_sha256 is 5, not the sha256 of a text (64 hex digits))"),
]


def optimizer_edit(group=None, **changes):
    """A change of the checkpoint's AdamW state: each param group's values (group), or the first parameter's state
    (changes; None removes the key)."""
    def change(checkpoint):
        optimizer = checkpoint["optimizer"]
        if group:
            optimizer["param_groups"] = [{**g, **group} for g in optimizer["param_groups"]]
        first = optimizer["state"][min(optimizer["state"])]
        for key, value in changes.items():
            if value is None:
                del first[key]
            else:
                first[key] = value
        return checkpoint
    return change


# issue 46's successor: the optimizer's values as load_state_dict takes them, which fused AdamW trusts (a moment of
# another shape crashed the process; a wrong type failed at the first step with a traceback)
FOREIGN += [
    ("a moment of another shape", optimizer_edit(exp_avg=torch.zeros(3)),
     "the state of param_groups[0]'s parameter 0: exp_avg is a tensor of shape (3,), not a tensor of shape ("),
    ("a moment missing", optimizer_edit(exp_avg_sq=None),
     "the state of param_groups[0]'s parameter 0: exp_avg_sq is None, not a tensor of shape ("),
    ("betas as text", optimizer_edit(group={"betas": "xx"}), "param_groups[0].betas is 'xx', not two numbers"),
    ("eps as None", optimizer_edit(group={"eps": None}), "param_groups[0].eps is None, not a number"),
    ("weight_decay as text", optimizer_edit(group={"weight_decay": "a"}),
     "param_groups[0].weight_decay is 'a', not a number"),
    ("fused as text", optimizer_edit(group={"fused": "yes"}), "param_groups[0].fused is 'yes', not True, False or"),
    # issue 55: load_state_dict cast them to the parameters' dtype without a word
    ("moments cast to bfloat16", lambda c: optimizer_edit(exp_avg=c["optimizer"]["state"][0]["exp_avg"].bfloat16())(c),
     "the checkpoint does not fit its own model (the state of param_groups[0]'s parameter 0: exp_avg is bfloat16, "
     "not float32 as its parameter)"),
]
# refused once the checkpoint is read, by what it does not fit: the rest name the checkpoint as they read it
NOT_FITTING = ("two processes", "moments cast to bfloat16", "a moment of another shape", "a moment missing",
               "betas as text", "eps as None", "weight_decay as text", "fused as text")


@pytest.mark.parametrize("name, change, expected", FOREIGN, ids=[f[0] for f in FOREIGN])
def test_a_foreign_checkpoint_is_one_line(corpus, checkpointed, capsys, name, change, expected):
    edit_checkpoint(checkpointed, change)
    before = {p.name: p.read_bytes() for p in checkpointed.iterdir()}
    capsys.readouterr()
    assert train.main(flags(corpus, checkpointed, "--resume", "--max_iters=4")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err
    if name not in NOT_FITTING:
        assert err.startswith(f"train.py: --resume: {checkpointed / 'ckpt.pt'} is not a nanonorm checkpoint ("), err
    assert {p.name: p.read_bytes() for p in checkpointed.iterdir()} == before


def flip_a_bit(checkpoint):
    """The checkpoint with one bit of AdamW's first moment flipped, the checksum it was written with kept: what a
    byte changed on the disk loads as (torch.load checks no checksum of its own)."""
    moment = checkpoint["optimizer"]["state"][0]["exp_avg"]
    moment.view(-1).view(torch.uint8)[5] ^= 1
    return checkpoint


def test_a_checkpoint_that_changed_since_it_was_written_is_refused_and_one_without_a_checksum_is_read(
        corpus, tmp_path, reference, capsys):
    """Issue 55: a flipped byte in AdamW's state resumed without a word. The checksum train.py writes with each
    checkpoint is checked at every read, and a damaged ckpt.pt gives way to the newest numbered checkpoint that
    loads, as one that does not load does; an older checkpoint, written without a checksum, resumes as before."""
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=9", "--eval_interval=3", "--keep_checkpoints=2")) == 0
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    assert checkpoint[run_folder.CHECKSUM] == run_folder.payload_sha256(checkpoint)
    torch.save(flip_a_bit(checkpoint), out / "ckpt.pt")  # and ckpt-9.pt, its hard link
    assert run_folder.payload_sha256(checkpoint) != checkpoint[run_folder.CHECKSUM]
    damaged = (f"{out / 'ckpt.pt'} is damaged: its contents are not what train.py wrote (their sha256 is not the "
               f"{run_folder.CHECKSUM} written with them)")
    capsys.readouterr()
    assert train.main(flags(corpus, out, "--resume", "--max_iters=12")) == 0
    assert capsys.readouterr().err.splitlines() == [f"train.py: note: {damaged}; resuming from {out / 'ckpt-6.pt'}",
                                                    resumed_line(6, 12, 9)]
    assert losses(out)[:9] == losses(reference)
    # the same flip with no older checkpoint to fall back on: one line, exit code 2, nothing changed
    for path in out.glob("ckpt-*.pt"):
        os.remove(path)
    torch.save(flip_a_bit(torch.load(out / "ckpt.pt", weights_only=True)), out / "ckpt.pt")
    before = folder_snapshot(out)
    assert train.main(flags(corpus, out, "--resume", "--max_iters=15")) == 2
    assert capsys.readouterr().err == f"train.py: --resume: {damaged}\n"
    assert folder_snapshot(out) == before
    # written before checksums: read unchecked, and the resume is exact
    again = tmp_path / "again"
    assert train.main(flags(corpus, again, "--max_iters=9", "--eval_interval=3", "--keep_checkpoints=3")) == 0
    old = torch.load(again / "ckpt-3.pt", weights_only=True)
    del old[run_folder.CHECKSUM]
    for path in again.glob("ckpt*.pt"):
        os.remove(path)
    torch.save(old, again / "ckpt.pt")
    assert train.main(flags(corpus, again, "--resume")) == 0
    assert losses(again) == losses(reference)


INCONSISTENT = [
    (["--preset=normformer"], "--preset, --scale_attn, --scale_fc, --scale_heads differ from the checkpoint's"),
    (["--n_layer=3"], "--n_layer differ from the checkpoint's"),
    (["--tokenizer=gpt2"], "--tokenizer=gpt2 differs from the checkpoint's byte"),
    (["--dataset=builtin"], "--dataset=builtin differs from the checkpoint's"),
    (["--max_iters=2"], "the checkpoint is at step 2 and --max_iters=2"),
    (["--lr=nan"], "--lr=nan is not a finite number"),
    (["--min_lr=1"], "--min_lr=1.0 must be in [0, --lr=0.003]"),
    # what the steps so far trained with, or the data order: config.json would claim it for the whole run
    (["--seed=5"], "--seed=5 differs from the checkpoint's 1337"),
    (["--batch_size=3"], "--batch_size=3 differs from the checkpoint's"),
    (["--grad_accum=2"], "--grad_accum=2 differs from the checkpoint's 1"),
    (["--lr_schedule=linear"], "--lr_schedule=linear differs from the checkpoint's cosine"),
    (["--warmup_iters=1"], "--warmup_iters=1 differs from the checkpoint's"),
    (["--lr=1e-3"], "--lr=0.001 differs from the checkpoint's 0.003"),
    (["--eval_iters=1"], "--eval_iters=1 differs from the checkpoint's"),
    (["--z_loss=1e-4"], "--z_loss=0.0001 differs from the checkpoint's 0.0"),
]


@pytest.mark.parametrize("more, expected", INCONSISTENT, ids=[" ".join(f) for f, _ in INCONSISTENT])
def test_an_inconsistent_resume_is_one_line(corpus, checkpointed, capsys, more, expected):
    before = {p.name: p.read_bytes() for p in checkpointed.iterdir()}
    capsys.readouterr()
    assert train.main(flags(corpus, checkpointed, "--resume", "--max_iters=4", *more)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err
    assert {p.name: p.read_bytes() for p in checkpointed.iterdir()} == before


def test_a_damaged_config_json_on_resume_is_to_be_removed_and_the_resume_writes_it_anew(corpus, checkpointed, capsys):
    """Issue 55: the line said to remove the run (its folder, .exit and .out), a sweep's words, which would have lost
    a good checkpoint; a resume writes config.json anew from the checkpoint."""
    (checkpointed / "config.json").write_text("not json")
    before = folder_snapshot(checkpointed)
    capsys.readouterr()
    assert train.main(flags(corpus, checkpointed, "--resume", "--max_iters=4")) == 2
    assert capsys.readouterr().err == (f"train.py: {checkpointed / 'config.json'} is not a config.json train.py wrote; "
                                       "remove it, and the resume writes it anew from the checkpoint (or start a new "
                                       "run in another --out_dir)\n")
    assert folder_snapshot(checkpointed) == before
    os.remove(checkpointed / "config.json")
    assert train.main(flags(corpus, checkpointed, "--resume", "--max_iters=4")) == 0
    assert json.loads((checkpointed / "config.json").read_text())["train"]["max_iters"] == 4


def test_every_training_flag_has_a_resume_rule():
    """configs.RESUME decides, flag by flag, what a resume may change: a new TrainConfig field needs its rule."""
    assert set(configs.RESUME) == {f.name for f in dataclasses.fields(configs.TrainConfig)}
    assert set(configs.RESUME.values()) == {configs.KEPT, configs.EXTENDS, configs.MACHINE, configs.BOOKKEEPING}


def test_a_resume_logs_and_says_what_it_changes_and_repeating_a_flag_changes_nothing(corpus, checkpointed, capsys):
    """The flags a resume may change (configs.RESUME's EXTENDS) take effect from the resumed step, with a
    "resumed" event and a line; the run's own flags again (what sweep.py passes) are no change and no event."""
    capsys.readouterr()
    same = ("--seed=1337", "--lr_schedule=cosine", "--grad_accum=1")  # and TINY's --lr, --batch_size
    assert train.main(flags(corpus, checkpointed, "--resume", "--max_iters=3", *same)) == 0
    assert "resumed at step 2 with --max_iters=3 (was 2);" in capsys.readouterr().err
    assert [e["changed"] for e in events(checkpointed, "resumed")] == [{"max_iters": [2, 3]}]
    assert train.main(flags(corpus, checkpointed, "--resume", "--max_iters=5", "--log_interval=2",
                            "--spike_z=4")) == 0
    err = capsys.readouterr().err
    assert "resumed at step 3 with --max_iters=5 (was 3), --log_interval=2 (was 1), --spike_z=4.0 (was 5.0)" in err
    resumed = events(checkpointed, "resumed")[-1]
    assert resumed["step"] == 3
    assert resumed["changed"] == {"max_iters": [3, 5], "log_interval": [1, 2], "spike_z": [5.0, 4.0]}
    assert json.loads((checkpointed / "config.json").read_text())["train"]["seed"] == 1337


@pytest.mark.slow
def test_a_compiled_runs_checkpoint_resumes_eagerly_and_compile_is_not_sticky(corpus, tmp_path, reference):
    """A checkpoint as a compiled nanoGPT run writes it (nanoGPT issue #325: _orig_mod. names), --compile
    recorded: the resume loads it, runs eagerly unless --compile is given, and continues exactly."""
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=3", "--eval_interval=3", "--lr_decay_iters=9")) == 0
    edit_checkpoint(out, lambda c: {**c, "model": {"_orig_mod." + k: v for k, v in c["model"].items()},
                                    "train_config": {**c["train_config"], "compile": True}})
    assert train.main(flags(corpus, out, "--resume", "--max_iters=9")) == 0
    assert json.loads((out / "config.json").read_text())["train"]["compile"] is False
    assert losses(out) == losses(reference)


@pytest.mark.slow
@pytest.mark.parametrize("saved, resumed", [("float32", "float16"), ("float16", "float32")])
def test_resume_in_another_dtype_is_allowed_with_a_note(corpus, tmp_path, capsys, saved, resumed):
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=2", "--eval_interval=2", f"--dtype={saved}")) == 0
    capsys.readouterr()
    assert train.main(flags(corpus, out, "--resume", "--max_iters=4", f"--dtype={resumed}")) == 0
    err = capsys.readouterr().err.splitlines()
    # the dtype is the machine's: its note is restore's; the resumed event records it, and the line says --max_iters
    assert len(err) == 2 and f"trained in {saved}, this run uses {resumed}" in err[0]
    assert err[1] == resumed_line(2, 4, 2)
    assert events(out, "resumed")[0]["changed"] == {"max_iters": [2, 4], "dtype": [saved, resumed]}
    assert len(losses(out)) == 4


def start(command, out, **env):
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env})


def kill_when(process, printed):
    """SIGKILL the run once it prints `printed` (a pause point of PAUSED_TRAIN's, where it then sleeps)."""
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if printed in process.stdout.readline():
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stdout.read()


@pytest.mark.slow
@pytest.mark.parametrize("point", ["step@5", "eval@6", "save@6"])
def test_kill_9_leaves_a_loadable_checkpoint_and_resume_continues_exactly(corpus, tmp_path, reference, point):
    """Killed between a step's backward and its optimizer step, inside an eval, or inside a checkpoint write:
    the checkpoint of step 3 survives and resume reproduces the uninterrupted run. Each kill lands at a pause
    point, not at a time read off the log (a 9-step run of this size can end before a poll sees step 4)."""
    out = tmp_path / "out"
    run = flags(corpus, out, "--max_iters=9", "--eval_interval=3")
    process = start([sys.executable, "-c", PAUSED_TRAIN, point, *run], out)
    kill_when(process, f"paused at {point}")
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 3
    assert (out / "ckpt.pt.tmp").exists() == (point == "save@6")  # the partial write was never renamed
    assert train.main([*run, "--resume"]) == 0
    assert losses(out) == losses(reference)  # each step once: the log lost what the checkpoint did not keep
    assert not (out / "ckpt.pt.tmp").exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads by their names in /proc (Linux)")
@pytest.mark.parametrize("n", [1, 3])
def test_the_defaults_work_under_torchrun_and_gloo_is_torn_down_before_exit(corpus, tmp_path, n):
    """No --grad_accum: one micro-step per process; the log states the global batch. And gloo's threads still
    running when the interpreter exits can abort it (SIGABRT, "terminate called without an active exception")
    after a run has finished: destroy_process_group joins them, unless something still holds the group
    (torch.distributed.nn, when first imported after init_process_group, does)."""
    out = tmp_path / "out"
    script = tmp_path / "then_count_threads.py"
    script.write_text(
        f"import os, sys\nsys.path.insert(0, {ROOT!r})\nimport train\n"
        "code = train.main(sys.argv[1:])\n"
        "names = [open(f'/proc/self/task/{task}/comm').read().strip() for task in os.listdir('/proc/self/task')]\n"
        f"open(os.path.join({str(tmp_path)!r}, 'gloo-threads-' + os.environ['RANK']), 'w')"
        ".write(str(sum('gloo' in name for name in names)))\n"
        "sys.exit(code)\n")
    result = torchrun(n, *flags(corpus, out, "--max_iters=2", "--eval_interval=2"), script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["world_size"] == n and config["global_batch"] == {"sequences": 4 * n, "tokens": 4 * n * 32}
    assert [s for s, _ in losses(out)] == [1, 2]
    assert all(4.5 < loss < 6.5 for _, loss in losses(out))  # a real step: near ln(256) = 5.55 at the start
    assert result.stdout.count("done at step 2; ") == 1  # the run's last line, said by process 0 alone
    left = [(tmp_path / f"gloo-threads-{rank}").read_text() for rank in range(n)]
    assert left == ["0"] * n, f"gloo threads still running after train.main returned, by rank: {left}"


@pytest.mark.slow
def test_exact_resume_under_torchrun_with_grad_accum_and_dropout(corpus, tmp_path, capsys):
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = ["--grad_accum=2", "--eval_interval=2", "--lr_decay_iters=4"]
    assert torchrun(2, *flags(corpus, whole, *common, "--max_iters=4")).returncode == 0
    assert torchrun(2, *flags(corpus, split, *common, "--max_iters=2")).returncode == 0
    config = json.loads((split / "config.json").read_text())
    assert config["global_batch"] == {"sequences": 4 * 2 * 2, "tokens": 4 * 2 * 2 * 32}
    assert config["model"]["pn_warmup"] == 2 * 2  # warmup_iters x micro-steps per process
    # the real 2-process checkpoint, resumed by one process (here, in this one: a torchrun of 3 is the same check)
    assert train.main(flags(corpus, split, "--resume", "--max_iters=4")) == 2
    assert capsys.readouterr().err.startswith("train.py: --resume: the checkpoint was written by 2 processes, this "
                                              "run has 1; exact resume needs the same number")
    assert torchrun(2, *flags(corpus, split, "--resume", "--max_iters=4")).returncode == 0
    assert losses(split) == losses(whole)


def worker_pids(parent):
    """{RANK: pid} of the child processes of torchrun's pid `parent`, read from Linux's /proc."""
    pids = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the state
            with open(f"/proc/{pid}/environ", "rb") as f:
                ranks = [v[len(b"RANK="):] for v in f.read().split(b"\0") if v.startswith(b"RANK=")]
        except OSError:  # a process that ended meanwhile, or someone else's
            continue
        if ppid == parent and ranks:
            pids[int(ranks[0])] = int(pid)
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("who", ["the process group", "rank 1 alone"])
def test_ctrl_c_under_torchrun_stops_every_process_at_the_same_step(corpus, tmp_path, who):
    """Ctrl-C in a terminal signals the whole process group: torchrun, which SIGTERMs its workers, and the
    workers themselves. A SIGINT to one worker's pid reaches that one alone; its request travels to the others
    with the step's loss all-reduce. Either way all stop at one step boundary, with one checkpoint."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
               *flags(corpus, out, "--max_iters=100000", "--eval_interval=1000")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    workers = {}
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(out / "log.jsonl") and len(losses(out)) >= 3):
            time.sleep(0.05)
        workers = worker_pids(process.pid)
        if who == "rank 1 alone":
            os.kill(workers[1], signal.SIGINT)
        else:
            os.killpg(process.pid, signal.SIGINT)
        output = process.communicate(timeout=120)[0]
    finally:
        # a failed test must not leave a 100,000-step run behind; the workers have process groups of their own
        for pid in [process.pid, *workers.values()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    interrupted = events(out, "interrupted")
    assert len(interrupted) == 1 and "torchrun --nproc_per_node=2 train.py" in output, output[-3000:]
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    assert checkpoint["step"] == interrupted[0]["step"] and len(checkpoint["rng"]) == 2


def test_a_short_run_with_the_default_warmup_extends(corpus, tmp_path):
    """The inherited --lr_decay_iters=2 is shorter than the default --warmup_iters=50: not bad input."""
    short = [f for f in flags(corpus, tmp_path / "out") if not f.startswith("--warmup_iters")]
    assert train.main([*short, "--max_iters=2", "--eval_interval=2"]) == 0
    assert train.main([*short, "--resume", "--max_iters=4"]) == 0
    assert [s for s, _ in losses(tmp_path / "out")] == [1, 2, 3, 4]


@pytest.mark.parametrize("ckpt", ["deleted", "a symlink to nowhere"])
def test_resume_without_ckpt_pt_takes_the_newest_numbered_checkpoint(corpus, tmp_path, reference, capsys, ckpt):
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=9", "--eval_interval=3", "--keep_checkpoints=2")) == 0
    (out / "ckpt.pt").unlink()
    if ckpt != "deleted":
        os.symlink(out / "gone.pt", out / "ckpt.pt")
    capsys.readouterr()
    assert train.main(flags(corpus, out, "--resume", "--max_iters=12")) == 0
    *notes, changed = capsys.readouterr().err.splitlines()
    assert changed == resumed_line(9, 12, 9)
    assert len(notes) == (ckpt != "deleted") and all(n.endswith(f"resuming from {out / 'ckpt-9.pt'}") for n in notes)
    assert [s for s, _ in losses(out)] == list(range(1, 13)) and losses(out)[:9] == losses(reference)


def test_an_older_ckpt_pt_than_a_numbered_checkpoint_gives_way_with_a_note(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=6", "--eval_interval=3", "--keep_checkpoints=2")) == 0
    os.replace(out / "ckpt-3.pt", out / "ckpt.pt")  # ckpt.pt put back from an older copy; ckpt-6.pt is newer
    capsys.readouterr()
    assert train.main(flags(corpus, out, "--resume", "--max_iters=8")) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"train.py: note: {out / 'ckpt.pt'} is at step 3, older than {out / 'ckpt-6.pt'}; resuming from "
        f"{out / 'ckpt-6.pt'}", resumed_line(6, 8, 6)]
    assert [s for s, _ in losses(out)] == list(range(1, 9))


@pytest.mark.parametrize("mode, name", [("--resume", "ckpt.pt"), ("--overwrite", "ckpt.pt"),
                                        ("--resume", "config.json"), ("--overwrite", "log.jsonl"),
                                        ("--resume", "ckpt.pt.tmp")])
def test_a_folder_where_the_run_writes_a_file_is_refused_before_anything_changes(corpus, checkpointed, capsys, mode,
                                                                                  name):
    """Found late, it let a resume train and rewrite the log before its checkpoint failed, and --overwrite delete
    the numbered checkpoints before it failed to remove the folder."""
    path = checkpointed / name
    if path.exists():
        path.unlink()
    path.mkdir()
    before = folder_snapshot(checkpointed)
    capsys.readouterr()
    assert train.main(flags(corpus, checkpointed, mode, "--max_iters=4")) == 2
    assert capsys.readouterr().err == (f"train.py: --out_dir={checkpointed}: {path} is a folder, where the run writes "
                                       "(or with --overwrite removes) a file of its own; move it away, or choose "
                                       "another --out_dir\n")
    assert folder_snapshot(checkpointed) == before


def test_a_refused_resume_says_one_line_not_the_checkpoint_it_would_have_taken(corpus, tmp_path, capsys):
    """The note that a damaged ckpt.pt was passed over comes only with a resume that goes ahead."""
    out = tmp_path / "out"
    assert train.main(flags(corpus, out, "--max_iters=4", "--eval_interval=2", "--keep_checkpoints=2")) == 0
    with open(out / "ckpt.pt", "r+b") as f:  # and ckpt-4.pt, its hard link: ckpt-2.pt is the newest that loads
        f.truncate(100)
    before = folder_snapshot(out)
    capsys.readouterr()
    assert train.main(flags(corpus, out, "--resume", "--max_iters=6", "--lr=1e-3")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: --resume: --lr=0.001 differs from the checkpoint's"), err
    assert folder_snapshot(out) == before
    assert train.main(flags(corpus, out, "--resume", "--max_iters=6")) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"train.py: note: cannot read {out / 'ckpt.pt'} (RuntimeError); it is damaged or not a checkpoint; resuming "
        f"from {out / 'ckpt-2.pt'}", resumed_line(2, 6, 4)]


def test_resuming_a_diverged_run_logs_one_diverged_event(corpus, tmp_path):
    out = tmp_path / "out"
    # above --diverge_loss three steps in a row: diverged at step 2, just after the step-2 checkpoint
    diverging = flags(corpus, out, "--max_iters=4", "--eval_interval=2", "--diverge_loss=1.0")
    assert train.main(diverging) == 3
    assert [e["step"] for e in events(out, "diverged")] == [2]
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 2
    assert train.main([*diverging, "--resume"]) == 3
    assert [e["step"] for e in events(out, "diverged")] == [2]


def test_resume_with_overwrite_is_refused_in_one_line(corpus, checkpointed, capsys):
    before = {p.name: p.read_bytes() for p in checkpointed.iterdir() if p.is_file()}
    capsys.readouterr()
    assert train.main(flags(corpus, checkpointed, "--resume", "--overwrite", "--max_iters=4")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume and --overwrite together" in err and "give one" in err
    assert {p.name: p.read_bytes() for p in checkpointed.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("line, says", [
    ({"event": "note", "step": None}, "note event: step is null, not an integer"),
    ({"event": "eval", "step": 1, "train_loss": 5.0}, "eval event: val_loss is missing"),
    ({"event": "train", "step": 1, "loss": "5"}, "train event: loss is a string, not a number"),
    ({"event": "spike"}, "spike event: step is missing"),
])
def test_a_log_line_with_damaged_fields_is_refused_in_one_line(corpus, checkpointed, capsys, line, says):
    log = checkpointed / "log.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:1] + [json.dumps(line) + "\n"] + lines[1:]))
    before = {p.name: p.read_bytes() for p in checkpointed.iterdir() if p.is_file()}
    capsys.readouterr()
    assert train.main(flags(corpus, checkpointed, "--resume", "--max_iters=4")) == 2
    err = capsys.readouterr().err
    assert err == f"train.py: {log}:2: {says}; it is not a log nanonorm wrote\n"
    assert {p.name: p.read_bytes() for p in checkpointed.iterdir() if p.is_file()} == before


def run_files_of(out):
    return {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"}


@pytest.fixture
def two_runs(corpus, tmp_path):
    """Two finished 2-step runs that a resume could extend: a layernorm one, and one of another norm or seed."""
    def make(*more):
        mine, other = tmp_path / "mine", tmp_path / "other"
        assert train.main(flags(corpus, mine, "--max_iters=2", "--eval_interval=2")) == 0
        assert train.main(flags(corpus, other, "--max_iters=2", "--eval_interval=2", *more)) == 0
        return mine, other
    return make


def test_a_checkpoint_of_another_run_is_not_adopted(corpus, two_runs, capsys):
    """Issue 46: a --norm=rmsnorm run's ckpt.pt copied into a layernorm run's folder (its numbered checkpoint
    removed) was resumed: exit 0, config.json rewritten to rmsnorm, the log keeping the layernorm run's steps. The
    checkpoint is held to config.json first: one line, exit code 2, nothing written."""
    mine, other = two_runs("--norm=rmsnorm")
    shutil.copy(other / "ckpt.pt", mine / "ckpt.pt")
    os.remove(mine / "ckpt-2.pt")
    before = run_files_of(mine)
    capsys.readouterr()
    assert train.main(flags(corpus, mine, "--resume", "--max_iters=4")) == 2
    err = capsys.readouterr().err
    assert err == (f"train.py: --resume: the checkpoint at step 2 is not the run of {mine}/config.json: its "
                   "model_config.norm is 'rmsnorm', config.json says 'layernorm'; put the run's own checkpoint back, "
                   "or start a new run in another --out_dir (or --overwrite)\n"), err
    assert run_files_of(mine) == before


def test_a_log_of_another_run_is_not_adopted(corpus, two_runs, capsys):
    """Issue 46: another run's log.jsonl copied in was continued. The log's evaluation at the checkpoint's best step
    must have logged the checkpoint's best val loss; a missing log is still a note, not a refusal."""
    mine, other = two_runs("--seed=7")
    shutil.copy(other / "log.jsonl", mine / "log.jsonl")
    before = run_files_of(mine)
    capsys.readouterr()
    assert train.main(flags(corpus, mine, "--resume", "--max_iters=4")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"train.py: --resume: {mine}/log.jsonl is not the checkpoint's run: the checkpoint's "
                          "best val loss is ") and "at step 2, the log has val loss " in err, err
    assert err.count("\n") == 1
    assert run_files_of(mine) == before
    os.remove(mine / "log.jsonl")
    assert train.main(flags(corpus, mine, "--resume", "--max_iters=4")) == 0
    assert f"{mine}/log.jsonl is missing" in capsys.readouterr().err


def test_a_run_whose_first_checkpoint_failed_is_told_to_start_again_with_overwrite(corpus, tmp_path, monkeypatch,
                                                                                     capsys):
    """Issue 46: with a capped file size (ulimit -f) the first checkpoint failed with "the previous checkpoint is
    kept" (there was none); the same command then said "continue it with --resume", and --resume "start without
    --resume": a circle that never named --overwrite. Each line now says what the folder holds and what works."""
    out = tmp_path / "out"
    real_save = torch.save

    def too_large(*args, **kwargs):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(torch, "save", too_large)
    assert train.main(flags(corpus, out, "--max_iters=2", "--eval_interval=2")) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"train.py: cannot write {out / 'ckpt.pt'} (File too large); the run has no checkpoint yet: once the file can "
        "be written, start it again with --overwrite")
    monkeypatch.setattr(torch, "save", real_save)
    assert train.main(flags(corpus, out, "--max_iters=2", "--eval_interval=2")) == 2
    assert capsys.readouterr().err == (f"train.py: --out_dir={out} holds a run's files but no checkpoint "
                                       "(config.json, log.jsonl), so --resume has nothing to continue; replace them "
                                       "with --overwrite, or choose another --out_dir\n")
    assert train.main(flags(corpus, out, "--max_iters=2", "--eval_interval=2", "--resume")) == 2
    assert capsys.readouterr().err == (f"train.py: --resume: no checkpoint in {out} (its run stopped before its first "
                                       "checkpoint: start it again with --overwrite)\n")
    assert train.main(flags(corpus, out, "--max_iters=2", "--eval_interval=2", "--overwrite")) == 0
