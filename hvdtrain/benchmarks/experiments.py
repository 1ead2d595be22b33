"""`hvdtrain sweep`: Paine et al.'s (2013) experiments 2 and 3 on your model and data.

A grid of real training runs, one job at a time so that wall times are honest:
worker counts × modes (sync, local, async) × n_sync × start. A cold start goes local from the first step; a warm
start first trains --warm-start-steps steps synchronously (post-local SGD); a single
start is the paper's own warm start: those steps count on one worker only, then every
worker takes its state. One worker has no local phase, so it is one run, the
reference, as is a synchronous run with more workers (--modes sync). With
--eval-every, the table also says when each run first reached a target accuracy
(`hvdtrain.benchmarks.time_to_accuracy`). With --seeds, every setting runs once per
seed, and a second table gives each setting's mean accuracy over them with its 95%
interval (`hvdtrain.benchmarks.seeds`). Every run is an ordinary `hvdtrain train` run
folder under OUT/runs/; a sweep started again skips the runs that finished and resumes
the one that stopped. A run the divergence guard stopped (exit 4) is a row of its own,
marked diverged at the step its one line names, with no accuracy (it reaches no target,
and --seeds counts it instead of averaging it), and the sweep goes on; its folder gets
diverged.json, so a sweep started again does not train it again (delete that file to
retry it). Any other failed run stops the sweep with its one line.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from dataclasses import dataclass, replace

from hvdtrain.benchmarks.diverged_runs import (DIVERGED, FINISHED, described, first_error,
                                               is_divergence, is_diverged, mark_diverged,
                                               read_marker)
from hvdtrain.benchmarks.launching import run_job, tool
from hvdtrain.benchmarks.learning_curves import (PAPER_WINDOW, STARTS, WARM_START_OF, load_curve,
                                                 plot_runs)
from hvdtrain.benchmarks.placement import add_hosts_option, check_where, job_command, topology
from hvdtrain.benchmarks.round_form import RoundForm
from hvdtrain.benchmarks.seeds import (SETTING_COLUMNS, add_seeds_option, format_settings_table,
                                       parse_seeds, seed_suffix, summarize_seeds)
from hvdtrain.benchmarks.time_to_accuracy import default_targets, load_points, target_row
from hvdtrain.config import (MODES, TrainConfig, load_config, option_flag,
                             parse_choice_list, parse_int_list, refused_in)
from hvdtrain.config_options import add_config_options, add_train_options, config_of
from hvdtrain.errors import ConfigError, HvdtrainError
from hvdtrain.plan import Job, settle
from hvdtrain.rounds.periods import (TRAINS_DEFAULT, PeriodError, parse_period, period_label,
                                     period_name)
from hvdtrain.stats import sliding_mean
from hvdtrain import files
from hvdtrain.training import run_folder

# hlocal and hasync: hierarchical local SGD (--hierarchical-sgd), sync inside a host.
HIERARCHICAL_OF = {"hlocal": "local", "hasync": "async"}
SWEEP_MODES = (*MODES, *HIERARCHICAL_OF)
# Set by the grid, or meaningless for a sweep.
GRID_OPTIONS = {"mode", "n_sync", "warm_start_steps", "warm_start", "out", "resume", "elastic",
                "elastic_commit_every"}
BASE_OPTIONS = tuple(n for n in TrainConfig.field_names() if n not in GRID_OPTIONS)
SUMMARY_COLUMNS = ("test_accuracy", "wall_seconds", "images_per_sec", "bytes_allreduced",
                   "averaging_rounds", "total_steps")
TARGET_COLUMNS = ("target", "seconds_to_target", "examples_to_target", "bytes_to_target")
# A run's rounds as they travelled (its resolved config): --optimizer auto takes LAMB from
# a global batch of 1,024, whose rescaled rounds default to int4, so one sweep over worker
# counts holds rounds of more than one form, and `hvdtrain predict` costs each with its own.
FORM_COLUMNS = ("round_fragments", "round_compression")
COLUMNS = ("name", "workers", "mode", "n_sync", "start", *FORM_COLUMNS, "seed", "status",
           "diverged_step", "final_training_error", *SUMMARY_COLUMNS, *TARGET_COLUMNS,
           "diverged_reason")


@dataclass(frozen=True)
class GridRun:
    name: str
    workers: int
    n_sync: int | str | None  # None: synchronous (one worker, or --modes sync)
    start: str
    mode: str = "local"  # or async (rounds behind training), hlocal, hasync (hierarchical)
    seed: int | None = None  # None: the shared options' --seed (a sweep without --seeds)

    @property
    def run_name(self) -> str:
        """The run's folder under runs/: the setting's `name`, and its seed with --seeds."""
        return self.name + seed_suffix(self.seed)

    def train_options(self, warm_start_steps: int) -> list[str]:
        seed = [] if self.seed is None else ["--seed", str(self.seed)]
        return self._grid_options(warm_start_steps) + seed

    def _grid_options(self, warm_start_steps: int) -> list[str]:
        if self.n_sync is None:
            # The shared options may set an outer optimizer for the local runs.
            return ["--mode", "sync", *(option for name, default in refused_in("sync")
                                        if default is not None  # None: not given
                                        for option in _option_at(name, default))]
        period = [] if self.n_sync == TRAINS_DEFAULT else ["--n-sync", str(self.n_sync)]
        options = ["--mode", HIERARCHICAL_OF.get(self.mode, self.mode), *period]
        if self.mode in HIERARCHICAL_OF:
            options.append("--hierarchical-sgd")
        if self.start in WARM_START_OF:
            options += ["--warm-start-steps", str(warm_start_steps),
                        "--warm-start", WARM_START_OF[self.start]]
        return options


def grid(workers: list[int], n_syncs: list, starts: list[str],
         modes: tuple[str, ...] = ("local",), slots: int | None = None) -> list[GridRun]:
    """The runs, in order. Hierarchical runs start cold (a warm start does not work with
    --hierarchical-sgd yet) and count hosts as `slots` workers each (None: one host);
    N/hosts periods are theirs only."""
    runs = []
    for count in dict.fromkeys(workers):
        if count == 1:
            runs.append(GridRun("w1", 1, None, "cold"))
            continue
        if "sync" in modes:  # one synchronous run: it has no period and no local start
            runs.append(GridRun(f"w{count}-sync", count, None, "cold", "sync"))
        for mode in (m for m in dict.fromkeys(modes) if m != "sync"):
            runs += _local_runs(count, n_syncs, starts, mode, slots)
    return runs


def with_seeds(runs: list[GridRun], seeds: list[int] | None) -> list[GridRun]:
    """Every run once per seed, the whole grid for one seed before the next, so that a
    sweep stopped early has whole passes and slow drift of the machine is spread over
    the settings alike."""
    if seeds is None:
        return runs
    return [replace(run, seed=seed) for seed in seeds for run in runs]


def _local_runs(count: int, n_syncs: list, starts: list[str], mode: str,
                slots: int | None) -> list[GridRun]:
    hierarchical = mode in HIERARCHICAL_OF
    hosts = math.ceil(count / slots) if hierarchical and slots else 1
    if hierarchical:
        starts = [s for s in starts if s == "cold"]
    else:
        n_syncs = [n for n in n_syncs if not _per_host(n)]
    # Local runs keep the names of sweeps made before async existed.
    tag = "" if mode == "local" else f"{mode}-"
    runs = []
    for n_sync in periods_for(n_syncs, count, hosts):
        for start in dict.fromkeys(starts):
            name = n_sync if n_sync == TRAINS_DEFAULT else period_name(n_sync)
            runs.append(GridRun(f"w{count}-{tag}n{name}-{start}", count, n_sync, start, mode))
    return runs


def _per_host(n_sync) -> bool:
    if n_sync == TRAINS_DEFAULT:
        return False
    period = parse_period(n_sync)
    return getattr(period, "per", "") == "hosts"


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "sweep", help="learning curves over workers × n_sync × cold/warm start",
        description=__doc__.split("\n\n")[1],
        epilog="example:\n  hvdtrain sweep --out runs/sweep --workers 1,2 --n-sync 1,10,100,600 "
               "--batch-size 32 --epochs 3", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="sweep folder: runs/, logs, tables, plots")
    parser.add_argument("--workers", default="1,2", help="worker counts (default: 1,2)")
    parser.add_argument("--n-sync", default="1,10,100,600",
                        help="local-SGD periods for more than one worker: numbers, N/workers "
                             "(resolved per worker count; `hvdtrain plan` shows train's default), "
                             "auto (auto:N), the adaptive period, or link (link:S:M), the period "
                             "that follows the link, or default: the period hvdtrain train "
                             "settles for each job (default: 1,10,100,600)")
    parser.add_argument("--modes", default="local",
                        help="any of sync (one synchronous run per worker count), local, "
                             "async (rounds behind training), hlocal and hasync (hierarchical: "
                             "sync inside a host, cold starts only, N/hosts periods with "
                             "--hosts and --slots), for more than one worker (default: local)")
    parser.add_argument("--target", type=float, default=None,
                        help="test accuracy to reach (0.88): the table gives the training "
                             "seconds, examples and bytes each run needed to first reach it "
                             "(evaluations come from --eval-every, and the final one) "
                             "(default: the synchronous run's final accuracy minus one point, "
                             "per worker count; the one-worker run's without one; a run "
                             "that diverged neither sets nor reaches it)")
    parser.add_argument("--start", default="cold,warm",
                        help="any of cold (local from the first step), warm (synchronous "
                             "steps first) and single (one worker's steps first, as in the "
                             "paper) (default: cold,warm)")
    add_seeds_option(parser)
    parser.add_argument("--warm-start-steps", type=int, default=200,
                        help="steps of a warm or single start (default: 200)")
    parser.add_argument("--window", type=int, default=PAPER_WINDOW,
                        help=f"smoothing window of the plots, in minibatches (default: "
                             f"{PAPER_WINDOW}, as in the paper)")
    parser.add_argument("--hostfile", default=None,
                        help="horovodrun hostfile; a K-worker run takes its first K slots "
                             "(default: all workers on this machine)")
    parser.add_argument("--link-rate", default=None, metavar="RATE",
                        help="train every run over an emulated link: a private network namespace "
                             "whose loopback is shaped to RATE (tc units: 10gbit, 1gbit, "
                             "100mbit); needs root (default: the unshaped loopback)")
    add_hosts_option(parser, "run")
    parser.add_argument("--config", metavar="FILE.yaml", default=None,
                        help="training options shared by every run; the options below override it")
    add_config_options(parser, BASE_OPTIONS)
    parser.set_defaults(handler=run)


def _failure(run: GridRun, code: int, log_path: str) -> HvdtrainError:
    """The job's own one-line error, if it printed one, and where its log is."""
    error = first_error(log_path)
    reason = f": {error}" if error else ""
    return HvdtrainError(f"sweep run {run.run_name} failed (exit {code}){reason}; log: {log_path}")


def _identity(run: GridRun, shared_seed: int) -> dict:
    """What every row says of its run, finished or not."""
    return {"name": run.run_name, "setting": run.name, "workers": run.workers,
            "mode": run.mode if run.n_sync else "sync", "n_sync": run.n_sync or "",
            "start": run.start, "seed": shared_seed if run.seed is None else run.seed}


def saved_round_form(run_dir: str) -> dict:
    """The form of the run's rounds, from the config it saved (blank where it saved none)."""
    config = run_folder.saved_config(run_dir)
    if not config:
        return dict.fromkeys(FORM_COLUMNS, "")
    return RoundForm.of({k: v for k, v in config.items() if v is not None}).columns()


def _row(run: GridRun, run_dir: str, window: int, shared_seed: int) -> dict:
    summary = files.read_json(os.path.join(run_dir, run_folder.SUMMARY))
    curve = load_curve(run_dir)
    return {**_identity(run, shared_seed), **_settled_period(run, run_dir),
            **saved_round_form(run_dir), "status": FINISHED,
            "diverged_step": "", "diverged_reason": "",
            "final_training_error": sliding_mean(curve.error, window)[-1],
            **{k: summary[k] for k in SUMMARY_COLUMNS}}


def _settled_period(run: GridRun, run_dir: str) -> dict:
    """A `--n-sync default` run's row gives the period its plan settled (plan.json)."""
    if run.n_sync != TRAINS_DEFAULT:
        return {}
    path = os.path.join(run_dir, run_folder.PLAN)
    period = files.read_json(path).get("period") if os.path.exists(path) else None
    return {"n_sync": period or TRAINS_DEFAULT}


def _diverged_row(run: GridRun, marker: dict, shared_seed: int, run_dir: str) -> dict:
    """A run the guard stopped: its step and line, and blanks where a summary would be
    (it wrote none, and its last logged steps are the blow-up, not a result)."""
    step = marker.get("step")
    return {**_identity(run, shared_seed), **saved_round_form(run_dir), "status": DIVERGED,
            "diverged_step": "" if step is None else step, "diverged_reason": marker["reason"],
            "final_training_error": "", **dict.fromkeys(SUMMARY_COLUMNS, "")}


def run(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in BASE_OPTIONS if hasattr(args, name)}
    # Checked as a local run's options, since only those take them all (outer optimizers).
    base = load_config(args.config, {**overrides, "mode": "local"})
    starts = parse_choice_list(args.start, "--start", STARTS)
    workers = check_where(args, parse_int_list(args.workers, "--workers"))
    runs = grid(workers, parse_period_list(args.n_sync), starts,
                tuple(parse_choice_list(args.modes, "--modes", SWEEP_MODES)),
                args.slots if args.hosts is not None else None)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    runs = with_seeds(runs, seeds)
    if args.target is not None and not 0 < args.target <= 1:
        raise ConfigError(f"--target must be an accuracy in (0, 1], got {args.target}")
    if args.window <= 0:
        raise ConfigError(f"--window must be a positive number of minibatches, got {args.window}")
    if set(starts) & set(WARM_START_OF) and args.warm_start_steps <= 0:
        raise ConfigError(f"--warm-start-steps must be positive for a warm or single start, "
                          f"got {args.warm_start_steps}")
    check_runs(runs, base, args.warm_start_steps, args.out,
               args.slots if args.hosts is not None else None)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    base_path = os.path.join(args.out, "base.yaml")
    files.atomic_write(base_path, base.save_yaml)
    rows = [_train_or_skip(args, grid_run, number, len(runs), base_path, base.seed)
            for number, grid_run in enumerate(runs, start=1)]
    run_dirs = [os.path.join(args.out, "runs", r.run_name) for r in runs]
    add_time_to_target(rows, run_dirs, args.target)
    _report(args, base, rows, run_dirs, summarize_seeds(rows) if seeds else None)
    return 0


def check_runs(runs: list[GridRun], base: TrainConfig, warm_start_steps: int, out: str,
               slots: int | None = None) -> None:
    """Load every run's config as its own `hvdtrain train` will (base.yaml, then its grid
    options) and settle its plan for its job (`hvdtrain.plan.settle`), before the first
    trains: a shared option that a run's mode refuses, or that its job's size does (a warm
    start as long as the run at the most workers), is refused now, in one line naming the
    run, not after hours of the runs before it.

    Such options are not put back per run, as sync runs put back the local runs' own
    (`_grid_options`): sync is the reference every sweep has, while --no-epoch-rounds,
    --rescale-rounds or an outer optimizer are what a user asked the local runs to train
    with, and quietly leaving them out of the async or hierarchical runs would make the
    sweep compare more than the mode. The user chooses: drop the option or the mode."""
    _check_distinct_folders(runs)
    parser = train_parser()
    epoch_examples = _epoch_counter(base) if warm_start_steps > 0 and any(
        run.start in WARM_START_OF for run in runs) else None
    with tempfile.TemporaryDirectory(prefix="hvdtrain-sweep-") as folder:
        base_path = os.path.join(folder, "base.yaml")  # nothing in --out before all pass
        base.save_yaml(base_path)
        for grid_run in runs:
            try:
                cfg = run_config(parser, grid_run, base_path, warm_start_steps,
                                 os.path.join(out, "runs", grid_run.run_name))
                job = _job_of(grid_run, slots)
                settle(cfg, job, epoch_examples=epoch_examples and epoch_examples(cfg, job))
            except ConfigError as exc:
                raise _refused(grid_run, exc) from None


def _check_distinct_folders(runs: list[GridRun]) -> None:
    """Two runs of one folder would be one run: the sweep would train the first, find the
    second finished, and give it the first's results. Periods are named one name each
    (`period_name`), so only one period spelt twice (link and link:15) gets here."""
    first_of: dict[str, GridRun] = {}
    for run in runs:
        first = first_of.setdefault(run.run_name, run)
        if first is not run:
            raise ConfigError(f"sweep runs of --n-sync {first.n_sync} and {run.n_sync} would "
                              f"share the run folder runs/{run.run_name}: they are one "
                              f"period, give it once; nothing has trained")


def _refused(grid_run: GridRun, exc: ConfigError) -> ConfigError:
    """The one line for a run whose config is refused: the run, its mode, why, and what to
    change (the one-worker reference run is not one of --modes)."""
    mode = grid_run.mode if grid_run.n_sync else "sync"
    change = ("change the shared options" if grid_run.workers == 1 else
              f"change the shared options, or leave {mode} out of --modes")
    return ConfigError(f"sweep run {grid_run.run_name} ({mode}) would be refused: {exc}; "
                       f"nothing has trained: {change}")


def train_argv(grid_run: GridRun, base_path: str, warm_start_steps: int,
               run_dir: str) -> list[str]:
    """The words after `hvdtrain` that train the run."""
    return ["train", "--config", base_path, *grid_run.train_options(warm_start_steps),
            "--out", run_dir]


def train_parser() -> argparse.ArgumentParser:
    """A parser of `hvdtrain train`'s options, as the CLI's train command reads them."""
    parser = argparse.ArgumentParser(prog="hvdtrain train")
    add_train_options(parser)
    return parser


def run_config(parser: argparse.ArgumentParser, grid_run: GridRun, base_path: str,
               warm_start_steps: int, run_dir: str) -> TrainConfig:
    """The validated config the run's `hvdtrain train` loads, parsed by `parser`
    (`train_parser`) as that command parses it."""
    words = train_argv(grid_run, base_path, warm_start_steps, run_dir)[1:]  # after `train`
    return config_of(parser.parse_args(words))


def _job_of(grid_run: GridRun, slots: int | None) -> Job:
    """The job a run trains on, as the grid counts its hosts (`_local_runs`)."""
    hierarchical = grid_run.mode in HIERARCHICAL_OF and grid_run.n_sync is not None
    return Job(grid_run.workers,
               math.ceil(grid_run.workers / slots) if hierarchical and slots else 1)


def _epoch_counter(base: TrainConfig):
    """How many examples a run's epoch holds at a job's size, from the training set's
    size read once here as the runs will read it (TensorFlow's import, once per sweep
    with a warm start); None when the size is known only by reading every record, or
    the data cannot be read here (each run then says why)."""
    from hvdtrain.config import parse_shape
    from hvdtrain.data import load_dataset
    from hvdtrain.progress import epoch_length

    try:
        data = load_dataset(base.dataset, base.data_dir, parse_shape(base.synthetic_shape),
                            seed=base.seed, image_size=base.image_size)
        if base.train_examples is not None:
            data.limit_train(base.train_examples)
    except HvdtrainError:
        return None
    if not (data.endless or data.size_is_cheap) or (data.endless and not base.steps_per_epoch):
        return None
    size = None if data.endless else data.num_train
    return lambda cfg, job: epoch_length(size, cfg.steps_per_epoch,
                                         cfg.batch_size * job.workers)


def _train_or_skip(args: argparse.Namespace, grid_run: GridRun, number: int, count: int,
                   base_path: str, shared_seed: int) -> dict:
    """The run's row: trained now unless an earlier sweep finished it or saw it diverge."""
    run_dir = os.path.join(args.out, "runs", grid_run.run_name)
    finished = os.path.exists(os.path.join(run_dir, run_folder.SUMMARY))
    marker = None if finished else read_marker(run_dir)
    if not finished and marker is None:
        marker = _train(args, grid_run, f"{number}/{count}", base_path, run_dir)
    if marker is not None:
        return _diverged_row(grid_run, marker, shared_seed, run_dir)
    return _row(grid_run, run_dir, args.window, shared_seed)


def _train(args: argparse.Namespace, grid_run: GridRun, number: str, base_path: str,
           run_dir: str) -> dict | None:
    """Train the run: None once it finished, its diverged.json if the guard stopped it;
    any other failure stops the sweep."""
    log_path = run_dir + ".log"
    print(f"hvdtrain: sweep run {number}: {grid_run.run_name}; log: {log_path}", flush=True)
    command = [tool("hvdtrain"), *train_argv(grid_run, base_path, args.warm_start_steps,
                                             run_dir)]
    result = run_job(job_command(args, grid_run.workers, command), log_path)
    if is_divergence(result.returncode):
        marker = mark_diverged(run_dir, log_path)
        print(f"hvdtrain: sweep run {grid_run.run_name} diverged ({marker['reason']}); "
              f"the sweep goes on", flush=True)
        return marker
    if result.returncode != 0:
        raise _failure(grid_run, result.returncode, log_path)
    return None


def _report(args: argparse.Namespace, base: TrainConfig, rows: list[dict],
            run_dirs: list[str], settings: list[dict] | None) -> None:
    """sweep.json, sweep.csv (and sweep-settings.csv with --seeds), the plots, the tables."""
    report = {"base_config": base.to_dict(), "window": args.window, "link_rate": args.link_rate,
              "topology": topology(args.hosts, args.link_rate, args.hostfile, args.slots),
              "warm_start_steps": args.warm_start_steps, "runs": rows}
    if settings is not None:
        report["settings"] = settings
        files.write_csv(os.path.join(args.out, "sweep-settings.csv"), settings, SETTING_COLUMNS)
    files.write_json(os.path.join(args.out, "sweep.json"), report)
    files.write_csv(os.path.join(args.out, "sweep.csv"), rows, COLUMNS)
    targets = {row["target"] for row in rows if row["workers"] > 1 and row["target"] != ""}
    plotted = plot_runs(run_dirs, args.out, args.window,
                        targets.pop() if len(targets) == 1 else None)
    print(format_table(rows, args.window))
    if settings is not None:
        print(format_settings_table(settings))
    plots = " and the plots" if plotted else " (no run logged a step to plot)"
    print(f"hvdtrain: wrote sweep.json, sweep.csv{plots} in {args.out}", flush=True)


def parse_period_list(text: str) -> list[int | str]:
    """'10,50,auto,link' -> [10, 50, 'auto', 'link']: each a --n-sync that `hvdtrain train`
    takes."""
    values = [part.strip() for part in str(text).split(",")]
    for value in (v for v in values if v != TRAINS_DEFAULT):
        try:
            parse_period(value)
        except PeriodError as exc:
            raise ConfigError(f"--n-sync takes periods separated by commas, got {text!r}: "
                              f"{value!r} is none ({exc.problem})") from None
    return [int(v) if v.isdigit() else v for v in values]


def periods_for(n_syncs: list[int | str], workers: int, hosts: int = 1) -> list[int | str]:
    """The periods of one worker count's runs, each once: N/workers (and N/hosts) becomes
    its number of steps, so '10,40/workers' at 4 workers is one run, named and trained as
    n_sync 10."""
    return list(dict.fromkeys(n if n == TRAINS_DEFAULT else period_label(n, workers, hosts)
                              for n in n_syncs))


def add_time_to_target(rows: list[dict], run_dirs: list[str], target: float | None) -> None:
    """Each row gains the target and when its run first reached it. With --seeds the
    default target comes from the synchronous runs' mean over the seeds. A diverged run
    never reached it: an evaluation on its way to the blow-up is not what the setting
    trains to. Nor does it set the default: its count's target comes from the sync runs
    that finished, or else, as for a count without a sync run, from the one-worker run."""
    finals: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        if r["mode"] == "sync" and not is_diverged(r):
            finals.setdefault((r["workers"], r["mode"]), []).append(r["test_accuracy"])
    targets = default_targets({key: sum(accs) / len(accs) for key, accs in finals.items()},
                              {r["workers"] for r in rows})
    for row, run_dir in zip(rows, run_dirs):
        goal = target if target is not None else targets.get(row["workers"])
        row.update(target_row([] if is_diverged(row) else load_points(run_dir), goal))


def _or_dash(value, form: str) -> str:
    return "–" if value == "" else format(value, form)


def format_table(rows: list[dict], window: int) -> str:
    lines = [f"| run | workers | n_sync | start | test accuracy | training error (last {window}) | "
             "wall s | MB allreduced | target | s to target | examples to target | "
             "MB to target |", "|" + "---|" * 12]
    for r in rows:
        mb_to_target = "" if r["bytes_to_target"] == "" else r["bytes_to_target"] / 1e6
        lines.append(f"| {r['name']} | {r['workers']} | {r['n_sync'] or '–'} | {r['start']} | "
                     f"{_result_cells(r)} | "
                     f"{_or_dash(r['target'], '.2%')} | {_or_dash(r['seconds_to_target'], '.0f')} | "
                     f"{_or_dash(r['examples_to_target'], 'd')} | {_or_dash(mb_to_target, '.1f')} |")
    return "\n".join(lines)


def _result_cells(r: dict) -> str:
    """Test accuracy, training error, wall seconds and MB: where a diverged run stopped
    instead, since it has none of them."""
    if is_diverged(r):
        return f"{described(r.get('diverged_step'))} | – | – | –"
    return (f"{r['test_accuracy']:.2%} | {r['final_training_error']:.2%} | "
            f"{r['wall_seconds']:.0f} | {r['bytes_allreduced'] / 1e6:.1f}")


def _option_at(name: str, value) -> list[str]:
    """The command-line words that set option `name` to `value` (a switch has no value)."""
    flag = option_flag(name)
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    return [flag, str(value)]
