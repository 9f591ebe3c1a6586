"""
Every normalization nanonorm can put in a norm slot, each beside its equation and paper.

Inputs are (..., C) tensors: per-token norms reduce over the last dim, batch-statistic norms over every
dim but the last (all B*T tokens, as PowerNorm §3 flattens sentences into one batch dimension).
Affine variants follow NormFormer (final) Table 8: gamma and beta, gamma only ("No Bias"), beta only ("No gamma"),
neither ("No Bias or gamma"). Half-precision inputs are normalized in float32 and returned in their dtype.
Each forward is its equation in tensor operations, or torch's function for it (F.layer_norm, F.rms_norm), and
autograd computes the exact gradient. The one handwritten backward is PowerNorm's, which the paper defines
itself (eq. (11)-(13)); test_norms.py writes every gradient out by hand and checks autograd against it.
"""

import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F

AFFINE = ("both", "no_bias", "no_gamma", "none")

# PowerNorm's group scaling uses a fixed eps, as the reference code's GroupScaling1D does
GROUP_SCALING_EPS = 1e-5


def gamma_beta(dim, affine):
    """The learned gain g (init 1) and shift b (init 0) that `affine` asks for; None where absent."""
    weight = nn.Parameter(torch.ones(dim)) if affine in ("both", "no_bias") else None
    bias = nn.Parameter(torch.zeros(dim)) if affine in ("both", "no_gamma") else None
    return weight, bias


def scale_shift(z, weight, bias):
    """y = g * z + b, per channel, leaving out g or b where the affine setting has none."""
    y = z if weight is None else z * weight
    return y if bias is None else y + bias


def upcast(x):
    # a bf16 mean of activations around 1e3 is off by units, so the statistics are taken in float32
    return x.float() if x.element_size() < 4 else x


def tokens(x):
    """x as a (B*T, C) matrix: the batch-statistic norms treat every token of the batch alike."""
    return x.reshape(-1, x.shape[-1])


def mean_var(u):
    """mu_B and the biased sigma_B^2 of PowerNorm Alg. 1, per channel over all tokens of the batch."""
    var, mean = torch.var_mean(tokens(u), dim=0, correction=0)
    return mean, var


def quadratic_mean(u):
    """psi_B^2 of PowerNorm Def. 1: the mean of x^2 per channel over all tokens of the batch."""
    return tokens(u).square().mean(0)


def distance(batch, running):
    """dist(s_B, s) = ||s_B - s|| / d, the "average Euclidean distance" between a batch statistic and its running
    value over the d channels (PowerNorm §3, Fig. 2; Fig. 4 for sigma^2 and psi^2): in eval a token is
    normalized with the running value, in training with the batch's, and this is how far apart they are."""
    return torch.linalg.vector_norm((batch - running).float()) / batch.numel()


class LayerNorm(nn.Module):
    """y = (x - E[x]) / sqrt(Var[x] + eps) * g + b over the C features of each token
    (Ba et al. 2016; NormFormer arXiv v1 eq. (1))."""

    def __init__(self, dim, eps=1e-5, affine="both"):
        super().__init__()
        self.eps = eps
        self.weight, self.bias = gamma_beta(dim, affine)

    def forward(self, x):
        y = F.layer_norm(upcast(x), x.shape[-1:], self.weight, self.bias, self.eps)
        return y.to(x.dtype)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * g over the C features of each token, never a bias
    (Zhang & Sennrich 2019; the "T5" LN variant of NormFormer (final) Table 8; Spike No More §5.3)."""

    def __init__(self, dim, eps=1e-5, affine="both"):
        super().__init__()
        self.eps = eps
        # T5 drops the bias, so `affine` only decides whether g exists
        self.weight, self.bias = gamma_beta(dim, affine)[0], None

    def forward(self, x):
        return F.rms_norm(upcast(x), x.shape[-1:], self.weight, self.eps).to(x.dtype)


class CogViewLayerNorm(nn.Module):
    """y = LN(x / (max|x| / 8)), the max over the whole tensor and detached
    (CogView "PB-relax", Ding et al. 2021 §2.4; NormFormer (final) Table 8). Equal to LN up to eps: it keeps
    fp16 activations in range, it does not change the math. The whole-tensor max couples the tokens of a
    batch only through eps, in eval too: LN(x / s) is LN(x) with eps * s^2 for eps, so one large token, a later
    one included, changes the others a little (NormFormer writes LN(X / Max(X)); the /8 is CogView's code)."""

    def __init__(self, dim, eps=1e-5, affine="both"):
        super().__init__()
        self.eps = eps
        self.weight, self.bias = gamma_beta(dim, affine)

    def forward(self, x):
        u = upcast(x)
        # the scale is a constant for autograd, as in CogView's code; tiny keeps an all-zero input finite
        scale = (u.detach().abs().amax() / 8).clamp_min(torch.finfo(u.dtype).tiny)
        y = F.layer_norm(u / scale, x.shape[-1:], self.weight, self.bias, self.eps)
        return y.to(x.dtype)


class DyT(nn.Module):
    """y = g * tanh(alpha * x) + b, alpha one learned scalar: Dynamic Tanh (Zhu, Chen, He, LeCun, Liu, CVPR 2025,
    "Transformers without Normalization", eq. (1)). Element-wise, no statistics: it replaces a norm by the S-shaped
    map that LN turns out to compute (their Fig. 2), squashing the rare large activations and passing the rest."""

    def __init__(self, dim, alpha0=0.5, affine="both"):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha0)))
        self.weight, self.bias = gamma_beta(dim, affine)

    def forward(self, x):
        return scale_shift(torch.tanh(self.alpha * upcast(x)), self.weight, self.bias).to(x.dtype)


class BatchNorm(nn.Module):
    """y = (x - mu_B) / sqrt(sigma_B^2 + eps) * g + b, mu_B and sigma_B^2 (biased) per channel over all
    tokens of the batch (Ioffe & Szegedy 2015; PowerNorm Alg. 1, eq. (1)-(3)).

    Eval uses running statistics, running = alpha * running + (1 - alpha) * batch (Alg. 1), so a token's
    output does not depend on the rest of the batch. In training it does: in a causal LM every token is
    normalized with statistics of the whole batch, future tokens included.
    Under DDP the statistics are per rank, and DDP's buffer broadcast makes rank 0's running buffers win.
    """
    STATISTICS = ("mean", "var")  # batch_distance's keys

    def __init__(self, dim, eps=1e-5, affine="both", alpha_fwd=0.9):
        super().__init__()
        self.eps, self.alpha = eps, alpha_fwd
        self.weight, self.bias = gamma_beta(dim, affine)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x):
        u = tokens(upcast(x))
        if self.training:
            mean, var = mean_var(u)
            self.update_running(mean, var)
        else:
            mean, var = self.running_mean, self.running_var
        z = (u - mean) / torch.sqrt(var + self.eps)  # eq. (1), with eps
        return scale_shift(z, self.weight, self.bias).reshape(x.shape).to(x.dtype)  # eq. (2)

    def batch_distance(self, x):
        """dist(mu_B, mu) and dist(sigma_B^2, sigma^2) of PowerNorm Fig. 2 for the batch x."""
        mean, var = mean_var(upcast(x))
        return {"mean": distance(mean, self.running_mean), "var": distance(var, self.running_var)}

    @torch.no_grad()
    def update_running(self, mean, var):
        self.running_mean.lerp_(mean, 1 - self.alpha)
        self.running_var.lerp_(var, 1 - self.alpha)


class PNV(nn.Module):
    """y = x / sqrt(psi_B^2 + eps) * g + b, psi_B^2 = mean of x^2 per channel over all tokens of the batch
    (PN-V: PowerNorm Def. 1, eq. (4)-(5); its exact gradient is eq. (6), which autograd computes).

    Eval uses the running quadratic mean, running_psi2 = alpha * running_psi2 + (1 - alpha) * psi_B^2,
    so a token's output does not depend on the rest of the batch. In training it does: in a causal LM
    every token is normalized with statistics of the whole batch, future tokens included.
    Under DDP the statistics are per rank, and DDP's buffer broadcast makes rank 0's running buffer win.
    """
    STATISTICS = ("psi2",)  # batch_distance's keys

    def __init__(self, dim, eps=1e-5, affine="both", alpha_fwd=0.9):
        super().__init__()
        self.eps, self.alpha = eps, alpha_fwd
        self.weight, self.bias = gamma_beta(dim, affine)
        self.register_buffer("running_psi2", torch.ones(dim))

    def forward(self, x):
        u = upcast(x)
        if self.training:
            psi2 = quadratic_mean(u)
            with torch.no_grad():
                self.running_psi2.lerp_(psi2, 1 - self.alpha)
        else:
            psi2 = self.running_psi2
        # eq. (4) and PowerNorm's eq. (8) have no eps: --norm_eps is our guard against a channel that is zero over
        # the whole batch, as in the reference code's x / (var + eps).sqrt() (sIncerass/powernorm, mask_powernorm.py)
        z = u / torch.sqrt(psi2 + self.eps)
        return scale_shift(z, self.weight, self.bias).to(x.dtype)  # eq. (5)

    def batch_distance(self, x):
        """dist(psi_B^2, psi^2) of PowerNorm Fig. 4 for the batch x."""
        return {"psi2": distance(quadratic_mean(upcast(x)), self.running_psi2)}


def group_scale(x, groups):
    """x / sqrt(mean_group(x^2) + 1e-5) per token and group of C / groups channels, no parameters: the
    "layer-scale layer" PowerNorm puts before the norm (App. A.1; reference code GroupScaling1D). That is
    RMSNorm without a gain over each group."""
    per_group = x.unflatten(-1, (groups, -1))
    return F.rms_norm(per_group, per_group.shape[-1:], None, GROUP_SCALING_EPS).flatten(-2)


class PowerNormGradient(torch.autograd.Function):
    """PowerNorm's approximate backward (Shen et al. 2020, Def. 3, eq. (11) and (13)), as a step on
    z = x / psi_(t-1) that is the identity in the forward. Its backward receives g_hat = dL/dz, which autograd
    has computed from eq. (9) as g * dL/dY, and returns
        g_hat' = g_hat - nu_(t-1) * z                                                    eq. (11)
    then moves nu by eq. (13) with Gamma = mean_tokens(z^2) and Lambda = mean_tokens(g_hat * z):
        nu_t = nu_(t-1) * (1 - (1 - alpha_bwd) * Gamma) + (1 - alpha_bwd) * Lambda
    Autograd carries g_hat' back through z = x / psi_(t-1), which is eq. (12). In warmup g_hat passes as it is,
    and autograd's gradient through the batch's psi_B is PN-V's exact eq. (6); nu still takes its step.
    (mean_tokens: per channel, over all B*T tokens of the batch.) Under float16's GradScaler g_hat is the scaled
    gradient, so nu is in the scaled units too, and after the scale halves or doubles it is off by that factor for
    about 1 / (1 - alpha_bwd) steps.
    """

    @staticmethod
    def forward(ctx, z, nu, warm, alpha_bwd):
        ctx.save_for_backward(z, warm)
        # nu is read and updated in backward, not saved: its value then is nu_(t-1)
        ctx.nu, ctx.alpha_bwd = nu, alpha_bwd
        # a new tensor: autograd forbids in-place changes to an input a Function returns as it is
        return z.clone()

    @staticmethod
    def backward(ctx, g_hat):
        z, warm = ctx.saved_tensors
        nu, a = ctx.nu, ctx.alpha_bwd
        Z, G = tokens(z), tokens(g_hat)
        g_hat_prime = g_hat - torch.where(warm, 0.0, nu) * z  # eq. (11), with nu_(t-1)
        Gamma = (Z * Z).mean(0)
        Lambda = (G * Z).mean(0)
        nu_t = nu * (1 - (1 - a) * Gamma) + (1 - a) * Lambda  # eq. (13)
        # a float16 backward that overflowed, whose update GradScaler skips, would leave nu inf for good: nu keeps
        # its value then, as the weights keep theirs (a tensor test, not a Python branch: no host sync)
        nu.copy_(torch.where(torch.isfinite(nu_t).all(), nu_t, nu))
        return g_hat_prime, None, None, None


class PowerNorm(nn.Module):
    """Power Normalization (Shen et al. 2020, Def. 3, Alg. 2, eq. (8)-(13)): after warmup,
    y = x / sqrt(psi_(t-1)^2 + eps) * g + b, then psi^2 <- alpha_fwd * psi^2 + (1 - alpha_fwd) * psi_B^2,
    with the approximate backward of eq. (11)-(13) (see PowerNormGradient).

    Warmup (the first `warmup` training calls, App. A.1 after Yan et al. 2020): forward and backward are
    exactly PN-V with the batch's psi_B, running_psi2 is the cumulative mean of psi_B^2 over those calls,
    and nu follows eq. (13), so both statistics are warm at the switch. With `groups`, every input is first
    group-scaled (see group_scale), in training and eval. Eval: y = x / sqrt(running_psi2 + eps) * g + b.

    Training with the batch statistic (warmup) lets a token's normalizer see the other tokens of the batch,
    future ones included, in a causal LM; after warmup the running statistic still carries earlier batches.
    Eval uses running statistics only, so a token's output does not depend on the rest of the batch.
    Under DDP the statistics are per rank, and DDP's buffer broadcast makes rank 0's buffers win.
    """
    STATISTICS = ("psi2",)  # batch_distance's keys

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
        u = self.group_scaled(upcast(x))
        if self.training:
            z = self.train_forward(u)
        else:
            z = u / torch.sqrt(self.running_psi2 + self.eps)
        return scale_shift(z, self.weight, self.bias).to(x.dtype)  # eq. (9)

    def group_scaled(self, u):
        return group_scale(u, self.groups) if self.groups else u

    def batch_distance(self, x):
        """dist(psi_B^2, psi^2) of PowerNorm Fig. 4 for the batch x; after warmup training normalizes with the
        running psi^2 too, so this is how far the batch is from what both use."""
        return {"psi2": distance(quadratic_mean(self.group_scaled(upcast(x))), self.running_psi2)}

    def train_forward(self, u):
        # a tensor, not a Python branch, so the warmup switch costs no host sync on a GPU
        warm = self.calls < self.warmup
        psi2_batch = quadratic_mean(u)
        # eq. (8) divides by psi_(t-1), the running statistic from before this call and a constant for autograd,
        # so autograd's gradient through this line divides by psi_(t-1) too: that is eq. (12). Alg. 2, read line by
        # line, divides the gradient by the psi it has just updated, psi_t, and the reference code
        # (sIncerass/powernorm) by the batch's psi_B; we follow eq. (12). In warmup the divisor is PN-V's psi_B,
        # through which autograd takes the exact gradient, eq. (6). eps is a guard, not the paper's (see PNV)
        psi2 = torch.where(warm, psi2_batch, self.running_psi2)
        z = u / torch.sqrt(psi2 + self.eps)
        with torch.no_grad():
            # both updates move running_psi2 toward psi_B^2: by 1 / k in warmup (k = calls + 1, the cumulative
            # mean of psi_B^2 over the k warmup calls so far), by 1 - alpha_fwd after it (eq. (10))
            calls = self.calls + 1
            step = torch.where(warm, calls.to(psi2_batch.dtype).reciprocal(), 1 - self.alpha_fwd)
            # new tensors, not in-place updates: torch.compile's backward may recompute psi2 and warm from these
            # buffers, and must find their values from before this call
            self.running_psi2 = self.running_psi2.lerp(psi2_batch, step)
            self.calls = calls
        return PowerNormGradient.apply(z, self.nu, warm, self.alpha_bwd)


class Identity(nn.Module):
    """y = x: no normalization, the ablation that shows what normalization prevents."""

    def __init__(self, dim):
        super().__init__()

    def forward(self, x):
        return x


# What each norm is: its class, and what a token's output depends on ("token": that token alone, so the norm means
# something over one head's q or k too, but for cogview, whose max over the whole tensor couples the tokens through
# eps, in eval too (CogViewLayerNorm); "batch": statistics of the whole batch, future tokens included, in training,
# PowerNorm §3; None: nothing, it normalizes nothing). The flags a norm reads are those of its class's arguments
# (ARGUMENTS). A new norm is its class and its row here; an argument no norm had before is also its line in
# ARGUMENTS, a keyword of make_norm (below) and of model.norm, and its flag in model.GPTConfig.
TABLE = {
    "layernorm": (LayerNorm, "token"),
    "rmsnorm": (RMSNorm, "token"),
    "cogview": (CogViewLayerNorm, "token"),
    "dyt": (DyT, "token"),
    "batchnorm": (BatchNorm, "batch"),
    "pnv": (PNV, "batch"),
    "powernorm": (PowerNorm, "batch"),
    "none": (Identity, None),
}
# The flags that set each argument of a norm class, besides dim: --norm_eps, --norm_affine; --pn_alpha_fwd, the
# running statistics' momentum; --pn_alpha_bwd, --pn_warmup, --pn_group_scaling (groups: n_head or 0), PowerNorm's
# alone; --dyt_alpha and --dyt_alpha_attn, DyT's initial alpha (model.norm picks one per slot)
ARGUMENTS = {
    "eps": ("norm_eps",),
    "affine": ("norm_affine",),
    "alpha_fwd": ("pn_alpha_fwd",),
    "alpha_bwd": ("pn_alpha_bwd",),
    "warmup": ("pn_warmup",),
    "groups": ("pn_group_scaling",),
    "alpha0": ("dyt_alpha", "dyt_alpha_attn"),
}
NORMS = tuple(TABLE)
PER_TOKEN_NORMS = tuple(kind for kind, (_, depends_on) in TABLE.items() if depends_on == "token")
BATCH_STATISTIC_NORMS = tuple(module for module, depends_on in TABLE.values() if depends_on == "batch")
NORM_FLAGS = tuple(name for names in ARGUMENTS.values() for name in names)  # every flag some norm reads


def arguments(module):
    """The names of a norm class's arguments after dim."""
    return list(inspect.signature(module).parameters)[1:]


def reads(kind):
    """The flags that set the arguments of norm `kind`."""
    return tuple(name for argument in arguments(TABLE[kind][0]) for name in ARGUMENTS[argument])


def readers(name):
    """The norms that read the flag `name` (it has an effect only with one of them)."""
    return tuple(kind for kind in NORMS if name in reads(kind))


def make_norm(kind, dim, eps=1e-5, affine="both", *, alpha_fwd=0.9, alpha_bwd=0.9, warmup=0, groups=0, alpha0=0.5):
    """The norm module `kind` for (..., dim) inputs, given the arguments its class takes (ARGUMENTS says which
    flag sets each). The values' ranges are the flags' (model.GPTConfig)."""
    if kind not in NORMS:
        raise ValueError(f"norm={kind!r} is not a norm; choose one of {', '.join(NORMS)}")
    if affine not in AFFINE:
        raise ValueError(f"affine={affine!r} is not an affine setting; choose one of {', '.join(AFFINE)}")
    module = TABLE[kind][0]
    # only a norm that takes groups (PowerNorm's group scaling) needs them to divide its features: a qk-norm's head
    # dim (64 at 768 / 12 heads) need not be a multiple of the head count
    if "groups" in arguments(module) and (groups < 0 or (groups and dim % groups)):
        raise ValueError(f"groups={groups} must be 0 (off) or divide dim={dim}")
    given = dict(eps=eps, affine=affine, alpha_fwd=alpha_fwd, alpha_bwd=alpha_bwd, warmup=warmup, groups=groups,
                 alpha0=alpha0)
    return module(dim, **{name: given[name] for name in arguments(module)})
