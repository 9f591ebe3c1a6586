"""
The coord check of Tensor Programs V (Yang et al. 2022, "Tuning Large Neural Networks via Zero-Shot Hyperparameter
Transfer"; the check their mup package ships): the same GPT at several widths, each trained a few AdamW steps on the
same batches, with the mean |x| of every probed op's output (diagnostics/probe_points.py) recorded in each step's
forward. Plotted against width, one line per step: under a parametrization whose hyperparameters transfer the lines
are flat; under the standard one, activations after the first updates grow with width (an Adam update moves each
entry of W by about lr, and a width-d matmul sums d such moves).
    python -m lab.coord_check --init=gpt2 --out=docs/coord_check.png
writes the PNG and the numbers beside it (same name, .json). Any model flag of train.py works
(--init, --preset, --norm, ...), except --n_embd and --n_head: --widths and --head_dim set them.
Step 0 is the forward at init; step t the forward after t updates.
"""

import dataclasses
import functools
import json
import math
import os
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import torch

import data
from engine.files import WriteError, cannot_write, nearest_existing, not_a_file, not_a_folder, write_atomic
from engine import runtime
import configs
from configs import LR_RANGE
from engine.flags import UsageError, build, fail, help_of, number, parse, print_help
from engine.flags import wants_help
from model import GPT, GPTConfig
from presets import PRESETS
from norms import upcast
from diagnostics.probe_points import probe_points


@dataclass
class CoordOptions:
    widths: str = help_of("comma-separated model widths d", default="32,64,128,256,512")
    head_dim: int = help_of("d / n_head, the same at every width (muP keeps it fixed)", default=16)
    steps: int = help_of("AdamW updates; the forward of each, and of the model after the last, is recorded",
                         default=4)
    lr: float = help_of("AdamW learning rate, the same at every width (the point of the check)", default=0.01)
    batch_size: int = help_of("sequences per step", default=8)
    dataset: str = help_of("builtin, shakespeare, or a path (data.py)", default="builtin")
    data_dir: str = help_of("where prepared datasets are stored", default="data")
    seed: int = help_of("seeds the batches and every width's init", default=1337)
    out: str = help_of("the PNG to write; its numbers go beside it as .json", default="coord_check.png")
    preset: str = help_of("a model preset of train.py, applied before the model flags", default="")


class MeanAbs:
    """Forward hooks recording mean |x| of each probe point's tensor (ProbePoints, as probe_points gives them;
    chunk (j, n) means tensor.chunk(n, dim=-1)[j])."""

    def __init__(self, model, points):
        modules = dict(model.named_modules())
        self.values = []
        self.handles = []
        for point in points:
            module = modules[point.module]
            if point.io == "input":
                self.handles.append(module.register_forward_pre_hook(functools.partial(self.on_input, point)))
            else:
                self.handles.append(module.register_forward_hook(functools.partial(self.on_output, point)))

    def on_input(self, point, module, args):
        self.record(point, args[0])

    def on_output(self, point, module, args, out):
        self.record(point, out[0] if isinstance(out, (tuple, list)) else out)

    def record(self, point, x):
        chunk = point.chunk
        part = x if chunk is None else x.chunk(chunk[1], dim=-1)[chunk[0]]
        self.values.append((point.layer, point.op, upcast(part.detach()).abs().mean()))

    def remove(self):
        for handle in self.handles:
            handle.remove()

    def rows(self):
        return [{"layer": layer, "op": op, "mean_abs": value.item()} for layer, op, value in self.values]


def coord_check(model, batches, lr):
    """One width: AdamW at lr (no weight decay, so only the gradient moves W) on batches[0..n-2], the mean |x|
    of every probe point recorded in the forward of each batch: step t is the model after t updates, and the
    last batch only measures. Rows {step, layer, op, mean_abs}."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rows = []
    for step, (x, y) in enumerate(batches):
        probe = MeanAbs(model, probe_points(model))
        try:
            _, loss = model(x, y)
        finally:
            probe.remove()
        rows += [{"step": step, **row} for row in probe.rows()]
        if step < len(batches) - 1:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return rows


def parse_widths(text):
    try:
        widths = [number("widths", w, int) for w in text.split(",")]  # flags' grammar and bound for each
    except UsageError:
        raise UsageError(f"--widths={text} is not a comma-separated list of integers (each at most 2^31 - 1)") \
            from None
    if not widths or min(widths) < 1:
        raise UsageError(f"--widths={text} must list positive integers")
    return widths


def model_configs(opts, given, vocab_size):
    """{width: GPTConfig}: each width a run of train.py's flags, resolved as train.py resolves one (configs.resolve):
    the preset, then the model flags given, then the width and its heads; AdamW at a constant LR from step 0 on the
    CPU in float32, as the check trains."""
    widths = parse_widths(opts.widths)
    if opts.head_dim < 1 or any(w % opts.head_dim for w in widths):
        raise UsageError(f"--head_dim={opts.head_dim} must be >= 1 and divide every width in --widths={opts.widths}")
    if "n_embd" in given or "n_head" in given:
        raise UsageError("--n_embd and --n_head are set by --widths and --head_dim; give those instead")
    flags = {"n_layer": 2, "block_size": 64, **given, "vocab_size": vocab_size, "lr_schedule": "constant",
             "warmup_iters": 0, "device": "cpu", "dtype": "float32"}
    return {w: configs.resolve({**flags, "n_embd": w, "n_head": w // opts.head_dim}, machine=False).model
            for w in widths}


def check_options(opts):
    if opts.steps < 1 or opts.batch_size < 1:
        raise UsageError(f"--steps={opts.steps} and --batch_size={opts.batch_size} must be >= 1")
    problem = LR_RANGE.refusal("lr", opts.lr)  # train.py's range for --lr, in its words
    if problem:
        raise UsageError(problem)
    if opts.seed < 0:
        raise UsageError(f"--seed={opts.seed} must be in [0, 2^63), as train.py's")
    if opts.preset and opts.preset not in PRESETS:
        raise UsageError(f"--preset={opts.preset} is not allowed; choose one of {', '.join(PRESETS)}")
    if not opts.out.endswith(".png"):
        raise UsageError(f"--out={opts.out} must be a .png path")
    # checked now, not after the runs: the folder of --out is one, or can be made, and can be written
    above = nearest_existing(os.path.dirname(os.path.abspath(opts.out)))
    problem = not_a_folder(above)
    if problem:
        raise UsageError(f"--out={opts.out}: {above} is {problem}; give a .png path in a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise UsageError(f"--out={opts.out}: {above} is not writable; give a .png path in a folder you can write to")
    for path in (opts.out, numbers_path(opts.out)):  # what will be written, if it is there already
        problem = not_a_file(path)
        if problem:
            raise UsageError(f"--out={opts.out}: {path} is {problem}; give a .png path the check can write")


def numbers_path(out):
    """Where the numbers go: beside the PNG, as .json."""
    return os.path.splitext(out)[0] + ".json"


def run(opts, given):
    """Every width's rows {width, step, layer, op, mean_abs}, on the same batches for all widths."""
    machine = runtime.Machine.from_env()  # the environment is input too: checked before the data is prepared
    folder = data.prepare(opts.dataset, "byte", opts.data_dir)
    meta = data.load_meta(folder)
    width_configs = model_configs(opts, given, meta["vocab_size"])
    block_size = next(iter(width_configs.values())).block_size
    # train.py's checks of the data and the memory, before anything is allocated
    data.check_length(meta, block_size)
    # no evaluation windows: the coord check reads activations, not a validation loss
    sizes = SimpleNamespace(batch_size=opts.batch_size, dtype="float32", eval_iters=0)
    runtime.check_memory(width_configs[max(width_configs)], sizes, "cpu", machine)
    generator = torch.Generator().manual_seed(opts.seed)
    batches = [data.get_batch(folder, "train", opts.batch_size, block_size, generator, "cpu")
               for _ in range(opts.steps + 1)]
    rows = []
    for width, cfg in width_configs.items():
        torch.manual_seed(opts.seed)
        rows += [{"width": width, **row} for row in coord_check(GPT(cfg), batches, opts.lr)]
        print(f"width {width}: done")
    return rows


def coord_check_means(rows):
    """{op: {step: {width: mean |x| averaged over the layers}}} from the rows of run()."""
    sums = {}
    for r in rows:
        cell = sums.setdefault(r["op"], {}).setdefault(r["step"], {}).setdefault(r["width"], [0.0, 0])
        cell[0] += r["mean_abs"]
        cell[1] += 1
    return {op: {step: {w: total / n for w, (total, n) in sorted(by_width.items())} for step, by_width in steps.items()}
            for op, steps in sums.items()}


def plot_coord_check(rows, title, path):
    """Tensor Programs V's coord check: mean |x| of each op's output (averaged over layers) against width, log-log,
    one line per training step; flat lines mean the scale of that op does not depend on width."""
    from lab.figures import plt, save_png  # matplotlib after the runs, so that bad input fails fast
    from matplotlib.ticker import NullFormatter

    means = coord_check_means(rows)
    cols = 4
    lines = math.ceil(len(means) / cols)
    fig, axes = plt.subplots(lines, cols, figsize=(2.3 * cols, 1.7 * lines), squeeze=False)
    for ax, (op, steps) in zip(axes.flat, means.items()):
        for step, by_width in sorted(steps.items()):
            ax.plot(list(by_width), list(by_width.values()), marker="o", ms=3, label=f"step {step}",
                    color=plt.cm.viridis(step / max(1, len(steps) - 1)))
        ax.set(xscale="log", yscale="log")
        ax.set_title(op, fontsize=8)
        ax.set_xticks(list(by_width), [str(w) for w in by_width])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(means):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"coord check (mean |x| vs width, one line per step): {title}", fontsize=9)
    fig.tight_layout()
    # 15 panels at the results page's 80 dpi make a 130 KB PNG; 56 dpi keeps it under 100 KB for docs/
    save_png(fig, path, dpi=56)


def main(argv):
    if wants_help(argv):
        print_help(__doc__, CoordOptions)
        return 0
    try:
        given = parse(argv, CoordOptions, GPTConfig)
        opts = build(CoordOptions, given)
        check_options(opts)
        rows = run(opts, given)
    except (UsageError, data.DataError) as e:
        return fail("coord_check.py", e)
    title = " ".join(f"--{k}={v}" for k, v in given.items() if k in GPTConfig.__dataclass_fields__ or k == "preset")
    record = {"options": dataclasses.asdict(opts), "model_flags": title, "rows": rows}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
        write_atomic(numbers_path(opts.out), json.dumps(record).encode())
        plot_coord_check(rows, title or "--init=gpt2 (default)", opts.out)
    except WriteError as e:
        print(f"coord_check.py: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the folder of --out, made after the check (another process changed it meanwhile)
        print(f"coord_check.py: {cannot_write(e.filename or opts.out, e)}", file=sys.stderr)
        return 1
    print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
