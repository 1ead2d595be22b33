"""Which inner optimizer `--optimizer auto`, the default, takes for a run.

Sync mode takes LAMB (Keras's Lamb, its peak capped at 0.03) from a global batch of
1,024: there, LeNet on Fashion-MNIST with SGD's defaults (momentum 0.9, the linear rule
capped at 0.1) ended 4.4 points below LAMB at 16 x 64, 3.0 below at 32 x 32 and 10.8
below at 32 x 64, lower at every one of 3 seeds in each. With ResNet-20, whose BatchNorm
LeNet lacks, SGD ended 1.67 and 1.69 points below LAMB at 16 x 64 and 32 x 32 (3 epochs),
lower at every seed too. At 512 the two were level (LeNet and ResNet-20). Below 1,024 it
takes SGD, the recipe the rest of hvdtrain's measurements used.

Flat local mode takes LAMB from a global batch of 1,024 too: with its defaults (int8 rounds
every 2 steps, momentum kept local) LAMB ended above SGD at every seed, by 2.06 points at
16 x 64 and 2.26 at 32 x 32 in the means (3 seeds each). Its rounds come every step
(`config.DEFAULT_LOCAL_LAMB_N_SYNC`) and are rescaled (`--rescale-rounds`), at sync's cap;
unrescaled, its cap is twice sync's (`schedules.default_max_lr`).

Everything else takes SGD:
- async mode and hierarchical local SGD, whose LAMB is not measured;
- `--elastic`: the global batch changes as workers come and go, and a worker that joins
  must build the optimizer the others hold before it may make any collective call;
- `--nesterov`, which is SGD's.

A run keeps what it took: config.yaml records it, and a resumed run takes the saved one
whatever its new number of workers. `hvdtrain.plan.settle` makes the choice, once.
"""

from __future__ import annotations

AUTO = "auto"
LAMB_FROM_GLOBAL_BATCH = 1024
# What `hvdtrain bench` trains every setup with unless told, whatever the job's size: `auto`
# takes LAMB from a global batch of 1,024, so one bench over worker counts would time SGD
# steps at few workers and LAMB's (with rescaled rounds) at many, and its speed-ups would
# mix them.
BENCH_OPTIMIZER = "sgd"


def auto_optimizer(mode: str, global_batch: int, elastic: bool, nesterov: bool,
                   hierarchical: bool = False) -> str:
    """The optimizer `--optimizer auto` takes for a new run of this kind."""
    measured = mode == "sync" or (mode == "local" and not hierarchical)
    if measured and not elastic and not nesterov and global_batch >= LAMB_FROM_GLOBAL_BATCH:
        return "lamb"
    return "sgd"


def took_lamb_notice(mode: str, global_batch: int) -> str:
    """Rank 0's line when `auto` took LAMB: what it did, and how to keep SGD."""
    return (f"hvdtrain: --optimizer auto took lamb: --mode {mode} at a global batch of "
            f"{global_batch} (from {LAMB_FROM_GLOBAL_BATCH}, SGD's defaults ended lower at "
            f"every seed measured); give --optimizer sgd to keep SGD")
