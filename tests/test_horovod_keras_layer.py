"""What the README says of Horovod's own Keras layer on Keras 3, checked under a real
horovodrun job: `horovod.tensorflow.keras.DistributedOptimizer` wraps a Keras 3 optimizer
without error and never averages. It is a statement about Horovod 0.28.1: should a
Horovod start averaging there, this test fails and the README's claim must go."""

import numpy as np
import pytest

from conftest import horovodrun, load_rank_files

pytestmark = pytest.mark.multiprocess


@pytest.mark.long  # a job of 17 seconds here
def test_horovods_distributed_optimizer_never_averages_on_keras_3(tmp_path):
    horovodrun("horovod_keras_layer_worker.py", str(tmp_path))
    ranks = load_rank_files(str(tmp_path), "horovod-keras")
    # Both workers start from the same weights, so any difference comes from training.
    np.testing.assert_array_equal(ranks[0]["initial"], ranks[1]["initial"])
    # Trained on different data through the wrapper, they end apart ...
    assert not np.allclose(ranks[0]["wrapped"], ranks[1]["wrapped"], atol=1e-3)
    # ... each exactly where its bare optimizer takes it: no gradient was averaged.
    for rank in ranks:
        np.testing.assert_array_equal(rank["wrapped"], rank["bare"])
