"""The peer trainer of BENCHMARKS.md's comparison: what its images/sec count."""

from hvdtrain.benchmarks.peers.mwms_tf_keras import free_ports, timed_steps


def test_every_epochs_first_step_is_left_out_of_the_timed_window():
    # Two epochs of 3 steps; step ends at these times. Step 0 (tracing) has no start
    # here, step 3 opens epoch 2: both left out, as hvdtrain's throughput meter does.
    ends = [10.0, 11.0, 12.5, 20.0, 21.0, 23.0]
    assert timed_steps(ends, steps_per_epoch=3) == [1.0, 1.5, 1.0, 2.0]


def test_each_worker_gets_its_own_port():
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(port > 0 for port in ports)
