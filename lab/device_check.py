"""
The one check a maintainer with a GPU runs: every test on the GPU machine, the quickstart, GPT-2 small's bench,
each norm's compiled cost beside layernorm's, the batch that gives the best MFU, and where powernorm's time goes.
    python -m lab.device_check                      # every part but the whole suite: 8 minutes on one H100
    python -m lab.device_check --parts=suite        # README command 1, every test, on the GPU machine
    python -m lab.device_check --parts=steps        # where a GPT-2 small step of baseline, NormFormer, PowerNorm goes
    python -m lab.device_check --parts=tests,quickstart
    python -m lab.device_check --parts=headline,multi_kernel,cudagraphs   # the compiler's settings to try (7 min)
Each part is a subprocess with its own time box, so one slow part cannot eat the rest: a part past its box is
stopped and reported as such, and the next one starts. The figures go to OUT/device_check.json and
OUT/device_check.md (with the GPU, torch and the commands), every part's output to OUT/device_check.log, and one
table is printed at the end. Absolute times mean something only on a GPU with nothing else running.
"""

import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

import configs
from engine import files
from engine import run_reader
from engine.flags import UsageError, build, fail, help_of, parse, print_help, wants_help
from lab.bench import VARIANTS, NormVariant, Variant, synchronize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# GPT-2 small (124M parameters with the padded vocabulary), nanoGPT's shape, at batch 16
GPT2_SMALL = ["--n_layer=12", "--n_head=12", "--n_embd=768", "--block_size=1024", "--vocab_size=50304"]
# the batches the MFU part tries at GPT-2 small beyond 16, in turn, while its box lasts (a compile and 5 rounds each,
# about 45 s): on one H100, MFU rose from 38.0% at 16 to 41.3% at 32, 41.9% at 48 and 42.1% at 64 (40 GiB)
BATCHES = (64, 48)
# The compiler's settings to try against the headline's costs (docs/benchmarks.md, "GPUs: one H100"), each a part to
# run beside the plain headline part, none changing the code: (part, box in seconds, the environment it sets, its bench
# flags, what it times)
TRIES = (
    # NormFormer: inductor reduces a row in one pass only up to 1,024 values; the FFN LN's rows have 3,072
    ("multi_kernel", 150, ["env", "TORCHINDUCTOR_MULTI_KERNEL=1"],
     ["--variants=headline", "--batch_size=16", "--rounds=10"], "the headline with inductor's multi-kernel reductions"),
    # PowerNorm: the GPU waited on the host for 3.6 ms of its step, the baseline for 1.3 ms
    ("cudagraphs", 150, [], ["--variants=headline", "--batch_size=16", "--rounds=10",
                             "--compile_mode=reduce-overhead"],
     "the headline replayed as CUDA graphs"),
    # both: inductor tries neighbouring block sizes for each of its kernels and keeps the fastest
    ("coordinate_descent", 200, ["env", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1"],
     ["--variants=headline", "--batch_size=16", "--rounds=10"], "the headline, each Triton kernel tuned in turn"),
    # MFU: the matrix products autotuned, at the batch that gave the best MFU (42.1% at 64)
    ("autotune", 300, [], ["--variants=defaults", "--batch_size=64", "--rounds=5",
                           "--compile_mode=max-autotune-no-cudagraphs"],
     "the default model at batch 64, its matrix products autotuned (MFU)"),
)
# the parts --parts=all leaves out: where a GPT-2 small step goes (150 s more), the whole suite (8 minutes more) and
# the compiler's settings to try (13 minutes more, all four)
NOT_IN_ALL = ("steps", "suite", *(name for name, *_ in TRIES))


@dataclass
class Options:
    out: str = help_of("folder for device_check.json, .md and .log (and the quickstart's run)",
                       default="out/device_check")
    parts: str = help_of("comma-separated parts to run, in this order: tests, quickstart, headline, baseline, "
                         "norms, batch, profile, steps, suite, multi_kernel, cudagraphs, coordinate_descent, "
                         "autotune; all: every part but steps (where a GPT-2 small step goes, 150 s more), suite (the "
                         "whole test suite, up to 8 minutes more) and the four compiler settings to try (from "
                         "multi_kernel on: the headline, or the best batch, under one setting each)",
                           default="all")
    suite_s: int = help_of("the whole suite's time box in seconds (16 workers, each on its share of the cores)",
                           default=480)
    profile: bool = help_of("(internal) print where the compiled layernorm and powernorm spend their time",
                            default=False)
    profile_steps: bool = help_of("(internal) print where a compiled GPT-2 small step of the headline variants "
                                  "spends its time", default=False)


@dataclass
class Part:
    name: str
    box_s: int  # the time box: the part is stopped after this many seconds
    commands: list  # run one after another inside the box
    what: str


def python(*args):
    return [sys.executable, *args]


def bench(*args):
    return python("-m", "lab.bench", *args)


def parts(out, suite_s=Options.suite_s):
    """The parts in their order. The default ones (every part but suite) have boxes that add up to 8 minutes."""
    # pytest-xdist where it is installed: the tests spread over 16 processes, test by test (the compiles too)
    xdist = ["-n", "16", "--dist=load"] if importlib.util.find_spec("xdist") else []
    pytest = python("-m", "pytest", "-p", "no:cacheprovider", "-rfE", *xdist)
    quickstart = python("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "train.py",
                        f"--out_dir={os.path.join(out, 'quickstart')}", f"--data_dir={os.path.join(out, 'data')}",
                        "--overwrite")
    return [
        Part("tests", 120, [[*pytest, "-q", "-m", "cuda or not slow"]],
             "every CUDA test, and the quick loop, on this machine"),
        Part("quickstart", 65, [quickstart], "README command 2: the default model on the built-in corpus"),
        Part("headline", 110, [bench("--variants=headline", *GPT2_SMALL, "--batch_size=16", "--rounds=10")],
             "GPT-2 small, bf16, compiled: baseline, NormFormer, PowerNorm"),
        Part("baseline", 35, [bench("--variants=baseline", *GPT2_SMALL, "--batch_size=16", "--rounds=10")],
             "the default model against plain GPT-2, same shape"),
        Part("norms", 35, [bench("--variants=norms", "--part=norm", "--compile=True", "--n_embd=768",
                                 "--block_size=1024", "--batch_size=16", "--rounds=20")],
             "each norm module alone at GPT-2 small's activations, compiled, against layernorm"),
        Part("batch", 100, [bench("--variants=defaults", *GPT2_SMALL, f"--batch_size={b}", "--rounds=5")
                            for b in BATCHES], "the default model at GPT-2 small: MFU by batch (16: baseline)"),
        Part("profile", 15, [python("-m", "lab.device_check", "--profile")],
             "the compiled layernorm and powernorm modules' kernels"),
        # not in the default 8 minutes: three more compiles of GPT-2 small, to see where the variants' time goes
        Part("steps", 150, [python("-m", "lab.device_check", "--profile_steps")],
             "where a GPT-2 small step of the headline variants spends its time"),
        # not in the default 8 minutes: README command 1 whole, every test one by one in the log; 16 processes
        # that each took all 16 cores got through 75% of it in 300 s on one H100 machine (conftest now pins them)
        Part("suite", suite_s, [[*pytest, "-v"]], "README command 1 on this machine: every test"),
        # not in the default 8 minutes: the compiler's settings to try, one a part
        *(Part(name, box_s, [[*setting, *bench(*GPT2_SMALL, *flags)]], what)
          for name, box_s, setting, flags, what in TRIES),
    ]


def run_part(part, log):
    """Runs the part's commands in turn until its box runs out; returns (status, seconds, output)."""
    start, output, status = time.perf_counter(), [], "ok"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for command in part.commands:
        left = part.box_s - (time.perf_counter() - start)
        if left <= 0:
            status = f"box of {part.box_s} s ran out"
            break
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        # a process group of its own, so that a part past its box is stopped with every process it started
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        try:
            text, _ = process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            text, _ = process.communicate()
            status = f"stopped at its box of {part.box_s} s"
        log.write(text)
        log.flush()
        output.append(text)
        if status != "ok":
            break
        if process.returncode != 0:
            status = f"exit code {process.returncode}"
            break
    return status, time.perf_counter() - start, "\n".join(output)


def tests_figures(output):
    """pytest's closing counts, and every failed test named so far (from -rfE's summary, or -v's lines as they
    come, which a part stopped at its box still has)."""
    match = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?) in ([\d.]+)s", output, re.M)
    failed = [word for line in output.splitlines() if "FAILED" in line.split()
              for word in line.split() if "::" in word]
    figures = {"summary": match[-1][0]} if match else {}
    return {**figures, "rows": [f"FAILED {name}" for name in dict.fromkeys(failed)]} if failed else figures


def quickstart_figures(output, out):
    """The quickstart's val loss and median step time from its log (run_reader's, which checks every event), and
    the last MFU its progress lines printed."""
    figures = {}
    try:
        events, _ = run_reader.read_log(run_reader.log_path(os.path.join(out, "quickstart")))
    except UsageError as e:
        figures["log"] = str(e)
        events = []
    if events:
        done = [e for e in events if e["event"] == "done"]
        steps = [e["ms_per_step"] for e in events if e["event"] == "train"][1:]  # the first holds the compile
        if done:
            figures["val_loss"] = round(done[-1]["val_loss"], 4)
        if steps:
            figures["ms_per_step_median"] = round(statistics.median(steps), 2)
    mfu = re.findall(r"MFU ([\d.]+)%", output)
    if mfu:
        figures["mfu_last"] = f"{mfu[-1]}%"
    return figures


def bench_rows(output):
    """The rows of bench.py's tables (and its header lines) as printed."""
    return [line for line in output.splitlines()
            if line.startswith(("device ", "MFU ", "variant ", "guard", "preset=", "norm=", "plain ", "nanonorm ",
                                "powernorm", "layernorm"))]


def figures_of(part, output, out):
    if part.name in ("tests", "suite"):
        return tests_figures(output)
    if part.name == "quickstart":
        return quickstart_figures(output, out)
    if part.name in ("profile", "steps"):
        return {"rows": [line for line in output.splitlines() if line.startswith(("  ", "norm=", "step "))]}
    return {"rows": bench_rows(output)}


def environment():
    cuda = torch.cuda.is_available()
    return {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name() if cuda else "no CUDA GPU",
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "cpu_cores": os.cpu_count()}


def markdown(env, results):
    lines = [f"device check, {env['date']}: {env['gpu']}, torch {env['torch']} (CUDA {env['cuda']}), Python "
             f"{env['python']}, {env['cpu_cores']} CPU cores", "", "| part | what | status | seconds | figures |",
             "|---|---|---|---|---|"]
    for r in results:
        short = {k: v for k, v in r["figures"].items() if k != "rows"}
        lines.append(f"| {r['part']} | {r['what']} | {r['status']} | {r['seconds']:.0f} | "
                     f"{', '.join(f'{k} {v}' for k, v in short.items())} |")
    for r in results:
        if r["figures"].get("rows"):
            lines += ["", f"{r['part']}: `{' '.join(os.path.basename(a) for a in r['commands'][0])}`", "```",
                      *r["figures"]["rows"], "```"]
    return "\n".join(lines) + "\n"


def profile_norms():
    """The CUDA kernels of one compiled forward and backward of layernorm and of powernorm (norm modules as the
    model builds them, GPT-2 small's activations, bf16 autocast), with their total time over 10 calls."""
    for kind in ("layernorm", "powernorm"):
        given = {"n_embd": 768, "block_size": 1024, "norm": kind, "batch_size": 16, "device": "cuda",
                 "dtype": "bfloat16", "compile": True}
        model_cfg, tc, device, _ = configs.resolve(given, random_tokens=True)
        variant = NormVariant(model_cfg, tc, device, torch.bfloat16)
        kernels, total = profiled(variant, 10)
        print(f"norm={kind}: {total * 1e3:.0f} us a forward and backward, {len(kernels)} kernels")
        for e in kernels[:8]:
            print(f"  {e.device_time_total / 10:8.1f} us x{e.count // 10:<3} {e.key[:90]}")
    return 0


def profile_steps(device="cuda", shape=GPT2_SMALL, compile=True):
    """Where one compiled training step of GPT-2 small (batch 16, bf16) goes, for the headline variants: its wall
    time beside the time its CUDA kernels take (the rest is the GPU waiting on the host), those kernels by kind, and
    the ones that take the most time."""
    calls = 5  # steps profiled, then as many timed
    given = {**configs.parse_flags(shape), "batch_size": 16, "device": device, "dtype": "bfloat16", "compile": compile}
    for name, flags in VARIANTS["headline"].items():
        model_cfg, tc, device, _ = configs.resolve({**flags, **given}, random_tokens=True)
        variant = Variant(model_cfg, tc, device, torch.bfloat16, name)
        kernels, total = profiled(variant, calls, device)
        start = time.perf_counter()
        for _ in range(calls):
            variant.step()
        synchronize(device)
        wall = (time.perf_counter() - start) / calls * 1e3
        kinds = {}
        for e in kernels:
            kind = kernel_kind(e.key)
            kinds[kind] = kinds.get(kind, 0) + e.device_time_total / calls / 1e3
        launches = sum(e.count for e in kernels) // calls
        print(f"step {name}: {wall:.1f} ms a step, {total:.1f} ms of it in {launches} CUDA kernels ("
              + ", ".join(f"{kind} {ms:.1f}" for kind, ms in sorted(kinds.items(), key=lambda k: -k[1])) + ")")
        for e in kernels[:10]:
            print(f"  {e.device_time_total / calls / 1e3:7.2f} ms x{e.count // calls:<4} {e.key[:90]}")
    return 0


def profiled(variant, calls, device="cuda"):
    """The CUDA kernels of `calls` steps of a warmed-up variant, the slowest first, and their time a step (ms)."""
    for _ in range(3):
        variant.step()
    synchronize(device)
    # on a CPU (the tests) the profiler records CPU ops, which have no device time: no kernels
    activity = "CUDA" if device.startswith("cuda") else "CPU"
    with torch.profiler.profile(activities=[getattr(torch.profiler.ProfilerActivity, activity)]) as prof:
        for _ in range(calls):
            variant.step()
        synchronize(device)
    kernels = sorted((e for e in prof.key_averages() if e.device_time_total > 0), key=lambda e: -e.device_time_total)
    return kernels, sum(e.device_time_total for e in kernels) / calls / 1e3


def kernel_kind(name):
    """A CUDA kernel's kind, from its name: matrix products (cuBLAS, CUTLASS), attention (flash), the compiler's
    fused Triton kernels, and the rest (copies, the optimizer's, the loss's)."""
    name = name.lower()
    if any(word in name for word in ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas")):
        return "matmul"
    if any(word in name for word in ("flash", "fmha", "attention")):
        return "attention"
    return "triton" if name.startswith("triton") else "other"


def main(argv):
    if wants_help(argv):
        print_help(__doc__, Options)
        return 0
    try:
        opts = build(Options, parse(argv, Options))
        files.check_out_folder(opts.out, "the figures and the log", "out/device_check")
        out = os.path.abspath(opts.out)
        if opts.suite_s < 1:
            raise UsageError(f"--suite_s={opts.suite_s}: the suite's box is a positive number of seconds")
        every = parts(out, opts.suite_s)
        names = [p.name for p in every]
        wanted = [n for n in names if n not in NOT_IN_ALL] if opts.parts == "all" else opts.parts.split(",")
        unknown = set(wanted) - set(names)
        if unknown:
            raise UsageError(f"--parts: {', '.join(sorted(unknown))} is not a part; choose from {', '.join(names)}")
        chosen = [p for p in every if p.name in wanted]
        if not torch.cuda.is_available():
            raise UsageError("PyTorch sees no CUDA GPU here; the device check is for a machine with one")
    except UsageError as e:
        return fail("device_check.py", e)
    if opts.profile:
        return profile_norms()
    if opts.profile_steps:
        return profile_steps()
    os.makedirs(out, exist_ok=True)
    env, results = environment(), []
    with open(os.path.join(out, "device_check.log"), "w") as log:
        for part in chosen:
            print(f"device_check: {part.name} ({part.what}), at most {part.box_s} s", flush=True)
            status, seconds, output = run_part(part, log)
            results.append({"part": part.name, "what": part.what, "status": status, "seconds": seconds,
                            "commands": part.commands, "figures": figures_of(part, output, out)})
    files.write_atomic(os.path.join(out, "device_check.json"),
                       json.dumps({"environment": env, "parts": results}, indent=1).encode())
    page = markdown(env, results)
    files.write_atomic(os.path.join(out, "device_check.md"), page.encode())
    print(page)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
