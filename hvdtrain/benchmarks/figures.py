"""The figures the results pages print, recomputed from the rows a command wrote (pure).

Readers for the CSVs under docs/benchmarks/, the per-seed lists of its hand-cut tables,
paired differences and ratios taken seed by seed, and `agrees`, which says whether a value
is what a page printed at the precision it printed. `python -m hvdtrain.benchmarks.figures
[ROOT]` rewrites the tables that are generated from raw rows (GENERATED) and says which.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
from typing import Callable, Iterable, Sequence

from hvdtrain.stats import mean_ci95

# A number as the pages print it: a sign (ASCII or the typographic minus), digits with
# thousands commas, decimals.
NUMBER = r"[−+-]?\d[\d,]*(?:\.\d+)?"
_NUMBER = re.compile(NUMBER)


def to_float(text: str) -> float:
    """A printed number ("−0.13", "+1.67", "1,971", "0.34×") as a float."""
    found = _NUMBER.search(text)
    if not found:
        raise ValueError(f"no number in {text!r}")
    return float(found.group(0).replace("−", "-").replace(",", ""))


def decimals(printed: str) -> int:
    """How many decimals a printed number shows."""
    number = _NUMBER.search(printed).group(0)
    return len(number.split(".")[1]) if "." in number else 0


def agrees(printed: str, value: float) -> bool:
    """Whether `value` is `printed` at the precision printed: within half its last digit
    (either rounding of an exact half)."""
    half_unit = 0.5 * 10 ** -decimals(printed)
    return abs(to_float(printed) - value) <= half_unit + 1e-9


def read_rows(path: str) -> list[dict[str, str]]:
    """A CSV's rows as dicts of its header's names."""
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def read_json(path: str):
    """A bench.json or summary.json."""
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def by_seed(rows: Iterable[dict[str, str]], column: str, **where: str) -> dict[str, float]:
    """{seed: float(row[column])} over the rows whose columns equal `where`'s values."""
    picked = {}
    for row in rows:
        if all(row.get(key) == value for key, value in where.items()):
            picked[row["seed"]] = float(row[column])
    if not picked:
        raise ValueError(f"no row with {where} holds {column!r}")
    return picked


def paired(a: dict[str, float], b: dict[str, float],
           op: Callable[[float, float], float]) -> list[float]:
    """op(a, b) seed by seed, over the seeds both hold, in seed order."""
    seeds = sorted(set(a) & set(b), key=lambda s: (len(s), s))
    if not seeds:
        raise ValueError("no seed in common")
    return [op(a[s], b[s]) for s in seeds]


def difference(a: float, b: float) -> float:
    return a - b


def ratio(a: float, b: float) -> float:
    return a / b


def seed_values(cell: str) -> list[float]:
    """The per-seed values a hand-cut table's cell lists: those in its parentheses
    ("89.20 ± 0.87 (89.14, 88.89, 89.58)") or, with none, the whole cell ("89.25, 89.67")."""
    inner = re.search(r"\(([^()]*)\)", cell)
    text = inner.group(1) if inner else cell
    return [to_float(part) for part in _NUMBER.findall(text)]


def table_cell(path: str, row_label: str | tuple[str, ...], column: int) -> str:
    """One cell of a hand-cut table: the row whose first cells are `row_label` (a blank
    first cell repeats the row above's, as the tables group rows by cell), the column by
    index."""
    labels = (row_label,) if isinstance(row_label, str) else row_label
    with open(path, encoding="utf-8", newline="") as fh:
        table = list(csv.reader(fh))
    group = ""
    for row in table[1:]:
        group = row[0] or group
        if row and (group, *row[1:len(labels)]) == labels:
            return row[column]
    raise ValueError(f"{path}: no row {labels!r}")


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


# --- generated tables -------------------------------------------------------------------

NIC_WORKERS = 8


def nic_theory(shape: str, flat_n: int, hier_n: int) -> float:
    """Gloo's bytes a step across a host's NIC, the hierarchy every `hier_n` steps over flat
    every `flat_n`: flat's alltoall reaches every worker off the host and its ring allgather
    crosses each NIC once; the host shards' peers run both as rings over the hosts."""
    hosts, slots = map(int, shape.split("x"))
    flat = slots * (NIC_WORKERS - slots) / NIC_WORKERS + (NIC_WORKERS - 1) / NIC_WORKERS
    return (2 * (hosts - 1) / hosts / hier_n) / (flat / flat_n)


def nic_third_table(per_step: list[dict[str, str]]) -> list[list[str]]:
    """Table 046 from nic-third/per_step.csv (what its ratios.py wrote): each shape's flat
    and hierarchical MB a host sent a step by repeat, their paired ratio, Gloo's theory."""
    steps: dict[tuple[str, str], tuple[int, dict[str, float]]] = {}
    for row in per_step:
        key = (row["shape"], row["setup"])
        n, repeats = steps.setdefault(key, (int(row["n_sync"]), {}))
        repeats[row["repeat"]] = float(row["bytes_per_step"])
    table = [["8 workers, AlexNet-64, int8", "flat, every 2 steps: MB a host sent a step (repeats)",
              "the hierarchy: period; MB a step",
              "hierarchy ÷ flat, paired, mean ± 95% (repeats)", "Gloo's theory"]]
    for shape in sorted({shape for shape, _ in steps}):
        flat_n, flat = steps[(shape, "flat")]
        hier_n, hier = steps[(shape, "hier")]
        ratios = paired(hier, flat, ratio)
        centre, half = mean_ci95(ratios)
        hosts, slots = shape.split("x")
        table.append([
            f"{hosts} hosts × {slots}",
            ", ".join(f"{flat[r] / 1e6:.2f}" for r in sorted(flat)),
            f"every {hier_n} steps; " + ", ".join(f"{hier[r] / 1e6:.2f}" for r in sorted(hier)),
            f"{centre:.3f} ± {half:.3f} (" + ", ".join(f"{x:.3f}" for x in ratios) + ")",
            f"{nic_theory(shape, flat_n, hier_n):.3f}"])
    return table


# table under docs/benchmarks/tables/ -> (its raw file under docs/benchmarks/, its maker)
GENERATED: dict[str, tuple[str, Callable[[list[dict[str, str]]], list[list[str]]]]] = {
    "046-nic-alexnet-third.csv": ("nic-third/per_step.csv", nic_third_table),
}


def csv_text(table: list[list[str]]) -> str:
    """A table as the csv module writes it, minimal quoting, one "\\n" a line."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(table)
    return out.getvalue()


def generated_text(benchmarks: str, name: str) -> str:
    """What the generated table `name` holds, made from its raw file under `benchmarks`."""
    raw, make = GENERATED[name]
    return csv_text(make(read_rows(os.path.join(benchmarks, raw))))


def main(argv: list[str]) -> None:
    root = argv[0] if argv else "."
    benchmarks = os.path.join(root, "docs", "benchmarks")
    for name, (raw, _make) in GENERATED.items():
        with open(os.path.join(benchmarks, "tables", name), "w", encoding="utf-8", newline="") as fh:
            fh.write(generated_text(benchmarks, name))
        print(f"tables/{name} <- {raw}")


if __name__ == "__main__":
    main(sys.argv[1:])
