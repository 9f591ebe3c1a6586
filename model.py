"""
A GPT language model in one file, with every normalization, layout, embedding and init variant of
nanonorm switched by a field of GPTConfig. Read it top to bottom: the pieces (attention, MLP, block; class Block
is where every variant meets, and where README's reading order starts), then GPTConfig (every model flag declared
once: default, allowed values, meaning, source), then the whole model: its initialization, embeddings, forward and
generate, and last the FLOPs count of MFU and the optimizer (configure_optimizer). The papers' names of each
operation, which the probes report, are in diagnostics/probe_points.py; the presets in presets.py.

Papers: NormFormer (Shleifer, Weston, Ott 2021, "NormFormer: Improved Transformer Pretraining with Extra
Normalization"), DeepNet (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers"), Spike No More
(Takase et al. 2023, "Spike No More: Stabilizing the Pre-training of Large Language Models") and PowerNorm
(Shen et al. 2020, "PowerNorm: Rethinking Batch Normalization in Transformers"); QK normalization from
Dehghani et al. 2023 ("Scaling Vision Transformers to 22 Billion Parameters") and Wortsman et al. 2023
("Small-scale proxies for large-scale Transformer training instabilities"). Beyond those four: DyT (Zhu et al.
2025, "Transformers without Normalization"), LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large
Language Models"), Mix-LN (Li, Yin, Liu 2025), Peri-LN (Kim et al. 2025), the reordered norm of OLMo 2 (2025),
SubLN (Magneto: Wang et al. 2023, "Foundation Transformers") and Gemma 2's logit soft-capping (2024). Comments
cite them by section, equation or table.
"""

import math
from dataclasses import dataclass, field, fields
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from norms import AFFINE, NORMS, PER_TOKEN_NORMS, make_norm, readers, upcast


def norm(cfg, dim, dyt_alpha=None):
    """The norm module chosen by --norm for a slot of `dim` features (every norm slot of the model uses it), its
    arguments set by their flags (norms.ARGUMENTS). dyt_alpha: DyT's initial alpha in this slot, if not --dyt_alpha."""
    return make_norm(cfg.norm, dim, eps=cfg.norm_eps, affine=cfg.norm_affine,
                     alpha_fwd=cfg.pn_alpha_fwd, alpha_bwd=cfg.pn_alpha_bwd, warmup=cfg.pn_warmup or 0,
                     groups=cfg.n_head if cfg.pn_group_scaling else 0, alpha0=dyt_alpha or cfg.dyt_alpha)


def block_layout(cfg, layer):
    """The layout of block `layer` (0-based). Mix-LN (Li, Yin, Liu 2025): Post-LN in the first
    mix_ln_ratio * n_layer layers (rounded half up), Pre-LN in the rest."""
    if cfg.layout != "mix":
        return cfg.layout
    # rounded half up (Python's round() would send 2.5 to 2)
    return "post" if layer < math.floor(cfg.mix_ln_ratio * cfg.n_layer + 0.5) else "pre"


def subln_gain(cfg):
    """Magneto (Wang et al. 2023, "Foundation Transformers" §2.2): with SubLN, W_v, W_O, W_1 and W_2 are initialized
    with gain gamma = sqrt(log(2N)) for a decoder-only model of N layers (torchscale: decoder_layers * 2)."""
    return math.sqrt(math.log(2 * cfg.n_layer))


def softcap(x, cap):
    """Gemma 2 §2: c * tanh(x / c), x itself where the cap is 0 (off). Smooth, |y| < c, y ~ x for |x| << c."""
    return x if not cap else cap * torch.tanh(x / cap)


def deepnorm_alpha(cfg):
    """DeepNet: x_{l+1} = LN(alpha * x_l + G(x_l)), alpha = (2N)^(1/4) for a decoder-only model."""
    return (2 * cfg.n_layer) ** 0.25


def deepnorm_beta(cfg):
    """DeepNet: the v, out-proj and FFN weights are initialized with gain beta = (8N)^(-1/4)."""
    return (8 * cfg.n_layer) ** -0.25


def dropout(cfg):
    """nn.Dropout(p), or None when p = 0: a dropout call that returns its input still costs a module call."""
    return nn.Dropout(cfg.dropout) if cfg.dropout > 0 else None


def optional(module, x):
    """module(x), or x where the module does not exist (its flag is off)."""
    return x if module is None else module(x)


def scaled(x, scale):
    """x * scale, or x itself where the scale does not exist (a multiply by 1 is still a kernel)."""
    return x if scale is None else x * scale


class AttentionScores(nn.Module):
    """s = q k^T / sqrt(hd), the attention logits of every head; with --attn_softcap=c, s = c * tanh(s / c)
    (Gemma 2 §2, before the causal mask). A module of its own so that a forward hook sees them: NormFormer
    arXiv v1 Table 3 names "q@k" as the operation that overflows first."""

    def __init__(self, cap=0.0):
        super().__init__()
        self.cap = cap

    def forward(self, q, k):
        return softcap((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))), self.cap)


class Attention(nn.Module):
    """Causal self-attention: h_i = softmax(q_i k_i^T / sqrt(hd)) v_i per head, y = Concat(h_1, ..., h_H) W_O.
    HeadScale (NormFormer arXiv v1 eq. (3)): y = Concat(gamma_1 h_1, ..., gamma_H h_H) W_O, or with
    --head_scale_at=after_proj fairseq's y = Concat(h_1, ..., h_H) W_O with its H groups of hd output channels
    times gamma_1 .. gamma_H."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        # NormFormer (final) Table 4, arXiv v1 Table 5, "+3 More LN": a norm on each of q, k and v, over all d features
        self.qkv_norm = nn.ModuleList(norm(cfg, cfg.n_embd) for _ in range(3)) if cfg.qkv_norm else None
        # QK normalization (Dehghani et al. 2023 §2; Wortsman et al. 2023 §3.1, qk-layernorm): q and k of
        # each head normalized over head_dim, which keeps the attention logits from growing
        head_dim = cfg.n_embd // cfg.n_head
        self.q_norm = norm(cfg, head_dim) if cfg.qk_norm else None
        self.k_norm = norm(cfg, head_dim) if cfg.qk_norm else None
        # NormFormer arXiv v1 eq. (3), HeadScale: one learned scalar per head, init 1
        self.head_scale = nn.Parameter(torch.ones(cfg.n_head)) if cfg.scale_heads else None
        self.head_scale_at = cfg.head_scale_at
        # Magneto's SubLN (Foundation Transformers §2.1): a norm on the concatenated heads, before W_O
        self.sub_norm = norm(cfg, cfg.n_embd) if cfg.subln else None
        # the ops written out (--attn_impl=manual), so that hooks can name the one that overflows; --attn_softcap
        # forces them too: SDPA takes no function of the scores, so the cap cannot go through it
        manual = cfg.attn_impl == "manual" or cfg.attn_softcap > 0
        self.scores = AttentionScores(cfg.attn_softcap) if manual else None
        if self.scores is not None:
            self.register_buffer("causal", torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).tril(),
                                 persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        if self.qkv_norm is not None:
            q, k, v = (n(t) for n, t in zip(self.qkv_norm, (q, k, v)))
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.scores is not None:
            y = self.manual_attention(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        if self.head_scale is not None and self.head_scale_at == "before_proj":
            y = y * self.head_scale.view(1, -1, 1, 1)  # before the concat and W_O, as in the paper (Fig. 1, right)
        y = self.proj(optional(self.sub_norm, y.transpose(1, 2).reshape(B, T, C)))
        if self.head_scale is not None and self.head_scale_at == "after_proj":
            # fairseq's NormFormer (transformer_layer.py, c_attn) scales W_O's output, viewed as H groups of hd
            # channels; NormFormer (final) §4: moved outside attention, "without noticeable performance degradation"
            y = (y.view(B, T, self.n_head, C // self.n_head) * self.head_scale.view(1, 1, -1, 1)).view(B, T, C)
        return y

    def manual_attention(self, q, k, v):
        """The same math as SDPA, one op at a time, so a hook or anomaly check can name the op that
        overflows (NormFormer arXiv v1 Table 3 reports "q@k at layer 0")."""
        T = q.size(2)
        scores = self.scores(q, k).masked_fill(~self.causal[:T, :T], float("-inf"))
        probs = F.softmax(scores, dim=-1)
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, p=self.dropout)
        return probs @ v


class ReLU2(nn.Module):
    """y = max(x, 0)^2, Primer's squared ReLU (So et al. 2021; NormFormer (final) §4's 2.7B models)."""

    def forward(self, x):
        return F.relu(x).square()


class GEGLU(nn.Module):
    """y = GELU(x W) * (x V) on the stacked projections [x W, x V] (Shazeer 2020; NormFormer (final) Table 8,
    "FFNGeGLU")."""

    def forward(self, h):
        gate, value = h.chunk(2, dim=-1)
        return F.gelu(gate) * value


ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "relu2": ReLU2, "geglu": GEGLU}


class MLP(nn.Module):
    """y = W_2 act(W_1 x); GEGLU (Shazeer 2020, NormFormer (final) Table 8 "FFNGeGLU"): y = W_2 (GELU(x W) * (x V))."""

    def __init__(self, cfg):
        super().__init__()
        hidden = cfg.ffn_mult * cfg.n_embd
        # GEGLU needs two input projections, W and V; they are stacked in one matrix (split by GEGLU)
        self.fc = nn.Linear(cfg.n_embd, 2 * hidden if cfg.activation == "geglu" else hidden, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]()
        # NormFormer "FFN LN": a norm on the 4d hidden features, after the activation, before fc2; Magneto's SubLN
        # (Foundation Transformers §2.1) puts its second extra norm in the same place (with both: one norm)
        self.fc_norm = norm(cfg, hidden) if cfg.scale_fc or cfg.subln else None
        self.proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)

    def forward(self, x):
        return self.proj(optional(self.fc_norm, self.act(self.fc(x))))


class Block(nn.Module):
    """One transformer layer. With norm N, attention A and feed-forward F (DeepNet's DeepNorm for deepnorm):
    pre:      x = x + A(N(x));           x = x + F(N(x))
    post:     x = N(x + A(x));           x = N(x + F(x))
    deepnorm: x = N(alpha*x + A(x));     x = N(alpha*x + F(x)),   alpha = (2 n_layer)^(1/4)
    reordered: x = x + N(A(x));          x = x + N(F(x))          (OLMo 2)
    mix:      post in layers l < mix_ln_ratio * n_layer (rounded half up), pre after (Mix-LN)
    LayerNorm Scaling (Sun et al. 2025, Curse of Depth), pre only: N(x) becomes N(x) / sqrt(l), l = layer + 1.
    """

    def __init__(self, cfg, layer=0):
        super().__init__()
        d = cfg.n_embd
        self.layout = block_layout(cfg, layer)
        self.alpha = deepnorm_alpha(cfg) if self.layout == "deepnorm" else None  # None: post, no multiply by 1
        # Curse of Depth: the variance of a pre-LN residual stream grows with depth and the deep layers become near
        # identities; 1/sqrt(l) on each pre-LN norm output of layer l (1-based) keeps that growth polynomial
        use_lns = cfg.layer_norm_scaling and self.layout == "pre"
        self.depth_scale = 1 / math.sqrt(layer + 1) if use_lns else None
        # DyT's LLaMA setting (Zhu et al. 2025): the attention sublayer's norm (before attention in pre) gets its own
        # alpha0 (0.8 vs 0.2 at 7B)
        self.attn_norm = norm(cfg, d, cfg.dyt_alpha_attn)
        self.attn = Attention(cfg)
        self.ffn_norm = norm(cfg, d)
        self.mlp = MLP(cfg)
        # NormFormer "post-attn LN" / CogView sandwich-LN: a norm on the attention output before the add
        self.attn_out_norm = norm(cfg, d) if cfg.scale_attn else None
        # CogView sandwich-LN: the same on the FFN output
        self.ffn_out_norm = norm(cfg, d) if cfg.ffn_out_norm else None
        # GPT-2 (Vaswani et al. §5.4): dropout on each sublayer's output, before it is added to the residual
        self.attn_dropout, self.ffn_dropout = dropout(cfg), dropout(cfg)
        # NormFormer (final) §3 ResScale: lambda_resid * x + FFN(LN(x)), one lambda per channel
        self.resid_scale = nn.Parameter(torch.full((d,), cfg.scale_resids_init)) if cfg.scale_resids else None
        # LayerScale (CaiT): x + diag(lambda) * Branch(x) on both branches, lambda small at init
        self.attn_layer_scale = nn.Parameter(torch.full((d,), cfg.layer_scale_init)) if cfg.layer_scale else None
        self.ffn_layer_scale = nn.Parameter(torch.full((d,), cfg.layer_scale_init)) if cfg.layer_scale else None

    def branch(self, x, sublayer, in_norm, out_norm, out_dropout, layer_scale):
        """Branch(x) of either sublayer: its input norm (pre layout only), the sublayer itself, the optional
        output norm (sandwich / post-attn LN), dropout and LayerScale. Dropout comes after the output norm, as
        in fairseq's NormFormer: a norm after it would undo its 1/(1-p) scaling in training, not in eval."""
        y = sublayer(scaled(in_norm(x), self.depth_scale) if self.layout == "pre" else x)
        return scaled(optional(out_dropout, optional(out_norm, y)), layer_scale)

    def forward(self, x):
        # reordered: the block's two norms are the sublayers' output norms
        reordered = self.layout == "reordered"
        attn_out, ffn_out = (self.attn_norm, self.ffn_norm) if reordered else (self.attn_out_norm, self.ffn_out_norm)
        attn = (self.attn, self.attn_norm, attn_out, self.attn_dropout, self.attn_layer_scale)
        ffn = (self.mlp, self.ffn_norm, ffn_out, self.ffn_dropout, self.ffn_layer_scale)
        if self.layout in ("pre", "reordered"):
            x = x + self.branch(x, *attn)
            return scaled(x, self.resid_scale) + self.branch(x, *ffn)
        # post and deepnorm: the norm comes after the residual sum
        x = self.attn_norm(scaled(x, self.alpha) + self.branch(x, *attn))
        return self.ffn_norm(scaled(x, self.alpha) + self.branch(x, *ffn))


def sinusoidal_positions(T, d):
    """Vaswani et al. (2017): PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(...). No parameters
    (NormFormer (final) §4 and Shortformer use them)."""
    position = torch.arange(T, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(T, d)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d // 2])
    return table


@dataclass(frozen=True)
class Range:
    """The numbers a flag means something at: low to high, each end included or not; with off, 0 too (0 turns the
    feature off). why: what lies outside, for the one line that refuses it; said: that line's words for the range,
    where they are not the catalog's ("a positive integer" for >= 1)."""
    low: float
    high: float = math.inf
    low_in: bool = True
    high_in: bool = True
    off: bool = False
    why: str = ""
    said: str = ""

    def holds(self, value):
        above = self.low <= value if self.low_in else self.low < value
        below = value <= self.high if self.high_in else value < self.high
        return (self.off and value == 0) or (above and below)

    def text(self):
        """As configurable.txt says it: "in [0, 1)", "> 0", "0 (off) or >= 1", "in [0, 2^63)"."""
        def number(x):
            return f"2^{x.bit_length() - 1}" if isinstance(x, int) and x > 2 ** 32 else f"{x:g}"
        if self.high == math.inf:
            span = f"{'>=' if self.low_in else '>'} {number(self.low)}"
        else:
            opening, closing = "[" if self.low_in else "(", "]" if self.high_in else ")"
            span = f"in {opening}{number(self.low)}, {number(self.high)}{closing}"
        return f"0 (off) or {span}" if self.off else span

    def refusal(self, name, value):
        """The one line refusing --name=value, or None where the range holds it (or it is None, an Optional's
        default)."""
        if value is None or self.holds(value):
            return None
        return f"--{name}={value} must be {self.said or self.text()}{self.why}"


POSITIVE = Range(1, said="a positive integer")


def flag(default, meaning, source, allowed=None, none=None, needs=None):
    """A config field declared once, with every fact its readers need (configurable.txt, --help, the range checks
    and the no-effect warnings read them from the field's metadata): its default; its meaning in one line; its
    source; allowed: a Range the value is held to, or the words of a rule checked where it involves other flags
    (a bool or a Literal says its values itself); none: what None means, for an Optional flag; needs: where it has
    an effect at all, a flag that must be on, or (flag, values) for a flag that must take one of the values."""
    return field(default=default, metadata={"meaning": meaning, "source": source, "allowed": allowed, "none": none,
                                            "needs": needs})


def out_of_range(config):
    """The one line refusing the first field of a config (in field order) whose Range its value breaks, or None."""
    for f in fields(config):
        allowed = f.metadata.get("allowed")
        problem = allowed.refusal(f.name, getattr(config, f.name)) if isinstance(allowed, Range) else None
        if problem:
            return problem
    return None


# DyT (Zhu et al. 2025) uses alpha0 from 0.2 to 0.8 (LLaMA) and 0.5 elsewhere: past 10, tanh(alpha0 x) of an activation
# of scale 1 is a sign function
DYT_ALPHA = Range(1e-7, 10, why=" (below 1e-7 its branch is lost in float32 beside the residual; past 10 "
                                "tanh(alpha x) is a sign function)")
# PowerNorm eq. (10) and (13): EMA factors, the weight of the past; at 0 the running statistic is the last batch's
# (torch's BatchNorm momentum=1), at 1 it never moves
EMA_FACTOR = Range(0, 1, high_in=False, why=" (an EMA factor: 0 keeps only the last batch, 1 never moves)")
# Gemma 2 §2 caps at 50 and 30: c * tanh(s / c) bounds the logits to +-c. Below 1e-3 every softmax is uniform to within
# 0.1% (a subnormal c made s / c overflow); above 1e4 no logit of a training run reaches the cap, and past float32's
# range c is infinite and the cap NaN
SOFTCAP = Range(1e-3, 1e4, off=True, why=" (a cap bounds the logits to +-cap)")


@dataclass
class GPTConfig:
    """Every model flag: flag(default, meaning, source, ...). configurable.txt lists them (python configs.py)."""
    # sizes (the defaults are the quickstart model: trains on 2 CPU cores in minutes)
    n_layer: int = flag(4, "number of transformer blocks N", "GPT-2", POSITIVE)
    n_head: int = flag(4, "attention heads H", "GPT-2", POSITIVE)
    n_embd: int = flag(128, "model width d; a multiple of n_head", "GPT-2", POSITIVE)
    block_size: int = flag(128, "context length T", "GPT-2", POSITIVE)
    vocab_size: int = flag(256, "embedding rows, at least the tokenizer's; set from the data (padded to 64) unless "
                                "given", "nanoGPT", POSITIVE)
    ffn_mult: int = flag(4, "FFN hidden width is ffn_mult * d", "GPT-2", POSITIVE)
    dropout: float = flag(0.0, "dropout on embeddings, attention probabilities and branch outputs", "GPT-2",
                          Range(0, 1, high_in=False))
    bias: bool = flag(True, "biases in linear layers", "GPT-2")
    # block layout and normalization (DeepNet; NormFormer (final) Table 8; PowerNorm)
    layout: Literal["pre", "post", "deepnorm", "mix", "reordered"] = flag(
        "pre", "where the norm sits; mix: post then pre; reordered: x + N(F(x))",
        "DeepNet eq. (1); Xiong et al. 2020; Mix-LN; OLMo 2")
    mix_ln_ratio: float = flag(0.25, "the first ratio * n_layer layers (rounded half up) are Post-LN",
                               "Mix-LN (Li, Yin, Liu, ICLR 2025)", Range(0, 1, why=" (the share of Post-LN layers)"),
                               needs=("layout", ("mix",)))
    layer_norm_scaling: bool = flag(False, "each pre-LN norm output of layer l (1-based) times 1/sqrt(l)",
                                    "LayerNorm Scaling (Sun et al. 2025, Curse of Depth)")
    subln: bool = flag(False, "extra norms before W_O and W_2; v, W_O, W_1, W_2 times sqrt(log 2N)",
                       "Magneto SubLN (Wang et al. 2023 §2)")
    norm: Literal[NORMS] = flag("layernorm", "the normalization used in every norm slot (norms.TABLE)",
                                "NormFormer (final) Table 8; PowerNorm §3-4; DyT")
    # the flags of the norms' arguments: each has an effect only with a norm that reads it (norms.reads)
    # DyT's alpha0 (Zhu et al. 2025): 0.5 is the paper's default outside LLMs; its LLaMA runs use 0.8 before
    # attention and 0.2 elsewhere at d = 4096 (smaller at larger d), and have no width near nanonorm's
    dyt_alpha: float = flag(0.5, "DyT's initial alpha in y = g * tanh(alpha * x) + b", "DyT (Zhu et al., CVPR 2025)",
                            DYT_ALPHA, needs=("norm", readers("dyt_alpha")))
    dyt_alpha_attn: Optional[float] = flag(None, "DyT's initial alpha of the attention sublayer's norm",
                                           "DyT (Zhu et al. 2025), LLaMA setting", DYT_ALPHA, none="dyt_alpha",
                                           needs=("norm", readers("dyt_alpha_attn")))
    # eps guards a variance that is about 1 at init (Ba et al. 2016); a larger one outweighs it, and every norm output
    # shrinks toward 0 (1e300 trains nothing). BERT's 1e-12 is the smallest in common use
    norm_eps: float = flag(1e-5, "eps inside the square root of every norm",
                           "Ba et al. 2016; nanonorm in PowerNorm too (its eq. (8) has none)",
                           Range(1e-12, 1, why=" (eps guards a variance of about 1: a larger one shrinks every norm "
                                 "output toward 0; below BERT's 1e-12 it guards nothing, 1e-300 is 0 in float32)"),
                           needs=("norm", readers("norm_eps")))
    norm_affine: Literal[AFFINE] = flag("both", "which of gain g and bias b the norms learn",
                                        "NormFormer (final) Table 8 rows 15-17, 25, 27, 28",
                                        needs=("norm", readers("norm_affine")))
    pn_alpha_fwd: float = flag(0.9, "EMA factor of the running quadratic mean (and running stats)",
                               "PowerNorm eq. (10)", EMA_FACTOR, needs=("norm", readers("pn_alpha_fwd")))
    pn_alpha_bwd: float = flag(0.9, "EMA factor of nu in the approximate backward", "PowerNorm eq. (13)",
                               EMA_FACTOR, needs=("norm", readers("pn_alpha_bwd")))
    pn_warmup: Optional[int] = flag(None, "training forward calls that run as PN-V before the running stats",
                                    "PowerNorm App. A.1 (warmup)", Range(0),
                                    none="warmup_iters x micro-steps; 0 in a ramp (configs.derive_model_flags)",
                                    needs=("norm", readers("pn_warmup")))
    pn_group_scaling: bool = flag(True, "divide each of H channel groups by its RMS before PowerNorm",
                                  "PowerNorm App. A.1", needs=("norm", readers("pn_group_scaling")))
    # extra operations inside a block (NormFormer (final) §2-3, Table 8)
    scale_heads: bool = flag(False, "HeadScale: a learned scalar per head (--head_scale_at: where)",
                             "NormFormer arXiv v1 eq. (3)")
    head_scale_at: Literal["before_proj", "after_proj"] = flag(
        "before_proj", "each head before W_O (paper), or W_O's output in H groups (fairseq)",
        "NormFormer arXiv v1 eq. (3), Fig. 1; fairseq transformer_layer.py", needs="scale_heads")
    scale_attn: bool = flag(False, "a norm on the attention output, before the residual add",
                            "NormFormer §2.1 (post-attn LN)")
    scale_fc: bool = flag(False, "a norm on the FFN hidden features, after the activation", "NormFormer §2.1 (FFN LN)")
    scale_resids: bool = flag(False, "ResScale: lambda * x + FFN(LN(x)), lambda per channel (pre only)",
                              "NormFormer (final) §3, §6.1")
    # NormFormer (final) §3 initializes ResScale's lambda at 1; CaiT's LayerScale starts near 0 (0.1 to 1e-6), so
    # that each block starts near the identity. Below 1e-7 what lambda scales is lost in float32 (2^-24 = 6e-8) beside
    # the sum's other term, of about 1
    scale_resids_init: float = flag(1.0, "initial value of ResScale's lambda", "NormFormer (final) §3",
                                    Range(1e-7, 10, why=" (ResScale's lambda scales the residual: NormFormer starts "
                                          "it at 1, and below 1e-7 the residual is lost in float32 beside the "
                                          "branch)"), needs="scale_resids")
    ffn_out_norm: bool = flag(False, "a norm on the FFN output, before the residual add",
                              "CogView sandwich-LN; NormFormer (final) Table 8")
    qkv_norm: bool = flag(False, "a norm on each of q, k and v",
                          "NormFormer (final) Table 4, arXiv v1 Table 5 (+3 More LN)")
    qk_norm: bool = flag(False, "--norm on q and k per head over head_dim; a per-token norm only",
                         "Dehghani et al. 2023 §2 (QK Normalization); Wortsman et al. 2023 §3.1")
    layer_scale: bool = flag(False, "x + diag(lambda) * Branch(x) on both branches", "LayerScale (CaiT); NormFormer "
                             "(final) Table 8")
    layer_scale_init: float = flag(1e-5, "initial value of LayerScale's lambda", "CaiT",
                                   Range(1e-7, 1, why=" (LayerScale starts each branch small, CaiT at 0.1 to 1e-6; "
                                         "below 1e-7 the branch is lost in float32 beside the residual)"),
                                   needs="layer_scale")
    # embeddings (Spike No More §3.2, §4.2; NormFormer (final) §4)
    pos: Literal["learned", "sinusoidal"] = flag("learned", "position embeddings", "GPT-2; NormFormer (final) §4")
    embed_scale: bool = flag(False, "token embeddings times sqrt(d) before adding positions",
                             "Spike No More (Scaled Embed)")
    embed_scale_learned: bool = flag(False, "--embed_scale's sqrt(d) is one learned scalar, init sqrt(d)",
                                     "DyT (Zhu et al. 2025), LLaMA code", needs="embed_scale")
    embed_norm: bool = flag(False, "a norm on the summed embeddings", "Spike No More (Embed LN); BLOOM")
    embed_grad_scale: float = flag(1.0, "e = a*e + (1-a)*e.detach(): shrinks the embedding gradient",
                                   "Spike No More (Embed Detach); GLM-130B", Range(0, 1, why=" (1 = off)"))
    embed_init: Literal["sigma", "inv_sqrt_d"] = flag("sigma", "std of the token-embedding init: --init's sigma, or "
                                                      "d^-1/2", "fairseq Embedding (NormFormer's code); Vaswani et "
                                                      "al. §3.4")
    tie_embeddings: bool = flag(True, "the output head shares the token embedding", "GPT-2")
    # feed-forward and attention (NormFormer arXiv v1 Table 3, final Table 8)
    activation: Literal["gelu", "relu", "relu2", "geglu"] = flag(
        "gelu", "FFN activation", "GPT-2; Primer; NormFormer (final) Table 8 (FFNGeGLU, in place of the FFN LN)")
    attn_impl: Literal["sdpa", "manual"] = flag("sdpa", "F.scaled_dot_product_attention, or the ops written out",
                                                "NormFormer arXiv v1 Table 3 (failed op)")
    attn_softcap: float = flag(0.0, "attention logits c * tanh(s / c); forces the manual attention path",
                               "Gemma 2 §2 (50)", SOFTCAP)
    logit_softcap: float = flag(0.0, "output logits c * tanh(z / c)", "Gemma 2 §2 (30)", SOFTCAP)
    # initialization (GPT-2 §2.3; Spike No More §2.2; DeepNet)
    init: Literal["gpt2", "plain", "scaled", "wang", "xavier"] = flag(
        "gpt2", "initialization scheme of all weight matrices", "GPT-2 §2.3; Spike No More §2.2; DeepNet")
    # a weight std past 1 makes each layer's output sqrt(d) times its input or more (GPT-2 uses 0.02); below 1e-4 a
    # weight is under float16's smallest normal number, 6.1e-5, in a --dtype=float16 matmul
    init_std: Optional[float] = flag(None, "overrides sigma (not with xavier); wang's W_O and W_2 keep 2 / (N sqrt(d))",
                                     "GPT-2 §2.3; Spike No More §2.2",
                                     Range(1e-4, 1, why=" (GPT-2 uses 0.02; past 1 every layer multiplies its input, "
                                           "below 1e-4 a weight is subnormal or 0 in float16)"),
                                     none="the scheme's sigma")
    init_depth_scale: bool = flag(False, "DeepInit: block l's weights times 1/sqrt(l)",
                                  "NormFormer (final) Table 8 rows 3-4")

    def __post_init__(self):
        """Reject values and combinations that mean nothing, with one line saying why."""
        problem = out_of_range(self)
        if problem:
            raise ValueError(problem)
        if self.n_embd % self.n_head:
            raise ValueError(f"--n_embd={self.n_embd} must be divisible by --n_head={self.n_head}")
        if self.init_std is not None and self.init == "xavier":
            raise ValueError("--init_std has no meaning with --init=xavier (its std comes from the fan-in and fan-out)")
        # only a norm that acts on each token alone means something over one head's q or k. DyT has no statistic,
        # but tanh bounds every entry of q and k, and with them the logits, which is what QK-norm is for
        if self.qk_norm and self.norm not in PER_TOKEN_NORMS:
            raise ValueError(f"--qk_norm normalizes each token's q and k per head; --norm={self.norm} has no per-token "
                             f"statistic over head_dim (use one of {', '.join(PER_TOKEN_NORMS)})")
        if self.layer_norm_scaling and self.layout not in ("pre", "mix"):
            raise ValueError(f"--layer_norm_scaling scales the output of each pre-LN norm; --layout={self.layout} has "
                             "none (use --layout=pre or mix)")
        if self.layout == "reordered" and (self.scale_attn or self.ffn_out_norm):
            raise ValueError("--layout=reordered already puts the norm on each sublayer's output; drop --scale_attn "
                             "and --ffn_out_norm")
        if self.scale_resids and self.layout != "pre":
            raise ValueError(f"--scale_resids is NormFormer's ResScale for pre-LN blocks; --layout={self.layout} "
                             "already normalizes the residual sum (use --layout=pre)")

    @classmethod
    def field_names(cls):
        return [f.name for f in fields(cls)]


class GPT(nn.Module):
    """Embeddings, n_layer blocks, a final norm (pre, mix and reordered layouts) and a language-model head, whose
    logits are c * tanh(z / c) with --logit_softcap=c (Gemma 2)."""

    def __init__(self, config):
        super().__init__()
        cfg = self.config = config
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        # DyT's LLaMA code (Zhu et al. 2025): the token embeddings' multiplier is one learned scalar, init sqrt(d)
        learned = cfg.embed_scale and cfg.embed_scale_learned
        self.embed_gain = nn.Parameter(torch.tensor(math.sqrt(cfg.n_embd))) if learned else None
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos == "learned" else None
        if self.wpe is None:  # a constant table, built once (not saved: it is a function of the config)
            self.register_buffer("sinusoids", sinusoidal_positions(cfg.block_size, cfg.n_embd), persistent=False)
        # Spike No More "Embed LN" (BLOOM): a norm on the summed embeddings
        self.embed_norm = norm(cfg, cfg.n_embd) if cfg.embed_norm else None
        self.drop = dropout(cfg)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layer))
        # post and deepnorm blocks already end with a norm; pre-LN needs one before the head (GPT-2), and so do
        # Mix-LN (its last layers are pre-LN; its LLaMA code keeps the final norm) and OLMo 2's reordered blocks
        # (x + N(F(x)) leaves the stream itself unnormalized; OLMo 2 keeps a final norm)
        self.final_norm = norm(cfg, cfg.n_embd) if cfg.layout in ("pre", "mix", "reordered") else None
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # Press & Wolf (2017), as in GPT-2
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """GPT-2 §2.3, Spike No More §2.2, DeepNet. Every matrix is drawn from N(0, sigma) except the two that
        write into the residual stream (attention W_O and FFN W_2), which get sigma_out; biases 0, norm gains 1
        (set by their modules). xavier draws each logical matrix (q, k, v separately) with std
        sqrt(2 / (fan_in + fan_out))."""
        cfg = self.config
        d, n = cfg.n_embd, cfg.n_layer
        # Spike No More §2.2: "plain" sigma = sqrt(2 / 5d) (Nguyen & Salazar; Le Scao et al.); GPT-2 uses 0.02
        if cfg.init_std:
            sigma = cfg.init_std
        elif cfg.init == "gpt2":
            sigma = 0.02
        else:
            sigma = math.sqrt(2 / (5 * d))
        sigma_out = {
            "gpt2": sigma / math.sqrt(2 * n),    # GPT-2 §2.3: scale residual-writing weights by 1/sqrt(2N)
            "plain": sigma,                      # Spike No More "plain": no depth scaling
            "scaled": sigma / math.sqrt(2 * n),  # Spike No More "scaled" (Megatron-LM)
            "wang": 2 / (n * math.sqrt(d)),      # GPT-NeoX wang_init: 2 / (N sqrt(d))
            "xavier": None,
        }[cfg.init]

        def draw(weight, std, chunks=1):
            for part in weight.chunk(chunks, dim=0):  # chunk views share memory with the weight
                if std is None:
                    nn.init.xavier_normal_(part)
                else:
                    nn.init.normal_(part, mean=0.0, std=std)

        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        std_in = None if cfg.init == "xavier" else sigma  # None: xavier's own std for each matrix
        std_embed = std_in
        if cfg.embed_init == "inv_sqrt_d":
            # fairseq's Embedding, which NormFormer trained with: N(0, d^-1/2), and with --embed_scale (x sqrt(d),
            # Vaswani et al. §3.4) tokens of std 1, the scale of the sinusoids they are added to
            std_embed = d ** -0.5
        draw(self.wte.weight, std_embed)
        if self.wpe is not None:
            draw(self.wpe.weight, std_in)
        if not cfg.tie_embeddings:
            draw(self.lm_head.weight, std_in)
        for layer, block in enumerate(self.blocks, start=1):
            draw(block.attn.qkv.weight, std_in, chunks=3)
            draw(block.attn.proj.weight, sigma_out)
            draw(block.mlp.fc.weight, std_in, chunks=2 if cfg.activation == "geglu" else 1)
            draw(block.mlp.proj.weight, sigma_out)
            # DeepNet: v, W_O, W_1 and W_2 get gain beta on top of whatever --init drew; q and k do not
            if cfg.layout == "deepnorm":
                block.attn.qkv.weight[2 * d:].mul_(deepnorm_beta(cfg))
                for weight in (block.attn.proj.weight, block.mlp.fc.weight, block.mlp.proj.weight):
                    weight.mul_(deepnorm_beta(cfg))
            # Magneto's SubLN: v, W_O, W_1 and W_2 times gamma = sqrt(log(2N)) (q and k keep their init)
            if cfg.subln:
                block.attn.qkv.weight[2 * d:].mul_(subln_gain(cfg))
                for weight in (block.attn.proj.weight, block.mlp.fc.weight, block.mlp.proj.weight):
                    weight.mul_(subln_gain(cfg))
            # DeepInit (NormFormer (final) Table 8 rows 3-4): every weight of block l scaled by 1/sqrt(l)
            if cfg.init_depth_scale:
                for weight in (block.attn.qkv.weight, block.attn.proj.weight, block.mlp.fc.weight,
                               block.mlp.proj.weight):
                    weight.mul_(1 / math.sqrt(layer))

    def embed(self, idx):
        cfg = self.config
        T = idx.size(1)
        x = self.wte(idx)
        if cfg.embed_scale:  # Spike No More "Scaled Embed": embeddings of std ~1, not ~sigma
            x = x * (math.sqrt(cfg.n_embd) if self.embed_gain is None else self.embed_gain)
        # rows 0..T-1 of the position table: a slice, where an index lookup would build arange(T) every step
        positions = self.wpe.weight if self.wpe is not None else self.sinusoids
        x = x + positions[:T]
        if cfg.embed_grad_scale != 1.0:
            # Spike No More "Embed Detach" (GLM-130B, CogView): same value, gradient into the embeddings times a;
            # taken after the positions are added, so a learned position table's gradient shrinks too
            a = cfg.embed_grad_scale
            x = a * x + (1 - a) * x.detach()
        return optional(self.drop, optional(self.embed_norm, x))

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> logits (B, T, vocab); loss is the mean cross-entropy when targets are given."""
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size={self.config.block_size}")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = softcap(self.lm_head(optional(self.final_norm, x)), self.config.logit_softcap)
        loss = None
        if targets is not None:
            # half-precision logits are upcast for the softmax; float32 and float64 stay as they are
            loss = F.cross_entropy(upcast(logits).view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """nanoGPT's sampling: appends max_new_tokens tokens to idx (B, T), each drawn from
        softmax(logits of the last position / temperature), over the top_k most likely tokens when top_k is given.
        Runs in eval mode, as validation does: dropout is off and the batch-statistic norms (batchnorm, pnv,
        powernorm) use their running statistics, so a token sees no other token's values and no buffer moves."""
        if temperature <= 0:
            raise ValueError(f"temperature={temperature} must be > 0 (top_k=1 samples greedily)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1 (or None for the whole vocabulary)")
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                context = idx[:, -self.config.block_size:]  # positions exist for block_size tokens only
                logits, _ = self(context)
                logits = upcast(logits[:, -1, :]) / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
                idx = torch.cat((idx, next_token), dim=1)
        finally:
            self.train(was_training)
        return idx

    def num_params(self):
        """Parameters counted once (the tied head shares the token embedding)."""
        return sum(p.numel() for p in self.parameters())


def flops_per_token(model, cfg):
    """Model FLOPs of one training token, forward and backward, as nanoGPT's estimate_mfu (PaLM App. B):
    6 N for the matmuls of the N parameters, less the position table (it is looked up, not multiplied), plus
    12 L T d for attention's q@k and probs@v. Norms, softmax and the optimizer are not model FLOPs."""
    positions = cfg.block_size * cfg.n_embd if cfg.pos == "learned" else 0
    params = sum(p.numel() for p in model.parameters()) - positions  # the tied head counted once
    return 6 * params + 12 * cfg.n_layer * cfg.block_size * cfg.n_embd


def configure_optimizer(model, weight_decay, lr, betas, device_type):
    """AdamW, as nanoGPT's configure_optimizers: weight decay on matrices only, not on biases, norm gains or
    per-channel scales."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device_type in ("cuda", "cpu")  # fused AdamW kernels exist for both in torch >= 2.4
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)
