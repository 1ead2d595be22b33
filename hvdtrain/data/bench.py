"""Throughput of an input pipeline alone: is the input or the model the bottleneck?"""

from __future__ import annotations

import time

import tensorflow as tf

from hvdtrain.config import TrainConfig, parse_shape
from hvdtrain.data import load_dataset
from hvdtrain.stats import mean_ci95


def pipeline_throughput(ds: tf.data.Dataset, batch_size: int, batches: int, warmup: int = 5,
                        window: int = 10) -> dict[str, float]:
    """Images/sec over `batches` batches after `warmup`, as mean ± 95% CI over windows."""
    iterator = iter(ds)
    for _ in range(warmup):
        next(iterator)
    rates = []
    done = 0
    while done < batches:
        size = min(window, batches - done)
        start = time.perf_counter()
        for _ in range(size):
            next(iterator)
        rates.append(size * batch_size / (time.perf_counter() - start))
        done += size
    mean, ci = mean_ci95(rates)
    return {"images_per_sec": mean, "ci95": ci, "batches": batches, "batch_size": batch_size}


def dataset_throughput(cfg: TrainConfig, batches: int, workers: int) -> dict:
    """`hvdtrain data bench`: rank 0's training pipeline among `workers`, read as fast as possible."""
    data = load_dataset(cfg.dataset, cfg.data_dir, parse_shape(cfg.synthetic_shape), cfg.seed,
                        cfg.image_size)
    result = pipeline_throughput(data.train(0, workers, cfg.batch_size, cfg.seed),
                                 cfg.batch_size, batches)
    result.update(dataset=cfg.dataset, workers=workers)
    return result
