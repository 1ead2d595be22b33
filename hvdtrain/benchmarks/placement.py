"""Where a bench or sweep runs its jobs: this machine (its loopback shaped or not), the
slots of a --hostfile, or an emulated cluster of --hosts with a NIC per worker."""

from __future__ import annotations

import argparse
import math
import os

from hvdtrain.benchmarks.launching import horovodrun_command, on_emulated_hosts
from hvdtrain.errors import ConfigError
from hvdtrain.cluster.links import check_link_options, over_link


def add_hosts_option(parser: argparse.ArgumentParser, what: str, more: str = "") -> None:
    parser.add_argument("--hosts", type=int, default=None, metavar="N",
                        help=f"run each {what} on an emulated cluster of N hosts (hvdtrain "
                             "cluster: root, sshd), one worker per host, each with its own NIC "
                             f"at --link-rate, launched over ssh{more} (default: all workers "
                             "on this machine)")
    parser.add_argument("--slots", type=int, default=1, metavar="S",
                        help="with --hosts: workers per emulated host, as GPUs per machine; a "
                             "job fills h1's slots first, and a host's workers share its NIC "
                             "(default: 1)")


def check_where(args, workers: list[int] | None) -> list[int] | None:
    """Where the jobs run (this machine, --hostfile or --hosts) checked in one line each;
    the worker counts, --hosts' own by default."""
    if args.hostfile and not os.path.isfile(args.hostfile):
        raise ConfigError(f"--hostfile not found: {args.hostfile}")
    slots = getattr(args, "slots", 1)
    if slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {slots}")
    if args.hosts is None:
        if slots != 1:
            raise ConfigError(f"--slots {slots} needs --hosts: it sets the workers per emulated host")
        check_link_options(args.link_rate, args.hostfile)
        return workers
    from hvdtrain.cluster.requirements import check_all
    from hvdtrain.cluster.topology import plan_hosts

    if args.hostfile:
        raise ConfigError(f"--hosts makes its own emulated hosts; it cannot also use --hostfile "
                          f"{args.hostfile}")
    plan_hosts(args.hosts, args.link_rate)  # a bad count or rate, in one line
    workers = workers or [args.hosts * slots]
    if max(workers) > args.hosts * slots:
        if slots == 1:
            raise ConfigError(f"--workers {max(workers)} needs as many hosts, one worker each; "
                              f"got --hosts {args.hosts}")
        raise ConfigError(f"--workers {max(workers)} needs {math.ceil(max(workers) / slots)} hosts "
                          f"of --slots {slots}; got --hosts {args.hosts}")
    check_all()
    return workers


def job_command(args, count: int, command: list[str]) -> list[str]:
    if args.hosts is not None:
        return on_emulated_hosts(count, command, args.hosts, args.link_rate,
                                 getattr(args, "slots", 1))
    return over_link(horovodrun_command(count, command, args.hostfile), args.link_rate)


def _shown(path: str) -> str:
    """`path` as bench.json, which may be committed, names it: relative to the folder the
    command ran in if it is inside it, else the file's name alone, never the machine's
    own folders (a launcher's hostfile is a temporary file)."""
    relative = os.path.relpath(os.path.abspath(path))
    outside = relative == os.pardir or relative.startswith(os.pardir + os.sep)
    return os.path.basename(path) if outside else relative


def topology(hosts: int | None, link_rate: str | None, hostfile: str | None = None,
             slots: int = 1) -> dict:
    """Where the workers ran and which link each one's traffic crossed, for bench.json
    and for predict --check: a NIC per host, or one loopback that all of them share.

    With several slots a host, a ring in rank order still sends one worker's share
    across each NIC (its other hops stay on the host), so a ring's hop per link is 1."""
    if hosts is not None:
        from hvdtrain.cluster.topology import describe, plan_hosts

        return {"kind": "emulated-hosts", "workers_per_link": 1, "slots": slots,
                "hosts": describe(plan_hosts(hosts, link_rate))}
    if hostfile:
        return {"kind": "hostfile", "hostfile": _shown(hostfile)}
    return {"kind": "shared-loopback" if link_rate else "this-machine",
            "workers_per_link": "all"}
