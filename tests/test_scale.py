"""16 workers on one machine (issue 37): the job starts, trains and ends in consensus,
each worker with TensorFlow pools sized to its share of the cores. `make test-scale`."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import horovodrun
from helpers import write_learnable_idx_dataset
from hvdtrain.machine.cpu_cores import shared_pool_sizes

pytestmark = [pytest.mark.scale, pytest.mark.multiprocess, pytest.mark.slow]

WORKERS = 16
STEPS = 3
# 64 examples a shard: 4 batches of 16 a worker, of which the run takes 3.
RUN = dict(model="lenet", batch_size=16, epochs=1, steps_per_epoch=STEPS, validate=False)


@pytest.fixture(scope="module")
def sixteen_workers(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    data_dir = write_learnable_idx_dataset(str(root / "data"), train=64 * WORKERS, test=160)
    results = root / "results"
    results.mkdir()
    config = dict(RUN, data_dir=data_dir, out=str(root / "run"))
    output = horovodrun("scale_worker.py", str(results), json.dumps(config), np_=WORKERS,
                        hosts=f"localhost:{WORKERS}", timeout=900)
    reports = [json.loads((results / f"rank{r}.json").read_text()) for r in range(WORKERS)]
    weights = [np.load(results / f"rank{r}.npz")["trainable"] for r in range(WORKERS)]
    return root, reports, weights, output


def test_sixteen_workers_end_with_identical_weights(sixteen_workers):
    _, _, weights, _ = sixteen_workers
    for rank, other in enumerate(weights[1:], start=1):
        np.testing.assert_array_equal(other, weights[0], err_msg=f"rank {rank}")


def test_the_summary_counts_sixteen_workers_in_step(sixteen_workers):
    root, reports, _, _ = sixteen_workers
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert summary["steps_per_worker"] == [STEPS] * WORKERS
    assert (summary["workers"], summary["global_batch"], summary["total_steps"]) == (
        WORKERS, 16 * WORKERS, STEPS)
    assert summary["gradient_steps_averaged"] == STEPS and summary["mode"] == "sync"
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    # Unpinned, 16 workers share the machine's cores: rank 0's share is a sixteenth of them.
    assert summary["cores_per_worker"] == round(len(os.sched_getaffinity(0)) / WORKERS, 3)
    assert all(r["summary"]["workers"] == WORKERS for r in reports)


def test_each_worker_sizes_tensorflows_pools_to_its_share_of_the_cores(sixteen_workers):
    _, reports, _, _ = sixteen_workers
    # TensorFlow reports 0 for a pool it sizes itself (a thread per core).
    expected = shared_pool_sizes(len(os.sched_getaffinity(0)), WORKERS) or (0, 0)
    assert {(r["intra_op_threads"], r["inter_op_threads"]) for r in reports} == {expected}
    assert all(r["local_size"] == WORKERS for r in reports)


def test_rank_0_alone_says_when_the_workers_outnumber_the_cores(sixteen_workers):
    _, _, _, output = sixteen_workers
    warnings = [line for line in output.stdout.splitlines() if "hvdtrain: warning:" in line]
    if len(os.sched_getaffinity(0)) >= WORKERS:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].startswith("[0]<stdout>:")
        assert f"{WORKERS} workers share" in warnings[0]
