"""
One named recipe per claim of a paper, and the statistics that judge it. sweep.py runs a recipe, its pilot first:
    python sweep.py --recipe=normformer_stability --pilot      # the pilot seeds: LRs, spread, seeds to test
    python sweep.py --recipe=normformer_stability              # then the rest, here, on 2 CPU cores
    python sweep.py --recipe=normformer_stability --dry_run    # the train.py commands, for a cluster
    python sweep.py --recipe=normformer_stability --scale=gpu  # the same claim at a GPU-sized scale
and `python plot.py --experiments=sweeps --out=docs` writes docs/experiments.md from the recipes' summaries.

A recipe states the paper's claim (quoted, with the paper's version and its table or figure), the paper's number,
the variants it compares with a reference variant of the same model context, the metric and the direction the
paper states, its seeds, flags and LRs, and how it departs from the paper's protocol (size, steps, dtype, data).

A claim is judged by lab/claims.py as a contrast paired by seed: the exact sign-flip test of the mean per-seed
difference, Holm-adjusted over the recipe's tested claims, with the mean, the interval that inverts the same test
and its coverage, the a-priori power for the claim's target effect (from the pilot seeds' spread, fixed before the
tested seeds run) and the observed minimum detectable effect (lab/stats.py). With n pairs the smallest p is
2 / 2^n, so a recipe's tested seeds must reach 0.05 / m at Holm's first step (8 seeds: 0.0078, enough for m up to
6). A descriptive claim (tested=False) is shown with its own p and interval, outside the family:
a comparison the design cannot power (Spike No More's spikes) or a check of the mechanism beside a tested claim
(did the baseline's log Z drift, without which z-loss has nothing to fix).

Effects are in the metric's units: a loss in nats per byte (the CPU recipes' byte tokens). A paper's effect in nats
per GPT-2 token or per word is divided by the bytes a token or word holds, measured with tiktoken's r50k_base
(GPT-2's BPE) on the papers' own text in ../shared/papers (tests/test_recipes.py measures it again):
BYTES_PER_GPT2_TOKEN on NormFormer's two versions, BYTES_PER_WORD (whitespace-separated) on all five papers. The
papers' text is English prose with tables and formulas, not CC100 or PTB: the conversion is approximate, to about
10%.
"""

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from typing import Optional

from data import FINEWEB_EDU

# Measured on ../shared/papers: NormFormer, both versions, 72,076 bytes in 21,372 GPT-2 tokens (3.42 final, 3.30
# arXiv v1); all five papers, 176,362 bytes in 26,838 whitespace-separated words
BYTES_PER_GPT2_TOKEN = 3.37
BYTES_PER_WORD = 6.57
NORMFORMER_PAPERS = ("000_17b7fa221acaa2b6.txt", "001_7e19e93304f0ad38.txt")
TARGET_ORIGINS = ("paper", "nanonorm")
REPLICATION = "replication"  # the stage of a recipe's fresh-seed replicate (Replication; sweep.py --replicate)

# the direction in which each metric is better (sweep.py's metric names, before the "@LR")
# (lr_sensitivity: Wortsman et al. 2023 §3; grad_ratio, fc2_grad_ratio: layer 0's gradient over the last layer's,
# which Spike No More Fig. 3 and NormFormer Fig. 3 show large for the baselines and evened out by the variants,
# scored as |ln ratio| so that a ratio overshooting below 1 is as uneven as one above it (lab/claims.py);
# left_plateau, survived: binary endpoints, 1 a run that did, lab/claims.py)
BETTER = {"steps_survived": "higher", "peak_lr": "higher", "final_loss": "lower", "best_loss": "lower",
          "spikes": "lower", "attn_logit_max": "lower", "log_z": "lower", "lr_sensitivity": "lower",
          "grad_ratio": "lower", "fc2_grad_ratio": "lower", "left_plateau": "higher", "survived": "higher"}


@dataclass
class Claim:
    """One comparison the paper makes, fixed before the runs: the per-seed difference variant - reference of a
    metric (paired by seed: the arms share seeds, data order and evaluation windows), in the paper's direction.
    With `minus`, the claim is an interaction: (variant - reference) - (minus[0] - minus[1]), per seed (DeepNet:
    the gap grows with depth). `effect` is the size the design is powered for, in the metric's units (or, with
    `relative`, as a fraction of the reference's median), `effect_source` says where it comes from and
    `target_origin` whose it is: "paper" (the paper's number, converted to the metric's units) or "nanonorm" (the
    paper gives none; nanonorm's choice, fixed before the runs). best_loss reads each arm at its own best LR: the
    LR of the lowest median loss over the recipe's pilot seeds, which are never tested, so that the tested seeds
    do not choose their own LR. tested=False: a descriptive row, outside Holm's family, without a verdict (with
    control=True: a control, where the paper predicts no effect)."""
    variant: str
    metric: str  # final_loss@LR, best_loss, lr_sensitivity, steps_survived@LR, grad_ratio@LR, spikes@LR, log_z@LR
    expect: str  # "better" or "worse" than the reference, as the paper states
    paper_number: str  # the paper's own figures for this comparison, with where they are
    effect: float  # the effect the design must detect (> 0, in the expected direction)
    effect_source: str
    target_origin: str  # "paper" or "nanonorm"
    relative: bool = False  # effect is a fraction of the reference's median
    reference: Optional[str] = None  # None: the recipe's reference
    minus: Optional[tuple] = None  # (variant, reference) of a second contrast subtracted per seed
    tested: bool = True  # False: descriptive, outside the family
    control: bool = False  # with tested=False: a control, where the paper predicts no effect

    def __post_init__(self):
        if self.target_origin not in TARGET_ORIGINS:
            raise ValueError(f"target_origin is {self.target_origin!r}; one of {', '.join(TARGET_ORIGINS)}")


@dataclass
class Replication:
    """A recipe's replication on fresh seeds, fixed here before any of them ran: the original design (its flags,
    its arms at the LRs the original pilot chose, its claims, test and failure rule) again on `seeds` seeds from
    `first_seed`, none of which the project had run before (`python sweep.py --recipe=NAME --replicate`). A
    replicate chooses nothing: `lrs` ({variant: LRs}, None: the recipe's whole grid, as an LR-sensitivity claim
    needs) are what each arm runs, `best_lrs` ({variant: LR}) where a best_loss claim reads each arm, the original
    pilot's pick. `variants` and `claims` add the arms and claims of another recipe run on the same seeds
    (NormFormer's two widths, so that the width interaction is paired by seed); `lr_check` ({variant: LRs}, run on
    the first `check_seeds` seeds only) measures the grid's error: each arm's sqrt(2) neighbours of its chosen LR.
    `seeds` is the original's number of tested seeds (the design the original used); its a-priori power comes from
    the original's tested pairs (lab/claims.replicate_power)."""
    first_seed: int
    seeds: int
    lrs: Optional[dict] = None
    best_lrs: Optional[dict] = None
    variants: list = field(default_factory=list)
    claims: list = field(default_factory=list)
    lr_check: Optional[dict] = None
    check_seeds: int = 3


@dataclass
class Recipe:
    """A claim, the paper's protocol for it shrunk to 2 CPU cores, and the same at GPU size (`gpu_flags` and
    `gpu_lrs` replace `flags` and `lrs`). The design (variants, LRs, seeds, metric, test, direction, effect) is
    fixed here before the runs; changing any of it means running the whole recipe again, on new seeds. The first
    `pilot` seeds are the pilot (`python sweep.py --recipe=NAME --pilot` runs only them): they choose each arm's
    best LR, show whether it is bracketed, and give the spread from which the tested seeds' number was chosen and
    the page's a-priori power is computed; no claim tests them. `tested_seeds` follow them."""
    title: str
    paper: str  # the paper, its version, and the table or figure the claim is in
    quote: str  # the paper's words
    mode: str  # sweep.py --mode: ramp or lr
    variants: list
    reference: str
    claims: list
    lrs: list
    flags: list
    tested_seeds: int = 8
    pilot: int = 3
    first_seed: int = 100  # seeds first_seed .. first_seed + pilot + tested_seeds - 1
    gpu_lrs: list = field(default_factory=list)
    gpu_flags: list = field(default_factory=list)
    deviations: str = ""
    gpu_deviations: str = ""
    figure: str = "metric"  # ramp, loss_vs_lr (with a band over seeds), depth, grad_ratio, metric (seed values)
    chaotic: bool = False  # its endpoint moves with the thread count and CPU: judged against a replicate's spread
    # {variant: LRs}: what the tested seeds run, fixed from the pilot before they do (each arm's chosen LR and the
    # LRs other claims read); None: every LR of the grid
    tested_lrs: Optional[dict] = None
    replication: Optional[Replication] = None  # its fresh-seed replicate (None: inside another recipe's)

    @property
    def seeds(self):
        return self.pilot + self.tested_seeds


# Every CPU recipe scores its runs on the same fixed windows of the validation split (train.py's evaluation does
# not depend on the seed): 40 x 8 windows of 64 tokens = 20,480 tokens for the LR curves, whose effects are
# large, and 80 x 8 = 40,960 for loss claims.
CURVE_EVAL = "--eval_iters=40"
LOSS_EVAL = "--eval_iters=80"
# normformer_loss's grid: 2x apart around both widths' optima of an earlier two-LR grid (6e-3 and 1e-2)
NF_LOSS_LRS = ["3e-3", "6e-3", "1.2e-2", "2.4e-2"]


def cpu(n_layer=4, n_embd=64, n_head=4, batch_size=8):
    """Every CPU recipe's data, size and logging: the builtin corpus (the Python standard library's source, byte
    tokens) and a tiny model, so that a recipe runs its seeds in minutes on 2 cores. --device=cpu: on a machine
    with a GPU the CPU recipes still run where their numbers were measured (a GPU's kernels round differently)."""
    return ["--dataset=builtin", "--device=cpu", f"--n_layer={n_layer}", f"--n_embd={n_embd}", f"--n_head={n_head}",
            "--block_size=64", f"--batch_size={batch_size}", "--log_interval=10"]


# The GPU versions' corpus: web text of the papers' kind, large enough that no run reads a token twice (the longest
# reads 5,000 x 65,536 = 0.33B tokens). sweep.py refuses to start the runs until data.py has prepared it.
GPU_CORPUS = FINEWEB_EDU
GPU_CORPUS_TOKENS = 9_600_000_000  # sample-10BT's train split, about 10B GPT-2 tokens less the 1% held out for val
GPU_DATA = ("FineWeb-Edu's sample-10BT in GPT-2 BPE tokens (educational web pages, about 10B tokens; a run reads at "
            "most 0.33B of them, less than one pass; each paper's own corpus is named in the CPU deviations)")


def gpu(n_layer=12, n_embd=768, n_head=12):
    """The GPU versions: GPT-3 Small's shape, GPT-2's BPE, 65K tokens a step, on GPU_CORPUS (--dataset=PATH on the
    command line comes after the recipe's flags and wins)."""
    return [f"--dataset={GPU_CORPUS}", "--tokenizer=gpt2", f"--n_layer={n_layer}", f"--n_embd={n_embd}",
            f"--n_head={n_head}", "--block_size=1024", "--batch_size=16", "--grad_accum=4", "--eval_iters=20",
            "--log_interval=10"]


# Wortsman et al. 2023 §2-3: final loss against LR over at least three decades, and the LR sensitivity
# E_lr[min(L(lr), L_0) - min_lr L(lr)] (L_0: the loss at initialization) as the statistic; here per seed.
LR_GRID = ["3e-4", "1e-3", "3e-3", "1e-2", "3e-2", "1e-1", "3e-1", "1"]
GPU_LR_GRID = ["1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2"]
CURVE_TRAINING = ["--max_iters=200", "--eval_interval=200", "--warmup_iters=20", "--min_lr=0", "--dropout=0",
                  CURVE_EVAL]
GPU_CURVE_TRAINING = ["--max_iters=2000", "--eval_interval=2000", "--warmup_iters=200", "--min_lr=0",
                      "--dropout=0"]
# one claim per LR-curve recipe: 6 seeds reach p = 2 / 2^6 = 0.031 < 0.05, at 96 runs a recipe
CURVE_SEEDS = 6
# an effect the paper states no number for: nanonorm powers its design for a quarter of the reference's median
QUARTER = ("no number in the paper: the design is powered for a quarter of the reference's median "
           "(nanonorm's choice, fixed before the runs)")

# The variants are model.py's paper-context presets: each paper's baseline and variants in the model it used
NF_BASELINE = "nf_baseline"
WIDE = "+n_embd=128+n_head=4"  # 4 heads of 32 at either scale (GPU: 12 x 768 is the other width)
NF_LOSS_NUMBER = "final Table 5, 125M at LR 0.003: valid PPL 15.88 vs 16.37 (arXiv v1 Table 7: 15.98 vs 16.37)"
NF_LOSS_EFFECT = round(math.log(16.37 / 15.88) / BYTES_PER_GPT2_TOKEN, 4)
NF_LOSS_SOURCE = (f"final Table 5: ln(16.37 / 15.88) = 0.0304 nats per GPT-2 token, / {BYTES_PER_GPT2_TOKEN} bytes "
                  f"per token = {NF_LOSS_EFFECT} nats per byte")
NF_NORMFORMER = "nf_normformer"
NF_DEVIATIONS = ("4 layers x 64 wide (the paper: 12 x 768, 125M parameters), sequences of 64 byte tokens of the "
                 "Python standard library (the paper: 1,024 BPE tokens of CC100, BookCorpus and Wikipedia), 512 "
                 "tokens a step (the paper: 524K), float32 on CPU (the paper: float16 on GPUs)")
# Spike No More App. A: Adam beta2 0.999, weight decay 0.01, dropout 0.1, gradient clipping 1.0 (nanonorm's default)
SNM_VANILLA = "snm_vanilla"
SNM_SCALED_EMBED = "snm_scaled_embed"
SNM_EMBED_LN = "snm_embed_ln"
SNM_TRAINING = ["--beta2=0.999", "--weight_decay=0.01", "--dropout=0.1"]
DN_POSTLN = "dn_postln"
DN_DEEPNORM = "dn_deepnorm"
DN_DEPTHS = (6, 18, 36)
PN_LAYERNORM = "pn_layernorm"
PN_BATCHNORM = "pn_batchnorm"
PN_PNV = "pn_pnv"
PN_POWERNORM = "pn_powernorm"


def ptb_target(high, low):
    """A PowerNorm claim's target from Table 2's PTB test perplexities: ln(high / low) nats per word, in nats per
    byte through BYTES_PER_WORD (Claim's effect and effect_source)."""
    nats = round(math.log(high / low), 3)
    effect = round(nats / BYTES_PER_WORD, 4)
    return {"effect": effect, "effect_source": f"Table 2, PTB: ln({high} / {low}) = {nats} nats per word, / "
                                               f"{BYTES_PER_WORD} bytes per word = {effect:.4f} nats per byte"}


QK_BASELINE = "baseline"
QK_NORM = "qk_norm=True"
WD0_BASELINE = "baseline+weight_decay=0"
WD0_Z_LOSS = "z_loss=1e-4+weight_decay=0"


NF_LOSS_FLAGS = [*cpu(batch_size=16), "--max_iters=600", "--eval_interval=600", LOSS_EVAL, "--warmup_iters=60",
                 "--lr_schedule=linear", "--min_lr=0", "--dropout=0", "--telemetry_interval=10"]
NF_LOSS_GPU_LRS = ["5e-4", "1e-3", "2e-3", "4e-3"]
NF_LOSS_GPU_FLAGS = [*gpu(), "--max_iters=5000", "--eval_interval=500", "--warmup_iters=500", "--lr_schedule=linear",
                     "--min_lr=0", "--dropout=0", "--telemetry_interval=50"]
NF_LOSS_DEVIATIONS = (NF_DEVIATIONS.replace("512 tokens", "1,024 tokens") + "; 600 steps with 60 warmup steps (the "
                      "paper: 100,000 updates, 500 warmup), equal steps (the paper compares equal GPU hours, where "
                      "NormFormer gets 2-6% fewer steps); each arm at its own best LR of four, 3e-3 to 2.4e-2, 2x "
                      "apart (an earlier grid of two, 6e-3 and 1e-2, put both arms at its top edge at 64 wide and at "
                      "its bottom edge at 128), chosen per arm by the lowest median loss over the 3 pilot seeds, "
                      "which are never tested; the tested seeds run only each arm's chosen LR (the paper tunes both "
                      "arms over six LRs at 50,000 steps, final §4 and Table 1); the loss target is the paper's gain "
                      "in nats per GPT-2 token divided by BYTES_PER_GPT2_TOKEN (lab/recipes.py)")
NF_LOSS_GPU_DEVIATIONS = ("12 x 768 (the paper's 125M shape) and the same 128-wide, 4-head variants, bfloat16 where "
                          "the GPU has it, 5,000 steps with 500 warmup (the paper: 100,000), 65K tokens a step, each "
                          "arm at its best of LRs 5e-4 to 4e-3 on the pilot seeds, the target per GPT-2 token "
                          "converted to bytes as on CPU although these runs count tokens; " + GPU_DATA)


def depth(variant, n):
    return f"{variant}+n_layer={n}"


# deepnorm_depth's arms at the LRs its pilot chose (the lowest median loss over seeds 100-102)
DN_CHOSEN = {depth(DN_POSTLN, 6): ["2e-3"], depth(DN_DEEPNORM, 6): ["8e-3"],
             depth(DN_POSTLN, 18): ["2e-3"], depth(DN_DEEPNORM, 18): ["4e-3"],
             depth(DN_POSTLN, 36): ["2e-3"], depth(DN_DEEPNORM, 36): ["4e-3"]}
# Every replicate's fresh seeds start here: seeds 300 on had never been run by the project when the replications
# were fixed (the pilots and tested seeds are 100-118)
REPLICATE_SEED = 300
# NormFormer's two widths on the same fresh seeds (normformer_loss's replicate holds normformer_loss_wide's arms):
# each arm at the LR its own recipe's pilot chose, the grid checked at each arm's sqrt(2) neighbours
NF_CHOSEN = {NF_BASELINE: "1.2e-2", NF_NORMFORMER: "6e-3", NF_BASELINE + WIDE: "6e-3", NF_NORMFORMER + WIDE: "3e-3"}
NF_NEIGHBOURS = {NF_BASELINE: ["8.49e-3", "1.7e-2"], NF_NORMFORMER: ["4.24e-3", "8.49e-3"],
                 NF_BASELINE + WIDE: ["4.24e-3", "8.49e-3"], NF_NORMFORMER + WIDE: ["2.12e-3", "4.24e-3"]}
NF_WIDE_CLAIM = Claim(NF_NORMFORMER + WIDE, "best_loss", "better", NF_LOSS_NUMBER, effect=NF_LOSS_EFFECT,
                      effect_source=NF_LOSS_SOURCE, target_origin="paper")
# NormFormer across width as one claim: its gain at 128 wide minus its gain at 64, per seed. The direction is the
# one the original seeds showed (worse at 64, better at 128): a hypothesis from those seeds, tested on fresh ones
NF_WIDTH_CLAIM = Claim(NF_NORMFORMER + WIDE, "best_loss", "better",
                       "final Table 5: NormFormer's gain at every size from 125M to 2.7B; no width below 125M",
                       effect=round(2 * NF_LOSS_EFFECT, 4), reference=NF_BASELINE + WIDE,
                       minus=(NF_NORMFORMER, NF_BASELINE), target_origin="nanonorm",
                       effect_source="nanonorm's choice: the paper's 0.009 gain at 128 wide against a 0.009 loss at "
                                     "64, twice the paper's per-width effect")


RECIPES = {
    "normformer_stability": Recipe(
        title="NormFormer survives a higher LR than the baseline in the LR stability test",
        paper="NormFormer arXiv v1 §4 and Table 3 (final version: §6, Fig. 5 and Table 8)",
        quote="Table 3 shows that NormFormer models last 150 steps longer and reach a higher peak learning rate "
              "than the baseline. For the baseline, loss explodes because the activations produced by multiplying "
              "the query and key features at layer 0 are too large to be represented in 16 bits.",
        mode="ramp", variants=[NF_BASELINE, NF_NORMFORMER], reference=NF_BASELINE,
        claims=[Claim(NF_NORMFORMER, "steps_survived@1.0", "better",
                      "arXiv v1 Table 3: last step 550 vs 400, peak LR 0.0275 vs 0.02 (5e-5 a step); final Table 8 "
                      "(1.3B, 0 to 0.1 over 1,000 steps): 200 steps (row 31) vs 94 (row 14)",
                      effect=0.375, relative=True, target_origin="paper",
                      effect_source="arXiv v1 Table 3: 150 more steps than the baseline's 400, i.e. 37.5% more")],
        lrs=["1.0"], flags=[*cpu(), "--max_iters=500", "--eval_interval=500", "--eval_iters=5", "--attn_impl=manual",
                            "--dropout=0", "--fp16_overflow_fails=True"],
        gpu_lrs=["0.05"], gpu_flags=[*gpu(), "--max_iters=1000", "--eval_interval=1000", "--attn_impl=manual",
                                     "--dropout=0", "--dtype=float16"], chaotic=True,
        # the pilot (seeds 100-102, 1 thread a run, 2026-11-28): steps survived d +128, -17, -37, sd 90 against a
        # target of 55 steps (37.5% of the pilot baseline's 147): 80% power would take about 21 pairs, past the
        # exact test's enumeration (lab/stats.py: n up to about 20); 16, the most pairs_for_power looks at, give
        # 64% (stats.sign_flip_power at alpha 0.05)
        tested_seeds=16, replication=Replication(REPLICATE_SEED, 16),
        deviations=NF_DEVIATIONS + "; the LR rises by 2e-3 a step, 0 to 1.0 over 500 steps (the paper: 5e-5 a step), "
                   "because a model this small survives far higher LRs; float32 runs fail where the paper's float16 "
                   "ones would, at the first op output above 65504 (--fp16_overflow_fails), unless nanonorm's "
                   "divergence rules stop them first; the step at which a run fails is chaotic: it moves with the "
                   "thread count and the CPU, by as much as the spread table below measures",
        gpu_deviations="12 x 768 (the paper's 125M shape), float16 with GradScaler, the LR rising by 5e-5 a step "
                       "as in final Fig. 5; 65K tokens a step (the paper: 524K); " + GPU_DATA,
        figure="ramp"),
    "normformer_lr": Recipe(
        title="NormFormer is less sensitive to the LR than the baseline (Wortsman et al.'s LR sensitivity)",
        paper="NormFormer arXiv v1 §4 (final version: §6), measured as Wortsman et al. 2023 §2 do",
        quote="NormFormer models [...] reach a higher peak learning rate than the baseline.",
        mode="lr", variants=[NF_BASELINE, NF_NORMFORMER], reference=NF_BASELINE,
        claims=[Claim(NF_NORMFORMER, "lr_sensitivity", "better",
                      "no LR-sensitivity number in the paper; arXiv v1 Table 3: peak LR 0.0275 vs 0.02",
                      effect=0.25, relative=True, effect_source=QUARTER,
                      target_origin="nanonorm")],
        lrs=LR_GRID, flags=[*cpu(), *CURVE_TRAINING],
        # the pilot (seeds 100-102, 1 thread a run, 2026-11-28, 221 s): both arms best at 1e-2, interior; d
        # (variant - reference) -0.133, -0.142, -0.142, sd 0.0053, against a target of 0.171 (a quarter of the pilot
        # baseline's median 0.685): 6 pairs give 100% power at alpha 0.05, and 6 is the fewest whose smallest p
        # (2 / 2^6 = 0.031) is below 0.05
        tested_seeds=CURVE_SEEDS, replication=Replication(REPLICATE_SEED, CURVE_SEEDS),
        gpu_lrs=GPU_LR_GRID, gpu_flags=[*gpu(), *GPU_CURVE_TRAINING],
        deviations=NF_DEVIATIONS + "; 200 steps at each of 8 LRs from 3e-4 to 1 (the paper reports the LR stability "
                   "test, not an LR sweep; the sweep and its statistic are Wortsman et al.'s)",
        gpu_deviations="12 x 768, 2,000 steps at each of 6 LRs from 1e-4 to 3e-2; " + GPU_DATA,
        figure="loss_vs_lr"),
    "normformer_loss": Recipe(
        title="NormFormer reaches a lower validation loss than the baseline at equal steps, each at its own best "
              "LR, and evens out the gradients across layers early in training",
        paper="NormFormer, final version: §4 (Table 1, both arms' LRs tuned), §6 (Fig. 3) and §7 (Table 5)",
        quote="Pre-LN models have the opposite behavior, with early layers instead receiving significantly larger "
              "gradients than later layers. NormFormer brings the average gradient norms closer together for "
              "different layers in the network. [...] NormFormer outperforms the baseline in all settings.",
        mode="lr", variants=[NF_BASELINE, NF_NORMFORMER], reference=NF_BASELINE,
        claims=[Claim(NF_NORMFORMER, "best_loss", "better", NF_LOSS_NUMBER, effect=NF_LOSS_EFFECT,
                      effect_source=NF_LOSS_SOURCE, target_origin="paper"),
                Claim(NF_NORMFORMER, "fc2_grad_ratio@1.2e-2", "better",
                      "final Fig. 3 (arXiv v1 Fig. 3): mean |grad| of the second FC weight by layer, early in "
                      "training; no number in the text",
                      effect=0.25, relative=True, effect_source=QUARTER, target_origin="nanonorm")],
        lrs=NF_LOSS_LRS, flags=NF_LOSS_FLAGS,
        # the pilot (seeds 100-102, 2026-11-28): medians at 3e-3 .. 2.4e-2, nf_baseline 2.188 2.070 2.038 2.140,
        # nf_normformer 2.110 2.055 2.097 2.295: both optima interior; best_loss d (variant - reference) +0.017,
        # +0.027, +0.026, sd 0.0058: 8 pairs give 81% power for the 0.009 target at alpha 0.05 / 3 (the family
        # with the 128-wide claim, now normformer_loss_wide), 88% at 0.05 / 2; the gradient ratio's pilot sd 0.065
        # against a target of 0.285: 7 pairs needed
        tested_lrs={NF_BASELINE: ["1.2e-2"], NF_NORMFORMER: ["6e-3", "1.2e-2"]},
        replication=Replication(REPLICATE_SEED, 8,
                                lrs={NF_BASELINE: ["1.2e-2"], NF_NORMFORMER: ["6e-3", "1.2e-2"],
                                     NF_BASELINE + WIDE: ["6e-3"], NF_NORMFORMER + WIDE: ["3e-3"]},
                                best_lrs=NF_CHOSEN, variants=[NF_BASELINE + WIDE, NF_NORMFORMER + WIDE],
                                claims=[replace(NF_WIDE_CLAIM, reference=NF_BASELINE + WIDE), NF_WIDTH_CLAIM],
                                lr_check=NF_NEIGHBOURS),
        gpu_lrs=NF_LOSS_GPU_LRS, gpu_flags=NF_LOSS_GPU_FLAGS,
        deviations=NF_LOSS_DEVIATIONS + "; the gradient ratio is layer 0's over layer 3's mean |grad| of W_2, its "
                   "geometric mean over the telemetry steps 10-100 scored as |ln ratio|, at LR 1.2e-2; the second "
                   "width, 128, is recipe normformer_loss_wide (its pilot alone takes about as long on 2 CPU cores "
                   "as this recipe)",
        gpu_deviations=NF_LOSS_GPU_DEVIATIONS,
        figure="grad_ratio"),
    "normformer_loss_wide": Recipe(
        title="NormFormer reaches a lower validation loss than the baseline at equal steps, each at its own best LR, "
              "at a second width (128)",
        paper="NormFormer, final version: §4 (Table 1, both arms' LRs tuned) and §7 (Table 5)",
        quote="NormFormer outperforms the baseline in all settings.",
        mode="lr", variants=[NF_BASELINE + WIDE, NF_NORMFORMER + WIDE], reference=NF_BASELINE + WIDE,
        claims=[NF_WIDE_CLAIM],
        # the first pilot (seeds 100-102, 1 thread a run, 2026-11-28, 1,041 s): NormFormer best at 3e-3, the grid's
        # lowest, so the grid extended down to 1.5e-3 before any tested seed (257 s more): NormFormer best at 3e-3,
        # the baseline at 6e-3, both interior; best_loss d (variant - reference) -0.089, -0.047, -0.006, sd 0.041
        # against the paper's 0.009: about 170 pairs would give 80% power (normal approximation), so at this scale
        # the claim cannot be decided; 6 tested seeds, the fewest whose smallest p (0.031) is below 0.05, give 5%
        tested_seeds=6, tested_lrs={NF_BASELINE + WIDE: ["6e-3"], NF_NORMFORMER + WIDE: ["3e-3"]},
        lrs=["1.5e-3", *NF_LOSS_LRS], flags=NF_LOSS_FLAGS, gpu_lrs=NF_LOSS_GPU_LRS, gpu_flags=NF_LOSS_GPU_FLAGS,
        deviations=NF_LOSS_DEVIATIONS.replace("4 layers x 64 wide", "4 layers x 128 wide (4 heads of 32)").replace(
            "best LR of four, 3e-3 to 2.4e-2", "best LR of five, 1.5e-3 to 2.4e-2") + "; the pilot's first grid, 3e-3 "
                   "to 2.4e-2, put NormFormer's best at its lowest LR, so the grid was extended to 1.5e-3 before the "
                   "tested seeds ran; 6 tested seeds, the fewest whose smallest p is below 0.05, ran at each arm's "
                   "chosen LR only, whatever power the pilot's spread gave (the claim's lines below)",
        gpu_deviations=NF_LOSS_GPU_DEVIATIONS, figure="metric"),
    "spike_no_more": Recipe(
        title="Scaled Embed and Embed LN keep the first layers' gradients from growing, and spike less than "
              "Vanilla at a high LR",
        paper="Spike No More (Takase et al.) §3.2 (Fig. 3), §4.3 (Fig. 4-5)",
        quote="This figure indicates that the gradient exponentially increases especially in shallow layers in "
              "Vanilla that uses the scaled initialization [...] our modifications prevent the exploding gradients. "
              "[...] Vanilla and Embed Detach faced loss and gradient spikes. In contrast, Embed LN and Scaled Embed "
              "did not face spikes.",
        mode="lr", variants=[SNM_VANILLA, SNM_SCALED_EMBED, SNM_EMBED_LN], reference=SNM_VANILLA,
        claims=[Claim(v, "grad_ratio@1e-3", "better",
                      "Fig. 3: the gradient norms of Vanilla grow toward the shallow layers, the modified ones stay "
                      "flat; no number in the text",
                      effect=0.25, relative=True, effect_source=QUARTER, target_origin="nanonorm")
                for v in (SNM_SCALED_EMBED, SNM_EMBED_LN)]
        # descriptive: the pilot's spike counts (sd 4.5 and 3.2 a pair) give 3-4% power for one spike fewer a run
        # at 7 pairs, and two such claims in the family would double Holm's penalty on the gradient claims
        + [Claim(v, "spikes@1e-1", "better", "Fig. 4-5: Vanilla spikes, Embed LN and Scaled Embed do not",
                 effect=1.0, target_origin="nanonorm", tested=False,
                 effect_source="Fig. 4-5: spikes against none; one spike fewer a run is nanonorm's choice")
           for v in (SNM_SCALED_EMBED, SNM_EMBED_LN)],
        lrs=["1e-3", "1e-1"],
        # the pilot (seeds 100-102, 1 thread a run, 2026-11-28): grad_ratio d (variant - reference) Scaled Embed
        # -0.625, -0.575, -0.493, sd 0.067, Embed LN -0.743, -0.734, -0.679, sd 0.035, against a target of 0.189
        # (a quarter of the pilot Vanilla's median 0.754): 7 pairs give 98% and 100% power at alpha 0.05 / 2, and 7
        # is the fewest whose smallest p (2 / 2^7 = 0.016) is below 0.025
        tested_seeds=7, replication=Replication(REPLICATE_SEED, 7),
        flags=[*cpu(), *SNM_TRAINING, "--max_iters=400", "--eval_interval=400", CURVE_EVAL, "--warmup_iters=40",
               "--telemetry_interval=10", "--spike_window=50"],
        gpu_lrs=["5e-4", "5e-3"], gpu_flags=[*gpu(24, 1024, 16), *SNM_TRAINING, "--max_iters=5000",
                                             "--eval_interval=1000", "--warmup_iters=500", "--telemetry_interval=50",
                                             "--dtype=float16"],
        deviations="4 layers x 64 wide, where the init sigma sqrt(2/5d) = 0.079 (the paper: 24 x 1024 and 24 x 2304, "
                   "sigma 0.020 and 0.013, so its embeddings are smaller still), 64 byte tokens of the Python standard "
                   "library a sequence (the paper: 2,048 GPT-2 BPE tokens of C4), 512 tokens a step, float32 on CPU, "
                   "400 steps (the paper: 35,000); the gradient ratio is layer 0's over layer 3's gradient L2 norm "
                   "(every parameter of the layer), its geometric mean over the telemetry steps 10-100 scored as "
                   "|ln ratio| (0: even), at LR 1e-3 (the "
                   "paper's Fig. 3 reads it at initialization); spikes are the spike monitor's (z above 5 over a "
                   "50-step window) at LR 1e-1, near where Vanilla failed in nanonorm's earlier LR ramp (about 0.2), "
                   "shown as descriptive rows (no design of this size has power for them)",
        gpu_deviations="24 x 1024 (the paper's 350M shape), float16 with GradScaler, 5,000 steps at LRs 5e-4 and "
                       "5e-3; " + GPU_DATA,
        figure="grad_ratio"),
    "deepnorm_depth": Recipe(
        title="Deep Post-LN fails to train where DeepNorm trains, and the gap grows with depth",
        paper="DeepNet (Wang et al. 2022), as the annotated implementation in papers/ states it",
        quote="The paper proposes a method to stabilize extremely deep transformers through a new normalizing function "
              "to replace LayerNorm and a weight initialization scheme. This combines the performance of "
              "Post-LayerNorm and the stability of Pre-LayerNorm.",
        mode="lr", variants=[depth(v, n) for n in DN_DEPTHS for v in (DN_POSTLN, DN_DEEPNORM)],
        reference=depth(DN_POSTLN, 6),
        # each depth's arms at their own bracketed best LR; 6 layers is the control: the paper predicts no gap there
        claims=[Claim(depth(DN_DEEPNORM, n), "best_loss", "better",
                      "no number in papers/ (the folder holds the annotated implementation, not the paper's tables)",
                      effect=0.5, reference=depth(DN_POSTLN, n), target_origin="nanonorm",
                      effect_source="the mechanism: a Post-LN model that fails stays on the unigram plateau "
                                    "(about 3.1 nats here) where a trained one is below 2.6; 0.5 nats is nanonorm's "
                                    "choice")
                for n in DN_DEPTHS[1:]]
        + [Claim(depth(DN_DEEPNORM, 36), "best_loss", "better",
                 "the paper's claim is about depth: Post-LN degrades as depth grows, DeepNorm does not",
                 effect=0.25, reference=depth(DN_POSTLN, 36), minus=(depth(DN_DEEPNORM, 6), depth(DN_POSTLN, 6)),
                 target_origin="nanonorm",
                 effect_source="nanonorm's choice: half of the per-depth effect"),
           Claim(depth(DN_DEEPNORM, 6), "best_loss", "better",
                 "the paper's 6-layer models: Post-LN trains, no gap expected",
                 effect=0.5, reference=depth(DN_POSTLN, 6), target_origin="nanonorm", tested=False, control=True,
                 effect_source="the per-depth target, for scale")],
        # the first pilot (seeds 100-102 at 1e-3, 2e-3 and 4e-3, 1 thread a run, 2026-11-28, 973 s): DeepNorm best at
        # 4e-3, the grid's top edge, at every depth; Post-LN best at 2e-3 at 6 layers and on the unigram plateau
        # (3.186-3.188) at every LR at 18 and 36: the grid extended both ways before any tested seed, up for
        # DeepNorm's optimum and down to 5e-4 (the paper's LR) so that deep Post-LN has the LRs where it might train
        lrs=["5e-4", "1e-3", "2e-3", "4e-3", "8e-3", "1.6e-2"],
        # the extended pilot (the same seeds at 5e-4, 8e-3 and 1.6e-2, 1,086 s more): every arm's best interior,
        # DeepNorm 8e-3 at 6 layers and 4e-3 at 18 and 36, Post-LN 2e-3 at every depth (at 18 and 36 on the plateau
        # at every LR, 3.186-3.196); best_loss d (variant - reference) -0.803, -0.811, -0.806 at 18 layers (sd
        # 0.0042), -0.799, -0.776, -0.772 at 36 (sd 0.015), both against a 0.5 target, and -0.652, -0.647, -0.644
        # for the gap's growth from 6 to 36 layers (sd 0.0039, target 0.25): 7 pairs give 100% power at alpha
        # 0.05 / 3, and 7 is the fewest whose smallest p (2 / 2^7 = 0.016) is below 0.017; the tested seeds run
        # only each arm's chosen LR
        tested_seeds=7,
        tested_lrs=DN_CHOSEN,
        # the replicate: each arm at its chosen LR; no grid check, as the grid's 2x step moves a loss by far less
        # than the 0.5 target (the pilot's neighbours of each chosen LR: within 0.05 of it)
        replication=Replication(REPLICATE_SEED, 7, lrs=DN_CHOSEN,
                                best_lrs={v: lrs[0] for v, lrs in DN_CHOSEN.items()}),
        flags=[*cpu(n_embd=64), "--max_iters=300", "--eval_interval=300", LOSS_EVAL, "--warmup_iters=100",
               "--dropout=0"],
        gpu_lrs=["5e-4", "1e-3", "2e-3"],
        gpu_flags=[*gpu(n_embd=256, n_head=8), "--max_iters=2000", "--eval_interval=1000", "--warmup_iters=400"],
        deviations="a decoder-only language model 64 wide at 6, 18 and 36 layers (the paper: encoder-decoder "
                   "translation models of up to 1,000 layers), 64 byte tokens of the Python standard library a "
                   "sequence, float32 on CPU, 300 steps with 100 warmup steps (the paper: 5e-4 with 4,000 warmup "
                   "steps for its translation models); each depth's Post-LN and DeepNorm at their own best LR of "
                   "5e-4 to 1.6e-2 (2x apart) on the 3 pilot seeds, which are never tested (the pilot's first grid, "
                   "1e-3 to 4e-3, put DeepNorm's best at its top edge at every depth, so the grid was extended both "
                   "ways before the tested seeds ran); the 6-layer row is "
                   "a control outside Holm's family (the paper predicts no gap there); a run has left the unigram "
                   "plateau when its final val loss is below 0.9 x the val split's unigram entropy",
        gpu_deviations="a decoder-only model 256 wide at 6, 18 and 36 layers, 2,000 steps with 400 warmup, each arm "
                       "at its best of LRs 5e-4 to 2e-3 on the pilot seeds; " + GPU_DATA,
        figure="depth"),
    "powernorm": Recipe(
        title="PowerNorm beats LayerNorm; BatchNorm and PN-V fall behind it (pre-norm, the same hyperparameters)",
        paper="PowerNorm (Shen et al. 2020) abstract, §3 (Fig. 2-3), §5, Tables 1-2",
        quote="We extensively test PN for transformers on a range of NLP tasks, and we show that it significantly "
              "outperforms both LN and BN. [...] Using PN-V instead of BN significantly improves the performance, "
              "but LN still outperforms.",
        mode="lr", variants=[PN_LAYERNORM, PN_BATCHNORM, PN_PNV, PN_POWERNORM], reference=PN_LAYERNORM,
        claims=[Claim(PN_POWERNORM, "final_loss@3e-3", "better",
                      "Table 1: BLEU 35.9 vs LN 35.5 (IWSLT14), 30.1 vs 29.5 (WMT14); Table 2: test PPL 47.6 vs 53.2 "
                      "(PTB), 17.9 vs 20.9 (WikiText-103)",
                      **ptb_target(53.2, 47.6), target_origin="paper"),
                Claim(PN_BATCHNORM, "final_loss@3e-3", "worse",
                      "Table 1: BLEU 34.4 vs LN 35.5 (IWSLT14), 28.1 vs 29.5 (WMT14); Table 2: test PPL 60.7 vs 53.2 "
                      "(PTB), 27.2 vs 20.9 (WikiText-103)",
                      **ptb_target(60.7, 53.2), target_origin="paper"),
                Claim(PN_PNV, "final_loss@3e-3", "worse",
                      "Table 1: BLEU 35.5 = LN 35.5 (IWSLT14), 28.5 vs 29.5 (WMT14); Table 2: test PPL 55.3 vs 53.2 "
                      "(PTB), 21.3 vs 20.9 (WikiText-103)",
                      **ptb_target(55.3, 53.2), target_origin="paper")],
        lrs=["1e-3", "3e-3", "1e-2"],
        # the pilot (seeds 100-102, 1 thread a run, 2026-11-28, 246 s): d (variant - reference) at 3e-3, PowerNorm
        # -0.004, -0.063, -0.032 (sd 0.030 against a 0.0169 target), BatchNorm +0.095, +0.100, +0.080 (sd 0.010,
        # target 0.0201), PN-V +0.027, +0.016, +0.019 (sd 0.0060, target 0.0059): at alpha 0.05 / 3, 16 pairs (the
        # most the exact test enumerates here) give BatchNorm 100%, PN-V 87% and PowerNorm 39% power (80% would
        # take about 32 pairs, by the normal approximation); the tested seeds run only the claims' LR, which keeps
        # 16 seeds to about 8 minutes
        tested_seeds=16, tested_lrs={v: ["3e-3"] for v in (PN_LAYERNORM, PN_BATCHNORM, PN_PNV, PN_POWERNORM)},
        replication=Replication(REPLICATE_SEED, 16, lrs={v: ["3e-3"] for v in (PN_LAYERNORM, PN_BATCHNORM, PN_PNV,
                                                                              PN_POWERNORM)}),
        flags=[*cpu(), "--max_iters=300", "--eval_interval=300", LOSS_EVAL, "--warmup_iters=30"],
        gpu_lrs=["3e-4", "1e-3", "3e-3"],
        # --min_lr at most the smallest LR: train.py refuses a cosine decay that ends above its peak
        gpu_flags=[*gpu(), "--max_iters=5000", "--eval_interval=500", "--warmup_iters=500", "--min_lr=3e-5"],
        deviations="a decoder-only language model, 4 layers x 64 wide, on 64 byte tokens of the Python standard "
                   "library a sequence and 8 sequences a step (the paper: translation models on IWSLT14 and WMT14, "
                   "and a tensorized-transformer LM on PTB and WikiText-103), 300 steps with 30 warmup, float32 on "
                   "CPU; the claims are read at LR 3e-3, fixed before the runs (the paper keeps LN's hyperparameters "
                   "for every norm), the other two LRs are shown, not tested, and run on the 3 pilot seeds only; "
                   "batch statistics in a "
                   "causal LM let a token's training normalizer see other tokens of the batch, future ones included: "
                   "the page shows each batch-statistic arm's validation loss with training-mode (batch) "
                   "statistics beside its eval-mode (running) one, on the same windows, to separate that leakage "
                   "from the paper's mechanism",
        gpu_deviations="12 x 768 decoder-only LM, 5,000 steps with 500 warmup; batch statistics see the batch's "
                       "future tokens in training; " + GPU_DATA,
        figure="loss_vs_lr"),
    "qk_norm_lr": Recipe(
        title="qk-layernorm lowers the LR sensitivity",
        paper="Wortsman et al. 2023, \"Small-scale proxies for large-scale Transformer training instabilities\" §3.1 "
              "(attention-logit growth, Fig. 1); not in papers/, so paraphrased",
        quote="(paraphrase) At high learning rates the attention logits of small models grow without bound and "
              "training becomes unstable; qk-layernorm prevents it, and so lowers the LR sensitivity.",
        mode="lr", variants=[QK_BASELINE, QK_NORM], reference=QK_BASELINE,
        claims=[Claim(QK_NORM, "lr_sensitivity", "better", "no number quoted here (the paper is not in papers/)",
                      effect=0.25, relative=True, effect_source=QUARTER,
                      target_origin="nanonorm")],
        lrs=LR_GRID, flags=[*cpu(), *CURVE_TRAINING],
        # the pilot (seeds 100-102, 1 thread a run, 2026-11-28, 186 s): both arms best at 3e-3, interior; d
        # (variant - reference) -0.028, -0.006, +0.224, sd 0.139, against a target of 0.157 (a quarter of the pilot
        # baseline's median 0.630): 6 pairs would give 45% power at alpha 0.05, 9 give 80%
        tested_seeds=9, replication=Replication(REPLICATE_SEED, 9),
        gpu_lrs=GPU_LR_GRID, gpu_flags=[*gpu(), *GPU_CURVE_TRAINING],
        deviations="4 layers x 64 wide (the paper sweeps models of many sizes, far larger), 64 byte tokens of the "
                   "Python standard library a sequence, 200 steps at each of 8 LRs from 3e-4 to 1 (the paper: far "
                   "longer runs), float32 on CPU, weight decay 0.1",
        gpu_deviations="12 x 768, 2,000 steps at each of 6 LRs from 1e-4 to 3e-2; " + GPU_DATA,
        figure="loss_vs_lr"),
    "z_loss_lr": Recipe(
        title="z-loss lowers the LR sensitivity where weight decay is off",
        paper="Wortsman et al. 2023, \"Small-scale proxies for large-scale Transformer training instabilities\" §3.2 "
              "(output-logit divergence); not in papers/, so paraphrased",
        quote="(paraphrase) Without weight decay the output logits drift until log Z is far from 0 and the loss "
              "diverges at high LRs; the z-loss (coefficient 1e-4, as PaLM) prevents it.",
        mode="lr", variants=[WD0_BASELINE, WD0_Z_LOSS], reference=WD0_BASELINE,
        claims=[Claim(WD0_Z_LOSS, "lr_sensitivity", "better", "no number quoted here (the paper is not in papers/)",
                      effect=0.25, relative=True, effect_source=QUARTER,
                      target_origin="nanonorm"),
                # the mechanism: without a drift of the baseline's log Z there is nothing for z-loss to fix, and
                # "not detected" above could not tell "no effect" from "no problem"
                Claim(WD0_Z_LOSS, "log_z@1e-1", "better",
                      "the paper's mechanism: |log Z| drifts from 0 without weight decay; no number quoted here",
                      effect=1.0, target_origin="nanonorm", tested=False,
                      effect_source="a drift of 1 nat in |mean log Z| is nanonorm's choice")],
        lrs=LR_GRID, flags=[*cpu(), *CURVE_TRAINING, "--telemetry_interval=50"],
        # the pilot (seeds 100-102, 1 thread a run, 2026-11-28, 190 s): both arms best at 3e-3, interior; d
        # (variant - reference) -0.011, -0.020, -0.018, sd 0.0047, against a target of 0.167 (a quarter of the pilot
        # baseline's median 0.667): 6 pairs give 100% power at alpha 0.05, and 6 is the fewest whose smallest p
        # (2 / 2^6 = 0.031) is below 0.05; the baseline's |mean log Z| at LR 1e-1: 5.42, 5.38, 5.23
        tested_seeds=CURVE_SEEDS, replication=Replication(REPLICATE_SEED, CURVE_SEEDS),
        gpu_lrs=GPU_LR_GRID, gpu_flags=[*gpu(), *GPU_CURVE_TRAINING, "--telemetry_interval=500"],
        deviations="4 layers x 64 wide (the paper sweeps models of many sizes, far larger), 64 byte tokens of the "
                   "Python standard library a sequence, 200 steps at each of 8 LRs from 3e-4 to 1 (the paper: far "
                   "longer runs), float32 on CPU; the baseline's |mean log Z| at the end of its LR-1e-1 runs is "
                   "shown beside the claim, as the check that there was a drift to prevent; both arms without "
                   "weight decay, where the paper sees the divergence",
        gpu_deviations="12 x 768, 2,000 steps at each of 6 LRs from 1e-4 to 3e-2, no weight decay; " + GPU_DATA,
        figure="loss_vs_lr"),
}


def settings(name, scale="cpu", pilot_only=False):
    """What sweep.py runs for a recipe: variants, LRs, seeds (first_seed .. first_seed + seeds - 1; with
    pilot_only, the pilot seeds alone), mode, reference, claims and every run's flags."""
    recipe = RECIPES[name]
    on_gpu = scale == "gpu"
    return dict(variants=list(recipe.variants), lrs=list(recipe.gpu_lrs if on_gpu else recipe.lrs),
                seeds=recipe.pilot if pilot_only else recipe.seeds, first_seed=recipe.first_seed, mode=recipe.mode,
                reference=recipe.reference,
                claims=list(recipe.claims), train_argv=list(recipe.gpu_flags if on_gpu else recipe.flags),
                tested_lrs=None if on_gpu or recipe.tested_lrs is None else dict(recipe.tested_lrs))


def replication_settings(name):
    """What sweep.py runs for a recipe's replication (Replication; CPU scale): settings() with the fresh seeds, no
    pilot, the replicate's extra arms and claims, every arm's LRs for every seed (run_lrs) and the grid check's
    (check_lrs, on the first check_seeds seeds), and each arm's LR for a best_loss claim (best_lrs)."""
    recipe, rep = RECIPES[name], RECIPES[name].replication
    base = settings(name)
    variants = [*base["variants"], *rep.variants]
    run_lrs = {v: list(rep.lrs[v]) if rep.lrs else list(recipe.lrs) for v in variants}
    check_lrs = {v: list(lrs) for v, lrs in (rep.lr_check or {}).items()}
    every = {lr for lrs in [*run_lrs.values(), *check_lrs.values()] for lr in lrs}
    return {**base, "variants": variants, "lrs": sorted(every, key=float), "seeds": rep.seeds,
            "first_seed": rep.first_seed, "claims": [*base["claims"], *rep.claims], "tested_lrs": None,
            "run_lrs": run_lrs, "check_lrs": check_lrs, "check_seeds": rep.check_seeds if check_lrs else 0,
            "best_lrs": dict(rep.best_lrs) if rep.best_lrs else None}


def command(name, scale="cpu", jobs=1, stage=None):
    """The command that runs the recipe (no machine paths: it writes into sweeps/<name>)."""
    return " ".join(["python sweep.py", f"--recipe={name}", *(["--scale=gpu"] if scale == "gpu" else []),
                     *(["--replicate"] if stage == REPLICATION else []), *([f"--jobs={jobs}"] if jobs > 1 else [])])


def describe(name, scale="cpu", jobs=1, stage=None):
    """The recipe as summary.json records it: everything the results page says about the claim; stage=REPLICATION:
    its fresh-seed replicate's (replication_settings), which records no pilot."""
    recipe = RECIPES[name]
    replicate = stage == REPLICATION
    ran = replication_settings(name) if replicate else settings(name, scale)
    return {**ran, "name": name, "order": list(RECIPES).index(name), "scale": scale,
            "title": recipe.title, "paper": recipe.paper, "quote": recipe.quote,
            "deviations": recipe.gpu_deviations if scale == "gpu" else recipe.deviations,
            "figure": recipe.figure, "command": command(name, scale, jobs, stage),
            "seed_list": list(range(ran["first_seed"], ran["first_seed"] + ran["seeds"])),
            "pilot": 0 if replicate else recipe.pilot, "chaotic": recipe.chaotic,
            "recipe_argv": list(recipe.gpu_flags if scale == "gpu" else recipe.flags),
            "claims": [vars(claim) for claim in ran["claims"]], **({"stage": REPLICATION} if replicate else {})}


def sweep_stage(pilot, replicate):
    """The stage of a recipe's sweep (sweep.py records it with its design hash, lab/summary.py in its summary): its
    pilot, its seeds (pilot and tested), or its fresh-seed replicate."""
    return "pilot" if pilot else REPLICATION if replicate else "all seeds"


def design_hash(name, scale="cpu", stage=None):
    """sha256 of the recipe's design as describe() records it (the replicate's with stage=REPLICATION): sweep.py
    records it before the runs start."""
    return described_hash(describe(name, scale, stage=stage))


def described_hash(described):
    """sha256 of a design as describe() records it (or a summary holds it: lab/schema checks the one it records),
    less what changes neither the runs nor their judgement (the command's --jobs, the recipe's place on the page)."""
    record = {k: v for k, v in described.items() if k not in ("command", "order")}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
