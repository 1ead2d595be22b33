"""The last step of each image build: hvdtrain's Horovod layer starts, sums over workers, and
gives a Keras 3 variable rank 0's value.

    python docker/smoke_test.py                                         # one worker
    horovodrun -np 2 -H localhost:2 --gloo python docker/smoke_test.py  # two

The variable check is there because Horovod's own Keras layer fails on Keras 3 variables:
hvdtrain reads them into tensors for Horovod and assigns the results back, and this
proves that path works in the image. Runs on CPU tensors, so it passes on a build
machine without a GPU.
"""

import keras
import tensorflow as tf

from hvdtrain import comm
from hvdtrain.keras.state import broadcast_variables

comm.init()
rank, size = comm.rank(), comm.size()
(total,) = comm.total([tf.constant([float(rank + 1)])], name="smoke")
expected = size * (size + 1) / 2
if float(total[0]) != expected:
    raise SystemExit(f"smoke test failed: rank {rank} summed {float(total[0])}, expected {expected}")
variable = keras.Variable([float(rank + 1)])
broadcast_variables([variable], name="smoke_variable")
if float(variable.numpy()[0]) != 1.0:
    raise SystemExit(f"smoke test failed: rank {rank} holds {float(variable.numpy()[0])} after "
                     "the broadcast, expected rank 0's 1.0")
print(f"smoke test ok: rank {rank} of {size}, sum over workers {expected:g}", flush=True)
