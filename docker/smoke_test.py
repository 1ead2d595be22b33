"""The last step of each image build: hvdtrain's Horovod layer starts and, with several workers, sums.

    python docker/smoke_test.py                                         # one worker
    horovodrun -np 2 -H localhost:2 --gloo python docker/smoke_test.py  # two

Runs on CPU tensors, so it passes on a build machine without a GPU.
"""

import tensorflow as tf

from hvdtrain import comm

comm.init()
rank, size = comm.rank(), comm.size()
(total,) = comm.total([tf.constant([float(rank + 1)])], name="smoke")
expected = size * (size + 1) / 2
if float(total[0]) != expected:
    raise SystemExit(f"smoke test failed: rank {rank} summed {float(total[0])}, expected {expected}")
print(f"smoke test ok: rank {rank} of {size}, sum over workers {expected:g}", flush=True)
