"""`hvdtrain compare`: settings of finished runs side by side, each over its seeds.

A setting is every run folder whose name differs only in a trailing `-s<seed>`, the
names `hvdtrain sweep --seeds` gives. Runs from several folders (two sweeps of one grid)
stay apart: each setting is named with the folder it came from, as in
`sweep-int8/w8-sync`, and a setting's rows from the folders sit one under another. The
table holds, per setting, the mean test accuracy with the half-width of its 95% interval
(Student's t, `hvdtrain.stats`), the lowest run, and the bytes a worker sent and the
wall time, each a mean over the runs; with `--reference`, bytes as a share of that
setting's too, and the accuracy's difference from it paired by seed: the mean of each
seed's difference with its 95% interval, and at how many of those seeds the setting
ended higher. Runs of one seed share their data order and initial weights, so the paired
interval is the narrower one for telling two settings apart. A run without a summary has
no accuracy: it is counted, not averaged, so a setting that lost a seed shows it; as
diverged when `hvdtrain sweep` recorded that the divergence guard stopped it
(diverged.json), else as stopped (a crash, or a guard's stop outside a sweep).
"""

from __future__ import annotations

import argparse
import os
import re

from hvdtrain.benchmarks.diverged_runs import read_marker
from hvdtrain.errors import ConfigError, DataError
from hvdtrain.files import read_json, write_csv
from hvdtrain.stats import mean_ci95
from hvdtrain.training import run_folder

SEED_NAME = re.compile(r"^(?P<setting>.+)-s(?P<seed>\d+)$")
# What a setting's finished runs give, and its paired difference from --reference.
MEASURED = ("test_accuracy_mean", "test_accuracy_ci95", "test_accuracy_min",
            "bytes_per_worker", "bytes_share", "wall_seconds")
PAIRED = ("paired_diff_mean", "paired_diff_ci95", "paired_seeds", "paired_higher")
COLUMNS = ("setting", "runs", "stopped", "diverged", "seeds", *MEASURED, *PAIRED)


def setting_of(name: str) -> tuple[str, int | None]:
    """'w8-local-s3' -> ('w8-local', 3); a name without a seed is a setting of its own."""
    match = SEED_NAME.match(name)
    return (match["setting"], int(match["seed"])) if match else (name, None)


def summarize(runs: list[dict], reference: str | None = None) -> list[dict]:
    """One row per setting, in the order of its first run. `runs` holds each run's
    `name`, its summary.json (None when the run stopped before writing one), whether a
    sweep recorded it as `diverged`, and the `folder` it was found in. `reference` may
    leave out the folder when only one folder has that setting."""
    groups = _groups(runs)
    rows = [_row(setting, members) for setting, members in groups.items()]
    if reference is not None:
        reference = _reference(reference, groups)
        _add_shares(rows, reference)
        for row in rows:
            row.update(paired(groups[row["setting"]], groups[reference]))
    return rows


def _groups(runs: list[dict]) -> dict[str, list[dict]]:
    """{setting: its runs}. Runs from several folders are grouped by folder and name, so
    that two sweeps of one grid are not pooled as one sample (nor paired seed by seed
    with whichever folder came last); the rows of one name are kept together."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        groups.setdefault((setting_of(run["name"])[0], _where(run)), []).append(run)
    for (name, _), members in groups.items():
        _check_one_run_a_seed(name, members)
    first: dict[str, int] = {}
    for index, (name, _) in enumerate(groups):
        first.setdefault(name, index)
    ordered = sorted(groups, key=lambda key: first[key[0]])  # stable: folders in order
    labels = _folder_labels([folder for _, folder in groups])
    return {_label(name, labels.get(folder)): groups[name, folder] for name, folder in ordered}


def _check_one_run_a_seed(setting: str, members: list[dict]) -> None:
    """Two runs of one seed in a setting would count as two seeds, and the paired column
    would keep one of them: refuse, naming both."""
    seen: dict[int, dict] = {}
    for run in members:
        seed = setting_of(run["name"])[1]
        if seed is not None and seed in seen:
            raise DataError(f"setting {setting} has two runs of seed {seed}: "
                            f"{seen[seed].get('path', seen[seed]['name'])} and "
                            f"{run.get('path', run['name'])}")
        seen.setdefault(seed, run)


def _where(run: dict) -> str:
    return os.path.abspath(run.get("folder") or ".")


def _label(name: str, folder_label: str | None) -> str:
    return name if folder_label is None else f"{folder_label}/{name}"


def _folder_labels(folders: list[str]) -> dict[str, str]:
    """{folder: the shortest end of its path that tells it from the other folders}, or
    {} when every run came from one folder (its settings keep their bare names)."""
    folders = list(dict.fromkeys(folders))
    if len(folders) < 2:
        return {}
    parts = {folder: folder.split(os.sep) for folder in folders}
    for depth in range(1, max(len(p) for p in parts.values())):
        tails = {folder: "/".join(p[-depth:]) for folder, p in parts.items()}
        if len(set(tails.values())) == len(tails):
            return tails
    return {folder: folder for folder in folders}  # absolute paths differ


def _reference(reference: str, groups: dict[str, list[dict]]) -> str:
    """The setting --reference names: itself, or the one setting of that name in any
    folder; a name that several folders have must say which."""
    if reference in groups:
        return reference
    matches = [label for label, members in groups.items()
               if setting_of(members[0]["name"])[0] == reference]
    if len(matches) > 1:
        raise ConfigError(f"--reference {reference} is a setting of {len(matches)} folders: "
                          f"name one, {' or '.join(matches)}")
    return matches[0] if matches else reference


def paired(members: list[dict], reference: list[dict]) -> dict:
    """A setting's accuracy less the reference's, seed by seed, over the seeds both
    finished: mean and 95% half-width in points, how many seeds, at how many higher."""
    mine, theirs = _accuracy_by_seed(members), _accuracy_by_seed(reference)
    differences = [mine[seed] - theirs[seed] for seed in sorted(mine.keys() & theirs.keys())]
    if not differences or members is reference:
        return dict.fromkeys(PAIRED)
    mean, half = mean_ci95(differences)
    return {"paired_diff_mean": mean, "paired_diff_ci95": half,
            "paired_seeds": len(differences), "paired_higher": sum(d > 0 for d in differences)}


def _accuracy_by_seed(members: list[dict]) -> dict[int, float]:
    return {setting_of(m["name"])[1]: 100.0 * m["summary"]["test_accuracy"] for m in members
            if m["summary"] is not None and setting_of(m["name"])[1] is not None}


def _row(setting: str, members: list[dict]) -> dict:
    done = [m["summary"] for m in members if m["summary"] is not None]
    diverged = sum(1 for m in members if m["summary"] is None and m.get("diverged"))
    row = {"setting": setting, "runs": len(members), "diverged": diverged,
           "stopped": len(members) - len(done) - diverged,
           "seeds": " ".join(str(setting_of(m["name"])[1]) for m in members
                             if setting_of(m["name"])[1] is not None),
           "bytes_share": None, **dict.fromkeys(PAIRED)}
    if not done:
        return {**row, **dict.fromkeys(MEASURED)}
    accuracy = [100.0 * s["test_accuracy"] for s in done]
    mean, half = mean_ci95(accuracy)
    return {**row, "test_accuracy_mean": mean, "test_accuracy_ci95": half,
            "test_accuracy_min": min(accuracy),
            "bytes_per_worker": _mean(s.get("bytes_allreduced", 0) for s in done),
            "wall_seconds": _mean(map(_run_seconds, done))}


def _run_seconds(summary: dict) -> float:
    """The run's time training and evaluating, every process's (a resumed run's part
    before its stop too, the stop itself not); a summary written before it kept them
    gives its wall time."""
    if "train_seconds" in summary:
        return summary["train_seconds"] + summary.get("eval_seconds", 0.0)
    return summary.get("wall_seconds", 0.0)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def _add_shares(rows: list[dict], reference: str) -> None:
    base = next((r for r in rows if r["setting"] == reference), None)
    if base is None:
        raise ConfigError(f"--reference {reference} is not one of the settings: "
                          f"{', '.join(r['setting'] for r in rows)}")
    if not base["bytes_per_worker"]:
        raise ConfigError(f"--reference {reference} has no bytes to compare with")
    for row in rows:
        if row["bytes_per_worker"] is not None:
            row["bytes_share"] = row["bytes_per_worker"] / base["bytes_per_worker"]


def markdown(rows: list[dict]) -> str:
    """The table as Markdown, accuracy in percent, bytes in MB."""
    lines = ["| setting | runs | test accuracy % (95% CI) | lowest | MB a worker sent "
             "| share of bytes | wall s | − reference, paired by seed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lost = [f"{r[k]} {k}" for k in ("diverged", "stopped") if r.get(k)]
        runs = f"{r['runs']}" + (f" ({', '.join(lost)})" if lost else "")
        if r["test_accuracy_mean"] is None:
            lines.append(f"| {r['setting']} | {runs} | | | | | | |")
            continue
        share = "" if r["bytes_share"] is None else f"{r['bytes_share']:.2f}"
        lines.append(f"| {r['setting']} | {runs} | {r['test_accuracy_mean']:.2f} ± "
                     f"{r['test_accuracy_ci95']:.2f} | {r['test_accuracy_min']:.2f} | "
                     f"{r['bytes_per_worker'] / 1e6:.1f} | {share} | {r['wall_seconds']:.0f} | "
                     f"{_paired_cell(r)} |")
    return "\n".join(lines) + "\n"


def _paired_cell(row: dict) -> str:
    """'+0.09 ± 0.10 (3 of 3 higher)'; empty without a reference or a seed in common."""
    if row.get("paired_diff_mean") is None:
        return ""
    return (f"{row['paired_diff_mean']:+.2f} ± {row['paired_diff_ci95']:.2f} "
            f"({row['paired_higher']} of {row['paired_seeds']} higher)")


def load_runs(paths: list[str]) -> list[dict]:
    """Each run folder named, or each run folder inside a folder named (a sweep's
    runs/ too): its name, its summary (None if it has none) and the folder it was
    found in (the folder named, or the run folder's parent)."""
    runs = []
    for folder, found_in in _run_folders(paths):
        summary_path = os.path.join(folder, run_folder.SUMMARY)
        summary = read_json(summary_path) if os.path.isfile(summary_path) else None
        runs.append({"name": os.path.basename(os.path.normpath(folder)), "summary": summary,
                     "diverged": read_marker(folder) is not None, "folder": found_in,
                     "path": folder})
    return runs


def _is_run(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, run_folder.CONFIG))


def _run_folders(paths: list[str]) -> list[tuple[str, str]]:
    """(run folder, the folder it was found in) for each run named or held by a folder
    named; a run named twice counts once."""
    folders: dict[str, tuple[str, str]] = {}
    for path in paths:
        if not os.path.isdir(path):
            raise DataError(f"run folder not found: {path}")
        for folder, found_in in _runs_at(os.path.normpath(path)):
            folders.setdefault(os.path.realpath(folder), (folder, found_in))
    if not folders:
        raise DataError(f"no run folders (with a config.yaml) in {', '.join(paths)}")
    return list(folders.values())


def _runs_at(path: str) -> list[tuple[str, str]]:
    if _is_run(path):
        return [(path, os.path.dirname(path) or ".")]
    inner = os.path.join(path, "runs")
    parent = inner if os.path.isdir(inner) else path
    return [(os.path.join(parent, name), path) for name in sorted(os.listdir(parent))
            if _is_run(os.path.join(parent, name))]


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "compare", help="settings of finished runs side by side, each over its seeds",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("runs", nargs="+", metavar="RUN_OR_FOLDER",
                        help="run folders of hvdtrain train, or folders holding them (a "
                             "sweep folder stands for its runs/)")
    parser.add_argument("--reference", default=None, metavar="SETTING",
                        help="a setting the others are compared with: their bytes a worker "
                             "sent as a share of its, and their accuracy less its, paired by "
                             "seed (e.g. a sync run's); with several folders, FOLDER/SETTING "
                             "as the table names it, or SETTING if one folder alone has it "
                             "(default: neither column)")
    parser.add_argument("--csv", default=None, metavar="FILE.csv",
                        help="also write the table as CSV, bytes in bytes (default: none)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    rows = summarize(load_runs(args.runs), args.reference)
    print(markdown(rows), end="", flush=True)
    if args.csv:
        write_csv(args.csv, rows, COLUMNS)
    return 0
