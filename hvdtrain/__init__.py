"""hvdtrain: Keras image classifiers trained across many workers with Horovod.

Synchronous data parallelism (gradients averaged every step) and local SGD
(weights averaged every n_sync steps), with linear-scaling learning rates and
warmup. The heavy modules (TensorFlow, Horovod) are imported only where needed.
"""

__version__ = "0.1.0"
