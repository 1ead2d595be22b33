import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import config, data
from hvdtrain.data import load_dataset, shard_indices, steps_per_epoch
from hvdtrain.data.pipeline import first_missing, passing_indices
from hvdtrain.errors import ConfigError, HvdtrainError


@pytest.mark.parametrize("n, workers", [(10, 2), (11, 3), (7, 1), (1000, 8)])
def test_shards_are_disjoint_and_cover_the_data(n, workers):
    shards = [shard_indices(n, r, workers) for r in range(workers)]
    joined = np.concatenate(shards)
    assert sorted(joined.tolist()) == list(range(n))
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_every_worker_gets_the_same_number_of_steps():
    # 1001 examples over 2 workers: shards of 501 and 500; the smaller decides.
    assert steps_per_epoch(1001, 2, 100) == 5
    assert steps_per_epoch(1001, 2, 100, cap=3) == 3
    with pytest.raises(ConfigError, match="--batch-size 600 is larger than each worker's shard"):
        steps_per_epoch(1001, 2, 600)


def test_train_pipeline_batches_normalised_images_of_this_shard(idx_dataset_dir):
    data = load_dataset("fashion-mnist", idx_dataset_dir)
    ds = data.train(rank=1, workers=2, batch_size=32, seed=0)
    images, labels = next(iter(ds))
    assert images.shape == (32, 28, 28, 1) and images.dtype.name == "float32"
    assert labels.shape == (32,)
    # Normalised with the dataset mean/std: pixel 0 and 255 map to these bounds.
    lo, hi = (0 - 0.2860) / 0.3530, (1 - 0.2860) / 0.3530
    assert lo - 1e-5 <= float(images.numpy().min()) and float(images.numpy().max()) <= hi + 1e-5
    shard_labels = set(data.train_labels[shard_indices(512, 1, 2)].tolist())
    assert set(labels.numpy().tolist()) <= shard_labels


def test_test_pipeline_covers_the_shard_once(idx_dataset_dir):
    data = load_dataset("fashion-mnist", idx_dataset_dir)
    ds = data.test(rank=0, workers=2, batch_size=50)
    labels = np.concatenate([y.numpy() for _, y in ds])
    assert len(labels) == 64
    np.testing.assert_array_equal(labels, data.test_labels[0::2])


def test_a_worker_that_keeps_its_shard_reads_the_same_streams_and_holds_no_other_example(
        idx_dataset_dir):
    whole = load_dataset("fashion-mnist", idx_dataset_dir)
    kept = load_dataset("fashion-mnist", idx_dataset_dir)
    kept.keep_shard(1, 4)
    assert (len(kept.train_labels), len(kept.test_labels)) == (128, 32)
    assert kept.num_train == whole.num_train == 512
    np.testing.assert_array_equal(kept.shard(1, 4), whole.shard(1, 4))
    streams = [(d.train(1, 4, batch_size=16, seed=3, start_step=5).take(10),
                d.test(1, 4, batch_size=16)) for d in (whole, kept)]
    for (a_train, a_test), (b_train, b_test) in [streams]:
        for a, b in zip([*a_train, *a_test], [*b_train, *b_test], strict=True):
            np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
            np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())
    with pytest.raises(ValueError, match="holds worker 1 of 4's shard only, not worker 0 of 4's"):
        kept.train(0, 4, batch_size=16, seed=3)
    with pytest.raises(ValueError, match="--train-examples must apply before"):
        kept.limit_train(100)


def test_synthetic_dataset_has_the_requested_shape():
    data = load_dataset("synthetic", synthetic_shape=(16, 12, 3), seed=3)
    assert data.input_shape == (16, 12, 3) and data.num_classes == 10
    assert data.train_images.dtype == np.uint8


def test_unknown_dataset_is_a_config_error():
    with pytest.raises(ConfigError, match="--dataset must be one of fashion-mnist, .*got 'mnist'"):
        load_dataset("mnist")


def test_dataset_names_have_one_home_that_load_dataset_serves():
    assert data.DATASETS is config.DATASETS
    for name in config.DATASETS:
        try:
            load_dataset(name, synthetic_shape=(4, 4, 1))
        except HvdtrainError as exc:  # no files here; only "unknown dataset" would be wrong
            assert "--dataset must be one of" not in str(exc)


def test_passing_indices_drops_failed_and_false_checks_and_first_missing_finds_the_gap():
    items = tf.data.Dataset.from_tensor_slices(["3", "x", "2", "0", "5"])
    # "x" raises (as an undecodable image would); "0" is a check that says no.
    passed = passing_indices(items, lambda s: tf.strings.to_number(s) > 0)
    assert sorted(passed.tolist()) == [0, 2, 4]
    assert first_missing(passed, 5) == 1 and first_missing(np.array([2, 0, 1]), 3) is None
