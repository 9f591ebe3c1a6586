"""The tests' shared fixtures and helpers (pytest reads this file for test_norms.py and every file in tests/; a test
file imports a plain helper as `from conftest import ROOT`). A test file never imports another test file."""
import builtins
import functools
import json
import os
import random
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))  # the repository root: scripts run from here
# GPT-2's BPE ranks where a developer's checkout has them beside it (../shared/tiktoken); elsewhere tiktoken's own
# cache. Only the tests marked by the gpt2_ranks fixture need them: the rest make their own tokenizer (small_bpe).
SHARED_TIKTOKEN = os.path.join(os.path.dirname(ROOT), "shared", "tiktoken")
if os.path.isdir(SHARED_TIKTOKEN):
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", SHARED_TIKTOKEN)
# The tests make their own corpora and never reach the Hub: datasets reads these before its first import
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# cuBLAS is deterministic only with a fixed workspace, set before its first use in the process (CUDA's docs,
# "Results reproducibility"): the exact-resume test on CUDA needs it; CPU runs ignore it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def pin_xdist_worker(environ, cores, set_affinity):
    """Under pytest-xdist (lab/device_check.py's suite: 16 workers on a 16-core GPU machine), each worker on its
    share of the cores; returns that share (None outside xdist). A training test gives torch as many threads as
    the cores its process may run on (engine/runtime.cpu_cores), so 16 workers on every core each oversubscribed
    the machine 16 times: the suite reached 75% in 300 s there."""
    worker, count = environ.get("PYTEST_XDIST_WORKER"), environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return None
    cores = sorted(cores)
    share = max(1, len(cores) // int(count))
    first = int(worker.removeprefix("gw")) * share % len(cores)
    mine = cores[first:first + share]
    set_affinity(0, mine)
    return mine


if hasattr(os, "sched_setaffinity"):  # Linux; before torch is imported, which sizes its thread pool then
    pin_xdist_worker(os.environ, os.sched_getaffinity(0), os.sched_setaffinity)


def cuda_available():
    """Whether PyTorch sees a CUDA GPU (imported here, not at the top: conftest.py is read before test files that
    need no torch)."""
    import torch
    return torch.cuda.is_available()


# the reason a CUDA test gives where it is skipped
NO_CUDA = "no CUDA GPU here: the CUDA tests run on a GPU machine (python -m lab.device_check runs them all)"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test marked cuda is skipped here where there is no CUDA GPU: pytest -rs (pyproject.toml) then says so on one
    line for them all, where a skipif mark's reason is said once per test function."""
    if item.get_closest_marker("cuda") and not cuda_available():
        pytest.skip(NO_CUDA)


# The tiny model of model.py's own tests: GPTConfig's keyword arguments.
TINY_CONFIG = dict(n_layer=2, n_embd=32, n_head=4, block_size=16, vocab_size=64)
# The tiny train.py run: a model that trains in milliseconds a step. A test file states how its runs differ with
# tiny(flag=value) (None drops a flag), since its assertions count steps, evals and tokens of exactly these runs.
# On the CPU, whatever the machine has: the tests about training (exact resume, float32 losses, dispatch counts)
# are about CPU semantics, and --device=auto on a GPU machine would pick CUDA, bfloat16 and a compile for every
# tiny run. The CUDA tests (tests/test_cuda.py, the cuda marker) ask for the GPU themselves.
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--log_interval=1", "--warmup_iters=2", "--lr=3e-3", "--device=cpu"]


def tiny(**changes):
    """TINY with each named flag set to its value (appended if TINY lacks it) or dropped where the value is None."""
    flags = {f[2:].partition("=")[0]: f[2:].partition("=")[2] for f in TINY}
    flags.update(changes)
    return [f"--{name}={value}" for name, value in flags.items() if value is not None]


# A sweep's tiny run (sweep.py's, plot.py's and the recipes' tests): one layer, 4 steps, the LR set per run.
SWEEP_TINY = tiny(n_layer=1, block_size=16, eval_iters=1, warmup_iters=0, lr=None, max_iters=4, eval_interval=2)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """About 20 KB of text from a small vocabulary: learnable structure, prepared in well under a second. Tests only
    read it; data prepared beside it (its folder's data/) is shared by the runs that ask for that data_dir."""
    rng = random.Random(0)
    words = ["norm", "layer", "gamma", "beta", "residual", "attention", "head", "scale", "spike", "loss"]
    text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(300))
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(text)
    return str(path)


def prepared(corpus):
    """The data folder beside corpus: the runs that name it prepare the corpus once between them."""
    return os.path.join(os.path.dirname(corpus), "data")


def train_argv(corpus, data_dir, out_dir, *flags):
    """train.py's flags for a run on corpus: its data prepared in data_dir, the run in out_dir, then flags, a test's
    own after TINY's replacing them (train.py refuses a flag given twice)."""
    return last_of_each([f"--dataset={corpus}", f"--data_dir={data_dir}", f"--out_dir={out_dir}", *flags])


def save_checkpoint(checkpoint, path):
    """torch.save of a checkpoint a test made or edited, with the sha256 of its contents that train.py writes with it
    (run_folder.CHECKSUM) made anew where it has one: a test of what a checkpoint holds, not of a damaged file."""
    import torch
    from engine import run_folder
    if isinstance(checkpoint, dict) and run_folder.CHECKSUM in checkpoint:
        checkpoint = {**checkpoint, run_folder.CHECKSUM: run_folder.payload_sha256(checkpoint)}
    torch.save(checkpoint, path)


def flag_name(entry):
    return entry[2:].partition("=")[0] if entry.startswith("--") else None


def last_of_each(flags):
    """flags with each --name=value kept only where it is the last of its name."""
    names = [flag_name(f) for f in flags]
    return [f for i, (f, name) in enumerate(zip(flags, names)) if name is None or name not in names[i + 1:]]


def without(base, flags):
    """base's flags less those flags set: what a test gives replaces TINY's (train.py refuses a flag given twice)."""
    given = {flag_name(f) for f in flags}
    return [f for f in base if flag_name(f) not in given]


def resumed_line(step, max_iters, was):
    """train.py's line for a resume that raised --max_iters (configs.RESUME: a flag that extends the run)."""
    return (f"train.py: note: resumed at step {step} with --max_iters={max_iters} (was {was}); from this step on "
            "(log.jsonl: a resumed event)")


def run_train(corpus, data_dir, out_dir, *flags):
    """train.main in this process (fast, and monkeypatch reaches into it); returns its exit code."""
    import train  # here, not at the top: conftest.py is read before every test file, even those without torch
    return train.main(train_argv(corpus, data_dir, out_dir, *flags))


def run(corpus, folder, *flags, out="out"):
    """train.main in this process on corpus, its data prepared in folder/data and the run in folder/out; returns its
    exit code."""
    return run_train(corpus, folder / "data", folder / out, *flags)


def events(out_dir, kind=None):
    """The events of out_dir/log.jsonl (all, or those of one kind), each line read as JSON here, not by nanonorm."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [e for e in map(json.loads, f) if kind in (None, e["event"])]


def folder_snapshot(root):
    """Every file under root with its bytes (a folder: None), to compare before and after a command."""
    return {p.relative_to(root): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


LAB_MODULES = {"bench.py": "lab.bench"}  # the lab's commands run as modules from the root


def refused(folder, script, args):
    """`python SCRIPT ARGS` in folder, which must refuse them: exit code 2, one line on stderr naming the script, no
    traceback, nothing on stdout, and every file under folder as it was. Returns the line."""
    before = folder_snapshot(folder)
    command = [sys.executable, "-m", LAB_MODULES[script]] if script in LAB_MODULES else [
        sys.executable, os.path.join(ROOT, script)]
    r = subprocess.run([*command, *args], cwd=folder, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith(f"{script}: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert folder_snapshot(folder) == before  # nothing written, nothing changed
    return r.stderr


def train_process(*args, timeout=300, env=None, **kwargs):
    """`python train.py ARGS` from the repository root, as a user runs it, on one intra-op thread."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                          **kwargs)


def torchrun(n, *args, script="train.py"):
    """`torchrun --standalone --nproc_per_node=n SCRIPT ARGS` from the repository root, one thread a process."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", str(script),
               *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on one intra-op thread (a file asks for it with pytestmark): a second thread only adds
    synchronization, and on a busy 2-core machine it made 30 training steps take 2-17 s instead of 0.3 s."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FailingWrites:
    """Writes to the files whose names start with `name` fail with `code`, after `after` that succeed (builtins.open
    and os.open, with a mode or flags that write). name None: every write under `under` once `once` exists."""

    def __init__(self, monkeypatch, code, name=None, after=0, under=None, once=None):
        self.code, self.name, self.after, self.under, self.once, self.count = code, name, after, under, once, 0
        self.open, self.os_open = builtins.open, os.open
        monkeypatch.setattr(builtins, "open", self.patched_open)
        monkeypatch.setattr(os, "open", self.patched_os_open)

    def check(self, path):
        path = str(path)
        if self.name is not None:
            hit = os.path.basename(path).startswith(self.name)
        else:
            hit = path.startswith(str(self.under)) and os.path.exists(self.once)
        if hit:
            self.count += 1
            if self.count > self.after:
                raise OSError(self.code, os.strerror(self.code), path)

    def patched_open(self, file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
            self.check(file)
        return self.open(file, mode, *args, **kwargs)

    def patched_os_open(self, path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR):
            self.check(path)
        return self.os_open(path, flags, *args, **kwargs)


def check_png(path):
    """path is a PNG larger than 100x100 pixels that is not one flat color."""
    import matplotlib.image  # here: only the plotting tests need matplotlib
    import numpy as np
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100 and pixels.shape[2] in (3, 4)
    assert float(np.std(pixels[..., :3])) > 0


# train.py with pause points, run as python -c PAUSED_TRAIN <point> <flags>: at the point it prints "paused at
# <point>" and sleeps, for a test to kill it there. step@N: step N's gradients computed, weights not yet updated;
# eval@N: step N's eval line about to be logged; save@N: step N's checkpoint written but not yet renamed into place.
PAUSED_TRAIN = """
import sys, time
import torch
import train
from diagnostics.instruments import Instruments
from engine import run_folder

point = sys.argv.pop(1)
judge, log_event, save = Instruments.judge, run_folder.log_event, torch.save


def pause(at):
    if at == point:
        print(f"paused at {point}", flush=True)
        time.sleep(60)


def judged(self, step, *args):
    verdict = judge(self, step, *args)
    pause(f"step@{step + 1}")
    return verdict


def logged(path, event):
    pause(f"{event['event']}@{event['step']}")
    log_event(path, event)


def saved(state, f, *args, **kwargs):
    save(state, f, *args, **kwargs)
    pause(f"save@{state['step']}")


Instruments.judge, run_folder.log_event, torch.save = judged, logged, saved
sys.exit(train.main(sys.argv[1:]))
"""


@functools.lru_cache(maxsize=None)
def reachable(url, timeout=5):
    """Whether url answers at all within timeout seconds (asked once a session)."""
    import urllib.request
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
        return True
    except Exception:
        return False


@pytest.fixture
def gpt2_ranks():
    """For the few tests about GPT-2's real BPE (its ids, its 50,257 tokens): skipped with a one-line reason where the
    ranks are neither in tiktoken's cache nor downloadable. CI has the cache, so there the skip is a failure."""
    import data
    cache = data.tiktoken_cache_file(data.GPT2_RANKS_URL)
    if (cache is None or not os.path.exists(cache)) and not reachable(data.GPT2_RANKS_URL):
        reason = ("GPT-2's BPE ranks are neither in tiktoken's cache nor downloadable: set TIKTOKEN_CACHE_DIR to a "
                  "folder holding them")
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run the GPT-2 tests)")
        pytest.skip(reason)


# The text small_bpe learns its merges from: English and Python, as the tests' corpora are
BPE_TEXT = ("the norm of the layer normalizes the tokens of the batch; the model learns the norm's gain.\n"
            "def norm(x):\n    return (x - x.mean()) / x.std()  # the layer norm of x\n") * 20


def learn_bpe(text, n_ranks, pat_str):
    """Byte-pair merges as GPT-2 learns them (Sennrich et al. 2016): start from the 256 bytes, then repeatedly make
    the most frequent adjacent pair inside a pre-tokenized piece one token, until there are n_ranks tokens."""
    import regex
    ranks = {bytes([i]): i for i in range(256)}
    pieces = {}
    for piece in regex.findall(pat_str, text):
        key = tuple(bytes([b]) for b in piece.encode("utf-8"))
        pieces[key] = pieces.get(key, 0) + 1
    while len(ranks) < n_ranks:
        pairs = {}
        for parts, count in pieces.items():
            for pair in zip(parts, parts[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        best = max(pairs, key=lambda pair: (pairs[pair], pair))  # ties broken by the bytes: the same ranks each run
        ranks.setdefault(best[0] + best[1], len(ranks))
        pieces = {merged(parts, best): count for parts, count in pieces.items()}
    return ranks


def merged(parts, pair):
    """parts with every adjacent occurrence of pair made one token, left to right."""
    out, i = [], 0
    while i < len(parts):
        if parts[i:i + 2] == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return tuple(out)


@functools.lru_cache(maxsize=None)
def small_bpe_encoding():
    """A BPE tokenizer of 300 ranks and <|endoftext|> (301 tokens: a vocab padded to 320), GPT-2's split pattern."""
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str
    ranks = learn_bpe(BPE_TEXT, 300, r50k_pat_str)
    return tiktoken.Encoding(name="small_bpe", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


@pytest.fixture
def small_bpe(monkeypatch):
    """--tokenizer=gpt2 as a small BPE made here, for the tests of nanonorm's own logic around a BPE tokenizer
    (padding the vocabulary, ids past it, meta checks, sampling with the run's tokenizer): no download needed."""
    import data
    enc = small_bpe_encoding()
    monkeypatch.setattr(data, "load_gpt2", lambda: enc)
    monkeypatch.setitem(data.VOCAB_SIZES, "gpt2", enc.n_vocab)
    return enc
