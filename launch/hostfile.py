#!/usr/bin/env python3
"""Build a horovodrun host list from a plain list, a Slurm allocation or AWS, and check it.

  launch/hostfile.py list node1:4 node2:4                 # or --file hosts.txt, --slots 4
  launch/hostfile.py slurm --check tcp -o hosts.txt       # inside sbatch/salloc
  launch/hostfile.py aws --cluster mycluster --format H   # AWS ParallelCluster compute nodes
  launch/hostfile.py aws --tag Project=hvdtrain --slots 8 # EC2 instances by tag

Prints `host slots=N` lines (--format hostfile, for horovodrun -hostfile), the -H
value (--format H) or the total number of slots (--format np). Exit codes: 0 ok,
2 bad input (one line naming the value), 1 hosts that do not answer or an AWS failure.
Needs only Python 3.8+ and this checkout: no TensorFlow, no Horovod.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Runs from a checkout with the system python3 (a login node, a Slurm batch script),
# so find hvdtrain next to this folder rather than requiring it to be installed.
sys.path.insert(0, os.path.dirname(HERE))

from hostcheck import ssh_probe, tcp_probe, unanswered_line, unreachable

from hvdtrain.machine import hosts as H

PROG = "hostfile"


class Failure(Exception):
    """Something outside our input went wrong (AWS CLI, unreachable hosts): exit 1."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    out = common.add_argument_group("output and check")
    out.add_argument("--format", choices=["hostfile", "H", "np", "discovery"], default="hostfile",
                     help="hostfile: 'host slots=N' lines; H: the horovodrun -H value; "
                          "np: the total number of slots; discovery: 'host:N' lines, as "
                          "an elastic job's host-discovery script prints (default: hostfile)")
    out.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    out.add_argument("--check", choices=["none", "tcp", "ssh"], default="none",
                     help="before printing, check that every host answers: tcp connects "
                          "to the ssh port, ssh logs in with BatchMode (default: none)")
    out.add_argument("--port", type=int, default=None,
                     help="ssh port to check (default: 22 for tcp, ssh's own for ssh)")
    out.add_argument("--timeout", type=float, default=3.0,
                     help="seconds to wait for each host (default: 3)")
    out.add_argument("--answering", action="store_true",
                     help="with --check: list only the hosts that answer instead of failing "
                          "(a discovery script, launch/discover/)")
    out.add_argument("--wait", type=float, default=0.0,
                     help="keep re-checking hosts that fail for up to this many seconds "
                          "(instances or pods still starting; default: 0)")

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sources = parser.add_subparsers(dest="source", metavar="SOURCE", required=True)

    plain = sources.add_parser("list", parents=[common], help="hosts given here or in a file")
    plain.add_argument("hosts", nargs="*", metavar="HOST[:SLOTS]")
    plain.add_argument("--file", metavar="FILE",
                       help="one host per line: 'host', 'host:N' or 'host slots=N' ('-': stdin)")
    plain.add_argument("--slots", default=None, help="slots of a host given without a count (default: 1)")

    slurm = sources.add_parser("slurm", parents=[common], help="the current Slurm allocation")
    slurm.add_argument("--nodelist", default=None,
                       help="Slurm node list (default: $SLURM_JOB_NODELIST)")
    slurm.add_argument("--slots", default=None,
                       help="slots per node (default: $SLURM_NTASKS_PER_NODE; else, if "
                            "the job asked GPUs but no task count, $SLURM_GPUS_PER_NODE, or "
                            "$SLURM_GPUS_ON_NODE (--gres=gpu:N, --gpus=N); "
                            "else $SLURM_TASKS_PER_NODE)")
    slurm.add_argument("--responding", action="store_true",
                       help="only the nodes sinfo reports usable (allocated, mixed or idle; "
                            "not down, drained or not responding)")

    aws = sources.add_parser("aws", parents=[common],
                             help="running EC2 instances, by tag or ParallelCluster name")
    aws.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                     help="instances carrying this tag (repeatable: all must match)")
    aws.add_argument("--cluster", help="compute nodes of this AWS ParallelCluster")
    aws.add_argument("--queue", help="with --cluster: only this Slurm queue")
    aws.add_argument("--region", help="AWS region (default: the AWS CLI's)")
    aws.add_argument("--address", choices=sorted(H.ADDRESS_FIELDS), default="private-ip",
                     help="how hosts are named (default: private-ip)")
    aws.add_argument("--slots", default=None,
                     help="workers per instance (default: its GPU count, known for p3, p4d, p5)")
    aws.add_argument("--json", metavar="FILE",
                     help="read saved 'aws ec2 describe-instances --output json' output "
                          "instead of calling the AWS CLI ('-': stdin)")
    return parser


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise H.HostError(f"cannot read {path!r}: {exc.strerror}") from None


def hosts_from_list(args) -> list[H.Host]:
    lines = list(args.hosts)
    if args.file:
        lines += _read(args.file).splitlines()
    return H.parse_host_entries(lines, args.slots)


def hosts_from_slurm(args) -> list[H.Host]:
    nodelist = args.nodelist or os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise H.HostError("SLURM_JOB_NODELIST is not set: run inside a Slurm allocation or pass --nodelist")
    env = os.environ.get
    hosts = H.slurm_hosts(nodelist, args.slots, env("SLURM_NTASKS_PER_NODE"),
                          env("SLURM_TASKS_PER_NODE"), env("SLURM_GPUS_PER_NODE"),
                          env("SLURM_NTASKS"), gpus_on_node=env("SLURM_GPUS_ON_NODE"),
                          gpus=env("SLURM_GPUS"))
    return responding(hosts, nodelist) if args.responding else hosts


def responding(hosts: list[H.Host], nodelist: str) -> list[H.Host]:
    """The hosts whose node slurmctld reports usable now (sinfo asks it)."""
    if shutil.which("sinfo") is None:
        raise Failure("--responding needs Slurm's sinfo, which is not on PATH")
    result = subprocess.run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N %t"], check=False,
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [f"exit code {result.returncode}"]
        raise Failure(f"sinfo failed: {lines[-1]}")
    return H.usable_slurm_hosts(hosts, result.stdout)


def hosts_from_aws(args) -> list[H.Host]:
    if args.json:
        return H.ec2_hosts(_read(args.json), args.slots, args.address)
    tags = dict(H.parse_tag(t) for t in args.tag)
    if args.cluster:
        tags.update(H.parallelcluster_filters(args.cluster, args.queue))
    command = H.describe_instances_command(tags, args.region)
    if shutil.which("aws") is None:
        raise Failure("the AWS CLI ('aws') is not installed: install it, or pass --json FILE "
                      "with the output of 'aws ec2 describe-instances --output json'")
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise Failure("aws ec2 describe-instances did not answer within 120 s") from None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [f"exit code {result.returncode}"]
        raise Failure(f"aws ec2 describe-instances failed: {lines[-1]}")
    return H.ec2_hosts(result.stdout, args.slots, args.address)


SOURCES = {"list": hosts_from_list, "slurm": hosts_from_slurm, "aws": hosts_from_aws}


def check(hosts: list[H.Host], args) -> list[H.Host]:
    """The hosts, once every one answers; with --answering, the ones that answer."""
    if args.check == "none":
        return hosts
    if args.timeout <= 0:
        raise H.HostError(f"--timeout must be positive, got {args.timeout:g}")
    if args.check == "tcp":
        port = args.port or 22
        probe, what = tcp_probe(port, args.timeout), f"tcp port {port}"
    else:
        probe, what = ssh_probe(args.port, args.timeout), "ssh -o BatchMode=yes"
    failed = unreachable([h.name for h in hosts], probe, wait=args.wait)
    if args.answering:
        return [h for h in hosts if h.name not in failed]
    if failed:
        raise Failure(unanswered_line(failed, len(hosts), what))
    return hosts


def render(hosts: list[H.Host], fmt: str) -> str:
    if fmt == "H":
        return H.format_host_arg(hosts) + "\n"
    if fmt == "np":
        return f"{H.total_slots(hosts)}\n"
    if fmt == "discovery":
        return H.format_discovery(hosts)
    return H.format_hostfile(hosts)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        hosts = SOURCES[args.source](args)
        hosts = check(hosts, args)
    except H.HostError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Failure as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    text = render(hosts, args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
