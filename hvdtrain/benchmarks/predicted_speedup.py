"""Wall time to a target accuracy on other hardware: a sweep's examples to the target,
over the throughput `hvdtrain predict` gives for that hardware.

A sweep (`hvdtrain sweep --target`) measures how many examples each setup needed to
first reach the target, here. A setup's predicted seconds to the target elsewhere are
those examples over its predicted images/sec there, and its speed-up is the one-worker
run's predicted seconds over its own. What carries over from the sweep is only the ratio
of examples: how much statistical efficiency a setup loses or gains per example, which
this assumes the other model and data would share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hvdtrain.config import LOCAL_MODES
from hvdtrain.errors import ConfigError

COLUMNS = ("mode", "n_sync", "start", "workers", "link_rate", "examples_to_target",
           "examples_ratio", "images_per_sec", "speedup")

# (mode, n_sync, workers, start): a sync run's period is 1, as predict counts it.
Setup = tuple[str, int, int, str]


@dataclass(frozen=True)
class SweepTargets:
    """What a sweep says about its target: the examples each of its flat runs needed to
    reach it, by setup; the target; and the runs left out, with their period."""

    examples: dict[Setup, int]
    target: float | None
    left_out: list[tuple[str, str]] = field(default_factory=list)

    def one_worker(self) -> int | None:
        """Examples the one-worker run needed, or None without one that reached it."""
        return next((examples for (mode, _, workers, _), examples in self.examples.items()
                     if (mode, workers) == ("sync", 1)), None)


def fixed_period(mode: str, n_sync) -> int | None:
    """A run's period as predict takes it: 1 for sync, the number of a local or async
    run; None for one that has no fixed number (auto, auto:48), which predict cannot
    cost."""
    if mode not in LOCAL_MODES:
        return 1
    text = str(n_sync).strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def examples_to_target(sweep: dict, path: str = "the sweep") -> SweepTargets:
    """Examples each of the sweep's flat runs needed to reach the target, by setup and
    start; runs that never reached it are left out, and so (named in `left_out`) are those
    of a period without a number. A one-worker run counts as sync. One target for all: by
    default a sweep sets one per worker count, which would compare unlike with unlike."""
    found, targets, left_out = {}, set(), []
    for run in sweep["runs"]:
        examples = run.get("examples_to_target")
        if examples in ("", None) or run["mode"] not in ("sync", *LOCAL_MODES):
            continue
        mode = "sync" if run["workers"] == 1 else run["mode"]
        period = fixed_period(mode, run["n_sync"])
        if period is None:
            left_out.append((run.get("name", f"{run['workers']} workers"), str(run["n_sync"])))
            continue
        # Sweeps from before the start was recorded ran their one start cold.
        found[(mode, period, run["workers"], run.get("start") or "cold")] = int(examples)
        targets.add(run["target"])
    if len(targets) > 1:
        raise ConfigError(f"{path}: its runs have different targets "
                          f"({', '.join(f'{t:.2%}' for t in sorted(targets))}); run the sweep "
                          "again with one --target")
    return SweepTargets(found, targets.pop() if targets else None, left_out)


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
        for (mode, n_sync, workers, start), examples in reached.examples.items():
            if (mode, n_sync, workers) != (row["mode"], row["n_sync"], row["workers"]):
                continue
            seconds = examples / row["images_per_sec"]
            out.append({"mode": mode, "n_sync": n_sync, "start": start, "workers": workers,
                        "link_rate": row["link_rate"], "examples_to_target": examples,
                        "examples_ratio": examples / alone,
                        "images_per_sec": row["images_per_sec"],
                        "speedup": alone_seconds / seconds})
    return out


def left_out_note(reached: SweepTargets) -> str | None:
    """One line naming the runs --time-to-target left out for their period, if any."""
    if not reached.left_out:
        return None
    runs = ", ".join(f"{name} (n_sync {period})" for name, period in reached.left_out)
    return (f"hvdtrain: note: --time-to-target leaves out {runs}: predict costs a fixed "
            "period only (--n-sync N)")


def format_table(rows: list[dict], target: float, alone_examples: int,
                 alone_images_per_sec: float) -> str:
    head = (f"Wall time to {target:.2%} test accuracy, against one worker (which needed "
            f"{alone_examples} examples, at {alone_images_per_sec:.1f} images/sec):\n"
            "| link | mode | start | workers | examples to target | × one worker's | "
            "images/sec | speed-up |\n" + "|" + "---|" * 8)
    lines = [f"| {r['link_rate']} | {r['mode']}"
             f"{' n_sync ' + str(r['n_sync']) if r['mode'] in LOCAL_MODES else ''} | "
             f"{r['start']} | {r['workers']} | {r['examples_to_target']} | "
             f"{r['examples_ratio']:.2f} | {r['images_per_sec']:.1f} | {r['speedup']:.2f}× |"
             for r in rows]
    return "\n".join([head, *lines])
