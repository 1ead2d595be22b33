"""Rank 1 fails while rank 0 waits in an allreduce: the job must end, not hang."""

import sys

import tensorflow as tf

from hvdtrain import comm

comm.init()
if comm.rank() == 1:
    print("rank 1: failing on purpose", flush=True)
    sys.exit(7)
comm.average([tf.ones(3)], name="never_completes")
print("rank 0: allreduce completed (should not happen)", flush=True)
