"""Each paper-context preset builds the model its paper describes: positions, embedding norm, init statistics
measured on the built weights, and parameter counts against the paper's own table (NormFormer arXiv v1 Table 6).
The numbers written here are the papers'; model.PRESETS is only read through GPTConfig and GPT."""

import math

import pytest
import torch

from model import GPT, GPTConfig, PRESETS

pytestmark = pytest.mark.usefixtures("one_thread")


def build(preset, seed=0, **overrides):
    """The model of --preset=NAME plus explicit flags, applied as train.py applies them (the preset first)."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**PRESETS[preset], **overrides}))


def tokens(B=4, T=64, V=256, seed=1):
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


# 1. every paper context is a group whose presets differ only in the variant

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
    "embed_ln": {"init": "scaled", "embed_norm": True}, "scaled_embed": {"init": "scaled", "embed_scale": True},
    "vanilla_scaled": {"init": "scaled"}, "layerscale": {"layer_scale": True},
}


@pytest.mark.parametrize("preset", sorted(VARIANTS))
def test_context_preset_is_its_context_plus_its_variant(preset):
    context = next(flags for prefix, flags in CONTEXTS.items() if preset.startswith(prefix))
    assert PRESETS[preset] == {**context, **VARIANTS[preset]}


# the methods beyond the four papers (DyT, Peri-LN, Mix-LN, LayerNorm Scaling, OLMo 2, Magneto, Gemma 2): test_beyond.py
BEYOND_PRESETS = {"peri_ln", "mix_ln", "lns", "olmo2", "magneto", "dyt", "gemma2"}


def test_presets_are_the_gpt2_context_and_the_paper_contexts():
    assert set(PRESETS) == set(GPT2_PRESETS) | set(VARIANTS) | BEYOND_PRESETS


def test_gpt2_context_presets_are_unchanged():
    assert {name: PRESETS[name] for name in GPT2_PRESETS} == GPT2_PRESETS


# 2. NormFormer: sinusoidal positions, token embeddings of std 1 (fairseq), an embedding LN, and arXiv v1
# Table 6's parameter counts

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
    model = build(preset, block_size=32, n_embd=256)
    d = model.config.n_embd
    assert not any(name.startswith("wpe") for name, _ in model.named_parameters())  # no learned table
    assert close(model.wte.weight.std().item(), d ** -0.5, 0.03)
    idx = tokens(T=32)
    x = model.wte.weight[idx].detach() * math.sqrt(d) + sinusoids_by_hand(32, d)
    mu, var = x.mean(-1, keepdim=True), (x - x.mean(-1, keepdim=True)).square().mean(-1, keepdim=True)
    expected = (x - mu) / torch.sqrt(var + model.config.norm_eps)  # LN at init: gain 1, bias 0
    torch.testing.assert_close(embedding_output(model, idx), expected, rtol=1e-4, atol=1e-5)


def test_embed_init_draws_the_token_embedding_alone_with_std_inverse_sqrt_d():
    d = 256
    fairseq, gpt2 = build("baseline", n_embd=d, embed_init="inv_sqrt_d"), build("baseline", n_embd=d)
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
    model = build("nf_normformer", n_embd=24, n_head=3, block_size=8, head_scale_at=where).double()
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


# 3. Spike No More: sigma = sqrt(2/(5d)) everywhere, sigma / sqrt(2N) on W_O and W_2 (§2.2), and the embeddings
# of each method (§3.2, §4.2)

SNM = ["snm_vanilla", "snm_embed_detach", "snm_scaled_embed", "snm_embed_ln"]
SNM_SHAPE = dict(n_layer=4, n_embd=256, n_head=4)  # wide enough for stds measured within 3%


@pytest.mark.parametrize("preset", SNM)
def test_spike_no_more_init_stds_measured_on_the_weights(preset):
    model = build(preset, **SNM_SHAPE)
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
    idx = tokens()
    vanilla = embedding_output(build("snm_vanilla", **SNM_SHAPE), idx)
    scaled = embedding_output(build("snm_scaled_embed", **SNM_SHAPE), idx)
    normed = embedding_output(build("snm_embed_ln", **SNM_SHAPE), idx)
    assert close(vanilla.std().item(), math.sqrt(2) * sigma, 0.05)
    assert close(scaled.std().item(), math.sqrt(2 / 5 + sigma ** 2), 0.05)
    # same seed, same draws: the vanilla embedding is what Embed LN normalizes (gain 1, bias 0 at init)
    mu, var = vanilla.mean(-1, keepdim=True), vanilla.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(normed, (vanilla - mu) / torch.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)


def test_spike_no_more_embed_detach_keeps_the_value_and_shrinks_the_gradient_tenfold():
    """eq. (14): e = gamma e + (1 - gamma) detach(e), gamma = 0.1 (as Zeng et al. 2023, GLM-130B)."""
    idx = tokens()
    vanilla, detach = build("snm_vanilla", **SNM_SHAPE).double(), build("snm_embed_detach", **SNM_SHAPE).double()
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


# 4. DeepNet: the same narrow model, Post-LN against DeepNorm, at the depth --n_layer gives

@pytest.mark.parametrize("depth", [6, 18])
@pytest.mark.parametrize("preset", ["dn_postln", "dn_deepnorm"])
def test_deepnet_context_at_each_depth(preset, depth):
    """xavier_normal per logical matrix, std sqrt(2 / (fan_in + fan_out)); DeepNorm: x_{l+1} = LN(alpha x_l +
    G(x_l)), alpha = (2N)^(1/4), and gain beta = (8N)^(-1/4) on v, W_O, W_1 and W_2 (q and k keep gain 1)."""
    model = build(preset) if depth == 6 else build(preset, n_layer=depth)  # 6: the preset's own depth
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


# 5. PowerNorm: pre-norm (§5.1), and every norm slot is the norm under comparison

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
    model = build(preset, pn_warmup=0)
    cfg = model.config
    assert cfg.layout == "pre" and model.final_norm is not None
    slots = [model.final_norm] + [norm for block in model.blocks for norm in (block.attn_norm, block.ffn_norm)]
    assert len({type(slot) for slot in slots}) == 1
    for slot in (model.blocks[0].attn_norm, model.blocks[-1].ffn_norm, model.final_norm):
        assert normalized_statistics(slot, cfg.n_embd, cfg.n_head) == {statistic}


# 6. PowerNorm's psi warmup follows the run's flags: a ramp has no LR warmup, so no PN-V warmup either

@pytest.mark.parametrize("schedule, expected", [("ramp", 0), ("cosine", 2 * 50)])
def test_powernorm_warmup_follows_the_lr_schedule(schedule, expected):
    from configs import TrainConfig, fit_to_tokenizer
    tc = TrainConfig(lr_schedule=schedule, warmup_iters=50, grad_accum=2)
    cfg = fit_to_tokenizer(GPTConfig(norm="powernorm"), tc, given={}, resumed=False)
    assert cfg.pn_warmup == expected
