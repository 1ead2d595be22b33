"""Every figure of BENCHMARKS.md's glance table and of the README's first screen is what its
file under docs/benchmarks/ gives: each glance row links the files its figures come from,
and each figure, recomputed from their rows with hvdtrain.benchmarks.figures (mean ± 95% t
over seeds or repeats, paired seed by seed), prints as the page prints it. A figure with no
file behind it is named so in docs/benchmarks/README.md. The generated tables are what their
raw files give."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable

import pytest

from hvdtrain.benchmarks import figures as fig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s#]+)\)")  # a Markdown link's target, anchor left out

BENCHMARKS = "BENCHMARKS.md"
README = "README.md"
DATA = os.path.join(ROOT, "docs", "benchmarks")
DATA_README = os.path.join(DATA, "README.md")
N = fig.NUMBER


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        return fh.read()


def rows(rel: str) -> list[dict[str, str]]:
    return fig.read_rows(os.path.join(DATA, rel))


def seeds(rel: str, label, column: int) -> list[float]:
    return fig.seed_values(fig.table_cell(os.path.join(DATA, rel), label, column))


def cell_number(rel: str, label, column: int, which: int = 0) -> float:
    cell = fig.table_cell(os.path.join(DATA, rel), label, column)
    return fig.to_float(re.findall(N, cell)[which])


def ci(values) -> tuple[float, float]:
    return fig.mean_ci95(list(values))


def diff_ci(a, b) -> tuple[float, float]:
    """a − b, paired by position (seed order), mean ± 95%."""
    return ci(x - y for x, y in zip(a, b, strict=True))


def sweep(rel: str, column: str, scale: float = 1.0, **where) -> dict[str, float]:
    return {s: v * scale for s, v in fig.by_seed(rows(rel), column, **where).items()}


# --- where each glance figure comes from ------------------------------------------------

PEERS = "peers/mwms-tf-keras-vs-hvdtrain-sync-lenet-2w.csv"
IDLE = "tables/085-gradient-groups-idle.csv"
E5_8 = "tables/026-e5-8x64-8x32.csv"
E5_LR8 = "tables/031-e5-local-lr-workers-8.csv"
E5_16 = "tables/030-e5-16-workers.csv"
INT8_GRID = "tables/025-grid-int8-every-2-vs-retired-default.csv"
PEAKS = "tables/089-sync-peak-and-warmup.csv"
RESNET = "tables/057-resnet20-local-default.csv"
INT4 = "tables/037-e5-int4.csv"
SEEDS7 = "tables/034-e5-32x64-7-seeds-unrescaled.csv"
TTA = "time-to-accuracy/resnet20-4-hosts/"
TTA10, TTA100 = TTA + "sweep-10mbit.csv", TTA + "sweep-100mbit.csv"
TTA_ASYNC = TTA + "sweep-10mbit-async.csv"
A16_SYNC, A16_INT8 = "async-16-workers/sweep-float32.csv", "async-16-workers/sweep-int8.csv"
SGD_CELLS = "tables/016-recipe-sync-sgd-8-16-32.csv"
LAMB_CELLS = "tables/018-recipe-lamb-vs-sgd-cells.csv"
LAMB_2048 = "tables/019-recipe-lamb-vs-sgd-32x64.csv"
BN = "batchnorm-recipe/"
BN_FILES = [BN + name for name in ("sweep-16x64.csv", "sweep-16x64-sgd.csv",
                                   "sweep-32x32.csv", "sweep-32x32-sgd.csv")]
COMPRESSION = "tables/053-e5-compression-momentum-8x64.csv"
HUNDREDTH = "time-to-accuracy/resnet20-hundredth/"
HUNDREDTH_SYNC, HUNDREDTH_INT1 = HUNDREDTH + "sweep-sync.csv", HUNDREDTH + "sweep-int1-every-4.csv"
HIER10 = "tables/038-hier-host-shards-10-seeds.csv"
HIER5E = "tables/040-hier-5-epochs.csv"
NIC_THIRD = "nic-third/per_step.csv"
HIER_BENCH = "throughput/hierarchical-2-slots/bench-resnet20-2x2-100mbit-host-shards.csv"
HIER_PREDICTED = "tables/064-hier-bench-host-shards-100mbit.csv"
SCALE = "tables/006-scale-2-to-32-workers-side-by-side.csv"
EXP3 = "learning-curves/paine-exp3/single-sweep.csv"


def mwms_ratios() -> list[float]:
    return [float(r["hvdtrain_sync_images_per_sec"]) / float(r["mwms_images_per_sec"])
            for r in rows(PEERS)]


def idle_intervals() -> list[tuple[float, float]]:
    return [tuple(map(fig.to_float, re.findall(N, r["paired ratio (mean ± 95%)"])))
            for r in rows(IDLE)]


def intervals_with_one() -> list[tuple[float, float]]:
    return [(m, h) for m, h in idle_intervals() if m - h <= 1 <= m + h]


def local_minus_sync_e5(cell: str) -> tuple[float, float]:
    """5 epochs at 8 × W: int8 every 2 steps (8 × 64) or local at 8 workers' rate (8 × 32)
    less sync, paired by seed."""
    sync = seeds(E5_8, cell, 1)
    if cell == "8 × 64":
        return diff_ci(seeds(E5_8, cell, 3), sync)
    return diff_ci(seeds(E5_LR8, "8 × 32, counting 8", 1), sync)


def int4_minus_sync(cell: str) -> tuple[float, float]:
    sync = seeds(INT4, (cell, "sync (LAMB, 0.03)"), 2)
    int4 = seeds(INT4, (cell, "rescaled, every step, int4"), 2)
    if cell == "32 × 64":  # 7 seeds: sync's from the 7-seed table, int4's 4 to 7 beside 1 to 3
        sync = seeds(SEEDS7, "sync", 1)
        int4 += seeds(INT4, (cell, "rescaled, every step, int4, seeds 4 to 7 (no sweep row "
                                   "kept; as BENCHMARKS.md prints them)"), 2)
    return diff_ci(int4, sync)


def int4_minus_int8(cell: str) -> tuple[float, float]:
    return diff_ci(seeds(INT4, (cell, "rescaled, every step, int4"), 2),
                   seeds(INT4, (cell, "rescaled, every step, int8 (the default before)"), 2))


def seconds_ratio(path: str, mode: str, **where) -> tuple[float, float]:
    """A mode's seconds to target over sync's, paired by seed."""
    data = rows(path)
    sync = fig.by_seed(rows(TTA10 if path == TTA_ASYNC else path), "seconds_to_target",
                       mode="sync")
    return ci(fig.paired(fig.by_seed(data, "seconds_to_target", mode=mode, **where), sync,
                         fig.ratio))


def bytes_share(path: str, mode: str, reference: str = TTA10) -> float:
    mine = fig.by_seed(rows(path), "bytes_allreduced", mode=mode)
    sync = fig.by_seed(rows(reference), "bytes_allreduced", mode="sync")
    return fig.mean(fig.paired(mine, sync, fig.ratio))


def lamb_16x64() -> list[float]:
    """LAMB's seeds at 16 × 64: SGD's seeds and LAMB − SGD by seed (the table's record)."""
    return [s + g for s, g in zip(seeds(SGD_CELLS, "16 × 64", 2),
                                  seeds(LAMB_CELLS, "LeNet-5, 16 × 64 (1,024; above)", 3))]


def resnet_lamb_gain(cell: str) -> tuple[float, float]:
    lamb = sweep(f"{BN}sweep-{cell}.csv", "test_accuracy", 100, mode="sync")
    sgd = sweep(f"{BN}sweep-{cell}-sgd.csv", "test_accuracy", 100, mode="sync")
    return ci(fig.paired(lamb, sgd, fig.difference))


def compression_gaps() -> list[float]:
    """|mean − int8 kept local's| of float32, fp16 and int8 averaged, at 8 × 64."""
    base = fig.mean(seeds(COMPRESSION, ("int8", "kept local (the default)"), 3))
    return [abs(fig.mean(seeds(COMPRESSION, (r, m), 3)) - base)
            for r in ("float32", "fp16", "int8") for m in ("averaged", "kept local")
            if (r, m) != ("int8", "kept local")]


def hundredth_gap() -> tuple[float, float]:
    """ResNet-20's int1 rounds every 4 steps less sync, paired by seed."""
    return ci(fig.paired(sweep(HUNDREDTH_INT1, "test_accuracy", 100, mode="local"),
                         sweep(HUNDREDTH_SYNC, "test_accuracy", 100, mode="sync"),
                         fig.difference))


def hundredth_share() -> float:
    """Their bytes as a share of sync's, paired by seed."""
    return bytes_share(HUNDREDTH_INT1, "local", reference=HUNDREDTH_SYNC)


def hier_minus_flat(setting: str) -> tuple[float, float]:
    flat = "flat local SGD, its default (int8 every 2 steps) (marked)"
    both = [seeds(HIER10, label, 2) + seeds(HIER10, label, 3) for label in (setting, flat)]
    return diff_ci(*both)


def hier_5_epochs(setting: str) -> float:
    return fig.mean(seeds(HIER5E, setting, 1)) - fig.mean(seeds(HIER5E,
                                                                 "flat local SGD, its default", 1))


def nic_third(shape: str) -> tuple[float, float]:
    data = rows(NIC_THIRD)
    steps = {kind: {r["repeat"]: float(r["bytes_per_step"]) for r in data
                    if r["shape"] == shape and r["setup"] == kind} for kind in ("hier", "flat")}
    return ci(fig.paired(steps["hier"], steps["flat"], fig.ratio))


def bench(label: str) -> tuple[float, float]:
    row = next(r for r in rows(HIER_BENCH) if r["label"] == label)
    return float(row["total_images_per_sec"]), float(row["total_ci95"])


def hierarchical_errors() -> list[float]:
    return [abs(cell_number(HIER_PREDICTED, label, 7))
            for label in ("hierarchical local, n_sync 20", "hierarchical async, n_sync 20")]


def scale_images() -> list[float]:
    return [float(r["images/sec"]) for r in rows(SCALE) if r["images/sec"] not in ("-", "")]


def exp3_error(workers: int, n_sync: int) -> float:
    row = next(r for r in rows(EXP3) if r["name"] == f"w{workers}-n{n_sync}-single")
    return float(row["final_training_error"]) * 100



@dataclasses.dataclass(frozen=True)
class Figure:
    """A figure a page prints: `pattern`'s groups are its numbers; `values` recomputes them
    from the files; `at_most` makes each printed number a bound the value must not pass."""
    pattern: str
    values: Callable[[], tuple[float, ...] | list[float]]
    at_most: bool = False


@dataclasses.dataclass(frozen=True)
class Row:
    question: str          # how the row's first cell begins
    files: tuple[str, ...]  # under docs/benchmarks/: each must be linked from the row
    figures: tuple[Figure, ...]
    no_file: tuple[str, ...] = ()  # figures no file holds: docs/benchmarks/README.md names each


GLANCE = (
    Row("Is sync mode faster than MultiWorkerMirroredStrategy?", (PEERS,), (
        Figure(rf"({N}) ± ({N})× its images/sec", lambda: ci(mwms_ratios())),
        Figure(rf"\(({N})×, ({N})×, ({N})×\)", lambda: sorted(mwms_ratios())),
    )),
    Row("What does hvdtrain cost over bare Horovod?", (IDLE,), (
        Figure(rf"\(({N}) ± ({N})× to ({N}) ± ({N})× its images/sec\)",
               lambda: [*min(intervals_with_one()), *max(intervals_with_one())]),
        Figure(rf"cost ({N})% \(({N}) ± ({N})×\)",
               lambda: ((1 - idle_intervals()[-1][0]) * 100, *idle_intervals()[-1])),
    ), no_file=("per-repeat ratios",)),
    Row("How close is local mode's default to sync at 2 to 8 workers?",
        (E5_8, E5_LR8, INT8_GRID, PEAKS, RESNET), (
            Figure(rf"({N}) ± ({N}) \(8 × 64\)", lambda: local_minus_sync_e5("8 × 64")),
            Figure(rf"({N}) ± ({N}) \(8 × 32\)", lambda: local_minus_sync_e5("8 × 32")),
            Figure(rf"({N}) ± ({N}) \(2 × 64\)", lambda: diff_ci(
                seeds(INT8_GRID, "2 × 64", 1), seeds(PEAKS, ("2 x 64 (128)", "0.05", "1"), 4)),),
            Figure(rf"({N}) \(4 × 64\)", lambda: (fig.mean(seeds(INT8_GRID, "4 × 64", 1))
                                                  - cell_number(INT8_GRID, "4 × 64", 3, 1),)),
            Figure(rf"ResNet-20 ({N}) ± ({N})", lambda: diff_ci(
                seeds(RESNET, "local, int8 every 2 steps (the default then)", 2),
                seeds(RESNET, "sync, its defaults", 2))),
            Figure(rf"Bytes: ({N}) of sync's", lambda: (
                cell_number(RESNET, "local, int8 every 2 steps (the default then)", 3)
                / cell_number(RESNET, "sync, its defaults", 3),)),
        )),
    Row("And at 16 and 32 workers?", (E5_LR8, E5_16, INT4, SEEDS7), (
        Figure(rf"({N}) ± ({N}) \(16 × 32\)", lambda: diff_ci(
            seeds(E5_LR8, "16 × 32, counting 8", 1), seeds(E5_16, "16 × 32", 1))),
        Figure(rf"({N}) ± ({N}) \(16 × 64\)", lambda: int4_minus_sync("16 × 64")),
        Figure(rf"({N}) ± ({N}) \(32 × 32\)", lambda: int4_minus_sync("32 × 32")),
        Figure(rf"({N}) ± ({N}) \(32 × 64\)", lambda: int4_minus_sync("32 × 64")),
        Figure(rf"for ({N}) and ({N}) of its bytes", lambda: (
            cell_number(E5_16, "16 × 32", 4, 2), cell_number(INT4, ("32 × 64",
                                                                     "rescaled, every step, int4"), 6, 1))),
    ), no_file=("89.15, 89.09, 89.02, 88.36",)),
    Row("Is local mode faster than sync?", (TTA10, TTA100), (
        Figure(rf"({N}) ± ({N})× sync's time", lambda: seconds_ratio(TTA10, "local")),
        Figure(rf"\(({N}) ± ({N})×\)\. On a loopback", lambda: seconds_ratio(TTA100, "local")),
    ), no_file=("0.87× to 1.24×",)),
    Row("And async mode?", (TTA10, TTA_ASYNC, A16_SYNC, A16_INT8), (
        Figure(rf"({N}) ± ({N})× sync's time", lambda: seconds_ratio(TTA_ASYNC, "async")),
        Figure(rf"local's default ({N})×", lambda: (seconds_ratio(TTA10, "local")[0],)),
        Figure(rf"({N}) of its bytes", lambda: (bytes_share(TTA_ASYNC, "async"),)),
        Figure(rf"\(({N}) ± ({N})\)", lambda: ci(fig.paired(
            sweep(TTA_ASYNC, "test_accuracy", 100, mode="async"),
            sweep(TTA10, "test_accuracy", 100, mode="sync"), fig.difference))),
        Figure(rf"16 × 64: ({N}) ± ({N}) behind", lambda: ci(fig.paired(
            sweep(A16_SYNC, "test_accuracy", 100, mode="sync"),
            sweep(A16_INT8, "test_accuracy", 100, mode="async"), fig.difference))),
    )),
    Row("Does sync hold at 8 to 32 workers?", (SGD_CELLS, LAMB_CELLS, LAMB_2048), (
        Figure(rf"({N}) ± ({N})% at 8 × 64", lambda: ci(seeds(SGD_CELLS, "8 × 64", 2))),
        Figure(rf"({N}) ± ({N})% \(16 × 64\)", lambda: ci(lamb_16x64())),
        Figure(rf"({N}) ± ({N})% \(32 × 32\)",
               lambda: ci(seeds(LAMB_CELLS, "LeNet-5, 32 × 32 (1,024)", 2))),
        Figure(rf"({N}) ± ({N})% \(32 × 64\)",
               lambda: ci(seeds(LAMB_2048, "LeNet-5, 32 × 64 (2,048)", 2))),
    )),
    Row("Why LAMB from a global batch of 1,024?", (LAMB_CELLS, LAMB_2048, *BN_FILES), (
        Figure(rf"({N}) ± ({N}) \(32 × 32\)",
               lambda: ci(seeds(LAMB_CELLS, "LeNet-5, 32 × 32 (1,024)", 3))),
        Figure(rf"({N}) ± ({N}) \(32 × 64\)",
               lambda: ci(seeds(LAMB_2048, "LeNet-5, 32 × 64 (2,048)", 3))),
        Figure(rf"({N}) ± ({N}) \(16 × 64\)",
               lambda: ci(seeds(LAMB_CELLS, "LeNet-5, 16 × 64 (1,024; above)", 3))),
        Figure(rf"ResNet-20 ({N}) ± ({N}), ({N}) ± ({N})",
               lambda: [*resnet_lamb_gain("16x64"), *resnet_lamb_gain("32x32")]),
    ), no_file=("optimizer column",)),
    Row("What do compressed rounds cost in accuracy?",
        (COMPRESSION, INT4, HUNDREDTH_SYNC, HUNDREDTH_INT1), (
            Figure(rf"means within ({N}) points", lambda: [max(compression_gaps())],
                   at_most=True),
            Figure(rf"int4 level with int8 \(({N}) ± ({N}), ({N}) ± ({N}), ({N}) ± ({N})\)",
                   lambda: [*int4_minus_int8("16 × 64"), *int4_minus_int8("32 × 32"),
                            *int4_minus_int8("32 × 64")]),
            Figure(rf"({N}) of sync's bytes: ({N}) ± ({N}), a loss",
                   lambda: (hundredth_share(), *hundredth_gap())),
        )),
    Row("Does hierarchical local SGD cost accuracy?", (HIER10,), (
        Figure(rf"hosts of 2: ({N}) ± ({N})",
               lambda: hier_minus_flat("hosts of 2, every 2 steps, host shards")),
        Figure(rf"hosts of 4: ({N}) ± ({N})",
               lambda: hier_minus_flat("hosts of 4, every 2 steps, host shards")),
    )),
    Row("What does a host's NIC carry in the hierarchy?", (NIC_THIRD,), (
        Figure(rf"theory: ({N}), ({N})",
               lambda: (fig.nic_theory("4x2", 1, 1), fig.nic_theory("2x4", 1, 1))),
        Figure(rf"({N}) ± ({N}) and ({N}) ± ({N})",
               lambda: [*nic_third("4x2"), *nic_third("2x4")]),
    ), no_file=("0.70 and 0.44",)),
    Row("Does the hierarchy train faster?", (HIER_BENCH,), (
        Figure(rf"({N}) ± ({N}) images/sec against flat local's ({N}) ± ({N}) and sync's "
               rf"({N}) ± ({N})", lambda: [*bench("hierarchical local, n_sync 20"),
                                           *bench("local, n_sync 20"), *bench("sync")]),
    )),
    Row("How far can `hvdtrain predict` be trusted?", (HIER_PREDICTED,), (
        Figure(rf"hierarchical rows within ({N})%", lambda: [max(hierarchical_errors())],
               at_most=True),
    ), no_file=("predicted column",)),
    Row("Do 16 and 32 workers run on one machine?", (SCALE,), (
        Figure(rf"\(({N}) to ({N}) images/sec\)",
               lambda: (min(scale_images()), max(scale_images()))),
    ), no_file=("10 GiB",)),
    Row("Do Paine et al.'s observations hold?", (EXP3,), (
        Figure(rf"gap is ({N}) points", lambda: (exp3_error(8, 900) - exp3_error(8, 100),)),
    )),
)


def glance_table(text: str) -> list[list[str]]:
    """The cells of each body row of the table under "Results at a glance"."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if re.match(r"^#+\s+Results at a glance", line))
    table = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return table[2:]


def figure_problems(where: str, text: str, figure: Figure) -> list[str]:
    found = re.search(figure.pattern, text)
    if not found:
        return [f"{where}: no figure matching {figure.pattern!r}"]
    values = list(figure.values())
    printed = list(found.groups())
    if len(values) != len(printed):
        return [f"{where}: {figure.pattern!r} prints {len(printed)} numbers, "
                f"the files give {len(values)}"]
    problems = []
    for shown, value in zip(printed, values):
        ok = (value <= fig.to_float(shown) + 1e-9 if figure.at_most
              else fig.agrees(shown, value))
        if not ok:
            problems.append(f"{where}: prints {shown} where its file gives {value:.4f} "
                            f"(in {found.group(0)!r})")
    return problems


def glance_problems(text: str, data_readme: str) -> list[str]:
    """What in the glance table of a BENCHMARKS text is not what its files give: a row
    missing, a file not linked or absent, a figure differing, or a figure without a file
    that docs/benchmarks/README.md (`data_readme`) does not name."""
    problems = []
    table = glance_table(text)
    for spec in GLANCE:
        row = next((r for r in table if r[0].startswith(spec.question)), None)
        if row is None:
            problems.append(f"no glance row {spec.question!r}")
            continue
        line = " | ".join(row)
        linked = {target[len("docs/benchmarks/"):] for target in LINK.findall(line)
                  if target.startswith("docs/benchmarks/")}
        problems += [f"{spec.question}: links no {path}" for path in spec.files
                     if path not in linked]
        problems += [f"{spec.question}: links {path}, which does not exist" for path in linked
                     if not os.path.isfile(os.path.join(DATA, path))]
        for figure in spec.figures:
            problems += figure_problems(spec.question, line, figure)
        problems += [f"{spec.question}: docs/benchmarks/README.md does not name {name!r} "
                     "as a figure without a file" for name in spec.no_file
                     if name not in data_readme]
    return problems


BENCH10 = TTA + "bench-10mbit.json"


def sync_over_independent(path: str) -> float:
    """Sync's images/sec in a sweep over independent workers' in the 10 Mbit/s bench (they
    exchange nothing, so the link does not move them)."""
    bench = fig.read_json(os.path.join(DATA, BENCH10))["rows"]
    independent = next(r for r in bench if r["mode"] == "independent")["total_images_per_sec"]
    return fig.mean(list(sweep(path, "images_per_sec", mode="sync").values())) / independent


def local_intervals() -> list[tuple[float, float]]:
    """Local mode less sync, every cell of 2 to 32 workers at a glance."""
    return [local_minus_sync_e5("8 × 64"), local_minus_sync_e5("8 × 32"),
            diff_ci(seeds(INT8_GRID, "2 × 64", 1),
                    seeds(PEAKS, ("2 x 64 (128)", "0.05", "1"), 4)),
            diff_ci(seeds(E5_LR8, "16 × 32, counting 8", 1), seeds(E5_16, "16 × 32", 1)),
            *(int4_minus_sync(cell) for cell in ("16 × 64", "32 × 32", "32 × 64"))]


FIRST_SCREEN = (
    Figure(rf"10 Mbit/s sync ran at ({N})×", lambda: (sync_over_independent(TTA10),)),
    Figure(rf"in ({N}) ± ({N})×\s+sync's time", lambda: seconds_ratio(TTA10, "local")),
    Figure(rf"100 Mbit/s sync ran at ({N})×", lambda: (sync_over_independent(TTA100),)),
    Figure(rf"local's\s+({N}) ± ({N})× is level", lambda: seconds_ratio(TTA100, "local")),
    Figure(rf"\(({N}) ± ({N})× to ({N}) ± ({N})×\)",
           lambda: [*min(intervals_with_one()), *max(intervals_with_one())]),
    Figure(rf"({N})% below in the fifth\s+\(({N}) ± ({N})×",
           lambda: ((1 - idle_intervals()[-1][0]) * 100, *idle_intervals()[-1])),
    Figure(rf"with up to ({N}) workers and\s+up to ({N}) hosts", lambda: (
        max(float(r["workers"]) for r in rows(SCALE)),
        fig.to_float(rows("tables/007-scale-32-workers-8-emulated-hosts.csv")[0]["where"]))),
)
# Figures the first screen gives in words: (pattern, whether the files bear it out).
FIRST_SCREEN_WORDS = (
    (r"sends an eighth of sync's bytes", lambda: round(1 / bytes_share(TTA10, "local")) == 8),
    (r"level with sync's within every interval at 2 to 32 workers",
     lambda: all(m - h <= 0 <= m + h for m, h in local_intervals())),
    (r"in four cells of five", lambda: (len(intervals_with_one()), len(idle_intervals())) == (4, 5)),
)


def first_screen_problems(text: str) -> list[str]:
    """The measured figures of the README's first 60 lines against their files."""
    screen = "\n".join(text.splitlines()[:60])
    problems = []
    for figure in FIRST_SCREEN:
        problems += figure_problems("README first screen", screen, figure)
    for pattern, holds in FIRST_SCREEN_WORDS:
        if not re.search(pattern.replace(" ", r"\s+"), screen):
            problems.append(f"README first screen: no claim matching {pattern!r}")
        elif not holds():
            problems.append(f"README first screen: {pattern!r} is not what its files give")
    return problems


def test_every_glance_figure_is_what_its_linked_file_gives():
    assert glance_problems(_read(BENCHMARKS), _read("docs/benchmarks/README.md")) == []


def test_the_readmes_measured_figures_are_what_their_files_give():
    assert first_screen_problems(_read(README)) == []


def _changed_digit(text: str, figure: str, changed: str) -> str:
    assert figure in text
    return text.replace(figure, changed, 1)


@pytest.mark.parametrize("figure,changed,number", [
    ("1.34 ± 0.53×", "1.35 ± 0.53×", "1.35"),     # a ratio from per-pair rows
    ("0.34 ± 0.05×", "0.34 ± 0.06×", "0.06"),     # an interval from per-seed rows
    ("−0.40 ± 1.21", "−0.41 ± 1.21", "−0.41"),    # a paired difference from a table's seeds
    ("0.241 ± 0.074", "0.241 ± 0.075", "0.075"),  # a ratio from per-repeat rows
])
def test_a_glance_figure_with_one_digit_changed_is_caught(figure, changed, number):
    page, data_readme = _read(BENCHMARKS), _read(DATA_README)
    before = set(glance_problems(page, data_readme))
    after = set(glance_problems(_changed_digit(page, figure, changed), data_readme))
    new = after - before
    assert len(new) == 1 and f"prints {number} " in new.pop()


def test_a_glance_row_that_stops_linking_its_file_is_caught():
    text = _read(BENCHMARKS).replace(f"(docs/benchmarks/{PEERS})", "(docs/benchmarks/README.md)")
    assert any("links no " + PEERS in p for p in glance_problems(text, _read(DATA_README)))


def test_a_readme_figure_changed_is_caught():
    page = _read(README)
    before = set(first_screen_problems(page))
    after = set(first_screen_problems(_changed_digit(page, "0.34 ± 0.05×", "0.34 ± 0.04×")))
    new = after - before
    assert len(new) == 1 and "prints 0.04 " in new.pop()


@pytest.mark.parametrize("name", sorted(fig.GENERATED))
def test_a_generated_table_is_what_its_raw_file_gives(name):
    assert fig.generated_text(DATA, name) == _read(f"docs/benchmarks/tables/{name}")
