"""A worker of an emulated GPU host: which GPU `hk.init()` leaves it.

There is no GPU here, so TensorFlow's device listing is faked the way CUDA answers it:
one GPU for each entry of CUDA_VISIBLE_DEVICES, renumbered from 0. Prints the entry
(the host's physical GPU) of each device the worker was left with.
"""

import os

import tensorflow as tf

import hvdtrain.keras as hk

physical = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
listed = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(len(physical))]
pinned = []
tf.config.list_physical_devices = lambda kind=None: listed if kind == "GPU" else []
tf.config.set_visible_devices = lambda devices, kind=None: pinned.extend(devices)
tf.config.experimental.set_memory_growth = lambda device, enable: None

hk.init()
seen = [physical[int(device.name.rsplit(":", 1)[1])] for device in pinned]
print(f"rank {hk.rank()} local rank {os.environ['HOROVOD_LOCAL_RANK']} sees GPUs {seen}")
