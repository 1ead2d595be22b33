"""Covering arrays: few rows of a table of options that still hold every pair (or every
t-tuple) of values that can be, as pairwise testing tools (PICT, allpairspy) build them.

    rows = covering_array({"mode": ("local", "async"), "hosts": (1, 2, 3), ...},
                          allowed=lambda row: ..., strength=2)

Greedy, over the whole product: the table's few thousand rows are built, the ones that
`allowed` refuses dropped, and rows are taken one at a time, each the allowed row that
covers the most t-tuples not yet covered (the first such, so the array is the same at
every run). A t-tuple that no allowed row holds is not asked for. `seeds` are partial
rows the array must hold (a regression's interaction of more than t options, or the rows
of a smaller array to extend): each that no earlier one's row holds is completed the same
greedy way, in order, before the rest. Pure Python.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping, Sequence

Row = dict[str, Any]


def all_rows(dimensions: Mapping[str, Sequence[Any]],
             allowed: Callable[[Row], bool] = lambda row: True) -> list[Row]:
    """Every row of the product that `allowed` keeps, in the product's order."""
    names = list(dimensions)
    rows = (dict(zip(names, values)) for values in itertools.product(*dimensions.values()))
    return [row for row in rows if allowed(row)]


def covering_array(dimensions: Mapping[str, Sequence[Any]],
                   allowed: Callable[[Row], bool] = lambda row: True, strength: int = 2,
                   seeds: Sequence[Mapping[str, Any]] = ()) -> list[Row]:
    """Rows of `dimensions` (name: its values) that together hold every `strength`-tuple
    of values some allowed row holds, and a completion of each of `seeds`."""
    names = list(dimensions)
    for seed in seeds:
        unknown = set(seed) - set(names) or {
            f"{name}={value!r}" for name, value in seed.items() if value not in dimensions[name]}
        if unknown:
            raise ValueError(f"seed {dict(seed)} names {sorted(map(str, unknown))}, "
                             f"not in the dimensions")
    rows = all_rows(dimensions, allowed)
    if strength >= len(names):
        return rows
    # Each row's t-tuples as the bits of one integer: a row's gain is a popcount.
    bit: dict[tuple, int] = {}
    covers = []
    for row in rows:
        cover = 0
        for combo in itertools.combinations(names, strength):
            cover |= 1 << bit.setdefault(tuple((name, row[name]) for name in combo), len(bit))
        covers.append(cover)
    uncovered = (1 << len(bit)) - 1
    chosen: list[Row] = []

    def take(candidates) -> None:
        nonlocal uncovered
        best = max(candidates, key=lambda i: (covers[i] & uncovered).bit_count())
        chosen.append(rows[best])
        uncovered &= ~covers[best]

    for seed in seeds:
        matching = [i for i, row in enumerate(rows)
                    if all(row[name] == value for name, value in seed.items())]
        if not matching:
            raise ValueError(f"seed {dict(seed)}: no allowed row holds it")
        if not any(rows[i] in chosen for i in matching):  # an earlier seed's row holds it
            take(matching)
    while uncovered:
        take(range(len(rows)))
    return chosen


def uncovered_tuples(rows: Sequence[Row], dimensions: Mapping[str, Sequence[Any]],
                     allowed: Callable[[Row], bool] = lambda row: True,
                     strength: int = 2) -> set[tuple]:
    """The `strength`-tuples some allowed row holds that none of `rows` does."""
    names = list(dimensions)
    combos = list(itertools.combinations(names, strength))

    def tuples(row: Row) -> set[tuple]:
        return {tuple((name, row[name]) for name in combo) for combo in combos}
    possible = set().union(*(tuples(row) for row in all_rows(dimensions, allowed)))
    return possible - set().union(*(tuples(row) for row in rows))
