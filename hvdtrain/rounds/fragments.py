"""Streamed fragments of a local SGD round (Streaming DiLoCo, arXiv 2501.18512).

The averaged state is cut into F contiguous groups of about equal bytes; a period's
round averages one group in turn, so a round's burst is about 1/F of the model and each
group is averaged every F rounds. A layer whose variables all end in the same number of
columns (a dense or convolution kernel, its bias and their optimizer slots: output units
or channels) may be cut between columns, so one large layer (LeNet's first dense layer is
78% of the model) does not hold the burst up; other layers (BatchNorm's, whose variance
is pooled about its mean) travel whole.

Pure Python: no TensorFlow, no Keras (`hvdtrain.keras.fragmented_rounds` applies it).
"""

from __future__ import annotations

from typing import Hashable, Sequence

from hvdtrain.errors import ConfigError


def split_evenly(sizes: Sequence[int], count: int) -> list[range]:
    """`count` contiguous, non-empty ranges of positions into `sizes` (bytes of each unit,
    in order) whose largest byte sum is the smallest any such split has: a fragmented
    round's peak burst is the largest fragment's."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"--round-fragments must be a positive integer, got {count!r}")
    if count > len(sizes):
        raise ConfigError(f"--round-fragments {count} is more than the {len(sizes)} layers "
                          "the rounds average: every fragment needs one")
    # The smallest cap that `count` groups can keep to, by bisection: a group never holds
    # less than the largest unit, nor all of them less than the total.
    low, high = max(max(sizes), -(-sum(sizes) // count)), sum(sizes)
    while low < high:
        cap = (low + high) // 2
        if len(_packed(sizes, cap)) <= count:
            high = cap
        else:
            low = cap + 1
    return _packed(sizes, low, count)


def _packed(sizes: Sequence[int], cap: int, groups_wanted: int | None = None) -> list[range]:
    """Units packed left to right into groups of at most `cap` bytes each (every unit is at
    most `cap`); with `groups_wanted`, a group closes early where the units left only just
    give each group still to come one."""
    groups, start, total = [], 0, 0
    for position, size in enumerate(sizes):
        to_come = None if groups_wanted is None else groups_wanted - len(groups) - 1
        if position > start and (total + size > cap or len(sizes) - position == to_come):
            groups.append(range(start, position))
            start, total = position, 0
        total += size
    groups.append(range(start, len(sizes)))
    return groups


def layer_units(keys: Sequence[Hashable]) -> list[list[int]]:
    """Positions grouped by key (each variable's layer), in the order keys first appear:
    a layer's variables travel in the same fragment (a BatchNorm layer's moving mean and
    variance must: the variance is pooled about the mean)."""
    units: dict[Hashable, list[int]] = {}
    for position, key in enumerate(keys):
        units.setdefault(key, []).append(position)
    return list(units.values())


Piece = tuple  # (position, first column, column after the last), or (position,) whole


def _atoms(unit_columns: Sequence[int]) -> list[tuple[int, int]]:
    """The smallest parts the split may take: (unit, column), or (unit, -1) for a unit
    that travels whole."""
    return [(u, c) for u, columns in enumerate(unit_columns)
            for c in (range(columns) if columns > 1 else (-1,))]


def _unit_columns(units: list[list[int]], columns: Sequence[int] | None) -> list[int]:
    """Each unit's columns if all its variables may be cut there alike, else 0."""
    if columns is None:
        return [0] * len(units)
    return [columns[unit[0]] if all(columns[i] == columns[unit[0]] for i in unit) else 0
            for unit in units]


def fragments_of(keys: Sequence[Hashable], sizes: Sequence[int], count: int,
                 columns: Sequence[int] | None = None) -> list[list[Piece]]:
    """The pieces of the variables (each with its layer's key, its bytes and, if it may be
    cut, its columns, else 0) in each of `count` fragments of about equal bytes, in order:
    (position,) for a whole variable, (position, start, stop) for its columns [start,
    stop). A layer is cut only where every one of its variables has the same columns."""
    units = layer_units(keys)
    unit_sizes = [sum(sizes[i] for i in unit) for unit in units]
    unit_columns = _unit_columns(units, columns)
    atoms = _atoms(unit_columns)
    # A cuttable unit's columns each weigh its bytes over its columns (every variable's
    # last axis is that long, so the division is exact).
    weights = [unit_sizes[u] // unit_columns[u] if c >= 0 else unit_sizes[u] for u, c in atoms]
    if count > len(atoms):
        split_evenly([1] * len(units), count)  # refuses, naming the layers
    groups = split_evenly(weights, count)
    return [_pieces([atoms[a] for a in group], units, unit_columns) for group in groups]


def _pieces(atoms: list[tuple[int, int]], units: list[list[int]],
            unit_columns: list[int]) -> list[Piece]:
    """A fragment's atoms, contiguous, as pieces: a unit whose columns are all here
    travels whole."""
    spans: dict[int, list[int]] = {}
    for unit, column in atoms:
        spans.setdefault(unit, []).append(column)
    pieces = []
    for unit, cols in spans.items():
        whole = cols == [-1] or len(cols) == unit_columns[unit]
        pieces += [(i,) if whole else (i, cols[0], cols[-1] + 1) for i in units[unit]]
    return sorted(pieces)
