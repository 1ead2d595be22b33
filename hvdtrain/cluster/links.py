"""Emulated network links: rates in tc's units, the token bucket that holds a link to
one, and a job in a private network namespace with a shaped loopback.

Below both of its users: the emulated cluster (`hvdtrain.cluster`) shapes its hosts'
links with the same rate and bucket, and the benchmarks run a job over one link.

On one machine two workers talk over loopback at several GB/s, so communication is a
small share of a step. `--link-rate 1gbit` runs each job in its own network namespace
(`unshare --net`), where the loopback is the only interface and a token-bucket filter
(`tc qdisc ... tbf`) holds it to the given rate. All of the job's traffic stays on
127.0.0.1 inside that namespace, which lives exactly as long as the job; nothing
outside it is touched. Both workers' traffic shares the one shaped link, as two
processes on one NIC would.
"""

from __future__ import annotations

import re
import subprocess

from hvdtrain.errors import ConfigError

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
# The loopback's MTU inside the namespace: jumbo frames, as on data-centre links.
# Loopback's own 64 KiB MTU would force a bucket of at least 64 KiB.
LINK_MTU = 9000
# tbf lets a full bucket through at line rate, so the bucket bounds how far the emulated
# link is faster than a real one: a 1 MiB bucket passed a whole LeNet exchange (0.25 MB)
# at once and refilled during compute, so 100 Mbit/s barely slowed LeNet. One
# millisecond of traffic keeps that error under 1 ms per exchange and still reaches
# the rate (measured: 12.4 MB/s at 100mbit, 123 MB/s at 1gbit, 1.29 GB/s at 10gbit).
BUCKET_SECONDS = 0.001
# Packets may wait this long in the queue before tbf drops them; allreduce traffic is
# one large transfer at a time, so a generous bound only avoids needless drops.
QUEUE_LATENCY = "200ms"


def parse_rate(text: str) -> int:
    """'1gbit' -> 1e9 bits per second; tc's decimal units bit, kbit, mbit, gbit, tbit."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?bit)\s*", str(text).lower())
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"--link-rate must be a rate in tc's units (10gbit, 1gbit, 100mbit), "
                          f"got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def burst_bytes(rate_bits: int) -> int:
    """The token bucket's size: 1 ms of traffic, and never less than two frames."""
    return max(2 * LINK_MTU, int(rate_bits * BUCKET_SECONDS) // 8)


def _setup_script(rate: str) -> str:
    bits = parse_rate(rate)
    return (f"ip link set lo up && ip link set lo mtu {LINK_MTU} && tc qdisc add dev lo root tbf rate {bits}bit "
            f"burst {burst_bytes(bits)} latency {QUEUE_LATENCY}")


def shaped_command(command: list[str], rate: str) -> list[str]:
    """`command` run in a new network namespace whose loopback is shaped to `rate`.

    The shell sets the link up and shapes it, then replaces itself with the command,
    so the namespace ends with the job.
    """
    script = _setup_script(rate) + ' && exec "$@"'
    return ["unshare", "--net", "--", "sh", "-c", script, "hvdtrain-link", *command]


def check_can_shape(rate: str) -> None:
    """Raise one line when this process cannot make and shape a network namespace."""
    try:
        probe = subprocess.run(["unshare", "--net", "--", "sh", "-c", _setup_script(rate)],
                               capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise ConfigError("--link-rate needs util-linux's unshare, which is not installed") from None
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise ConfigError(f"--link-rate {rate} needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to "
                          f"make and shape a private network namespace: {reason}")


def check_link_options(rate: str | None, hostfile: str | None) -> None:
    """What a driver (bench, sweep) checks before it starts jobs over an emulated link."""
    if not rate:
        return
    parse_rate(rate)
    if hostfile:
        raise ConfigError("--link-rate shapes this machine's loopback; it cannot emulate links "
                          f"to the hosts of --hostfile {hostfile}")
    check_can_shape(rate)


def over_link(command: list[str], rate: str | None) -> list[str]:
    """`command` over an emulated link of `rate`, or as it is without one."""
    return shaped_command(command, rate) if rate else list(command)
