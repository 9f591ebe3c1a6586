"""lab/device_check.py as far as a machine without a GPU can check it: its time boxes, its refusals, and how it
reads the figures out of its parts' output."""
import glob
import json
import os
import re
import sys

import pytest
import torch

from conftest import pin_xdist_worker
from lab import bench
from lab import device_check


def test_the_default_parts_add_up_to_eight_minutes():
    assert sum(part.box_s for part in device_check.parts("out") if part.name not in device_check.NOT_IN_ALL) <= 8 * 60


def test_each_compiler_setting_to_try_is_a_part_of_its_own_that_bench_accepts_beside_the_plain_headline():
    every = {part.name: part for part in device_check.parts("out")}
    tries = [name for name, *_ in device_check.TRIES]
    assert set(tries) <= set(device_check.NOT_IN_ALL) and len(set(tries)) == 4
    headline = every["headline"].commands[0]
    for name in tries:
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
    assert err.count("\n") == 1 and "--parts: bench is not a part; choose from tests, quickstart, headline" in err


def test_the_suites_box_is_the_flags_and_a_box_of_no_seconds_is_refused(capsys):
    assert [p.box_s for p in device_check.parts("out", 300) if p.name == "suite"] == [300]
    assert device_check.main(["--parts=suite", "--suite_s=0"]) == 2
    assert capsys.readouterr().err == "device_check.py: --suite_s=0: the suite's box is a positive number of seconds\n"


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
