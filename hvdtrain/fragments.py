"""Streamed fragments of a local SGD round (Streaming DiLoCo, arXiv 2501.18512).

The averaged state is cut into F contiguous groups of layers of about equal bytes; a
period's round averages one group in turn, so a round's burst is about 1/F of the model
and each group is averaged every F rounds.

Pure Python: no TensorFlow, no Keras (`hvdtrain.keras.fragmented_rounds` applies it).
"""

from __future__ import annotations

from typing import Hashable, Sequence

from hvdtrain.errors import ConfigError


def split_evenly(sizes: Sequence[int], count: int) -> list[range]:
    """`count` contiguous, non-empty ranges of positions into `sizes` (bytes of each unit,
    in order) whose byte sums are about equal: each boundary falls at the unit boundary
    nearest to its share of the total, leaving at least one unit for every later group."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"--round-fragments must be a positive integer, got {count!r}")
    if count > len(sizes):
        raise ConfigError(f"--round-fragments {count} is more than the {len(sizes)} layers "
                          "the rounds average: every fragment needs one")
    cumulative = [0]
    for size in sizes:
        cumulative.append(cumulative[-1] + size)
    total, start, groups = cumulative[-1], 0, []
    for group in range(1, count):
        target = total * group / count
        # Ends from start + 1 (a group is never empty) to the last that leaves one unit for
        # each of the groups still to come.
        ends = range(start + 1, len(sizes) - (count - group) + 1)
        end = min(ends, key=lambda e: abs(cumulative[e] - target))
        groups.append(range(start, end))
        start = end
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


def fragments_of(keys: Sequence[Hashable], sizes: Sequence[int], count: int) -> list[list[int]]:
    """Positions of the variables (each with its layer's key and its bytes) in each of
    `count` fragments: whole layers, in order, of about equal bytes."""
    units = layer_units(keys)
    unit_sizes = [sum(sizes[i] for i in unit) for unit in units]
    return [sorted(i for u in group for i in units[u])
            for group in split_evenly(unit_sizes, count)]

