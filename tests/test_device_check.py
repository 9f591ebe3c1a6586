"""lab/device_check.py as far as a machine without a GPU can check it: its time boxes, its refusals, and how it
reads the figures out of its parts' output."""
import dataclasses
import glob
import json
import os
import re
import signal
import sys

import pytest
import torch

import configs
from conftest import pin_xdist_worker
from engine import flags
from lab import bench
from lab import device_check
from lab import recipes


def test_the_default_parts_add_up_to_under_nine_minutes_with_a_cold_cache():
    every = {part.name: part for part in device_check.parts("out")}
    assert sum(every[name].box_s for name in device_check.ALL) <= 9 * 60
    with_nanogpt = {part.name: part for part in device_check.parts("out", nanogpt="/copy/of/nanoGPT")}
    assert sum(with_nanogpt[name].box_s for name in device_check.ALL) <= 10 * 60
    # a fresh machine's cold cache stopped the headline at its old box of 110 s, where a warm one took 62 s
    assert every["headline"].box_s >= 62 + 3 * device_check.COLD_COMPILE_S > 110


def test_each_compiler_setting_to_try_is_a_part_of_its_own_that_bench_accepts_beside_the_plain_headline():
    every = {part.name: part for part in device_check.parts("out")}
    tries = [name for name, *_ in device_check.TRIES]
    assert not set(tries) & set(device_check.ALL) and len(set(tries)) == 3
    headline = every["headline"].commands[0]
    assert every["cudagraphs"].commands == [[*headline, "--compile_mode=reduce-overhead"]]
    for name in [*tries, "cudagraphs"]:
        (command,) = every[name].commands
        module = command.index("lab.bench")
        setting, argv = command[:module - 2], command[module + 1:]
        # a setting is the environment of the one command, or none; the rest is a command bench.py takes
        assert setting == [] or (setting[0] == "env" and all(s.startswith("TORCHINDUCTOR_") for s in setting[1:]))
        assert setting or any(arg.startswith("--compile_mode=") for arg in argv)
        # on a GPU compile is on by default; a CPU has to be told, or it refuses --compile_mode
        models, opts, _, _ = bench.parse([*argv, "--compile=True"])
        assert all(cfg.n_embd == 768 and cfg.n_layer == 12 for cfg in models.values())
        if opts.variants == "headline":
            assert set(argv) - set(headline) <= {"--compile_mode=reduce-overhead"}


@pytest.mark.parametrize("name,kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"), ("nvjet_tst_128x256_64x4", "matmul"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
    ("triton_red_fused__to_copy_add_native_layer_norm_0", "triton"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "other")])
def test_a_kernel_is_sorted_by_its_name(name, kind):
    assert device_check.kernel_kind(name) == kind


@pytest.mark.slow
def test_the_step_profile_times_each_headline_variant(capsys):
    # on the CPU, eager and tiny: what runs is the code the GPU runs, with no CUDA kernels to count
    tiny = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--vocab_size=64"]
    assert device_check.profile_steps("cpu", tiny, compile=False) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step preset=baseline", "step preset=normformer",
                                                     "step norm=powernorm"]
    assert all(" ms a step, 0.0 ms of it in 0 CUDA kernels" in line for line in lines)


@pytest.mark.slow
def test_a_part_past_its_box_is_stopped_with_what_it_started_and_the_next_command_never_runs(tmp_path):
    marker = tmp_path / "ran"
    sleeper = [sys.executable, "-c", "import subprocess, sys, time; "
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('began', flush=True); "
               "time.sleep(60)"]
    part = device_check.Part("slow", 2, [sleeper, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]], "a test")
    with open(tmp_path / "log", "w") as log:
        status, seconds, output = device_check.run_part(part, log)
    assert status == "stopped at its box of 2 s" and seconds < 10
    assert "began" in output and not marker.exists()


def test_a_failing_command_ends_its_part_with_its_exit_code(tmp_path):
    part = device_check.Part("failing", 30, [[sys.executable, "-c", "raise SystemExit(3)"],
                                             [sys.executable, "-c", "print('after')"]], "a test")
    with open(tmp_path / "log", "w") as log:
        status, _, output = device_check.run_part(part, log)
    assert status == "exit code 3" and "after" not in output


def test_the_test_summary_is_read_from_pytests_last_line():
    output = "....F.\n= 2 failed, 1517 passed, 150 skipped in 171.20s (0:02:51) =\n"
    assert device_check.tests_figures(output) == {"summary": "2 failed, 1517 passed, 150 skipped"}
    assert device_check.tests_figures("....\n") == {}  # stopped before pytest's last line
    verbose = ("[gw3] [ 40%] FAILED tests/test_a.py::test_one[x] \n[gw1] [ 41%] PASSED tests/test_a.py::test_two \n"
               "FAILED tests/test_a.py::test_one[x] - AssertionError: no\n")
    assert device_check.tests_figures(verbose) == {"rows": ["FAILED tests/test_a.py::test_one[x]"]}


def test_the_quickstart_figures_come_from_its_log_and_progress_lines(tmp_path):
    run = tmp_path / "quickstart"
    run.mkdir()
    events = [{"event": "train", "step": step, "loss": 2.0, "lr": 1e-3, "ms_per_step": ms}
              for step, ms in [(25, 900.0), (50, 12.0), (75, 14.0), (100, 13.0)]]
    events.append({"event": "done", "step": 100, "val_loss": 1.84261})
    (run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    output = "step 25 | loss 3.1 | MFU 0.1% | ETA 0:10\nstep 100 | loss 2.0 | MFU 0.2% | ETA 0:00\n"
    assert device_check.quickstart_figures(output, str(tmp_path)) == {
        "val_loss": 1.8426, "ms_per_step_median": 13.0, "mfu_last": "0.2%"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU runs the check")
def test_without_a_gpu_the_check_is_refused_in_one_line(capsys):
    assert device_check.main([]) == 2
    assert capsys.readouterr().err == ("device_check.py: PyTorch sees no CUDA GPU here; the device check is for a "
                                       "machine with one\n")


def test_an_unknown_part_is_refused_naming_the_parts(capsys):
    assert device_check.main(["--parts=tests,bench"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--parts: bench is not a part; choose from tests, quickstart, speed, host, headline" in err


def test_the_suites_box_is_the_flags_and_a_box_of_no_seconds_is_refused(capsys):
    assert [p.box_s for p in device_check.parts("out", 300) if p.name == "suite"] == [300]
    assert device_check.main(["--parts=suite", "--suite_s=0"]) == 2
    assert capsys.readouterr().err == "device_check.py: --suite_s=0: a part's box is a positive number of seconds\n"


def pinned(environ, cores):
    calls = []
    share = pin_xdist_worker(environ, cores, lambda pid, mine: calls.append((pid, list(mine))))
    return share, calls


def test_outside_xdist_no_test_process_is_pinned():
    assert pinned({}, range(16)) == (None, [])


@pytest.mark.parametrize("workers,cores,share", [(16, 16, 1), (4, 16, 4), (3, 16, 5), (16, 2, 1)])
def test_each_xdist_worker_gets_its_own_share_of_the_cores(workers, cores, share):
    shares = []
    for i in range(workers):
        mine, calls = pinned({"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": str(workers)},
                             set(range(100, 100 + cores)))
        assert calls == [(0, mine)] and len(mine) == share and set(mine) <= set(range(100, 100 + cores))
        shares.append(mine)
    used = [core for mine in shares for core in mine]
    # no core is shared while there are cores enough; with more workers than cores they share round the cores
    assert len(set(used)) == min(len(used), cores)


def test_every_device_check_command_in_the_docs_names_its_parts():
    names = {part.name for part in device_check.parts("out")}
    pages = ["README.md", *sorted(glob.glob(os.path.join("docs", "*.md")))]
    named = []
    for page in pages:
        with open(os.path.join(device_check.ROOT, page), encoding="utf-8") as f:
            named += re.findall(r"lab\.device_check --parts=([\w,]+)", f.read())
    assert len(named) >= 3
    for parts in named:
        assert set(parts.split(",")) <= names, parts


@pytest.mark.parametrize("out, says", [("", "--out is empty; give the folder the figures and the log go to"),
                                       ("a_file", "is a file; give the folder"),
                                       ("a_file/deeper", "is under")])
def test_an_out_that_cannot_be_a_folder_is_refused_in_one_line_before_the_gpu_is_asked_for(tmp_path, capsys, out,
                                                                                           says):
    (tmp_path / "a_file").write_text("a file\n")
    assert device_check.main([f"--out={tmp_path / out if out else ''}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("device_check.py: ") and says in err and err.count("\n") == 1


def test_the_lab_plan_runs_every_recipe_as_designed_on_the_gpu_cheapest_first_within_its_box(capsys):
    import sweep
    plan = device_check.lab_plan("/out", 16, 480)
    assert sorted(name for name, *_ in plan) == sorted(recipes.RECIPES)
    assert [seconds for _, _, seconds, _, _ in plan] == sorted(seconds for _, _, seconds, _, _ in plan)
    to_run = [seconds for *_, seconds, _, fits in plan if fits]
    assert to_run and sum(to_run) <= 480 - device_check.LAB_MARGIN_S
    assert all(fits for *_, fits in plan[:len(to_run)]) and not any(fits for *_, fits in plan[len(to_run):])
    for name, runs, seconds, command, _ in plan:
        argv = command[command.index("sweep.py") + 1:]
        on_gpu, on_cpu = sweep.parse_args(argv), sweep.parse_args([f"--recipe={name}", "--out_dir=/out/lab/" + name])
        # the CPU design's runs (variants, LRs, seeds) and flags, then the GPU's device, eager float32
        assert [(r.variant, r.lr, r.seed) for r in sweep.grid(on_gpu)] == \
            [(r.variant, r.lr, r.seed) for r in sweep.grid(on_cpu)] and len(sweep.grid(on_gpu)) == runs
        assert on_gpu.train_argv == flags.replaced(on_cpu.train_argv,
                                                          [*device_check.ON_THE_GPU, "--data_dir=/out/data"])
        assert seconds == pytest.approx(sum(device_check.lab_estimate(sweep.train_flags(run, on_gpu))
                                            for run in sweep.grid(on_gpu)) / 16)
    assert device_check.main(["--dry_run", "--parts=lab", "--lab_s=60", "--out=/tmp/nanonorm_dry"]) == 0
    out = capsys.readouterr().out
    assert out.count("lab plan: ") == len(recipes.RECIPES) and "in all at most 60 s" in out


def test_a_runs_estimate_is_its_start_its_steps_and_its_evaluations():
    argv = ["--n_layer=4", "--max_iters=200", "--eval_interval=100", "--eval_iters=40"]
    steps = 200 + device_check.EVAL_SHARE * 3 * 2 * 40  # evaluations at steps 0, 100 and 200, both splits
    assert device_check.lab_estimate(argv) == pytest.approx(
        device_check.LAB_START_S + steps * 4 * device_check.LAB_LAYER_MS / 1000)


# a headline table as lab/results_page.headline_rows writes it: one agreeing claim, one not detected, one smaller
HEADLINE = """## Headline

| recipe | claim | effect | coverage | p (Holm) | target | power | verdict |
|---|---|---|---|---|---|---|---|
| [qk](#qk) | qk vs baseline: LR sensitivity | +0.3 [+0.1, +0.5] | 96.9% | 0.0312 | 0.2 | 90% | agrees |
| [pn](#pn) | pnv vs ln: loss | +0.01 [-0.02, +0.03] | 98.4% | 0.5 | 0.006 | 4% | not detected (MDE 0.03) |
| [dn](#dn) | dn vs postln: loss | +0.001 [-0.01, +0.02] | 99.2% | 0.6 | 0.5 | 100% | smaller than the target |
"""


def test_each_claims_verdict_on_the_gpu_is_set_beside_the_pages():
    page = device_check.headline_cells(HEADLINE)
    assert set(page) == {("qk", "qk vs baseline: LR sensitivity"), ("pn", "pnv vs ln: loss"),
                         ("dn", "dn vs postln: loss")}
    lines = device_check.lab_verdicts(page, page)
    assert len(lines) == len(page) and all("same verdict" in line for line in lines)
    assert all("within the page's interval" in line for line in lines)
    key = ("qk", "qk vs baseline: LR sensitivity")
    mean, low, high = device_check.effect_numbers(page[key][0])
    assert (mean, low, high) == (0.3, 0.1, 0.5)
    gpu = {key: (f"{high + 1:+g} [{high:+g}, {high + 2:+g}]", "not detected (minimum detectable effect 1)"),
           ("powernorm", "a claim the page lacks"): ("+1 [+0, +2]", "agrees")}
    changed, missing = device_check.lab_verdicts(page, gpu)
    assert "GPU not detected" in changed and "page agrees" in changed
    assert changed.endswith("another verdict, outside the page's interval")
    assert missing == "lab powernorm: a claim the page lacks: GPU agrees +1 [+0, +2]; not on the page"


def test_the_committed_pages_headline_is_read_whole():
    """Every row of docs/experiments.md's headline reaches the GPU comparison."""
    with open(os.path.join(device_check.ROOT, "docs", "experiments.md"), encoding="utf-8") as f:
        text = f.read()
    rows = [line for line in text.split("## Headline", 1)[1].splitlines() if line.startswith("| [")]
    assert rows and len(device_check.headline_cells(text)) == len(rows)


@pytest.mark.parametrize("verdict, word", [("agrees", "agrees"), ("earlier design: disagrees", "disagrees"),
                                           ("smaller than the paper's (not detected; ...)", "smaller than"),
                                           ("not detected (minimum detectable effect 0.05)", "not detected")])
def test_a_verdicts_word_is_its_kind(verdict, word):
    assert device_check.verdict_word(verdict) == word


def test_runs_a_minute_come_from_each_sweeps_count_and_its_commands_seconds():
    output = ("device_check: the command took 0.2 s\n4 runs, 0 finished already, 0 running elsewhere, 4 to run, 1 at "
              "a time\ndevice_check: the command took 40.0 s\n16 runs, 0 finished already, 0 running elsewhere, 16 to "
              "run, 16 at a time\ndevice_check: the command took 12.0 s\n")
    assert device_check.pack_figures(output) == {"rows": ["--jobs=1: 4 runs in 40.0 s, 6.0 runs a minute",
                                                          "--jobs=16: 16 runs in 12.0 s, 80.0 runs a minute"]}


def test_nanogpt_runs_at_the_quickstarts_settings_with_floats_where_its_configurator_wants_floats():
    import ast
    values = dict(flag[2:].split("=", 1) for flag in device_check.nanogpt_flags(*configs.from_flags({})))
    model_cfg, tc = configs.from_flags({})
    assert (int(values["n_layer"]), int(values["n_embd"]), int(values["block_size"]), int(values["batch_size"]),
            int(values["max_iters"])) == (model_cfg.n_layer, model_cfg.n_embd, model_cfg.block_size, tc.batch_size,
                                          tc.max_iters)
    for key in ("learning_rate", "min_lr", "dropout", "weight_decay", "beta1", "beta2", "grad_clip"):
        assert isinstance(ast.literal_eval(values[key]), float), key
    assert values["gradient_accumulation_steps"] == "1" and values["dtype"] == "bfloat16"


def test_nanogpts_figures_are_its_median_iteration_its_val_loss_and_its_seconds():
    output = ("step 0: train loss 5.5, val loss 5.6\niter 0: loss 5.5, time 9000.00ms, mfu -100.00%\n"
              "iter 25: loss 3.1, time 2.50ms, mfu 0.10%\niter 50: loss 2.9, time 2.70ms, mfu 0.10%\n"
              "iter 75: loss 2.8, time 2.60ms, mfu 0.10%\nstep 800: train loss 1.7, val loss 1.80\n")
    assert device_check.nanogpt_line(output, 21.04, 0) == \
        "nanoGPT: 2.60 ms/iter median, val loss 1.80, 21.0 s end to end"


def test_without_a_copy_of_nanogpt_its_side_is_skipped_in_one_line(tmp_path, capsys):
    assert device_check.side_by_side("", str(tmp_path)) == 0
    assert capsys.readouterr().out.startswith("nanoGPT: skipped: no --nanogpt=PATH")
    (tmp_path / "train.py").write_text("")
    assert device_check.side_by_side(str(tmp_path), str(tmp_path)) == 0
    assert capsys.readouterr().out == f"nanoGPT: skipped: {tmp_path} has no model.py, configurator.py\n"


def test_every_train_command_of_the_parts_is_one_train_py_takes():
    """The flags of each train.py run a part makes, resolved as train.py resolves them (compile on, as on a GPU,
    unless given): --fp16_overflow_fails refuses a compiled model, whose ops its hooks cannot see."""
    commands = [command for part in device_check.parts("out", nanogpt="/nanoGPT") for command in part.commands]
    runs = [command[command.index("train.py") + 1:] for command in commands if "train.py" in command]
    assert len(runs) >= 4
    for argv in runs:
        model_cfg, tc = configs.from_flags(configs.parse_flags(argv))
        assert not (tc.fp16_overflow_fails and tc.compile is not False), argv


def test_the_speed_figures_are_each_runs_step_and_the_eager_runs_end_to_end(tmp_path):
    for run, ms in (("speed", [900.0, 4.0, 5.0, 6.0]), ("speed_eager", [50.0, 2.0, 2.5, 3.0])):
        (tmp_path / run).mkdir()
        events = [{"event": "train", "step": 25 * (i + 1), "loss": 2.0, "lr": 1e-3, "ms_per_step": t}
                  for i, t in enumerate(ms)]
        (tmp_path / run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    output = ("device_check: the command took 30.0 s\ndevice_check: the command took 14.5 s\n"
              "nanoGPT: 2.60 ms/iter median, val loss 1.80, 21.0 s end to end\ndevice_check: the command took 25.0 s\n")
    speed = next(part for part in device_check.parts(str(tmp_path)) if part.name == "speed")
    assert device_check.figures_of(speed, output, str(tmp_path)) == {
        "instruments_ms_per_step_median": 5.0, "eager_ms_per_step_median": 2.5, "eager_end_to_end_s": 14.5,
        "eager_val_loss": None, "rows": ["nanoGPT: 2.60 ms/iter median, val loss 1.80, 21.0 s end to end"]}


@pytest.mark.slow
def test_the_lab_runs_what_fits_stops_what_runs_past_its_box_and_names_what_remains(tmp_path, monkeypatch, capsys):
    quick = [sys.executable, "-c", "print('a sweep that ends')"]
    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    plan = [("first", 2, 1.0, quick, True), ("second", 3, 2.0, slow, True), ("third", 5, 900.0, quick, False)]
    monkeypatch.setattr(device_check, "lab_plan", lambda out, jobs, box_s: plan)
    monkeypatch.setattr(device_check, "gpu_rows", lambda out, names: {("first", "a claim"): ("+1 [+0, +2]", "agrees")})
    assert device_check.run_lab(str(tmp_path), device_check.LAB_MARGIN_S + 3) == 0
    lines = capsys.readouterr().out.splitlines()
    ran = [line for line in lines if line.startswith("lab ran: ")]
    assert ran[0].startswith("lab ran: first, 2 runs in ") and ran[0].endswith("exit code 0")
    assert ran[1].startswith("lab ran: second, 3 runs in ") and ran[1].endswith(f"exit code {-signal.SIGTERM}")
    assert len(ran) == 2 and "lab remains: second, third" in lines
    assert lines[-1] == "lab first: a claim: GPU agrees +1 [+0, +2]; not on the page"


@pytest.mark.slow
def test_the_pack_part_end_to_end_on_the_cpu_writes_its_runs_a_minute(tmp_path, monkeypatch, corpus):
    """The pack part as main runs it, its sweeps made tiny and put on this CPU: the figures file gets a row per
    sweep with its runs and their rate."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device_check, "environment", lambda: {"date": "today", "gpu": "none", "torch": "-",
                                                              "cuda": "-", "python": "-", "cpu_cores": 2})
    monkeypatch.setattr(device_check, "ON_THE_GPU", ["--device=cpu", f"--dataset={corpus}"])
    monkeypatch.setattr(recipes, "CURVE_TRAINING", ["--max_iters=2", "--eval_interval=2", "--eval_iters=1"])
    monkeypatch.setattr(device_check, "PACK_SEEDS", {1: 1, "cores": 1})
    monkeypatch.setattr(device_check.pool.Machine, "here",
                        classmethod(lambda cls: device_check.pool.Machine(None, 2, [])))
    every = device_check.parts  # a box for a shared 2-core machine, where each run starts in seconds
    monkeypatch.setattr(device_check, "parts", lambda *args: [dataclasses.replace(part, box_s=600)
                                                              for part in every(*args)])
    assert device_check.main(["--parts=pack", f"--out={tmp_path}"]) == 0
    with open(tmp_path / "device_check.json") as f:
        (pack,) = json.load(f)["parts"]
    assert pack["status"] == "ok" and len(pack["figures"]["rows"]) == 2
    assert pack["figures"]["rows"][0].startswith("--jobs=1: 2 runs in ")
    assert pack["figures"]["rows"][1].startswith("--jobs=2: 2 runs in ")


def test_a_run_an_earlier_lab_part_finished_is_left_out_of_the_estimate(tmp_path):
    import sweep
    before = {name: seconds for name, _, seconds, *_ in device_check.lab_plan(str(tmp_path), 16, 480)}
    plan = sweep.parse_args(["--recipe=powernorm", f"--out_dir={tmp_path / 'lab' / 'powernorm'}",
                             *device_check.ON_THE_GPU, f"--data_dir={tmp_path / 'data'}"])
    done = sweep.grid(plan)[0]
    os.makedirs(done.dir)
    with open(os.path.join(done.dir, "log.jsonl"), "w") as f:  # a finished run's log: its end, as train.py logs it
        f.write('{"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}\n'
                '{"event": "done", "step": 2, "val_loss": 5.0}\n')
    with open(done.dir + ".exit", "w") as f:
        f.write("0\n")
    after = {name: seconds for name, _, seconds, *_ in device_check.lab_plan(str(tmp_path), 16, 480)}
    assert after["powernorm"] == pytest.approx(
        before["powernorm"] - device_check.lab_estimate(sweep.train_flags(done, plan)) / 16)
    assert {k: v for k, v in after.items() if k != "powernorm"} == {k: v for k, v in before.items() if k != "powernorm"}
