r"""
Grids of train.py runs, one summary. Every (variant, lr, seed) runs as its own `python train.py` process
into out_dir/<variant>/<lr>/<seed>/, --jobs at a time; any other flag goes to every run:
    python sweep.py --variants=baseline,normformer,norm=powernorm --lrs=3e-3,1e-2 --seeds=3 --mode=lr \
        --jobs=2 --out_dir=sweeps/lr --max_iters=300
A variant is a preset name (presets.py) or flags without their dashes, several joined by "+":
    normformer    norm=powernorm    preset=normformer+qk_norm=True    normformer+z_loss=1e-4
Seeds are --first_seed .. --first_seed + --seeds - 1. --mode=ramp is the LR stability test (NormFormer arXiv v1 §4,
final §6: the LR rises from 0 to --lr at --max_iters); --mode=lr runs each LR on the runs' own schedule.
--reference=VARIANT compares every other variant with it, seed by seed. --recipe=NAME runs one paper's claims
(lab/recipes.py: its variants, LRs, seeds, mode, reference and flags, fixed before the runs) into sweeps/NAME,
--scale=gpu at a GPU's size:
    python sweep.py --recipe=normformer_stability --jobs=2
A recipe's first seeds are a pilot (--pilot runs only them) that chooses each arm's LR and the number of tested
seeds, never tested; the design's hash goes into the sweep's design.json before any run starts.
Re-running a command skips finished runs and resumes interrupted ones; --dry_run prints the train.py commands
still to run, one per line, for a cluster scheduler, and runs nothing. --launcher=slurm submits the runs to Slurm
through submitit instead, one job array (lab/launch.py: --partition, --time_min, --gpus_per_run, ...), waits for
them and writes the summary; a preempted or timed-out job is requeued and resumes from its checkpoint, and a sweep
left to Slurm is summarized later with --collect (which starts nothing):
    python sweep.py --recipe=normformer_loss --scale=gpu --launcher=slurm --partition=gpu --jobs=32 --dry_run
Before any run starts, every run passes train.py's checks, and a finished or resumable run must have trained with
this command's configs and on its data.
Writes summary.json, summary.csv and a Markdown table on stdout (docs/instruments.md, "Sweeps and plots", says what
each mode summarizes; `python plot.py --experiments=sweeps --out=docs` writes the results page). Exit code 0; 4
where runs failed (crashed, or were refused by train.py: not a divergence, which is a result); 2 bad input, 1 a
failed write, 128 + N stopped by signal N.
"""

from engine import starting  # first: a Ctrl-C from here to main's own handling is one line and exit code 130

import contextlib
import dataclasses
import functools
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Literal, Optional

import configs
import data
from engine import files
from engine import flags
from engine import run_reader
from engine import runtime
from engine import signals
from engine import tensorboard_view
from engine import wandb_view
from lab import launch
from lab import pool
from lab import recipes
from lab.runs import Run, exit_code, forget_notes, is_finished, restart_flags, say_notes
from lab.summary import design_record, previous_summary, write_summary
from presets import PRESETS
from engine.files import WriteError
from engine.flags import UsageError, help_of

HERE = os.path.dirname(os.path.abspath(__file__))
SET_BY_SWEEP = ("lr", "seed", "out_dir", "resume", "overwrite")  # per run; the user gives --lrs, --seeds instead
RUNNING = "sweep.running.lock"  # held by the sweep running in --out_dir, for its whole life (files.claim)
# where and how a run starts or shows, not what it does
BOOKKEEPING = ("out_dir", "resume", "overwrite", "tensorboard", "wandb", "wandb_project", "wandb_run_name",
               "wandb_group", "wandb_tags", "rendezvous_timeout")
# a variant is a folder name inside --out_dir: no separator, no other character a shell or file system treats apart
FOLDER_NAME = re.compile(r"[A-Za-z0-9_.=+-]+")
MAX_COUNT = 10_000  # --seeds, --jobs and the runs of a sweep: larger is a typo, and 1e11 threads would hang the machine
RUNS_FAILED = 4  # the exit code of a sweep some of whose runs failed (crashed or were refused)


@dataclass
class SweepOptions:
    variants: str = help_of("comma-separated: preset names, or flags without dashes joined by +", default="")
    lrs: str = help_of("comma-separated peak LRs (as written, each names a folder)", default="")
    seeds: int = help_of("seeds first_seed .. first_seed+seeds-1 per variant and LR", default=1)
    first_seed: int = help_of("the first seed", default=0)
    mode: Literal["lr", "ramp"] = help_of("lr: the runs' own schedule; ramp: the LR stability test", default="lr")
    jobs: int = help_of("runs at a time", default=1)
    out_dir: str = help_of("the sweep's folder: <variant>/<lr>/<seed>/ per run, and the summaries", default="sweep")
    dry_run: bool = help_of("print the train.py commands still to run, and run nothing", default=False)
    reference: str = help_of("the variant every other variant is compared with (seeds, exact p, verdict)", default="")
    recipe: str = help_of(f"a paper's claim as one command: {', '.join(recipes.RECIPES)}", default="")
    scale: Literal["cpu", "gpu"] = help_of("a recipe's size: cpu (minutes on 2 cores) or gpu", default="cpu")
    pilot: bool = help_of("a recipe's pilot seeds only (they choose its LRs and seeds; never tested)", default=False)
    replicate: bool = help_of("a recipe's replicate: its tested claims again on fresh seeds fixed in the recipe",
                              default=False)


@dataclass
class Plan:
    """A sweep as it runs: SweepOptions with its lists split and a recipe's settings in, and every run's flags."""
    variants: list
    lrs: list
    seeds: int
    first_seed: int
    mode: str
    jobs: int
    out_dir: str
    dry_run: bool
    train_argv: list  # the flags every run gets, checked by train.py's parser
    reference: Optional[str] = None
    recipe: Optional[str] = None
    scale: str = "cpu"
    claims: list = dataclasses.field(default_factory=list)  # a recipe's (recipes.Claim)
    pilot: bool = False
    tested_lrs: Optional[dict] = None  # a recipe's {variant: LRs} after its pilot seeds (recipes.Recipe.tested_lrs)
    replicate: bool = False  # a recipe's fresh-seed replicate (recipes.Replication)
    run_lrs: Optional[dict] = None  # the replicate's {variant: LRs} on every seed
    check_lrs: Optional[dict] = None  # the replicate's {variant: LRs} on its first check_seeds seeds (the grid check)
    check_seeds: int = 0
    best_lrs: Optional[dict] = None  # the replicate's {variant: LR} a best_loss claim reads (the original pilot's)
    launch_options: launch.LaunchOptions = dataclasses.field(default_factory=launch.LaunchOptions)  # where the runs run


def listed(given, name, example):
    """The comma-separated items of --variants or --lrs ([] where it is not given); an empty one, or one with an
    empty item, is refused (UsageError): `--lrs=` was called missing, and `--lrs=3e-3,,1e-2` lost its empty item
    without a word."""
    if name not in given:
        return []
    items = given[name].split(",")
    if "" in items:
        what = "is empty" if not given[name] else "has an empty item"
        raise UsageError(f"--{name}={given[name]} {what}; give one or more, comma-separated, e.g. --{name}={example}")
    return items


def parse_args(argv):
    """Split argv into the sweep's own options and the flags every run gets (checked by train.py's parser)."""
    own, train_argv = flags.split(argv, SweepOptions, launch.LaunchOptions)
    given = flags.parse(own, SweepOptions, launch.LaunchOptions, choices={"recipe": list(recipes.RECIPES)})
    opts = flags.build(SweepOptions, given)
    shared = configs.parse_flags(train_argv)  # the flags every run gets, parsed once
    plan = Plan(variants=listed(given, "variants", "baseline,norm=powernorm"), lrs=listed(given, "lrs", "3e-3,1e-2"),
                seeds=opts.seeds, first_seed=opts.first_seed, mode=opts.mode, jobs=opts.jobs, out_dir=opts.out_dir,
                dry_run=opts.dry_run, train_argv=train_argv, reference=opts.reference or None,
                recipe=opts.recipe or None, scale=opts.scale, pilot=opts.pilot, replicate=opts.replicate,
                launch_options=launch.check(flags.build(launch.LaunchOptions, given), given, opts.dry_run, opts.scale))
    if (plan.pilot or plan.replicate) and not plan.recipe:
        raise UsageError(f"--{'pilot' if plan.pilot else 'replicate'} runs a recipe's "
                         f"{'pilot' if plan.pilot else 'replicate'} seeds; give --recipe=NAME")
    if plan.pilot and plan.replicate:
        raise UsageError("--pilot and --replicate are two stages of a recipe; give one")
    if plan.recipe:
        plan, shared = apply_recipe(plan, given, shared)
        check_scale(plan, shared)
    elif "scale" in given:
        raise UsageError("--scale sizes a recipe; give --recipe=NAME too")
    else:
        overridden = variant_settings(plan.variants).keys() & configs.parse_flags(plan.train_argv).keys()
        if overridden:  # the variant's value would replace the command line's in its runs
            name = sorted(overridden)[0]
            raise UsageError(f"--{name} is set by the variant {variant_settings(plan.variants)[name]} too; give it "
                             "in the variants or on the command line, not both")
    variants, lrs = plan.variants, plan.lrs
    if not variants or not lrs:
        raise UsageError("--variants and --lrs are required; e.g. --variants=baseline,norm=powernorm --lrs=3e-3,1e-2")
    for name in ("seeds", "jobs"):
        if not 1 <= getattr(opts, name) <= MAX_COUNT:
            raise UsageError(f"--{name}={getattr(opts, name)} must be an integer from 1 to {MAX_COUNT}")
    runs = len(variants) * len(lrs) * plan.seeds
    if runs > MAX_COUNT:  # each run's flags are resolved before the first starts: a million would take hours
        raise UsageError(f"{len(variants):,} variants x {len(lrs):,} LRs x {plan.seeds:,} seeds are {runs:,} runs; a "
                         f"sweep has at most {MAX_COUNT:,} (split it into several --out_dir)")
    if not 0 <= opts.first_seed < 2 ** 63 - MAX_COUNT:
        raise UsageError(f"--first_seed={opts.first_seed} must be an integer from 0 to {2 ** 63 - MAX_COUNT - 1} "
                         "(train.py's --seed is below 2^63)")
    check_lrs(lrs)
    check_variants(variants, plan.mode)
    check_out_dir(plan.out_dir)
    owned = [name for name in shared if set_per_run(name, plan.mode)]
    if owned:
        raise UsageError(f"{', '.join('--' + n for n in owned)} is set per run by sweep.py; use --lrs, --seeds, "
                         "--out_dir and --mode instead")
    check_reference(plan)
    return plan


def runs_here(plan):
    """Whether the runs start on this machine: not --dry_run's commands, nor Slurm's jobs (its nodes have their own
    devices and memory)."""
    return not plan.dry_run and plan.launch_options.launcher != "slurm"


def set_per_run(name, mode):
    return name in SET_BY_SWEEP or (name == "lr_schedule" and mode == "ramp")


def check_lrs(lrs):
    """Positive numbers of the flags' one number grammar (flags.number: 1_0 is not 10), each once: an LR given twice
    would run twice into one folder at once, and 1e-2 beside 0.01 would count the same LR twice."""
    seen = {}
    for lr in lrs:
        value = flags.number("lrs", lr, float)
        if not value > 0:
            raise UsageError(f"--lrs: {lr} is not a positive number; give LRs separated by commas")
        if value in seen:
            raise UsageError(f"--lrs: {seen[value]} and {lr} are the same LR; give each LR once")
        seen[value] = lr


def check_variants(variants, mode):
    """Each variant a plain folder name, and none setting what the sweep sets per run: baseline+lr=1 would be
    overridden by --lrs without a word. (Two variants of the same config are refused by check_runs.)"""
    for variant in variants:
        if not FOLDER_NAME.fullmatch(variant) or variant in (".", ".."):
            # a variant names its runs' folder: norm=rmsnorm+data_dir=../../x would put them outside --out_dir
            raise UsageError(f"variant {variant}: a variant names a folder and may hold letters, digits and _ . = + -"
                             "; give a path as a flag to every run (--data_dir=...), not in a variant")
        for part in variant.split("+"):
            name = part_flag(part)
            if set_per_run(name, mode):
                raise UsageError(f"variant {variant}: {name} is set per run by sweep.py; use --lrs, --seeds, "
                                 "--out_dir and --mode instead")


def check_out_dir(out_dir):
    """A folder, or a path where one can be made: not empty, not a file, not inside one."""
    if not out_dir:
        raise UsageError("--out_dir is empty; give the sweep's folder")
    path = files.nearest_existing(os.path.abspath(out_dir))
    what = files.not_a_folder(path)
    if what:
        where = "is" if path == os.path.abspath(out_dir) else f"is inside {path}, which is"
        raise UsageError(f"--out_dir={out_dir} {where} {what}; give the sweep's folder")
    held = [n for n in sorted(os.listdir(path)) if run_reader.is_run_file(n) or n == files.LOCK] \
        if path == os.path.abspath(out_dir) else []
    if held:  # a sweep's runs go in folders below it, and train.py's files would be taken for a sweep's
        raise UsageError(f"--out_dir={out_dir} is a train.py run's folder (it holds {', '.join(held)}); give the "
                         "sweep a folder of its own")


def part_flag(part):
    """The flag a part of a variant sets: 'qk_norm=True' -> qk_norm; a bare name is a preset's."""
    return part.partition("=")[0] if "=" in part else "preset"


def variant_flags(variant):
    """'normformer' -> --preset=normformer; 'preset=normformer+qk_norm=True' -> --preset=normformer --qk_norm=True."""
    return [f"--{part}" if "=" in part else f"--preset={part}" for part in variant.split("+")]


def apply_recipe(plan, given, shared):
    """The plan of --recipe=NAME: the recipe's variants, LRs, seeds, mode, reference, claims and every run's flags
    (recipes.settings, --scale=gpu for the GPU-sized ones); the command line's own train.py flags replace the
    recipe's of the same name, and one its variants set is refused (theirs would win without a word). --out_dir defaults
    to sweeps/NAME (sweeps/NAME_gpu). Its seeds are part of its design, fixed before the runs: --seeds and
    --first_seed are refused. given: the sweep options the command line set; shared: its flags for every run.
    Returns the plan and the flags every run gets, the recipe's and the command line's."""
    if "seeds" in given or "first_seed" in given:
        raise UsageError("a recipe's seeds are part of its design; edit lab/recipes.py and re-run the whole recipe")
    taken = [f"--{name}" for name in ("variants", "lrs", "mode", "reference") if name in given]
    if taken:
        raise UsageError(f"{', '.join(taken)} come from the recipe; run without them, or without --recipe")
    recipe = replicate_settings(plan) if plan.replicate else recipes.settings(plan.recipe, plan.scale, plan.pilot)
    settings = variant_settings(recipe["variants"])
    overridden = settings.keys() & shared.keys()
    if overridden:
        name = sorted(overridden)[0]
        raise UsageError(f"--{name} is set by the recipe's variants ({settings[name]}), "
                         f"which come after the command line's flags: --{name} would change nothing; run the recipe "
                         "without it, or run its variants yourself without --recipe")
    # an explicit flag wins over a preset's (configs.resolve: the preset first), so one that an arm's preset sets
    # would change that arm, and the recipe's claims would be judged on runs it did not design
    by_preset = preset_settings(recipe["variants"])
    changed = by_preset.keys() & shared.keys()
    if changed:
        name = sorted(changed)[0]
        raise UsageError(f"--{name} is set by the preset of the recipe's variant {by_preset[name]}: given on the "
                         "command line it would change that arm, and the recipe would not run as designed; run the "
                         "recipe without it, or run its variants yourself without --recipe")
    out_dir = plan.out_dir if "out_dir" in given else os.path.join(
        "sweeps", plan.recipe + ("_gpu" if plan.scale == "gpu" else "") + ("_replication" if plan.replicate else ""))
    # the command line's flags replace the recipe's of the same name (train.py refuses a flag given twice)
    train_argv = flags.replaced(recipe["train_argv"], plan.train_argv)
    plan = dataclasses.replace(plan, **{**recipe, "out_dir": out_dir, "train_argv": train_argv})
    return plan, {**configs.parse_flags(recipe["train_argv"]), **shared}


def replicate_settings(plan):
    """A recipe's replicate (recipes.replication_settings), at the CPU scale its original ran at: a recipe without
    one of its own is replicated inside another's (normformer_loss_wide in normformer_loss's)."""
    recipe = recipes.RECIPES[plan.recipe]
    if recipe.replication is None:
        inside = [name for name, r in recipes.RECIPES.items() if r.replication and any(
            c.variant in recipe.variants for c in r.replication.claims)]
        where = f": its claims are replicated in {inside[0]} (--recipe={inside[0]} --replicate)" if inside else ""
        raise UsageError(f"{plan.recipe} has no replicate of its own{where}")
    if plan.scale != "cpu":
        raise UsageError("--replicate re-runs a recipe's CPU design on fresh seeds; run it without --scale=gpu")
    return recipes.replication_settings(plan.recipe)


def check_scale(plan, shared):
    """--scale=gpu runs where a GPU is, or where the command line asks for its device (--device=cpu): GPU-sized runs
    that --device=auto would put on this machine's CPU are refused (--dry_run prints them for a GPU node)."""
    if plan.scale == "gpu" and runs_here(plan) and "device" not in shared and \
            runtime.concrete_device("auto") == "cpu":
        raise UsageError("--scale=gpu is the recipe at a GPU's size (GPT-3 Small's shape, 65K tokens a step), and this "
                         "machine has no CUDA GPU: its runs would take days on the CPU; run it on a GPU node, add "
                         "--dry_run for its commands, or give --device=cpu to run it here anyway")


def variant_settings(variants):
    """{flag: the first variant that sets it} of the flags the variants set ("preset" for a preset's name): they
    come after the flags every run gets (train_flags), so they win over them."""
    found = {}
    for variant in variants:
        for part in variant.split("+"):
            found.setdefault(part_flag(part), variant)
    return found


def preset_settings(variants):
    """{flag: the first variant whose preset sets it} of the model flags the variants' presets set (presets.py)."""
    found = {}
    for variant in variants:
        for part in variant.split("+"):
            if part_flag(part) == "preset":  # "normformer" or "preset=normformer"
                for name in PRESETS.get(part.partition("=")[2] or part, {}):
                    found.setdefault(name, variant)
    return found


def check_reference(plan):
    """--reference must be one of the variants: the comparisons need its runs."""
    if plan.reference and plan.reference not in plan.variants:
        raise UsageError(f"--reference={plan.reference} is not one of --variants ({', '.join(plan.variants)}); "
                         "name the variant the others are compared with")


def grid(plan):
    """Every (variant, LR, seed) of the sweep; a recipe's seeds after its pilot only at the LRs its tested_lrs
    names (each arm's LR chosen on the pilot)."""
    return [Run(variant, lr, seed, os.path.join(plan.out_dir, variant, lr, str(seed)))
            for variant in plan.variants for lr in plan.lrs
            for seed in range(plan.first_seed, plan.first_seed + plan.seeds) if runs_at(plan, variant, lr, seed)]


def runs_at(plan, variant, lr, seed):
    """Whether the sweep runs variant at lr on seed: every LR on a recipe's pilot seeds and where it names no
    tested_lrs; a replicate's run_lrs on every seed and its check_lrs on its first check_seeds seeds."""
    if plan.replicate:
        return lr in plan.run_lrs[variant] or (seed < plan.first_seed + plan.check_seeds
                                               and lr in plan.check_lrs.get(variant, ()))
    pilot_end = plan.first_seed + (recipes.RECIPES[plan.recipe].pilot if plan.recipe else 0)
    return seed < pilot_end or plan.tested_lrs is None or lr in plan.tested_lrs.get(variant, ())


def train_flags(run, plan):
    """The flags of one run: the common ones less those the variant sets (a recipe's base flags; the command line's
    are refused where a variant sets them), the variant's, then what the sweep sets per run: each flag once, as
    train.py takes them; --resume or --overwrite as the run's folder asks (restart_flags)."""
    return [*run_flags(run, plan), *restart_flags(run.dir)]


def run_flags(run, plan):
    """train_flags but --resume and --overwrite: what a job sent to a scheduler decides when it starts."""
    argv = [*flags.replaced(flags.replaced(plan.train_argv, variant_flags(run.variant)), wandb_flags(run, plan)),
            f"--lr={run.lr}", f"--seed={run.seed}", f"--out_dir={run.dir}"]
    if plan.mode == "ramp":
        argv.append("--lr_schedule=ramp")
    return argv


def wandb_flags(run, plan):
    """With --wandb, W&B's names of one run: every run of the sweep in the one project of --wandb_project, grouped by
    the recipe (or the sweep folder's name), named <variant>/<lr>/<seed> and tagged with the recipe and the variant
    (train.py adds lr: and seed:), so that W&B shows a recipe's arms side by side; a group or a name the command
    line gives is kept, and its tags come first."""
    given = configs.parse_flags(plan.train_argv)
    if not given.get("wandb"):
        return []
    group = given.get("wandb_group") or plan.recipe or os.path.basename(os.path.abspath(plan.out_dir))
    name = given.get("wandb_run_name") or f"{run.variant}/{run.lr}/{run.seed}"
    tags = [given.get("wandb_tags"), plan.recipe and f"recipe:{plan.recipe}", f"variant:{run.variant}"]
    return [f"--wandb_group={group}", f"--wandb_run_name={name}", f"--wandb_tags={','.join(t for t in tags if t)}"]


def train_command(run, plan):
    """The argv of one run's train.py process."""
    return [sys.executable, os.path.join(HERE, "train.py"), *train_flags(run, plan)]


def check_runs(runs, plan, metas, machine):
    """Every run through the checks train.py makes before it trains, and two variants that resolve to one config
    refused (the same runs twice, into two folders); every <seed>.exit read; and a finished or resumable run trained
    with other settings or on other data refused: it is not this command's run, and a summary would publish it as
    one. The quick checks of every run come before the first data is prepared. metas: {(dataset, tokenizer,
    data_dir): its meta.json}, filled as the data is prepared (data_meta), so that one invocation prepares each
    dataset once and judges every run by one text."""
    seen, resolved = {}, []
    for run in runs:
        model_cfg, tc = run_configs(run, plan, machine)
        settings = config_dicts(model_cfg, tc)
        # the preset is a name: its settings are in the model config
        key = json.dumps([settings["model"], {k: v for k, v in settings["train"].items() if k != "preset"}])
        same = seen.setdefault(key, run)
        if same is not run:
            raise UsageError(f"--variants: {same.variant} and {run.variant} are the same runs (one config); give each "
                             "variant once")
        resolved.append((run, model_cfg, tc, settings))
    saved = {}
    for run, _, tc, settings in resolved:
        exit_code(run)  # a damaged one is refused now, not once the other runs have trained
        if is_finished(run) or run_reader.has_checkpoint(run.dir):
            saved[run.dir] = run_reader.read_config(run.dir)
            check_trained_as(run, saved[run.dir], settings, tc)
    for run, model_cfg, tc, _ in resolved:  # last, the data, which may take minutes to prepare
        if not plan.dry_run:
            check_data(run, model_cfg, tc, metas)
        if run.dir in saved:
            check_trained_on(run, saved[run.dir], tc, metas)


def run_configs(run, plan, machine):
    """A run's model and train configs as train.py resolves them for a fresh run (configs.resolve, once), less what
    the machine decides (configs.machine_free: --dry_run's commands may be meant for another machine, a GPU node);
    where the runs run on this machine, train.py's memory check passes here, with the device and dtype the
    resolution picks on it. Bad input is one line naming the variant."""
    argv = [f for f in train_flags(run, plan) if f not in ("--resume", "--overwrite")]
    try:
        given = configs.parse_flags(argv)
        model_cfg, tc, device, _ = configs.resolve(given, machine=runs_here(plan))
        if runs_here(plan):
            runtime.check_memory(model_cfg, tc, device, machine)
            tensorboard_view.check_installed(tc.tensorboard)
            wandb_view.check_installed(tc.wandb)
    except UsageError as e:
        raise UsageError(f"variant {run.variant}: {e}") from None
    return model_cfg, configs.machine_free(tc, given)


def data_meta(run, tc, metas):
    """The meta.json of the run's data, prepared as train.py prepares it (data.prepare: a corpus prepared already is
    found, not read again; a bad one writes nothing), once per invocation. A corpus train.py would refuse is one line
    naming the variant."""
    key = (tc.dataset, tc.tokenizer, tc.data_dir)
    if key not in metas:
        try:
            if data.is_streamed(tc.dataset) and data.prepared_streamed(*key) is None:
                raise UsageError(f"variant {run.variant}: {not_prepared(tc)}; prepare it first, once for every run")
            metas[key] = data.load_meta(data.prepare(*key))
        except data.DataError as e:
            raise UsageError(f"variant {run.variant}: {e}") from None
    return metas[key]


def not_prepared(tc):
    """What a corpus of the datasets library that is not prepared yet needs: sweep.py does not stream billions of
    tokens before its runs (data.py does, in worker processes, resumably)."""
    return (f"--dataset={tc.dataset} is not prepared in --data_dir={tc.data_dir}: python data.py "
            f"--dataset={tc.dataset} --tokenizer={tc.tokenizer} --data_dir={tc.data_dir} prepares it (docs/scale.md)")


def gpu_estimate(runs, plan):
    """The lines --scale=gpu --dry_run ends with on stderr: the runs' tokens and H100-hours (lab.bench.gpu_hours),
    and notes: the corpus to prepare first where it is not prepared, a variant whose model cannot be built."""
    from lab import bench  # here: torch's model on the meta device, only for this estimate
    tokens, hours, notes, per_token = 0, 0.0, set(), {}  # per_token: H100-hours a token, by model config
    for run in runs:
        model_cfg, tc = run_configs(run, plan, None)
        run_tokens = tc.max_iters * tc.batch_size * tc.grad_accum * model_cfg.block_size * \
            max(1, plan.launch_options.gpus_per_run)
        if repr(model_cfg) not in per_token:  # a model built once per config, not once per run
            try:
                per_token[repr(model_cfg)] = bench.gpu_hours(model_cfg, 1)
            except ValueError as e:  # a combination model.py refuses when it builds the model, which train.py would
                per_token[repr(model_cfg)] = 0.0
                notes.add(f"variant {run.variant}: model.py cannot build its model ({e}); not counted")
        tokens, hours = tokens + run_tokens, hours + per_token[repr(model_cfg)] * run_tokens
        if data.is_streamed(tc.dataset) and data.prepared_streamed(tc.dataset, tc.tokenizer, tc.data_dir) is None:
            notes.add(not_prepared(tc))
    return [f"sweep.py: {len(runs)} runs, {tokens / 1e9:,.1f}B tokens: about {hours:,.0f} GPU-hours on H100s (model "
            f"FLOPs at the {bench.H100_MODEL_FLOPS / 1e12:.0f} TFLOP/s GPT-2 small reached on one, docs/benchmarks.md;"
            " evaluation not counted)", *(f"sweep.py: note: {line}" for line in sorted(notes))]


def check_data(run, model_cfg, tc, metas):
    """train.py's data checks (configs.check_data: a block fits in each split); a resumed run's text is compared
    with the one it trained on by check_trained_on."""
    try:
        configs.check_data(data_meta(run, tc, metas), model_cfg, None)
    except data.DataError as e:
        raise UsageError(f"variant {run.variant}: {e}") from None


def config_dicts(model_cfg, tc):
    """{"model": ..., "train": ...} as config.json holds them (JSON values), less the per-run bookkeeping."""
    settings = json.loads(json.dumps({"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(tc)}))
    settings["train"] = {k: v for k, v in settings["train"].items() if k not in BOOKKEEPING}
    return settings


def check_trained_as(run, saved, settings, tc):
    """The finished or resumable run's config.json (saved) holds the settings this command would run it with
    (train.py writes it before the first step, so a run without one cannot be told apart from another command's). A
    key its config.json lacks counts as its default; a setting train.py resolves when
    the run starts counts as given where it was left unset."""
    if saved is None:
        raise UsageError(f"{run.dir} has a result or a checkpoint but no config.json, so nothing says which flags "
                         "trained it; remove the run (its folder, .exit and .out) to run it again")
    defaults = {"model": default_values(configs.GPTConfig), "train": default_values(configs.TrainConfig)}
    for section, expected in settings.items():
        for key, value in expected.items():
            was = saved[section].get(key, defaults[section][key])
            if was != value and not resolved_at_start(key, value, was, tc, defaults[section]):
                raise UsageError(f"{run.dir} was trained with --{key}={was}, this command runs --{key}={value}: it is "
                                 "not this command's run; give another --out_dir, or remove the run (its folder, "
                                 ".exit and .out) to run it again")


def check_trained_on(run, saved, tc, metas):
    """The finished or resumable run trained on the text this command's runs read now: the sha256 its config.json
    records (data.py's meta.json, which train.py copies there) is that of the data prepared now (data_meta). A corpus
    edited since the run trained makes it another experiment's run."""
    now = data_meta(run, tc, metas)["source"]["sha256"]
    source = saved.get("data")
    source = source.get("source") if isinstance(source, dict) else None
    trained_on = source.get("sha256") if isinstance(source, dict) else None
    if not isinstance(trained_on, str):
        raise UsageError(f"{run.dir}/config.json records no sha256 of its data, so nothing says which text trained "
                         "it; remove the run (its folder, .exit and .out) to run it again")
    if trained_on != now:
        raise UsageError(f"{run.dir} was trained on another text of --dataset={tc.dataset} (sha256 {trained_on[:12]}; "
                         f"now {now[:12]}): it is not this command's run; put its data back, give another "
                         "--out_dir, or remove the run (its folder, .exit and .out) to run it again")


def resolved_at_start(key, value, was, tc, defaults):
    """Whether was is what train.py made of a setting left at its default when the run started: dtype and compile
    (from the machine it ran on, configs.MACHINE_SETTINGS), and a resumed run's lr_decay_iters (max_iters:
    configs.resume_configs)."""
    if key == "lr_decay_iters":
        return value is None and was == tc.max_iters
    return key in configs.MACHINE_SETTINGS and value == defaults[key]


def default_values(cls):
    return json.loads(json.dumps(dataclasses.asdict(cls())))


def main(argv):
    starting.done()  # Ctrl-C is KeyboardInterrupt from here on
    if flags.wants_help(argv):
        flags.print_help(__doc__, SweepOptions, launch.LaunchOptions)
        return 0
    forget_notes()
    try:
        plan = parse_args(argv)
        machine = runtime.Machine.from_env()  # every run inherits sweep.py's environment: a bad one would fail them all
        runs = grid(plan)
        metas = {}
        check_runs(runs, plan, metas, machine)
        previous_summary(plan.out_dir)  # a damaged one is refused now, not after hours of runs
        design_record(plan.out_dir)  # so is a damaged record of the design, which the summary carries
        # the same sweep started twice at once would start the same runs twice: the second is refused
        with contextlib.nullcontext() if plan.dry_run else files.claim(plan.out_dir, RUNNING, "another sweep"):
            todo = [run for run in runs if not is_finished(run)]
            say_notes()  # the checks have passed: the logs' notes, each once (a refusal is its one line alone)
            code = run_sweep(plan, runs, todo, metas, machine)
        say_notes()
        return code
    except UsageError as e:
        return flags.fail("sweep.py", e)
    except WriteError as e:
        print(f"sweep.py: {e}", file=sys.stderr)
        return 1


def run_sweep(plan, runs, todo, metas, machine):
    """Print --dry_run's commands, or run what is left (with --collect, nothing) and write the summaries. Exit code 0;
    RUNS_FAILED where runs failed (crashed or were refused), with one line counting them; or 128 + the signal that
    stopped the sweep (its runs stopped with a checkpoint). metas, machine: check_runs'."""
    elsewhere = [run for run in todo if files.held_by(run.dir) or launch.queued(run)]
    for run in elsewhere:
        where = f"in another process ({files.held_by(run.dir)})" if files.held_by(run.dir) else \
            f"as {launch.queued(run)}"
        print(f"sweep.py: {run.dir} is running {where}; left to it", file=sys.stderr)
    todo = [run for run in todo if run not in elsewhere]
    if plan.dry_run:
        if plan.launch_options.launcher == "slurm" and todo:
            print(launch.sbatch_script(plan.launch_options, plan.jobs, job_name(plan), plan.out_dir, len(todo)))
        for run in todo:
            print(shlex.join(["python", "train.py", *train_flags(run, plan)]))
        if plan.scale == "gpu":
            print("\n".join(gpu_estimate(todo, plan)), file=sys.stderr)
        return 0
    if plan.launch_options.collect:
        print(f"{len(runs)} runs, {len(runs) - len(todo) - len(elsewhere)} finished, {len(elsewhere)} running "
              f"elsewhere or queued, {len(todo)} neither: --collect starts nothing")
        todo = []
    else:
        print(f"{len(runs)} runs, {len(runs) - len(todo) - len(elsewhere)} finished already, {len(elsewhere)} running "
              f"elsewhere, {len(todo)} to run, {plan.jobs} at a time")
    started = time.time()
    if plan.recipe and todo:
        record_design(plan)
    if plan.launch_options.launcher == "pool":
        stopped = pool.run_all(todo, plan.jobs, functools.partial(train_command, plan=plan))
    else:
        stopped = launch.run_all(todo, functools.partial(run_flags, plan=plan), plan.launch_options, plan.jobs,
                                 job_name(plan), plan.out_dir) if todo else None
    if stopped:
        print(stop_message(stopped, todo, plan.launch_options.launcher), file=sys.stderr)
        return signals.exit_code(stopped)
    check_runs(runs, plan, metas, machine)  # a run another process finished meanwhile may hold other settings or data
    failed = write_summary(plan, runs, wall_s=time.time() - started if todo else 0.0)
    if failed:
        print(f"sweep.py: {failed} of {len(runs)} runs failed (they crashed or were refused: see their .out files)"
              f"{refused_resumes(todo)}{'; the recipe publishes no verdict' if plan.recipe else ''}; exit code "
              f"{RUNS_FAILED}", file=sys.stderr)
        return RUNS_FAILED
    return 0


def job_name(plan):
    """The name of a sweep's jobs in the scheduler's queue: the recipe's, or the sweep folder's."""
    return f"nanonorm-{plan.recipe or os.path.basename(os.path.abspath(plan.out_dir))}"


def record_design(plan):
    """out_dir/design.json: the recipe's design hash (recipes.design_hash), the stage and the time, appended before
    runs of a design or stage not yet recorded start, so that the summary shows the design the runs started
    under."""
    path = os.path.join(plan.out_dir, "design.json")
    entries = design_record(plan.out_dir)
    stage = recipes.sweep_stage(plan.pilot, plan.replicate)
    entry = {"sha256": recipes.design_hash(plan.recipe, plan.scale, stage), "stage": stage}
    if any({k: e.get(k) for k in entry} == entry for e in entries):
        return
    os.makedirs(plan.out_dir, exist_ok=True)
    entry["recorded"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    files.write_atomic(path, json.dumps([*entries, entry], indent=1).encode())


def refused_resumes(todo):
    """The part of the failure line that names the runs train.py refused to resume (exit code 2 beside a
    checkpoint: every checkpoint damaged, say), "" where none was: a re-run of the sweep resumes them again, to the
    same end, until they are removed."""
    refused = [run for run in todo if not is_finished(run) and exit_code(run) == 2
               and run_reader.has_checkpoint(run.dir)]
    if not refused:
        return ""
    more = f" (and {len(refused) - 1} more)" if refused[1:] else ""
    return (f"; train.py refused to resume {refused[0].dir}{more}, as it will on every re-run (its .out says why): "
            "remove the run (its folder, .exit and .out) to train it afresh")


def stop_message(stopped, todo, launcher="pool"):
    """The line of a stopped sweep: which of its unfinished runs resume from a checkpoint and which start afresh (a
    run stopped, or killed, before its first checkpoint has none); Slurm's jobs are left to Slurm."""
    if launcher == "slurm":
        return (f"sweep.py: stopped by {signals.name(stopped)} while waiting; the Slurm jobs go on: run the same "
                "command with --collect to summarize what has finished, or again to submit what has not")
    left = [run for run in todo if not is_finished(run)]
    resume = sum(run_reader.has_checkpoint(run.dir) for run in left)
    return (f"sweep.py: stopped by {signals.name(stopped)}; of its {len(left)} unfinished runs, {resume} resume from a "
            f"checkpoint, {len(left) - resume} start afresh; run the same command again to go on")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
