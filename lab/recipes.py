"""
One named recipe per claim of a paper, and the statistics that judge it. sweep.py runs a recipe:
    python sweep.py --recipe=normformer_stability              # here, on 2 CPU cores
    python sweep.py --recipe=normformer_stability --dry_run    # the train.py commands, for a cluster
    python sweep.py --recipe=normformer_stability --scale=gpu  # the same claim at a GPU-sized scale
and `python plot.py --experiments=sweeps --out=docs` writes docs/experiments.md from the recipes' summaries.

A recipe states the paper's claim (quoted, with the paper's version and its table or figure), the paper's number,
the variants it compares with a reference variant of the same model context, the metric and the direction the
paper states, its seeds, flags and LRs, and how it departs from the paper's protocol (size, steps, dtype, data).

The verdict on a claim comes from an exact two-sided permutation test of the seeds' values (lab/stats.py): "agrees" or
"disagrees" with the paper's direction only at p < 0.05, else "inconclusive at this scale". With n seeds a side
the smallest p is 2 / C(2n, n): 0.1 at 3 seeds, 0.029 at 4, 0.0079 at 5, so every recipe runs at least 4.
"""

import math
import statistics
from dataclasses import dataclass, field

from lab.stats import ALPHA, doubled_ranks, permutation_p, smallest_p  # noqa: F401 (used by callers as recipes.X)

# the direction in which each metric is better (sweep.py's metric names, before the "@LR")
BETTER = {"steps_survived": "higher", "peak_lr": "higher", "final_loss": "lower", "best_loss": "lower",
          "spikes": "lower", "attn_logit_max": "lower", "log_z": "lower"}


def spread(values):
    """Median, min and max; inf (a diverged run) stays inf."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def compare(values, reference, better, expect="better"):
    """A variant's values against its reference's, over seeds. better: "higher" or "lower" (the metric);
    expect: "better" or "worse", the paper's direction for the variant. Returns the medians, [min, max] and n
    of each side, the difference of medians, the exact p, which side ranks better, and the verdict."""
    ours, theirs = spread(values), spread(reference)
    with_inf = math.isinf(ours["median"]) and math.isinf(theirs["median"])
    difference = None if with_inf else ours["median"] - theirs["median"]
    p = permutation_p(values, reference)
    # the direction is read from the rank sums, the statistic the p-value is about
    ranks = doubled_ranks([float(v) for v in [*values, *reference]])
    lean = sum(ranks[:len(values)]) - len(values) * (len(values) + len(reference) + 1)
    side = "same" if lean == 0 else ("better" if (lean > 0) == (better == "higher") else "worse")
    return {"variant_values": ours, "reference_values": theirs, "median_difference": difference, "p": float(p),
            "p_exact": f"{p.numerator}/{p.denominator}", "smallest_p": float(smallest_p(len(values), len(reference))),
            "observed": side, "expect": expect, "verdict": verdict(p, side, expect)}


def verdict(p, side, expect):
    """agrees / disagrees with the expected direction only at p < 0.05; otherwise inconclusive."""
    if p >= ALPHA:
        return "inconclusive at this scale"
    return "agrees" if side == expect else "disagrees"


@dataclass
class Claim:
    """One comparison the paper makes: variant against the recipe's reference on a metric, in a direction."""
    variant: str
    metric: str  # a sweep.py metric: steps_survived@LR, final_loss@LR, best_loss, attn_logit_max@LR, log_z@LR
    expect: str  # "better" or "worse" than the reference, as the paper states
    paper_number: str  # the paper's own figures for this comparison, with where they are


@dataclass
class Recipe:
    """A claim, the paper's protocol for it shrunk to 2 CPU cores, and the same at GPU size (`gpu_flags` and
    `gpu_lrs` replace `flags` and `lrs`)."""
    title: str
    paper: str  # the paper, its version, and the table or figure the claim is in
    quote: str  # the paper's words
    mode: str  # sweep.py --mode: ramp or lr
    variants: list
    reference: str  # compared with every other variant (with its +key=value overrides where one exists: sweep.py)
    claims: list
    lrs: list
    flags: list
    seeds: int = 5
    gpu_lrs: list = field(default_factory=list)
    gpu_flags: list = field(default_factory=list)
    deviations: str = ""
    gpu_deviations: str = ""
    figure: str = "metric"  # ramp (loss along the LR ramp), loss_vs_lr, logits (over steps), metric (seed values)


def cpu(n_layer=4, n_embd=64, n_head=4):
    """Every CPU recipe's data, size and logging: the builtin corpus (the Python standard library's source, byte
    tokens) and a tiny model, so that a recipe runs its seeds in minutes on 2 cores."""
    return ["--dataset=builtin", f"--n_layer={n_layer}", f"--n_embd={n_embd}", f"--n_head={n_head}",
            "--block_size=64", "--batch_size=8", "--eval_iters=5", "--log_interval=10"]


def gpu(n_layer=12, n_embd=768, n_head=12):
    """The GPU versions: GPT-3 Small's shape, GPT-2's BPE, 65K tokens a step. The builtin corpus is a few million
    BPE tokens: give a larger one on the command line (--dataset=PATH comes after the recipe's flags and wins)."""
    return ["--dataset=builtin", "--tokenizer=gpt2", f"--n_layer={n_layer}", f"--n_embd={n_embd}",
            f"--n_head={n_head}", "--block_size=1024", "--batch_size=16", "--grad_accum=4", "--eval_iters=20",
            "--log_interval=10"]


# The variants are model.py's paper-context presets: each paper's baseline and variants in the model it used
NF_BASELINE = "nf_baseline"
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
PN_LAYERNORM = "pn_layernorm"
PN_BATCHNORM = "pn_batchnorm"
PN_PNV = "pn_pnv"
PN_POWERNORM = "pn_powernorm"
QK_BASELINE = "baseline"
QK_NORM = "qk_norm=True"
Z_LOSS = "z_loss=1e-4"

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
                      "(1.3B, 0 to 0.1 over 1,000 steps): 200 steps (row 31) vs 94 (row 14)")],
        lrs=["1.0"], flags=[*cpu(), "--max_iters=500", "--eval_interval=500", "--attn_impl=manual", "--dropout=0",
                            "--fp16_overflow_fails=True"],
        gpu_lrs=["0.05"], gpu_flags=[*gpu(), "--max_iters=1000", "--eval_interval=1000", "--attn_impl=manual",
                                     "--dropout=0", "--dtype=float16"],
        deviations=NF_DEVIATIONS + "; the LR rises by 2e-3 a step, 0 to 1.0 over 500 steps (the paper: 5e-5 a step), "
                   "because a model this small survives far higher LRs; float32 runs fail where the paper's float16 "
                   "ones would, at the first op output above 65504 (--fp16_overflow_fails), unless nanonorm's "
                   "divergence rules stop them first",
        gpu_deviations="12 x 768 (the paper's 125M shape), float16 with GradScaler, the LR rising by 5e-5 a step "
                       "as in final Fig. 5; 65K tokens a step (the paper: 524K); the builtin corpus unless "
                       "--dataset names a larger one",
        figure="ramp"),
    "normformer_loss": Recipe(
        title="NormFormer reaches a lower validation loss than the baseline at equal steps, each at its best LR",
        paper="NormFormer arXiv v1 §5, Table 7 (final version: §7, Table 5)",
        quote="NormFormer outperforms the baseline in all settings.",
        mode="lr", variants=[NF_BASELINE, NF_NORMFORMER], reference=NF_BASELINE,
        claims=[Claim(NF_NORMFORMER, "best_loss", "better",
                      "arXiv v1 Table 7, 125M at LR 0.003: valid PPL 15.98 vs 16.37 (final Table 5: 15.88 vs 16.37); "
                      "both best at LR 3e-3 (final Table 1)")],
        lrs=["3e-3", "6e-3", "1e-2", "2e-2", "4e-2"],
        flags=[*cpu(), "--max_iters=600", "--eval_interval=600", "--warmup_iters=60", "--lr_schedule=linear",
               "--min_lr=0", "--dropout=0"],
        gpu_lrs=["1e-3", "3e-3", "6e-3"],
        gpu_flags=[*gpu(), "--max_iters=5000", "--eval_interval=500", "--warmup_iters=500", "--lr_schedule=linear",
                   "--min_lr=0", "--dropout=0"],
        deviations=NF_DEVIATIONS + "; 600 steps with 60 warmup steps (the paper: 100,000 updates, 500 warmup), "
                   "equal steps (the paper compares equal GPU hours, where NormFormer gets 2-6% fewer steps); LRs "
                   "3e-3 to 4e-2 (the paper's grid: six LRs, 6e-5, 3e-4, 6e-4, 1e-3, 3e-3 and 6e-3, arXiv v1 "
                   "§2.2), as a model this small trains best higher",
        gpu_deviations="12 x 768 (the paper's 125M shape), bfloat16 where the GPU has it, 5,000 steps with 500 "
                       "warmup (the paper: 100,000), 65K tokens a step; the builtin corpus unless --dataset names a "
                       "larger one",
        figure="loss_vs_lr"),
    "spike_no_more": Recipe(
        title="Scaled Embed and Embed LN train at LRs where Vanilla (scaled init alone) fails",
        paper="Spike No More (Takase et al.) §1, §4.3 (Fig. 4-5) and §5.1 (Fig. 6-7, Table 2)",
        quote="Additionally, we demonstrate that a method satisfying the requirement enables LLMs to be pre-trained "
              "with a comparatively larger learning rate, culminating in superior performance outcomes.",
        mode="ramp", variants=[SNM_VANILLA, SNM_SCALED_EMBED, SNM_EMBED_LN], reference=SNM_VANILLA,
        claims=[Claim(SNM_SCALED_EMBED, "steps_survived@1.0", "better",
                      "§5.1, Table 2 (1.7B): Vanilla N/A (its gradient exploded) at the largest LR, where Scaled "
                      "Embed reaches WikiText PPL 20.95; Table 1 (1.7B): 21.29 vs Vanilla 22.58"),
                Claim(SNM_EMBED_LN, "steps_survived@1.0", "better",
                      "§4.3, Fig. 4-5: Vanilla spikes, Embed LN does not; Table 1 (1.7B): WikiText PPL 21.29 vs "
                      "Vanilla 22.58")],
        lrs=["1.0"], flags=[*cpu(), *SNM_TRAINING, "--max_iters=500", "--eval_interval=500", "--attn_impl=manual",
                            "--fp16_overflow_fails=True"],
        gpu_lrs=["0.05"], gpu_flags=[*gpu(24, 1024, 16), *SNM_TRAINING,
                                     "--max_iters=1000", "--eval_interval=1000", "--attn_impl=manual",
                                     "--dtype=float16"],
        deviations="4 layers x 64 wide, where the init sigma sqrt(2/5d) = 0.079 (the paper: 24 x 1024 and 24 x 2304, "
                   "sigma 0.020 and 0.013, so its embeddings are smaller still), 64 byte tokens of the Python standard "
                   "library a sequence (the paper: 2,048 GPT-2 BPE tokens of C4), 512 tokens a step, float32 on CPU "
                   "failing at the first op output above 65504 (the paper: float16); the paper trains at fixed LRs "
                   "for 35,000 steps and watches for spikes, here an LR ramp 0 to 1.0 over 500 steps (NormFormer's "
                   "stability test) measures the LR each survives",
        gpu_deviations="24 x 1024 (the paper's 350M shape), float16 with GradScaler, an LR ramp 0 to 0.05 over "
                       "1,000 steps (the paper: fixed LRs, 35,000 steps); the builtin corpus unless --dataset names "
                       "a larger one",
        figure="ramp"),
    "deepnorm_depth": Recipe(
        title="DeepNorm survives a higher LR than Post-LN, the more so the deeper the model",
        paper="DeepNet (Wang et al. 2022), as the annotated implementation in papers/ states it",
        quote="The paper proposes a method to stabilize extremely deep transformers through a new normalizing function "
              "to replace LayerNorm and a weight initialization scheme. This combines the performance of "
              "Post-LayerNorm and the stability of Pre-LayerNorm.",
        mode="ramp", variants=[f"{v}+n_layer={n}" for n in (6, 18, 36) for v in (DN_POSTLN, DN_DEEPNORM)],
        reference=f"{DN_POSTLN}+n_layer=6",
        claims=[Claim(f"{DN_DEEPNORM}+n_layer={n}", "steps_survived@1.5", "better",
                      "no number in papers/ (the folder holds the annotated implementation, not the paper's tables)")
                for n in (6, 18, 36)],
        lrs=["1.5"], flags=[*cpu(n_embd=32), "--max_iters=300", "--eval_interval=300", "--attn_impl=manual",
                            "--fp16_overflow_fails=True"],
        gpu_lrs=["0.05"], gpu_flags=[*gpu(n_embd=256, n_head=8), "--max_iters=1000", "--eval_interval=1000",
                                     "--attn_impl=manual", "--dtype=float16"],
        deviations="a decoder-only language model 32 wide at 6, 18 and 36 layers (the paper: encoder-decoder "
                   "translation models of up to 1,000 layers), 64 byte tokens of the Python standard library a "
                   "sequence, float32 on CPU failing at the first op output above 65504 (float16's range); "
                   "stability measured by an LR ramp 0 to 1.5 over 300 steps (NormFormer's test), not by training "
                   "at the paper's LR and warmup",
        gpu_deviations="a decoder-only model 256 wide at 6, 18 and 36 layers, float16 with GradScaler, an LR ramp "
                       "0 to 0.05 over 1,000 steps; the builtin corpus unless --dataset names a larger one",
        figure="metric"),
    "powernorm": Recipe(
        title="PowerNorm beats LayerNorm; BatchNorm and PN-V fall behind it (pre-norm, the same hyperparameters)",
        paper="PowerNorm (Shen et al. 2020) abstract, §5, Tables 1-2",
        quote="We extensively test PN for transformers on a range of NLP tasks, and we show that it significantly "
              "outperforms both LN and BN. [...] Using PN-V instead of BN significantly improves the performance, "
              "but LN still outperforms.",
        mode="lr", variants=[PN_LAYERNORM, PN_BATCHNORM, PN_PNV, PN_POWERNORM], reference=PN_LAYERNORM,
        claims=[Claim(PN_POWERNORM, "final_loss@3e-3", "better",
                      "Table 1: BLEU 35.9 vs LN 35.5 (IWSLT14), 30.1 vs 29.5 (WMT14); Table 2: test PPL 47.6 vs 53.2 "
                      "(PTB), 17.9 vs 20.9 (WikiText-103)"),
                Claim(PN_BATCHNORM, "final_loss@3e-3", "worse",
                      "Table 1: BLEU 34.4 vs LN 35.5 (IWSLT14), 28.1 vs 29.5 (WMT14); Table 2: test PPL 60.7 vs 53.2 "
                      "(PTB), 27.2 vs 20.9 (WikiText-103)"),
                Claim(PN_PNV, "final_loss@3e-3", "worse",
                      "Table 1: BLEU 35.5 = LN 35.5 (IWSLT14), 28.5 vs 29.5 (WMT14); Table 2: test PPL 55.3 vs 53.2 "
                      "(PTB), 21.3 vs 20.9 (WikiText-103)")],
        lrs=["3e-3"], flags=[*cpu(), "--max_iters=400", "--eval_interval=400", "--warmup_iters=40"],
        gpu_lrs=["1e-3"], gpu_flags=[*gpu(), "--max_iters=5000", "--eval_interval=500", "--warmup_iters=500"],
        deviations="a decoder-only language model, 4 layers x 64 wide, on 64 byte tokens of the Python standard "
                   "library a sequence and 8 sequences a step (the paper: translation models on IWSLT14 and WMT14, "
                   "and a tensorized-transformer LM on PTB and WikiText-103), 400 steps, float32 on CPU; batch "
                   "statistics in a causal LM let a token's training normalizer see other tokens of the batch, "
                   "future ones included (validation uses the running statistics); one LR for every norm, as the "
                   "paper keeps LN's hyperparameters",
        gpu_deviations="12 x 768 decoder-only LM, 5,000 steps with 500 warmup, one LR for every norm; batch "
                       "statistics see the batch's future tokens in training; the builtin corpus unless --dataset "
                       "names a larger one",
        figure="metric"),
    "qk_norm_z_loss": Recipe(
        title="qk-layernorm keeps the attention logits small, and z-loss keeps log Z near 0, at a high LR",
        paper="Wortsman et al. 2023, \"Small-scale proxies for large-scale Transformer training instabilities\" §3.1 "
              "(attention-logit growth) and §3.2 (output-logit divergence); not in papers/, so paraphrased",
        quote="(paraphrase) At high learning rates the attention logits of small models grow without bound and "
              "training becomes unstable; qk-layernorm prevents it. The output logits drift until log Z is far "
              "from 0; the z-loss (coefficient 1e-4, as PaLM) prevents it.",
        mode="lr", variants=[QK_BASELINE, QK_NORM, Z_LOSS], reference=QK_BASELINE,
        claims=[Claim(QK_NORM, "attn_logit_max@3e-2", "better", "no number quoted here (the paper is not in papers/)"),
                Claim(Z_LOSS, "log_z@3e-2", "better", "no number quoted here (the paper is not in papers/)")],
        lrs=["3e-2"], flags=[*cpu(), "--max_iters=400", "--eval_interval=400", "--warmup_iters=40",
                             "--attn_impl=manual", "--telemetry_interval=50"],
        gpu_lrs=["3e-2"], gpu_flags=[*gpu(), "--max_iters=5000", "--eval_interval=500", "--warmup_iters=500",
                                     "--attn_impl=manual", "--telemetry_interval=100"],
        deviations="4 layers x 64 wide (the paper sweeps models of many sizes, far larger), 64 byte tokens of the "
                   "Python standard library a sequence, 400 steps at one high LR (the paper: a grid of LRs and far "
                   "longer runs), float32 on CPU; both logits read at the last telemetry step (every 50 steps)",
        gpu_deviations="12 x 768, 5,000 steps with 500 warmup at one high LR (the paper: a grid of LRs); the "
                       "builtin corpus unless --dataset names a larger one",
        figure="logits"),
}


def settings(name, scale="cpu"):
    """What sweep.py runs for a recipe: variants, LRs, seeds, mode, reference, claims and every run's flags."""
    recipe = RECIPES[name]
    on_gpu = scale == "gpu"
    return dict(variants=list(recipe.variants), lrs=list(recipe.gpu_lrs if on_gpu else recipe.lrs),
                seeds=recipe.seeds, mode=recipe.mode, reference=recipe.reference, claims=list(recipe.claims),
                train_argv=list(recipe.gpu_flags if on_gpu else recipe.flags))


def command(name, scale="cpu", jobs=1):
    """The command that runs the recipe (no machine paths: it writes into sweeps/<name>)."""
    return " ".join(["python sweep.py", f"--recipe={name}", *(["--scale=gpu"] if scale == "gpu" else []),
                     *([f"--jobs={jobs}"] if jobs > 1 else [])])


def describe(name, scale="cpu", jobs=1):
    """The recipe as summary.json records it: everything the results page says about the claim."""
    recipe = RECIPES[name]
    return {**settings(name, scale), "name": name, "order": list(RECIPES).index(name), "scale": scale,
            "title": recipe.title, "paper": recipe.paper, "quote": recipe.quote,
            "deviations": recipe.gpu_deviations if scale == "gpu" else recipe.deviations,
            "figure": recipe.figure, "command": command(name, scale, jobs),
            "claims": [vars(claim) for claim in recipe.claims]}
