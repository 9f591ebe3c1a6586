"""Tests of the methods beyond the four papers against their equations, written out here in float64: DyT (Zhu et al.
2025), Gemma 2's soft-caps, LayerNorm Scaling (Sun et al. 2025), Mix-LN (Li, Yin, Liu 2025), Peri-LN (Kim et al.
2025), OLMo 2's reordered norm, Magneto's SubLN (Wang et al. 2023), and the coord check (Tensor Programs V); and
the memory estimate of a soft-capped model, whose attention keeps its scores."""

import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F

from lab import coord_check
import norms
from engine import config_checks, runtime
import train
from diagnostics.probe_points import probe_points
from model import GPT, GPTConfig, PRESETS, softcap, subln_gain
from conftest import ROOT, TINY_CONFIG


pytestmark = pytest.mark.usefixtures("one_thread")


def build(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY_CONFIG, **kw})).double()


def tokens(B=3, T=16, V=64, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def hidden(seed=3, shape=(2, 16, 32), scale=1.0):
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def perturb_(module, seed=7, scale=0.3):
    """Move every parameter away from its init (gains 1, biases 0, alpha 0.5), so that an operation that is skipped
    or misplaced shows up in the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def layer_norm(x, norm, scale=1.0):
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
    return attn.proj(y if sub_norm is None else layer_norm(y, sub_norm))


# 1. DyT: y = g * tanh(alpha * x) + b

@pytest.mark.parametrize("affine", norms.AFFINE)
def test_dyt_forward_matches_formula(affine):
    m = norms.make_norm("dyt", 8, affine=affine, dyt_alpha=0.7).double()
    perturb_(m)
    x = hidden(shape=(3, 5, 8), scale=3.0)
    g = 1.0 if m.weight is None else m.weight
    b = 0.0 if m.bias is None else m.bias
    torch.testing.assert_close(m(x), g * torch.tanh(m.alpha * x) + b, rtol=0, atol=1e-14)


def test_dyt_backward_matches_closed_form():
    m = norms.make_norm("dyt", 8, dyt_alpha=0.7).double()
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


# 2. soft-caps (Gemma 2): c * tanh(z / c)

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
    tc = train.TrainConfig(dtype="float32")
    T, L, H, d = 4096, 4, 4, 128
    sizes = dict(block_size=T, n_layer=L, n_head=H, n_embd=d)
    sdpa = runtime.memory_estimate(GPTConfig(**sizes), tc)
    capped = runtime.memory_estimate(GPTConfig(**sizes, attn_softcap=50.0), tc)
    assert capped == runtime.memory_estimate(GPTConfig(**sizes, attn_impl="manual"), tc)
    assert capped - sdpa == pytest.approx(L * tc.batch_size * T * d * 5 * H * T / d * 2, rel=1e-12)


# 3. placements, each block against its equation on a hand-built input

def test_layer_norm_scaling_divides_each_pre_ln_norm_output_by_sqrt_l():
    model = build(n_layer=3, layer_norm_scaling=True)
    perturb_(model)
    x = hidden(scale=2.0)
    for layer, block in enumerate(model.blocks, start=1):
        h = x + block.attn(layer_norm(x, block.attn_norm, 1 / math.sqrt(layer)))
        expected = h + block.mlp(layer_norm(h, block.ffn_norm, 1 / math.sqrt(layer)))
        torch.testing.assert_close(block(x), expected, rtol=0, atol=1e-12)


def test_mix_ln_is_post_ln_in_the_first_round_alpha_l_layers_then_pre_ln():
    model = build(n_layer=4, layout="mix", mix_ln_ratio=0.5)
    perturb_(model)
    x = hidden(scale=2.0)
    assert [b.layout for b in model.blocks] == ["post", "post", "pre", "pre"]
    last_post, first_pre = model.blocks[1], model.blocks[2]  # the switch
    h = layer_norm(x + last_post.attn(x), last_post.attn_norm)
    torch.testing.assert_close(last_post(x), layer_norm(h + last_post.mlp(h), last_post.ffn_norm), rtol=0, atol=1e-12)
    h = x + first_pre.attn(layer_norm(x, first_pre.attn_norm))
    torch.testing.assert_close(first_pre(x), h + first_pre.mlp(layer_norm(h, first_pre.ffn_norm)), rtol=0, atol=1e-12)
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
    h = x + layer_norm(block.attn(x), block.attn_norm)
    torch.testing.assert_close(block(x), h + layer_norm(block.mlp(h), block.ffn_norm), rtol=0, atol=1e-12)
    assert model.final_norm is not None  # OLMo 2 keeps a final norm
    with pytest.raises(ValueError, match="reordered"):
        GPTConfig(layout="reordered", scale_attn=True)


def test_peri_ln_preset_norms_each_sublayer_input_and_output_and_the_embeddings():
    model = build(**PRESETS["peri_ln"])
    perturb_(model)
    x = hidden(scale=2.0)
    block = model.blocks[0]
    h = x + layer_norm(block.attn(layer_norm(x, block.attn_norm)), block.attn_out_norm)
    expected = h + layer_norm(block.mlp(layer_norm(h, block.ffn_norm)), block.ffn_out_norm)
    torch.testing.assert_close(block(x), expected, rtol=0, atol=1e-12)
    idx = tokens()
    embedded = layer_norm(model.wte.weight[idx] + model.wpe.weight[:16], model.embed_norm)
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
    torch.testing.assert_close(mlp(x), mlp.proj(layer_norm(F.gelu(mlp.fc(x)), mlp.fc_norm)), rtol=0, atol=1e-12)


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
    warnings = config_checks.no_effect_warnings({"embed_scale_learned"}, GPTConfig(embed_scale_learned=True),
                                                train.TrainConfig())
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


# 4. the coord check

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
        q = twin.blocks[0].attn.qkv(layer_norm(h, twin.blocks[0].attn_norm)).chunk(3, dim=-1)[0]
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
    (["--widths=1_6"], "--widths=1_6 is not a comma-separated list of integers"),
    (["--lr=1e300"], "--lr=1e+300 must be in (0, 1000]"),
    (["--widths=10000000", "--head_dim=10000000"], "need about"),
])
def test_coord_check_bad_input_is_one_line_and_exit_code_2(argv, expected, capsys):
    assert coord_check.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("coord_check.py: ") and expected in err and err.count("\n") == 1


@pytest.mark.parametrize("out, says", [("a_file/cc.png", "a_file is a file, not a folder"),
                                       ("a_file/deeper/cc.png", "a_file is a file, not a folder"),
                                       ("gone/cc.png", "gone is a symlink to")])
def test_coord_check_refuses_an_out_it_could_not_write_before_it_runs(tmp_path, capsys, monkeypatch, out, says):
    """--out=<file>/x.png, said before the runs in one line, exit code 2 (not the makedirs error after them)."""
    (tmp_path / "a_file").write_text("a file\n")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
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
