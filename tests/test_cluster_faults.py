"""Training jobs on an emulated cluster whose hosts fail: a host crashes, leaves the network, slows.

Each fault fires on an event of the job (`--fault when=PATH`: its first checkpoint, an
epoch's line, or a file this test creates), never at a guessed time: on a loaded
machine a time says little about how far a job has come.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from helpers import write_learnable_idx_dataset
from test_cluster import HVDTRAIN, VENV_BIN, hostfile, needs_cluster, run_cluster

HOROVODRUN = os.path.join(VENV_BIN, "horovodrun")
pytestmark = [needs_cluster, pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.cluster]


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))


def _wait_for(predicate, timeout: float, proc: subprocess.Popen) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def ended_after_event(proc: subprocess.Popen, event, wait: float, end: float) -> tuple[str, float]:
    """Wait up to `wait` s for `event()` (the fault's trigger), then up to `end` s for the
    job to end: its output, and the seconds from the event to its end."""
    try:
        assert _wait_for(event, wait, proc)
        happened_at = time.monotonic()
        output = proc.communicate(timeout=end)[0]
        return output, time.monotonic() - happened_at
    finally:
        if proc.poll() is None:
            proc.kill()


def _epochs(out) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- a job without --elastic loses a host: the others stop in one line; the same command resumes ---

STEP_TIMEOUT = 20


def _static_job(tmp_path, data_dir, out) -> list[str]:
    return [HOROVODRUN, "-np", "3", "-hostfile", hostfile(tmp_path, 3), "--gloo",
            "--network-interface", "eth0", "--start-timeout", "60",
            HVDTRAIN, "train", "--model", "lenet", "--data-dir", data_dir, "--batch-size", "16",
            "--epochs", "3", "--steps-per-epoch", "12", "--checkpoint-every", "6",
            "--step-timeout", str(STEP_TIMEOUT), "--out", str(out)]


def test_a_crashed_host_stops_the_others_in_one_line_and_the_same_command_resumes(tmp_path):
    """h3's processes are all killed once the first checkpoint exists. The peers' next
    collective fails at once (the kernel resets h3's connections); each worker still
    running says so in one line, unless horovodrun, which ends the rest of the job as
    soon as one worker fails, has terminated it first (status 143): which of the two
    comes first is a race. A host that leaves without a reset is the step timeout's
    case (a hung worker, in test_fault_tolerance); it bounds this one too."""
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=1152, test=256)
    out = tmp_path / "run"
    job = _static_job(tmp_path, data_dir, out)
    kill = f"when={out}/checkpoints/step-* host=h3 action=kill"
    proc = subprocess.Popen([HVDTRAIN, "cluster", "--hosts", "3", "--link-rate", "1gbit",
                             "--fault", kill, "--", *job], env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output, ended_after = ended_after_event(
        proc, lambda: os.path.isdir(out / "checkpoints" / "step-000000006"), 300, 120)
    assert proc.returncode != 0 and not (out / "summary.json").exists(), output[-3000:]
    assert f"h3 kill (once {out}/checkpoints/step-* exists)" in output
    assert ended_after < STEP_TIMEOUT, output[-3000:]
    for rank in (0, 1):  # the workers on h1 and h2
        said = re.search(rf"\[{rank}\]<stderr>:hvdtrain: error: worker {rank} lost a peer after "
                         rf"step \d+: Horovod shut down .* Run the same command again to resume "
                         rf"from the newest checkpoint in {out}\n", output)
        # Terminated by horovodrun: its status line may be missing, as the job ends at once.
        terminated = (f"Process {rank} exit with status code 143" in output
                      or "Terminating remaining workers after failure of Process" in output)
        assert said or terminated, output[-3000:]
        assert f"[{rank}]<stderr>:Traceback" not in output, output[-3000:]

    again = run_cluster(["--hosts", "3", "--link-rate", "1gbit", "--", *job])
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {out}/checkpoints/step-0000000" in again.stdout
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["resumed_from_step"] >= 6 and resumed["total_steps"] == 36
    assert [r["epoch"] for r in _epochs(out)] == [1, 2, 3]

    unbroken_out = tmp_path / "unbroken"
    unbroken = run_cluster(["--hosts", "3", "--link-rate", "1gbit", "--",
                            *_static_job(tmp_path, data_dir, unbroken_out)])
    assert unbroken.returncode == 0, unbroken.stderr[-3000:]
    reference = json.loads((unbroken_out / "summary.json").read_text())
    # The resumed run replays the same data from the same state; what differs is the
    # order of floating-point sums. 256 test images: 0.02 is 5 of them.
    assert resumed["test_accuracy"] == pytest.approx(reference["test_accuracy"], abs=0.02)


# --- an elastic job loses h3's network mid-epoch, goes on with two, and takes h3 in again ---

# The hosts that answer on the ssh port now, a slot each: a host whose NIC is down drops
# out of the list by itself, and comes back into it with its NIC. The probe outlasts a
# lost SYN, which Linux sends again after 1 s and 3 s: the job keeps the 10 Mbit/s links
# full, their shapers drop what waits too long, and a 1 s probe then dropped a host that
# was up, now and then; the job was reset without it and broke off when it came back.
DISCOVER = """#!/bin/bash
for h in h1 h2 h3; do
  timeout 5 bash -c "exec 3<>/dev/tcp/$h/22" 2>/dev/null && echo "$h:{slots}"
done
exit 0
"""


GLOO_WAIT = 60


def _elastic_job(tmp_path, data_dir, out, epochs: int, *extra: str, slots: int = 1) -> list[str]:
    discover = tmp_path / "discover.sh"
    discover.write_text(DISCOVER.replace("{slots}", str(slots)))
    discover.chmod(0o755)
    # A failed host is blacklisted for good unless a cool-down range is given: 1-2 s here.
    # Gloo's wait covers a returning host's fresh start (TensorFlow's import): on this
    # machine, busy with other work, it outlasted the default 30 s (a test-long failure,
    # "Wait timeout after 30 seconds for key(s): 4"). The price: a lost host is noticed
    # after as long.
    return [HOROVODRUN, "-np", str(3 * slots), "--min-np", str(2 * slots),
            "--max-np", str(3 * slots), "--host-discovery-script",
            str(discover), "--blacklist-cooldown-range", "1", "2", "--gloo",
            "--gloo-timeout-seconds", str(GLOO_WAIT),
            "--network-interface", "eth0", "--start-timeout", "60",
            HVDTRAIN, "train", "--elastic", "--model", "lenet", "--data-dir", data_dir,
            "--batch-size", "16", "--epochs", str(epochs), "--elastic-commit-every", "5",
            "--no-validate", "--out", str(out), *extra]


def _h3_leaves_and_comes_back(tmp_path, data_dir, epochs: int, *extra: str,
                              slots: int = 1) -> tuple[subprocess.Popen, str]:
    """Run the elastic job on 3 hosts; pull h3's NIC after the first epoch line and plug
    it back once the others train without it: the job, and its output."""
    out, log = tmp_path / "run", tmp_path / "job.log"
    down, up = tmp_path / "pull-h3", tmp_path / "plug-h3"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [HVDTRAIN, "cluster", "--hosts", "3", "--link-rate", "10mbit",
             "--fault", f"when={down} host=h3 action=down", "--fault", f"when={up} host=h3 action=up",
             "--", *_elastic_job(tmp_path, data_dir, out, epochs, *extra, slots=slots)],
            env=_env(), stdout=log_file, stderr=subprocess.STDOUT)
    try:
        assert _wait_for(lambda: len(_epochs(out)) >= 1, 300, proc), log.read_text()[-3000:]
        down.touch()
        assert _wait_for(lambda: f"training with {2 * slots} worker(s)" in log.read_text(),
                         180, proc), log.read_text()[-3000:]
        up.touch()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, log.read_text()


def _assert_left_and_came_back(proc, output: str, out, epochs: int, slots: int) -> None:
    from test_fault_tolerance import _assert_progress_in_examples

    assert proc.returncode == 0, output[-4000:]
    assert "h3 down (once" in output and "h3 up (once" in output
    # Two hosts' workers from the last commit on, then three hosts' again, later.
    phases = re.findall(r"training with (\d) worker\(s\) from step (\d+)", output)
    assert [int(w) for w, _ in phases] == [3 * slots, 2 * slots, 3 * slots], output[-4000:]
    assert 0 < int(phases[1][1]) < int(phases[2][1]), phases
    assert _epochs(out)[-1]["workers"] == 3 * slots
    _assert_progress_in_examples(out, epochs)  # every epoch once, in order
    assert json.loads((out / "summary.json").read_text())["workers"] == 3 * slots


@pytest.mark.ci
def test_an_elastic_job_goes_on_without_a_host_that_left_the_network_and_takes_it_back(tmp_path):
    """h3's NIC goes down in epoch 2 (no reset reaches anyone: its peers' allreduce
    waits for Horovod's gloo timeout, and its ssh session for the keep-alives, 15 s).
    The two others go on from the last commit; once h3 is back and the discovery script
    lists it, it joins. Every epoch is logged once, with its workers and examples.

    10 Mbit/s links make a LeNet step last about 0.2 s of waiting on the network rather
    than of the machine's two busy cores, so the job outlasts h3's return."""
    epochs = 30
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=240, test=64)
    proc, output = _h3_leaves_and_comes_back(tmp_path, data_dir, epochs)
    _assert_left_and_came_back(proc, output, tmp_path / "run", epochs, slots=1)


def test_a_hierarchical_elastic_job_loses_a_host_of_two_workers_and_takes_it_back(tmp_path):
    """Hierarchical local SGD on 3 hosts × 2 slots: h3's NIC goes down after the first
    epoch, so both its workers are lost at once. The 4 workers of h1 and h2 go on from the
    last commit in a hierarchy of 2 hosts (Horovod's process sets made again after the
    reset), and h3's pair is taken back in at a round (a commit). Every epoch is logged
    once, and the summary's topology is the final one."""
    epochs = 30
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=960, test=64)
    proc, output = _h3_leaves_and_comes_back(
        tmp_path, data_dir, epochs, "--mode", "local", "--hierarchical-sgd", "--n-sync", "5",
        slots=2)
    out = tmp_path / "run"
    _assert_left_and_came_back(proc, output, out, epochs, slots=2)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["hosts"], summary["workers_per_host"]) == (3, 2)


# --- with rounds every T seconds, one host's link drops to a tenth: async hides it, local waits ---

def _fast_hosts_rate(records: list[dict], first: int, last: int) -> float:
    """Steps a second of the workers on h1 and h2 (ranks 0 and 1) between two epoch lines."""
    a, b = records[first], records[last]
    steps = sum(b["steps_per_worker"][r] - a["steps_per_worker"][r] for r in (0, 1)) / 2
    return steps / (b["wall_seconds"] - a["wall_seconds"])


def _timed_run_with_a_slowed_host(tmp_path, data_dir, mode: str) -> tuple[float, float]:
    """h3's link drops from 10 to 1 Mbit/s once the job has logged two epochs: the fast
    hosts' steps a second over the epoch before, and over the epochs after."""
    out, slow, log = tmp_path / f"run-{mode}", tmp_path / f"slow-{mode}", tmp_path / f"{mode}.log"
    job = [HOROVODRUN, "-np", "3", "-hostfile", hostfile(tmp_path, 3), "--gloo",
           "--network-interface", "eth0", "--start-timeout", "60",
           HVDTRAIN, "train", "--model", "lenet", "--data-dir", data_dir, "--batch-size", "16",
           "--epochs", "5", "--mode", mode, "--sync-seconds", "3", "--no-validate", "--out", str(out)]
    with open(log, "w") as log_file:
        proc = subprocess.Popen([HVDTRAIN, "cluster", "--hosts", "3", "--link-rate", "10mbit",
                                 "--fault", f"when={slow} host=h3 action=slow:1mbit", "--", *job],
                                env=_env(), stdout=log_file, stderr=subprocess.STDOUT)
    try:
        assert _wait_for(lambda: len(_epochs(out)) >= 2, 300, proc), log.read_text()[-3000:]
        slow.touch()
        before = len(_epochs(out)) - 1  # the line after which the link is slow
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert "h3 slow to 1 Mbit/s" in log.read_text()
    records = _epochs(out)
    assert len(records) > before + 1, records  # at least one epoch line after the slowing
    return _fast_hosts_rate(records, before - 1, before), _fast_hosts_rate(records, before, -1)


def test_timed_local_and_async_jobs_finish_when_one_hosts_link_drops_to_a_tenth(tmp_path):
    """Rounds every 3 s; h3's link drops from 10 to 1 Mbit/s after two epochs, and both a
    blocking (local) and an overlapped (async) job go on and finish, logging epochs after
    the slowing. The fast hosts' steps/s before and after are printed, not asserted: tests
    check behaviour, not speed (BENCHMARKS.md has the comparison). Measured here: local
    118 -> 74 steps/s (-37%) and 105 -> 71 (-32%); async 75 -> 80 (+7%), 120 -> 96 (-20%)
    and, in a fresh-clone CI run, local -38% and async -47%: two cores make them noisy."""
    # An epoch of 72,000 examples is 500 steps a worker, about 4 s at full speed: longer
    # than the 3-s period, so a period rarely ends two epochs and the log has a line per
    # epoch. With 24,000 a period once ended epochs 3 to 5 in one line, and the job had
    # finished before the link was slowed.
    data_dir = write_learnable_idx_dataset(str(tmp_path / "data"), train=72000, test=64)
    for mode in ("local", "async"):
        before, after = _timed_run_with_a_slowed_host(tmp_path, data_dir, mode)
        assert before > 0 and after > 0, (mode, before, after)  # both stretches took steps
        print(f"{mode}: the fast hosts' steps/s {before:.1f} -> {after:.1f} ({after / before - 1:+.0%})")


# --- a worker on a host that left the network ends with its ssh session ---

# Two processes on h3, started over ssh as horovodrun starts its workers: one marked as
# horovodrun's worker, one not. h3's NIC goes down for longer than sshd's keep-alives
# (15 s), then comes back: the worker is gone, the other process lives on.
GHOST_JOB = """
set -u
start() {{  # $1: the env it runs with, $2: where it writes its pid
  ssh h3 "cd {tmp} > /dev/null 2>&1 ; env $1 {python} -c 'import os, time
from hvdtrain.machine.launcher_lifetime import end_with_launcher
end_with_launcher()
open(\\"$2.tmp\\", \\"w\\").write(str(os.getpid())); os.rename(\\"$2.tmp\\", \\"$2\\")
time.sleep(600)'" > /dev/null 2>&1 &
}}
start HOROVOD_GLOO_RENDEZVOUS_ADDR=198.18.0.1 {tmp}/worker.pid
start OTHER=1 {tmp}/other.pid
while [ ! -e {tmp}/worker.pid ] || [ ! -e {tmp}/other.pid ]; do sleep 0.2; done
touch {tmp}/pull-h3
sleep 30
touch {tmp}/plug-h3
sleep 3
kill -0 "$(cat {tmp}/worker.pid)" 2>/dev/null && echo "worker lives" || echo "worker gone"
kill -0 "$(cat {tmp}/other.pid)" 2>/dev/null && echo "other lives" || echo "other gone"
"""


def test_a_worker_on_a_host_that_left_the_network_ends_with_its_ssh_session(tmp_path):
    """Left alive, such a worker reaches the elastic driver again once its host is back,
    and is counted beside the worker started there anew (hvdtrain.machine.launcher_lifetime)."""
    job = tmp_path / "job.sh"
    job.write_text(GHOST_JOB.format(tmp=tmp_path, python=sys.executable))
    result = run_cluster(["--hosts", "3",
                          "--fault", f"when={tmp_path / 'pull-h3'} host=h3 action=down",
                          "--fault", f"when={tmp_path / 'plug-h3'} host=h3 action=up",
                          "--", "bash", str(job)], timeout=180, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "worker gone" in result.stdout and "other lives" in result.stdout, result.stdout
