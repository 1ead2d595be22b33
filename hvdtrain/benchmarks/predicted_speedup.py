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

from hvdtrain.config import LOCAL_MODES
from hvdtrain.errors import ConfigError

COLUMNS = ("mode", "n_sync", "workers", "link_rate", "examples_to_target",
           "examples_ratio", "images_per_sec", "speedup")


def setup_key(mode: str, n_sync, workers: int) -> tuple[str, int, int]:
    """(mode, n_sync, workers), with a sync run's period 1 as predict counts it."""
    return mode, int(n_sync) if mode in LOCAL_MODES and n_sync else 1, workers


def examples_to_target(sweep: dict, path: str = "the sweep") -> tuple[dict, float]:
    """Examples each of the sweep's flat runs needed to reach the target, by setup, and
    the target; runs that never reached it are left out. A one-worker run counts as sync.
    One target for all: by default a sweep sets one per worker count, which would compare
    unlike with unlike."""
    found, targets = {}, set()
    for run in sweep["runs"]:
        examples = run.get("examples_to_target")
        if examples in ("", None) or run["mode"] not in ("sync", *LOCAL_MODES):
            continue
        mode = "sync" if run["workers"] == 1 else run["mode"]
        found[setup_key(mode, run["n_sync"], run["workers"])] = int(examples)
        targets.add(run["target"])
    if len(targets) > 1:
        raise ConfigError(f"{path}: its runs have different targets "
                          f"({', '.join(f'{t:.2%}' for t in sorted(targets))}); run the sweep "
                          "again with one --target")
    return found, targets.pop() if targets else None


def speedups(rows: list[dict], found: dict[tuple[str, int, int], int],
             one_worker_images_per_sec: float) -> list[dict]:
    """Each predicted flat row whose setup the sweep reached the target with, and its
    speed-up over one worker in wall time to the target. Empty without the one-worker run."""
    alone = found.get(("sync", 1, 1))
    if alone is None:
        return []
    alone_seconds = alone / one_worker_images_per_sec
    out = []
    for row in rows:
        key = setup_key(row["mode"], row["n_sync"], row["workers"])
        if row.get("hierarchical") or key not in found:
            continue
        seconds = found[key] / row["images_per_sec"]
        out.append({"mode": row["mode"], "n_sync": key[1], "workers": row["workers"],
                    "link_rate": row["link_rate"], "examples_to_target": found[key],
                    "examples_ratio": found[key] / alone, "images_per_sec": row["images_per_sec"],
                    "speedup": alone_seconds / seconds})
    return out


def format_table(rows: list[dict], target: float, alone_examples: int,
                 alone_images_per_sec: float) -> str:
    head = (f"Wall time to {target:.2%} test accuracy, against one worker (which needed "
            f"{alone_examples} examples, at {alone_images_per_sec:.1f} images/sec):\n"
            "| link | mode | workers | examples to target | × one worker's | images/sec | "
            "speed-up |\n" + "|" + "---|" * 7)
    lines = [f"| {r['link_rate']} | {r['mode']}"
             f"{' n_sync ' + str(r['n_sync']) if r['mode'] in LOCAL_MODES else ''} | "
             f"{r['workers']} | {r['examples_to_target']} | {r['examples_ratio']:.2f} | "
             f"{r['images_per_sec']:.1f} | {r['speedup']:.2f}× |" for r in rows]
    return "\n".join([head, *lines])
