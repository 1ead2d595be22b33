"""Bytes a host's NIC sent per step, from run.sh's counters: each setup's 36-step run less
its 12-step run of the same repeat, over 24 steps, the hosts' mean; then the hierarchy's
share of flat's on the same hosts, paired by repeat, beside Gloo's theory.

    python ratios.py OUT      (writes OUT/per_step.csv and prints the table)
"""
import glob
import os
import sys

from hvdtrain.files import read_json, write_csv
from hvdtrain.stats import mean_ci95

WORKERS, LONG, SHORT = 8, 36, 12


def sent_per_host(path: str) -> float:
    during = read_json(path)["during"]
    return sum(h["tx_bytes"] for h in during.values()) / len(during)


def theory(shape: str, flat_n: int, hier_n: int) -> float:
    """Gloo's bytes per step across a NIC, hierarchy over flat: flat's alltoall reaches
    every worker off the host and its ring allgather crosses each NIC once; the host
    shards' peers run both as rings over the hosts."""
    hosts, slots = map(int, shape.split("x"))
    flat = slots * (WORKERS - slots) / WORKERS + (WORKERS - 1) / WORKERS
    return (2 * (hosts - 1) / hosts / hier_n) / (flat / flat_n)


def main(out: str) -> None:
    per_step = {}  # (shape, kind, n) -> {repeat: bytes a step}
    for path in sorted(glob.glob(os.path.join(out, f"*-s{LONG}-r*.json"))):
        name = os.path.basename(path)[:-len(".json")]
        short = os.path.join(out, name.replace(f"-s{LONG}-", f"-s{SHORT}-") + ".json")
        if not os.path.exists(short):
            continue
        kind, shape, n, _cycle, _steps, repeat = name.split("-")
        extra = sent_per_host(path) - sent_per_host(short)
        per_step.setdefault((shape, kind, int(n[1:])), {})[repeat] = extra / (LONG - SHORT)
    rows = [{"shape": s, "setup": k, "n_sync": n, "repeat": r, "bytes_per_step": round(b)}
            for (s, k, n), reps in sorted(per_step.items()) for r, b in sorted(reps.items())]
    write_csv(os.path.join(out, "per_step.csv"), rows)
    for (shape, kind, n), reps in sorted(per_step.items()):
        if kind != "hier":
            continue
        for (f_shape, f_kind, f_n), flat in per_step.items():
            if f_shape != shape or f_kind != "flat":
                continue
            paired = sorted(set(reps) & set(flat))
            ratios = [reps[r] / flat[r] for r in paired]
            mean, half = mean_ci95(ratios)
            print(f"{shape}: hierarchy every {n} over flat every {f_n}: {mean:.3f} ± {half:.3f} "
                  f"({', '.join(f'{x:.3f}' for x in ratios)}; theory {theory(shape, f_n, n):.3f}); "
                  f"MB a step: flat {', '.join(f'{flat[r] / 1e6:.2f}' for r in paired)}, "
                  f"hierarchy {', '.join(f'{reps[r] / 1e6:.2f}' for r in paired)}")


if __name__ == "__main__":
    main(sys.argv[1])
