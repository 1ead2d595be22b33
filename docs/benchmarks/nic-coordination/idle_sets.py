"""What idle Horovod process sets cost on the NICs (run.sh runs it). Every worker
starts Horovod with no sets, host sets, or host and peer sets (as hvdtrain's hierarchy
does), idles IDLE seconds, then ends; or (a2a) runs K global alltoalls whose splits are
zero except to the worker's peers (the hierarchy's cross-host exchange without sets).
HVDTRAIN_HOST_SIZES, which hvdtrain's horovodrun gives every worker, says the hosts.
A probe of Horovod itself, kept beside its numbers: hvdtrain's own code calls Horovod
only through hvdtrain.comm."""
import os, sys, time
import tensorflow as tf
import horovod.tensorflow as hvd

variant, idle, k = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
sizes = [int(x) for x in os.environ["HVDTRAIN_HOST_SIZES"].split(",")]
per, hosts = sizes[0], len(sizes)
host_sets = [list(range(h * per, (h + 1) * per)) for h in range(hosts)]
peer_sets = [[h * per + p for h in range(hosts)] for p in range(per)]
sets = []
if variant in ("host", "hostpeer"):
    sets += [hvd.ProcessSet(r) for r in host_sets]
if variant == "hostpeer":
    sets += [hvd.ProcessSet(r) for r in peer_sets]
hvd.init(process_sets=sets or None)
hvd.allreduce(tf.constant(1.0), name="start")
time.sleep(idle)
if variant == "a2a":
    rank, size = hvd.rank(), hvd.size()
    mine = next(p for p in peer_sets if rank in p)
    chunk = 1024
    splits = tf.constant([chunk if r in mine else 0 for r in range(size)], tf.int32)
    data = tf.zeros([chunk * len(mine)], tf.int8)
    for i in range(k):
        hvd.alltoall(data, splits=splits, name=f"a2a{i % 4}")
hvd.allreduce(tf.constant(1.0), name="end")
if hvd.rank() == 0:
    print(f"done {variant} idle={idle} k={k}", flush=True)
