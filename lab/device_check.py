"""
The one check a maintainer with a GPU runs: small runs at the GPU's speed (README command 2 end to end, the quickstart
model's step with every instrument on, nanoGPT's own train.py beside it), GPT-2 small's headline bench, plain and as
CUDA graphs, a sweep packed on one GPU, every recipe of the lab on it, and the whole suite.
    python -m lab.device_check                      # quickstart, speed, headline, cudagraphs: 8.6 minutes at most
    python -m lab.device_check --nanogpt=PATH       # the same, with nanoGPT's train.py (a copy, PATH) beside it
    python -m lab.device_check --parts=pack,lab     # --jobs=1 against --jobs=16, then every recipe (9 minutes)
    python -m lab.device_check --parts=suite        # README command 1, every test, on the GPU machine
    python -m lab.device_check --parts=steps        # where a GPT-2 small step of baseline, NormFormer, PowerNorm goes
    python -m lab.device_check --parts=host         # where the quickstart's host time goes (cProfile)
    python -m lab.device_check --parts=tests,baseline,norms,batch,profile   # the earlier figures (docs/benchmarks.md)
    python -m lab.device_check --parts=headline,multi_kernel,coordinate_descent  # compiler settings to try
    python -m lab.device_check --dry_run            # every part's commands and box, and the lab's plan; no GPU needed
Each part is a subprocess with its own time box, so one slow part cannot eat the rest: a part past its box is
stopped and reported as such, and the next one starts. The boxes are sized for a fresh machine, whose compile cache is
cold (the cudagraphs part's counts on the headline part's kernels in the cache). The figures go to
OUT/device_check.json and OUT/device_check.md (with the GPU, torch and the commands), rewritten after every part,
every part's output to OUT/device_check.log, and one table is printed at the end. Absolute times mean something
only on a GPU with nothing else running.
"""
import glob
import importlib.util
import json
import os
import pickle
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

import configs
from engine import files
from engine import flags
from engine import run_reader
from engine.flags import UsageError, build, fail, help_of, parse, print_help, wants_help
from lab import pool
from lab import recipes
from lab.bench import VARIANTS, NormVariant, Variant, synchronize
from lab.results_page import headline_rows, variant_flags
from lab.runs import Run, is_finished
from lab.schema import read_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# GPT-2 small (124M parameters with the padded vocabulary), nanoGPT's shape, at batch 16
GPT2_SMALL = ["--n_layer=12", "--n_head=12", "--n_embd=768", "--block_size=1024", "--vocab_size=50304"]
# the batches the MFU part tries at GPT-2 small beyond 16, in turn, while its box lasts (a compile and 5 rounds each,
# about 45 s): on one H100, MFU rose from 38.0% at 16 to 41.3% at 32, 41.9% at 48 and 42.1% at 64 (40 GiB)
BATCHES = (64, 48)
# The compiler's settings to try against the headline's costs (docs/benchmarks.md, "GPUs: one H100"), each a part to
# run beside the plain headline part, none changing the code (CUDA graphs, the fourth, is the part cudagraphs): (part,
# box in seconds, the environment it sets, its bench flags, what it times)
TRIES = (
    # NormFormer: inductor reduces a row in one pass only up to 1,024 values; the FFN LN's rows have 3,072
    ("multi_kernel", 200, ["env", "TORCHINDUCTOR_MULTI_KERNEL=1"],
     ["--variants=headline", "--batch_size=16", "--rounds=10"], "the headline with inductor's multi-kernel reductions"),
    # both: inductor tries neighbouring block sizes for each of its kernels and keeps the fastest
    ("coordinate_descent", 260, ["env", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1"],
     ["--variants=headline", "--batch_size=16", "--rounds=10"], "the headline, each Triton kernel tuned in turn"),
    # MFU: the matrix products autotuned, at the batch that gave the best MFU (42.1% at 64)
    ("autotune", 300, [], ["--variants=defaults", "--batch_size=64", "--rounds=5",
                           "--compile_mode=max-autotune-no-cudagraphs"],
     "the default model at batch 64, its matrix products autotuned (MFU)"),
)
# --parts=all: the figures of small runs and of the headline, in 8.6 minutes at most on a fresh machine (the boxes)
ALL = ("quickstart", "speed", "headline", "cudagraphs")
# What a cold compile cache adds to a part that compiles GPT-2 small, per compile: on a fresh H200 the headline part
# (three compiles) overran its 110 s box, where with the cache warm it took 62 s (2026-11-27): 45 s a compile is an
# allowance, not a measurement, to replace with the first fresh machine's figure. A model the quickstart's size
# compiles in a fraction of that.
COLD_COMPILE_S = 45
COLD_SMALL_COMPILE_S = 20
# CPU recipes on the GPU as the CPU ran them: eager, float32 (these replace a recipe's --device=cpu, as sweep.py
# replaces a recipe's flag the command line gives)
ON_THE_GPU = ["--device=cuda", "--dtype=float32", "--compile=False"]


# the lab part's estimate of a recipe run on one GPU, until a GPU run measures it: a process's start (Python, torch,
# CUDA, the data and memory checks) and an eager step, which the host bounds at these sizes (kernel launches), per
# layer; an evaluation batch is a forward alone, about a third of a step
LAB_START_S = 8.0
LAB_LAYER_MS = 1.5
EVAL_SHARE = 1 / 3
LAB_MARGIN_S = 30  # of the lab part's box, kept for stopping a recipe that runs long and reading the summaries
# the pack part: a recipe-sized sweep (normformer_lr's runs) at --jobs=1 and at one job per core
PACK_SEEDS = {1: 2, "cores": 8}  # seeds per variant: 4 runs at --jobs=1, 16 at one job per core
NANOGPT_FILES = ("train.py", "model.py", "configurator.py")


@dataclass
class Options:
    out: str = help_of("folder for device_check.json, .md and .log (and the runs of its parts)",
                       default="out/device_check")
    parts: str = help_of("comma-separated parts to run, in this order: tests, quickstart, speed, host, headline, "
                         "cudagraphs, pack, lab, baseline, norms, batch, profile, steps, suite, multi_kernel, "
                         "coordinate_descent, autotune; all: quickstart, speed, headline and cudagraphs (8.6 minutes)",
                         default="all")
    nanogpt: str = help_of("a folder holding a copy of nanoGPT's train.py, model.py and configurator.py: the speed "
                           "part runs it beside nanonorm at the quickstart's shape (skipped, and said, without it)",
                           default="")
    lab_s: int = help_of("the lab part's time box in seconds: the recipes that fit run, the rest are named",
                         default=480)
    suite_s: int = help_of("the whole suite's time box in seconds (16 workers, each on its share of the cores)",
                           default=480)
    dry_run: bool = help_of("print each chosen part's box and commands (and the lab's plan) and run nothing",
                            default=False)
    profile: bool = help_of("(internal) print where the compiled layernorm and powernorm spend their time",
                            default=False)
    profile_steps: bool = help_of("(internal) print where a compiled GPT-2 small step of the headline variants "
                                  "spends its time", default=False)
    side_by_side: bool = help_of("(internal) run nanoGPT's train.py from --nanogpt at the quickstart's settings",
                                 default=False)
    lab: bool = help_of("(internal) run the recipes that fit in --lab_s on this GPU and compare their verdicts",
                        default=False)


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


def this_check(*args):
    return python("-m", "lab.device_check", *args)


def parts(out, suite_s=Options.suite_s, nanogpt="", lab_s=Options.lab_s):
    """The parts in their order. Those of --parts=all have boxes that add up to 8.6 minutes with a cold cache."""
    # pytest-xdist where it is installed: the tests spread over 16 processes, test by test (the compiles too)
    xdist = ["-n", "16", "--dist=load"] if importlib.util.find_spec("xdist") else []
    pytest = python("-m", "pytest", "-p", "no:cacheprovider", "-rfE", *xdist)
    data = f"--data_dir={os.path.join(out, 'data')}"
    quickstart = python("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "train.py",
                        f"--out_dir={os.path.join(out, 'quickstart')}", data, "--overwrite")
    # the quickstart's model and data with every instrument on, every 25 steps: telemetry, float16 headroom, and the
    # float16 overflow criterion's forward hooks on every step, which see nothing inside torch.compile: eager
    instruments = python("train.py", f"--out_dir={os.path.join(out, 'speed')}", data, "--overwrite",
                         "--max_iters=400", "--eval_interval=400", "--telemetry_interval=25",
                         "--fp16_headroom_interval=25", "--fp16_overflow_fails=True", "--compile=False")
    # README command 2 without the compile: whether inductor pays for itself at this size on a GPU
    eager = python("train.py", f"--out_dir={os.path.join(out, 'speed_eager')}", data, "--overwrite", "--compile=False")
    side = this_check("--side_by_side", f"--out={out}", *([f"--nanogpt={nanogpt}"] if nanogpt else []))
    profile = os.path.join(out, "host.prof")
    host = [python("-m", "cProfile", "-o", profile, "train.py", f"--out_dir={os.path.join(out, 'host')}", data,
                   "--overwrite", "--max_iters=400", "--eval_interval=400"),
            python("-c", f"import pstats; pstats.Stats({profile!r}).sort_stats('tottime').print_stats(30)")]
    cores = pool.Machine.here().count
    headline = ["--variants=headline", *GPT2_SMALL, "--batch_size=16", "--rounds=10"]
    return [
        Part("tests", 120 + 2 * COLD_SMALL_COMPILE_S, [[*pytest, "-q", "-m", "cuda or not slow"]],
             "every CUDA test, and the quick loop, on this machine"),
        # README command 2 as a new user runs it, data preparation and compile included: 56 s on one H200 (its
        # target: 25 s), and a cold compile of its small model
        Part("quickstart", 70 + COLD_SMALL_COMPILE_S, [quickstart],
             "README command 2, end to end: the default model on the built-in corpus"),
        # 400 steps with every instrument on (the step's target: 3 ms), README command 2 eager, then nanoGPT's own
        # train.py at the quickstart's settings, from a copy passed in (this machine may have no network to fetch it)
        Part("speed", 40 + COLD_SMALL_COMPILE_S + 40 + (50 + COLD_SMALL_COMPILE_S if nanogpt else 0),
             [instruments, eager, side],
             "the quickstart model's step with every instrument on, README command 2 eager, nanoGPT beside them"),
        # where the host's time goes in 400 quickstart steps, compiled (cProfile: Python, the one device read a step,
        # the launches)
        Part("host", 45 + COLD_SMALL_COMPILE_S, host, "the quickstart's host time by function (cProfile)"),
        # 62 s with a warm cache on one H200, and three cold compiles of GPT-2 small
        Part("headline", 62 + 3 * COLD_COMPILE_S, [bench(*headline)],
             "GPT-2 small, bf16, compiled: baseline, NormFormer, PowerNorm"),
        # the headline's three models again, recorded as CUDA graphs (the Triton kernels come from the headline's
        # cache; the graphs are traced and recorded anew)
        Part("cudagraphs", 70 + 3 * COLD_SMALL_COMPILE_S, [bench(*headline, "--compile_mode=reduce-overhead")],
             "the headline replayed as CUDA graphs (PowerNorm waited 3.6 ms of its step on the host)"),
        # the same sweep of recipe-sized runs, one at a time and one a core: runs per minute (eager float32, as the
        # CPU recipes run)
        Part("pack", 90, [python("-c", f"import shutil; shutil.rmtree({os.path.join(out, 'pack')!r}, True)"),
                          *(pack_sweep(out, jobs, cores) for jobs in PACK_SEEDS)],
             f"a sweep of {2 * PACK_SEEDS[1]} runs at --jobs=1, then {2 * PACK_SEEDS['cores']} at --jobs={cores}: "
             "runs per minute"),
        Part("lab", lab_s, [this_check("--lab", f"--out={out}", f"--lab_s={lab_s}")],
             "every recipe at its CPU design on this GPU, packed; each claim's verdict beside the page's"),
        Part("baseline", 35 + 2 * COLD_COMPILE_S,
             [bench("--variants=baseline", *GPT2_SMALL, "--batch_size=16", "--rounds=10")],
             "the default model against plain GPT-2, same shape"),
        Part("norms", 35 + COLD_SMALL_COMPILE_S, [bench("--variants=norms", "--part=norm", "--compile=True",
                                                        "--n_embd=768", "--block_size=1024", "--batch_size=16",
                                                        "--rounds=20")],
             "each norm module alone at GPT-2 small's activations, compiled, against layernorm"),
        Part("batch", 100 + 2 * COLD_COMPILE_S,
             [bench("--variants=defaults", *GPT2_SMALL, f"--batch_size={b}", "--rounds=5") for b in BATCHES],
             "the default model at GPT-2 small: MFU by batch (16: baseline)"),
        Part("profile", 15 + COLD_SMALL_COMPILE_S, [this_check("--profile")],
             "the compiled layernorm and powernorm modules' kernels"),
        Part("steps", 150 + 3 * COLD_COMPILE_S, [this_check("--profile_steps")],
             "where a GPT-2 small step of the headline variants spends its time"),
        # README command 1 whole, every test one by one in the log; 16 processes that each took all 16 cores got
        # through 75% of it in 300 s on one H100 machine (conftest now pins them)
        Part("suite", suite_s, [[*pytest, "-v"]], "README command 1 on this machine: every test"),
        # the compiler's settings to try, one a part
        *(Part(name, box_s, [[*setting, *bench(*GPT2_SMALL, *flags)]], what)
          for name, box_s, setting, flags, what in TRIES),
    ]


def pack_sweep(out, jobs, cores):
    """The pack part's sweep at --jobs=jobs ("cores": one job per core): two variants of normformer_lr's runs, one
    LR, PACK_SEEDS[jobs] seeds each."""
    count = cores if jobs == "cores" else jobs
    return python("sweep.py", "--variants=nf_baseline,nf_normformer", "--lrs=1e-2", f"--seeds={PACK_SEEDS[jobs]}",
                  f"--jobs={count}", f"--out_dir={os.path.join(out, 'pack', f'jobs_{jobs}')}",
                  *flags.replaced([*recipes.cpu(), *recipes.CURVE_TRAINING], ON_THE_GPU),
                  f"--data_dir={os.path.join(out, 'data')}")


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
        begun = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        try:
            text, _ = process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            text, _ = process.communicate()
            status = f"stopped at its box of {part.box_s} s"
        text += f"\ndevice_check: the command took {time.perf_counter() - begun:.1f} s\n"
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


def quickstart_figures(output, out, run="quickstart"):
    """A train.py run's val loss and median step time from its log (run_reader's, which checks every event), the
    last MFU its progress lines printed, and the seconds its command took end to end."""
    figures = {}
    try:
        events, _ = run_reader.read_log(run_reader.log_path(os.path.join(out, run)))
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
    took = command_seconds(output)
    if took:
        figures["end_to_end_s"] = took[0]
    return figures


def command_seconds(output):
    """The seconds each command of a part took, in order (run_part's closing line of each)."""
    return [float(s) for s in re.findall(r"^device_check: the command took ([\d.]+) s$", output, re.M)]


def pack_figures(output):
    """Runs per minute of each sweep of the pack part (its first command clears their folder)."""
    rows = []
    sweeps = re.findall(r"^(\d+) runs, .* (\d+) at a time$", output, re.M)
    for (runs, jobs), seconds in zip(sweeps, command_seconds(output)[1:]):
        rows.append(f"--jobs={jobs}: {runs} runs in {seconds:.1f} s, {int(runs) / seconds * 60:.1f} runs a minute")
    return {"rows": rows}


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
    if part.name == "speed":
        instruments = quickstart_figures(output, out, "speed")
        eager = quickstart_figures(output.split("device_check: the command took", 1)[-1], out, "speed_eager")
        return {"instruments_ms_per_step_median": instruments.get("ms_per_step_median"),
                "eager_ms_per_step_median": eager.get("ms_per_step_median"),
                "eager_end_to_end_s": eager.get("end_to_end_s"), "eager_val_loss": eager.get("val_loss"),
                "rows": [line for line in output.splitlines() if line.startswith("nanoGPT")]}
    if part.name == "host":
        return {"rows": [line for line in output.splitlines() if re.match(r"\s+\d+(/\d+)?\s+[\d.]+", line)]}
    if part.name == "pack":
        return pack_figures(output)
    if part.name == "lab":
        return {"rows": [line for line in output.splitlines() if line.startswith("lab")]}
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
            commands = "`, `".join(" ".join(os.path.basename(a) for a in command) for command in r["commands"])
            lines += ["", f"{r['part']}: `{commands}`", "```", *r["figures"]["rows"], "```"]
    return "\n".join(lines) + "\n"


def nanogpt_flags(model_cfg, tc):
    """nanoGPT's train.py flags for the quickstart's run: its shape, batch, steps, LR schedule, evaluation and
    logging, on the GPU in bf16, compiled, as nanonorm's train.py resolves them there. Floats are written as floats:
    nanoGPT's configurator.py refuses a value of another type than its default's."""
    values = {"dataset": "nanonorm", "out_dir": "out", "device": "cuda", "dtype": "bfloat16", "compile": True,
              "n_layer": model_cfg.n_layer, "n_head": model_cfg.n_head, "n_embd": model_cfg.n_embd,
              "block_size": model_cfg.block_size, "bias": model_cfg.bias, "dropout": float(model_cfg.dropout),
              "batch_size": tc.batch_size, "gradient_accumulation_steps": tc.grad_accum, "max_iters": tc.max_iters,
              "lr_decay_iters": tc.lr_decay_iters or tc.max_iters, "learning_rate": float(tc.lr),
              "min_lr": float(tc.min_lr), "warmup_iters": tc.warmup_iters, "weight_decay": float(tc.weight_decay),
              "beta1": float(tc.beta1), "beta2": float(tc.beta2), "grad_clip": float(tc.grad_clip),
              "eval_interval": tc.eval_interval, "eval_iters": tc.eval_iters, "log_interval": tc.log_interval,
              "always_save_checkpoint": False}
    return [f"--{key}={value}" for key, value in values.items()]


def side_by_side(nanogpt, out):
    """nanoGPT's own train.py (a copy in the folder nanogpt) at the quickstart's settings, from a temporary folder,
    on the data the quickstart part prepared: its median ms per iteration and its seconds end to end, printed as a
    line beside the quickstart's figures. Without a copy, one line says why it was skipped."""
    if not nanogpt:
        print("nanoGPT: skipped: no --nanogpt=PATH (a folder with a copy of nanoGPT's train.py, model.py and "
              "configurator.py; this machine may have no network to fetch them)")
        return 0
    missing = [name for name in NANOGPT_FILES if not os.path.isfile(os.path.join(nanogpt, name))]
    prepared = sorted(glob.glob(os.path.join(glob.escape(out), "data", "*", "train.bin")))
    if missing or not prepared:
        print(f"nanoGPT: skipped: {nanogpt} has no {', '.join(missing)}" if missing else
              f"nanoGPT: skipped: no data prepared under {os.path.join(out, 'data')} (the quickstart part prepares it)")
        return 0
    model_cfg, tc = configs.from_flags({})
    with tempfile.TemporaryDirectory() as folder:
        for name in NANOGPT_FILES:
            shutil.copy(os.path.join(nanogpt, name), folder)
        data = os.path.join(folder, "data", "nanonorm")
        os.makedirs(data)
        for split in ("train", "val"):  # nanonorm's byte tokens are uint16, as nanoGPT reads them
            os.symlink(os.path.join(os.path.dirname(prepared[0]), f"{split}.bin"), os.path.join(data, f"{split}.bin"))
        with open(os.path.join(data, "meta.pkl"), "wb") as f:
            pickle.dump({"vocab_size": model_cfg.vocab_size}, f)
        start = time.perf_counter()
        result = subprocess.run(python("train.py", *nanogpt_flags(model_cfg, tc)), cwd=folder, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
    print(result.stdout)
    print(nanogpt_line(result.stdout, seconds, result.returncode))
    return 0


def nanogpt_line(output, seconds, code):
    """The line of figures from nanoGPT's output: the median of its "iter N: ... time X ms" lines after the first
    (which holds the compile), its last val loss and its seconds end to end."""
    times = [float(ms) for ms in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", output, re.M)][1:]
    val = re.findall(r"val loss ([\d.]+)", output)
    figures = [f"{statistics.median(times):.2f} ms/iter median" if times else "no iteration times",
               f"val loss {val[-1]}" if val else "no val loss", f"{seconds:.1f} s end to end"]
    return f"nanoGPT: {', '.join(figures)}" + (f" (exit code {code})" if code else "")


def lab_plan(out, jobs, box_s):
    """Every recipe at its CPU design (its seeds, LRs and flags, eager float32) as a sweep on this GPU, jobs runs at
    a time, with the estimated seconds of its unfinished runs (lab_estimate), cheapest first; the recipes whose
    estimates add up within the box, less LAB_MARGIN_S, are to run, the rest to remain. Returns [(name, runs,
    seconds, command, fits)]."""
    plan = []
    data = f"--data_dir={os.path.join(out, 'data')}"
    for name in recipes.RECIPES:
        recipe, folder = recipes.settings(name), os.path.join(out, "lab", name)
        # sweep.py's grid (lab/ runs below sweep.py and cannot import it; tests/test_device_check.py holds them equal)
        pilot_end, tested = recipe["first_seed"] + recipes.RECIPES[name].pilot, recipe["tested_lrs"]
        runs = [Run(variant, lr, seed, os.path.join(folder, variant, lr, str(seed)))
                for variant in recipe["variants"] for lr in recipe["lrs"]
                for seed in range(recipe["first_seed"], recipe["first_seed"] + recipe["seeds"])
                if seed < pilot_end or tested is None or lr in tested.get(variant, ())]
        common = flags.replaced(recipe["train_argv"], [*ON_THE_GPU, data])
        # a run an earlier lab part finished costs nothing: its sweep skips it
        seconds = sum(lab_estimate(flags.replaced(common, variant_flags(run.variant))) for run in runs
                      if not is_finished(run))
        command = python("sweep.py", f"--recipe={name}", f"--jobs={jobs}", f"--out_dir={folder}", *ON_THE_GPU, data)
        plan.append((name, len(runs), seconds / jobs, command))
    planned, used = [], 0.0
    for name, runs, seconds, command in sorted(plan, key=lambda p: p[2]):
        fits = used + seconds <= box_s - LAB_MARGIN_S
        used += seconds if fits else 0
        planned.append((name, runs, seconds, command, fits))
    return planned


def lab_estimate(argv):
    """A run's seconds on one GPU by LAB_START_S, LAB_LAYER_MS and EVAL_SHARE: its start, its steps, and its
    evaluations (both splits, eval_iters batches each, at step 0, every eval_interval and at the end)."""
    model_cfg, tc = configs.from_flags(configs.parse_flags(argv))
    evaluations = tc.max_iters // tc.eval_interval + 1
    steps = tc.max_iters + EVAL_SHARE * evaluations * 2 * tc.eval_iters
    return LAB_START_S + steps * model_cfg.n_layer * LAB_LAYER_MS / 1000


def run_lab(out, box_s):
    """The lab part: the recipes that fit (lab_plan) in turn, each sweep stopped (with its runs' checkpoints, which
    a re-run resumes) if the box runs out; then each claim's verdict beside the page's (docs/experiments.md)."""
    start, jobs = time.perf_counter(), pool.Machine.here().count
    plan = lab_plan(out, jobs, box_s)
    for name, runs, seconds, _, fits in plan:
        print(f"lab plan: {name}, {runs} runs, about {seconds:.0f} s at {jobs} jobs: "
              f"{'to run' if fits else 'remains (past the box)'}", flush=True)
    done = []
    for name, runs, _, command, fits in plan:
        left = box_s - LAB_MARGIN_S - (time.perf_counter() - start)
        if not fits or left <= 0:
            continue
        began = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
        try:
            code = process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # sweep.py passes it on: the runs stop with a checkpoint
            code = process.wait()
        took = time.perf_counter() - began
        print(f"lab ran: {name}, {runs} runs in {took:.0f} s ({runs / took * 60:.0f} runs a minute), exit code {code}",
              flush=True)
        if code == 0:
            done.append(name)
    remain = [name for name, *_ in plan if name not in done]
    print(f"lab remains: {', '.join(remain) if remain else 'none'}")
    with open(os.path.join(ROOT, "docs", "experiments.md"), encoding="utf-8") as f:
        page = headline_cells(f.read())
    for line in lab_verdicts(page, gpu_rows(out, done)):
        print(line)
    return 0


def gpu_rows(out, names):
    """The headline rows of the recipes' sweeps on this GPU, as the results page writes them."""
    rows = []
    for name in names:
        rows += headline_rows(read_summary(os.path.join(out, "lab", name, "summary.json")))
    return headline_cells("\n".join(rows))


def headline_cells(text):
    """The rows of a headline table (the results page's): {(recipe, claim): (effect, verdict)}."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ["):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            recipe = re.match(r"\[(\w+)\]", cells[0]).group(1)
            rows[(recipe, cells[1])] = (cells[2], cells[-1])
    return rows


VERDICTS = ("agrees", "disagrees", "smaller than", "not detected", "descriptive", "no verdict")


def verdict_word(verdict):
    """A verdict's kind, the word a GPU run and the page should share."""
    verdict = verdict.removeprefix("earlier design: ")
    return next((word for word in VERDICTS if verdict.startswith(word)), verdict)


def effect_numbers(effect):
    """(mean, low, high) of an effect cell "+0.183 [+0.0984, +0.497]"; None where it holds no such numbers."""
    number = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)"
    match = re.match(rf"{number} \[{number}, {number}\]", effect)
    return tuple(float(x) for x in match.groups()) if match else None


def lab_verdicts(page, gpu):
    """A line per claim the GPU ran: its verdict and effect beside the page's, whether the verdict is the same word
    and whether the GPU's mean lies within the interval the page states."""
    lines = []
    for (recipe, claim), (effect, verdict) in gpu.items():
        if (recipe, claim) not in page:
            lines.append(f"lab {recipe}: {claim}: GPU {verdict_word(verdict)} {effect}; not on the page")
            continue
        page_effect, page_verdict = page[(recipe, claim)]
        same = "same verdict" if verdict_word(verdict) == verdict_word(page_verdict) else "another verdict"
        ours, theirs = effect_numbers(effect), effect_numbers(page_effect)
        within = ("no interval to compare" if not ours or not theirs else
                  "within the page's interval" if theirs[1] <= ours[0] <= theirs[2] else "outside the page's interval")
        lines.append(f"lab {recipe}: {claim}: GPU {verdict_word(verdict)} {effect}; page {verdict_word(page_verdict)} "
                     f"{page_effect}: {same}, {within}")
    return lines


def dry_run(chosen, out, lab_s):
    """Each chosen part's box and commands, and the lab part's plan, without running anything (no GPU needed)."""
    for part in chosen:
        print(f"{part.name}: at most {part.box_s} s: {part.what}")
        for command in part.commands:
            print(f"    {' '.join(command)}")
        if part.name == "lab":
            jobs = pool.Machine.here().count
            for name, runs, seconds, _, fits in lab_plan(out, jobs, lab_s):
                print(f"    lab plan: {name}, {runs} runs, about {seconds:.0f} s at {jobs} jobs: "
                      f"{'to run' if fits else 'remains (past the box)'}")
    print(f"in all at most {sum(part.box_s for part in chosen)} s")
    return 0


def write_figures(out, env, results):
    """OUT/device_check.json and .md with the parts run so far; returns the page."""
    files.write_atomic(os.path.join(out, "device_check.json"),
                       json.dumps({"environment": env, "parts": results}, indent=1).encode())
    page = markdown(env, results)
    files.write_atomic(os.path.join(out, "device_check.md"), page.encode())
    return page


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
    for name, settings in VARIANTS["headline"].items():
        model_cfg, tc, device, _ = configs.resolve({**settings, **given}, random_tokens=True)
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
        for name, box in (("suite_s", opts.suite_s), ("lab_s", opts.lab_s)):
            if box < 1:
                raise UsageError(f"--{name}={box}: a part's box is a positive number of seconds")
        nanogpt = os.path.abspath(opts.nanogpt) if opts.nanogpt else ""
        every = parts(out, opts.suite_s, nanogpt, opts.lab_s)
        names = [p.name for p in every]
        wanted = list(ALL) if opts.parts == "all" else opts.parts.split(",")
        unknown = set(wanted) - set(names)
        if unknown:
            raise UsageError(f"--parts: {', '.join(sorted(unknown))} is not a part; choose from {', '.join(names)}")
        chosen = [p for p in every if p.name in wanted]
        if opts.dry_run:
            return dry_run(chosen, out, opts.lab_s)
        if not torch.cuda.is_available():
            raise UsageError("PyTorch sees no CUDA GPU here; the device check is for a machine with one")
    except UsageError as e:
        return fail("device_check.py", e)
    if opts.profile:
        return profile_norms()
    if opts.profile_steps:
        return profile_steps()
    if opts.side_by_side:
        return side_by_side(nanogpt, out)
    if opts.lab:
        return run_lab(out, opts.lab_s)
    os.makedirs(out, exist_ok=True)
    env, results = environment(), []
    with open(os.path.join(out, "device_check.log"), "w") as log:
        for part in chosen:
            print(f"device_check: {part.name} ({part.what}), at most {part.box_s} s", flush=True)
            status, seconds, output = run_part(part, log)
            results.append({"part": part.name, "what": part.what, "status": status, "seconds": seconds,
                            "commands": part.commands, "figures": figures_of(part, output, out)})
            page = write_figures(out, env, results)  # after every part: a check stopped from outside keeps them
    print(page)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
