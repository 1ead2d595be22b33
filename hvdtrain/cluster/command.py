"""`hvdtrain cluster`: options, the checks, and the step into the run's private namespaces."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys

from hvdtrain.cluster.cgroups import removed_after_the_run, run_parent
from hvdtrain.cluster.faults import FORMAT, parse_faults
from hvdtrain.cluster.requirements import check_all, check_image, check_slurm
from hvdtrain.cluster.topology import describe, host_names, plan_hosts
from hvdtrain.errors import ConfigError

PR_SET_PDEATHSIG = 1

DESCRIPTION = """\
Run COMMAND on an emulated cluster of --hosts hosts h1..hN on this machine, as on a
real one: each host is a private network namespace with one NIC, eth0, cabled to a
switch (a bridge), with an address in 198.18.0.0/15 (the range RFC 2544 sets aside for
benchmarking), its link shaped to --link-rate in each direction, an sshd that accepts
the run's own key, and an /etc/hosts entry. The hosts share the file system, as a
cluster's nodes share a home: the same venv and data paths work on every host.

COMMAND runs on h1 (the launcher's host), so `horovodrun -H h1:1,h2:1` starts the
other workers over ssh, exactly as on a cluster. Rehearse a hostfile, a Slurm-style
launch or the launch/ scripts here before renting one.

Everything lives in private network, mount and PID namespaces made for the run: no
packet leaves them, no file outside changes (/etc/hosts and /etc/ssh are replaced by
bind mounts only inside), and when COMMAND ends or is interrupted every process,
namespace and mount of the run ends with it. Needs root (CAP_NET_ADMIN and
CAP_SYS_ADMIN), ip and tc (iproute2), and sshd (openssh-server).

With --image, every host runs that image instead of the machine's file system: a podman
container in the host's network namespace, hostname hK, the image's own sshd on the
image's port (2222 for hvdtrain's images) with the run's key in /root/.ssh, and each
--volume folder at the same path. COMMAND then runs in h1's container, so the recipe of
docker/README.md is rehearsed as it is (horovodrun -p 2222). The run's containers live
in its own podman store on its private tmpfs, and go with it; images are only read."""

EXAMPLE = f"""\
examples:
  hvdtrain cluster --hosts 4 --link-rate 1gbit -- \\
      horovodrun -np 4 -H h1:1,h2:1,h3:1,h4:1 --gloo --network-interface eth0 \\
      hvdtrain train --epochs 1
  hvdtrain cluster --hosts 3 --link-rate 1gbit --host-rate h3=100mbit \\
      --fault "at=30s host=h3 action=down" --fault "at=60s host=h3 action=up" -- COMMAND...
  hvdtrain cluster --hosts 3 --fault "when=run/checkpoints/step-* host=h3 action=kill" \
      -- COMMAND...

--fault: {FORMAT!r}, times from the start of COMMAND, or once a file matching PATH
(* and ? allowed) exists, such as the job's first checkpoint or a file you touch;
down/up take h3's NIC down or bring it back (restarting its sshd if it died), kill
kills every process on h3, slow shapes its link to a new rate. The exit status is
COMMAND's.

  hvdtrain cluster --hosts 3 --slots 2 --slurm -- \\
      sbatch --wait launch/slurm/train.sbatch --epochs 1

--slurm: munged and slurmctld on h1 and slurmd on every host (Debian's slurm-wlm and
munge), with a slurm.conf naming h1..hN with --slots CPUs each, all on the run's tmpfs;
COMMAND then submits, queues and allocates as on a real cluster.

  make image      # hvdtrain:cpu, from docker/Dockerfile.cpu
  hvdtrain cluster --hosts 2 --image hvdtrain:cpu --volume $PWD/shared -- \
      horovodrun -np 2 -H h1:1,h2:1 -p 2222 --gloo \
      hvdtrain train --epochs 1 --out $PWD/shared/run"""


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "cluster", help="run a command on an emulated cluster of hosts with their own NICs (root)",
        description=DESCRIPTION, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2, help="number of hosts h1..hN (default: 2)")
    parser.add_argument("--link-rate", default=None, metavar="RATE",
                        help="every host's link rate in tc units, e.g. 1gbit, 100mbit "
                             "(default: unshaped)")
    parser.add_argument("--host-rate", action="append", default=[], metavar="hK=RATE",
                        help="one host's own link rate, e.g. h3=100mbit (repeatable)")
    parser.add_argument("--fault", action="append", default=[], metavar="SPEC",
                        help=f"a host fault during the run: {FORMAT!r} (repeatable)")
    parser.add_argument("--nic-counters", default=None, metavar="FILE.json",
                        help="write the bytes each host's eth0 sent and received while "
                             "COMMAND ran")
    parser.add_argument("--image", default=None, metavar="IMAGE",
                        help="every host runs this image (podman), e.g. hvdtrain:cpu from "
                             "`make image`; COMMAND runs in h1's container (default: the "
                             "hosts share this machine's file system)")
    parser.add_argument("--volume", action="append", default=[], metavar="DIR",
                        help="with --image: bind this folder at the same path in every "
                             "host's container, as docker run -v DIR:DIR (repeatable); put "
                             "run folders there to keep them after the run")
    parser.add_argument("--slurm", action="store_true",
                        help="run Slurm on the hosts: munged and slurmctld on h1, slurmd on "
                             "every host, so COMMAND can sbatch, srun and squeue (Debian's "
                             "slurm-wlm and munge)")
    parser.add_argument("--slots", type=int, default=None, metavar="S",
                        help="with --slurm: the CPUs (task slots) each host offers Slurm "
                             "(default: 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="what to run on h1")
    parser.set_defaults(handler=run)


def make_spec(args: argparse.Namespace, tools: dict[str, str], image: dict | None = None) -> dict:
    """Everything the supervisor inside the namespaces needs, as JSON-ready data."""
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    if not command:
        raise ConfigError("hvdtrain cluster needs a command to run on h1, after --")
    hosts = plan_hosts(args.hosts, args.link_rate, args.host_rate)
    faults = parse_faults(args.fault, host_names(args.hosts))
    if args.volume and not args.image:
        raise ConfigError("--volume needs --image: without it the hosts share this machine's "
                          f"file system already (got --volume {args.volume[0]})")
    return {"hosts": describe(hosts), "command": command, "tools": tools,
            "faults": [vars(f) for f in faults],
            "nic_counters": os.path.abspath(args.nic_counters) if args.nic_counters else None,
            "image": image, "slurm": slurm_spec(args)}


def slurm_spec(args: argparse.Namespace) -> dict | None:
    """{"slots": S} for --slurm, after checking the options that go with it."""
    if args.slots is not None and not args.slurm:
        raise ConfigError(f"--slots needs --slurm: it is what each host offers Slurm "
                          f"(got --slots {args.slots})")
    if not args.slurm:
        return None
    if args.image:
        raise ConfigError(f"--slurm runs this machine's Slurm daemons on the hosts, not in "
                          f"containers: leave out --image {args.image}")
    slots = 1 if args.slots is None else args.slots
    if slots < 1:
        raise ConfigError(f"--slots must be a positive integer, got {slots}")
    return {"slots": slots}


def namespace_command(spec: dict) -> list[str]:
    """unshare's --kill-child ends PID 1, and so the whole run, if unshare itself is killed."""
    return [spec["tools"]["unshare"], "--net", "--mount", "--pid", "--fork", "--kill-child",
            "--mount-proc", "--propagation", "private", "--",
            sys.executable, "-m", "hvdtrain.cluster.supervisor", json.dumps(spec)]


def _die_with_parent() -> None:
    """In unshare, before it starts: SIGKILL when this process dies, even by SIGKILL, and
    with unshare (--kill-child) PID 1 of the run, and with PID 1 everything in it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _init_of(unshare_pid: int) -> int | None:
    """PID 1 of the run, as this PID namespace numbers it: unshare's only child."""
    try:
        with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children", encoding="utf-8") as fh:
            children = fh.read().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _image(args: argparse.Namespace) -> dict | None:
    """The image's spec; under runc with a cgroup parent of the run's own (cgroups.py)."""
    if not args.image:
        return None
    image = check_image(args.image, args.volume)
    if image["runtime"] == "runc":
        image["cgroup_parent"] = run_parent()
    return image


def run(args: argparse.Namespace) -> int:
    make_spec(args, {"unshare": "unshare"})  # check the options before the machine
    tools = check_all()
    if args.slurm:
        tools.update(check_slurm())
    spec = make_spec(args, tools, _image(args))
    with removed_after_the_run((spec["image"] or {}).get("cgroup_parent")):
        return _run_in_namespaces(spec)


def _run_in_namespaces(spec: dict) -> int:
    proc = subprocess.Popen(namespace_command(spec), preexec_fn=_die_with_parent)

    # unshare blocks SIGINT and SIGTERM while it waits, so they go to the run's PID 1,
    # which passes them to the command and ends everything after a grace period.
    def forward(signum, _frame):
        init = _init_of(proc.pid)
        if init is not None:
            os.kill(init, signum)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    return proc.wait()
