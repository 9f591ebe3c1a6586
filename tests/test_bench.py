"""bench.py runs every variant of a group and reports each against the first (and its bad input, at the end)."""

import glob
import math
import os
import shlex

import pytest
import torch

from lab import bench
import configs
from model import GPT, GPTConfig, configure_optimizer
import norms
from norms import NORMS
from conftest import folder_snapshot, refused, without


def table_row(line):
    """A row of bench.py's table: the variant's name (the first 28 characters), then the figures."""
    return [line[:28].strip(), *line[28:].split()]


# on the CPU, whatever the machine has: the table, the dispatch counts and the guard are about the CPU build here
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8", "--batch_size=2", "--vocab_size=64",
        "--device=cpu"]


@pytest.mark.slow
def test_bench_times_every_norm_against_the_first(capsys):
    assert bench.main(["--rounds=1", "--steps=1", *TINY]) == 0
    rows = [table_row(line) for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == [f"norm={kind}" for kind in NORMS] + [bench.POWERNORM_ALONE]
    assert rows[0][2] == "1.00" and all(float(row[1]) > 0 for row in rows)


def test_bench_times_powernorm_with_and_without_its_group_scaling():
    """The last row of --variants=norms is PowerNorm alone (eq. (8)-(13)), without App. A.1's group scaling."""
    models = bench.parse([])[0]
    with_groups, alone = models["norm=powernorm"], models[bench.POWERNORM_ALONE]
    assert (with_groups.norm, with_groups.pn_group_scaling) == ("powernorm", True)
    assert (alone.norm, alone.pn_group_scaling) == ("powernorm", False)
    assert GPT(alone).blocks[0].attn_norm.groups == 0 < GPT(with_groups).blocks[0].attn_norm.groups


@pytest.mark.slow
def test_bench_alternates_the_order_of_the_variants_round_by_round(monkeypatch, capsys):
    """Forward in even rounds, backward in odd ones: no variant always runs next to the baseline."""
    calls, step = [], bench.Variant.step
    monkeypatch.setattr(bench.Variant, "step", lambda self: calls.append(self) or step(self))
    assert bench.main(["--variants=baseline", "--rounds=3", "--steps=2", *TINY]) == 0
    plain, default = calls[:2]  # each variant's warm-up step, in the order they were built
    assert calls[2:] == [plain, plain, default, default, default, default, plain, plain, plain, plain, default, default]


def test_median_interval_from_the_binomial_distribution():
    """The interval's ends are the order statistics that a binomial table gives: P(Binomial(10, 1/2) <= 1) =
    11/1024, twice that 2.1% <= 5%, while P(<= 2) = 56/1024 gives 10.9%, so of 10 values the 2nd smallest and the
    2nd largest; of 30, P(<= 9) = 2.1% and P(<= 10) = 4.9%, so the 10th from each end."""
    values = [float(v) for v in torch.randperm(30)]
    assert bench.median_interval(values[:10]) == (sorted(values[:10])[1], sorted(values[:10])[8])
    assert bench.median_interval(values) == (9.0, 20.0)
    assert bench.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few values: the whole range


def test_too_few_rounds_for_a_95_percent_interval_show_none(capsys):
    """The range of n values misses the median with probability 2 / 2^n: 6.25% for 5 rounds, 3.1% for 6. Below
    MIN_ROUNDS the table shows "-" and the first line says why, rather than a "95% interval" that is not one."""
    assert 2 / 2 ** bench.MIN_ROUNDS <= 0.05 < 2 / 2 ** (bench.MIN_ROUNDS - 1)
    for rounds, interval in [(1, "-"), (bench.MIN_ROUNDS - 1, "-"), (bench.MIN_ROUNDS, "interval")]:
        assert bench.main(["--variants=baseline", f"--rounds={rounds}", "--steps=1", *TINY]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert (bench.NO_INTERVAL in lines[0]) == (interval == "-")
        rows = [table_row(line) for line in lines[2:]]
        assert len(rows) == 2 and all((row[3] == "-") == (interval == "-") for row in rows), lines
        if interval != "-":
            low, high = map(float, rows[1][3].split("-"))
            assert low <= float(rows[1][2]) <= high


def test_median_interval_holds_the_median_95_times_in_100():
    """Samples of 25 from a skewed distribution (exponential, median ln 2): the interval is exact at
    1 - 2 P(Binomial(25, 1/2) <= 7) = 95.7%, and 4,000 samples measure that to about +-0.3%."""
    generator = torch.Generator().manual_seed(0)
    samples = torch.empty(4000, 25).exponential_(generator=generator).tolist()
    covered = [low <= math.log(2) <= high for low, high in map(bench.median_interval, samples)]
    assert 0.945 <= sum(covered) / len(covered) <= 0.97


def test_bench_times_each_norm_module_alone(capsys):
    assert bench.main(["--part=norm", "--rounds=1", "--steps=1", *TINY, "--norm_affine=no_bias"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "the norm modules alone" in lines[0]
    rows = [table_row(line) for line in lines[2:]]
    assert [row[0] for row in rows] == [f"norm={kind}" for kind in NORMS] + [bench.POWERNORM_ALONE]
    assert rows[0][2] == "1.00"


@pytest.mark.slow
def test_bench_presets_with_an_explicit_override(capsys):
    assert bench.main(["--variants", "presets", "--rounds", "1", "--steps=1", *TINY, "--activation=geglu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(bench.PRESETS) and "1 rounds x 1 steps" in lines[0]


def test_bench_headline_times_the_baseline_normformer_and_powernorm(capsys):
    """The three the README's GPU runs time, in one run: GPT-2 as it is, NormFormer's three additions, and PowerNorm."""
    models = bench.parse(["--variants=headline"])[0]
    baseline, normformer, powernorm = models.values()
    assert baseline == configs.resolve({}).model  # the quickstart's model, as train.py resolves it
    changed = {k for k, v in vars(normformer).items() if v != getattr(baseline, k)}
    assert changed == {"scale_attn", "scale_fc", "scale_heads"} and normformer.scale_heads is True
    assert (powernorm.norm, powernorm.pn_group_scaling) == ("powernorm", True)
    assert bench.main(["--variants=headline", "--rounds=1", "--steps=1", *TINY]) == 0
    rows = [table_row(line) for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["preset=baseline", "preset=normformer", "norm=powernorm"]


def test_every_bench_command_in_the_docs_is_accepted():
    """The bench.py commands of README.md and docs/*.md (docs/benchmarks.md holds them, the GPU ones too, with that
    page's $S) parse; none is run here."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commands = []
    for page in [os.path.join(root, "README.md"), *sorted(glob.glob(os.path.join(root, "docs", "*.md")))]:
        with open(page, encoding="utf-8") as f:
            lines = [line.split("#")[0] for line in f.read().splitlines()]
        shape = next((line.strip().removeprefix("S=").strip('"') for line in lines if line.startswith("S=")), None)
        for line in lines:
            if line.startswith("python -m lab.bench"):
                assert shape is not None or "$S" not in line, (page, line)
                commands.append(shlex.split(line.replace("$S", shape or ""))[3:])
    assert len(commands) >= 10 and any("--variants=headline" in argv for argv in commands)
    for argv in commands:
        bench.parse(argv)


def test_bench_help_lists_its_flags_with_the_defaults_it_uses(capsys):
    assert bench.main(["--steps=2", "--help"]) == 0
    out = capsys.readouterr().out
    opts = bench.parse(["--variants", "norms"])[1]
    defaults = {"variants": "norms", "rounds": str(opts.rounds), "steps": str(opts.steps), "part": opts.part,
                "compile_mode": opts.compile_mode}
    for name, default in defaults.items():
        assert any(line.split()[:2] == [f"--{name}", default] for line in out.splitlines()), (name, out)
    assert "python train.py --help" in out and "configurable.txt" in out
    assert all(group in out for group in bench.VARIANTS)


def plain_and_default(dtype=torch.float32, **shape):
    """nanonorm's GPT at its defaults and bench.PlainGPT of the same shape holding the same weights."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**{"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 64, **shape}))
    plain = bench.PlainGPT(gpt.config)
    pairs = list(zip(gpt.named_parameters(), plain.named_parameters()))
    assert len(pairs) == len(list(plain.parameters())) == len(list(gpt.parameters()))
    with torch.no_grad():
        for (name, p), (plain_name, q) in pairs:
            assert p.shape == q.shape, (name, plain_name)
            q.copy_(p)
    return gpt.to(dtype), plain.to(dtype)


@pytest.mark.parametrize("bias", [True, False])
def test_plain_gpt_is_the_default_model(bias):
    """The baseline is the same function as nanonorm's default GPT, value and gradient (float64): its ratio in
    --variants=baseline times only the work around the math."""
    gpt, plain = plain_and_default(torch.float64, bias=bias)
    idx, targets = torch.randint(0, 64, (3, 16)), torch.randint(0, 64, (3, 16))
    (logits, loss), (plain_logits, plain_loss) = gpt(idx, targets), plain(idx, targets)
    torch.testing.assert_close(plain_logits, logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(plain_loss, loss, rtol=1e-12, atol=1e-12)
    loss.backward(), plain_loss.backward()
    for (name, p), q in zip(gpt.named_parameters(), plain.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-14, msg=name)


def training_step_ops(model):
    """The aten ops of one training step (forward, backward, fused AdamW), counted by name, after a first step
    that created the optimizer's states."""
    tc = configs.TrainConfig()
    optimizer = configure_optimizer(model, tc.weight_decay, tc.lr, (tc.beta1, tc.beta2), "cpu")
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))

    def step():
        model(idx, targets)[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    with bench.AtenOps() as ops:
        step()
    return ops.counts


def test_the_default_training_step_does_the_plain_gpts_work_and_no_more():
    """Every op of nanonorm's default training step, backward and optimizer included, is one the plainest GPT-2
    also runs, as often: a flag that is off leaves no multiply by 1, dtype round trip or identity in the step."""
    gpt, plain = plain_and_default()
    assert training_step_ops(gpt) == training_step_ops(plain)


def test_bench_baseline_times_nanonorm_against_the_plain_gpt(capsys):
    assert bench.main(["--variants=baseline", "--rounds=1", "--steps=1", *TINY]) == 0
    rows = [table_row(line) for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == [bench.PLAIN, "nanonorm defaults"]


@pytest.mark.slow
def test_bench_float16_steps_scale_the_loss_as_train_does(monkeypatch, capsys):
    """Under float16 every timed step (and each variant's warm-up step) goes through an enabled GradScaler, as
    train.py's do: the loss scaled before backward, the optimizer stepped by the scaler (which skips on inf)."""
    steps = []
    scaler_step = torch.amp.GradScaler.step
    monkeypatch.setattr(torch.amp.GradScaler, "step",
                        lambda self, optimizer: steps.append(self.is_enabled()) or scaler_step(self, optimizer))
    assert bench.main(["--variants=baseline", "--rounds=2", "--steps=1", "--dtype=float16", *TINY]) == 0
    assert steps == [True] * 2 * (1 + 2)
    steps.clear()
    assert bench.main(["--variants=baseline", "--rounds=2", "--steps=1", *TINY]) == 0
    assert steps == [False] * 2 * (1 + 2)


@pytest.mark.parametrize("affine", ["both", "no_bias", "none"])
def test_layernorm_through_a_function_is_layernorm(affine):
    """--variants=function times the same math by the same kernels: values and gradients equal in float64."""
    torch.manual_seed(0)
    native = norms.LayerNorm(7, affine=affine).double()
    with torch.no_grad():
        for p in native.parameters():
            p.normal_()
    through_function = bench.FunctionLayerNorm(7, affine=affine).double()
    through_function.load_state_dict(native.state_dict())
    x = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(3, 5, 7, dtype=torch.float64)
    grads = []
    for module in (native, through_function):
        y = module(x)
        grads.append((y, *torch.autograd.grad(y, (x, *module.parameters()), dy)))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.slow
def test_bench_swaps_every_layernorm_for_the_function_and_the_step_dispatches_the_same_ops(capsys):
    shape = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--vocab_size=64"]
    model_cfgs, *_ = bench.parse(["--variants=function", *shape])
    models = [bench.Variant(cfg, configs.TrainConfig(), "cpu", torch.float32, name).model
              for name, cfg in model_cfgs.items()]
    native, through_function = ([type(m) for m in model.modules() if isinstance(m, norms.LayerNorm)]
                                for model in models)
    assert native == [norms.LayerNorm] * 3 and through_function == [bench.FunctionLayerNorm] * 3  # two per block, final
    assert training_step_ops(models[0]) == training_step_ops(models[1])
    assert bench.main(["--variants=function", "--rounds=1", "--steps=1", *TINY]) == 0
    rows = [table_row(line) for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["norm=layernorm", bench.THROUGH_FUNCTION] and rows[0][2] == "1.00"


def test_guard_flags_every_norm_above_1_05x_of_layernorm():
    ratios = {"norm=layernorm": 1.0, "norm=rmsnorm": 1.05, "norm=pnv": 1.07, "norm=powernorm": 1.31}
    assert bench.guard_verdict(ratios).endswith("above it: norm=pnv 1.07x, norm=powernorm 1.31x")
    assert bench.guard_verdict({"norm=layernorm": 1.0, "norm=rmsnorm": 0.98}).endswith("all within")


@pytest.mark.slow
def test_bench_gives_the_guards_verdict_for_compiled_norms_only(monkeypatch, capsys):
    """--variants=norms --compile=True ends with the guard's line; eager runs and other groups have none. Compiling
    eight models takes minutes, so torch.compile is the identity here: this checks the mode, not the compiler."""
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: model)
    assert bench.main(["--compile=True", "--rounds=1", "--steps=1", *TINY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "compile True" in lines[0] and len(lines) == 2 + len(bench.VARIANTS["norms"]) + 1
    assert lines[-1].startswith("guard, compiled: every norm within 1.05x of layernorm's step; ")
    for argv in (["--compile=False"], ["--compile=True", "--variants=attention"]):
        assert bench.main([*argv, "--rounds=1", "--steps=1", *TINY]) == 0
        assert "guard" not in capsys.readouterr().out


@pytest.mark.parametrize("mode, graph_steps", [("default", 0), ("max-autotune-no-cudagraphs", 0),
                                               ("reduce-overhead", 4), ("max-autotune", 4)])
def test_the_compile_mode_reaches_torch_compile_and_cuda_graphs_hear_of_each_step(monkeypatch, capsys, mode,
                                                                                 graph_steps):
    """torch.compile is the identity here (a CPU compiles no CUDA graphs): this checks what bench.py asks of it."""
    modes, marks = [], []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: modes.append(mode) or model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    argv = ["--variants=attention", "--compile=True", f"--compile_mode={mode}", "--rounds=1", *TINY]
    assert bench.main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert modes == [None if mode == "default" else mode] * 2
    assert ("compile True," if mode == "default" else f"compile True ({mode}),") in header
    assert len(marks) == graph_steps  # two variants, a warm-up step and a timed one each


@pytest.mark.parametrize("flags, says", [(["--block_size=100000000"], "need about"),
                                         (["--rounds=100000000000000000000"], "is too large")])
def test_bench_refuses_what_cannot_fit_or_run_in_one_line(capsys, flags, says):
    assert bench.main([*without(TINY, flags), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.py: ") and says in err and err.count("\n") == 1


# Bad input to bench.py, in this process and once as a real process: exit code 2, one line on stderr, no traceback,
# and every file under the working folder exactly as it was.

# a model no machine can hold: a bench case that gets past the check it names is refused by the memory check instead
HUGE = ["--vocab_size=2000000000", "--n_embd=1000000"]


@pytest.mark.parametrize("args, says", [
    (["--variants=everything"], "--variants=everything is not allowed; choose one of norms"),
    (["--variants="], "--variants= is not allowed"),
    (["--rounds=two"], "--rounds=two is not a valid int"),
    (["--steps=0"], "--steps=0 must be"),
    # issue 46: a billion rounds ran, for years, without a word
    (["--rounds=1000000000"], "--rounds=1000000000 must be an integer from 1 to 10,000"),
    (["--steps=10001"], "--steps=10001 must be an integer from 1 to 10,000"),
    (["--rounds=3", "--rounds=5"], "--rounds is given twice (--rounds=3, then --rounds=5); give each flag once"),
    (["--part=layer"], "--part=layer is not allowed; choose one of step, norm"),
    (["--part=norm", "--variants=presets"], "--part=norm times the norms of --variants=norms"),
    (["--compile_mode=fast"], "--compile_mode=fast is not allowed; choose one of default, reduce-overhead"),
    (["--compile_mode=reduce-overhead", "--compile=False"], "it needs --compile=True (compile is False here)"),
    (["--norm=groupnorm"], "--norm=groupnorm is not allowed"),
    (["--bogus=1"], "unknown flag --bogus"),
    (["--batch_size=0"], "--batch_size=0 must be"),
    (["--device=tpu"], "--device=tpu is not a device"),
    (["extra"], "unexpected argument 'extra'"),
    (["--variants=presets", "--layout=post", "--scale_resids"], "scale_resids"),
    pytest.param(["--device=cuda"], "CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_bench_bad_input(tmp_path, monkeypatch, capsys, args, says):
    """In this process (one real process below): bench.py's checks run before it allocates anything."""
    monkeypatch.chdir(tmp_path)
    before = folder_snapshot(tmp_path)
    assert bench.main([*HUGE, *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("bench.py: ") and captured.err.count("\n") == 1 and says in captured.err
    assert captured.out == "" and folder_snapshot(tmp_path) == before


@pytest.mark.slow
def test_bench_bad_input_from_the_shell(tmp_path):
    assert "unknown flag --bogus" in refused(tmp_path, "bench.py", [*HUGE, "--bogus=1"])


class FakeCudaGraphs:
    """torch.compile(mode="reduce-overhead") as a CPU can stand in for it: like CUDA graph trees, a call's outputs
    (what it returns, and the buffers it gave the module) are overwritten once a new step begins
    (torch.compiler.cudagraph_mark_step_begin), and a later call that reads one fails with CUDA graphs' error."""
    ERROR = "Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run."

    def __init__(self, model):
        self.model, self.outputs, self.overwritten = model, [], []

    def step_begins(self):
        self.overwritten, self.outputs = self.overwritten + self.outputs, []

    def __call__(self, *args):
        if any(buffer is old for buffer in self.model.buffers() for old in self.overwritten):
            raise RuntimeError(self.ERROR)
        before = set(map(id, self.model.buffers()))
        out = self.model(*args)
        self.outputs += [b for b in self.model.buffers() if id(b) not in before] + [t for t in out if t is not None]
        return out


def test_under_cuda_graphs_a_step_keeps_no_tensor_the_next_replay_overwrites(monkeypatch, capsys):
    """The headline with --compile_mode=reduce-overhead, whose cudagraphs part failed on the GPU: PowerNorm's
    forward gives its module new running_psi2 and calls tensors, the graphs' outputs, which the next step's forward
    read after they were overwritten. Each step copies them back into buffers of its own, with the same values."""
    fakes = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: fakes.append(FakeCudaGraphs(model)) or fakes[-1])
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: [f.step_begins() for f in fakes])
    argv = ["--variants=headline", "--compile=True", "--compile_mode=reduce-overhead", "--rounds=3", *TINY]
    assert bench.main(argv) == 0
    assert "norm=powernorm" in capsys.readouterr().out
    assert any(fake.overwritten for fake in fakes)  # the stand-in did overwrite outputs

    # the kept buffers hold what eager steps give them
    models, _, device, tc = bench.parse(["--variants=headline", *TINY])
    steps = []
    for graphs in (False, True):
        fakes.clear()
        variant = bench.Variant(models["norm=powernorm"], tc, device, torch.float32, "norm=powernorm")
        if graphs:
            variant.step_model, variant.new_graph_step = FakeCudaGraphs(variant.model), True
            fakes.append(variant.step_model)
        for _ in range(4):
            variant.step()
        steps.append({name: b.clone() for name, b in variant.model.named_buffers()})
    assert steps[0].keys() == steps[1].keys() and any("running_psi2" in name for name in steps[0])
    assert all(torch.equal(steps[0][name], steps[1][name]) for name in steps[0])
    assert steps[1]["blocks.0.attn_norm.calls"].item() == 4
