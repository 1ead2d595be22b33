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


def fragments_of(keys: Sequence[Hashable], sizes: Sequence[int], count: int) -> list[list[int]]:
    """Positions of the variables (each with its layer's key and its bytes) in each of
    `count` fragments: whole layers, in order, of about equal bytes."""
    units = layer_units(keys)
    unit_sizes = [sum(sizes[i] for i in unit) for unit in units]
    return [sorted(i for u in group for i in units[u])
            for group in split_evenly(unit_sizes, count)]

