r"""
Speed and memory of the variants, side by side in one run: one training step (forward, backward, AdamW)
of each variant, interleaved round by round so that drift in the machine's load hits them all alike. The
order runs forward in even rounds and backward in odd ones, so no variant always runs next to the baseline
or after the same neighbour. Each round gives every variant a ratio to the first variant (the baseline)
timed in that same round; the table shows the median time, the median of those paired ratios, and a 95%
interval for that median (a ratio whose interval holds 1.00 is no difference this run could see); with fewer than
6 rounds there is no such interval, and the table shows "-".
    python -m lab.bench                                    # every --norm (and powernorm without group
                                                       # scaling), the quickstart model, on CPU here
    python -m lab.bench --compile=True                     # the same compiled, with the guard's verdict: every
                                                       # norm's step within 1.05x of layernorm's
    python -m lab.bench --variants=headline --n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 \
        --vocab_size=50304 --batch_size=16             # baseline, normformer, powernorm at GPT-2 small on a GPU
    python -m lab.bench --part=norm                        # each norm module alone, forward and backward
    python -m lab.bench --variants=function                # LayerNorm's kernels through a Python autograd.Function
    python -m lab.bench --variants=headline --compile_mode=reduce-overhead ...  # the same with CUDA graphs
Model and system flags are train.py's (configurable.txt); bench.py adds --variants, --rounds, --steps, --part and
--compile_mode (torch.compile's mode, for trying the compiler's settings before train.py takes one).
On CUDA it also reports the memory a step allocates on top of the resident weights and optimizer states
(activations and workspaces), the achieved TFLOP/s (model.flops_per_token, nanoGPT's estimate) and MFU
(over train.py's dense bf16 peak of the GPU, or --gpu_peak_tflops), with the GPU's name and the peak used.
Absolute times only mean something on a GPU with nothing else running; on a shared CPU read the ratios.
"""

import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._python_dispatch

from engine import flags
from engine import runtime
import configs
from engine.flags import UsageError, help_of
from model import GPT, configure_optimizer, flops_per_token, norm
from presets import PRESETS
from norms import NORMS, LayerNorm, upcast

PLAIN, THROUGH_FUNCTION = "plain GPT-2", "layernorm via a Function"
POWERNORM_ALONE = "powernorm, no group scaling"
VARIANTS = {
    # every --norm, then PowerNorm without the group scaling App. A.1 puts before it (a second norm in the slot)
    "norms": {**{f"norm={kind}": {"norm": kind} for kind in NORMS},
              POWERNORM_ALONE: {"norm": "powernorm", "pn_group_scaling": False}},
    "presets": {f"preset={name}": {"preset": name} for name in PRESETS},
    # the three the README's GPU runs time: the GPT-2 baseline, NormFormer's preset and PowerNorm (with its
    # App. A.1 group scaling): three compiles instead of the presets' ten, so one run fits a short GPU session
    "headline": {"preset=baseline": {"preset": "baseline"}, "preset=normformer": {"preset": "normformer"},
                 "norm=powernorm": {"norm": "powernorm"}},
    "attention": {"attn_impl=sdpa": {"attn_impl": "sdpa"}, "attn_impl=manual": {"attn_impl": "manual"}},
    # the plainest GPT-2 of the same shape (PlainGPT, below) against nanonorm's model with every flag at its
    # default: the same math, so a ratio above 1 is work that a switched-off flag left in the step
    "baseline": {PLAIN: {}, "nanonorm defaults": {}},
    # the default model alone: one compile, for timing it at several batch sizes (lab/device_check.py's MFU part)
    "defaults": {"nanonorm defaults": {}},
    # LayerNorm's own two fused kernels, called through a Python torch.autograd.Function (LayerNormFunction,
    # below): a ratio above 1 is what the Function itself costs, which PowerNorm's approximate gradient pays
    "function": {"norm=layernorm": {"norm": "layernorm"}, THROUGH_FUNCTION: {"norm": "layernorm"}},
}
# norms.py writes the norms as their equations and leaves the fusing to torch.compile: compiled, no norm's training
# step may take more than GUARD times layernorm's (--variants=norms --compile=True); eager ratios are only reported
GUARD = 1.05
# The fewest rounds whose ratios give a 95% interval for their median: the range of n values misses the median with
# probability 2 / 2^n (all n on one side), at most 5% from n = 6 on; with fewer the table shows no interval
MIN_ROUNDS = 6
NO_INTERVAL = f" (too few for a 95% interval: it takes {MIN_ROUNDS} rounds)"
# --rounds and --steps at most this: 45 rounds of 1 step are the default, and a typo of a billion ran for years
MAX_COUNT = 10_000


@dataclass
class BenchOptions:
    variants: str = help_of(f"the group of variants to time: {', '.join(VARIANTS)}", default="norms")
    rounds: int = help_of("rounds; each times every variant once, in turn, and the table shows medians over rounds",
                          default=45)
    steps: int = help_of("training steps per variant in each round", default=1)
    part: Literal["step", "norm"] = help_of("what is timed: step (a training step of the model) or norm (forward "
                                            "and backward of one norm module on a batch of activations, with "
                                            "--variants=norms)", default="step")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"] = help_of(
        "torch.compile's mode, with --compile=True: reduce-overhead replays each step as CUDA graphs (fewer kernel "
        "launches from the host), the max-autotune modes time several kernels for each matrix product and keep "
        "the fastest", default="default")


# model FLOPs a second of GPT-2 small's training step on one H100 (bf16, compiled, batch 16; docs/benchmarks.md,
# 2026-11-26): what sweep.py's --scale=gpu --dry_run divides a sweep's FLOPs by
H100_MODEL_FLOPS = 373e12


def gpu_hours(model_cfg, tokens):
    """H100-hours of training a model of model_cfg on `tokens` tokens at H100_MODEL_FLOPS (6N + 12LTd FLOPs a token,
    model.flops_per_token; evaluation not counted). The model is built on the meta device: its parameters are
    counted and nothing is allocated."""
    with torch.device("meta"):
        model = GPT(model_cfg)
    return flops_per_token(model, model_cfg) * tokens / H100_MODEL_FLOPS / 3600


def parse(argv):
    """bench.py's own five flags, then train.py's for the rest (one parser, same syntax, same errors).
    Each variant's flags go in before the explicit ones, so the command line overrides them, as with --preset."""
    own, rest = flags.split(argv, BenchOptions)
    opts = flags.build(BenchOptions, flags.parse(own, BenchOptions, choices={"variants": list(VARIANTS)}))
    if opts.part == "norm" and opts.variants != "norms":
        raise UsageError(f"--part=norm times the norms of --variants=norms, not --variants={opts.variants}")
    for name in ("rounds", "steps"):
        if not 1 <= getattr(opts, name) <= MAX_COUNT:
            raise UsageError(f"--{name}={getattr(opts, name)} must be an integer from 1 to {MAX_COUNT:,} (a bench of "
                             f"{MAX_COUNT:,} rounds of {MAX_COUNT:,} steps already runs for days)")
    given = configs.parse_flags(rest)
    # each variant is a run of train.py's flags, resolved as train.py resolves one; they set model flags only, so
    # they share one TrainConfig and device
    runs = {name: configs.resolve({**variant, **given}, random_tokens=True)
            for name, variant in VARIANTS[opts.variants].items()}
    _, tc, device, _ = next(iter(runs.values()))
    if opts.compile_mode != "default" and not tc.compile:
        raise UsageError(f"--compile_mode={opts.compile_mode} is a mode of torch.compile; it needs --compile=True "
                         f"(compile is {tc.compile} here)")
    return {name: run.model for name, run in runs.items()}, opts, device, tc


def compiled(model, tc, mode):
    """The model as a step runs it: compiled in torch.compile's `mode` with --compile, else as it is."""
    return torch.compile(model, mode=None if mode == "default" else mode) if tc.compile else model


class PlainGPT(nn.Module):
    """GPT-2 with no options, the baseline of --variants=baseline: token and learned position embeddings, per
    layer x = x + W_O attn(LN(x)) and x = x + W_2 gelu(W_1 LN(x)), a final LN and the tied head (GPT-2 §2.3;
    nanoGPT's model). It reads only the shape from the config (layers, heads, width, context, vocabulary,
    ffn_mult, bias) and lists its parameters in the order GPT does, so one can load the other's weights."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg.n_embd
        self.n_head = cfg.n_head
        self.wte = nn.Embedding(cfg.vocab_size, d)
        self.wpe = nn.Embedding(cfg.block_size, d)
        self.layers = nn.ModuleList(nn.ModuleDict({
            "ln_1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d, bias=cfg.bias), "out": nn.Linear(d, d, bias=cfg.bias),
            "ln_2": nn.LayerNorm(d), "fc": nn.Linear(d, cfg.ffn_mult * d, bias=cfg.bias),
            "fc_out": nn.Linear(cfg.ffn_mult * d, d, bias=cfg.bias),
        }) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe.weight[:T]
        for layer in self.layers:
            qkv = layer.qkv(layer.ln_1(x)).split(x.size(-1), dim=2)
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in qkv)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + layer.out(y.transpose(1, 2).reshape(B, T, -1))
            x = x + layer.fc_out(F.gelu(layer.fc(layer.ln_2(x))))
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class LayerNormFunction(torch.autograd.Function):
    """y = LN(x) * g + b by the kernels F.layer_norm calls, forward and backward, from Python."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], weight, bias, eps)
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, mean, rstd, weight, bias = ctx.saved_tensors
        grads = torch.ops.aten.native_layer_norm_backward.default(dy, x, x.shape[-1:], mean, rstd, weight, bias,
                                                                   list(ctx.needs_input_grad[:3]))
        return *grads, None


class FunctionLayerNorm(LayerNorm):
    """norms.LayerNorm through LayerNormFunction: the same parameters, math and kernels."""

    def forward(self, x):
        return LayerNormFunction.apply(upcast(x), self.weight, self.bias, self.eps).to(x.dtype)


class Variant:
    """One model, its optimizer and a fixed batch, ready to time training steps."""

    def __init__(self, model_cfg, tc, device, dtype, name, mode="default"):
        torch.manual_seed(tc.seed)
        self.model = (PlainGPT if name == PLAIN else GPT)(model_cfg).to(device)
        if name == THROUGH_FUNCTION:
            for module in self.model.modules():
                if isinstance(module, LayerNorm):
                    module.__class__ = FunctionLayerNorm  # its parameters stay; only forward changes
        self.flops_per_token = flops_per_token(self.model, model_cfg)
        self.step_model = compiled(self.model, tc, mode)
        # CUDA graphs reuse their memory from one replay to the next: each step tells them a new one begins
        self.new_graph_step = tc.compile and mode in ("reduce-overhead", "max-autotune")
        # each buffer and the tensor that holds it between steps (see keep_buffers)
        self.homes = [(module, name, buffer) for module in self.model.modules()
                      for name, buffer in module._buffers.items() if buffer is not None]
        device_type = device.split(":")[0]
        self.optimizer = configure_optimizer(self.model, tc.weight_decay, tc.lr, (tc.beta1, tc.beta2), device_type)
        shape = (tc.batch_size, model_cfg.block_size)
        self.x = torch.randint(0, model_cfg.vocab_size, shape, device=device)
        self.y = torch.randint(0, model_cfg.vocab_size, shape, device=device)
        self.autocast = torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32)
        # float16 steps pay for loss scaling as train.py's do: the scaled backward and the unscale and inf check
        self.scaler = torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)
        self.times, self.step_bytes = [], 0

    def step(self):
        if self.new_graph_step:
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast:
            loss = self.step_model(self.x, self.y)[1]
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.new_graph_step:
            self.keep_buffers()

    def keep_buffers(self):
        """A replay's outputs live in the CUDA graphs' memory until the next step begins, when they are overwritten.
        A buffer the forward replaces with a new tensor (PowerNorm's running_psi2 and calls) is such an output, and
        the next step's forward reads it: "accessing tensor output of CUDAGraphs that has been overwritten by a
        subsequent run". So each replaced buffer's value is copied back into the tensor it replaced, which is not
        the graphs' and keeps its address from step to step, and that tensor is the buffer again."""
        replaced = [(module, name, home) for module, name, home in self.homes if module._buffers[name] is not home]
        if replaced:
            values = [module._buffers[name] for module, name, _ in replaced]
            torch._foreach_copy_([home for *_, home in replaced], values)
            for module, name, home in replaced:
                module._buffers[name] = home


class AtenOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts, by name, the aten ops dispatched while it is active: the kernels a piece of code launches."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket).removeprefix("aten.")
        name = "attention" if "scaled_dot_product" in name else name  # the kernel's name depends on the device
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class NormVariant:
    """One norm module as the model builds it, a batch of activations and an output gradient, ready to time the
    module's forward and backward alone (--part=norm): the norms' share of a step, one by one."""

    def __init__(self, model_cfg, tc, device, dtype, mode="default"):
        torch.manual_seed(tc.seed)
        self.model = norm(model_cfg, model_cfg.n_embd).to(device)
        self.flops_per_token = 0
        self.step_model = compiled(self.model, tc, mode)
        shape = (tc.batch_size, model_cfg.block_size, model_cfg.n_embd)
        self.x = torch.randn(shape, device=device, requires_grad=True)
        self.residual, self.dy = torch.randn(shape, device=device), torch.randn(shape, device=device)
        self.autocast = torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32)
        self.times, self.step_bytes = [], 0
        with AtenOps() as ops:  # the kernels of one forward and backward, counted on the eager module
            self.forward_backward(self.model)
        self.ops = sum(ops.counts.values())

    def step(self):
        self.forward_backward(self.step_model)

    def forward_backward(self, module):
        # the input and the output gradient are new tensors in each call, as in a model, where they come from the
        # residual add and the next layer's backward: some ops that reread the same cached tensors in a loop took
        # a tenth of the time they take on data another op has just written
        with self.autocast:
            y = module(self.x + self.residual)
        y.backward(self.dy.to(y.dtype, copy=True))
        self.x.grad = None


def synchronize(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv):
    if flags.wants_help(argv):
        flags.print_help(__doc__, BenchOptions)
        print("Every other flag is train.py's (the model, --batch_size, --device, --dtype, --compile), same syntax and "
              "defaults: python train.py --help lists them, as does configurable.txt.")
        return 0
    try:
        models, opts, device, tc = parse(argv)
        for model_cfg in models.values():  # train.py's memory check, on this machine, before anything is allocated
            runtime.check_memory(model_cfg, tc, device, runtime.Machine.from_env())
    except UsageError as e:
        return flags.fail("bench.py", e)
    if tc.compile:
        # every variant recompiles the same Block.forward; past the default limit dynamo would fall back to eager
        torch._dynamo.config.recompile_limit = 8 * len(models)
    dtype = getattr(torch, tc.dtype)
    cuda = device.startswith("cuda")
    if device == "cpu":
        runtime.keep_freed_memory()  # as train.py does: without it every step's new tensors page-fault
    rounds, steps, part, mode = opts.rounds, opts.steps, opts.part, opts.compile_mode
    runs = {}
    for name, cfg in models.items():
        runs[name] = (NormVariant(cfg, tc, device, dtype, mode) if part == "norm" else
                      Variant(cfg, tc, device, dtype, name, mode))
        runs[name].step()  # warm up: allocator, kernels, torch.compile
    block_size = next(iter(models.values())).block_size
    tokens = tc.batch_size * block_size * steps
    order = list(runs.values())
    for i in range(rounds):
        for run in (order if i % 2 == 0 else order[::-1]):
            if cuda:
                resident = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                run.step()
            synchronize(device)
            run.times.append((time.perf_counter() - t0) / steps)
            if cuda:
                run.step_bytes = max(run.step_bytes, torch.cuda.max_memory_allocated() - resident)
    peak = runtime.gpu_peak_flops(tc, device) if cuda else None  # per GPU, as train.py's MFU
    compile = f"{tc.compile}{f' ({mode})' if mode != 'default' else ''}"
    print(f"device {runtime.describe_device(device)} {tc.dtype}, compile {compile}, batch {tc.batch_size} x "
          f"{block_size}, {rounds} rounds x {steps} steps{'' if rounds >= MIN_ROUNDS else NO_INTERVAL}, "
          f"{'the norm modules alone' if part == 'norm' else 'training steps'}, torch {torch.__version__}")
    if cuda:
        print(f"MFU over a dense bf16 peak of {peak / 1e12:g} TFLOP/s" if peak else
              "MFU: this GPU's peak is not in train.py's table; give it with --gpu_peak_tflops")
    baseline = next(iter(runs.values())).times
    medians = {}
    header = f"{'variant':<28}{'ms/step':>10}{'ratio':>8}{'95% interval':>14}{'tokens/s':>12}"
    header += f"{'ops':>6}" if part == "norm" else ""
    print(header + (f"{'step MiB':>10}{'TFLOP/s':>9}{'MFU':>7}" if cuda else ""))
    for name, run in runs.items():
        ms = statistics.median(run.times)
        ratios = [t / b for t, b in zip(run.times, baseline)]
        ratio, (low, high) = statistics.median(ratios), median_interval(ratios)
        medians[name] = ratio
        interval = f"{low:.2f}-{high:.2f}" if rounds >= MIN_ROUNDS else "-"
        line = f"{name:<28}{ms * 1000:>10.{3 if part == 'norm' else 1}f}{ratio:>8.2f}{interval:>14}"
        line += f"{tokens / steps / ms:>12,.0f}"
        line += f"{run.ops:>6}" if part == "norm" else ""
        if cuda:
            flops = run.flops_per_token * tokens / steps / ms
            tflops = f"{flops / 1e12:.1f}" if flops else "-"
            mfu = f"{flops / peak:.1%}" if flops and peak else "-"
            line += f"{run.step_bytes / 2**20:>10,.0f}{tflops:>9}{mfu:>7}"
        print(line)
    if tc.compile and part == "step" and list(runs) == list(VARIANTS["norms"]):
        print(guard_verdict(medians))
    return 0


def guard_verdict(ratios):
    """The line that checks GUARD: `ratios` holds each norm's median ratio to layernorm's compiled step."""
    slower = [f"{name} {ratio:.2f}x" for name, ratio in ratios.items() if ratio > GUARD]
    verdict = f"above it: {', '.join(slower)}" if slower else "all within"
    return f"guard, compiled: every norm within {GUARD:.2f}x of layernorm's step; {verdict}"


def median_interval(values):
    """A 95% confidence interval for the median of values, whatever their distribution: the true median lies
    below the (k+1)-th smallest of n values only if at most k of them fall below it, which has probability
    P(Binomial(n, 1/2) <= k). k is the largest with twice that at most 5%; with 5 values or fewer there is
    none, and the interval is the whole range."""
    ordered, n = sorted(values), len(values)
    k = max((j for j in range(n // 2) if 40 * sum(math.comb(n, i) for i in range(j + 1)) <= 2 ** n), default=0)
    return ordered[k], ordered[-1 - k]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
