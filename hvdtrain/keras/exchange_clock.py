"""How long a compiled training step waits for its gradient exchange.

A benchmark that makes one worker's steps slower (`hvdtrain.benchmarks.timing.SlowerSteps`)
must slow its computation only: a slower GPU does not make the network slower. In sync
mode the exchange runs inside the compiled step, so the step's wall time alone cannot
tell the two apart. An `ExchangeClock` adds up, inside the step, the time from the
moment the last gradient is ready to the moment the last average is back: the part of
the exchange that back-propagation did not hide. Earlier groups may start before that
moment; their time overlaps computation and counts as computation.

The clock is a plain holder, not a Keras or TensorFlow trackable: it must not become
part of the optimizer's checkpoint (a timing is no training state). The timestamps
order only among themselves (they are stateful ops, Horovod's allreduces are not), so
timing an exchange does not delay its start.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf


class ExchangeClock:
    """Seconds spent in timed exchanges since it was made, summed inside compiled steps."""

    def __init__(self):
        self._seconds = tf.Variable(0.0, trainable=False, dtype=tf.float64,
                                    name="exchange_seconds")

    def timed(self, inputs: Sequence[tf.Tensor],
              exchange: Callable[[], Sequence[tf.Tensor]]) -> list[tf.Tensor]:
        """`exchange()`'s tensors; the time from `inputs` being ready to them is added."""
        inputs = [t for t in inputs if t is not None]
        with tf.control_dependencies(inputs):
            start = tf.timestamp()
        outputs = list(exchange())
        with tf.control_dependencies([t for t in outputs if t is not None]):
            self._seconds.assign_add(tf.timestamp() - start)
        return outputs

    def read(self) -> float:
        """The total so far (waits for a step still running on the device)."""
        return float(self._seconds.numpy())


def exchange_clock(model) -> ExchangeClock | None:
    """The clock of `model`'s gradient exchange: the model's own (the plain-Horovod
    reference), or its optimizer's (hvdtrain's gradient averaging, also inside a
    loss-scaling wrapper); None when nothing in its step exchanges gradients."""
    optimizer = getattr(model, "optimizer", None)
    for holder in (model, optimizer, getattr(optimizer, "inner_optimizer", None)):
        clock = getattr(holder, "exchange_clock", None)
        if callable(getattr(clock, "read", None)):
            return clock
    return None
