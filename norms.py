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


def normalize_affine(x, rstd, weight, bias):
    """g * x * rstd + b for a per-channel rstd: g * rstd folds into one factor, so it is one pass over x."""
    scale = rstd if weight is None else weight * rstd
    return x * scale if bias is None else torch.addcmul(bias, x, scale)


def upcast(x):
    # a bf16 mean of activations around 1e3 is off by units, so the statistics are taken in float32
    return x.float() if x.element_size() < 4 else x


def tokens(x):
    """x as a (B*T, C) matrix: the batch-statistic norms treat every token of the batch alike."""
    return x.reshape(-1, x.shape[-1])


def mean_square_tokens(x):
    """psi_B^2 = mean of x^2 over all B*T tokens, per channel (PowerNorm eq. (4)), summed over each sequence's T
    tokens first and then over the B sequences: on CPU, a sum over dim 0 of a (B*T, C) matrix just written by
    another op took 2-10x as long as these two sums (bench.py --part=norm)."""
    squares = x.square()
    per_sequence = squares.sum(-2) if x.dim() > 2 else squares
    return tokens(per_sequence).sum(0).div_(x.numel() // x.shape[-1])


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


class RMSNormFunction(torch.autograd.Function):
    """y = g * x / r, r = sqrt(mean(x^2) + eps) over the last dim, with the closed-form gradient
    dL/dx = (dz - z * mean(dz * z)) / r, z = x / r, dz = g * dL/dy, and dL/dg = sum over tokens of dL/dy * z
    (Zhang & Sennrich 2019). g may be None (no gain).

    The backward is LayerNorm's fused kernel given a mean of 0 and RMSNorm's 1/r: it then computes
    (dz - mean(dz) - z * mean(dz * z)) / r and dL/dg in one pass over the activations, and adding back
    mean(dz) / r per token gives RMSNorm's dL/dx. On CPU, torch's own rms_norm is six kernels forward (three
    writing a tensor the size of x) and fourteen backward; this writes two forward (one with no gain) and one
    backward.
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        # mean(x^2) = |x|^2 / C, read in one pass without an x^2 temporary; the rest is in place on (..., 1)
        rstd = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        ctx.save_for_backward(x, rstd, weight)
        y = x * rstd
        # not y.mul_(weight): torch 2.11's torch.compile drops the gradient of a Function whose output was changed
        # in place (zero dL/dx and dL/dg with every backend); the extra tensor costs about 3% of this module on CPU
        return y if weight is None else y * weight

    @staticmethod
    def backward(ctx, dy):
        x, rstd, weight = ctx.saved_tensors
        C = x.shape[-1]
        mask = [True, weight is not None and ctx.needs_input_grad[1], False]
        grad_x, grad_weight, _ = torch.ops.aten.native_layer_norm_backward.default(
            dy, x, [C], torch.zeros_like(rstd), rstd, weight, None, mask)
        # sum_c(g * dL/dy) per token as a product and a row sum: as a matrix-vector product, dy @ g, it made
        # the whole module up to 1.9x slower on CPU (bench.py --part=norm)
        dz_sum = dy.sum(-1, keepdim=True) if weight is None else (dy * weight).sum(-1, keepdim=True)
        return grad_x.add_(dz_sum.mul_(rstd).div_(C)), grad_weight, None


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * g over the C features of each token, never a bias
    (Zhang & Sennrich 2019; the "T5" LN variant of NormFormer Table 8; Spike No More §5.3).
    See RMSNormFunction for the gradient."""

    def __init__(self, dim, eps=1e-5, affine="both"):
        super().__init__()
        self.eps = eps
        # T5 drops the bias, so `affine` only decides whether g exists
        self.weight, self.bias = gamma_beta(dim, affine)[0], None

    def forward(self, x):
        return RMSNormFunction.apply(upcast(x), self.weight, self.eps).to(x.dtype)


class CogViewLayerNorm(nn.Module):
    """y = LN(x / (max|x| / 8)), the max over the whole tensor and detached
    (CogView "PB-relax", Ding et al. 2021 §2.4; NormFormer Table 8). Equal to LN up to eps: it keeps
    fp16 activations in range, it does not change the math. The whole-tensor max couples the tokens of a
    batch only through eps, in eval too: LN(x / s) is LN(x) with eps * s^2 for eps, so one large token, a later
    one included, changes the others a little (NormFormer writes LN(X / Max(X)); the /8 is CogView's code)."""

    def __init__(self, dim, eps=1e-5, affine="both"):
        super().__init__()
        self.eps = eps
        self.weight, self.bias = gamma_beta(dim, affine)

    def forward(self, x):
        u = upcast(x)
        # the scale is a constant for autograd, as in CogView's code; tiny keeps an all-zero input finite.
        # max|u| = max(max u, -min u), read in one pass: the infinity norm (vector_norm) took 20x as long on CPU
        low, high = torch.aminmax(u.detach())
        scale = (torch.maximum(high, -low) / 8).clamp_min(torch.finfo(u.dtype).tiny)
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
        u = tokens(upcast(x))
        if self.training:
            # torch's fused kernel computes Alg. 1 with the biased variance, and its backward is the closed form
            # of eq. (3). It also returns the batch mean and 1 / sqrt(var + eps) it used, from which the running
            # statistics are updated: F.batch_norm would keep the unbiased variance.
            y, mean, rstd = torch.native_batch_norm(u, self.weight, self.bias, None, None, True, 0.0, self.eps)
            self.update_running(mean, rstd ** -2 - self.eps)
        else:
            y = F.batch_norm(u, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return y.reshape(x.shape).to(x.dtype)

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
        if not self.training:
            return normalize_affine(u, torch.rsqrt(self.running_psi2 + self.eps), self.weight, self.bias).to(x.dtype)
        with torch.no_grad():
            psi2 = mean_square_tokens(u)
            self.running_psi2.mul_(self.alpha).add_((1 - self.alpha) * psi2)
        # with the batch's psi_B and no nu, PowerNormFunction's gradient is PN-V's exact one, eq. (6)
        return PowerNormFunction.apply(u, self.weight, self.bias, psi2, None, None, None, self.eps, None).to(x.dtype)


def group_scale(x, groups):
    """x / sqrt(mean_group(x^2) + 1e-5) per token and group of C / groups channels, no parameters: the
    "layer-scale layer" PowerNorm puts before the norm (App. A.1; reference code GroupScaling1D). That is
    RMSNorm without a gain over each group."""
    return RMSNormFunction.apply(x.unflatten(-1, (groups, -1)), None, GROUP_SCALING_EPS).flatten(-2)


class PowerNormFunction(torch.autograd.Function):
    """y = g * z + b, z = x / sqrt(psi2 + eps) per channel, with PowerNorm's approximate backward
    (eq. (11)-(13)): g_hat = g * dL/dy, dL/dx = (g_hat - nu_(t-1) * z) / sqrt(psi2 + eps), then
    nu <- nu * (1 - (1 - alpha_bwd) * Gamma) + (1 - alpha_bwd) * Lambda with Gamma = mean_tokens(z^2) and
    Lambda = mean_tokens(g_hat * z); dL/dg = sum_tokens(dL/dy * z), dL/db = sum_tokens(dL/dy).
    (mean_tokens and sum_tokens: per channel, over all B*T tokens of the batch.)

    psi2 is the divisor the module chose (a constant for autograd), psi2_batch = mean_tokens(x^2). Where
    `warm` (PowerNorm's warmup) psi2 is psi2_batch and nu_(t-1) is replaced by this batch's Lambda, which
    makes it PN-V's exact gradient eq. (6); nu then still takes the step of eq. (13). psi2, nu and warm None:
    PN-V itself, divided by psi2_batch, always eq. (6), no nu to update.

    Autograd through x * rsqrt(psi2 + eps) * g + b would write about ten temporaries the size of x. Here the
    forward folds g and 1 / psi into one per-channel factor (one pass), and the backward starts from batch
    norm's fused eval-mode kernel given a mean of 0 and variance psi2: in one pass it computes g_hat / psi,
    sum_tokens(dL/dy * z) = dL/dg and sum_tokens(dL/dy) = dL/db. Lambda = g * dL/dg / (B*T) and
    Gamma = psi2_batch / (psi2 + eps) follow without touching x, and one more pass subtracts coef * z / psi.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, psi2_batch, psi2, nu, warm, eps, alpha_bwd):
        psi2 = psi2_batch if psi2 is None else psi2
        rstd = torch.rsqrt(psi2 + eps)
        ctx.save_for_backward(x, weight, psi2, rstd, psi2_batch, warm)
        # nu is read and updated in backward, not saved: its value then is nu_(t-1)
        ctx.nu, ctx.alpha_bwd, ctx.eps = nu, alpha_bwd, eps
        return normalize_affine(x, rstd, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight, psi2, rstd, psi2_batch, warm = ctx.saved_tensors
        nu, a = ctx.nu, ctx.alpha_bwd
        X, dY = tokens(x), tokens(dy)
        mask = [True, True, ctx.needs_input_grad[2]]  # dL/dg is always needed: it gives Lambda
        grad_x, dy_z, grad_bias = torch.ops.aten.native_batch_norm_backward.default(
            dY, X, weight, torch.zeros_like(psi2), psi2, None, None, False, ctx.eps, mask)
        lam = dy_z / X.shape[0] if weight is None else weight * dy_z / X.shape[0]  # Lambda^(t) of eq. (13)
        coef = lam if nu is None else torch.where(warm, lam, nu)  # eq. (11); eq. (6) in warmup and for PN-V
        # eq. (12) divides by the running psi_(t-1). Alg. 2, read line by line, divides by the psi the forward
        # has just updated, psi_t, and the reference code (sIncerass/powernorm) by the batch psi_B. We follow
        # eq. (12). (g_hat - coef * z) / psi, z = x / psi:
        inv_var = rstd.square()
        grad_x.addcmul_(X, coef * inv_var, value=-1)
        if nu is not None:
            with torch.no_grad():
                # eq. (13), nu <- nu (1 - (1 - a) Gamma) + (1 - a) Lambda, written nu += (1 - a)(Lambda - Gamma nu)
                gamma = psi2_batch * inv_var  # Gamma = mean_tokens(z^2)
                nu.add_(torch.addcmul(lam, gamma, nu, value=-1), alpha=1 - a)
        grad_weight = dy_z if ctx.needs_input_grad[1] else None
        return grad_x.view(x.shape), grad_weight, grad_bias, None, None, None, None, None, None


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
            y = self.train_forward(u)
        else:
            y = normalize_affine(u, torch.rsqrt(self.running_psi2 + self.eps), self.weight, self.bias)
        return y.to(x.dtype)

    def train_forward(self, u):
        # tensors, not Python branches, so the warmup switch costs no host sync on a GPU
        warm = self.calls < self.warmup
        with torch.no_grad():
            psi2_batch = mean_square_tokens(u)
            psi2 = torch.where(warm, psi2_batch, self.running_psi2)  # eq. (8): psi_(t-1), from before this call
            # both updates move running_psi2 toward psi_B^2: by 1 / k in warmup (k = calls + 1, the cumulative
            # mean of psi_B^2 over the k warmup calls so far), by 1 - alpha_fwd after it (the EMA of eq. (10))
            calls = self.calls + 1
            step = torch.where(warm, calls.to(psi2_batch.dtype).reciprocal_(), 1 - self.alpha_fwd)
            # new tensors, not in-place updates: torch.compile's backward may recompute psi2 and warm from these
            # buffers, and must find their values from before this call
            self.running_psi2 = self.running_psi2.lerp(psi2_batch, step)
            self.calls = calls
        return PowerNormFunction.apply(u, self.weight, self.bias, psi2_batch, psi2, self.nu, warm, self.eps,
                                       self.alpha_bwd)


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
