"""Tests of model.py against the papers: every flag acts where its paper says and adds the parameters it says,
layouts and attention are checked against the equations written out here, inits against the stds of GPT-2 §2.3,
Spike No More §3 and DeepNet, parameter counts against NormFormer arXiv v1 Table 6, and gradient norms at init against
Spike No More Fig. 3."""

import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lab import bench, coord_check
import norms
from diagnostics.probe_points import op_label, probe_points, weight_splits
from model import GPT, GPTConfig, flops_per_token, norm, softcap, subln_gain
from presets import PRESETS
from norms import PER_TOKEN_NORMS
from conftest import ROOT, TINY_CONFIG
import copy
from engine import runtime
import configs


pytestmark = pytest.mark.usefixtures("one_thread")


def build(seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY_CONFIG, **kw})).to(dtype)


def tokens(B=3, T=16, V=64, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def layer_norm(x, weight, bias, eps=1e-5):
    """Ba et al. 2016, written out: (x - E[x]) / sqrt(Var[x] + eps) * g + b over the last dim."""
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).square().mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * weight + bias


def perturb_(module, seed=7, scale=0.3):
    """Move every parameter away from its init (gains 1, biases 0, head scales 1), so that an identity-
    initialized operation that is skipped or misplaced shows up in the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


# 1. forward

ALL_SLOTS = dict(scale_attn=True, scale_fc=True, ffn_out_norm=True, qkv_norm=True, embed_norm=True)


@pytest.mark.parametrize("kind", norms.NORMS)
def test_every_norm_slot_uses_the_chosen_norm(kind):
    """--norm fills every slot. Per block: attn_norm, ffn_norm, attn_out_norm, fc_norm, ffn_out_norm
    and three qkv norms (8); plus embed_norm and the final norm of the pre layout."""
    chosen = type(norms.make_norm(kind, 8))
    norm_classes = tuple(type(norms.make_norm(k, 8)) for k in norms.NORMS)
    model = build(norm=kind, **ALL_SLOTS)
    slots = [m for m in model.modules() if isinstance(m, norm_classes)]
    assert len(slots) == 8 * TINY_CONFIG["n_layer"] + 2
    assert all(type(m) is chosen for m in slots)


def test_forward_logits_shape_and_initial_loss_is_ln_vocab():
    model = build(dtype=torch.float32, n_embd=48)
    idx, targets = tokens(B=8, seed=1), tokens(B=8, seed=2)
    # targets differ from the inputs: with tied embeddings the own-token logit is ~0.6 higher at init
    logits, loss = model(idx, targets)
    assert logits.shape == (8, 16, 64)
    assert model(idx)[1] is None
    assert abs(loss.item() - math.log(64)) < 0.15  # gpt2 init: logits ~0, so the prediction is ~uniform


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_builds_on_meta_device(preset):
    cfg = GPTConfig(**{**TINY_CONFIG, **PRESETS[preset]})
    with torch.device("meta"):
        model = GPT(cfg)
    assert all(p.is_meta for p in model.parameters())
    assert model.num_params() == GPT(cfg).num_params()


# 2. parameter counts, NormFormer arXiv v1 Table 6 (final Table 2 rounds them to 0.1M)

def gpt3_params(N, d, H, V=51200, normformer=False):
    """--pos=sinusoidal --embed_norm, bias on, tied head, layernorm with gain and bias."""
    per_layer = (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * (2 * d)
    if normformer:
        per_layer += 2 * d + 2 * (4 * d) + H  # post-attn LN, FFN LN (over 4d), one gamma per head
    return V * d + 2 * d + N * per_layer + 2 * d  # token embedding, embed norm, blocks, final norm


@pytest.mark.parametrize("N, d, H, baseline, paper_m, paper_nf_m", [
    (12, 768, 12, 124_379_136, (124.4, 124.38), (124.5, 124.47)),
    (24, 1024, 16, 354_742_272, (354.7, 354.74), (355.0, 354.98)),
])
def test_parameter_counts_of_gpt3_small_and_medium(N, d, H, baseline, paper_m, paper_nf_m):
    common = dict(n_layer=N, n_embd=d, n_head=H, block_size=2048, vocab_size=51200, pos="sinusoidal",
                  embed_norm=True, bias=True, tie_embeddings=True)
    with torch.device("meta"):
        base = GPT(GPTConfig(**common)).num_params()
        nf = GPT(GPTConfig(**common, **PRESETS["normformer"])).num_params()
    assert base == gpt3_params(N, d, H) == baseline  # NormFormer arXiv v1 Table 6
    assert nf == gpt3_params(N, d, H, normformer=True)
    assert nf - base == N * (2 * d + 8 * d + H)
    # NormFormer Table 2 (later version, 0.1M) and Table 1 (earlier version, 0.01M). The earlier version
    # prints 354.98M for NormFormer-355M where the formula gives 354.988M, so 0.01M is the tolerance there.
    assert round(base / 1e6, 1) == paper_m[0] and round(nf / 1e6, 1) == paper_nf_m[0]
    assert abs(base / 1e6 - paper_m[1]) <= 0.005 and abs(nf / 1e6 - paper_nf_m[1]) <= 0.01


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_flops_per_token_is_nanogpts_estimate_at_gpt2_small(pos):
    """MFU's numerator, as nanoGPT's estimate_mfu: 6 N + 12 L T d per token, N the parameters without the position
    table. GPT-2 small has 124,439,808 parameters (the released checkpoint), 1024 x 768 of them its positions; with
    sinusoids there is no table and the same N."""
    cfg = GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, bias=True, pos=pos)
    with torch.device("meta"):
        flops = flops_per_token(GPT(cfg), cfg)
    assert flops == 6 * (124_439_808 - 1024 * 768) + 12 * 12 * 1024 * 768


# 3. every flag acts on the forward and adds exactly the parameters its paper says

d, N, H, T, V = (TINY_CONFIG[k] for k in ("n_embd", "n_layer", "n_head", "block_size", "vocab_size"))
FLAG_PARAMS = [  # (flags, parameters added, does the forward change for the same weights)
    (dict(scale_heads=True), N * H, True),
    (dict(scale_attn=True), N * 2 * d, True),
    (dict(scale_fc=True), N * 2 * 4 * d, True),
    (dict(scale_resids=True), N * d, True),
    (dict(ffn_out_norm=True), N * 2 * d, True),
    (dict(qkv_norm=True), N * 3 * 2 * d, True),
    (dict(qk_norm=True), N * 2 * 2 * (d // H), True),  # a gain and a bias over head_dim, for q and for k
    (dict(layer_scale=True), N * 2 * d, True),
    (dict(embed_norm=True), 2 * d, True),
    (dict(embed_scale=True), 0, True),
    (dict(pos="sinusoidal"), -T * d, True),
    (dict(tie_embeddings=False), V * d, True),
    (dict(activation="relu"), 0, True),
    (dict(activation="relu2"), 0, True),
    (dict(activation="geglu"), N * (d * 4 * d + 4 * d), True),
    (dict(layout="post"), -2 * d, True),  # no final norm
    (dict(layout="deepnorm"), -2 * d, True),
    (dict(norm="rmsnorm"), -(2 * N + 1) * d, True),  # RMSNorm never has a bias
    (dict(embed_grad_scale=0.1), 0, False),  # the value is unchanged, only the gradient (test below)
    (dict(attn_impl="manual"), 0, False),
    (dict(init="xavier"), 0, False),  # init changes the weights, not the function of given weights
    (dict(init="wang", init_depth_scale=True), 0, False),
]


@pytest.mark.parametrize("flags, added, acts", FLAG_PARAMS, ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_flag_adds_its_parameters_and_changes_the_forward(flags, added, acts):
    base, model = build(), build(**flags)
    assert model.num_params() - base.num_params() == added
    # give both models the same shared weights; the flag's own parameters are moved off their identity init
    # (named_parameters lists a tied head once, as wte; state_dict would list it as lm_head.weight too)
    mine = dict(model.named_parameters())
    own = {k: v for k, v in base.named_parameters() if k in mine and v.shape == mine[k].shape}
    model.load_state_dict(own, strict=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in own:
                p.add_(0.5 * torch.randn_like(p))
    idx = tokens()
    gap = (model(idx)[0] - base(idx)[0]).abs().max().item()
    if acts:
        assert gap > 1e-3
    else:
        assert gap < 1e-10


def sinusoidal_by_hand(T, dim):
    """Vaswani et al. 2017: PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(t / 10000^(2i/d))."""
    pe = torch.zeros(T, dim, dtype=torch.float64)
    for t in range(T):
        for i in range(0, dim, 2):
            pe[t, i] = math.sin(t / 10000 ** (i / dim))
            pe[t, i + 1] = math.cos(t / 10000 ** (i / dim))
    return pe


@pytest.mark.parametrize("flags", [dict(), dict(embed_scale=True), dict(pos="sinusoidal"),
                                   dict(embed_norm=True, embed_scale=True, pos="sinusoidal")], ids=str)
def test_embeddings_follow_spec(flags):
    model = build(**flags)
    perturb_(model)
    idx = tokens()
    x = model.wte.weight[idx] * (math.sqrt(d) if flags.get("embed_scale") else 1.0)  # Scaled Embed: x sqrt(d)
    x = x + (sinusoidal_by_hand(T, d) if flags.get("pos") == "sinusoidal" else model.wpe.weight)
    if flags.get("embed_norm"):
        x = layer_norm(x, model.embed_norm.weight, model.embed_norm.bias)
    torch.testing.assert_close(model.embed(idx), x, rtol=1e-6, atol=1e-6)  # the table is built in float32


@pytest.mark.parametrize("activation", ["gelu", "relu", "relu2", "geglu"])
@pytest.mark.parametrize("scale_fc", [False, True])
def test_mlp_follows_its_equation(activation, scale_fc):
    mlp = build(activation=activation, scale_fc=scale_fc).blocks[0].mlp
    perturb_(mlp)
    x = torch.randn(3, 16, d, dtype=torch.float64)
    h = x @ mlp.fc.weight.T + mlp.fc.bias
    if activation == "geglu":  # GELU(x W) * (x V), Shazeer 2020
        h = F.gelu(h[..., :4 * d]) * h[..., 4 * d:]
    else:
        h = {"gelu": F.gelu, "relu": torch.relu, "relu2": lambda t: torch.relu(t) ** 2}[activation](h)
    if scale_fc:  # NormFormer FFN LN: after the activation, over the 4d hidden features
        h = layer_norm(h, mlp.fc_norm.weight, mlp.fc_norm.bias)
    torch.testing.assert_close(mlp(x), h @ mlp.proj.weight.T + mlp.proj.bias, rtol=1e-10, atol=1e-12)


# 4. attention: HeadScale before W_O, manual == SDPA

def attention_by_hand(attn, x, n_head, gamma, head_norm=lambda t, which: t):
    """NormFormer eq. (3): concat_i(gamma_i * softmax(q_i k_i^T / sqrt(hd) + causal) v_i) W_O^T + b_O;
    head_norm(t, "q" or "k") is applied to each head's q_i and k_i (QK normalization)."""
    B, T, C = x.shape
    hd = C // n_head
    W, b = attn.qkv.weight, attn.qkv.bias
    q, k, v = (x @ W[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C] for i in range(3))
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    heads = []
    for h in range(n_head):
        s = slice(h * hd, (h + 1) * hd)
        qh, kh = head_norm(q[..., s], "q"), head_norm(k[..., s], "k")
        scores = (qh @ kh.transpose(1, 2) / math.sqrt(hd)).masked_fill(future, float("-inf"))
        heads.append(gamma[h] * torch.softmax(scores, dim=-1) @ v[..., s])
    return torch.cat(heads, dim=-1) @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("attn_impl", ["sdpa", "manual"])
def test_head_scale_scales_each_head_before_w_o(attn_impl):
    model = build(scale_heads=True, attn_impl=attn_impl)
    attn = model.blocks[0].attn
    perturb_(attn)  # random biases as well, so the bias of W_O is not scaled by accident
    gamma = torch.tensor([2.0, 0.0, 1.0, -0.5], dtype=torch.float64)
    with torch.no_grad():
        attn.head_scale.copy_(gamma)
    x = torch.randn(3, 16, d, dtype=torch.float64)
    torch.testing.assert_close(attn(x), attention_by_hand(attn, x, H, gamma), rtol=1e-10, atol=1e-12)
    # and at block level: pre-LN x + A(LN(x)) is what the FFN sees
    block = model.blocks[0]
    h = x + attention_by_hand(attn, layer_norm(x, block.attn_norm.weight, block.attn_norm.bias), H, gamma)
    expected = h + block.mlp(layer_norm(h, block.ffn_norm.weight, block.ffn_norm.bias))
    torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dropout, train", [(0.0, True), (0.2, False)])
def test_manual_attention_equals_sdpa(dropout, train):
    sdpa, manual = build(dropout=dropout), build(dropout=dropout, attn_impl="manual")
    sdpa.train(train), manual.train(train)
    idx = tokens()
    out_s, out_m = sdpa(idx)[0], manual(idx)[0]
    torch.testing.assert_close(out_m, out_s, rtol=1e-10, atol=1e-12)
    r = torch.randn(out_s.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (out_s * r).sum().backward(), (out_m * r).sum().backward()
    for (name, ps), pm in zip(sdpa.named_parameters(), manual.parameters()):
        torch.testing.assert_close(pm.grad, ps.grad, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("attn_impl", ["sdpa", "manual"])
def test_attention_dropout_acts_in_training_only(attn_impl):
    attn = build(dropout=0.3, attn_impl=attn_impl).blocks[0].attn  # the dropout on its output is the block's
    x = torch.randn(2, 16, d, dtype=torch.float64)
    torch.manual_seed(0)
    train_out = attn(x)
    attn.eval()
    torch.testing.assert_close(attn(x), attention_by_hand(attn, x, H, torch.ones(H)), rtol=1e-10, atol=1e-12)
    assert (train_out - attn(x)).abs().max() > 1e-3


@pytest.mark.parametrize("out_norms", [False, True], ids=["plain", "output norms"])
@pytest.mark.parametrize("where", ["embeddings", "attention output", "ffn output"])
def test_dropout_acts_on_embeddings_and_branch_outputs_in_training_only(where, out_norms):
    """GPT-2 (as in Vaswani et al. §5.4): dropout on the summed embeddings and on each sublayer's output, after
    the output norms of NormFormer and CogView (as fairseq's NormFormer): each kept output is its eval value
    over (1 - p), which a norm after the dropout would break."""
    p = 0.25
    model = build(dropout=p, embed_norm=out_norms, scale_attn=out_norms, ffn_out_norm=out_norms)
    block = model.blocks[0]
    block.attn.dropout = 0.0  # leave only the dropout on the branch output, not the one on the probabilities
    attn = (block.attn, block.attn_norm, block.attn_out_norm, block.attn_dropout, block.attn_layer_scale)
    ffn = (block.mlp, block.ffn_norm, block.ffn_out_norm, block.ffn_dropout, block.ffn_layer_scale)
    run = {"embeddings": lambda: model.embed(tokens()),
           "attention output": lambda: block.branch(x, *attn), "ffn output": lambda: block.branch(x, *ffn)}[where]
    x = torch.randn(3, 16, d, dtype=torch.float64)
    model.eval()
    clean = run()
    model.train()
    torch.manual_seed(0)
    dropped = run()
    kept = dropped != 0
    assert abs(1 - kept.double().mean().item() - p) < 0.05  # a fraction p of the outputs is zeroed
    torch.testing.assert_close(dropped[kept], clean[kept] / (1 - p))


@pytest.mark.parametrize("flags", [dict(), dict(layout="post"), dict(pos="sinusoidal")], ids=str)
def test_flags_that_are_off_leave_no_work_in_the_forward(flags):
    """The plainest GPT (GPT-2, nanoGPT) and nothing else: no dropout at p = 0, no multiply by alpha = 1 in
    post-LN, no position index or sinusoid table built per step. Kernels counted by hand per block: 2 norms,
    4 linears (qkv, W_O, fc1, fc2), attention, GELU and 2 residual adds; plus the embedding, the position
    add, the final norm (pre only) and the head. Views and the loss may appear; any other op fails."""
    model = build(dtype=torch.float32, **flags)
    model.train()
    idx, targets = tokens(), tokens(seed=2)
    with bench.AtenOps() as ops:
        model(idx, targets)
    pre = flags.get("layout", "pre") == "pre"
    math_ops = {"embedding": 1, "add": 1 + 2 * N, "native_layer_norm": 2 * N + pre, "addmm": 4 * N,
                "attention": N, "gelu": N, "mm": 1}
    free = {"view", "_unsafe_view", "t", "transpose", "split", "slice", "detach", "_log_softmax", "nll_loss_forward"}
    assert {k: v for k, v in ops.counts.items() if k not in free} == math_ops
    # F.dropout at p = 0 returns before any kernel is dispatched, but the module call is still made
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())


# 5. Embed Detach

@pytest.mark.parametrize("embed_norm", [False, True])
def test_embed_grad_scale_keeps_forward_and_scales_embedding_gradient(embed_norm):
    """Embed Detach acts before Embed LN (Spike No More §4): the gradient into wte and wpe shrinks by a,
    the gradient into the embedding norm's gain and bias does not."""
    a = 0.1
    off = build(tie_embeddings=False, embed_norm=embed_norm)
    on = build(tie_embeddings=False, embed_norm=embed_norm, embed_grad_scale=a)
    idx = tokens()
    out_off, out_on = off(idx)[0], on(idx)[0]
    torch.testing.assert_close(out_on, out_off, rtol=1e-12, atol=1e-12)
    # a fixed random functional of the logits: a test of the gradient that does not go through the loss
    r = torch.randn(out_off.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (out_off * r).sum().backward(), (out_on * r).sum().backward()
    for (name, p_off), p_on in zip(off.named_parameters(), on.parameters()):
        expected = a * p_off.grad if name in ("wte.weight", "wpe.weight") else p_off.grad
        torch.testing.assert_close(p_on.grad, expected, rtol=1e-10, atol=1e-14, msg=name)
    assert off.wte.weight.grad.abs().max() > 0 and off.wpe.weight.grad.abs().max() > 0


# 6. layouts: pre, post, deepnorm (DeepNet eq. (1))

@pytest.mark.parametrize("layout", ["pre", "post", "deepnorm"])
def test_block_and_model_follow_the_layout_equations(layout):
    model = build(layout=layout, n_layer=3)
    perturb_(model)
    alpha = (2 * 3) ** 0.25 if layout == "deepnorm" else 1.0  # DeepNet: alpha = (2N)^(1/4)
    x = torch.randn(3, 16, d, dtype=torch.float64)
    for block in model.blocks:
        A, Fn, an, fn = block.attn, block.mlp, block.attn_norm, block.ffn_norm
        if layout == "pre":
            h = x + A(layer_norm(x, an.weight, an.bias))
            expected = h + Fn(layer_norm(h, fn.weight, fn.bias))
        else:  # x = LN(alpha*x + A(x)); x = LN(alpha*x + F(x))
            h = layer_norm(alpha * x + A(x), an.weight, an.bias)
            expected = layer_norm(alpha * h + Fn(h), fn.weight, fn.bias)
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-12)
    # the whole model: embeddings, blocks, a final norm for pre only, the tied head
    idx = tokens()
    h = model.wte.weight[idx] + model.wpe.weight[:16]
    for block in model.blocks:
        h = block(h)
    if layout == "pre":
        h = layer_norm(h, model.final_norm.weight, model.final_norm.bias)
    else:
        assert model.final_norm is None
    torch.testing.assert_close(model(idx)[0], h @ model.wte.weight.T, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("flags", [dict(scale_attn=True), dict(ffn_out_norm=True), dict(scale_resids=True),
                                   dict(layer_scale=True), dict(scale_attn=True, ffn_out_norm=True, scale_resids=True,
                                                                layer_scale=True)], ids=str)
def test_pre_block_extra_operations(flags):
    """NormFormer §2-3 in a pre-LN block: h = x + ls_a * N_ao(A(N(x)));  out = lambda * h + ls_f * N_fo(F(N(h)))."""
    block = build(**flags).blocks[0]
    perturb_(block)
    ln = lambda m, t: layer_norm(t, m.weight, m.bias) if m is not None else t  # noqa: E731
    one = torch.ones(d, dtype=torch.float64)
    pick = lambda p: p if p is not None else one  # noqa: E731
    x = torch.randn(3, 16, d, dtype=torch.float64)
    h = x + pick(block.attn_layer_scale) * ln(block.attn_out_norm, block.attn(ln(block.attn_norm, x)))
    expected = pick(block.resid_scale) * h + pick(block.ffn_layer_scale) * ln(block.ffn_out_norm,
                                                                             block.mlp(ln(block.ffn_norm, h)))
    torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-12)


def weight_stds(block, d, geglu=False):
    """Sample stds of each logical matrix of a block: q, k, v, W_O, W_1 (W and V for GEGLU), W_2."""
    qkv = block.attn.qkv.weight
    fc = block.mlp.fc.weight.chunk(2 if geglu else 1, dim=0)
    mats = dict(q=qkv[:d], k=qkv[d:2 * d], v=qkv[2 * d:], o=block.attn.proj.weight, fc=fc[0], fc2=block.mlp.proj.weight)
    if geglu:
        mats["fc_v"] = fc[1]
    return {name: w.std().item() for name, w in mats.items()}


WIDE = dict(n_layer=4, n_embd=512, n_head=4, block_size=16, vocab_size=64)


def assert_stds(measured, expected, rel=0.03):
    for name, std in expected.items():
        assert measured[name] == pytest.approx(std, rel=rel), name


@pytest.mark.parametrize("init", ["xavier", "gpt2"])
def test_deepnorm_beta_gains_v_out_and_ffn_weights(init):
    Nw, dw = WIDE["n_layer"], WIDE["n_embd"]
    torch.manual_seed(0)
    model = GPT(GPTConfig(**WIDE, layout="deepnorm", init=init))
    beta = (8 * Nw) ** -0.25  # DeepNet decoder-only: beta = (8N)^(-1/4)
    if init == "xavier":  # xavier_normal: sqrt(2 / (fan_in + fan_out)) per logical matrix
        sq, so, sf = math.sqrt(2 / (2 * dw)), math.sqrt(2 / (2 * dw)), math.sqrt(2 / (5 * dw))
        sf2 = sf
    else:
        sq = sf = 0.02
        so = sf2 = 0.02 / math.sqrt(2 * Nw)
    expected = dict(q=sq, k=sq, v=beta * sq, o=beta * so, fc=beta * sf, fc2=beta * sf2)
    for block in model.blocks:
        assert_stds(weight_stds(block, dw), expected)


# 7. initializations (GPT-2, Spike No More §3, DeepNet)

def init_table(init, Nw, dw, std=None):
    """(sigma of all weights, sigma of W_O and W_2)."""
    sigma = std or (0.02 if init == "gpt2" else math.sqrt(2 / (5 * dw)))
    out = {"gpt2": sigma / math.sqrt(2 * Nw), "plain": sigma, "scaled": sigma / math.sqrt(2 * Nw),
           "wang": 2 / (Nw * math.sqrt(dw))}[init]
    return sigma, out


@pytest.mark.parametrize("init, init_std, depth_scale", [
    ("gpt2", None, False), ("plain", None, False), ("scaled", None, False), ("wang", None, False),
    ("gpt2", 0.05, False), ("scaled", 0.05, False), ("wang", 0.05, False),  # wang's W_O and W_2 ignore init_std
    ("gpt2", None, True), ("scaled", None, True),
])
def test_init_stds(init, init_std, depth_scale):
    Nw, dw = WIDE["n_layer"], WIDE["n_embd"]
    torch.manual_seed(0)
    model = GPT(GPTConfig(**WIDE, init=init, init_std=init_std, init_depth_scale=depth_scale, tie_embeddings=False))
    sigma, out = init_table(init, Nw, dw, init_std)
    for layer, block in enumerate(model.blocks, start=1):
        s = 1 / math.sqrt(layer) if depth_scale else 1.0  # DeepInit: block l's weights / sqrt(l)
        expected = dict(q=s * sigma, k=s * sigma, v=s * sigma, o=s * out, fc=s * sigma, fc2=s * out)
        assert_stds(weight_stds(block, dw), expected)
    for w in (model.wte.weight, model.wpe.weight, model.lm_head.weight):  # embeddings: the "all weights" sigma
        assert w.std().item() == pytest.approx(sigma, rel=0.03)
    assert_biases_zero_gains_one(model)


@pytest.mark.parametrize("activation", ["gelu", "geglu"])
def test_xavier_init_per_logical_matrix(activation):
    dw, Vw, Tw = WIDE["n_embd"], WIDE["vocab_size"], WIDE["block_size"]
    torch.manual_seed(0)
    model = GPT(GPTConfig(**WIDE, init="xavier", activation=activation, tie_embeddings=False))
    x = lambda fan_in, fan_out: math.sqrt(2 / (fan_in + fan_out))  # noqa: E731
    expected = dict(q=x(dw, dw), k=x(dw, dw), v=x(dw, dw), o=x(dw, dw), fc=x(dw, 4 * dw), fc2=x(4 * dw, dw))
    if activation == "geglu":
        expected["fc_v"] = x(dw, 4 * dw)  # W and V are two matrices, not one 8d x d matrix
    for block in model.blocks:
        assert_stds(weight_stds(block, dw, geglu=activation == "geglu"), expected)
    assert model.wte.weight.std().item() == pytest.approx(x(dw, Vw), rel=0.03)
    assert model.wpe.weight.std().item() == pytest.approx(x(dw, Tw), rel=0.05)  # only 8k samples
    assert_biases_zero_gains_one(model)


def assert_biases_zero_gains_one(model):
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
        elif "norm" in name and name.endswith("weight"):
            assert torch.all(p == 1), name


def test_norm_gains_one_and_extra_scalars_at_their_init():
    model = build(dtype=torch.float32, **PRESETS["normformer_resid"], qkv_norm=True, ffn_out_norm=True, embed_norm=True,
                  scale_resids_init=0.7)
    assert_biases_zero_gains_one(model)
    for block in model.blocks:
        assert torch.all(block.attn.head_scale == 1)
        assert torch.all(block.resid_scale == 0.7)
    block = build(dtype=torch.float32, layer_scale=True, layer_scale_init=1e-3).blocks[0]
    assert torch.all(block.attn_layer_scale == 1e-3) and torch.all(block.ffn_layer_scale == 1e-3)


# 8. config-time errors

@pytest.mark.parametrize("kw, flags", [
    (dict(n_embd=30, n_head=4), r"--n_embd.*--n_head"),
    (dict(layout="post", scale_resids=True), r"--scale_resids.*--layout"),
    (dict(init="xavier", init_std=0.1), r"--init_std.*--init=xavier"),
    (dict(qk_norm=True, norm="batchnorm"), r"--qk_norm.*--norm=batchnorm.*layernorm, rmsnorm, cogview"),
    (dict(qk_norm=True, norm="pnv"), r"--qk_norm.*--norm=pnv"),
    (dict(qk_norm=True, norm="powernorm"), r"--qk_norm.*--norm=powernorm"),
    (dict(qk_norm=True, norm="none"), r"--qk_norm.*--norm=none"),
])
def test_config_errors_name_the_flag(kw, flags):
    with pytest.raises(ValueError, match=flags):
        GPTConfig(**kw)


# 9. presets

@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_forward_backward(preset):
    model = build(dtype=torch.float32, **PRESETS[preset])
    _, loss = model(tokens(), tokens(seed=2))
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name  # every parameter is used


# 10. Spike No More Fig. 3: gradient norms per layer at init

def block_grad_norms(preset, seeds=3, N=8, dw=128, Tw=64, B=8, Vw=256):
    norms = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = GPT(GPTConfig(n_layer=N, n_embd=dw, n_head=4, block_size=Tw, vocab_size=Vw, **PRESETS[preset]))
        model(tokens(B, Tw, Vw, seed=100 + seed), tokens(B, Tw, Vw, seed=200 + seed))[1].backward()
        norms.append([torch.sqrt(sum(p.grad.square().sum() for p in b.parameters())).item() for b in model.blocks])
    return torch.tensor(norms).mean(0)


def test_spike_no_more_gradients_explode_toward_shallow_layers_only_in_vanilla():
    # Measured with this function (N=8, d=128, T=64, batch 8, vocab 256, mean of seeds 0-2), block grad norms
    # from first to last block: snm_vanilla 2.32 -> 0.83 (ratio 2.79, falling at every block; single
    # seeds 2.3-2.8), snm_scaled_embed 0.62 -> 0.54 (1.14), snm_embed_ln 0.29 -> 0.27 (1.07).
    # Small embeddings (std sqrt(2/5d)) in front of a pre-LN amplify the gradient by 1/std (Spike No More §3.2).
    vanilla = block_grad_norms("snm_vanilla")
    assert vanilla[0] / vanilla[-1] > 2.0
    assert torch.all(vanilla[:-1] > vanilla[1:])  # grows toward the shallow layers, layer by layer
    for preset in ("snm_scaled_embed", "snm_embed_ln"):
        g = block_grad_norms(preset)
        assert g.max() / g.min() < 1.3, preset
        assert vanilla[0] / vanilla[-1] > 1.5 * g[0] / g[-1], preset


# 11. every variant trains

@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_overfits_a_fixed_batch(preset):
    # at the tiny size: a context preset's own depth (dn_postln: 6 Post-LN layers) is what its recipe tests
    model = build(dtype=torch.float32, **{**PRESETS[preset], **TINY_CONFIG})
    idx, targets = tokens(B=4, T=8), tokens(B=4, T=8, seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        _, loss = model(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # measured from ~4.2 (seeds 1, 5, 9 of the batch): 0.01-0.08 for most presets, cogview 0.40-0.85 and
    # normformer(_resid) 0.97-1.19 (a unit-scale post-attention norm drowns the 0.02-scale embeddings)
    assert losses[-1] < 0.5 * losses[0]


# 12. torch.compile

# Dynamo tracing with fullgraph=True is what model.py can break (a graph break on a flag, Python on tensor
# values); inductor's C++ code generation takes 20-35 s per graph on 2 cores, so it runs only on request.
BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    not os.environ.get("NANONORM_INDUCTOR"), reason="slow on CPU; set NANONORM_INDUCTOR=1"))]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flags", [PRESETS["normformer"], dict(activation="geglu", qkv_norm=True, attn_impl="manual")],
                         ids=["normformer", "geglu_qkv_norm_manual"])
def test_torch_compile_matches_eager(flags, backend):
    torch._dynamo.reset()
    model = build(dtype=torch.float32, **flags)
    idx, targets = tokens(), tokens(seed=2)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    logits_c, loss_c = compiled(idx, targets)
    logits_e, loss_e = model(idx, targets)
    torch.testing.assert_close(logits_c, logits_e, rtol=1e-5, atol=1e-5)
    loss_c.backward()
    grad_c = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss_e.backward()
    for gc, p in zip(grad_c, model.parameters()):
        torch.testing.assert_close(gc, p.grad, rtol=1e-4, atol=1e-6)


# 13. QK normalization (Dehghani et al. 2023 §2; Wortsman et al. 2023 §3.1)

def rms_norm(x, weight, eps=1e-5):
    """Zhang & Sennrich 2019, written out: x / sqrt(mean(x^2) + eps) * g over the last dim."""
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "cogview"])
@pytest.mark.parametrize("attn_impl", ["sdpa", "manual"])
def test_qk_norm_normalizes_each_heads_q_and_k_over_head_dim(kind, attn_impl):
    attn = build(qk_norm=True, norm=kind, attn_impl=attn_impl).blocks[0].attn
    perturb_(attn)  # gains and biases away from 1 and 0, different for q and k

    def head_norm(t, which):  # one norm over hd, shared by the heads; CogView's rescaling is LN up to eps
        n = attn.q_norm if which == "q" else attn.k_norm
        return rms_norm(t, n.weight) if kind == "rmsnorm" else layer_norm(t, n.weight, n.bias)

    x = torch.randn(3, 16, d, dtype=torch.float64)
    expected = attention_by_hand(attn, x, H, torch.ones(H), head_norm)
    tol = 1e-4 if kind == "cogview" else 1e-10  # CogView divides by max|x| / 8 first: eps weighs differently
    torch.testing.assert_close(attn(x), expected, rtol=tol, atol=tol)
    assert (attn(x) - attention_by_hand(attn, x, H, torch.ones(H))).abs().max() > 1e-3


@pytest.mark.parametrize("kind, affine, per_norm", [
    ("layernorm", "both", 2), ("layernorm", "no_bias", 1), ("layernorm", "none", 0),
    ("rmsnorm", "both", 1), ("cogview", "no_gamma", 1),
])
def test_qk_norm_adds_two_norms_over_head_dim_per_layer(kind, affine, per_norm):
    base = build(norm=kind, norm_affine=affine)
    model = build(norm=kind, norm_affine=affine, qk_norm=True)
    assert model.num_params() - base.num_params() == N * 2 * per_norm * (d // H)


# 14. probe points: the papers' operation names, for hooks (NormFormer arXiv v1 Table 3)

PAPER_OPS = ["embed", "attn_ln", "q", "k", "v", "q@k", "probs@v", "attn_sub_ln", "out_proj", "attn_out_ln",
             "resid_attn", "ffn_ln",
             "fc1", "act", "ffn_hidden_ln", "fc2", "ffn_out_ln", "resid_ffn", "final_ln", "logits"]
PROBE_CONFIGS = [{**PRESETS[p], "attn_impl": impl} for p in sorted(PRESETS) for impl in ("sdpa", "manual")] + [
    dict(qk_norm=True), dict(qkv_norm=True), dict(qkv_norm=True, qk_norm=True, attn_impl="manual"),
    dict(activation="geglu", scale_fc=True, dropout=0.1), dict(layout="post", **ALL_SLOTS, qk_norm=True),
]


def record_probes(model, points, idx):
    """Run the model with a hook on every probe point; return [(event number, tensor)] per point."""
    events, seen, handles = [], {}, []
    modules = dict(model.named_modules())
    for name, io in {(p[2], p[3]) for p in points}:
        def hook(module, args, output=None, key=(name, io)):
            seen.setdefault(key, (len(events), output if key[1] == "output" else args[0]))
            events.append(key)
        if io == "output":
            handles.append(modules[name].register_forward_hook(hook))
        else:
            handles.append(modules[name].register_forward_pre_hook(hook))
    model(idx)
    for h in handles:
        h.remove()
    found = []
    for _, _, name, io, chunk in points:
        number, t = seen[(name, io)]
        found.append((number, t if chunk is None else t.chunk(chunk[1], dim=-1)[chunk[0]]))
    return found


@pytest.mark.parametrize("flags", PROBE_CONFIGS, ids=str)
def test_probe_points_exist_in_forward_order_with_the_papers_names(flags):
    model = build(**flags)
    N, d, H = model.config.n_layer, model.config.n_embd, model.config.n_head  # a preset may set its own sizes
    points = probe_points(model)
    found = record_probes(model, points, tokens())
    order = [number for number, _ in found]
    assert order == sorted(order), "probe points are not in forward order"
    layers = [p[0] for p in points]
    inner = [layer for layer in layers if layer is not None]
    assert inner == sorted(inner) and layers[1:len(inner) + 1] == inner  # None only before and after the blocks
    assert points[0][1] == "embed" and points[-1][1] == "logits"
    for layer in range(N):
        ops = [p[1] for p in points if p[0] == layer]
        assert len(ops) == len(set(ops)), f"layer {layer} repeats an op: {ops}"
        assert set(ops) <= set(PAPER_OPS)
        expected = {"attn_ln", "q", "k", "v", "probs@v", "out_proj", "resid_attn", "ffn_ln", "fc1", "act", "fc2",
                    "resid_ffn"}
        # --attn_softcap forces the manual attention path (SDPA cannot cap the scores), so q@k exists with it
        optional_ops = [("q@k", flags.get("attn_impl") == "manual" or flags.get("attn_softcap")),
                        ("attn_out_ln", flags.get("scale_attn")), ("attn_sub_ln", flags.get("subln")),
                        ("ffn_hidden_ln", flags.get("scale_fc") or flags.get("subln")),
                        ("ffn_out_ln", flags.get("ffn_out_norm"))]
        expected |= {op for op, on in optional_ops if on}
        assert set(ops) == expected
    assert ("final_ln" in [p[1] for p in points]) == (flags.get("layout", "pre") in ("pre", "mix", "reordered"))
    B, T = tokens().shape
    for (layer, op, name, io, chunk), (_, t) in zip(points, found):
        hd = d // H
        shape = {"q@k": (B, H, T, T), "fc1": (B, T, 8 * d if flags.get("activation") == "geglu" else 4 * d),
                 "act": (B, T, 4 * d), "ffn_hidden_ln": (B, T, 4 * d), "logits": (B, T, V)}.get(op, (B, T, d))
        if op in ("q", "k") and flags.get("qk_norm"):
            shape = (B, H, T, hd)  # after the head split
        assert t.shape == shape, (op, name)


def test_probe_tensors_are_the_operations_they_name():
    """q, k, v, q@k, probs@v and act seen by the hooks against the formulas, in a pre-LN block."""
    model = build(attn_impl="manual", scale_heads=True)
    perturb_(model)
    points = probe_points(model)
    idx = tokens()
    seen = {(layer, op): t for (layer, op, *_), (_, t) in zip(points, record_probes(model, points, idx))}
    attn = model.blocks[1].attn
    x = seen[(1, "attn_ln")]
    B, T, C = x.shape
    W, b = attn.qkv.weight, attn.qkv.bias
    q, k, v = (x @ W[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C] for i in range(3))
    for op, t in (("q", q), ("k", k), ("v", v)):
        torch.testing.assert_close(seen[(1, op)], t, rtol=1e-10, atol=1e-12)
    heads = lambda t: t.view(B, T, H, C // H).transpose(1, 2)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(-2, -1) / math.sqrt(C // H)
    torch.testing.assert_close(seen[(1, "q@k")], scores, rtol=1e-10, atol=1e-12)  # the logits, before the mask
    y = torch.softmax(scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")), -1) @ heads(v)
    y = (y * attn.head_scale.view(1, -1, 1, 1)).transpose(1, 2).reshape(B, T, C)
    torch.testing.assert_close(seen[(1, "probs@v")], y, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(seen[(1, "act")], F.gelu(seen[(1, "fc1")]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(seen[(None, "embed")], model.wte.weight[idx] + model.wpe.weight[:T])
    torch.testing.assert_close(seen[(1, "resid_attn")], seen[(0, "resid_ffn")] + seen[(1, "out_proj")])
    torch.testing.assert_close(seen[(None, "logits")], model(idx)[0])


def test_op_labels_and_weight_splits():
    model = build(activation="geglu", qkv_norm=True, qk_norm=True, tie_embeddings=False, **PRESETS["normformer_resid"],
                  layer_scale=True, ffn_out_norm=True, embed_norm=True)
    expected = {"wte.weight": "embed", "wpe.weight": "embed", "embed_norm.weight": "embed_ln",
                "final_norm.bias": "final_ln", "lm_head.weight": "logits",
                "blocks.1.attn_norm.weight": "attn_ln", "blocks.1.attn.qkv.weight": "qkv",
                "blocks.1.attn.qkv_norm.0.weight": "q", "blocks.1.attn.qkv_norm.2.bias": "v",
                "blocks.1.attn.q_norm.weight": "q", "blocks.1.attn.k_norm.bias": "k",
                "blocks.1.attn.head_scale": "head_scale", "blocks.1.attn.proj.weight": "out_proj",
                "blocks.1.attn_out_norm.weight": "attn_out_ln", "blocks.1.attn_layer_scale": "attn_layer_scale",
                "blocks.1.ffn_norm.bias": "ffn_ln", "blocks.1.mlp.fc.bias": "fc1",
                "blocks.1.mlp.fc_norm.weight": "ffn_hidden_ln",
                "blocks.1.mlp.proj.weight": "fc2", "blocks.1.ffn_out_norm.weight": "ffn_out_ln",
                "blocks.1.resid_scale": "resid_scale", "blocks.1.ffn_layer_scale": "ffn_layer_scale"}
    names = dict(model.named_parameters())
    assert set(expected) <= set(names)
    for name, label in expected.items():
        assert op_label(name) == label, name
    for name in names:
        op_label(name)  # every parameter has a label
    powernorm = build(norm="powernorm", **ALL_SLOTS)
    owners = [name for name, m in powernorm.named_modules() if list(m.buffers(recurse=False))]
    assert len(owners) == 8 * N + 2
    for name in owners:
        op_label(name)  # and every module that owns buffers (PowerNorm's psi^2 and nu)
    assert op_label("blocks.1.mlp.fc_norm") == "ffn_hidden_ln" and op_label("final_norm") == "final_ln"
    splits = weight_splits(model)
    assert splits["blocks.0.attn.qkv.weight"] == ("q", "k", "v") == splits["blocks.1.attn.qkv.bias"]
    assert splits["blocks.1.mlp.fc.weight"] == ("fc1_gate", "fc1_value")
    assert len(splits) == 4 * N
    assert "blocks.0.mlp.fc.weight" not in weight_splits(build())


# 15. every flag reaches where it acts: a one-line mutation that drops or swaps a flag fails one of these

NORM_CLASSES = tuple(type(norms.make_norm(k, 8)) for k in norms.NORMS)


@pytest.mark.parametrize("affine", norms.AFFINE)
@pytest.mark.parametrize("kind", norms.NORMS)
def test_every_norm_flag_reaches_every_norm_module(kind, affine):
    """Distinct non-default values, so that a swapped pair (alpha_fwd/alpha_bwd) or a dropped flag fails."""
    for group_scaling in (True, False):
        model = build(norm=kind, norm_eps=3e-4, norm_affine=affine, pn_alpha_fwd=0.7, pn_alpha_bwd=0.6, pn_warmup=17,
                      pn_group_scaling=group_scaling, qk_norm=kind in PER_TOKEN_NORMS, dyt_alpha=0.3, **ALL_SLOTS)
        slots = [m for m in model.modules() if isinstance(m, NORM_CLASSES)]
        assert len(slots) == (10 if kind in PER_TOKEN_NORMS else 8) * N + 2
        for m in slots:
            if kind == "none":
                assert not list(m.parameters())
                continue
            if kind == "dyt":
                assert m.alpha.item() == pytest.approx(0.3)  # DyT has no eps; its alpha0 is --dyt_alpha
            else:
                assert m.eps == 3e-4
            assert (m.weight is not None) == (affine in ("both", "no_bias"))
            assert (m.bias is not None) == (affine in ("both", "no_gamma") and kind != "rmsnorm")  # T5: never a bias
            if kind in ("batchnorm", "pnv"):
                assert m.alpha == 0.7  # the momentum of the running statistics is alpha_fwd
            if kind == "powernorm":
                assert (m.alpha_fwd, m.alpha_bwd, m.warmup) == (0.7, 0.6, 17)
                assert m.groups == (H if group_scaling else 0)  # one group per head (PowerNorm App. A.1)


# a value other than each flag's default
NORM_FLAG_VALUES = dict(pn_alpha_fwd=0.7, pn_alpha_bwd=0.6, pn_warmup=17, pn_group_scaling=False, dyt_alpha=0.3,
                        dyt_alpha_attn=0.8, norm_eps=3e-4, norm_affine="none")


def norm_modules(**kw):
    """Every norm module of a model: its class, its number settings and its tensors."""
    modules = [m for m in build(**kw).modules() if isinstance(m, NORM_CLASSES)]
    return [(type(m), {k: v for k, v in vars(m).items() if isinstance(v, (int, float))},
             {k: t.tolist() for k, t in m.state_dict().items()}) for m in modules]


def sees_the_batch(kind):
    """Whether a token's output in training changes when another token of the batch changes (beyond a whole-tensor
    scale's effect through eps: CogView's)."""
    x = torch.randn(2, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    other = x.clone()
    other[1, 2] *= 0.5
    # fresh modules (PowerNorm in its warmup), so that both see the same running statistics
    first, second = (norms.make_norm(kind, 8, warmup=1).double()(batch)[0, 0] for batch in (x, other))
    return not torch.allclose(first, second, atol=1e-4)


@pytest.mark.parametrize("kind", norms.NORMS)
def test_norms_table_says_what_each_norm_is(kind):
    """norms.TABLE: a norm's class is make_norm's, it uses batch statistics exactly when a token's output depends on
    the batch, and it reads a flag (norms.reads, from its class's arguments) exactly when the flag changes its
    modules."""
    module, depends_on = norms.TABLE[kind]
    assert type(norms.make_norm(kind, 8)) is module
    assert sees_the_batch(kind) == (depends_on == "batch") == (module in norms.BATCH_STATISTIC_NORMS)
    assert set(norms.NORM_FLAGS) == set(NORM_FLAG_VALUES) and set(norms.reads(kind)) <= set(norms.NORM_FLAGS)
    plain = norm_modules(norm=kind, **ALL_SLOTS)
    for flag, value in NORM_FLAG_VALUES.items():
        assert (norm_modules(norm=kind, **ALL_SLOTS, **{flag: value}) != plain) == (flag in norms.reads(kind)), flag


@pytest.mark.parametrize("bias", [True, False])
def test_bias_flag_reaches_every_linear(bias):
    model = build(bias=bias, activation="geglu", tie_embeddings=False)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert len(linears) == 4 * N + 1
    for name, m in linears.items():
        assert (m.bias is not None) == (bias and name != "lm_head"), name  # the head never has one (GPT-2)


@pytest.mark.parametrize("activation", ["gelu", "geglu"])
def test_ffn_mult_sets_the_hidden_width(activation):
    model = build(ffn_mult=3, activation=activation, scale_fc=True)
    for block in model.blocks:
        assert block.mlp.fc.weight.shape == ((6 if activation == "geglu" else 3) * d, d)
        assert block.mlp.proj.weight.shape == (d, 3 * d)
        assert block.mlp.fc_norm.weight.shape == (3 * d,)


def test_cogview_norm_of_an_all_zero_input_is_finite():
    """max|x| = 0 would divide 0 by 0; LN of a constant row is 0, so the output is the bias b."""
    n = norm(GPTConfig(norm="cogview"), 8).double()
    perturb_(n)
    torch.testing.assert_close(n(torch.zeros(2, 3, 8, dtype=torch.float64)), n.bias.expand(2, 3, 8))


def observed_run(model):
    """Logits and gradients of two training steps on fixed batches (no update, but running statistics and
    PowerNorm's nu move), then an eval forward: all that a flag of the math can change for given weights."""
    torch.manual_seed(0)
    seen = []
    for step in range(2):
        model.zero_grad()
        logits, loss = model(tokens(seed=step), tokens(seed=10 + step))
        loss.backward()
        seen += [logits.detach().flatten()] + [p.grad.flatten() for p in model.parameters()]
    model.eval()
    seen.append(model(tokens(seed=5))[0].detach().flatten())
    return torch.cat(seen)


# (base flags, flag, value, what it changes): "params" the parameter names and shapes; "init" the initial
# values; "run" the outputs or gradients of observed_run for the same weights; "modules" only the modules
# that hooks can see (the same math)
EVERY_FLAG = [
    ({}, "n_layer", 3, "params"), ({}, "n_head", 2, "run"), ({}, "n_embd", 48, "params"),
    ({}, "block_size", 24, "params"), ({}, "vocab_size", 80, "params"), ({}, "ffn_mult", 3, "params"),
    ({}, "dropout", 0.3, "run"), ({}, "bias", False, "params"), ({}, "layout", "deepnorm", "params"),
    ({}, "norm", "batchnorm", "run"), ({}, "norm_eps", 0.5, "run"), ({}, "norm_affine", "no_gamma", "params"),
    ({"norm": "powernorm", "pn_warmup": 1}, "pn_alpha_fwd", 0.5, "run"),
    ({"norm": "powernorm"}, "pn_alpha_bwd", 0.5, "run"),
    ({"norm": "powernorm"}, "pn_warmup", 1, "run"),
    ({"norm": "powernorm"}, "pn_group_scaling", False, "run"),
    ({}, "scale_heads", True, "params"), ({}, "scale_attn", True, "params"), ({}, "scale_fc", True, "params"),
    ({}, "scale_resids", True, "params"), ({"scale_resids": True}, "scale_resids_init", 0.5, "init"),
    ({}, "ffn_out_norm", True, "params"), ({}, "qkv_norm", True, "params"), ({}, "qk_norm", True, "params"),
    ({}, "layer_scale", True, "params"), ({"layer_scale": True}, "layer_scale_init", 0.1, "init"),
    ({}, "pos", "sinusoidal", "params"), ({}, "embed_scale", True, "run"), ({}, "embed_norm", True, "params"),
    ({}, "embed_grad_scale", 0.1, "run"), ({}, "tie_embeddings", False, "params"),
    ({}, "activation", "relu", "run"), ({}, "attn_impl", "manual", "modules"),
    ({}, "init", "plain", "init"), ({}, "init_std", 0.05, "init"), ({}, "init_depth_scale", True, "init"),
    ({"layout": "mix"}, "mix_ln_ratio", 1.0, "run"), ({}, "layer_norm_scaling", True, "run"),
    ({}, "subln", True, "params"), ({"norm": "dyt"}, "dyt_alpha", 0.3, "init"),
    ({"norm": "dyt"}, "dyt_alpha_attn", 0.9, "init"), ({}, "attn_softcap", 0.5, "run"),
    ({}, "logit_softcap", 0.5, "run"), ({"scale_heads": True}, "head_scale_at", "after_proj", "run"),
    ({}, "embed_init", "inv_sqrt_d", "init"), ({"embed_scale": True}, "embed_scale_learned", True, "params"),
]


def test_every_config_flag_has_a_row():
    assert sorted(row[1] for row in EVERY_FLAG) == sorted(GPTConfig.field_names())


@pytest.mark.parametrize("base_flags, flag, value, effect", EVERY_FLAG, ids=lambda v: v if isinstance(v, str) else "")
def test_every_flag_changes_what_it_should(base_flags, flag, value, effect):
    base, model = build(**base_flags), build(**base_flags, **{flag: value})
    shapes = lambda m: {k: p.shape for k, p in m.named_parameters()}  # noqa: E731
    if effect == "params":
        assert shapes(model) != shapes(base)
    elif effect == "modules":
        assert shapes(model) == shapes(base)
        assert set(dict(model.named_modules())) != set(dict(base.named_modules()))
    elif effect == "init":
        assert shapes(model) == shapes(base)
        mine = dict(model.named_parameters())
        assert any(not torch.equal(p, mine[k]) for k, p in base.named_parameters())
    else:
        assert shapes(model) == shapes(base)
        model.load_state_dict(dict(base.named_parameters()), strict=False)
        gap = (observed_run(model) - observed_run(base)).abs().max().item()
        assert gap > 1e-9, f"--{flag}={value} changed nothing"


# 16. generation (nanoGPT's generate: crop to block_size, last logits / temperature, top-k, sample)

GENERATE_CONFIGS = [dict(norm=kind) for kind in norms.NORMS] + [
    dict(pos="sinusoidal"), dict(norm="powernorm", pos="sinusoidal", layout="post", dropout=0.2)]


@pytest.mark.parametrize("flags", GENERATE_CONFIGS, ids=str)
def test_generate_appends_tokens_of_the_vocabulary_in_eval_mode(flags):
    """Past block_size (16) the context is cropped; the batch-statistic norms use their running statistics, so
    their buffers do not move, each prompt's greedy continuation is the same alone or in a batch, and the
    model is back in training mode afterwards."""
    model = build(**flags)
    perturb_(model)
    model.train()
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    prompt = tokens(B=2, T=5)
    torch.manual_seed(0)
    out = model.generate(prompt, max_new_tokens=20)
    assert out.shape == (2, 25) and out.dtype == torch.long and torch.equal(out[:, :5], prompt)
    assert 0 <= out.min() and out.max() < TINY_CONFIG["vocab_size"]
    assert model.training
    for k, b in model.named_buffers():
        torch.testing.assert_close(b, buffers[k], rtol=0, atol=0, msg=k)
    greedy = model.generate(prompt, max_new_tokens=20, top_k=1)
    alone = torch.cat([model.generate(prompt[i:i + 1], max_new_tokens=20, top_k=1) for i in range(2)])
    assert torch.equal(greedy, alone)


def test_generate_samples_only_the_top_k_and_a_low_temperature_is_greedy():
    model = build()
    perturb_(model, scale=1.0)  # logits spread enough that the top 3 hold a visible share of the samples
    prompt = tokens(B=1, T=7).expand(400, 7)
    logits = model(prompt[:1])[0][0, -1]
    torch.manual_seed(0)
    drawn = set(model.generate(prompt, max_new_tokens=1, top_k=3)[:, -1].tolist())
    assert drawn == set(logits.topk(3).indices.tolist())  # 400 draws reach all three, and nothing else
    torch.manual_seed(0)
    everything = set(model.generate(prompt, max_new_tokens=1)[:, -1].tolist())
    assert len(everything) > 3
    cold = model.generate(prompt[:2], max_new_tokens=1, temperature=1e-6)[:, -1]
    assert cold.tolist() == [logits.argmax().item()] * 2


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=-1.0), dict(top_k=0)])
def test_generate_refuses_a_temperature_or_top_k_that_means_nothing(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        build().generate(tokens(B=1, T=3), max_new_tokens=1, **kw)


# Each paper-context preset builds the model its paper describes: positions, embedding norm, init statistics
# measured on the built weights, and parameter counts against the paper's own table (NormFormer arXiv v1 Table 6).
# The numbers written here are the papers'; presets.PRESETS is only read through GPTConfig and GPT.

def build_preset(preset, seed=0, **overrides):
    """The model of --preset=NAME plus explicit flags, applied as train.py applies them (the preset first)."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**PRESETS[preset], **overrides}))


def preset_tokens(B=4, T=64, V=256, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def embedding_output(model, idx):
    """What block 0 receives: the embeddings after positions, scaling and any embedding norm."""
    seen = []
    handle = model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        model(idx)
    handle.remove()
    return seen[0]


def close(measured, expected, tolerance):
    return abs(measured - expected) <= tolerance * expected


CONTEXTS = {  # preset prefix: the flags every preset of the group shares (the paper's model, not its variant)
    "nf_": {"pos": "sinusoidal", "embed_norm": True, "embed_scale": True, "embed_init": "inv_sqrt_d"},
    "snm_": {"init": "scaled"},
    "dn_": {"init": "xavier", "n_layer": 6, "n_embd": 64, "n_head": 4},
    "pn_": {"layout": "pre"},
}


VARIANTS = {  # preset: the flags that make it its paper's variant, on top of its context
    "nf_baseline": {}, "nf_normformer": {"scale_attn": True, "scale_fc": True, "scale_heads": True},
    "nf_normformer_resid": {"scale_attn": True, "scale_fc": True, "scale_heads": True, "scale_resids": True},
    "snm_vanilla": {}, "snm_embed_detach": {"embed_grad_scale": 0.1}, "snm_scaled_embed": {"embed_scale": True},
    "snm_embed_ln": {"embed_norm": True},
    "dn_postln": {"layout": "post"}, "dn_deepnorm": {"layout": "deepnorm"},
    "pn_layernorm": {"norm": "layernorm"}, "pn_batchnorm": {"norm": "batchnorm"}, "pn_pnv": {"norm": "pnv"},
    "pn_powernorm": {"norm": "powernorm"},
}


GPT2_PRESETS = {  # nanonorm's GPT-2 context, as people use it today
    "baseline": {}, "postln": {"layout": "post"},
    "normformer": {"scale_attn": True, "scale_fc": True, "scale_heads": True},
    "normformer_resid": {"scale_attn": True, "scale_fc": True, "scale_heads": True, "scale_resids": True},
    "deepnorm": {"layout": "deepnorm", "init": "xavier"},
    "cogview": {"norm": "cogview", "scale_attn": True, "ffn_out_norm": True, "embed_grad_scale": 0.1},
    "layerscale": {"layer_scale": True},
}


@pytest.mark.parametrize("preset", sorted(VARIANTS))
def test_context_preset_is_its_context_plus_its_variant(preset):
    context = next(flags for prefix, flags in CONTEXTS.items() if preset.startswith(prefix))
    assert PRESETS[preset] == {**context, **VARIANTS[preset]}


# the methods beyond the four papers (DyT, Peri-LN, Mix-LN, LayerNorm Scaling, OLMo 2, Magneto, Gemma 2): below
BEYOND_PRESETS = {"peri_ln", "mix_ln", "lns", "olmo2", "magneto", "dyt", "gemma2"}


def test_presets_are_the_gpt2_context_and_the_paper_contexts():
    assert set(PRESETS) == set(GPT2_PRESETS) | set(VARIANTS) | BEYOND_PRESETS


def test_gpt2_context_presets_are_unchanged():
    assert {name: PRESETS[name] for name in GPT2_PRESETS} == GPT2_PRESETS


def sinusoids_by_hand(T, d):
    """Vaswani et al. 2017 §3.5: PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(t / 10000^(2i/d))."""
    pe = torch.zeros(T, d)
    for t in range(T):
        for i in range(0, d, 2):
            pe[t, i] = math.sin(t / 10000 ** (i / d))
            pe[t, i + 1] = math.cos(t / 10000 ** (i / d))
    return pe


@pytest.mark.parametrize("preset", ["nf_baseline", "nf_normformer", "nf_normformer_resid"])
def test_normformer_context_has_sinusoidal_positions_unit_tokens_and_an_embedding_ln(preset):
    """fairseq (NormFormer final §4: "We train ... in fairseq"): token embeddings drawn from N(0, d^-1/2) and
    multiplied by sqrt(d), so of std 1 like the sinusoids; then the embedding LN."""
    model = build_preset(preset, block_size=32, n_embd=256)
    d = model.config.n_embd
    assert not any(name.startswith("wpe") for name, _ in model.named_parameters())  # no learned table
    assert close(model.wte.weight.std().item(), d ** -0.5, 0.03)
    idx = preset_tokens(T=32)
    x = model.wte.weight[idx].detach() * math.sqrt(d) + sinusoids_by_hand(32, d)
    mu, var = x.mean(-1, keepdim=True), (x - x.mean(-1, keepdim=True)).square().mean(-1, keepdim=True)
    expected = (x - mu) / torch.sqrt(var + model.config.norm_eps)  # LN at init: gain 1, bias 0
    torch.testing.assert_close(embedding_output(model, idx), expected, rtol=1e-4, atol=1e-5)


def test_embed_init_draws_the_token_embedding_alone_with_std_inverse_sqrt_d():
    d = 256
    fairseq, gpt2 = build_preset("baseline", n_embd=d, embed_init="inv_sqrt_d"), build_preset("baseline", n_embd=d)
    assert close(fairseq.wte.weight.std().item(), d ** -0.5, 0.03)
    assert close(fairseq.wpe.weight.std().item(), 0.02, 0.03)  # positions keep --init's sigma
    for name, weight in gpt2.named_parameters():
        if not name.startswith("wte"):
            torch.testing.assert_close(dict(fairseq.named_parameters())[name], weight)  # the same draws otherwise


# NormFormer arXiv v1 Table 6 (GPT-3 Small and Medium, vocabulary 51200): (baseline, NormFormer) parameters
TABLE_6 = {(12, 768, 12): (124_379_136, 124_471_296), (24, 1024, 16): (354_742_272, 354_988_032)}


@pytest.mark.parametrize("size", sorted(TABLE_6), ids=["gpt3_small", "gpt3_medium"])
def test_normformer_context_has_the_parameter_counts_of_arxiv_v1_table_6(size):
    """The counts add up with the embedding LN (2d) and without HeadScale (H per layer): the paper leaves
    HeadScale out of its NormFormer counts."""
    N, d, H = size
    shape = dict(n_layer=N, n_embd=d, n_head=H, block_size=1024, vocab_size=51200)
    with torch.device("meta"):  # counts only: no memory, no init cost
        baseline = GPT(GPTConfig(**{**PRESETS["nf_baseline"], **shape})).num_params()
        normformer = GPT(GPTConfig(**{**PRESETS["nf_normformer"], **shape})).num_params()
        no_embed_ln = GPT(GPTConfig(**{**PRESETS["nf_baseline"], **shape, "embed_norm": False})).num_params()
    assert baseline == TABLE_6[size][0]
    assert normformer - N * H == TABLE_6[size][1]
    assert no_embed_ln == TABLE_6[size][0] - 2 * d  # without the embedding LN the table's count is 2d away


def heads_by_hand(attn, x):
    """softmax(q_i k_i^T / sqrt(hd) + causal mask) v_i for each head i: a list of (B, T, hd)."""
    B, T, C = x.shape
    H = attn.n_head
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split(C, dim=-1)
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    heads = []
    for i in range(H):
        part = slice(i * C // H, (i + 1) * C // H)
        scores = q[..., part] @ k[..., part].transpose(-2, -1) / math.sqrt(C // H) + mask
        heads.append(torch.softmax(scores, dim=-1) @ v[..., part])
    return heads


@pytest.mark.parametrize("where", ["before_proj", "after_proj"])
def test_head_scale_before_w_o_as_the_paper_or_after_it_as_fairseq(where):
    """Paper (NormFormer final §2.1, Fig. 1 right): Concat(gamma_1 h_1, ..., gamma_H h_H) W_O. fairseq
    (transformer_layer.py, c_attn): W_O's output, bias included, viewed as H groups of hd channels, times gamma."""
    model = build_preset("nf_normformer", n_embd=24, n_head=3, block_size=8, head_scale_at=where).double()
    attn = model.blocks[0].attn
    gamma = torch.tensor([1.7, -0.4, 0.6], dtype=torch.float64)
    with torch.no_grad():
        attn.head_scale.copy_(gamma)
        attn.qkv.bias.normal_()
        attn.proj.bias.normal_()  # a bias that fairseq scales and the paper does not
    x = torch.randn(2, 8, 24, dtype=torch.float64)
    heads = heads_by_hand(attn, x)
    W, b = attn.proj.weight, attn.proj.bias
    paper = torch.cat([g * h for g, h in zip(gamma, heads)], dim=-1) @ W.T + b
    fairseq = (torch.cat(heads, dim=-1) @ W.T + b) * gamma.repeat_interleave(8)
    assert (paper - fairseq).abs().max() > 0.1  # the two placements differ, so the test tells them apart
    torch.testing.assert_close(attn(x), paper if where == "before_proj" else fairseq, rtol=1e-10, atol=1e-12)


SNM = ["snm_vanilla", "snm_embed_detach", "snm_scaled_embed", "snm_embed_ln"]


SNM_SHAPE = dict(n_layer=4, n_embd=256, n_head=4)  # wide enough for stds measured within 3%


@pytest.mark.parametrize("preset", SNM)
def test_spike_no_more_init_stds_measured_on_the_weights(preset):
    model = build_preset(preset, **SNM_SHAPE)
    d, N = SNM_SHAPE["n_embd"], SNM_SHAPE["n_layer"]
    sigma = math.sqrt(2 / (5 * d))  # §2.2, after Nguyen & Salazar and Le Scao et al.
    assert model.config.layout == "pre" and model.config.pos == "learned" and model.config.tie_embeddings
    for weight in (model.wte.weight, model.wpe.weight):  # §3.1: embeddings drawn with the same sigma
        assert close(weight.std().item(), sigma, 0.03)
    for block in model.blocks:
        for weight in (block.attn.qkv.weight, block.mlp.fc.weight):
            assert close(weight.std().item(), sigma, 0.03)
        for weight in (block.attn.proj.weight, block.mlp.proj.weight):  # the "scaled" ones: W_O and W_2
            assert close(weight.std().item(), sigma / math.sqrt(2 * N), 0.03)


def test_spike_no_more_embeddings_of_each_method():
    """§3.2: the vanilla embeddings have std ~ sigma << 1 (token + position: sqrt(2) sigma); Scaled Embed
    multiplies the token embedding by sqrt(d) (std sqrt(2/5)); Embed LN normalizes each token's embedding."""
    d = SNM_SHAPE["n_embd"]
    sigma = math.sqrt(2 / (5 * d))
    idx = preset_tokens()
    vanilla = embedding_output(build_preset("snm_vanilla", **SNM_SHAPE), idx)
    scaled = embedding_output(build_preset("snm_scaled_embed", **SNM_SHAPE), idx)
    normed = embedding_output(build_preset("snm_embed_ln", **SNM_SHAPE), idx)
    assert close(vanilla.std().item(), math.sqrt(2) * sigma, 0.05)
    assert close(scaled.std().item(), math.sqrt(2 / 5 + sigma ** 2), 0.05)
    # same seed, same draws: the vanilla embedding is what Embed LN normalizes (gain 1, bias 0 at init)
    mu, var = vanilla.mean(-1, keepdim=True), vanilla.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(normed, (vanilla - mu) / torch.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)


def test_spike_no_more_embed_detach_keeps_the_value_and_shrinks_the_gradient_tenfold():
    """eq. (14): e = gamma e + (1 - gamma) detach(e), gamma = 0.1 (as Zeng et al. 2023, GLM-130B)."""
    idx = preset_tokens()
    vanilla = build_preset("snm_vanilla", **SNM_SHAPE).double()
    detach = build_preset("snm_embed_detach", **SNM_SHAPE).double()
    torch.testing.assert_close(embedding_output(detach, idx), embedding_output(vanilla, idx))
    probe = torch.randn(4, 64, SNM_SHAPE["n_embd"], dtype=torch.float64)
    grads = []
    for model in (vanilla, detach):
        seen = []
        model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        model(idx)
        (seen[0] * probe).sum().backward()  # a loss through the embedding path alone (the head is tied)
        grads.append((model.wte.weight.grad, model.wpe.weight.grad))
    for vanilla_grad, detach_grad in zip(*grads):
        torch.testing.assert_close(detach_grad, 0.1 * vanilla_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("depth", [6, 18])
@pytest.mark.parametrize("preset", ["dn_postln", "dn_deepnorm"])
def test_deepnet_context_at_each_depth(preset, depth):
    """xavier_normal per logical matrix, std sqrt(2 / (fan_in + fan_out)); DeepNorm: x_{l+1} = LN(alpha x_l +
    G(x_l)), alpha = (2N)^(1/4), and gain beta = (8N)^(-1/4) on v, W_O, W_1 and W_2 (q and k keep gain 1)."""
    model = build_preset(preset) if depth == 6 else build_preset(preset, n_layer=depth)  # 6: the preset's own depth
    d = model.config.n_embd
    assert (d, model.config.n_head, len(model.blocks)) == (64, 4, depth)
    assert model.final_norm is None  # post and deepnorm blocks end with their own norm
    deepnorm = preset == "dn_deepnorm"
    alpha, beta = ((2 * depth) ** 0.25, (8 * depth) ** -0.25) if deepnorm else (None, 1.0)
    xavier_square, xavier_ffn = math.sqrt(2 / (d + d)), math.sqrt(2 / (d + 4 * d))
    q, k, v, w_o, w_1, w_2 = ([] for _ in range(6))
    for block in model.blocks:
        assert block.alpha == alpha
        for part, weights in zip(block.attn.qkv.weight.chunk(3), (q, k, v)):
            weights.append(part.flatten())
        w_o.append(block.attn.proj.weight.flatten())
        w_1.append(block.mlp.fc.weight.flatten())
        w_2.append(block.mlp.proj.weight.flatten())
    expected = [(q, xavier_square), (k, xavier_square), (v, beta * xavier_square), (w_o, beta * xavier_square),
                (w_1, beta * xavier_ffn), (w_2, beta * xavier_ffn)]
    for weights, std in expected:  # pooled over the layers: 6 x 4096 values or more, within 3%
        assert close(torch.cat(weights).std().item(), std, 0.03)


def normalized_statistics(norm_module, d, groups):
    """Feed a norm slot a batch whose channels have mean 3 and std 2, in training mode, and report which
    statistic came out normalized: per token (LN), per channel over the tokens (BN: mean 0 and variance 1;
    PN-V: quadratic mean 1), or per token and channel group (PowerNorm's group scaling, then its running
    quadratic mean psi^2 = 1 at the first step)."""
    x = 3 + 2 * torch.randn(8, 16, d, generator=torch.Generator().manual_seed(3))
    norm_module.train()
    with torch.no_grad():
        y = norm_module(x).reshape(-1, d)
    grouped = y.reshape(-1, groups, d // groups)
    found = {
        "token_mean0_var1": torch.allclose(y.mean(-1), torch.zeros(len(y)), atol=1e-4)
        and torch.allclose(y.var(-1, unbiased=False), torch.ones(len(y)), atol=1e-3),
        "channel_mean0_var1": torch.allclose(y.mean(0), torch.zeros(d), atol=1e-4)
        and torch.allclose(y.var(0, unbiased=False), torch.ones(d), atol=1e-3),
        "channel_quadratic_mean1_mean_kept": torch.allclose(y.square().mean(0), torch.ones(d), atol=1e-3)
        and bool(torch.all(y.mean(0) > 0.5)),  # PN-V does not subtract the mean (3 / sqrt(13) here)
        "group_quadratic_mean1": torch.allclose(grouped.square().mean(-1), torch.ones(grouped.shape[:2]), atol=1e-3),
    }
    return {name for name, yes in found.items() if yes}


@pytest.mark.parametrize("preset, statistic", [
    ("pn_layernorm", "token_mean0_var1"), ("pn_batchnorm", "channel_mean0_var1"),
    ("pn_pnv", "channel_quadratic_mean1_mean_kept"), ("pn_powernorm", "group_quadratic_mean1")])
def test_powernorm_context_puts_the_compared_norm_in_every_slot(preset, statistic):
    model = build_preset(preset, pn_warmup=0)
    cfg = model.config
    assert cfg.layout == "pre" and model.final_norm is not None
    slots = [model.final_norm] + [norm for block in model.blocks for norm in (block.attn_norm, block.ffn_norm)]
    assert len({type(slot) for slot in slots}) == 1
    for slot in (model.blocks[0].attn_norm, model.blocks[-1].ffn_norm, model.final_norm):
        assert normalized_statistics(slot, cfg.n_embd, cfg.n_head) == {statistic}


@pytest.mark.parametrize("schedule, expected", [("ramp", 0), ("cosine", 2 * 50)])
def test_powernorm_warmup_follows_the_lr_schedule(schedule, expected):
    from configs import TrainConfig, derive_model_flags
    tc = TrainConfig(lr_schedule=schedule, warmup_iters=50, grad_accum=2)
    cfg = derive_model_flags(GPTConfig(norm="powernorm"), tc, given={}, resumed=False)
    assert cfg.pn_warmup == expected


# Tests of the methods beyond the four papers against their equations, written out here in float64: DyT (Zhu et al.
# 2025), Gemma 2's soft-caps, LayerNorm Scaling (Sun et al. 2025), Mix-LN (Li, Yin, Liu 2025), Peri-LN (Kim et al.
# 2025), OLMo 2's reordered norm, Magneto's SubLN (Wang et al. 2023), and the coord check (Tensor Programs V); and
# the memory estimate of a soft-capped model, whose attention keeps its scores.

def hidden(seed=3, shape=(2, 16, 32), scale=1.0):
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def scaled_layer_norm(x, norm, scale=1.0):
    """Ba et al. 2016 with norm's g and b, written out: (x - E[x]) / sqrt(Var[x] + eps) * g + b, times scale."""
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).square().mean(-1, keepdim=True)
    return ((x - mu) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias) * scale


def attention(attn, x, cap=0.0, sub_norm=None):
    """Causal attention written out: per head softmax(mask(q k^T / sqrt(hd))) v, the logits soft-capped as
    c * tanh(s / c) when cap > 0, the concatenated heads through sub_norm (SubLN) when given, then W_O."""
    B, T, C = x.shape
    H = attn.n_head
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in attn.qkv(x).split(C, dim=2))
    s = q @ k.transpose(-2, -1) / math.sqrt(C // H)
    if cap:
        s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    y = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    return attn.proj(y if sub_norm is None else scaled_layer_norm(y, sub_norm))


@pytest.mark.parametrize("affine", norms.AFFINE)
def test_dyt_forward_matches_formula(affine):
    m = norms.make_norm("dyt", 8, affine=affine, alpha0=0.7).double()
    perturb_(m)
    x = hidden(shape=(3, 5, 8), scale=3.0)
    g = 1.0 if m.weight is None else m.weight
    b = 0.0 if m.bias is None else m.bias
    torch.testing.assert_close(m(x), g * torch.tanh(m.alpha * x) + b, rtol=0, atol=1e-14)


def test_dyt_backward_matches_closed_form():
    m = norms.make_norm("dyt", 8, alpha0=0.7).double()
    perturb_(m)
    x = hidden(shape=(3, 5, 8), scale=3.0).requires_grad_()
    dy = hidden(seed=4, shape=(3, 5, 8))
    m(x).backward(dy)
    a, g = m.alpha.detach(), m.weight.detach()
    t = torch.tanh(a * x.detach())
    sech2 = 1 - t * t  # d tanh(u) / du
    torch.testing.assert_close(x.grad, dy * g * a * sech2, rtol=0, atol=1e-13)
    torch.testing.assert_close(m.alpha.grad, (dy * g * x.detach() * sech2).sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m.weight.grad, (dy * t).sum((0, 1)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m.bias.grad, dy.sum((0, 1)), rtol=1e-12, atol=1e-12)


def test_dyt_alpha_starts_at_its_flags_per_slot():
    model = build(norm="dyt", dyt_alpha=0.2, dyt_alpha_attn=0.8, qk_norm=True)
    block = model.blocks[0]
    assert block.attn_norm.alpha.item() == pytest.approx(0.8)  # a float32 parameter
    for slot in (block.ffn_norm, block.attn.q_norm, block.attn.k_norm, model.final_norm):
        assert slot.alpha.item() == pytest.approx(0.2)
    assert build(norm="dyt").blocks[1].attn_norm.alpha.item() == 0.5


def test_softcap_values_and_gradient():
    z = torch.linspace(-200, 200, 101, dtype=torch.float64, requires_grad=True)
    y = softcap(z, 30.0)
    y.sum().backward()
    torch.testing.assert_close(y, 30.0 * torch.tanh(z.detach() / 30.0), rtol=0, atol=1e-13)
    torch.testing.assert_close(z.grad, 1 - torch.tanh(z.detach() / 30.0) ** 2, rtol=0, atol=1e-13)
    assert y.abs().max() < 30.0 and softcap(z, 0.0) is z


def test_attn_softcap_forces_the_manual_path_and_caps_the_logits():
    model = build(attn_softcap=0.5)  # attn_impl=sdpa: the cap must take the manual path anyway
    perturb_(model)
    attn = model.blocks[0].attn
    assert attn.scores is not None
    x = hidden(scale=2.0).requires_grad_()
    y = attn(x)
    torch.testing.assert_close(y, attention(attn, x, cap=0.5), rtol=0, atol=1e-12)
    assert not torch.allclose(y, attention(attn, x))  # the cap is small enough to matter here
    dx = torch.autograd.grad(y.square().sum(), x)[0]
    dx_written = torch.autograd.grad(attention(attn, x, cap=0.5).square().sum(), x)[0]
    torch.testing.assert_close(dx, dx_written, rtol=0, atol=1e-11)


def test_logit_softcap_caps_the_output_logits_and_the_loss_sees_them():
    capped, plain = build(logit_softcap=0.5), build()
    perturb_(capped)
    perturb_(plain)
    idx, targets = tokens(), tokens(seed=2)
    logits, loss = capped(idx, targets)
    expected = 0.5 * torch.tanh(plain(idx)[0] / 0.5)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-13)
    torch.testing.assert_close(loss, F.cross_entropy(expected.view(-1, 64), targets.view(-1)), rtol=0, atol=1e-13)


def test_the_memory_estimate_counts_the_scores_a_soft_cap_keeps():
    """--attn_softcap takes the manual path, which keeps the (B, H, T, T) scores: train.py's memory check counts
    them as for --attn_impl=manual, Korthikanti et al.'s 5 H T / d bytes per activation value (x2 in float32)."""
    tc = configs.TrainConfig(dtype="float32")
    T, L, H, d = 4096, 4, 4, 128
    sizes = dict(block_size=T, n_layer=L, n_head=H, n_embd=d)
    sdpa = runtime.memory_estimate(GPTConfig(**sizes), tc)
    capped = runtime.memory_estimate(GPTConfig(**sizes, attn_softcap=50.0), tc)
    assert capped == runtime.memory_estimate(GPTConfig(**sizes, attn_impl="manual"), tc)
    assert capped - sdpa == pytest.approx(L * tc.batch_size * T * d * 5 * H * T / d * 2, rel=1e-12)


def test_layer_norm_scaling_divides_each_pre_ln_norm_output_by_sqrt_l():
    model = build(n_layer=3, layer_norm_scaling=True)
    perturb_(model)
    x = hidden(scale=2.0)
    for layer, block in enumerate(model.blocks, start=1):
        h = x + block.attn(scaled_layer_norm(x, block.attn_norm, 1 / math.sqrt(layer)))
        expected = h + block.mlp(scaled_layer_norm(h, block.ffn_norm, 1 / math.sqrt(layer)))
        torch.testing.assert_close(block(x), expected, rtol=0, atol=1e-12)


def test_mix_ln_is_post_ln_in_the_first_round_alpha_l_layers_then_pre_ln():
    model = build(n_layer=4, layout="mix", mix_ln_ratio=0.5)
    perturb_(model)
    x = hidden(scale=2.0)
    assert [b.layout for b in model.blocks] == ["post", "post", "pre", "pre"]
    last_post, first_pre = model.blocks[1], model.blocks[2]  # the switch
    h = scaled_layer_norm(x + last_post.attn(x), last_post.attn_norm)
    torch.testing.assert_close(last_post(x), scaled_layer_norm(h + last_post.mlp(h), last_post.ffn_norm), rtol=0,
                               atol=1e-12)
    h = x + first_pre.attn(scaled_layer_norm(x, first_pre.attn_norm))
    torch.testing.assert_close(first_pre(x), h + first_pre.mlp(scaled_layer_norm(h, first_pre.ffn_norm)), rtol=0,
                               atol=1e-12)
    assert model.final_norm is not None  # the last layers are pre-LN
    # the default ratio 0.25, rounded half up: 10 layers -> 3 Post-LN (Python's round would give 2), 4 -> 1, 1 -> 0
    for n_layer, posts in ((10, 3), (4, 1), (1, 0)):
        layouts = [b.layout for b in GPT(GPTConfig(**{**TINY_CONFIG, "n_layer": n_layer, "layout": "mix"})).blocks]
        assert layouts == ["post"] * posts + ["pre"] * (n_layer - posts)


def test_reordered_norms_each_sublayer_output_only():
    model = build(layout="reordered")
    perturb_(model)
    x = hidden(scale=2.0)
    block = model.blocks[1]
    h = x + scaled_layer_norm(block.attn(x), block.attn_norm)
    torch.testing.assert_close(block(x), h + scaled_layer_norm(block.mlp(h), block.ffn_norm), rtol=0, atol=1e-12)
    assert model.final_norm is not None  # OLMo 2 keeps a final norm
    with pytest.raises(ValueError, match="reordered"):
        GPTConfig(layout="reordered", scale_attn=True)


def test_peri_ln_preset_norms_each_sublayer_input_and_output_and_the_embeddings():
    model = build(**PRESETS["peri_ln"])
    perturb_(model)
    x = hidden(scale=2.0)
    block = model.blocks[0]
    h = x + scaled_layer_norm(block.attn(scaled_layer_norm(x, block.attn_norm)), block.attn_out_norm)
    expected = h + scaled_layer_norm(block.mlp(scaled_layer_norm(h, block.ffn_norm)), block.ffn_out_norm)
    torch.testing.assert_close(block(x), expected, rtol=0, atol=1e-12)
    idx = tokens()
    embedded = scaled_layer_norm(model.wte.weight[idx] + model.wpe.weight[:16], model.embed_norm)
    torch.testing.assert_close(model.embed(idx), embedded, rtol=0, atol=1e-12)
    assert model.final_norm is not None


def test_subln_puts_a_norm_before_w_o_and_before_w_2():
    model = build(subln=True)
    perturb_(model)
    x = hidden(scale=2.0)
    block = model.blocks[0]
    torch.testing.assert_close(block.attn(x), attention(block.attn, x, sub_norm=block.attn.sub_norm),
                               rtol=0, atol=1e-12)
    mlp = block.mlp
    torch.testing.assert_close(mlp(x), mlp.proj(scaled_layer_norm(F.gelu(mlp.fc(x)), mlp.fc_norm)), rtol=0, atol=1e-12)


def test_subln_init_multiplies_v_w_o_w_1_and_w_2_by_sqrt_log_2n():
    plain, sub = build(n_layer=3), build(n_layer=3, subln=True)
    gain = math.sqrt(math.log(6))
    assert subln_gain(GPTConfig(n_layer=3)) == gain
    for p, s in zip(plain.blocks, sub.blocks):
        qk_p, v_p = p.attn.qkv.weight.split((64, 32))
        qk_s, v_s = s.attn.qkv.weight.split((64, 32))
        torch.testing.assert_close(qk_s, qk_p, rtol=0, atol=0)
        for w_p, w_s in ((v_p, v_s), (p.attn.proj.weight, s.attn.proj.weight), (p.mlp.fc.weight, s.mlp.fc.weight),
                         (p.mlp.proj.weight, s.mlp.proj.weight)):
            torch.testing.assert_close(w_s, gain * w_p, rtol=1e-6, atol=0)  # drawn and scaled in float32


def test_learned_embed_scale_starts_at_sqrt_d_and_its_gradient_is_the_chain_rule():
    """DyT's LLaMA code: x = s * E[idx] + P with s one learned scalar from sqrt(d), so dL/ds = sum(dL/dx * E[idx])."""
    model = build(embed_scale=True, embed_scale_learned=True)
    assert model.embed_gain.item() == pytest.approx(math.sqrt(32), rel=1e-7)  # drawn in float32
    with torch.no_grad():
        model.embed_gain.fill_(1.7)  # away from sqrt(d): a fixed sqrt(d) would no longer match
    idx = tokens()
    x = model.embed(idx)
    torch.testing.assert_close(x, 1.7 * model.wte.weight[idx] + model.wpe.weight[:16], rtol=0, atol=1e-12)
    upstream = hidden(shape=(3, 16, 32))
    x.backward(upstream)
    expected = (upstream * model.wte.weight[idx].detach()).sum()
    torch.testing.assert_close(model.embed_gain.grad, expected, rtol=1e-12, atol=0)
    assert build(embed_scale_learned=True).embed_gain is None  # no --embed_scale, no multiplier to learn
    warnings = configs.no_effect_warnings({"embed_scale_learned": True}, GPTConfig(embed_scale_learned=True),
                                          configs.TrainConfig())
    assert warnings == ["train.py: warning: --embed_scale_learned has no effect with --embed_scale=False"]


def init_stds(preset, N=4, d=128):
    """The std of each weight matrix at init of a preset's model, float32 (draws as train.py's)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=N, n_embd=d, n_head=4, block_size=16, vocab_size=256, **PRESETS[preset]))
    block = model.blocks[1]
    q, _, v = block.attn.qkv.weight.chunk(3)
    return model, {"q": q.std().item(), "v": v.std().item(), "W_O": block.attn.proj.weight.std().item(),
                   "W_1": block.mlp.fc.weight.std().item(), "W_2": block.mlp.proj.weight.std().item(),
                   "embed": model.wte.weight.std().item(), "head": model.lm_head.weight.std().item()}


@pytest.mark.parametrize("preset", ["lns", "olmo2"])
def test_lns_and_olmo2_presets_draw_every_weight_from_n_0_0_02(preset):
    """The Curse of Depth's LLaMA code (and its README's advice) and OLMo 2's configs (init_fn: normal,
    init_std: 0.02): no 1/sqrt(2N) on W_O and W_2, which GPT-2's init would make 0.02 / sqrt(8) = 0.0071."""
    model, stds = init_stds(preset)
    assert stds == pytest.approx(dict.fromkeys(stds, 0.02), rel=0.05)
    # OLMo 2: weight_tying false, a head of its own; the Curse of Depth's code keeps GPT-2's tied head here
    assert (model.lm_head.weight is model.wte.weight) == (preset == "lns")


def test_magneto_preset_puts_its_gain_on_a_xavier_init_with_no_depth_factor():
    """Foundation Transformers §2.2 (torchscale's decoder.py): W_v, W_O, W_1, W_2 times sqrt(log 2N) on an init
    of std ~ d^-1/2; xavier: sqrt(2 / (fan_in + fan_out)). On GPT-2's 0.02 / sqrt(2N) W_O would start 12x smaller."""
    _, stds = init_stds("magneto")
    gain, d = math.sqrt(math.log(8)), 128
    expected = {"q": math.sqrt(1 / d), "v": gain * math.sqrt(1 / d), "W_O": gain * math.sqrt(1 / d),
                "W_1": gain * math.sqrt(2 / (5 * d)), "W_2": gain * math.sqrt(2 / (5 * d))}
    assert {k: stds[k] for k in expected} == pytest.approx(expected, rel=0.05)


def test_dyt_preset_learns_its_embedding_scale():
    model = build(**PRESETS["dyt"])
    assert model.embed_gain.requires_grad
    assert model.embed_gain.item() == pytest.approx(math.sqrt(32), rel=1e-7)  # drawn in float32


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["peri_ln", "mix_ln", "lns", "olmo2", "magneto", "dyt", "gemma2"])
def test_new_presets_compile_to_one_graph_that_matches_eager(preset):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY_CONFIG, **PRESETS[preset]}))
    idx = tokens()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(idx)[0], model(idx)[0], rtol=1e-5, atol=1e-5)


def test_coord_check_gives_the_mean_abs_a_direct_computation_gives():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY_CONFIG)).double()
    twin = copy.deepcopy(model)
    batches = [(tokens(seed=s), tokens(seed=s + 10)) for s in range(3)]
    rows = coord_check.coord_check(model, batches, lr=0.01)
    assert len(rows) == 3 * len(probe_points(twin))
    got = {(r["step"], r["layer"], r["op"]): r["mean_abs"] for r in rows}
    optimizer = torch.optim.AdamW(twin.parameters(), lr=0.01, weight_decay=0.0)
    for step, (idx, targets) in enumerate(batches):
        h = twin.embed(idx)
        q = twin.blocks[0].attn.qkv(scaled_layer_norm(h, twin.blocks[0].attn_norm)).chunk(3, dim=-1)[0]
        direct = {(step, None, "embed"): h, (step, 0, "q"): q}
        for layer, block in enumerate(twin.blocks):
            h = block(h)
            direct[(step, layer, "resid_ffn")] = h
        logits, loss = twin(idx, targets)
        direct[(step, None, "logits")] = logits
        for key, tensor in direct.items():
            assert got[key] == pytest.approx(tensor.abs().mean().item(), rel=1e-12), key
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.slow
def test_coord_check_command_writes_png_and_numbers(tmp_path):
    out = tmp_path / "cc.png"
    argv = ["--widths=16,32", "--head_dim=8", "--steps=1", "--n_layer=1", "--batch_size=2",
            f"--data_dir={os.path.join(ROOT, 'data')}", f"--out={out}"]
    assert coord_check.main(argv) == 0
    assert out.stat().st_size > 0 and (tmp_path / "cc.json").stat().st_size > 0


@pytest.mark.parametrize("argv, expected", [
    (["--widths=32,x"], "--widths=32,x is not a comma-separated list of integers"),
    (["--widths=24", "--head_dim=16"], "--head_dim=16 must be >= 1 and divide every width"),
    (["--n_embd=64"], "--n_embd and --n_head are set by --widths and --head_dim"),
    (["--out=cc.jpg"], "--out=cc.jpg must be a .png path"),
    (["--seed=-1"], "--seed=-1 must be in [0, 2^63), as train.py's"),
    (["--widths=1_6"], "--widths=1_6 is not a comma-separated list of integers"),
    (["--lr=1e300"], "--lr=1e+300 must be in [1e-07, 1000] (AdamW moves every weight"),
    (["--lr=1e-9"], "--lr=1e-09 must be in [1e-07, 1000]"),
    (["--widths=10000000", "--head_dim=10000000"], "need about"),
])
def test_coord_check_bad_input_is_one_line_and_exit_code_2(argv, expected, capsys):
    assert coord_check.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("coord_check.py: ") and expected in err and err.count("\n") == 1


@pytest.mark.parametrize("out, says", [("a_file/cc.png", "a_file is a file, not a folder"),
                                       ("a_file/deeper/cc.png", "a_file is a file, not a folder"),
                                       ("gone/cc.png", "gone is a symlink to"),
                                       ("taken.png", "taken.png is a folder, not a file"),
                                       ("numbers.png", "numbers.json is a folder, not a file")])
def test_coord_check_refuses_an_out_it_could_not_write_before_it_runs(tmp_path, capsys, monkeypatch, out, says):
    """--out=<file>/x.png, or a folder where the PNG or its numbers go, said before the runs in one line, exit code
    2 (not the write error after them)."""
    (tmp_path / "a_file").write_text("a file\n")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "taken.png").mkdir()
    (tmp_path / "numbers.json").mkdir()
    ran = []
    monkeypatch.setattr(coord_check, "run", lambda opts, given: ran.append(opts) or [])
    assert coord_check.main([f"--out={tmp_path / out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"coord_check.py: --out={tmp_path / out}: {tmp_path}/") and says in err
    assert err.count("\n") == 1 and ran == []


def test_coord_check_refuses_a_corpus_shorter_than_its_block(tmp_path, capsys):
    (tmp_path / "short.txt").write_text("too short for a block of 64 tokens\n" * 2)
    argv = [f"--dataset={tmp_path / 'short.txt'}", f"--data_dir={tmp_path / 'data'}", f"--out={tmp_path / 'cc.png'}"]
    assert coord_check.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("coord_check.py: ") and "too few for --block_size=64" in err and err.count("\n") == 1
