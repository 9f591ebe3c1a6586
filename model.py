"""
A GPT language model in one file, with every normalization, layout, embedding and init variant of
nanonorm switched by a field of GPTConfig. Read it top to bottom: the config, then the pieces
(attention, MLP, block), then the whole model and its initialization.

Papers: NormFormer (Shleifer, Weston, Ott 2021, "NormFormer: Improved Transformer Pretraining with Extra
Normalization"), DeepNet (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers"), Spike No More
(Takase et al. 2023, "Spike No More: Stabilizing the Pre-training of Large Language Models") and PowerNorm
(Shen et al. 2020, "PowerNorm: Rethinking Batch Normalization in Transformers"); QK normalization from
Dehghani et al. 2023 ("Scaling Vision Transformers to 22 Billion Parameters") and Wortsman et al. 2023
("Small-scale proxies for large-scale Transformer training instabilities"). Comments cite them by section,
equation or table.
"""

import math
from dataclasses import dataclass, fields
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from norms import make_norm, upcast


# norms whose statistics are per token: the only ones that mean something over one head's q or k (--qk_norm)
PER_TOKEN_NORMS = ("layernorm", "rmsnorm", "cogview")


@dataclass
class GPTConfig:
    # sizes (the defaults are the quickstart model: trains on 2 CPU cores in minutes)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    vocab_size: int = 256
    ffn_mult: int = 4
    dropout: float = 0.0
    bias: bool = True
    # block layout and normalization (DeepNet §2; NormFormer Table 8; PowerNorm)
    layout: Literal["pre", "post", "deepnorm"] = "pre"
    norm: Literal["layernorm", "rmsnorm", "cogview", "batchnorm", "pnv", "powernorm", "none"] = "layernorm"
    norm_eps: float = 1e-5
    norm_affine: Literal["both", "no_bias", "no_gamma", "none"] = "both"
    pn_alpha_fwd: float = 0.9
    pn_alpha_bwd: float = 0.9
    pn_warmup: Optional[int] = None  # PowerNorm warmup in training forward calls; None: train.py uses the LR warmup
    pn_group_scaling: bool = True
    # extra operations inside a block (NormFormer §2-3, Table 8)
    scale_heads: bool = False
    scale_attn: bool = False
    scale_fc: bool = False
    scale_resids: bool = False
    scale_resids_init: float = 1.0
    ffn_out_norm: bool = False
    qkv_norm: bool = False
    qk_norm: bool = False
    layer_scale: bool = False
    layer_scale_init: float = 1e-5
    # embeddings (Spike No More §3-4; NormFormer §4)
    pos: Literal["learned", "sinusoidal"] = "learned"
    embed_scale: bool = False
    embed_norm: bool = False
    embed_grad_scale: float = 1.0
    tie_embeddings: bool = True
    # feed-forward and attention (NormFormer Table 3, Table 8)
    activation: Literal["gelu", "relu", "relu2", "geglu"] = "gelu"
    attn_impl: Literal["sdpa", "manual"] = "sdpa"
    # initialization (GPT-2 §2.3; Spike No More §3; DeepNet §2.3)
    init: Literal["gpt2", "plain", "scaled", "wang", "xavier"] = "gpt2"
    init_std: Optional[float] = None
    init_depth_scale: bool = False

    def __post_init__(self):
        """Reject combinations that mean nothing, with one line saying why."""
        positive = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "ffn_mult")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}={getattr(self, name)} must be a positive integer")
        if self.n_embd % self.n_head:
            raise ValueError(f"--n_embd={self.n_embd} must be divisible by --n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout={self.dropout} must be in [0, 1)")
        if self.norm_eps <= 0:
            raise ValueError(f"--norm_eps={self.norm_eps} must be > 0")
        for name in ("pn_alpha_fwd", "pn_alpha_bwd"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"--{name}={getattr(self, name)} must be in (0, 1)")
        if self.pn_warmup is not None and self.pn_warmup < 0:
            raise ValueError(f"--pn_warmup={self.pn_warmup} must be >= 0")
        if not 0.0 <= self.embed_grad_scale <= 1.0:
            raise ValueError(f"--embed_grad_scale={self.embed_grad_scale} must be in [0, 1] (1 = off)")
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"--init_std={self.init_std} must be > 0")
        if self.init_std is not None and self.init == "xavier":
            raise ValueError("--init_std has no meaning with --init=xavier (its std comes from the fan-in and fan-out)")
        if self.qk_norm and self.norm not in PER_TOKEN_NORMS:
            raise ValueError(f"--qk_norm normalizes each token's q and k per head; --norm={self.norm} has no per-token "
                             f"statistic over head_dim (use one of {', '.join(PER_TOKEN_NORMS)})")
        if self.scale_resids and self.layout != "pre":
            raise ValueError(f"--scale_resids is NormFormer's ResScale for pre-LN blocks; --layout={self.layout} "
                             "already normalizes the residual sum (use --layout=pre)")

    @classmethod
    def field_names(cls):
        return [f.name for f in fields(cls)]


# Named rows of the papers' tables, applied before the explicit flags (which override them).
# An ablation is a preset plus an override: --preset=normformer --scale_heads=False is "- Head Scale".
PRESETS = {
    "baseline": {},                                                          # GPT-2 / GPT-3 pre-LN
    "postln": {"layout": "post"},                                            # original Transformer
    "normformer": {"scale_attn": True, "scale_fc": True, "scale_heads": True},  # NormFormer Table 2
    "normformer_resid": {"scale_attn": True, "scale_fc": True, "scale_heads": True, "scale_resids": True},
    "deepnorm": {"layout": "deepnorm", "init": "xavier"},                    # DeepNet §3
    "cogview": {"norm": "cogview", "scale_attn": True, "ffn_out_norm": True, "embed_grad_scale": 0.1},
    "embed_ln": {"init": "scaled", "embed_norm": True},                      # Spike No More Table 1
    "scaled_embed": {"init": "scaled", "embed_scale": True},                 # Spike No More Table 1
    "vanilla_scaled": {"init": "scaled"},                                    # Spike No More "Vanilla"
    "layerscale": {"layer_scale": True},                                     # NormFormer Table 8 (CaiT)
}


def norm(cfg, dim):
    """The norm module chosen by --norm for a slot of `dim` features (every norm slot of the model uses it)."""
    return make_norm(cfg.norm, dim, eps=cfg.norm_eps, affine=cfg.norm_affine,
                     alpha_fwd=cfg.pn_alpha_fwd, alpha_bwd=cfg.pn_alpha_bwd, warmup=cfg.pn_warmup or 0,
                     groups=cfg.n_head if cfg.pn_group_scaling else 0)


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
    """s = q k^T / sqrt(hd), the attention logits of every head. A module of its own so that a forward
    hook sees them: NormFormer Table 3 names "q@k" as the operation that overflows first."""

    def forward(self, q, k):
        return (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))


class Attention(nn.Module):
    """Causal self-attention: softmax(q k^T / sqrt(hd)) v per head, concat, W_O."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        # NormFormer Table 4/5 "+3 More LN": a norm on each of q, k and v, over all d features
        self.qkv_norm = nn.ModuleList(norm(cfg, cfg.n_embd) for _ in range(3)) if cfg.qkv_norm else None
        # QK normalization (Dehghani et al. 2023 §2; Wortsman et al. 2023 §3.1, qk-layernorm): q and k of
        # each head normalized over head_dim, which keeps the attention logits from growing
        head_dim = cfg.n_embd // cfg.n_head
        self.q_norm = norm(cfg, head_dim) if cfg.qk_norm else None
        self.k_norm = norm(cfg, head_dim) if cfg.qk_norm else None
        # NormFormer eq. (3), HeadScale: one learned scalar per head, init 1
        self.head_scale = nn.Parameter(torch.ones(cfg.n_head)) if cfg.scale_heads else None
        # the ops written out (--attn_impl=manual), so that hooks can name the one that overflows
        self.scores = AttentionScores() if cfg.attn_impl == "manual" else None
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
        if self.head_scale is not None:
            y = y * self.head_scale.view(1, -1, 1, 1)  # before the concat and W_O, as in the paper
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def manual_attention(self, q, k, v):
        """The same math as SDPA, one op at a time, so a hook or anomaly check can name the op that
        overflows (NormFormer Table 3 reports "q@k at layer 0")."""
        T = q.size(2)
        scores = self.scores(q, k).masked_fill(~self.causal[:T, :T], float("-inf"))
        probs = F.softmax(scores, dim=-1)
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, p=self.dropout)
        return probs @ v


class ReLU2(nn.Module):
    """y = max(x, 0)^2, Primer's squared ReLU (So et al. 2021; NormFormer's 2.7B models)."""

    def forward(self, x):
        return F.relu(x).square()


class GEGLU(nn.Module):
    """y = GELU(x W) * (x V) on the stacked projections [x W, x V] (Shazeer 2020; NormFormer Table 8 "FFNGeGLU")."""

    def forward(self, h):
        gate, value = h.chunk(2, dim=-1)
        return F.gelu(gate) * value


ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "relu2": ReLU2, "geglu": GEGLU}


class MLP(nn.Module):
    """y = W_2 act(W_1 x); GEGLU (Shazeer 2020, NormFormer Table 8 "FFNGeGLU"): y = W_2 (GELU(x W) * (x V))."""

    def __init__(self, cfg):
        super().__init__()
        hidden = cfg.ffn_mult * cfg.n_embd
        # GEGLU needs two input projections, W and V; they are stacked in one matrix (split by GEGLU)
        self.fc = nn.Linear(cfg.n_embd, 2 * hidden if cfg.activation == "geglu" else hidden, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]()
        # NormFormer "FFN LN": a norm on the 4d hidden features, after the activation, before fc2
        self.fc_norm = norm(cfg, hidden) if cfg.scale_fc else None
        self.proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)

    def forward(self, x):
        return self.proj(optional(self.fc_norm, self.act(self.fc(x))))


class Block(nn.Module):
    """One transformer layer. With norm N, attention A and feed-forward F (DeepNet eq. (1) for deepnorm):
    pre:      x = x + A(N(x));           x = x + F(N(x))
    post:     x = N(x + A(x));           x = N(x + F(x))
    deepnorm: x = N(alpha*x + A(x));     x = N(alpha*x + F(x)),   alpha = (2 n_layer)^(1/4)
    """

    def __init__(self, cfg):
        super().__init__()
        d = cfg.n_embd
        self.layout = cfg.layout
        self.alpha = deepnorm_alpha(cfg) if cfg.layout == "deepnorm" else None  # None: post, no multiply by 1
        self.attn_norm = norm(cfg, d)
        self.attn = Attention(cfg)
        self.ffn_norm = norm(cfg, d)
        self.mlp = MLP(cfg)
        # NormFormer "post-attn LN" / CogView sandwich-LN: a norm on the attention output before the add
        self.attn_out_norm = norm(cfg, d) if cfg.scale_attn else None
        # CogView sandwich-LN: the same on the FFN output
        self.ffn_out_norm = norm(cfg, d) if cfg.ffn_out_norm else None
        # GPT-2 (Vaswani et al. §5.4): dropout on each sublayer's output, before it is added to the residual
        self.attn_dropout, self.ffn_dropout = dropout(cfg), dropout(cfg)
        # NormFormer §3 ResScale: lambda_resid * x + FFN(LN(x)), one lambda per channel
        self.resid_scale = nn.Parameter(torch.full((d,), cfg.scale_resids_init)) if cfg.scale_resids else None
        # LayerScale (CaiT): x + diag(lambda) * Branch(x) on both branches, lambda small at init
        self.attn_layer_scale = nn.Parameter(torch.full((d,), cfg.layer_scale_init)) if cfg.layer_scale else None
        self.ffn_layer_scale = nn.Parameter(torch.full((d,), cfg.layer_scale_init)) if cfg.layer_scale else None

    def branch(self, x, sublayer, in_norm, out_norm, out_dropout, layer_scale):
        """Branch(x) of either sublayer: its input norm (pre layout only), the sublayer itself, the optional
        output norm (sandwich / post-attn LN), dropout and LayerScale. Dropout comes after the output norm, as
        in fairseq's NormFormer: a norm after it would undo its 1/(1-p) scaling in training, not in eval."""
        y = sublayer(in_norm(x) if self.layout == "pre" else x)
        return scaled(optional(out_dropout, optional(out_norm, y)), layer_scale)

    def forward(self, x):
        attn = (self.attn, self.attn_norm, self.attn_out_norm, self.attn_dropout, self.attn_layer_scale)
        ffn = (self.mlp, self.ffn_norm, self.ffn_out_norm, self.ffn_dropout, self.ffn_layer_scale)
        if self.layout == "pre":
            x = x + self.branch(x, *attn)
            return scaled(x, self.resid_scale) + self.branch(x, *ffn)
        # post and deepnorm: the norm comes after the residual sum
        x = self.attn_norm(scaled(x, self.alpha) + self.branch(x, *attn))
        return self.ffn_norm(scaled(x, self.alpha) + self.branch(x, *ffn))


def sinusoidal_positions(T, d):
    """Vaswani et al. (2017): PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(...). No parameters
    (NormFormer §4 and Shortformer use them)."""
    position = torch.arange(T, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(T, d)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d // 2])
    return table


# The papers' names of what each module outputs (NormFormer Table 3 "failed operation", Fig. 3-4), by module
# name inside a block; GPT.probe_points and GPT.op_label read them.
BLOCK_OPS = {
    "attn_norm": "attn_ln", "attn.qkv": "qkv", "attn.scores": "q@k", "attn.proj": "out_proj",
    "attn_out_norm": "attn_out_ln", "ffn_norm": "ffn_ln", "mlp.fc": "fc1", "mlp.act": "act",
    "mlp.fc_norm": "ffn_hidden_ln", "mlp.proj": "fc2", "ffn_out_norm": "ffn_out_ln",
    # the norms of --qkv_norm and --qk_norm output the q, k and v that attention uses
    "attn.qkv_norm.0": "q", "attn.qkv_norm.1": "k", "attn.qkv_norm.2": "v", "attn.q_norm": "q", "attn.k_norm": "k",
}
# parameters that are no module's output: their own names
PARAM_OPS = {"attn.head_scale": "head_scale", "resid_scale": "resid_scale",
             "attn_layer_scale": "attn_layer_scale", "ffn_layer_scale": "ffn_layer_scale"}
TOP_OPS = {"wte": "embed", "wpe": "embed", "embed_norm": "embed_ln", "final_norm": "final_ln", "lm_head": "logits"}


def flops_per_token(model, cfg):
    """Model FLOPs of one training token, forward and backward, as nanoGPT's estimate_mfu (PaLM App. B):
    6 N for the matmuls of the N parameters, less the position table (it is looked up, not multiplied), plus
    12 L T d for attention's q@k and probs@v. Norms, softmax and the optimizer are not model FLOPs."""
    positions = cfg.block_size * cfg.n_embd if cfg.pos == "learned" else 0
    params = sum(p.numel() for p in model.parameters()) - positions  # the tied head counted once
    return 6 * params + 12 * cfg.n_layer * cfg.block_size * cfg.n_embd


def output_of(module_name):
    """The probe point (op, module name inside a block, "output", no chunk) of a module's output."""
    return BLOCK_OPS[module_name], module_name, "output", None


class GPT(nn.Module):
    """Embeddings, n_layer blocks, a final norm (pre layout only) and a language-model head."""

    def __init__(self, config):
        super().__init__()
        cfg = self.config = config
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos == "learned" else None
        if self.wpe is None:  # a constant table, built once (not saved: it is a function of the config)
            self.register_buffer("sinusoids", sinusoidal_positions(cfg.block_size, cfg.n_embd), persistent=False)
        # Spike No More "Embed LN" (BLOOM): a norm on the summed embeddings
        self.embed_norm = norm(cfg, cfg.n_embd) if cfg.embed_norm else None
        self.drop = dropout(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        # post and deepnorm blocks already end with a norm; pre-LN needs one before the head (GPT-2)
        self.final_norm = norm(cfg, cfg.n_embd) if cfg.layout == "pre" else None
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # Press & Wolf (2017), as in GPT-2
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """GPT-2 §2.3, Spike No More §3, DeepNet §2.3. Every matrix is drawn from N(0, sigma) except the two that write into the residual
        stream (attention W_O and FFN W_2), which get sigma_out; biases 0, norm gains 1 (set by their
        modules). xavier draws each logical matrix (q, k, v separately) with std sqrt(2 / (fan_in + fan_out))."""
        cfg = self.config
        d, n = cfg.n_embd, cfg.n_layer
        # Spike No More §3: "plain" sigma = sqrt(2 / 5d) (Nguyen & Salazar; Le Scao et al.); GPT-2 uses 0.02
        sigma = cfg.init_std or (0.02 if cfg.init == "gpt2" else math.sqrt(2 / (5 * d)))
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
        draw(self.wte.weight, None if cfg.init == "xavier" else sigma)
        if self.wpe is not None:
            draw(self.wpe.weight, None if cfg.init == "xavier" else sigma)
        if not cfg.tie_embeddings:
            draw(self.lm_head.weight, None if cfg.init == "xavier" else sigma)
        std_in = None if cfg.init == "xavier" else sigma
        beta = deepnorm_beta(cfg) if cfg.layout == "deepnorm" else 1.0
        for layer, block in enumerate(self.blocks, start=1):
            draw(block.attn.qkv.weight, std_in, chunks=3)
            draw(block.attn.proj.weight, sigma_out)
            draw(block.mlp.fc.weight, std_in, chunks=2 if cfg.activation == "geglu" else 1)
            draw(block.mlp.proj.weight, sigma_out)
            # DeepNet: v, W_O, W_1 and W_2 get gain beta on top of whatever --init drew; q and k do not
            block.attn.qkv.weight[2 * d:].mul_(beta)
            for weight in (block.attn.proj.weight, block.mlp.fc.weight, block.mlp.proj.weight):
                weight.mul_(beta)
            # DeepInit (NormFormer Table 8 rows 3-4): every weight of block l scaled by 1/sqrt(l)
            if cfg.init_depth_scale:
                for weight in (block.attn.qkv.weight, block.attn.proj.weight, block.mlp.fc.weight, block.mlp.proj.weight):
                    weight.mul_(1 / math.sqrt(layer))

    def probe_points(self):
        """Where to hook each operation the papers name, in forward order: a list of (layer, op, module_name,
        io, chunk). A forward hook ("output") or forward pre-hook ("input") on module_name sees the tensor;
        chunk (index, count), when not None, means tensor.chunk(count, dim=-1)[index]. layer is None for
        `embed` (the input of block 0), `final_ln` and `logits`. Only operations this config has are listed
        (q@k needs --attn_impl=manual, attn_out_ln --scale_attn, ...).
        q, k, v are chunks of the fused qkv output, or the outputs of the --qkv_norm norms; with --qk_norm,
        q and k are the per-head norms' outputs, which run after v exists, so the order there is v, q, k.
        probs@v is the input of W_O (after HeadScale). In post and deepnorm blocks the norms come after the
        residual sums: attn_ln and resid_attn are then both attn_norm's output, ffn_ln is ffn_norm's output
        and resid_ffn (the block output) the same tensor again."""
        cfg = self.config
        qkv = [(op, "attn.qkv", "output", (j, 3)) for j, op in enumerate("qkv")]
        if cfg.qkv_norm:
            qkv = [output_of(f"attn.qkv_norm.{j}") for j in range(3)]
        if cfg.qk_norm:
            qkv = qkv[2:] + [output_of("attn.q_norm"), output_of("attn.k_norm")]
        attn = [*qkv, output_of("attn.scores"), ("probs@v", "attn.proj", "input", None), output_of("attn.proj"),
                output_of("attn_out_norm")]
        ffn = [output_of(m) for m in ("mlp.fc", "mlp.act", "mlp.fc_norm", "mlp.proj", "ffn_out_norm")]
        if cfg.layout == "pre":
            block = [output_of("attn_norm"), *attn, ("resid_attn", "ffn_norm", "input", None), output_of("ffn_norm"),
                     *ffn]
        else:
            block = [*attn, output_of("attn_norm"), ("resid_attn", "attn_norm", "output", None), *ffn,
                     output_of("ffn_norm")]
        modules = dict(self.named_modules())
        points = [(None, "embed", "blocks.0", "input", None)]
        for i in range(cfg.n_layer):
            points += [(i, op, f"blocks.{i}.{m}", io, chunk)
                       for op, m, io, chunk in block if f"blocks.{i}.{m}" in modules]
            points.append((i, "resid_ffn", f"blocks.{i}", "output", None))
        points += [(None, TOP_OPS[m], m, "output", None) for m in ("final_norm", "lm_head") if m in modules]
        return points

    def weight_splits(self):
        """{parameter name: labels} for the fused parameters: parameter.chunk(len(labels), dim=0)[j] is
        labels[j]. The qkv Linear stacks W_q, W_k, W_v; GEGLU's fc stacks W (gate) and V (value)."""
        splits = {}
        for name, _ in self.named_parameters():
            if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
                splits[name] = ("q", "k", "v")
            elif self.config.activation == "geglu" and name.endswith(("mlp.fc.weight", "mlp.fc.bias")):
                splits[name] = ("fc1_gate", "fc1_value")
        return splits

    @staticmethod
    def op_label(name):
        """The papers' name of the operation a parameter or module belongs to: "blocks.3.mlp.proj.weight" ->
        "fc2", "blocks.0.attn_norm" -> "attn_ln", "blocks.1.attn.qkv.weight" -> "qkv" (see weight_splits).
        The norms of --qkv_norm and --qk_norm are labeled by the tensor they normalize: "q", "k", "v"."""
        parts = name.split(".")
        if parts[0] != "blocks":
            return TOP_OPS[parts[0]]
        inner = ".".join(parts[2:])
        ops = {**BLOCK_OPS, **PARAM_OPS}
        return ops[inner] if inner in ops else ops[inner.rsplit(".", 1)[0]]

    def num_params(self):
        """Parameters counted once (the tied head shares the token embedding)."""
        return sum(p.numel() for p in self.parameters())

    def embed(self, idx):
        cfg = self.config
        T = idx.size(1)
        x = self.wte(idx)
        if cfg.embed_scale:
            x = x * math.sqrt(cfg.n_embd)  # Spike No More "Scaled Embed": embeddings of std ~1, not ~sigma
        # rows 0..T-1 of the position table: a slice, where an index lookup would build arange(T) every step
        positions = self.wpe.weight if self.wpe is not None else self.sinusoids
        x = x + positions[:T]
        if cfg.embed_grad_scale != 1.0:
            # Spike No More "Embed Detach" (GLM-130B, CogView): same value, gradient into the embeddings times a
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
        logits = self.lm_head(optional(self.final_norm, x))
        loss = None
        if targets is not None:
            # half-precision logits are upcast for the softmax; float32 and float64 stay as they are
            loss = F.cross_entropy(upcast(logits).view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
