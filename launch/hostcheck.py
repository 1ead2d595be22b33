"""Does every host answer before we launch? Probes all hosts at once and reports every one that does not.

horovodrun stops at the first host it cannot reach, after its own start timeout;
checking first gives the whole list of broken hosts in a few seconds.

Two probes:
- tcp: connect to the ssh port (sshd is up and the network path is open);
- ssh: `ssh -o BatchMode=yes host true` (also proves passwordless login works,
  which horovodrun needs for every remote host).
"""

from __future__ import annotations

import concurrent.futures
import socket
import subprocess
import time
# typing, not collections.abc: this runs on a cluster's system python3 (3.7+).
from typing import Callable, Iterable

Probe = Callable[[str], "str | None"]  # host -> None if it answers, else why not


def tcp_probe(port: int = 22, timeout: float = 3.0) -> Probe:
    def probe(host: str) -> str | None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return None
        except socket.gaierror:
            return "name does not resolve"
        except socket.timeout:  # not yet an alias of TimeoutError before Python 3.10
            return f"no answer on port {port} within {timeout:g} s"
        except OSError as exc:
            return f"port {port}: {exc.strerror or exc}"
    return probe


def ssh_probe(port: int | None = None, timeout: float = 5.0) -> Probe:
    def probe(host: str) -> str | None:
        command = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}"]
        if port:
            command += ["-p", str(port)]
        command += [host, "true"]
        try:
            # ConnectTimeout bounds the connection only; a hung login is bounded here.
            result = subprocess.run(command, check=False, stdin=subprocess.DEVNULL, capture_output=True,
                                    text=True, timeout=timeout + 5)
        except FileNotFoundError:
            return "ssh is not installed on this machine"
        except subprocess.TimeoutExpired:
            return f"ssh did not finish within {timeout + 5:g} s"
        if result.returncode == 0:
            return None
        lines = result.stderr.strip().splitlines()
        return lines[-1] if lines else f"ssh exited with {result.returncode}"
    return probe


def unreachable(hosts: Iterable[str], probe: Probe, wait: float = 0.0,
                interval: float = 2.0) -> dict[str, str]:
    """Every host that does not answer, with the reason, in the order given.

    With `wait` > 0, hosts that fail are probed again every `interval` seconds until
    they all answer or `wait` seconds have passed (instances still booting, pods
    still starting).
    """
    pending = list(dict.fromkeys(hosts))
    deadline = time.monotonic() + wait
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, max(1, len(pending)))) as pool:
        while True:
            reasons = dict(zip(pending, pool.map(probe, pending)))
            failed = {host: why for host, why in reasons.items() if why is not None}
            if not failed or time.monotonic() + interval > deadline:
                return failed
            pending = list(failed)
            time.sleep(interval)


def unanswered_line(failed: dict[str, str], total: int, what: str) -> str:
    """One line naming every host that does not answer and why, in the order given: a
    job's log or sbatch's output file shows one line per problem. A reason's line breaks
    are folded too, so no probe's wording can split it."""
    hosts = ", ".join(f"{host} ({' '.join(why.split())})" for host, why in failed.items())
    return f"{len(failed)} of {total} hosts do not answer ({what}): {hosts}"
