"""Wall time to a target accuracy on other hardware: a sweep's examples to the target,
over the throughput `hvdtrain predict` gives for that hardware.

A sweep (`hvdtrain sweep --target`) measures how many examples each setup needed to
first reach the target, here. A setup's predicted seconds to the target elsewhere are
those examples over its predicted images/sec there, and its speed-up is the one-worker
run's predicted seconds over its own. What carries over from the sweep is only the ratio
of examples: how much statistical efficiency a setup loses or gains per example, which
this assumes the other model and data would share. A sweep over seeds gives each setup
the mean of its seeds that reached the target, and says how many did. Each local run is
costed with the predicted rows of its own rounds' form (`--round-compression`,
`--round-fragments`): a sweep over worker counts under `--optimizer auto` sends int8 rounds
below a global batch of 1,024 and int4 from it on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from statistics import fmean

from hvdtrain.benchmarks.round_form import RoundForm
from hvdtrain.config import DEFAULT_ROUND_COMPRESSION, LOCAL_MODES
from hvdtrain.errors import ConfigError

COLUMNS = ("mode", "n_sync", "start", "workers", "round_fragments", "round_compression",
           "link_rate", "examples_to_target", "examples_ratio", "images_per_sec", "speedup",
           "runs_reached", "runs")

# (mode, n_sync, workers, start, form of its rounds): a sync run's period is 1, as predict
# counts it, and its form RoundForm() (it sends no rounds).
Setup = tuple[str, int, int, str, RoundForm]


@dataclass(frozen=True)
class SweepTargets:
    """What a sweep says about its target: the examples its flat runs needed to reach it,
    by setup (the mean over the seeds that reached it); the target; the runs left out,
    with their period; and per setup, how many of its runs reached it of how many ran."""

    examples: dict[Setup, float]
    target: float | None
    left_out: list[tuple[str, str]] = field(default_factory=list)
    reached: dict[Setup, tuple[int, int]] = field(default_factory=dict)

    def one_worker(self) -> float | None:
        """Examples the one-worker run needed, or None without one that reached it."""
        return next((self.examples[s] for s in self._one_worker_setups()), None)

    def one_worker_runs(self) -> tuple[int, int] | None:
        """How many of the one-worker runs reached the target, of how many ran."""
        return next((self.reached[s] for s in self._one_worker_setups()), None)

    def _one_worker_setups(self) -> list[Setup]:
        return [s for s in self.examples if (s[0], s[2]) == ("sync", 1)]


def fixed_period(mode: str, n_sync) -> int | None:
    """A run's period as predict takes it: 1 for sync, the number of a local or async
    run; None for one that has no fixed number (auto, auto:48), which predict cannot
    cost."""
    if mode not in LOCAL_MODES:
        return 1
    text = str(n_sync).strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def examples_to_target(sweep: dict, path: str = "the sweep") -> SweepTargets:
    """Examples each of the sweep's flat setups needed to reach the target, by setup and
    start: the mean over its runs (seeds) that reached it; a setup none of whose runs
    reached it is left out, and so (named in `left_out`) are runs of a period without a
    number. A one-worker run counts as sync. One target for all: by default a sweep sets
    one per worker count, which would compare unlike with unlike."""
    found, runs, targets, left_out = defaultdict(list), Counter(), set(), []
    sweep_form = sweep_round_form(sweep)
    for run in sweep["runs"]:
        if run["mode"] not in ("sync", *LOCAL_MODES):
            continue
        examples = run.get("examples_to_target")
        reached = examples not in ("", None)
        mode = "sync" if run["workers"] == 1 else run["mode"]
        period = fixed_period(mode, run["n_sync"])
        if period is None:
            if reached:
                left_out.append((run.get("name", f"{run['workers']} workers"), str(run["n_sync"])))
            continue
        # Sweeps from before the start was recorded ran their one start cold.
        setup = (mode, period, run["workers"], run.get("start") or "cold",
                 run_round_form(run, mode, sweep_form))
        runs[setup] += 1  # a seed that never reached it (or diverged) counts here only
        if reached:
            found[setup].append(int(examples))
            targets.add(run["target"])
    if len(targets) > 1:
        raise ConfigError(f"{path}: its runs have different targets "
                          f"({', '.join(f'{t:.2%}' for t in sorted(targets))}); run the sweep "
                          "again with one --target")
    return SweepTargets({s: fmean(e) for s, e in found.items()},
                        targets.pop() if targets else None, left_out,
                        {s: (len(e), runs[s]) for s, e in found.items()})


def run_round_form(run: dict, mode: str, sweep_form: RoundForm) -> RoundForm:
    """How a sweep run's rounds travelled: not at all in sync mode; as its row says (sweeps
    since rows recorded it); else as the sweep's base config says (`sweep_round_form`)."""
    if mode not in LOCAL_MODES:
        return RoundForm()
    if run.get("round_compression") not in ("", None):
        return RoundForm.of(run)
    return sweep_form


def sweep_round_form(sweep: dict) -> RoundForm:
    """How the sweep's local and async runs sent their rounds: its base config's
    fragments and compression (--fp16-allreduce's uncompressed rounds are fp16 rounds; no
    compression given, local mode's default). Sweeps from before the base config was
    recorded sent whole, uncompressed rounds."""
    # A config names the form as a bench row does (round_fragments, round_compression,
    # fp16_allreduce). It says none where the default was none; None since int8 is local's.
    config = dict(sweep.get("base_config") or {})
    if "round_compression" in config and config["round_compression"] is None:
        config["round_compression"] = DEFAULT_ROUND_COMPRESSION["local"]
    return RoundForm.of(config)


def gradients_note(sweep: dict, bench_fp16: bool) -> str | None:
    """One line where the sweep's gradients and the bench's travelled in different
    precisions (--fp16-allreduce in one only): sync's bytes are then the bench's."""
    sweep_fp16 = bool((sweep.get("base_config") or {}).get("fp16_allreduce"))
    if sweep_fp16 == bench_fp16:
        return None
    said = {True: "float16 (--fp16-allreduce)", False: "float32"}
    return (f"hvdtrain: note: the sweep's gradients travelled as {said[sweep_fp16]}, the "
            f"bench's as {said[bench_fp16]}: sync mode is costed with the bench's bytes")


def rows_of_forms(rows: list[dict], reached: SweepTargets) -> list[dict]:
    """The predicted rows that stand for the sweep's runs: sync's, and the local and async
    ones whose rounds have the form of one of the sweep's local or async setups. Refused in
    one line naming the first such form the prediction has no row of."""
    forms = sorted({s[4] for s in reached.examples if s[0] in LOCAL_MODES},
                   key=lambda f: (f.fragments, f.compression))
    have = {RoundForm.of(r) for r in rows if r["mode"] in LOCAL_MODES}
    missing = [form for form in forms if form not in have]
    if missing:
        runs = "the sweep's local runs" if len(forms) == 1 else "some of the sweep's local runs"
        raise ConfigError(f"--time-to-target: {runs} sent rounds of --round-compression "
                          f"{missing[0].compression} --round-fragments {missing[0].fragments}, "
                          f"and the bench has no local or async rows of them to cost them "
                          f"with: run `hvdtrain bench` with those options (its "
                          f"--fp16-allreduce sends uncompressed rounds as fp16)")
    return [r for r in rows if r["mode"] not in LOCAL_MODES or RoundForm.of(r) in forms]


def table_form(rows: list[dict], sweep_form: RoundForm) -> RoundForm | None:
    """The one form of the table's local rows, for its heading: the sweep's where it has
    none; None where they differ, and each row then names its own."""
    forms = {RoundForm.of(r) for r in rows if r["mode"] in LOCAL_MODES}
    if not forms:
        return sweep_form
    return forms.pop() if len(forms) == 1 else None


def speedups(rows: list[dict], reached: SweepTargets,
             one_worker_images_per_sec: float) -> list[dict]:
    """Each predicted flat row, once for every start the sweep reached the target with in
    that setup, and its speed-up over one worker in wall time to the target. Empty
    without the one-worker run."""
    alone = reached.one_worker()
    if alone is None:
        return []
    alone_seconds = alone / one_worker_images_per_sec
    out = []
    for row in rows:
        if row.get("hierarchical"):
            continue
        for setup, examples in reached.examples.items():
            mode, n_sync, workers, start, form = setup
            if (mode, n_sync, workers) != (row["mode"], row["n_sync"], row["workers"]):
                continue
            if mode in LOCAL_MODES and RoundForm.of(row) != form:
                continue
            seconds = examples / row["images_per_sec"]
            hits, ran = reached.reached[setup]
            out.append({"mode": mode, "n_sync": n_sync, "start": start, "workers": workers,
                        **form.columns(), "link_rate": row["link_rate"],
                        "examples_to_target": examples, "examples_ratio": examples / alone,
                        "images_per_sec": row["images_per_sec"],
                        "speedup": alone_seconds / seconds, "runs_reached": hits, "runs": ran})
    return out


def left_out_note(reached: SweepTargets) -> str | None:
    """One line naming the runs --time-to-target left out for their period, if any."""
    if not reached.left_out:
        return None
    runs = ", ".join(f"{name} (n_sync {period})" for name, period in reached.left_out)
    return (f"hvdtrain: note: --time-to-target leaves out {runs}: predict costs a fixed "
            "period only (--n-sync N)")


def format_table(rows: list[dict], target: float, alone_examples: float,
                 alone_images_per_sec: float, round_form: dict | None = None,
                 alone_runs: list[int] | None = None) -> str:
    # None: the local rows' forms differ, and each names its own.
    form = None if round_form is None else RoundForm.of(round_form)
    rounds = f" (local rounds{form.suffix})" if form not in (None, RoundForm()) else ""
    seeds = f"{alone_runs[0]} of {alone_runs[1]} runs reaching it, " if alone_runs else ""
    head = (f"Wall time to {target:.2%} test accuracy{rounds}, against one worker (which "
            f"needed {alone_examples:.0f} examples, {seeds}at {alone_images_per_sec:.1f} "
            "images/sec):\n"
            "| link | mode | start | workers | examples to target | × one worker's | "
            "images/sec | speed-up | runs that reached it |\n" + "|" + "---|" * 9)
    lines = [f"| {r['link_rate']} | {r['mode']}{_period_and_form(r, form is None)} | "
             f"{r['start']} | {r['workers']} | {r['examples_to_target']:.0f} | "
             f"{r['examples_ratio']:.2f} | {r['images_per_sec']:.1f} | {r['speedup']:.2f}× | "
             f"{r['runs_reached']} of {r['runs']} |"
             for r in rows]
    return "\n".join([head, *lines])


def _period_and_form(row: dict, own_form: bool) -> str:
    """What the mode cell adds for a local or async row: its period, and with `own_form`
    its rounds' form (' n_sync 2, int4')."""
    if row["mode"] not in LOCAL_MODES:
        return ""
    return f" n_sync {row['n_sync']}" + (RoundForm.of(row).suffix if own_form else "")
