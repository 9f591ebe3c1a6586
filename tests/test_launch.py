"""lab/launch.py: sweep.py's runs as submitit jobs. A tiny recipe end to end through submitit's local executor (the
same jobs as Slurm's, as processes here) with its summary and results page; a preempted job that resumes from its
checkpoint; a failed job counted as the summary counts a failed run; the Slurm parameters and the sbatch file built
without a cluster; the refusals."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import configs
import data
import lab.summary
import plot
import sweep
import train
from conftest import ROOT, SWEEP_TINY, tiny
from engine import run_reader
from lab import launch
from lab import recipes
from lab.runs import Run, exit_code, is_finished

submitit = pytest.importorskip("submitit")  # requirements.txt installs it; without it, this file has nothing to test


def options(**given):
    """LaunchOptions as a command line giving these flags leaves them, checked (a CPU sweep's, not a dry run)."""
    return launch.check(launch.LaunchOptions(**given), given, False, "cpu")


def wait_for(condition, what, timeout=1200):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.2)


def tiny_recipe(flags):
    """Two arms, one LR, seeds 3 and 4, one claim: the recipe machinery's smallest real case."""
    claim = recipes.Claim("norm=rmsnorm", "final_loss@1e-2", "better", "94 vs 200 steps", effect=0.25,
                          effect_source="a guess", target_origin="nanonorm")
    return recipes.Recipe(title="tiny recipe through submitit", paper="A Paper (v2) §1, Table 9", quote="It is better.",
                          mode="lr", variants=["baseline", "norm=rmsnorm"], reference="baseline", claims=[claim],
                          lrs=["1e-2"], tested_seeds=2, pilot=0, first_seed=3, flags=flags, gpu_lrs=["1e-2"],
                          gpu_flags=flags, deviations="tiny", figure="loss_vs_lr")


@pytest.mark.slow
def test_a_tiny_recipe_runs_end_to_end_through_submitits_local_executor(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(recipes.RECIPES, "tiny_launch",
                        tiny_recipe([*SWEEP_TINY, f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}"]))
    argv = ["--recipe=tiny_launch", "--launcher=local", "--jobs=2", f"--out_dir={tmp_path / 'sweeps' / 'tiny_launch'}"]
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    runs = sweep.grid(sweep.parse_args(argv))
    assert len(runs) == 4 and "4 runs, 0 finished already, 0 running elsewhere, 4 to run, 2 at a time" in out
    for run in runs:
        assert is_finished(run) and exit_code(run) == 0 and f"exit 0 {run.dir}" in out
        job = json.loads(open(run.dir + ".job").read())
        assert job["launcher"] == "local" and f"start {run.dir} (local job {job['job_id']})" in out
        console = open(run.dir + ".out").read()
        assert console.startswith(f"--- {sys.executable} {launch.TRAIN} ") and f"(job {job['job_id']} on " in console
        assert os.path.isfile(os.path.join(job["folder"], f"{job['job_id']}_0_log.out"))  # submitit's own log
    summary = json.loads((tmp_path / "sweeps" / "tiny_launch" / "summary.json").read_text())
    assert summary["failed_runs"] == 0 and summary["running_elsewhere"] == 0 and summary["no_verdict"] is None
    [claim] = summary["claims"]
    assert claim["n"] == 2 and claim["seeds"] == [3, 4]
    assert plot.main([f"--experiments={tmp_path / 'sweeps'}", f"--out={tmp_path / 'docs'}"]) == 0
    page = (tmp_path / "docs" / "experiments.md").read_text()
    assert '<a id="tiny_launch"></a>' in page and "tiny recipe through submitit" in page
    capsys.readouterr()
    assert sweep.main(argv) == 0  # the same command again: every run finished, nothing submitted
    out = capsys.readouterr().out
    assert "4 runs, 4 finished already, 0 running elsewhere, 0 to run" in out and "start " not in out
    assert sweep.main([*argv, "--collect"]) == 0
    assert "4 runs, 4 finished, 0 running elsewhere or queued, 0 neither" in capsys.readouterr().out


def parent_of(pid):
    """The parent process of pid (Linux's /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the job's process through Linux's /proc")
def test_a_preempted_job_stops_train_py_with_a_checkpoint_is_requeued_and_resumes_to_the_same_end(corpus, tmp_path):
    """Slurm's preemption signal (USR2) to the job's process: submitit calls TrainJob.checkpoint, train.py stops with
    a checkpoint, the job is requeued and resumes it; the run ends where an uninterrupted run of it ends."""
    run = Run("baseline", "1e-2", 0, str(tmp_path / "sweep" / "baseline" / "1e-2" / "0"))
    flags = [*tiny(max_iters=400, eval_interval=20, log_interval=20, lr="1e-2"), f"--dataset={corpus}",
             f"--data_dir={tmp_path / 'data'}", "--seed=0"]
    made = launch.executor(options(launcher="local"), 1, "test", tmp_path / "sweep")
    [(_, job)] = launch.submit(made, [(run, launch.TrainJob([*flags, f"--out_dir={run.dir}"], run.dir, 0))], "local")
    try:
        wait_for(lambda: job.done() or run_reader.has_checkpoint(run.dir) and
                 os.path.exists(os.path.join(run.dir, "run.lock")), "a first checkpoint")
        assert not job.done(), open(run.dir + ".out").read()
        trainer = int(open(os.path.join(run.dir, "run.lock")).read().split()[0])
        os.kill(parent_of(trainer), signal.SIGUSR2)  # what Slurm sends the job's processes before preempting it
        wait_for(job.done, "the requeued job's end")
    finally:
        launch.stop_local([job])  # a failed wait leaves no job running
    console = open(run.dir + ".out").read()
    starts = [line for line in console.splitlines() if line.startswith("--- ")]
    assert len(starts) == 2 and "--resume" not in starts[0] and starts[1].split(" (job ")[0].endswith(" --resume")
    assert "; the checkpoint is saved. To continue: " in console  # train.py's line: it stopped with a checkpoint
    assert "Requeued job" in job.stdout()  # submitit's log
    assert exit_code(run) == 0 and is_finished(run)
    events = run_reader.read_log(run_reader.log_path(run.dir))[0]
    steps = [e["step"] for e in events if e["event"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 400  # each step logged once, to the end
    assert train.main([*flags, f"--out_dir={tmp_path / 'whole'}"]) == 0
    whole = run_reader.read_log(run_reader.log_path(str(tmp_path / "whole")))[0]
    assert [e["val_loss"] for e in events if e["event"] == "done"] == [e["val_loss"] for e in whole
                                                                       if e["event"] == "done"]


@pytest.mark.slow
def test_a_job_whose_run_fails_records_its_exit_code_and_the_summary_counts_it_failed(tmp_path, capsys):
    run = Run("baseline", "1e-2", 0, str(tmp_path / "sweep" / "baseline" / "1e-2" / "0"))
    assert launch.run_all([run], lambda run: ["--n_layer=0", f"--out_dir={run.dir}"], options(launcher="local"), 1,
                          "test", tmp_path / "sweep") is None
    assert f"exit 2 {run.dir}" in capsys.readouterr().out
    assert exit_code(run) == 2 and "--n_layer=0" in open(run.dir + ".out").read()
    assert lab.summary.missing_runs([run], [{"status": "unfinished"}]) == (1, 0)  # failed, not queued


def test_a_run_whose_job_is_queued_or_running_is_left_to_it_and_counted_apart(tmp_path, monkeypatch):
    run = Run("baseline", "1e-2", 0, str(tmp_path / "baseline" / "1e-2" / "0"))
    os.makedirs(os.path.dirname(run.dir))
    assert launch.queued(run) is None  # no job recorded

    def job(launcher, job_id, host=socket.gethostname()):
        with open(run.dir + ".job", "w") as f:
            json.dump({"launcher": launcher, "job_id": job_id, "folder": str(tmp_path), "host": host}, f)

    job("local", str(os.getpid()))
    assert launch.queued(run) == f"local job {os.getpid()} (running)"
    assert lab.summary.missing_runs([run], [{"status": "unfinished"}]) == (0, 1)
    job("local", str(os.getpid()), host="another-host")
    assert launch.queued(run) is None
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    job("local", str(dead.pid))
    assert launch.queued(run) is None
    job("slurm", "123_4")
    monkeypatch.setattr(launch.shutil, "which", lambda name: f"/usr/bin/{name}")
    for state, left in (("PENDING", True), ("RUNNING", True), ("REQUEUED", True), ("COMPLETED", False),
                        ("TIMEOUT", False), ("CANCELLED by 42", False)):
        monkeypatch.setattr(submitit.SlurmJob, "state", property(lambda self, state=state: state))
        assert (launch.queued(run) == f"Slurm job 123_4 ({state})") is left, state
    (tmp_path / "baseline" / "1e-2" / "0.job").write_text("not json")
    assert launch.queued(run) is None


CLUSTER = dict(launcher="slurm", partition="gpu", time_min=90, gpus_per_run=2, cpus_per_run=16, account="lab",
               qos="high", sbatch="constraint=h100,mem=64G,exclusive")


def sbatch_lines(text):
    return [line for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_the_slurm_parameters_make_the_sbatch_file_a_cluster_needs(tmp_path):
    script = launch.sbatch_script(launch.check(launch.LaunchOptions(**CLUSTER), CLUSTER, True, "gpu"), 3, "nanonorm-x",
                                  tmp_path, 10)
    assert set(sbatch_lines(script)) >= {
        "#SBATCH --partition=gpu", "#SBATCH --time=90", "#SBATCH --gpus-per-node=2", "#SBATCH --cpus-per-task=16",
        "#SBATCH --account=lab", "#SBATCH --qos=high", "#SBATCH --constraint=h100", "#SBATCH --mem=64G",
        "#SBATCH --exclusive", "#SBATCH --array=0-9%3", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --signal=USR2@120", "#SBATCH --job-name=nanonorm-x", "#SBATCH --open-mode=append"}
    assert f"#SBATCH --output={tmp_path}/.submitit/%A_%a/%A_%a_0_log.out" in sbatch_lines(script)
    assert not any(line.startswith("#SBATCH --error") for line in sbatch_lines(script))  # one log
    assert f"export PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" in script.splitlines()
    assert "-m submitit.core._submit" in script


def test_submitits_slurm_executor_takes_the_parameters_and_writes_the_same_file(tmp_path, monkeypatch):
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # as if srun were here
    given = {**CLUSTER, "gpus_per_run": 1}
    made = launch.executor(launch.check(launch.LaunchOptions(**given), given, True, "gpu"), 4, "nanonorm-x", tmp_path)
    assert made.max_num_timeout == launch.MAX_TIMEOUTS
    written = made._make_submission_file_text("python -u -m submitit.core._submit F", "uid")
    assert {"#SBATCH --gpus-per-node=1", "#SBATCH --partition=gpu", "#SBATCH --mem=64G",
            "#SBATCH --time=90"} <= set(sbatch_lines(written))


def test_a_gpu_recipes_dry_run_on_slurm_shows_the_array_then_each_command(tmp_path, capsys):
    argv = ["--recipe=powernorm", "--scale=gpu", "--launcher=slurm", "--partition=gpu", "--jobs=8", "--dry_run",
            f"--out_dir={tmp_path / 'sweep'}"]
    assert sweep.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = [line for line in lines if line.startswith("python train.py ")]
    plan = sweep.parse_args(argv)
    assert lines[0] == "#!/bin/bash" and len(commands) == len(sweep.grid(plan))
    assert f"#SBATCH --array=0-{len(commands) - 1}%8" in lines and "#SBATCH --gpus-per-node=1" in lines
    assert plan.launch_options.gpus_per_run == 1  # the GPU scale's default


def test_a_job_over_several_gpus_is_torchrun_and_a_job_resumes_beside_a_checkpoint(tmp_path):
    run_dir = str(tmp_path / "run")
    assert launch.TrainJob(["--lr=1"], run_dir, 0).command() == [sys.executable, launch.TRAIN, "--lr=1"]
    assert launch.TrainJob(["--lr=1"], run_dir, 4).command() == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", launch.TRAIN, "--lr=1"]
    os.makedirs(run_dir)
    (tmp_path / "run" / "log.jsonl").write_text("")
    assert launch.TrainJob(["--lr=1"], run_dir, 0).command()[-1] == "--overwrite"
    (tmp_path / "run" / "ckpt.pt").write_bytes(b"")
    assert launch.TrainJob(["--lr=1"], run_dir, 0).command()[-1] == "--resume"


@pytest.mark.parametrize("flags, says", [
    (["--partition=gpu"], "--partition set a scheduler's jobs; add --launcher=slurm"),
    (["--launcher=local", "--qos=high"], "--qos are Slurm's; --launcher=local runs the jobs on this machine"),
    (["--launcher=slurm"], "--launcher=slurm submits with sbatch, which is not on this machine's PATH"),
    (["--launcher=slurm", "--dry_run", "--time_min=0"], "--time_min=0 must be from 1 to"),
    (["--launcher=slurm", "--dry_run", "--gpus_per_run=65"], "--gpus_per_run=65 must be from 0 to 64"),
    (["--launcher=slurm", "--dry_run", "--sbatch=--mem=4G"], "--sbatch: '--mem=4G' is not an sbatch option"),
    (["--launcher=local", "--collect", "--dry_run"], "--collect summarizes and --dry_run prints commands"),
    (["--launcher=cloud"], "--launcher=cloud is not allowed; choose one of pool, slurm, local"),
])
def test_bad_launch_flags_are_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch, flags, says):
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)  # no Slurm here, whatever the machine
    argv = ["--variants=baseline", "--lrs=1e-2", f"--out_dir={tmp_path / 'sweep'}", *SWEEP_TINY, *flags]
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: ") and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "sweep").exists()


def test_every_gpu_recipe_trains_on_a_corpus_of_the_papers_kind_that_no_run_reads_twice():
    for name, recipe in recipes.RECIPES.items():
        given = configs.parse_flags(recipe.gpu_flags)
        assert given["dataset"] == recipes.GPU_CORPUS == data.FINEWEB_EDU and given["tokenizer"] == "gpt2", name
        tc = configs.resolve(given, machine=False)[1]
        tokens = tc.max_iters * tc.batch_size * tc.grad_accum * given["block_size"]
        assert tokens <= recipes.GPU_CORPUS_TOKENS, name  # at most one pass over the train split
        assert "FineWeb-Edu's sample-10BT" in recipes.describe(name, "gpu")["deviations"], name


def test_a_gpu_recipe_is_refused_in_one_line_until_its_corpus_is_prepared(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launch.shutil, "which", lambda name: f"/usr/bin/{name}")  # as on a login node
    argv = ["--recipe=powernorm", "--scale=gpu", "--launcher=slurm", f"--out_dir={tmp_path / 'sweep'}",
            f"--data_dir={tmp_path / 'data'}"]
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is not prepared in --data_dir={tmp_path / 'data'}: python data.py " \
        f"--dataset={data.FINEWEB_EDU} --tokenizer=gpt2 --data_dir={tmp_path / 'data'} prepares it" in err
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "data").exists()


def test_a_gpu_recipes_dry_run_says_its_tokens_and_gpu_hours(tmp_path, capsys):
    assert sweep.main(["--recipe=powernorm", "--scale=gpu", "--dry_run", f"--data_dir={tmp_path / 'data'}"]) == 0
    captured = capsys.readouterr()
    runs = len(captured.out.splitlines())
    tokens = runs * 5000 * 16 * 4 * 1024  # powernorm's GPU runs: 5,000 steps of 64 sequences of 1,024 tokens
    # GPT-2 small's 6N + 12LTd FLOPs a token (N = 124M less the 0.8M of the position table), at 373 TFLOP/s
    hours = tokens * (6 * (124.44e6 - 1024 * 768) + 12 * 12 * 1024 * 768) / 373e12 / 3600
    line, note = captured.err.splitlines()
    assert line.startswith(f"sweep.py: {runs} runs, {tokens / 1e9:,.1f}B tokens: about ")
    said = float(line.split(": about ")[1].split(" GPU-hours on H100s")[0].replace(",", ""))
    assert said == pytest.approx(hours, rel=0.01)  # the arms' parameters differ by their norms' few
    assert note.startswith(f"sweep.py: note: --dataset={data.FINEWEB_EDU} is not prepared in --data_dir=")
