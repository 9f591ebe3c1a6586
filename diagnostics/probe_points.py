"""The papers' names of a GPT's operations, for the hooks of diagnostics/probes.py (telemetry, fp16 headroom
and forensics, the coord check) and for labeling weights and gains. This is instrumentation, not the model:
model.py does not import it."""
from diagnostics.probes import ProbePoint
from model import block_layout

# The papers' names of what each module outputs (NormFormer arXiv v1 Table 3 "failed operation"; final Fig. 3-4),
# by module name inside a block; probe_points and op_label (below) read them.
BLOCK_OPS = {
    "attn_norm": "attn_ln", "attn.qkv": "qkv", "attn.scores": "q@k", "attn.sub_norm": "attn_sub_ln",
    "attn.proj": "out_proj",
    "attn_out_norm": "attn_out_ln", "ffn_norm": "ffn_ln", "mlp.fc": "fc1", "mlp.act": "act",
    "mlp.fc_norm": "ffn_hidden_ln", "mlp.proj": "fc2", "ffn_out_norm": "ffn_out_ln",
    # the norms of --qkv_norm and --qk_norm output the q, k and v that attention uses
    "attn.qkv_norm.0": "q", "attn.qkv_norm.1": "k", "attn.qkv_norm.2": "v", "attn.q_norm": "q", "attn.k_norm": "k",
}
# parameters that are no module's output: their own names
PARAM_OPS = {"attn.head_scale": "head_scale", "resid_scale": "resid_scale",
             "attn_layer_scale": "attn_layer_scale", "ffn_layer_scale": "ffn_layer_scale"}
TOP_OPS = {"wte": "embed", "wpe": "embed", "embed_gain": "embed_gain", "embed_norm": "embed_ln",
           "final_norm": "final_ln", "lm_head": "logits"}


def output_of(module_name):
    """The probe point (op, module name inside a block, "output", no chunk) of a module's output."""
    return BLOCK_OPS[module_name], module_name, "output", None


def probe_points(model):
    """Where to hook each operation the papers name, in forward order: a list of ProbePoint(layer, op, module,
    io, chunk). A forward hook ("output") or forward pre-hook ("input") on module sees the tensor;
    chunk (index, count), when not None, means tensor.chunk(count, dim=-1)[index]. layer is None for
    `embed` (the input of block 0), `final_ln` and `logits`. Only operations this config has are listed
    (q@k needs --attn_impl=manual, attn_out_ln --scale_attn, ...).
    q, k, v are chunks of the fused qkv output, or the outputs of the --qkv_norm norms; with --qk_norm,
    q and k are the per-head norms' outputs, which run after v exists, so the order there is v, q, k.
    probs@v is the input of W_O (after HeadScale). In post and deepnorm blocks the norms come after the
    residual sums: attn_ln and resid_attn are then both attn_norm's output, ffn_ln is ffn_norm's output
    and resid_ffn (the block output) the same tensor again. In reordered blocks attn_ln and ffn_ln are the
    sublayer output norms and resid_attn is the FFN's input; a Mix-LN model lists each layer by its own layout.
    With --subln, probs@v is the input of the SubLN norm before W_O; with --layer_norm_scaling, attn_ln and
    ffn_ln are the norms' outputs before the 1/sqrt(l)."""
    cfg = model.config
    qkv = [(op, "attn.qkv", "output", (j, 3)) for j, op in enumerate("qkv")]
    if cfg.qkv_norm:
        qkv = [output_of(f"attn.qkv_norm.{j}") for j in range(3)]
    if cfg.qk_norm:
        qkv = qkv[2:] + [output_of("attn.q_norm"), output_of("attn.k_norm")]
    probs_v = ("probs@v", "attn.sub_norm" if cfg.subln else "attn.proj", "input", None)
    attn = [*qkv, output_of("attn.scores"), probs_v, output_of("attn.sub_norm"), output_of("attn.proj"),
            output_of("attn_out_norm")]
    ffn = [output_of(m) for m in ("mlp.fc", "mlp.act", "mlp.fc_norm", "mlp.proj", "ffn_out_norm")]
    post = [*attn, output_of("attn_norm"), ("resid_attn", "attn_norm", "output", None), *ffn, output_of("ffn_norm")]
    by_layout = {
        "pre": [output_of("attn_norm"), *attn, ("resid_attn", "ffn_norm", "input", None), output_of("ffn_norm"),
                *ffn],
        "post": post,
        "deepnorm": post,
        "reordered": [*attn, output_of("attn_norm"), ("resid_attn", "mlp", "input", None), *ffn,
                      output_of("ffn_norm")],
    }
    modules = dict(model.named_modules())
    points = [ProbePoint(None, "embed", "blocks.0", "input")]
    for i in range(cfg.n_layer):
        points += [ProbePoint(i, op, f"blocks.{i}.{m}", io, chunk)
                   for op, m, io, chunk in by_layout[block_layout(cfg, i)] if f"blocks.{i}.{m}" in modules]
        points.append(ProbePoint(i, "resid_ffn", f"blocks.{i}", "output"))
    points += [ProbePoint(None, TOP_OPS[m], m, "output") for m in ("final_norm", "lm_head") if m in modules]
    return points


def weight_splits(model):
    """{parameter name: labels} for the fused parameters: parameter.chunk(len(labels), dim=0)[j] is
    labels[j]. The qkv Linear stacks W_q, W_k, W_v; GEGLU's fc stacks W (gate) and V (value)."""
    splits = {}
    for name, _ in model.named_parameters():
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            splits[name] = ("q", "k", "v")
        elif model.config.activation == "geglu" and name.endswith(("mlp.fc.weight", "mlp.fc.bias")):
            splits[name] = ("fc1_gate", "fc1_value")
    return splits


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
