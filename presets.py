"""
--preset=NAME: named rows of the papers' tables, each a set of model flags applied before the explicit ones (which
override them), as nanoGPT keeps its configs in config/. An ablation is a preset plus an override:
--preset=normformer --scale_heads=False is NormFormer's "- Head Scale".

Each group below is one model context: a variant is compared only with the baseline of its own group. The first
lives in nanonorm's GPT-2 context (learned positions, embeddings of std 0.02, no embedding norm, GPT-2's init); each
later group is one paper's own model, its baseline and variants sharing every other flag. Plain data: configs.py
applies a preset, and configurable.txt lists them from here. As a script it prints presets and their flags:
    python presets.py [NAME ...]
"""

import sys

from engine.flags import UsageError, fail, wants_help


class Preset(dict):
    """The model flags a preset sets (it is their dict), and what it reproduces (`source`)."""

    def __init__(self, source, **flags):
        super().__init__(flags)
        self.source = source


# NormFormer's three operations (final §2.1, Fig. 1): a norm after attention, one after the FFN's activation,
# and HeadScale
NORMFORMER = {"scale_attn": True, "scale_fc": True, "scale_heads": True}
# NormFormer's model context, arXiv v1 §2.2 / final §4: sinusoidal positions "following Shortformer"; an embedding LN,
# without which the parameter counts of arXiv v1 Table 6 do not add up (they leave HeadScale's H per layer out); token
# embeddings of std 1 as in fairseq, which it trained with (with std 0.02 the sinusoids swamp them in the LN)
NORMFORMER_CONTEXT = {"pos": "sinusoidal", "embed_norm": True, "embed_scale": True, "embed_init": "inv_sqrt_d"}
# Spike No More §2.2, §4.2: pre-LN GPT, tied embeddings, "scaled" init with sigma = sqrt(2/(5d)) everywhere
# (embeddings included) and sigma / sqrt(2N) on W_O and W_2: nanonorm's GPT-2 context with that init
SCALED_INIT = {"init": "scaled"}
# DeepNet: its claim is about depth, so the context is narrow and --n_layer (6, 18, 36, ...) is the variable
DEEPNET_CONTEXT = {"init": "xavier", "n_layer": 6, "n_embd": 64, "n_head": 4}

CONTEXTS = {
    "GPT-2 context (nanonorm's defaults: learned positions, embeddings of std 0.02, no embedding norm, gpt2 init)": {
        "baseline": Preset("GPT-2 / GPT-3 pre-LN baseline"),
        "postln": Preset("Post-LN Transformer (Vaswani et al.)", layout="post"),
        "normformer": Preset("NormFormer's three operations; ablate with e.g. --scale_heads=False (arXiv v1 Table 5, "
                             "final Table 4)", **NORMFORMER),
        "normformer_resid": Preset("NormFormer + ResScale (final Table 2, small models)", **NORMFORMER,
                                   scale_resids=True),
        "deepnorm": Preset("DeepNet: DeepNorm, alpha = (2N)^(1/4), beta = (8N)^(-1/4)", layout="deepnorm",
                           init="xavier"),
        # CogView's four changes as NormFormer (final) §9.1 note 1 lists them; its Table 8 runs them only with Scale FC
        # on top (row 10: --preset=cogview --scale_fc; rows 19, 21 add more), and the LN formula alone (rows 20, 26)
        "cogview": Preset("CogView as NormFormer (final) §9.1 lists it; + --scale_fc: Table 8 row 10", norm="cogview",
                          scale_attn=True, ffn_out_norm=True, embed_grad_scale=0.1),
        # LayerScale (CaiT) as NormFormer (final) §9.1 note 3; its Table 8 rows 7 and 24 add lambda_resid
        # (--scale_resids; row 24 all three NormFormer operations too)
        "layerscale": Preset("LayerScale (CaiT), NormFormer (final) §9.1; + --scale_resids: Table 8 row 7",
                             layer_scale=True),
    },
    "NormFormer context: sinusoidal positions (arXiv v1 §2.2, final §4), an embedding LN (arXiv v1 Table 6's counts "
    "need it), token embeddings of std 1 (fairseq's N(0, d^-1/2) times sqrt(d), as the sinusoids they are added to)": {
        "nf_baseline": Preset("NormFormer arXiv v1 Table 6 / final Table 2 baseline (124,379,136 parameters at GPT-3 "
                              "Small)", **NORMFORMER_CONTEXT),
        "nf_normformer": Preset("NormFormer arXiv v1 Table 6 / final Table 2; --head_scale_at=after_proj for fairseq's "
                                "HeadScale", **NORMFORMER_CONTEXT, **NORMFORMER),
        "nf_normformer_resid": Preset("NormFormer (final) Table 2, ResScale rows (125M, 355M)", **NORMFORMER_CONTEXT,
                                      **NORMFORMER, scale_resids=True),
    },
    "Spike No More context: pre-LN, tied embeddings, init=scaled (sigma = sqrt(2/(5d)), W_O and W_2 sigma / "
    "sqrt(2N))": {
        "snm_vanilla": Preset("Spike No More Table 1 (Vanilla)", **SCALED_INIT),
        # eq. (14), gamma = 0.1 (after GLM-130B)
        "snm_embed_detach": Preset("Spike No More Table 1 (Embed Detach, eq. (14), gamma = 0.1)", **SCALED_INIT,
                                   embed_grad_scale=0.1),
        "snm_scaled_embed": Preset("Spike No More Table 1 (Scaled Embed)", **SCALED_INIT, embed_scale=True),
        "snm_embed_ln": Preset("Spike No More Table 1 (Embed LN)", **SCALED_INIT, embed_norm=True),
    },
    "DeepNet context: narrow (d = 64, 4 heads), xavier init; its claim is about depth: add --n_layer=6, 18 or 36": {
        # Post-LN against DeepNorm, both xavier (DeepNorm adds alpha and beta)
        "dn_postln": Preset("DeepNet: the Post-LN baseline", layout="post", **DEEPNET_CONTEXT),
        "dn_deepnorm": Preset("DeepNet: DeepNorm, alpha = (2N)^(1/4), beta = (8N)^(-1/4)", layout="deepnorm",
                              **DEEPNET_CONTEXT),
    },
    "PowerNorm context: pre-norm (PowerNorm §5.1), every norm slot the norm under comparison": {
        "pn_layernorm": Preset("PowerNorm Table 2, App. A.2 (LM, every norm: LN)", layout="pre", norm="layernorm"),
        "pn_batchnorm": Preset("PowerNorm Table 2, App. A.2 (LM, every norm: BN)", layout="pre", norm="batchnorm"),
        "pn_pnv": Preset("PowerNorm Table 2, App. A.2 (LM, every norm: PN-V)", layout="pre", norm="pnv"),
        "pn_powernorm": Preset("PowerNorm Table 2, App. A.2 (LM, every norm: PN)", layout="pre", norm="powernorm"),
    },
    "Beyond the four papers: each method as its paper's model defines it, in nanonorm's GPT-2 context otherwise": {
        # Peri-LN: inside the blocks the residual stream itself is never normalized
        "peri_ln": Preset("Peri-LN (Kim et al., ICML 2025): norm on each sublayer's input and output, on the "
                          "embeddings, a final norm", scale_attn=True, ffn_out_norm=True, embed_norm=True),
        "mix_ln": Preset("Mix-LN (Li, Yin, Liu, ICLR 2025): Post-LN in the first 25% of layers, Pre-LN after",
                         layout="mix"),
        # Curse of Depth, with the init its code uses: every weight N(0, 0.02). Its README warns that the scaled
        # init (W_O and W_2 / sqrt(2N), GPT-2's) takes away LNS's effect
        "lns": Preset("LayerNorm Scaling (Sun et al. 2025): pre-LN norm outputs times 1/sqrt(l); N(0, 0.02) init as "
                      "its code (its README warns against the scaled init)", layer_norm_scaling=True, init="plain",
                      init_std=0.02),
        # OLMo 2 normalizes q and k over all d, here per head; it truncates its init at 3 sigma, here untruncated
        "olmo2": Preset("OLMo 2 (2025): x + RMSNorm(F(x)), QK-norm (per head here; OLMo 2's is over all d), final "
                        "norm; N(0, 0.02) init, untied head", layout="reordered", norm="rmsnorm", qk_norm=True,
                        init="plain", init_std=0.02, tie_embeddings=False),
        # Foundation Transformers §2: the gain sqrt(log 2N) on a xavier init with no depth factor
        "magneto": Preset("Magneto (Wang et al. 2023): Pre-LN + SubLN, gain sqrt(log 2N) on a xavier init",
                          subln=True, init="xavier"),
        # Without a norm, the 0.02-scale GPT-2 embeddings reach the first DyT as |x| ~ 0.02 and leave it as ~0.01
        # (tanh(0.5 x) ~ 0.5 x), where LN would give O(1): --embed_scale (x sqrt(d)) gives O(1) tokens, and DyT's
        # LLaMA code learns that multiplier (one scalar, init sqrt(d))
        "dyt": Preset("DyT (Zhu et al., CVPR 2025) in every norm slot; embeddings x a learned scalar, init sqrt(d), as "
                      "its LLaMA code", norm="dyt", embed_scale=True, embed_scale_learned=True),
        # Gemma 2 §2: embeddings times sqrt(d)
        "gemma2": Preset("Gemma 2 (2024): RMSNorm before and after each sublayer, soft-caps 50 and 30", norm="rmsnorm",
                         scale_attn=True, ffn_out_norm=True, embed_scale=True, attn_softcap=50.0, logit_softcap=30.0),
    },
}
PRESETS = {name: preset for group in CONTEXTS.values() for name, preset in group.items()}


def main(argv):
    """Each preset named in argv (every preset without one), a line each: its name, the flags it sets and what it
    reproduces. A name that is no preset is one line, exit code 2."""
    if wants_help(argv):
        print(__doc__.strip())
        return 0
    unknown = [name for name in argv if name not in PRESETS]
    if unknown:
        return fail("presets.py", UsageError(f"{unknown[0]} is not a preset; choose one of {', '.join(PRESETS)}"))
    for name in argv or PRESETS:
        flags = " ".join(f"--{key}={value}" for key, value in PRESETS[name].items())
        print(f"{name}: {flags or '(no flags)'}; {PRESETS[name].source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
