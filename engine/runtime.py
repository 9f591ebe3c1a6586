"""
Where a run executes: torchrun's processes (DDP), the device and dtype, CPU threads and memory, and how fast it
goes (ms/step, tokens/s, MFU).

In the order a run meets them: `Machine.from_env()` reads torchrun's environment (one process without it), and
`resolve_device(tc)` makes --device=auto and --dtype=auto concrete; `check_memory(model_cfg, tc, device, machine)`
refuses a model that cannot fit before anything is allocated. Once every input is checked (on every process, each on its
own: no process group yet), `start(device, machine)` joins the process group and sets the CPU threads. In the loop,
`host_read(...)` is a step's one read of the device (a StepRead), through which the processes agree on the loss,
gradient norm and a stop request (StopRequest, Ctrl-C); `agree` makes a failure on one process (a checkpoint write) a
failure on all, and `rank_spread` checks that DDP kept their weights identical. `Progress` times the progress lines and
`mfu` divides their FLOP/s by the GPUs' peak (`gpu_peak_flops`).
"""

import ctypes
import dataclasses
import datetime
import os
import platform
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
# Imported before init_process_group on purpose: torch.distributed.nn binds group.WORLD as a default argument when
# first imported, and DDP imports it (through torch._dynamo). Imported after, it pins the group for good, so
# destroy_process_group leaves gloo's threads running into the interpreter's exit, where they can abort it
# ("terminate called without an active exception": once in a 2-process CPU run). Imported first, it binds None.
import torch.distributed.nn  # noqa: F401

from engine import signals
from engine.flags import UsageError

# what a gloo collective says when the process at the other end has exited
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


@dataclass
class Machine:
    """This process's place in the run: its rank among world_size processes (torchrun sets RANK, LOCAL_RANK,
    WORLD_SIZE and LOCAL_WORLD_SIZE; without them, one process), its device, and the GPUs the run uses."""
    ddp: bool = False
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    device: str = "cpu"
    gpus: int = 0  # GPUs of the whole run, for MFU: one per process, or each node's when processes share them

    @classmethod
    def from_env(cls):
        """This process's place from torchrun's variables (torchrun_counts checks them, before anything is
        written); one process where RANK is unset."""
        counts = torchrun_counts(os.environ)
        return cls(ddp="RANK" in os.environ, rank=counts["RANK"], local_rank=counts["LOCAL_RANK"],
                   world_size=counts["WORLD_SIZE"], local_world_size=counts["LOCAL_WORLD_SIZE"])

    @property
    def master(self):
        return self.rank == 0

    @property
    def device_type(self):
        return self.device.split(":")[0]


# What torchrun sets in every process it starts, with the values of a run of one process, and where process 0 listens
# (init_process_group's env:// rendezvous reads MASTER_ADDR and MASTER_PORT)
COUNTS = {"RANK": 0, "LOCAL_RANK": 0, "WORLD_SIZE": 1, "LOCAL_WORLD_SIZE": 1}
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")
BELOW = (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE"))  # a rank goes from 0 to its size - 1
RUN_ONE = ("run under torchrun (torchrun --standalone --nproc_per_node=N ...), or unset torchrun's variables to run "
           "one process")


def torchrun_counts(environ):
    """{name: value} of COUNTS from environ, checked against each other: the environment is input too. Each is a
    plain integer; without RANK the run is one process, so the others are unset or one process's values (WORLD_SIZE=2
    alone would make process 0 average its losses over a second process that never starts); with RANK all four and
    the rendezvous are set, the sizes are at least 1, each rank is below its size and a node's processes are at most
    the run's. Anything else is a UsageError naming the variable."""
    given = {name: environ[name] for name in COUNTS if name in environ}
    for name, text in given.items():
        if not re.fullmatch(r"[0-9]{1,9}", text):
            raise UsageError(f"{name}={text} in the environment is not an integer >= 0; torchrun sets {name}: "
                             f"{RUN_ONE}")
    counts = {name: int(given.get(name, one)) for name, one in COUNTS.items()}
    for size in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        if counts[size] < 1:
            raise UsageError(f"{size}=0 in the environment: a run has at least one process; {RUN_ONE}")
    if "RANK" not in environ:
        for name, one in COUNTS.items():
            if counts[name] != one:
                raise UsageError(f"{name}={counts[name]} is set in the environment but RANK is not, and torchrun "
                                 f"sets both; {RUN_ONE}")
        return counts
    for name in (*COUNTS, *RENDEZVOUS):
        if name not in environ:
            raise UsageError(f"RANK={counts['RANK']} is set in the environment but {name} is not, and torchrun "
                             f"sets both; {RUN_ONE}")
    for rank, size in BELOW:
        if counts[rank] >= counts[size]:
            raise UsageError(f"{rank}={counts[rank]} with {size}={counts[size]} in the environment: a {rank} goes "
                             f"from 0 to {size} - 1; {RUN_ONE}")
    if counts["LOCAL_WORLD_SIZE"] > counts["WORLD_SIZE"]:
        raise UsageError(f"LOCAL_WORLD_SIZE={counts['LOCAL_WORLD_SIZE']} with WORLD_SIZE={counts['WORLD_SIZE']} in "
                         f"the environment: a node runs at most the run's processes; {RUN_ONE}")
    port = environ["MASTER_PORT"]
    # a TCP port; torch's rendezvous fails on another with a traceback of its own
    if not (re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65535):
        raise UsageError(f"MASTER_PORT={port[:20]} in the environment is not a TCP port (an integer from 1 to 65535); "
                         f"torchrun sets it from --master_port (--standalone picks a free one); {RUN_ONE}")
    if not environ["MASTER_ADDR"].strip():
        raise UsageError(f"MASTER_ADDR is empty in the environment; torchrun sets it from --master_addr; {RUN_ONE}")
    return counts


def concrete_device(name):
    """--device=name as a device of this machine: auto is CUDA where there is a GPU, else the CPU; a named GPU or
    MPS device that is not here is a UsageError."""
    device = name
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = device.split(":")[0]
    if device_type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device={name}: CUDA is not available here; use --device=cpu")
    gpu = torch.device(device).index if device_type == "cuda" else None
    if gpu is not None and gpu >= torch.cuda.device_count():
        raise UsageError(f"--device={name}: this machine has {torch.cuda.device_count()} GPUs (cuda:0 to "
                         f"cuda:{torch.cuda.device_count() - 1})")
    if device_type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device={name}: this torch has no MPS device; use --device=cpu")
    return device


def resolve_device(tc):
    """--device=auto and --dtype=auto made concrete: returns the device and tc with its dtype resolved."""
    device = concrete_device(tc.device)
    device_type = device.split(":")[0]
    if tc.dtype == "auto":
        # CPUs without bf16 units run bf16 autocast 20-30x slower than float32 (measured on a 2-core AMD EPYC)
        bf16_ok = device_type == "cuda" and torch.cuda.is_bf16_supported()
        tc = dataclasses.replace(tc, dtype="bfloat16" if bf16_ok else "float32")
    if tc.dtype == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("--dtype=bfloat16 is not supported by this GPU; use --dtype=float16")
    if tc.compile is None:
        # measured: inductor beats eager on GPUs, but on a 2-core CPU at the quickstart shape it was slower
        tc = dataclasses.replace(tc, compile=device_type == "cuda")
    return device, tc


def parameter_estimate(m):
    """The model's parameters, counted from its config without building it: the embeddings and every layer's
    matrices (attention's 4 d^2, the feed-forward's 2 or, for GEGLU, 3 times ffn_mult d^2). Biases, gains and
    scales are left out: O(L d) against O(L d^2), a few percent at d = 32."""
    ffn = m.ffn_mult * m.n_embd * (3 if m.activation == "geglu" else 2)
    embeddings = m.vocab_size * m.n_embd * (1 if m.tie_embeddings else 2)
    positions = m.block_size * m.n_embd if m.pos == "learned" else 0
    return m.n_layer * (4 * m.n_embd + ffn) * m.n_embd + embeddings + positions


def memory_estimate(m, tc):
    """Bytes one training process needs, roughly: 16 per parameter (float32 weights and gradients, AdamW's two
    moments) plus the activations autograd keeps for a micro-step of batch_size x block_size tokens, which
    Korthikanti et al. 2022 (§4.1, eq. (1)) put at T B d (34 + 5 H T / d) bytes per layer in 16-bit (the 5 H T / d
    term is the attention matrix, which SDPA's fused kernels do not keep), twice that in float32, plus the logits
    and their gradient in float32."""
    tokens = tc.batch_size * m.block_size
    # model.Attention writes attention out, keeping the (B, H, T, T) scores, with --attn_impl=manual and with
    # --attn_softcap, which SDPA cannot apply
    manual = m.attn_impl == "manual" or m.attn_softcap > 0
    per_value = 34 + (5 * m.n_head * m.block_size / m.n_embd if manual else 0)
    activations = m.n_layer * tokens * m.n_embd * per_value * (2 if tc.dtype == "float32" else 1)
    return 16 * parameter_estimate(m) + activations + 2 * 4 * tokens * m.vocab_size


def memory_of(device, machine):
    """(bytes, what they are) this process may use: its GPU's memory, or its share of the machine's RAM (the
    processes torchrun starts on one machine share it)."""
    if device.startswith("cuda"):
        sharing = -(-machine.local_world_size // torch.cuda.device_count())
        return torch.cuda.get_device_properties(device).total_memory // sharing, describe_device(device)
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    share = f" ({machine.local_world_size} processes share it)" if machine.local_world_size > 1 else ""
    return total // machine.local_world_size, f"this machine's memory{share}"


# data.eval_starts lists every evaluation window's start as a Python int: 8 bytes in the list, 28 in the int
BYTES_PER_EVAL_WINDOW = 36


def check_memory(model_cfg, tc, device, machine):
    """A model and batch that cannot fit in memory, and evaluation windows too many to list in the machine's RAM,
    refused before anything is allocated (one line)."""
    need = memory_estimate(model_cfg, tc)
    have, where = memory_of(device, machine)
    if need > have:
        raise UsageError(f"the model and its training need about {need / 1e9:.3g} GB "
                         f"({parameter_estimate(model_cfg):.3g} parameters, 16 bytes each with their gradients and "
                         f"AdamW's state, and the activations of --batch_size={tc.batch_size} x --block_size="
                         f"{model_cfg.block_size} tokens), and {where} has {have / 1e9:.3g} GB; choose a smaller "
                         "model, --batch_size or --block_size")
    windows = tc.eval_iters * tc.batch_size
    ram, ram_where = memory_of("cpu", machine)
    if windows * BYTES_PER_EVAL_WINDOW > ram:
        raise UsageError(f"--eval_iters={tc.eval_iters} x --batch_size={tc.batch_size} = {windows:,} evaluation "
                         f"windows need about {windows * BYTES_PER_EVAL_WINDOW / 1e9:.3g} GB for their start "
                         f"offsets alone, and {ram_where} has {ram / 1e9:.3g} GB; choose a smaller --eval_iters")


def ddp_device(device_type, local_rank, local_world_size):
    """This torchrun process's device and process-group backend. NCCL takes one process per GPU; with more
    processes than GPUs (torchrun --nproc_per_node=2 on one GPU, to try DDP) they share the GPUs in turn, and
    gloo, which copies CUDA tensors through host memory, carries their collectives."""
    if device_type != "cuda":
        return device_type, "gloo"
    gpus = torch.cuda.device_count()
    return f"cuda:{local_rank % gpus}", "nccl" if local_world_size <= gpus else "gloo"


def start(device, machine, rendezvous_timeout=600):
    """This process on the run's device (resolve_device's): machine.device, and under torchrun the process group
    joined (join_process_group, waiting at most rendezvous_timeout seconds for the others); on CPU, each process's
    share of the cores and an allocator that keeps freed memory. Called once every input is checked: bad input stops
    each process on its own, with no process group to tear down."""
    machine.device = device
    if machine.device_type == "cuda":
        machine.gpus = machine.world_size // machine.local_world_size * min(machine.local_world_size,
                                                                            torch.cuda.device_count())
    if machine.ddp:
        machine.device, backend = ddp_device(machine.device_type, machine.local_rank, machine.local_world_size)
        if machine.device_type == "cuda":
            torch.cuda.set_device(machine.device)
        join_process_group(backend, machine, rendezvous_timeout)
    if machine.device_type == "cpu":
        # torchrun sets OMP_NUM_THREADS=1 per process: give each process its share of the cores instead
        torch.set_num_threads(max(1, cpu_cores() // machine.local_world_size))
        keep_freed_memory()


class NotJoined(UsageError):
    """A process that could not join the run's others (join_process_group): its own failure, with no process group
    for the processes to leave together."""


def join_process_group(backend, machine, wait):
    """init_process_group, with a bounded wait that a stop signal ends. The rendezvous (the store at MASTER_ADDR:
    MASTER_PORT that every process connects to, then the backend's connections between them) waits at most `wait`
    seconds for the other processes, then fails in one line (NotJoined), as does a rendezvous torch cannot make (a
    port in use). It runs in a thread of its own: Python runs signal handlers in the main thread only, between
    bytecodes, so a main thread blocked in torch's C++ wait heard no Ctrl-C, SIGTERM or SIGHUP (a process whose peer
    never came waited torch's 30 minutes, deaf to SIGTERM). Here the main thread waits on that thread, and a stop
    exits at once with one line (signals.exit_at_once): the C++ wait cannot be cancelled, and nothing of the run is
    written before it."""
    joined = {}
    thread = threading.Thread(target=rendezvous, args=(backend, machine, wait, joined), daemon=True)
    try:
        thread.start()
        thread.join()
    except KeyboardInterrupt as stop:  # Ctrl-C, or signals.Stopped (SIGTERM, SIGHUP)
        signals.exit_at_once(stop, "while waiting for the run's other processes to join; nothing of the run was "
                             "written", machine.master)
    failure = joined.get("failure")
    if isinstance(failure, dist.DistError):
        cause = str(failure).strip().splitlines()[0]
        raise NotJoined(f"process {machine.rank} of WORLD_SIZE={machine.world_size} could not join the run's "
                         f"processes at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} ({cause}); start "
                         f"every process (torchrun --nproc_per_node=N starts them together), or give them more than "
                         f"--rendezvous_timeout={wait} seconds") from None
    if failure:
        raise failure


def rendezvous(backend, machine, wait, joined):
    """The process group of torchrun's env:// rendezvous, whose store waits `wait` seconds instead of torch's 30
    minutes (10 with NCCL); torch's own timeout for the store afterwards. joined["failure"]: what it raised."""
    try:
        store, _, _ = next(dist.rendezvous("env://", machine.rank, machine.world_size,
                                           timeout=datetime.timedelta(seconds=wait)))
        # the prefix init_process_group gives a store it makes itself: torchrun's agent shares the store
        dist.init_process_group(backend=backend, store=dist.PrefixStore("default_pg", store), rank=machine.rank,
                                world_size=machine.world_size)
        store.set_timeout(dist.default_pg_timeout)
    except BaseException as e:  # for the main thread to raise
        joined["failure"] = e


def cpu_cores():
    """The cores this process may run on: its affinity mask where the OS has one (Linux), else all of them (macOS
    has no os.sched_getaffinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def keep_freed_memory():
    """Make glibc keep the memory a CPU training step frees, for the next step to reuse. Returns whether it could.

    Each step allocates and frees every activation. By default glibc serves large blocks with mmap and gives them
    back to the OS on free, so each new tensor page-faults on first touch: measured 476-5,700 faults a step at
    the quickstart shape and 36,000-71,000 at 2L/768d/T1024, batch 4. Never trimming the heap
    (M_TRIM_THRESHOLD = -1) and never using mmap (M_MMAP_MAX = 0) stops that; the process then holds its peak
    memory. Trimming off alone is worse: it also freezes glibc's adaptive mmap threshold at 128 KiB. Not glibc
    (macOS, musl): nothing to do.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_TRIM_THRESHOLD, -1)) and bool(libc.mallopt(M_MMAP_MAX, 0))


class StopRequest:
    """The first Ctrl-C (SIGINT), a SIGTERM (what torchrun sends its workers on Ctrl-C), a SIGHUP (a closed
    terminal or ssh session) or an output whose reader went away (output_lost) asks the run to stop at the next step
    boundary, or between two eval batches, with a checkpoint; a second Ctrl-C stops at once. `agreed`: whether the
    run stops at this step boundary. One process stops when asked; under DDP every process stops at the boundary
    after the step whose host read (host_read) saw a request on any of them, so that all stop at the same step."""

    def __init__(self, ddp=False, master=True):
        self.requested = False
        self.ddp, self.master = ddp, master
        self.seen_by_all = False  # under DDP: a request on some process at the last step's host read

    @property
    def agreed(self):
        return self.seen_by_all if self.ddp else self.requested

    def __call__(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def output_lost(self):
        """stdout or stderr lost its reader (signals.Output: `python train.py | head -3`): a stop request, said on
        stderr, where it may still be read."""
        if self.master:
            print("train.py: its output's reader went away (a closed pipe or terminal); the run stops after this step "
                  "with a checkpoint, as for SIGHUP, and prints nothing more there", file=sys.stderr)
        self.requested = True


def leave_together(code, machine):
    """How torchrun's processes leave on an error that every one of them meets (bad input, which each process checks
    on its own): process 0, which has printed it, waits a second for the others to get here too, then exits; each
    other process waits for the SIGTERM that torchrun sends once process 0 has exited, and exits with the same code.
    So the line is printed once, never lost to a process 0 that torchrun stopped first, and torchrun lists every
    process with that exit code rather than as killed by a signal. Returns in a process other than 0 only if
    torchrun has not ended it within a minute: an error of its own, which it then prints itself."""
    if machine.master:
        time.sleep(1)
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(code))
    time.sleep(60)


def lost_a_peer(error, machine):
    """Whether a RuntimeError is this process's collective meeting another process that has stopped (process 0
    after a failed write, which it says in its own line): gloo's "Connection closed by peer", nccl's DistError."""
    if not machine.ddp:
        return False
    return isinstance(error, dist.DistError) or any(words in str(error) for words in PEER_GONE)


class StepRead(NamedTuple):
    """A step's numbers on the host, the same on every process."""
    loss: float  # the cross-entropy, mean over the micro-steps (and under DDP over the processes)
    z_loss: float  # the z-loss term, likewise
    grad_norm: float
    stop: bool  # a stop request on any process


def host_read(means, grad_norm, stop, machine):
    """A step's one read of the device: StepRead from means (the cross-entropy and the z-loss term over the
    micro-steps) and the gradient norm. Under DDP the processes' means are all-reduced first, so that every process
    takes the same divergence and spike decisions, and a stop request (Ctrl-C) on any process rides along in the
    same all-reduce: all stop before the next step without a sync of their own."""
    shared = torch.cat([means, means.new_full((1,), float(stop.requested))])
    if machine.ddp:
        dist.all_reduce(shared)
        shared /= machine.world_size
    loss, z_loss, stops, grad = torch.cat([shared, grad_norm.view(1).float()]).tolist()
    stop.seen_by_all = stops > 0
    return StepRead(loss, z_loss, grad, stops > 0)


def agree(value, machine):
    """The largest of the processes' values (a flag, an exit code) on every process: a failure on one (a
    checkpoint write, a stop request) is a failure on all, so all stop together."""
    if not machine.ddp:
        return value
    value = torch.tensor(float(value), device=machine.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def rank_spread(model):
    """How far the processes' weights and buffers have drifted apart: DDP keeps them identical, so anything
    but 0 means a bug (an unsynchronized buffer, a gradient that skipped the all-reduce)."""
    sums = torch.stack([t.detach().double().sum() for t in [*model.parameters(), *model.buffers()]]).tolist()
    gathered = [None] * dist.get_world_size()
    # a list of Python floats per process, gathered as one object: one call, whatever the backend and device
    dist.all_gather_object(gathered, sums)
    return max(abs(theirs - ours) for other in gathered for theirs, ours in zip(other, sums, strict=True))


class Progress:
    """The timing of the progress lines: each times the steps since the line before. The run's first step
    compiles and warms up (seconds to minutes on a GPU), so unless it ends a line itself the first line leaves
    it out and times the steps after it."""

    def __init__(self, step):
        self.first_step, self.timed_from, self.t0 = step, step, time.perf_counter()

    def step_done(self, step, log_interval):
        if step == self.first_step + 1 and step % log_interval:
            self.timed_from, self.t0 = step, time.perf_counter()

    def lap(self, step):
        """Seconds per step since the last lap, and the steps it timed (first, last); the next lap starts here."""
        now = time.perf_counter()
        seconds, timed = (now - self.t0) / (step - self.timed_from), (self.timed_from + 1, step)
        self.timed_from, self.t0 = step, now
        return seconds, timed


def format_duration(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}" if minutes >= 60 else f"{minutes}:{seconds:02d}"


# Dense bf16 peak of common GPUs, FLOP/s (vendor datasheets, without sparsity). MFU = achieved model FLOP/s over
# this peak (PaLM App. B); a hard-coded A100 peak (nanoGPT's) gives wrong MFU on any other GPU. The first
# key found in the device's name wins, so a name that holds another ("H100 NVL" holds "H100") comes before it.
GPU_PEAK_BF16 = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12),
                 ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("A10", 125e12), ("RTX 4090", 165e12),
                 ("RTX 3090", 71e12))


def describe_device(device):
    """The device as the progress output names it: with the GPU's model, so that timings say where they ran."""
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.startswith("cuda") else device


def gpu_peak_flops(tc, device):
    """The peak used for MFU on this GPU, or None where it is not known (then MFU is not printed)."""
    if tc.gpu_peak_tflops:
        return tc.gpu_peak_tflops * 1e12
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_BF16 if key in name), None)


def mfu(flops_per_second, tc, machine):
    """Model FLOP/s over the peak of the run's GPUs (PaLM App. B), or None off CUDA or for a GPU of unknown peak."""
    peak = gpu_peak_flops(tc, machine.device) if machine.device_type == "cuda" else None
    return flops_per_second / peak / machine.gpus if peak else None
