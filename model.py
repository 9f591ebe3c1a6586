"""
A GPT language model in one file, with every normalization, layout, embedding and init variant of
nanonorm switched by a field of GPTConfig. Read it top to bottom: the config, then the pieces
(attention, MLP, block), then the whole model and its initialization.

Papers: NormFormer (Shleifer, Weston, Ott 2021, "NormFormer: Improved Transformer Pretraining with Extra
Normalization"), DeepNet (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers"), Spike No More
(Takase et al. 2023, "Spike No More: Stabilizing the Pre-training of Large Language Models") and PowerNorm
(Shen et al. 2020, "PowerNorm: Rethinking Batch Normalization in Transformers"). Comments cite them by
section, equation or table.
"""

import math
from dataclasses import dataclass, fields
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from norms import make_norm


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


class Attention(nn.Module):
    """Causal self-attention: softmax(q k^T / sqrt(hd)) v per head, concat, W_O."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.manual = cfg.attn_impl == "manual"
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        # NormFormer Table 4/5 "+3 More LN": a norm on each of q, k and v, over all d features
        self.qkv_norm = nn.ModuleList(norm(cfg, cfg.n_embd) for _ in range(3)) if cfg.qkv_norm else None
        # NormFormer eq. (3), HeadScale: one learned scalar per head, init 1
        self.head_scale = nn.Parameter(torch.ones(cfg.n_head)) if cfg.scale_heads else None

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        if self.qkv_norm is not None:
            q, k, v = (n(t) for n, t in zip(self.qkv_norm, (q, k, v)))
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        if self.manual:
            y = self.manual_attention(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        if self.head_scale is not None:
            y = y * self.head_scale.view(1, -1, 1, 1)  # before the concat and W_O, as in the paper
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))

    def manual_attention(self, q, k, v):
        """The same math as SDPA, one op at a time, so a hook or anomaly check can name the op that
        overflows (NormFormer Table 3 reports "q@k at layer 0")."""
        T = q.size(2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = F.dropout(F.softmax(scores, dim=-1), p=self.dropout, training=self.training)
        return probs @ v


class MLP(nn.Module):
    """y = W_2 act(W_1 x); GEGLU (Shazeer 2020, NormFormer Table 8 "FFNGeGLU"): y = W_2 (GELU(x W) * (x V))."""

    def __init__(self, cfg):
        super().__init__()
        hidden = cfg.ffn_mult * cfg.n_embd
        self.activation = cfg.activation
        # GEGLU needs two input projections, W and V; they are stacked in one matrix (split in forward)
        self.fc = nn.Linear(cfg.n_embd, 2 * hidden if cfg.activation == "geglu" else hidden, bias=cfg.bias)
        # NormFormer "FFN LN": a norm on the 4d hidden features, after the activation, before fc2
        self.fc_norm = norm(cfg, hidden) if cfg.scale_fc else None
        self.proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        h = self.fc(x)
        if self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "relu2":
            h = F.relu(h).square()  # Primer's squared ReLU (NormFormer's 2.7B models)
        else:
            gate, value = h.chunk(2, dim=-1)
            h = F.gelu(gate) * value
        if self.fc_norm is not None:
            h = self.fc_norm(h)
        return self.dropout(self.proj(h))


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
        self.alpha = deepnorm_alpha(cfg) if cfg.layout == "deepnorm" else 1.0
        self.attn_norm = norm(cfg, d)
        self.attn = Attention(cfg)
        self.ffn_norm = norm(cfg, d)
        self.mlp = MLP(cfg)
        # NormFormer "post-attn LN" / CogView sandwich-LN: a norm on the attention output before the add
        self.attn_out_norm = norm(cfg, d) if cfg.scale_attn else None
        # CogView sandwich-LN: the same on the FFN output
        self.ffn_out_norm = norm(cfg, d) if cfg.ffn_out_norm else None
        # NormFormer §3 ResScale: lambda_resid * x + FFN(LN(x)), one lambda per channel
        self.resid_scale = nn.Parameter(torch.full((d,), cfg.scale_resids_init)) if cfg.scale_resids else None
        # LayerScale (CaiT): x + diag(lambda) * Branch(x) on both branches, lambda small at init
        self.attn_layer_scale = nn.Parameter(torch.full((d,), cfg.layer_scale_init)) if cfg.layer_scale else None
        self.ffn_layer_scale = nn.Parameter(torch.full((d,), cfg.layer_scale_init)) if cfg.layer_scale else None

    def branch(self, x, sublayer, in_norm, out_norm, layer_scale):
        """Branch(x) of either sublayer: its input norm (pre layout only), the sublayer itself, then the
        optional output norm (sandwich / post-attn LN) and LayerScale."""
        y = sublayer(in_norm(x) if self.layout == "pre" else x)
        if out_norm is not None:
            y = out_norm(y)
        if layer_scale is not None:
            y = y * layer_scale
        return y

    def forward(self, x):
        attn = (self.attn, self.attn_norm, self.attn_out_norm, self.attn_layer_scale)
        ffn = (self.mlp, self.ffn_norm, self.ffn_out_norm, self.ffn_layer_scale)
        if self.layout == "pre":
            x = x + self.branch(x, *attn)
            residual = x * self.resid_scale if self.resid_scale is not None else x
            return residual + self.branch(x, *ffn)
        # post and deepnorm: the norm comes after the residual sum; alpha is 1 for post
        x = self.attn_norm(self.alpha * x + self.branch(x, *attn))
        return self.ffn_norm(self.alpha * x + self.branch(x, *ffn))


def sinusoidal_positions(T, d, device):
    """Vaswani et al. (2017): PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(...). No parameters
    (NormFormer §4 and Shortformer use them)."""
    position = torch.arange(T, device=device, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, d, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(T, d, device=device)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d // 2])
    return table


class GPT(nn.Module):
    """Embeddings, n_layer blocks, a final norm (pre layout only) and a language-model head."""

    def __init__(self, config):
        super().__init__()
        cfg = self.config = config
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos == "learned" else None
        # Spike No More "Embed LN" (BLOOM): a norm on the summed embeddings
        self.embed_norm = norm(cfg, cfg.n_embd) if cfg.embed_norm else None
        self.drop = nn.Dropout(cfg.dropout)
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

    def num_params(self):
        """Parameters counted once (the tied head shares the token embedding)."""
        return sum(p.numel() for p in self.parameters())

    def embed(self, idx):
        cfg = self.config
        T = idx.size(1)
        x = self.wte(idx)
        if cfg.embed_scale:
            x = x * math.sqrt(cfg.n_embd)  # Spike No More "Scaled Embed": embeddings of std ~1, not ~sigma
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        else:
            x = x + sinusoidal_positions(T, cfg.n_embd, idx.device).to(x.dtype)
        if cfg.embed_grad_scale != 1.0:
            # Spike No More "Embed Detach" (GLM-130B, CogView): same value, gradient into the embeddings times a
            a = cfg.embed_grad_scale
            x = a * x + (1 - a) * x.detach()
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.drop(x)

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> logits (B, T, vocab); loss is the mean cross-entropy when targets are given."""
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size={self.config.block_size}")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
