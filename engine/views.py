"""
A run's views: log.jsonl's events shown elsewhere as they are logged, to watch runs as they train. --tensorboard's
event files (engine/tensorboard_view.py) and --wandb's Weights & Biases run (engine/wandb_view.py). log.jsonl stays
the record that every reader uses; a view is handed each event as it goes into the log (run_folder.log_event calls
show) and is never read back by nanonorm. Every view shows the same numbers under the same names, from one mapping
(scalars): each event at its step, every number under a tag named by its place in the log line:
    a number                a scalar <event>/<key>: train/loss, train/lr, train/grad_norm, train/tokens_per_s,
                            eval/val_loss, eval/train_loss, spike/z_loss_score, spike/skipped (1 or 0),
                            overflow/loss_scale
    a dict's number         <event>.<key>/<name>: telemetry.logits/mean_log_z, diverged.failed_op/max_abs
    a list of per-layer rows (telemetry, headroom) <event>.<key>.<stat>/<row>/layer_<i>, the row named by its op,
                            its parameter inside the layer and its pass (telemetry.weights.grad_l2/fc2:mlp.proj.weight/
                            layer_3, telemetry.acts.std/fc2/layer_3, headroom.ops.max_abs/q@k:forward/layer_0)
Every event but the routine ones (ROUTINE) is also shown whole, each view in its own way: spikes, skipped steps,
float16 overflows, the divergence with its first overflowing op, done, interrupted, resumed. Standard library only:
plot.py writes the views of finished runs without torch.
"""

ROUTINE = ("train", "eval", "telemetry", "headroom")  # the events shown as scalars only
OPEN = {}  # {log path: [its views]}: each event logged there is shown by each of them


def add(log_path, view):
    """view (an object with show(event) and close()) shown each event logged to log_path from now on."""
    OPEN.setdefault(log_path, []).append(view)


def show(log_path, event):
    for view in OPEN.get(log_path, ()):
        view.show(event)


def close_all():
    """Every open view written out and closed (train.py as the run ends, however it ends; plot.py after a run)."""
    for opened in OPEN.values():
        for view in opened:
            view.close()
    OPEN.clear()


def scalars(event):
    """[(tag, value)] of every number in an event (a bool as 1 or 0; None and text left out), tagged as the module
    docstring says."""
    kind, found = event["event"], []
    for key, value in event.items():
        if key in ("event", "step"):
            continue
        if is_number(value):
            found.append((f"{kind}/{key}", float(value)))
        elif isinstance(value, dict):
            found += [(f"{kind}.{key}/{name}", float(number)) for name, number in value.items() if is_number(number)]
        elif isinstance(value, list) and value and all(isinstance(row, dict) and "layer" in row for row in value):
            found += [(row_tag(f"{kind}.{key}.{stat}", row), float(number)) for row in value
                      for stat, number in row.items() if stat != "layer" and is_number(number)]
    return found


def is_number(value):
    return isinstance(value, (bool, int, float))


def row_tag(figure, row):
    """figure/<op>:<parameter inside its layer>:<pass>/layer_<i> of a per-layer row (the parts it has): the layer
    last, so that one figure's layers share everything before it. A row of no layer (embed, final_ln) has none."""
    name, layer = row.get("name"), row["layer"]
    if name and layer is not None:
        parts = name.split(".")
        name = ".".join(parts[parts.index(str(layer)) + 1:]) if str(layer) in parts else name
    label = ":".join(str(part) for part in (row.get("op"), name, row.get("pass")) if part)
    return "/".join(part for part in (figure, label, None if layer is None else f"layer_{layer}") if part)
