"""One line of the scale table from the reports scale_worker.py wrote in RESULTS_DIR.

usage: scale_report.py RESULTS_DIR [LABEL]
Prints a JSON line: the workers, their peak and current resident memory (median and
largest, MiB), where the seconds from launch to the last worker's first step went, the
threads of a worker, and whether every worker ended with rank 0's weights.
"""

import glob
import json
import os
import statistics
import sys

import numpy as np

KIB_PER_MIB = 1024


def main(results_dir: str, label: str = "") -> None:
    reports = [json.load(open(p, encoding="utf-8"))
               for p in sorted(glob.glob(os.path.join(results_dir, "rank*.json")))]
    weights = [np.load(os.path.join(results_dir, f"rank{r['rank']}.npz"))["trainable"]
               for r in reports]
    launched = reports[0]["launched_at"]

    def median(key, scale=1.0):
        return round(statistics.median(r[key] for r in reports) / scale, 1)

    def latest(key):
        return round(max(r[key] for r in reports) - launched, 1)

    print(json.dumps({
        "label": label, "workers": len(reports),
        "peak_rss_mib_median": median("peak_rss_kib", KIB_PER_MIB),
        "peak_rss_mib_max": round(max(r["peak_rss_kib"] for r in reports) / KIB_PER_MIB, 1),
        "peak_rss_gib_sum": round(sum(r["peak_rss_kib"] for r in reports) / KIB_PER_MIB**2, 2),
        "rss_mib_imported": median("rss_kib_imported", KIB_PER_MIB),
        "rss_mib_first_step": median("rss_kib_first_step", KIB_PER_MIB),
        "rss_mib_end": median("rss_kib_end", KIB_PER_MIB),
        **({"rss_anon_mib_end": median("rss_anon_kib_end", KIB_PER_MIB),
            "rss_file_mib_end": median("rss_file_kib_end", KIB_PER_MIB)}
           if "rss_anon_kib_end" in reports[0] else {}),
        "s_to_last_python_start": latest("started_at"),
        "s_to_last_import_done": latest("imported_at"),
        **({"s_to_last_fit_began": latest("fit_began_at")} if "fit_began_at" in reports[0]
           else {}),
        "s_to_last_first_step_began": latest("first_step_began_at"),
        "s_to_last_first_step_ended": latest("first_step_ended_at"),
        "s_to_last_end": latest("ended_at"),
        "threads_median": median("threads"),
        "intra_inter": sorted({(r["intra_op_threads"], r["inter_op_threads"]) for r in reports}),
        "images_per_sec": round(reports[0]["summary"]["images_per_sec"], 1),
        "consensus": all(np.array_equal(w, weights[0]) for w in weights),
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
