"""The invariant matrix (tests/invariant_matrix.py): local SGD's round choices in
combination, each cell a run of the trainer's parts in threaded workers that must not
hang, must agree after every whole round and at the end, must write every due checkpoint
within a period, and must train at the plan's period and rates.

`make test` runs a cell for every pair of values (and each of the seeds);
`make test-long` every triple beyond those. INVARIANT_MATRIX_STRENGTH=4 (any t) widens
the long run to every t-tuple, and INVARIANT_MATRIX_STRENGTH=all runs every combination
the trainer takes (1,728 cells: hours here)."""

from __future__ import annotations

import os

import pytest

import invariant_matrix as matrix
from covering_arrays import all_rows, covering_array, uncovered_tuples

PAIRWISE = matrix.cells(strength=2)


def _wider() -> list[dict]:
    """The long run's cells: every t-tuple of values, less the cells of `PAIRWISE`."""
    asked = os.environ.get("INVARIANT_MATRIX_STRENGTH", "3")
    strength = len(matrix.DIMENSIONS) if asked == "all" else int(asked)
    pairwise = {matrix.cell_id(cell) for cell in PAIRWISE}
    return [cell for cell in matrix.cells(strength, including=tuple(PAIRWISE))
            if matrix.cell_id(cell) not in pairwise]


def test_the_pairwise_cells_hold_every_pair_of_values_the_trainer_takes_and_each_seed():
    assert not uncovered_tuples(PAIRWISE, matrix.DIMENSIONS, matrix.allowed)
    for seed in matrix.SEEDS:
        assert any(all(cell[k] == v for k, v in seed.items()) for cell in PAIRWISE), seed
    assert all(matrix.allowed(cell) for cell in PAIRWISE)
    # What make test's budget holds: 25 cells, one per pair of the 6 encodings and 4 periods
    # (make test took 5 min 14 s idle with 19).
    assert len(PAIRWISE) <= 25


def test_the_cells_the_trainer_refuses_are_left_out_by_asking_its_checks():
    # The round rules refuse overlapped rounds without epoch rounds, and a merge of rounds
    # that do not overlap, and nothing else here.
    refused = [row for row in all_rows(matrix.DIMENSIONS) if not matrix.allowed(row)]
    assert refused and all(row["mode"] == "async" and not row["epoch_rounds"]
                           or row["mode"] == "local" and row["streaming"] == "merge1"
                           for row in refused)
    assert not any(cell["mode"] == "async" and not cell["epoch_rounds"] for cell in PAIRWISE)


def test_a_covering_array_holds_every_pair_in_fewer_rows_than_the_product():
    dimensions = {"a": (1, 2, 3), "b": (1, 2, 3), "c": (1, 2), "d": (1, 2)}
    allowed = lambda row: (row["a"], row["b"]) != (3, 3)  # noqa: E731
    rows = covering_array(dimensions, allowed, seeds=[dict(a=1, c=2, d=2)])
    assert 8 <= len(rows) < len(all_rows(dimensions, allowed))
    assert not uncovered_tuples(rows, dimensions, allowed)
    assert all(allowed(row) for row in rows)
    assert rows[0]["a"] == 1 and rows[0]["c"] == rows[0]["d"] == 2  # the seed, first
    assert covering_array(dimensions, allowed) == covering_array(dimensions, allowed)


@pytest.mark.slow  # a threaded job each: about 3 seconds here
@pytest.mark.parametrize("cell", PAIRWISE, ids=matrix.cell_id)
def test_every_pair_of_round_choices_keeps_the_invariants(cell):
    problems = matrix.problems(matrix.run_cell(cell))
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.long  # every triple of values: 31 cells beyond the pairs, about 5 minutes here
@pytest.mark.parametrize("cell", _wider(), ids=matrix.cell_id)
def test_every_triple_of_round_choices_keeps_the_invariants(cell):
    problems = matrix.problems(matrix.run_cell(cell))
    assert not problems, "\n".join(problems)
