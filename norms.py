"""
Every normalization nanonorm can put in a norm slot, each beside its equation and paper.

Inputs are (..., C) tensors: per-token norms reduce over the last dim, batch-statistic norms over every
dim but the last (all B*T tokens, as PowerNorm §3 flattens sentences into one batch dimension).
Affine variants follow NormFormer Table 8: gamma and beta, gamma only ("No Bias"), beta only ("No gamma"),
neither ("No Bias or gamma"). Half-precision inputs are normalized in float32 and returned in their dtype.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

NORMS = ("layernorm", "rmsnorm", "cogview", "batchnorm", "pnv", "powernorm", "none")
AFFINE = ("both", "no_bias", "no_gamma", "none")

# PowerNorm's group scaling uses a fixed eps, as the reference code's GroupScaling1D does
GROUP_SCALING_EPS = 1e-5


def gamma_beta(dim, affine):
    """The learned gain g (init 1) and shift b (init 0) that `affine` asks for; None where absent."""
    weight = nn.Parameter(torch.ones(dim)) if affine in ("both", "no_bias") else None
    bias = nn.Parameter(torch.zeros(dim)) if affine in ("both", "no_gamma") else None
    return weight, bias


def scale_shift(z, weight, bias):
    if weight is not None:
        z = z * weight
    if bias is not None:
        z = z + bias
    return z


def upcast(x):
    # a bf16 mean of activations around 1e3 is off by units, so the statistics are taken in float32
    return x.float() if x.element_size() < 4 else x


def mean_tokens(x):
    """Mean over every dim but the last: the per-channel batch statistic over all B*T tokens."""
    return x.reshape(-1, x.shape[-1]).mean(0)


class LayerNorm(nn.Module):
    """y = (x - E[x]) / sqrt(Var[x] + eps) * g + b over the C features of each token
    (Ba et al. 2016; NormFormer eq. (1))."""

    def __init__(self, dim, eps=1e-5, affine="both"):
        super().__init__()
        self.eps = eps
        self.weight, self.bias = gamma_beta(dim, affine)

    def forward(self, x):
        y = F.layer_norm(upcast(x), x.shape[-1:], self.weight, self.bias, self.eps)
        return y.to(x.dtype)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * g over the C features of each token, never a bias
    (Zhang & Sennrich 2019; the "T5" LN variant of NormFormer Table 8; Spike No More §5.3)."""

    def __init__(self, dim, eps=1e-5, affine="both"):
        super().__init__()
        self.eps = eps
        # T5 drops the bias, so `affine` only decides whether g exists
        self.weight, self.bias = gamma_beta(dim, affine)[0], None

    def forward(self, x):
        y = F.rms_norm(upcast(x), x.shape[-1:], self.weight, self.eps)
        return y.to(x.dtype)


class CogViewLayerNorm(nn.Module):
    """y = LN(x / (max|x| / 8)), the max over the whole tensor and detached
    (CogView "PB-relax", Ding et al. 2021 §2.4; NormFormer Table 8). Equal to LN up to eps: it keeps
    fp16 activations in range, it does not change the math. The whole-tensor max couples the tokens of a
    batch only through eps (NormFormer writes LN(X / Max(X)); the /8 is CogView's code)."""

    def __init__(self, dim, eps=1e-5, affine="both"):
        super().__init__()
        self.eps = eps
        self.weight, self.bias = gamma_beta(dim, affine)

    def forward(self, x):
        u = upcast(x)
        # the scale is a constant for autograd, as in CogView's code; tiny keeps an all-zero input finite
        scale = (u.abs().amax().detach() / 8).clamp_min(torch.finfo(u.dtype).tiny)
        y = F.layer_norm(u / scale, x.shape[-1:], self.weight, self.bias, self.eps)
        return y.to(x.dtype)


class BatchNorm(nn.Module):
    """y = (x - mu_B) / sqrt(sigma_B^2 + eps) * g + b, mu_B and sigma_B^2 (biased) per channel over all
    tokens of the batch (Ioffe & Szegedy 2015; PowerNorm Alg. 1, eq. (1)-(3)).

    Eval uses running statistics, running = alpha * running + (1 - alpha) * batch (Alg. 1), so a token's
    output does not depend on the rest of the batch. In training it does: in a causal LM every token is
    normalized with statistics of the whole batch, future tokens included.
    Under DDP the statistics are per rank, and DDP's buffer broadcast makes rank 0's running buffers win.
    """

    def __init__(self, dim, eps=1e-5, affine="both", alpha=0.9):
        super().__init__()
        self.eps, self.alpha = eps, alpha
        self.weight, self.bias = gamma_beta(dim, affine)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x):
        u = upcast(x)
        if self.training:
            mean = mean_tokens(u)
            var = mean_tokens((u - mean) ** 2)  # biased, as in Alg. 1 (torch's BatchNorm keeps the unbiased one)
            self.update_running(mean.detach(), var.detach())
        else:
            mean, var = self.running_mean, self.running_var
        z = (u - mean) * torch.rsqrt(var + self.eps)
        return scale_shift(z, self.weight, self.bias).to(x.dtype)

    @torch.no_grad()
    def update_running(self, mean, var):
        self.running_mean.mul_(self.alpha).add_((1 - self.alpha) * mean)
        self.running_var.mul_(self.alpha).add_((1 - self.alpha) * var)


class PNV(nn.Module):
    """y = x / sqrt(psi_B^2 + eps) * g + b, psi_B^2 = mean of x^2 per channel over all tokens of the batch
    (PN-V: PowerNorm Def. 1, eq. (4)-(5); its exact gradient is eq. (6), which autograd computes).

    Eval uses the running quadratic mean, running_psi2 = alpha * running_psi2 + (1 - alpha) * psi_B^2,
    so a token's output does not depend on the rest of the batch. In training it does: in a causal LM
    every token is normalized with statistics of the whole batch, future tokens included.
    Under DDP the statistics are per rank, and DDP's buffer broadcast makes rank 0's running buffer win.
    """

    def __init__(self, dim, eps=1e-5, affine="both", alpha=0.9):
        super().__init__()
        self.eps, self.alpha = eps, alpha
        self.weight, self.bias = gamma_beta(dim, affine)
        self.register_buffer("running_psi2", torch.ones(dim))

    def forward(self, x):
        u = upcast(x)
        if self.training:
            psi2 = mean_tokens(u * u)
            with torch.no_grad():
                self.running_psi2.mul_(self.alpha).add_((1 - self.alpha) * psi2)
        else:
            psi2 = self.running_psi2
        z = u * torch.rsqrt(psi2 + self.eps)
        return scale_shift(z, self.weight, self.bias).to(x.dtype)


def group_scale(x, groups):
    """x / sqrt(mean_group(x^2) + 1e-5) per token and group of C / groups channels, no parameters: the
    "layer-scale layer" PowerNorm puts before the norm (App. A.1; reference code GroupScaling1D)."""
    u = x.unflatten(-1, (groups, -1))
    u = u * torch.rsqrt((u * u).mean(-1, keepdim=True) + GROUP_SCALING_EPS)
    return u.flatten(-2)


class PowerNormFunction(torch.autograd.Function):
    """z = x / sqrt(psi2 + eps) with PowerNorm's approximate backward (eq. (11)-(13)).

    psi2 is the divisor the module chose (a constant for autograd). After warmup the gradient is
    dL/dx = (g_hat - nu_(t-1) * z) / sqrt(psi2 + eps), g_hat = dL/dz = g * dL/dy. During warmup psi2 is the
    batch's psi_B^2 and nu is replaced by this batch's Lambda, which makes it PN-V's exact gradient eq. (6).
    Either way nu then takes the step of eq. (13).
    """

    @staticmethod
    def forward(ctx, x, psi2, nu, warm, eps, alpha_bwd):
        z = x * torch.rsqrt(psi2 + eps)
        ctx.save_for_backward(z, psi2, warm)
        # nu is read and updated in backward, not saved: its value then is nu_(t-1)
        ctx.nu, ctx.eps, ctx.alpha_bwd = nu, eps, alpha_bwd
        return z

    @staticmethod
    def backward(ctx, g_hat):
        z, psi2, warm = ctx.saved_tensors
        nu, a = ctx.nu, ctx.alpha_bwd
        gamma, lam = mean_tokens(z * z), mean_tokens(g_hat * z)  # Gamma^(t), Lambda^(t) of eq. (13)
        x_hat = g_hat - torch.where(warm, lam, nu) * z  # eq. (11); eq. (6) in warmup
        # eq. (12) divides by the running psi_(t-1); the reference code (sIncerass/powernorm) divides by
        # the batch psi_B here instead. We follow the paper.
        grad_x = x_hat * torch.rsqrt(psi2 + ctx.eps)
        with torch.no_grad():
            nu.mul_(1 - (1 - a) * gamma).add_((1 - a) * lam)  # eq. (13)
        return grad_x, None, None, None, None, None


class PowerNorm(nn.Module):
    """Power Normalization (Shen et al. 2020, Def. 3, Alg. 2, eq. (8)-(13)): after warmup,
    y = x / sqrt(psi_(t-1)^2 + eps) * g + b, then psi^2 <- alpha_fwd * psi^2 + (1 - alpha_fwd) * psi_B^2,
    with the approximate backward of eq. (11)-(13) (see PowerNormFunction).

    Warmup (the first `warmup` training calls, App. A.1 after Yan et al. 2020): forward and backward are
    exactly PN-V with the batch's psi_B, running_psi2 is the cumulative mean of psi_B^2 over those calls,
    and nu follows eq. (13), so both statistics are warm at the switch. With `groups`, every input is first
    group-scaled (see group_scale), in training and eval. Eval: y = x / sqrt(running_psi2 + eps) * g + b.

    Training with the batch statistic (warmup) lets a token's normalizer see the other tokens of the batch,
    future ones included, in a causal LM; after warmup the running statistic still carries earlier batches.
    Eval uses running statistics only, so a token's output does not depend on the rest of the batch.
    Under DDP the statistics are per rank, and DDP's buffer broadcast makes rank 0's buffers win.
    """

    def __init__(self, dim, eps=1e-5, affine="both", alpha_fwd=0.9, alpha_bwd=0.9, warmup=0, groups=0):
        super().__init__()
        self.eps, self.alpha_fwd, self.alpha_bwd = eps, alpha_fwd, alpha_bwd
        self.warmup, self.groups = warmup, groups
        self.weight, self.bias = gamma_beta(dim, affine)
        self.register_buffer("running_psi2", torch.ones(dim))
        self.register_buffer("nu", torch.zeros(dim))
        # a buffer, so that a checkpoint resumes warmup where it stopped
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        u = upcast(x)
        if self.groups:
            u = group_scale(u, self.groups)
        if self.training:
            z = self.train_forward(u)
        else:
            z = u * torch.rsqrt(self.running_psi2 + self.eps)
        return scale_shift(z, self.weight, self.bias).to(x.dtype)

    def train_forward(self, u):
        # tensors, not Python branches, so the warmup switch costs no host sync on a GPU
        warm = self.calls < self.warmup
        with torch.no_grad():
            psi2_batch = mean_tokens(u * u)
            psi2 = torch.where(warm, psi2_batch, self.running_psi2)  # eq. (8): psi_(t-1), from before this call
            # the mean of psi_B^2 over the k = calls + 1 warmup calls so far, updated in place
            cumulative = self.running_psi2 + (psi2_batch - self.running_psi2) / (self.calls + 1)
            ema = self.alpha_fwd * self.running_psi2 + (1 - self.alpha_fwd) * psi2_batch  # eq. (10)
            self.running_psi2.copy_(torch.where(warm, cumulative, ema))
            self.calls.add_(1)
        return PowerNormFunction.apply(u, psi2, self.nu, warm, self.eps, self.alpha_bwd)


class Identity(nn.Module):
    """y = x: no normalization, the ablation that shows what normalization prevents (an ablation)."""

    def forward(self, x):
        return x


def make_norm(kind, dim, eps=1e-5, affine="both", *, alpha_fwd=0.9, alpha_bwd=0.9, warmup=0, groups=0):
    """The norm module `kind` for (..., dim) inputs; alpha_fwd is also the momentum of the running
    statistics of batchnorm and pnv; alpha_bwd, warmup and groups matter only for powernorm."""
    if kind not in NORMS:
        raise ValueError(f"norm={kind!r} is not a norm; choose one of {', '.join(NORMS)}")
    if affine not in AFFINE:
        raise ValueError(f"affine={affine!r} is not an affine setting; choose one of {', '.join(AFFINE)}")
    if not (0 < alpha_fwd < 1 and 0 < alpha_bwd < 1):
        raise ValueError(f"alpha_fwd={alpha_fwd}, alpha_bwd={alpha_bwd}: both must be in (0, 1) (PowerNorm eq. (10))")
    if groups < 0 or (groups and dim % groups):
        raise ValueError(f"groups={groups} must be 0 (off) or divide dim={dim}")
    if kind == "layernorm":
        return LayerNorm(dim, eps, affine)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps, affine)
    if kind == "cogview":
        return CogViewLayerNorm(dim, eps, affine)
    if kind == "batchnorm":
        return BatchNorm(dim, eps, affine, alpha_fwd)
    if kind == "pnv":
        return PNV(dim, eps, affine, alpha_fwd)
    if kind == "powernorm":
        return PowerNorm(dim, eps, affine, alpha_fwd, alpha_bwd, warmup, groups)
    return Identity()
