"""
norms.py against the papers: every forward and every gradient below is the paper's equation written out
in plain tensor arithmetic (float64, seeded random inputs, odd sizes), never autograd run on a reference.
X is the (N, C) matrix of the N = B*T tokens, the paper's B x d input (PowerNorm §3, footnote 1).
The forward, backward and PowerNorm step tests run each module on the CPU and on a CUDA GPU where there is one
(float64 on both, against the same formulas computed on the CPU).
"""

import inspect
import os

import pytest
import torch

import norms
from norms import AFFINE, NORMS, make_norm

SHAPES = [(4, 7, 13), (3, 1, 10), (2, 5, 24)]
EPS = 1e-3  # not the default 1e-5, so a module that ignores its eps argument fails
GROUP_EPS = 1e-5  # PowerNorm's group scaling eps, fixed (reference code GroupScaling1D)
EXACT = dict(rtol=1e-10, atol=1e-12)
# the per-token norms with a statistic (DyT has none: its formula is tested on its own)
PER_TOKEN = tuple(kind for kind in norms.PER_TOKEN_NORMS if kind != "dyt")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # skipped without a GPU (conftest.py)
BATCH_STAT = ("batchnorm", "pnv")


def generator(seed):
    return torch.Generator().manual_seed(seed)


def rand(shape, gen, offset=0.5):
    """Normal draws plus an offset, so the inputs have a nonzero mean."""
    return torch.randn(shape, generator=gen, dtype=torch.float64) + offset


def tokens(x):
    return x.reshape(-1, x.shape[-1])


def build(kind, dim, affine, gen, eps=EPS, **kwargs):
    """A float64 module whose gains and shifts are random, so that g and b take part in every check."""
    m = make_norm(kind, dim, eps=eps, affine=affine, **kwargs).double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(rand(p.shape, gen, offset=1.0))
    return m


def gain_shift(m, dim):
    """The module's g and b, or 1 and 0 where the affine setting leaves them out."""
    g, b = getattr(m, "weight", None), getattr(m, "bias", None)
    g = torch.ones(dim, dtype=torch.float64) if g is None else g.detach()
    b = torch.zeros(dim, dtype=torch.float64) if b is None else b.detach()
    return g, b


def run(m, x, dy, call=None, device="cpu"):
    """The module's y and autograd's dL/dx, dL/dg, dL/db for L = sum(y * dy), computed on `device` (where m is)
    and returned on the CPU; `call` wraps m (torch.compile)."""
    x = x.to(device, copy=True).requires_grad_(True)
    m.zero_grad(set_to_none=True)
    y = (m if call is None else call)(x)
    y.backward(dy.to(device))
    grads = [None if p is None else p.grad for p in (getattr(m, "weight", None), getattr(m, "bias", None))]
    return tuple(None if t is None else t.detach().cpu() for t in (y, x.grad, *grads))


# Forward formulas, each returning z (before g and b)

def layernorm_z(x, eps):
    """Ba et al. 2016: (x - E[x]) / sqrt(Var[x] + eps) per token."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


def rmsnorm_z(x, eps):
    """Zhang & Sennrich 2019: x / sqrt(mean(x^2) + eps) per token."""
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)


def cogview_scale(x):
    """CogView PB-relax: max|x| over the whole tensor, divided by 8."""
    return x.abs().max() / 8


def cogview_z(x, eps):
    return layernorm_z(x / cogview_scale(x), eps)


def batchnorm_z(x, eps):
    """PowerNorm eq. (1): (X - mu_B) / sqrt(sigma_B^2 + eps), statistics per channel over the tokens."""
    X = tokens(x)
    mu = X.mean(0)
    var = ((X - mu) ** 2).mean(0)
    return ((X - mu) / torch.sqrt(var + eps)).reshape(x.shape)


def pnv_z(x, eps):
    """PowerNorm eq. (4): X / psi_B, psi_B^2 = mean over tokens of X^2 (+ eps)."""
    X = tokens(x)
    return (X / torch.sqrt((X ** 2).mean(0) + eps)).reshape(x.shape)


Z_FORMULA = {"layernorm": layernorm_z, "rmsnorm": rmsnorm_z, "cogview": cogview_z,
             "batchnorm": batchnorm_z, "pnv": pnv_z}


# Gradient formulas: dL/dx from g and dy = dL/dy

def layernorm_dx(x, g, dy, eps):
    """LN closed form: (dz - mean(dz) - z mean(dz z)) / sigma per token, dz = g dy."""
    sigma = torch.sqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + eps)
    z, dz = layernorm_z(x, eps), g * dy
    return (dz - dz.mean(-1, keepdim=True) - z * (dz * z).mean(-1, keepdim=True)) / sigma


def rmsnorm_dx(x, g, dy, eps):
    """RMSNorm closed form: (dz - z mean(dz z)) / r per token, r = sqrt(mean(x^2) + eps), dz = g dy."""
    r = torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)
    z, dz = x / r, g * dy
    return (dz - z * (dz * z).mean(-1, keepdim=True)) / r


def cogview_dx(x, g, dy, eps):
    """LN's closed form at x / s, times 1 / s: the scale s is a constant (detached)."""
    s = cogview_scale(x)
    return layernorm_dx(x / s, g, dy, eps) / s


def batchnorm_dx(x, g, dy, eps):
    """PowerNorm eq. (3): dL/dx_i = g/s dy_i - g/(s N) sum_j (dy_j + dy_j xt_j xt_i), s = sqrt(sigma_B^2 + eps)."""
    X, dY = tokens(x), tokens(dy)
    N = X.shape[0]
    mu = X.mean(0)
    s = torch.sqrt(((X - mu) ** 2).mean(0) + eps)
    Xt = (X - mu) / s
    dX = g / s * dY - g / (s * N) * (dY.sum(0) + (dY * Xt).sum(0) * Xt)
    return dX.reshape(x.shape)


def pnv_dx(x, g, dy, eps):
    """PowerNorm eq. (6): dL/dx_i = g/psi dy_i - g/(N psi) sum_j dy_j xh_j xh_i, psi = sqrt(psi_B^2 + eps)."""
    X, dY = tokens(x), tokens(dy)
    N = X.shape[0]
    psi = torch.sqrt((X ** 2).mean(0) + eps)
    Xh = X / psi
    dX = g / psi * dY - g / (N * psi) * (dY * Xh).sum(0) * Xh
    return dX.reshape(x.shape)


DX_FORMULA = {"layernorm": layernorm_dx, "rmsnorm": rmsnorm_dx, "cogview": cogview_dx,
              "batchnorm": batchnorm_dx, "pnv": pnv_dx}


def group_scale(x, groups):
    """PowerNorm App. A.1 layer-scale, per token and group: x / sqrt(mean_group(x^2) + 1e-5)."""
    if not groups:
        return x
    xg = x.reshape(*x.shape[:-1], groups, -1)
    return (xg / torch.sqrt((xg ** 2).mean(-1, keepdim=True) + GROUP_EPS)).reshape(x.shape)


def group_scale_dx(x, du, groups):
    """Its gradient, RMSNorm's closed form per group without a gain: (du - u mean_group(du u)) / r."""
    if not groups:
        return du
    xg, dug = x.reshape(*x.shape[:-1], groups, -1), du.reshape(*du.shape[:-1], groups, -1)
    r = torch.sqrt((xg ** 2).mean(-1, keepdim=True) + GROUP_EPS)
    u = xg / r
    return ((dug - u * (dug * u).mean(-1, keepdim=True)) / r).reshape(x.shape)


# The interface

EXPECTED_PARAMS = {"both": {"weight", "bias"}, "no_bias": {"weight"}, "no_gamma": {"bias"}, "none": set()}


@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("kind", NORMS)
def test_parameters_follow_affine(kind, affine):
    m = make_norm(kind, 11, affine=affine)
    expected = EXPECTED_PARAMS[affine]
    if kind == "rmsnorm":
        expected = expected - {"bias"}  # the T5 variant never has a bias
    if kind == "none":
        expected = set()
    if kind == "dyt":
        assert m.alpha.shape == () and m.alpha.item() == 0.5  # DyT's one scalar alpha, init alpha0 = 0.5
        expected = expected | {"alpha"}
    assert {name for name, _ in m.named_parameters()} == expected
    expected = expected - {"alpha"}
    for name in expected:
        p = getattr(m, name)
        assert p.shape == (11,)
        assert torch.equal(p.detach(), torch.full((11,), 1.0 if name == "weight" else 0.0))


def test_make_norm_rejects_a_bad_kind():
    with pytest.raises(ValueError) as err:
        make_norm("groupnorm", 8)
    message = str(err.value)
    assert "groupnorm" in message and "\n" not in message
    assert all(kind in message for kind in NORMS)


def test_make_norm_rejects_a_bad_affine():
    with pytest.raises(ValueError) as err:
        make_norm("layernorm", 8, affine="gamma_only")
    message = str(err.value)
    assert "gamma_only" in message and "\n" not in message
    assert all(a in message for a in AFFINE)


def test_make_norm_rejects_groups_that_do_not_divide_dim():
    with pytest.raises(ValueError, match="groups=5"):
        make_norm("powernorm", 12, groups=5)


# Forward and backward against the papers

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", PER_TOKEN + BATCH_STAT)
def test_forward_matches_formula(kind, shape, affine, device):
    gen = generator(1)
    m = build(kind, shape[-1], affine, gen)
    x = rand(shape, gen)
    g, b = gain_shift(m, shape[-1])
    torch.testing.assert_close(m.to(device)(x.to(device)).cpu(), Z_FORMULA[kind](x, EPS) * g + b, **EXACT)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", PER_TOKEN + BATCH_STAT)
def test_backward_matches_formula(kind, shape, affine, device):
    gen = generator(2)
    m = build(kind, shape[-1], affine, gen)
    x, dy = rand(shape, gen), rand(shape, gen)
    g, _ = gain_shift(m, shape[-1])
    _, dx, dg, db = run(m.to(device), x, dy, device=device)
    torch.testing.assert_close(dx, DX_FORMULA[kind](x, g, dy, EPS), **EXACT)
    z = Z_FORMULA[kind](x, EPS)
    if dg is not None:
        torch.testing.assert_close(dg, tokens(dy * z).sum(0), **EXACT)  # dL/dg = sum_i dy_i z_i
    if db is not None:
        torch.testing.assert_close(db, tokens(dy).sum(0), **EXACT)  # dL/db = sum_i dy_i


def module_gradcheck(m, x):
    """gradcheck over x and every parameter of m; fast mode checks a random projection of the Jacobian,
    which catches the same errors and keeps the file fast."""
    names = [name for name, _ in m.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for p in m.parameters()]

    def f(x, *ps):
        return torch.func.functional_call(m, dict(zip(names, ps)), (x,))

    return torch.autograd.gradcheck(f, (x.clone().requires_grad_(True), *params), fast_mode=True)


@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", PER_TOKEN + BATCH_STAT)
def test_gradcheck(kind, shape, affine):
    gen = generator(3)
    # CogView's detached max is the true derivative only where LN is exactly scale invariant: eps = 0
    m = build(kind, shape[-1], affine, gen, eps=0.0 if kind == "cogview" else EPS)
    assert module_gradcheck(m, rand(shape, gen))


def test_norms_call_no_private_kernels():
    """Each forward is its equation in public torch operations, and autograd or the one Function the paper
    defines (PowerNorm's) gives the gradient: no aten kernel called by hand."""
    source = inspect.getsource(norms)
    assert "torch.ops" not in source and "native_" not in source


@pytest.mark.parametrize("shape,groups", [((3, 5, 12), 2), ((4, 7, 15), 3), ((2, 3, 8), 8)])
def test_group_scale_is_rmsnorm_per_group_without_a_gain(shape, groups):
    """PowerNorm's group scaling alone: the forward and the closed-form gradient per group, and gradcheck."""
    gen = generator(17)
    x, du = rand(shape, gen), rand(shape, gen)
    xr = x.clone().requires_grad_(True)
    u = norms.group_scale(xr, groups)
    u.backward(du)
    torch.testing.assert_close(u, group_scale(x, groups), **EXACT)
    torch.testing.assert_close(xr.grad, group_scale_dx(x, du, groups), **EXACT)
    assert torch.autograd.gradcheck(lambda v: norms.group_scale(v, groups), (x.requires_grad_(True),))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", SHAPES)
def test_dyt_forward_and_backward_match_formula(shape, affine, device):
    """DyT eq. (1): y = g tanh(alpha x) + b, so dL/dx = dy g alpha (1 - tanh^2(alpha x)),
    dL/dalpha = sum over every element of dy g x (1 - tanh^2(alpha x)), dL/dg = sum_i dy_i tanh(alpha x_i)."""
    gen = generator(18)
    m = build("dyt", shape[-1], affine, gen)
    x, dy = rand(shape, gen), rand(shape, gen)
    g, b = gain_shift(m, shape[-1])
    alpha = m.alpha.detach().clone()
    t = torch.tanh(alpha * x)
    y, dx, dg, db = run(m.to(device), x, dy, device=device)
    torch.testing.assert_close(y, t * g + b, **EXACT)
    torch.testing.assert_close(dx, dy * g * alpha * (1 - t ** 2), **EXACT)
    torch.testing.assert_close(m.alpha.grad.cpu(), (dy * g * x * (1 - t ** 2)).sum(), **EXACT)
    if dg is not None:
        torch.testing.assert_close(dg, tokens(dy * t).sum(0), **EXACT)
    if db is not None:
        torch.testing.assert_close(db, tokens(dy).sum(0), **EXACT)
    assert module_gradcheck(m, x.to(device))


def test_none_is_the_identity():
    x = rand((2, 3, 5), generator(4))
    assert make_norm("none", 5)(x) is x


# Running statistics and eval of the batch-statistic norms

@pytest.mark.parametrize("shape", SHAPES)
def test_batchnorm_running_statistics_follow_alg_1(shape):
    gen, a = generator(5), 0.8
    m = build("batchnorm", shape[-1], "both", gen, alpha_fwd=a)
    mean, var = torch.zeros(shape[-1], dtype=torch.float64), torch.ones(shape[-1], dtype=torch.float64)
    for _ in range(3):
        X = tokens(rand(shape, gen))
        m(X.reshape(shape))
        mean = a * mean + (1 - a) * X.mean(0)
        var = a * var + (1 - a) * ((X - X.mean(0)) ** 2).mean(0)  # the biased sigma_B^2 of Alg. 1
        torch.testing.assert_close(m.running_mean, mean, **EXACT)
        torch.testing.assert_close(m.running_var, var, **EXACT)


@pytest.mark.parametrize("shape", SHAPES)
def test_pnv_running_statistic_is_an_ema_of_psi_b(shape):
    gen, a = generator(6), 0.8
    m = build("pnv", shape[-1], "both", gen, alpha_fwd=a)
    psi2 = torch.ones(shape[-1], dtype=torch.float64)
    for _ in range(3):
        X = tokens(rand(shape, gen))
        m(X.reshape(shape))
        psi2 = a * psi2 + (1 - a) * (X ** 2).mean(0)
        torch.testing.assert_close(m.running_psi2, psi2, **EXACT)


def eval_formula(m, x):
    """Inference with running statistics: Alg. 1 for batchnorm, Alg. 2 for pnv and powernorm."""
    g, b = gain_shift(m, x.shape[-1])
    if isinstance(m, norms.BatchNorm):
        return (x - m.running_mean) / torch.sqrt(m.running_var + EPS) * g + b
    return group_scale(x, getattr(m, "groups", 0)) / torch.sqrt(m.running_psi2 + EPS) * g + b


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["batchnorm", "pnv", "powernorm"])
def test_eval_uses_running_statistics_only(kind, shape):
    gen = generator(7)
    groups = 2 if shape[-1] % 2 == 0 else 0
    m = build(kind, shape[-1], "both", gen, alpha_fwd=0.8, warmup=1, groups=groups)
    for _ in range(3):
        m(rand(shape, gen)).sum().backward()
    m.eval()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    x = rand(shape, gen, offset=2.0)  # far from the training data, so batch statistics would differ
    y = m(x)
    torch.testing.assert_close(y, eval_formula(m, x), **EXACT)
    X = tokens(x).clone()
    X[1:] = rand(X[1:].shape, gen, offset=-3.0)  # every token but the first replaced
    torch.testing.assert_close(tokens(m(X.reshape(shape)))[0], tokens(y)[0], **EXACT)
    for k, v in m.state_dict().items():
        assert torch.equal(v, state[k]), f"eval changed {k}"


@pytest.mark.parametrize("kind", BATCH_STAT)
def test_training_mode_mixes_tokens(kind):
    """The leak the docstrings warn about: in training a token's output depends on the other tokens."""
    gen = generator(8)
    m = build(kind, 6, "both", gen)
    x = rand((2, 4, 6), gen)
    other = x.clone()
    other[1, 3] += 1.0
    assert not torch.allclose(m(x)[0, 0], m(other)[0, 0])


# PowerNorm, step by step

PN_CASES = [((4, 7, 13), 0), ((3, 1, 10), 2), ((2, 5, 24), 4), ((2, 5, 24), 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape,groups", PN_CASES)
def test_powernorm_follows_eqs_8_to_13_over_steps(shape, groups, affine, device):
    gen, warmup, a_fwd, a_bwd = generator(9), 2, 0.8, 0.7  # two alphas that differ, so a swap shows
    C = shape[-1]
    m = build("powernorm", C, affine, gen, alpha_fwd=a_fwd, alpha_bwd=a_bwd, warmup=warmup, groups=groups)
    g, b = gain_shift(m, C)
    m.to(device)
    psi2, nu = torch.ones(C, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)
    for t in range(6):
        x, dy = rand(shape, gen, offset=0.3 * t), rand(shape, gen)
        y, dx, dg, db = run(m, x, dy, device=device)

        X, dY = tokens(group_scale(x, groups)), tokens(dy)
        psi2_batch = (X ** 2).mean(0)
        if t < warmup:  # PN-V with the batch psi_B; running_psi2 is the mean of psi_B^2 so far
            divisor = psi2_batch
            psi2 = (psi2 * t + psi2_batch) / (t + 1)
        else:  # eq. (8): psi from step t-1, then eq. (10)
            divisor = psi2
            psi2 = a_fwd * psi2 + (1 - a_fwd) * psi2_batch
        Z = X / torch.sqrt(divisor + EPS)
        g_hat = g * dY  # dL/dX_hat
        if t < warmup:
            dX = tokens(pnv_dx(X, g, dY, EPS))  # eq. (6)
        else:
            dX = (g_hat - nu * Z) / torch.sqrt(divisor + EPS)  # eq. (11)-(12) with nu_(t-1), psi_(t-1)
        nu = nu * (1 - (1 - a_bwd) * (Z * Z).mean(0)) + (1 - a_bwd) * (g_hat * Z).mean(0)  # eq. (13)

        torch.testing.assert_close(y, (Z * g + b).reshape(shape), **EXACT)
        torch.testing.assert_close(dx, group_scale_dx(x, dX.reshape(shape), groups), **EXACT)
        torch.testing.assert_close(m.running_psi2.cpu(), psi2, **EXACT)
        torch.testing.assert_close(m.nu.cpu(), nu, **EXACT)
        assert m.calls.item() == t + 1
        if dg is not None:
            torch.testing.assert_close(dg, (dY * Z).sum(0), **EXACT)
        if db is not None:
            torch.testing.assert_close(db, dY.sum(0), **EXACT)


def test_powernorm_keeps_nu_through_a_backward_that_overflowed():
    """Under float16 a backward can overflow, and GradScaler skips that update: nu must not take the inf in, or
    every later gradient is non-finite (eq. (11) subtracts nu * z)."""
    gen, shape = generator(15), (2, 3, 8)
    m = build("powernorm", 8, "both", gen, warmup=0)
    run(m, rand(shape, gen), rand(shape, gen))
    before = m.nu.clone()
    overflowed = rand(shape, gen)
    overflowed[0, 0, 0] = float("inf")
    run(m, rand(shape, gen), overflowed)
    assert torch.equal(m.nu, before)
    _, dx, dg, db = run(m, rand(shape, gen), rand(shape, gen))
    assert all(torch.isfinite(t).all() for t in (dx, dg, db, m.nu)) and not torch.equal(m.nu, before)


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_powernorm_switches_from_pnv_exactly_at_warmup(warmup):
    gen, shape = generator(10), (3, 4, 7)
    m = build("powernorm", 7, "both", gen, warmup=warmup)
    g, b = gain_shift(m, 7)
    for t in range(warmup + 2):
        x = rand(shape, gen, offset=1.0 + t)  # growing inputs: batch and running psi never coincide
        y, pnv = m(x), pnv_z(x, EPS) * g + b
        if t < warmup:
            torch.testing.assert_close(y, pnv, **EXACT)
        else:
            assert not torch.allclose(y, pnv), f"call {t} still uses the batch statistic"


def test_powernorm_warmup_equals_the_pnv_module():
    gen, shape = generator(11), (3, 5, 9)
    pn = build("powernorm", 9, "both", gen, warmup=4)
    pnv = make_norm("pnv", 9, eps=EPS).double()
    pnv.load_state_dict({"weight": pn.weight, "bias": pn.bias, "running_psi2": pnv.running_psi2})
    for _ in range(4):
        x, dy = rand(shape, gen), rand(shape, gen)
        for got, want in zip(run(pn, x, dy), run(pnv, x, dy)):
            torch.testing.assert_close(got, want, **EXACT)


@pytest.mark.parametrize("shape,groups", PN_CASES)
def test_powernorm_gradcheck_during_warmup(shape, groups):
    gen = generator(12)
    m = build("powernorm", shape[-1], "both", gen, warmup=10 ** 9, groups=groups)
    assert module_gradcheck(m, rand(shape, gen))


@pytest.mark.parametrize("shape,groups", PN_CASES)
def test_powernorm_group_scaling_formula(shape, groups):
    """Group scaling alone: with warmup 0 and the initial running_psi2 = 1, y = group_scale(x) / sqrt(1 + eps)."""
    gen = generator(13)
    m = make_norm("powernorm", shape[-1], eps=EPS, affine="none", groups=groups).double()
    x = rand(shape, gen, offset=2.0)
    torch.testing.assert_close(m(x), group_scale(x, groups) / (1 + EPS) ** 0.5, **EXACT)
    m.eval()
    torch.testing.assert_close(m(x), group_scale(x, groups) / torch.sqrt(m.running_psi2 + EPS), **EXACT)


def test_powernorm_state_resumes_from_a_checkpoint():
    gen, shape = generator(14), (2, 3, 8)
    a = build("powernorm", 8, "both", gen, warmup=2, groups=2)
    for _ in range(3):
        a(rand(shape, gen)).sum().backward()
    assert {"running_psi2", "nu", "calls"} <= set(a.state_dict())
    b = make_norm("powernorm", 8, eps=EPS, warmup=2, groups=2).double()
    b.load_state_dict(a.state_dict())
    x, dy = rand(shape, gen), rand(shape, gen)
    for got, want in zip(run(b, x, dy), run(a, x, dy)):
        torch.testing.assert_close(got, want, **EXACT)


# Mixed precision and torch.compile

@pytest.mark.parametrize("kind", PER_TOKEN + BATCH_STAT + ("powernorm",))
def test_autocast_bf16_keeps_dtype_and_float32_statistics(kind):
    """A bf16 input around 1000 (std 30): float32 statistics give bf16-accurate outputs, while a mean taken
    in bf16 is off by up to 2 (its spacing there is 4), i.e. 0.07 in normalized units."""
    gen = generator(15)
    m = build(kind, 24, "both", gen, warmup=1).float()
    x = (1000 + 30 * torch.randn((4, 7, 24), generator=gen)).bfloat16()
    ref = build(kind, 24, "both", generator(15), warmup=1)  # the same parameters, in float64
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
        y32 = build(kind, 24, "both", gen).float()(x.float())
    assert y.dtype == torch.bfloat16 and y32.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref(x.double()), rtol=1e-2, atol=2e-2)
    for name, buf in m.named_buffers():  # float32 statistics agree with float64 ones to float32 precision
        if buf.is_floating_point():
            torch.testing.assert_close(buf.double(), getattr(ref, name), rtol=1e-5, atol=1e-6)


COMPILE_BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    not os.environ.get("NANONORM_INDUCTOR"), reason="inductor compiles for ~30 s; set NANONORM_INDUCTOR=1"))]


@pytest.mark.slow
@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
@pytest.mark.parametrize("kind", ["rmsnorm", "batchnorm", "pnv", "powernorm"])
def test_compiled_module_matches_eager(kind, backend):
    torch._dynamo.reset()
    gen = generator(16)
    eager = make_norm(kind, 12, alpha_fwd=0.8, warmup=1, groups=3)
    compiled_module = make_norm(kind, 12, alpha_fwd=0.8, warmup=1, groups=3)
    with torch.no_grad():
        for p, q in zip(eager.parameters(), compiled_module.parameters()):
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            q.copy_(p)
    compiled = torch.compile(compiled_module, backend=backend, fullgraph=True)  # a graph break would hide work
    for _ in range(3):  # warmup, then two calls with running statistics
        x, dy = torch.randn((2, 5, 12), generator=gen) + 0.5, torch.randn((2, 5, 12), generator=gen)
        for got, want in zip(run(compiled_module, x, dy, call=compiled), run(eager, x, dy)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, buf in eager.named_buffers():
        torch.testing.assert_close(getattr(compiled_module, name), buf, rtol=1e-5, atol=1e-6)
    eager.eval(), compiled.eval()
    x = torch.randn((2, 5, 12), generator=gen)
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("kind", NORMS)
def test_no_norm_returns_a_tensor_it_changed_in_place(kind, affine):
    """torch 2.11's torch.compile (the GPU machines' torch) drops the gradient of an autograd.Function whose output
    was changed in place, with every backend: an RMSNorm Function's (x / r).mul_(g) trained with dL/dx = dL/dg = 0
    there. PowerNorm's gradient is such a Function. A tensor's version counter counts the in-place changes to it,
    so this checks for that on any torch."""
    m = make_norm(kind, 12, affine=affine, groups=3)
    for training in (True, False):
        m.train(training)
        y = m(torch.randn(2, 5, 12, requires_grad=True))
        assert y._version == 0, (kind, affine, training)


def test_only_a_norm_that_takes_groups_needs_them_to_divide_its_features():
    # qk-norm at GPT-2 small's 12 heads normalizes head dims of 64: the head count need not divide them
    assert make_norm("layernorm", 64, groups=12) is not None
    with pytest.raises(ValueError, match="divide dim=64"):
        make_norm("powernorm", 64, groups=12)
