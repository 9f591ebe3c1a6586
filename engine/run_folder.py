"""
The run folder (--out_dir): config.json, log.jsonl and the checkpoints, written so that nothing is lost, by one
run at a time. A write goes to a .tmp file that is flushed to the disk and then renamed over the old file: a
crash or kill -9 at any moment leaves the old checkpoint or the new one, never half of one.

In the order a run meets them: before any work, `check_out_dir` refuses a folder that cannot be written, that
another run is using, that has a folder where the run writes a file, that is a sweep's, or that holds another run
(unless --resume or --overwrite), and on --resume `newest_checkpoint` finds the newest checkpoint that loads and
`past_events` reads its log (run_reader.read_log), each with notes for the caller to say once the resume goes ahead,
and `check_pieces` holds the checkpoint, config.json and the log to each other (one run's, or the resume is refused).
Once every input is checked, `claim` takes the folder's lock (files.claim) for all the run's processes. `restore` puts
the checkpoint's state back into the model, optimizer, GradScaler and RNGs, and `start_run` writes config.json and
log.jsonl (a resumed run keeps the events up to its checkpoint). In the loop, `log_event` appends one JSON line per
event and `save` writes ckpt.pt with every process's RNG states, keeping ckpt-<step>.pt of the last
--keep_checkpoints checkpoints and of the best one. A failed write is a files.WriteError on every process, with the
files as they were before it. A run stopped by Ctrl-C ends with `interrupted`, which says how to resume it.
"""

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import shlex
import sys
import warnings

import torch
import torch.distributed as dist

from engine import files
from engine import run_reader
from engine import runtime
from engine import views
from engine.files import WriteError
from engine.flags import UsageError, finite_number

CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "step", "best_val", "rng", "model_config", "train_config")
# the sha256 of everything else in a checkpoint (payload_sha256), written with it and checked at every read: torch.load
# checks no checksum of its own, and took a flipped byte in AdamW's moments without a word. An older checkpoint
# without one is read unchecked.
CHECKSUM = "payload_sha256"
# The keys an older checkpoint may lack, with the shape each has where present (run_reader.mismatch): the
# instruments' state (diagnostics/probes.py's state_dict) and whether the checkpoint's step was evaluated.
OPTIONAL_SHAPES = {
    "spike_monitor": {"window": int, "z_threshold": run_reader.NUMBER, "losses": [run_reader.NUMBER],
                      "grads": [run_reader.NUMBER]},
    "divergence": {"max_loss": (int, float, type(None)), "best_mean": run_reader.NUMBER, "above": int,
                   "recent": [run_reader.NUMBER], "tail": [run_reader.NUMBER]},
    "evaluated": bool,
}


def check_out_dir(out_dir, fresh):
    """out_dir is a folder, or can become one, and can be written; no run is using it; it is no sweep's; for a fresh
    run (not --resume or --overwrite) it holds no other run. Checked before anything is written."""
    too_long = files.too_long(out_dir)
    if too_long:
        raise UsageError(f"--out_dir={out_dir[:60]}...: {too_long}; choose a shorter --out_dir")
    existing = files.nearest_existing(os.path.abspath(out_dir))
    if not os.path.exists(existing):  # a symlink that leads nowhere (or into a loop): makedirs would fail on it
        raise UsageError(f"--out_dir={out_dir}: {existing} is {files.not_a_file(existing)}; choose another --out_dir")
    if not os.path.isdir(existing):
        raise UsageError(f"--out_dir={out_dir}: {existing} is a file, not a folder; choose another --out_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out_dir={out_dir}: {existing} is not writable; choose another --out_dir")
    holder = files.held_by(out_dir)
    if holder:
        raise files.in_use(out_dir, holder)
    folder = folder_in_the_way(out_dir)
    if folder:
        raise UsageError(f"--out_dir={out_dir}: {folder} is a folder, where the run writes (or with --overwrite "
                         "removes) a file of its own; move it away, or choose another --out_dir")
    refuse_a_sweep(out_dir)
    if fresh:
        refuse_a_run(out_dir)


def folder_in_the_way(out_dir):
    """The first folder in out_dir named as a run file or a checkpoint's temporary file (ckpt.pt.tmp), or None.
    Found only at the write (the first checkpoint, after the log is rewritten) or at --overwrite's removal (after
    the older files are gone), it would stop a run half-started; a symlink is replaced or removed, never written
    through."""
    for name in sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []:
        path = os.path.join(out_dir, name)
        written = run_reader.is_run_file(name) or name.endswith(".pt.tmp") and run_reader.is_run_file(name[:-4])
        if written and os.path.isdir(path) and not os.path.islink(path):
            return path
    return None


def refuse_a_sweep(out_dir):
    """A sweep's folder (run_reader.SWEEP_FILES) refused, with --resume and --overwrite too: a run's files beside the
    sweep's would make the sweep refuse its own folder."""
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    found = [name for name in run_reader.SWEEP_FILES if name in names]
    if found:
        raise UsageError(f"--out_dir={out_dir} is a sweep's folder (it holds {', '.join(found)}); a run needs a folder "
                         "of its own: choose another --out_dir (a sweep's runs are in its <variant>/<lr>/<seed> "
                         "folders)")


def refuse_a_run(out_dir):
    held = holds_a_run(out_dir)
    if held and not any(name.endswith(".pt") for name in held):  # --resume would find nothing to continue
        raise UsageError(f"--out_dir={out_dir} holds a run's files but no checkpoint ({', '.join(held)}), so --resume "
                         "has nothing to continue; replace them with --overwrite, or choose another --out_dir")
    if held:
        raise UsageError(f"--out_dir={out_dir} holds a run ({', '.join(held)}); continue it with --resume, replace "
                         "it with --overwrite, or choose another --out_dir")


def run_files(out_dir):
    """The files in out_dir that a run writes over: config.json, log.jsonl and the checkpoints."""
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    return [n for n in sorted(names) if run_reader.is_run_file(n)]


def holds_a_run(out_dir):
    """The run files in out_dir that hold something: a user's own config.json counts, and a run that wrote only
    empty files (a fresh run on a full disk) holds nothing."""
    return [n for n in run_files(out_dir) if not is_empty(os.path.join(out_dir, n))]


def is_empty(path):
    try:
        return os.stat(path).st_size == 0 and os.path.isfile(path)
    except OSError:
        return False  # a broken symlink: not empty, as far as anyone can tell


def claim(out_dir, fresh, machine):
    """The run folder's lock (files.claim), taken by process 0 for all the run's processes and held until it
    exits; a fresh run checks again, under the lock, that no run has left its files there meanwhile, and every run,
    just before, that no sweep has (refuse_a_sweep). Returns the lock's file (None on the other processes): keep it
    open."""
    def take():
        refuse_a_sweep(out_dir)  # again, before the lock file: a sweep may have started in the folder meanwhile
        lock = files.claim(out_dir)
        if fresh:
            refuse_a_run(out_dir)
        return lock
    return on_process_0(take, machine)


def on_process_0(work, machine):
    """work() done by process 0 alone, and its failure (a UsageError or WriteError) raised on every process, so
    that all stop with its exit code; process 0 prints it. Returns what work returned (None on the other
    processes)."""
    result, code, failure = None, 0, None
    if machine.master:
        try:
            result = work()
        except UsageError as e:
            code, failure = 2, e
        except WriteError as e:
            code, failure = 1, e
    code = runtime.agree(code, machine)
    if code == 2:
        raise failure or UsageError("process 0 stopped the run")
    if code == 1:
        raise failure or WriteError("process 0 stopped the run")
    return result


class RecordedWrites:
    """A file's writes, keeping the OSError of one that fails: torch.save reports a write that fails after its
    first as a RuntimeError of its own ("unexpected pos 768 vs 662"), which does not say that the disk is full."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data):
        return self.recorded(self.f.write, data)

    def flush(self):
        return self.recorded(self.f.flush)

    def recorded(self, operation, *args):
        try:
            return operation(*args)
        except OSError as e:
            self.error = e
            raise


def write_checkpoint(path, state):
    """state as the checkpoint at path, whole or not at all (files.write_atomic), or a WriteError that keeps the
    previous one. The temporary file has one name, path.tmp, not one per process: only the process holding the
    run folder's lock writes it, and a killed run's partial write is written over by the next save, not left
    behind."""
    writes = []
    # what is left: the run's newest checkpoint, or (the first one failed) none, and then --resume has nothing to
    # continue: the run starts again with --overwrite
    kept = ("the previous checkpoint is kept" if os.path.exists(run_reader.checkpoint_path(os.path.dirname(path)))
            else "the run has no checkpoint yet: once the file can be written, start it again with --overwrite")

    state = {**state, CHECKSUM: payload_sha256(state)}

    def save(f):
        writes.append(RecordedWrites(f))
        torch.save(state, writes[0])

    try:
        files.write_atomic(path, save, tmp=path + ".tmp")
    except WriteError as e:
        raise WriteError(f"{e}; {kept}") from None
    except RuntimeError as e:  # torch.save's report of a failed write: the OSError behind it says why
        error = writes[0].error if writes and writes[0].error else None
        cause = error.strerror if error else str(e).splitlines()[0]
        raise WriteError(f"cannot write {path} ({cause}); {kept}") from None


def save_checkpoint(out_dir, state, keep):
    """ckpt.pt is the newest checkpoint; ckpt-<step>.pt (a hard link, no extra space) names each of the last
    `keep` ones and the one with the best val loss; older ones are deleted."""
    newest = run_reader.checkpoint_path(out_dir)
    write_checkpoint(newest, state)
    numbered = run_reader.checkpoint_path(out_dir, state["step"])
    try:
        with contextlib.suppress(FileNotFoundError):
            os.remove(numbered + ".tmp")
        os.link(newest, numbered + ".tmp")
        os.replace(numbered + ".tmp", numbered)
    except OSError:
        write_checkpoint(numbered, state)  # a file system without hard links
    steps = sorted(run_reader.numbered_checkpoints(out_dir).items())
    for step, path in steps[:-keep]:
        if step != state["best_step"]:
            try:
                os.remove(path)
            except OSError as e:
                raise WriteError(f"cannot remove {path} ({e.strerror}), an older checkpoint; {newest} is saved") \
                    from None


def gather_rng_states(world_size):
    """Every process's RNG states (dropout draws from them), so a resume continues each one exactly."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    if world_size == 1:
        return [state]
    states = [None] * world_size
    dist.all_gather_object(states, state)
    return states


def save(out_dir, state, keep, machine):
    """state and every process's RNG states as the newest checkpoint (process 0 writes), or WriteError on every
    process."""
    state = {**state, "rng": gather_rng_states(machine.world_size)}
    on_process_0(lambda: save_checkpoint(out_dir, state, keep), machine)


def read_checkpoint(path, check_configs=None):
    """A nanonorm checkpoint, or UsageError saying why path is not one (damaged_value; check_configs as there). A
    FIFO is refused unread: reading one would wait forever for a writer."""
    problem = files.not_a_file(path)
    if problem:
        raise UsageError(f"cannot read {path}: it is {problem}")
    try:
        with warnings.catch_warnings():  # torch warns of a pickle protocol it did not write: the one line is below
            warnings.simplefilter("ignore")
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"cannot read {path} ({type(e).__name__}); it is damaged or not a checkpoint") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint]
    if missing:
        raise UsageError(f"{path} is not a nanonorm checkpoint (it lacks {', '.join(missing)})")
    recorded = checkpoint.get(CHECKSUM)
    if recorded is not None and not (isinstance(recorded, str) and recorded == payload_sha256(checkpoint)):
        raise UsageError(f"{path} is damaged: its contents are not what train.py wrote (their sha256 is not the "
                         f"{CHECKSUM} written with them)")
    damage = damaged_value(checkpoint, check_configs)
    if damage:
        raise UsageError(f"{path} is not a nanonorm checkpoint ({damage}); it is damaged or not train.py's")
    return checkpoint


def payload_sha256(state):
    """The sha256 of a checkpoint's contents, all but CHECKSUM, in one walk that a save and a load see alike: each
    tensor's dtype, shape and bytes (on the CPU), each dict's items in the order of their keys' repr, each list's
    (or tuple's) items in order, any other value by its type and repr."""
    digest = hashlib.sha256()
    feed(digest, {key: value for key, value in state.items() if key != CHECKSUM})
    return digest.hexdigest()


def feed(digest, value):
    """value into digest, as payload_sha256 walks it."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"tensor {flat.dtype} {tuple(value.shape)}:".encode())
        digest.update(flat.view(torch.uint8).numpy())
    elif isinstance(value, dict):
        digest.update(f"dict {len(value)}:".encode())
        for key in sorted(value, key=repr):
            digest.update(f"{key!r}=".encode())
            feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"list {len(value)}:".encode())
        for item in value:
            feed(digest, item)
    else:
        digest.update(f"{type(value).__name__} {value!r};".encode())


def damaged_value(checkpoint, check_configs=None):
    """What is wrong with a checkpoint's values ("step is -5, not an integer >= 0"), or None: a resume truncates
    the log to its step, compares losses with its best_val and goes on from its instruments' state, so each is
    checked before anything is written. check_configs(checkpoint) says what is wrong with its configs' values
    (configs.damaged_configs: engine/ knows no flag's type or range), so that a bad one names the checkpoint, not
    a flag the user never gave."""
    for name in ("step", "best_step"):
        value = checkpoint.get(name, 0)
        if type(value) is not int or value < 0:
            return f"{name} is {value!r:.40}, not an integer >= 0"
    if type(checkpoint["best_val"]) not in (int, float) or math.isnan(checkpoint["best_val"]):
        return f"best_val is {checkpoint['best_val']!r:.40}, not a number"
    for name in ("model", "optimizer", "scaler", "model_config", "train_config"):
        if not isinstance(checkpoint[name], dict):
            return f"{name} is a {type(checkpoint[name]).__name__}, not a dict"
    rng = checkpoint["rng"]
    if not (isinstance(rng, list) and rng and all(isinstance(state, dict) and "cpu" in state for state in rng)):
        return "rng is not a list of each process's RNG states"
    optimizer = checkpoint["optimizer"]
    if not (isinstance(optimizer.get("state"), dict) and isinstance(optimizer.get("param_groups"), list)
            and optimizer["param_groups"] and all(isinstance(g, dict) for g in optimizer["param_groups"])):
        return "optimizer is not AdamW's state (a dict of state and a list of param_groups)"
    return (damaged_optional(checkpoint) or non_finite(checkpoint["model"])
            or (check_configs(checkpoint) if check_configs else None))


def non_finite(weights):
    """"it holds non-finite weights (name)" where a floating tensor of the model's state holds NaN or inf, or None. A
    run never saves one: divergence is judged before the update that would make it (diagnostics/instruments.py), so
    such a checkpoint is damaged, not a diverged run's, and a resume of it would "diverge" at once."""
    broken = [name for name, value in weights.items()
              if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all()]
    return f"it holds non-finite weights ({broken[0]}{' and others' if broken[1:] else ''})" if broken else None


def damaged_optional(checkpoint):
    """What is wrong with the keys an older checkpoint may lack (OPTIONAL_SHAPES, and the sha256 of the text the run
    trained on, which a resume compares with the data's), or None."""
    for name, shape in OPTIONAL_SHAPES.items():
        problem = run_reader.mismatch(checkpoint[name], shape, name) if name in checkpoint else None
        if problem:
            return problem
    sha = checkpoint.get("data_sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch("[0-9a-f]{64}", sha)):
        return f"data_sha256 is {sha!r:.40}, not the sha256 of a text (64 hex digits)"
    return None


def same_file(path, other):
    """Whether two paths name one file (ckpt-<step>.pt is a hard link to ckpt.pt); False where either is gone."""
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


def newest_checkpoint(out_dir, check_configs=None):
    """(checkpoint, notes): the newest checkpoint that loads (read_checkpoint, with check_configs): ckpt.pt, unless a
    ckpt-<step>.pt of a later step loads (a ckpt.pt put back from a copy, say), else the ckpt-<step>.pt files from
    the newest down. A missing ckpt.pt is passed over; one that does not load (a symlink to nowhere, a FIFO, a
    damaged file) too, and each note says which it skipped: the caller says them once the resume goes ahead."""
    newest = run_reader.checkpoint_path(out_dir)
    numbered = [(step, path) for step, path in sorted(run_reader.numbered_checkpoints(out_dir).items(), reverse=True)
                if not same_file(path, newest)]
    if not numbered and not os.path.lexists(newest):
        again = ("its run stopped before its first checkpoint: start it again with --overwrite" if holds_a_run(out_dir)
                 else "start without --resume to train from scratch")
        raise UsageError(f"--resume: no checkpoint in {out_dir} ({again})")
    problems = []
    main = loadable(newest, problems, check_configs) if os.path.lexists(newest) else None
    chosen = (newest, main) if main else None
    for step, path in numbered:
        if main and step <= main["step"]:
            break
        checkpoint = loadable(path, problems, check_configs)
        if checkpoint and (not main or checkpoint["step"] > main["step"]):
            if main:
                problems.append(f"{newest} is at step {main['step']}, older than {path}")
            chosen = (path, checkpoint)
            break
    if not chosen:
        raise UsageError(f"--resume: {problems[0]}" + (f" (and {len(problems) - 1} older ones)" if problems[1:] else
                                                       ""))
    return chosen[1], [f"{problem}; resuming from {chosen[0]}" for problem in problems]


def loadable(path, problems, check_configs):
    """read_checkpoint(path, check_configs), or None with why it does not load appended to problems."""
    try:
        return read_checkpoint(path, check_configs)
    except UsageError as e:
        problems.append(str(e))
        return None


def restore(checkpoint, model, optimizer, scaler, tc, machine):
    """A checkpoint's state into the fresh model, optimizer, scaler and RNGs; returns (step, best_val, best_step)."""
    # a compiled module's state_dict prefixes every name with _orig_mod.
    weights = {k.removeprefix("_orig_mod."): v for k, v in checkpoint["model"].items()}
    try:
        model.load_state_dict(weights)
        problem = moments_unlike_parameters(checkpoint["optimizer"], optimizer)
        if problem:
            raise ValueError(problem)
        optimizer.load_state_dict(checkpoint["optimizer"])
        problem = optimizer_mismatch(optimizer)
        if problem:  # fused AdamW would fail at the first step, or read past a moment's end (a crash)
            raise ValueError(problem)
        rng = checkpoint["rng"][machine.rank]
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and machine.device_type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        raise UsageError(f"--resume: the checkpoint does not fit its own model ({load_error(e)})") from None
    saved_dtype = checkpoint["train_config"].get("dtype")
    if scaler.is_enabled() and checkpoint["scaler"]:
        scaler.load_state_dict(checkpoint["scaler"])
    elif saved_dtype != tc.dtype and machine.master:
        # dtype is the machine's choice (a resume may move to a GPU), so allowed, but it is a new numeric path
        fresh_scaler = " with a fresh GradScaler" if scaler.is_enabled() else ""
        print(f"train.py: note: the checkpoint was trained in {saved_dtype}, this run uses {tc.dtype}{fresh_scaler}; "
              "not an exact continuation", file=sys.stderr)
    return checkpoint["step"], checkpoint["best_val"], checkpoint.get("best_step", checkpoint["step"])


def moments_unlike_parameters(saved, optimizer):
    """What of a checkpoint's AdamW moments is not of its parameter's dtype ("the state of param_groups[0]'s
    parameter 3: exp_avg is bfloat16, not float32 as its parameter"), or None: load_state_dict casts each moment to
    its parameter's dtype without a word, so a cast copy would resume inexactly. Read before the load, in the order
    load_state_dict pairs the saved state with the parameters."""
    for i, (group, held) in enumerate(zip(saved["param_groups"], optimizer.param_groups)):
        for j, (key, param) in enumerate(zip(group.get("params", []), held["params"])):
            state = saved["state"].get(key)
            for name in ("exp_avg", "exp_avg_sq"):
                value = state.get(name) if isinstance(state, dict) else None
                if isinstance(value, torch.Tensor) and value.dtype != param.dtype:
                    return (f"the state of param_groups[{i}]'s parameter {j}: {name} is "
                            f"{str(value.dtype).removeprefix('torch.')}, not "
                            f"{str(param.dtype).removeprefix('torch.')} as its parameter")
    return None


def optimizer_mismatch(optimizer):
    """What of AdamW's loaded state does not fit its parameters ("param_groups[0].eps is None, not a number",
    "the state of param_groups[1]'s parameter 0: exp_avg has shape (3,), not (32, 32)"), or None: load_state_dict
    takes any value, and the fused kernel trusts each moment to have its parameter's shape."""
    for i, group in enumerate(optimizer.param_groups):
        for key, default in optimizer.defaults.items():
            value = group.get(key)
            if isinstance(default, bool) or default is None:
                wanted, fits = "True, False or None", value is None or isinstance(value, bool)
            elif key == "betas":
                wanted = "two numbers"
                fits = isinstance(value, (tuple, list)) and len(value) == 2 and all(map(finite_number, value))
            else:
                wanted, fits = "a number", not finite_number(default) or finite_number(value)
            if not fits:
                return f"param_groups[{i}].{key} is {value!r:.40}, not {wanted}"
        for j, param in enumerate(group["params"]):
            state = optimizer.state.get(param)
            if not state:
                continue  # a parameter without a step yet: AdamW makes its state at its first
            for key in ("step", "exp_avg", "exp_avg_sq"):
                value = state.get(key)
                shape = () if key == "step" else tuple(param.shape)
                if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
                    got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else \
                        repr(value)[:40]
                    return (f"the state of param_groups[{i}]'s parameter {j}: {key} is {got}, not a tensor of shape "
                            f"{shape}")
    return None


def load_error(error):
    """torch's error of a load_state_dict as one line that names the key: its first line is only "Error(s) in loading
    state_dict for GPT:", and a KeyError's text is the key alone ('param_groups')."""
    if isinstance(error, KeyError):
        return f"{type(error).__name__}: no {error.args[0]!r} in it" if error.args else type(error).__name__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines[:2]) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def check_pieces(out_dir, checkpoint, events, kept):
    """The run folder's pieces agree, before a resume trusts any of them (a checkpoint or a log copied in from another
    run would be adopted: config.json rewritten, the other run's steps kept): the checkpoint is the run whose
    config.json is there (its whole model config, the training flags `kept` that no resume changes, its data's
    sha256), and the log is the checkpoint's run's (its evaluation at the checkpoint's best step logged the
    checkpoint's best val loss, the same float). A missing config.json or log says nothing against them (each is
    rewritten). A UsageError of one line where they do not agree; nothing is written."""
    config = run_reader.read_config(out_dir, advice="remove it, and the resume writes it anew from the checkpoint "
                                    "(or start a new run in another --out_dir)")
    if config:
        differs = differing_setting(checkpoint, config, kept)
        if differs:
            raise UsageError(f"--resume: the checkpoint at step {checkpoint['step']} is not the run of "
                             f"{run_reader.config_path(out_dir)}: {differs}; put the run's own checkpoint back, or "
                             "start a new run in another --out_dir (or --overwrite)")
    best_val, best_step = checkpoint["best_val"], checkpoint.get("best_step", checkpoint["step"])
    if events and math.isfinite(best_val):
        logged = [e["val_loss"] for e in events if e["event"] == "eval" and e["step"] == best_step]
        if best_val not in logged:
            found = f"val loss {logged[-1]!r} there" if logged else "no evaluation there"
            raise UsageError(f"--resume: {run_reader.log_path(out_dir)} is not the checkpoint's run: the checkpoint's "
                             f"best val loss is {best_val!r} at step {best_step}, the log has {found}; put the run's "
                             "own log back, or remove it (the resumed log then starts at the checkpoint's step)")


def differing_setting(checkpoint, config, kept):
    """The first setting in which a checkpoint and a config.json differ ("model_config.norm is 'rmsnorm', config.json
    says 'layernorm'"), among those both hold, or None."""
    pairs = [("model_config", checkpoint["model_config"], config["model"], None),
             ("train_config", checkpoint["train_config"], config["train"], kept)]
    for section, saved, said, names in pairs:
        for name in saved if names is None else names:
            if name in saved and name in said and json.loads(json.dumps(saved[name])) != said[name]:
                return f"its {section}.{name} is {saved[name]!r:.40}, config.json says {said[name]!r:.40}"
    data = config.get("data")
    source = data.get("source") if isinstance(data, dict) else None
    sha, said = checkpoint.get("data_sha256"), source.get("sha256") if isinstance(source, dict) else None
    if sha and said is not None and said != sha:
        return f"it trained on text sha256 {sha[:12]}, config.json says {str(said)[:12]}"
    return None


def past_events(out_dir):
    """(events, notes): the events of the log of the run being resumed (run_reader.read_log: a log that is not one
    is a UsageError, and nothing is written), and a note where its torn last line was left out or it is missing."""
    path = run_reader.log_path(out_dir)
    events, note = run_reader.read_log(path)
    if not os.path.lexists(path):
        note = f"{path} is missing; the resumed run's log starts at its checkpoint's step"
    return events, [note] if note else []


def write_run_files(model_cfg, tc, machine, resumed_step, events, changes, meta):
    """A fresh run removes an old one's files (--overwrite) and starts an empty log; a resumed one keeps the
    events up to its checkpoint's step (the steps after it, logged before a crash or a kill, are trained and
    logged again), then a "resumed" event with the settings it changed, if any ({flag: [was, now]}: config.json
    holds the new values, so the log says from which step they hold). config.json holds the resolved configs and
    the data's description (meta.json)."""
    if tc.overwrite and resumed_step is None:
        for name in run_files(tc.out_dir):
            try:
                os.remove(os.path.join(tc.out_dir, name))
            except OSError as e:
                raise WriteError(f"cannot remove {os.path.join(tc.out_dir, name)} ({e.strerror})") from None
    # a run's end (diverged, done) at its checkpoint's step is not kept: the resumed run logs its own end
    kept = [e for e in events if resumed_step is not None and e["step"] <= resumed_step
            and not (e["step"] == resumed_step and e["event"] in run_reader.ENDS)]
    if changes:
        kept.append({"event": "resumed", "step": resumed_step, "changed": changes})
    files.write_atomic(run_reader.log_path(tc.out_dir), "".join(json.dumps(e) + "\n" for e in kept).encode())
    sequences = tc.batch_size * tc.grad_accum * machine.world_size
    config = {"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(tc), "world_size": machine.world_size,
              "global_batch": {"sequences": sequences, "tokens": sequences * model_cfg.block_size}, "data": meta,
              "torch": torch.__version__}
    files.write_atomic(run_reader.config_path(tc.out_dir), json.dumps(config, indent=2).encode())


def start_run(model_cfg, tc, machine, model, resumed_step, events, changes, folder, meta):
    """The run folder's files (write_run_files, by process 0; a failure stops every process) and the run's first
    lines, with a line for what a resume changed."""
    on_process_0(lambda: write_run_files(model_cfg, tc, machine, resumed_step, events, changes, meta), machine)
    if not machine.master:
        return
    said = {name: values for name, values in changes.items() if name not in ("dtype", "compile", "device")}
    if said:  # the machine's settings are in the line below, and restore says a dtype change
        print(f"train.py: note: resumed at step {resumed_step} with " + ", ".join(
            f"--{name}={now} (was {was})" for name, (was, now) in said.items()) + "; from this step on (log.jsonl: "
            "a resumed event)", file=sys.stderr)
    sequences = tc.batch_size * tc.grad_accum * machine.world_size
    print(f"{model.num_params():,} parameters | data {folder} | unigram entropy of val {meta['unigram_entropy']:.4f} "
          f"nats/token | device {runtime.describe_device(machine.device)} {tc.dtype} x{machine.world_size} | global "
          f"batch {sequences} sequences = {tc.batch_size} x {tc.grad_accum} micro-steps x {machine.world_size} "
          f"processes, {sequences * model_cfg.block_size:,} tokens")
    if resumed_step is not None and tc.lr_schedule != "constant" and tc.max_iters > tc.lr_decay_iters > tc.warmup_iters:
        print(f"resumed at step {resumed_step}: the LR stays at --min_lr={tc.min_lr} after --lr_decay_iters="
              f"{tc.lr_decay_iters} (the checkpoint's schedule); raise --lr_decay_iters to decay over the longer run")


def interrupted(step, tc, machine, log_path):
    """A run stopped by Ctrl-C, SIGTERM or SIGHUP after its checkpoint: the "interrupted" event and how to resume.
    Exit code 130."""
    if machine.master:
        log_event(log_path, {"event": "interrupted", "step": step})
        launcher = f"torchrun --nproc_per_node={machine.world_size}" if machine.ddp else "python"
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone; the log has said it
            # quoted for a shell: an out_dir may hold spaces, quotes or $
            print(f"interrupted at step {step}; the checkpoint is saved. To continue: "
                  f"{launcher} {shlex.join(['train.py', f'--out_dir={tc.out_dir}', '--resume'])}")
    return 130


def finished(step, val_loss, saved_at, tc, machine, log_path):
    """A run that reached --max_iters: the "done" event, then its last line: where its checkpoint is (saved_at, the
    step of the newest checkpoint, None when none was written) and the command that samples from it. Exit code 0."""
    if machine.master:
        log_event(log_path, {"event": "done", "step": step, "val_loss": val_loss})
        if saved_at is None:  # --always_save_checkpoint=False, and no evaluation improved on step 0's
            print(f"done at step {step}; no checkpoint was written: the validation loss never improved on step 0's")
        else:  # quoted for a shell: an out_dir may hold spaces, quotes or $
            print(f"done at step {step}; the checkpoint of step {saved_at} is "
                  f"{run_reader.checkpoint_path(tc.out_dir)}. To let the model write: "
                  f"python {shlex.join(['sample.py', f'--out_dir={tc.out_dir}'])}")
    return 0


def log_event(path, event):
    """One line of log.jsonl, whole or not at all (files.append_line), then shown by the log's views, if it has any
    (engine/views.py: --tensorboard's event files, --wandb's W&B run)."""
    files.append_line(path, json.dumps(event) + "\n")
    views.show(path, event)
