"""Host lists for horovodrun: Slurm node lists, plain lists, AWS JSON, the reachability check and the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from hvdtrain.machine.hosts import (
    Host,
    HostError,
    describe_instances_command,
    ec2_hosts,
    expand_nodelist,
    expand_tasks_per_node,
    format_host_arg,
    format_hostfile,
    parallelcluster_filters,
    parse_host_entries,
    slurm_hosts,
    total_slots,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")
sys.path.insert(0, LAUNCH)

from hostcheck import ssh_probe, tcp_probe, unanswered_line, unreachable

# --- Slurm node lists ---

@pytest.mark.parametrize("spec, expected", [
    ("login1", ["login1"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu-[1-2],login1", ["gpu-1", "gpu-2", "login1"]),
    ("node[08-10]", ["node08", "node09", "node10"]),       # zero padding kept
    ("node[8-10]", ["node8", "node9", "node10"]),          # and not invented
    ("n[001-3]", ["n001", "n002", "n003"]),                # width of the lower bound
    ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),  # several groups
    ("a[1-2],b[3],c", ["a1", "a2", "b3", "c"]),
    ("10.0.0.[9-11]", ["10.0.0.9", "10.0.0.10", "10.0.0.11"]),
    ("  node[1-2] ", ["node1", "node2"]),
])
def test_slurm_node_lists_expand_like_scontrol_show_hostnames(spec, expected):
    assert expand_nodelist(spec) == expected


@pytest.mark.parametrize("spec, message", [
    ("", "empty node list"),
    ("node[01-03", "malformed node list 'node[01-03': '[' is never closed"),
    ("node01-03]", "malformed node list 'node01-03]': ']' without '['"),
    ("node[[1-2]]", "malformed node list 'node[[1-2]]': nested '['"),
    ("node[]", "malformed node list 'node[]': empty brackets in 'node[]'"),
    ("node[3-1]", "malformed node list 'node[3-1]': range '3-1' runs backwards"),
    ("node[a-b]", "malformed node list 'node[a-b]': bad range 'a-b' in [a-b]"),
    ("node[1-2-3]", "malformed node list 'node[1-2-3]': bad range '1-2-3' in [1-2-3]"),
    ("a,,b", "malformed node list 'a,,b': empty entry between commas"),
    ("node 1", "invalid host name 'node 1' in 'node 1'"),
])
def test_malformed_node_lists_are_rejected_with_one_line_naming_them(spec, message):
    with pytest.raises(HostError) as err:
        expand_nodelist(spec)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_tasks_per_node_expands_slurm_repeat_syntax():
    assert expand_tasks_per_node("4(x2),3") == [4, 4, 3]
    assert expand_tasks_per_node("8") == [8]
    with pytest.raises(HostError, match=r"malformed SLURM_TASKS_PER_NODE '4\(2\)'"):
        expand_tasks_per_node("4(2)")


def test_slurm_slots_come_from_the_option_then_ntasks_then_tasks_per_node():
    nodes = "node[1-2]"
    assert slurm_hosts(nodes, slots=8, ntasks_per_node="2", tasks_per_node="1(x2)") == [
        Host("node1", 8), Host("node2", 8)]
    assert slurm_hosts(nodes, ntasks_per_node="2", tasks_per_node="1(x2)") == [
        Host("node1", 2), Host("node2", 2)]
    assert slurm_hosts(nodes, tasks_per_node="4,3") == [Host("node1", 4), Host("node2", 3)]


def test_a_job_asking_gpus_but_no_task_count_gets_a_worker_per_gpu_not_per_cpu():
    # sbatch --exclusive --gpus-per-node=8 on 96-CPU nodes: SLURM_TASKS_PER_NODE is 96(x2).
    nodes = "gpu[1-2]"
    assert slurm_hosts(nodes, tasks_per_node="96(x2)", gpus_per_node="8") == [
        Host("gpu1", 8), Host("gpu2", 8)]
    assert slurm_hosts(nodes, tasks_per_node="96(x2)", gpus_per_node="a100:4,v100:2") == [
        Host("gpu1", 6), Host("gpu2", 6)]
    # A task count the user asked for wins over the GPUs.
    assert slurm_hosts(nodes, ntasks_per_node="4", tasks_per_node="4(x2)",
                       gpus_per_node="8") == [Host("gpu1", 4), Host("gpu2", 4)]
    assert slurm_hosts(nodes, tasks_per_node="3,2", gpus_per_node="8", ntasks="5") == [
        Host("gpu1", 3), Host("gpu2", 2)]


def test_gpus_asked_with_gres_or_a_total_give_a_worker_per_gpu_of_the_node():
    # sbatch --exclusive --gres=gpu:8, or --gpus=16 on two nodes: no SLURM_GPUS_PER_NODE,
    # but Slurm sets SLURM_GPUS_ON_NODE either way.
    nodes = "gpu[1-2]"
    eight = [Host("gpu1", 8), Host("gpu2", 8)]
    assert slurm_hosts(nodes, tasks_per_node="96(x2)", gpus_on_node="8") == eight
    assert slurm_hosts(nodes, tasks_per_node="96(x2)", gpus_on_node="8", gpus="16") == eight
    assert slurm_hosts(nodes, tasks_per_node="96(x2)", gpus_on_node="8", gpus="h100:16") == eight
    # SLURM_GPUS_PER_NODE names every node's count: it wins; a task count wins over both.
    assert slurm_hosts(nodes, tasks_per_node="96(x2)", gpus_per_node="4",
                       gpus_on_node="8") == [Host("gpu1", 4), Host("gpu2", 4)]
    assert slurm_hosts(nodes, tasks_per_node="3,2", gpus_on_node="8", ntasks="5") == [
        Host("gpu1", 3), Host("gpu2", 2)]
    # No GPUs on the node is no GPUs asked: a worker per task (per CPU) as before.
    assert slurm_hosts(nodes, tasks_per_node="4(x2)", gpus_on_node="0") == [
        Host("gpu1", 4), Host("gpu2", 4)]


def test_a_gpu_total_the_nodes_do_not_share_evenly_is_one_line_naming_both_counts():
    # --gpus=12 on two 8-GPU nodes: the batch node has 8, the other 4.
    with pytest.raises(HostError) as err:
        slurm_hosts("gpu[1-2]", tasks_per_node="96(x2)", gpus_on_node="8", gpus="12")
    assert str(err.value) == ("SLURM_GPUS '12' is not SLURM_GPUS_ON_NODE '8' on each of the 2 "
                              "nodes: ask GPUs with --gpus-per-node, or pass --slots")
    with pytest.raises(HostError) as err:
        slurm_hosts("gpu[1-2]", tasks_per_node="96(x2)", gpus_on_node="eight")
    assert str(err.value) == "SLURM_GPUS_ON_NODE: slots must be a positive integer, got 'eight'"


@pytest.mark.parametrize("spec, message", [
    ("eight", "malformed SLURM_GPUS_PER_NODE 'eight': bad entry 'eight'"),
    ("a100:", "malformed SLURM_GPUS_PER_NODE 'a100:': bad entry 'a100:'"),
    ("a100:0", "SLURM_GPUS_PER_NODE 'a100:0': slots must be a positive integer, got 0"),
])
def test_a_bad_gpus_per_node_is_one_line_naming_it(spec, message):
    with pytest.raises(HostError) as err:
        slurm_hosts("gpu[1-2]", tasks_per_node="96(x2)", gpus_per_node=spec)
    assert str(err.value) == message


def test_slurm_errors_name_the_offending_value():
    with pytest.raises(HostError) as err:
        slurm_hosts("node[1-3]", tasks_per_node="4(x2)")
    assert str(err.value) == ("SLURM_TASKS_PER_NODE '4(x2)' describes 2 nodes but the node "
                              "list 'node[1-3]' has 3")
    with pytest.raises(HostError) as err:
        slurm_hosts("node[1-2]", slots=0)
    assert str(err.value) == "--slots: slots must be a positive integer, got 0"
    with pytest.raises(HostError) as err:
        slurm_hosts("node[1-2]")
    assert str(err.value).startswith("no slot count: pass --slots")
    with pytest.raises(HostError) as err:
        slurm_hosts("node[1-2],node2", slots=1)
    assert str(err.value) == "duplicate host 'node2' (listed 2 times)"


# --- plain lists and hostfiles ---

def test_plain_lists_accept_host_colon_slots_commas_spaces_and_hostfile_lines():
    lines = ["node1:4,node2", "node3  node4:2  # a comment", "", "# only a comment",
             "node5 slots=8", "node6 slots = 1"]
    assert parse_host_entries(lines, default_slots=3) == [
        Host("node1", 4), Host("node2", 3), Host("node3", 3), Host("node4", 2),
        Host("node5", 8), Host("node6", 1)]
    assert parse_host_entries(["a", "b"]) == [Host("a", 1), Host("b", 1)]


@pytest.mark.parametrize("lines, message", [
    ([], "no hosts given"),
    (["# nothing but comments"], "no hosts given"),
    (["node1:0"], "host 'node1': slots must be a positive integer, got 0"),
    (["node1:-2"], "host 'node1': slots must be a positive integer, got -2"),
    (["node1:four"], "host 'node1': slots must be a positive integer, got 'four'"),
    (["node1:"], "host 'node1': slots must be a positive integer, got ''"),
    (["node1 slots=0"], "host 'node1': slots must be a positive integer, got 0"),
    (["node1 max_slots=4"], "malformed host line 'node1 max_slots=4': expected 'host slots=N'"),
    (["node1", "node2", "NODE1:2"], "duplicate host 'node1' (listed 2 times)"),
    (["-node1"], "invalid host name '-node1' in '-node1'"),
])
def test_bad_host_lists_are_rejected_with_one_line_naming_the_value(lines, message):
    with pytest.raises(HostError) as err:
        parse_host_entries(lines)
    assert str(err.value) == message


def test_default_slots_must_be_positive():
    with pytest.raises(HostError) as err:
        parse_host_entries(["a"], default_slots=0)
    assert str(err.value) == "--slots: slots must be a positive integer, got 0"


def test_formats_round_trip_and_count_slots():
    hosts = [Host("node01", 8), Host("10.0.0.5", 4)]
    text = format_hostfile(hosts)
    assert text == "node01 slots=8\n10.0.0.5 slots=4\n"
    assert parse_host_entries(text.splitlines()) == hosts
    assert format_host_arg(hosts) == "node01:8,10.0.0.5:4"
    assert parse_host_entries([format_host_arg(hosts)]) == hosts
    assert total_slots(hosts) == 12


# --- AWS ---

def _instance(ip, kind="p4d.24xlarge", state="running", instance_id=None, dns=True):
    instance = {"InstanceId": instance_id or "i-" + ip.replace(".", ""), "InstanceType": kind,
                "State": {"Code": 16 if state == "running" else 80, "Name": state},
                "Placement": {"AvailabilityZone": "us-east-1a", "GroupName": "hvd-pg"},
                "Tags": [{"Key": "parallelcluster:node-type", "Value": "Compute"}]}
    if state != "terminated":
        instance["PrivateIpAddress"] = ip
        if dns:
            instance["PrivateDnsName"] = f"ip-{ip.replace('.', '-')}.ec2.internal"
    return instance


# What `aws ec2 describe-instances --output json` returns: instances grouped by reservation.
DESCRIBE_OUTPUT = {"Reservations": [
    {"ReservationId": "r-1", "Instances": [_instance("10.0.0.10"), _instance("10.0.0.9")]},
    {"ReservationId": "r-2", "Instances": [_instance("10.0.1.2", state="stopped"),
                                           _instance("10.0.1.3", state="terminated")]},
    {"ReservationId": "r-3", "Instances": [_instance("10.0.0.100")]},
]}


def test_ec2_json_gives_running_instances_with_one_slot_per_gpu_in_address_order():
    hosts = ec2_hosts(json.dumps(DESCRIBE_OUTPUT))
    assert hosts == [Host("10.0.0.9", 8), Host("10.0.0.10", 8), Host("10.0.0.100", 8)]


def test_ec2_slots_option_and_dns_names():
    hosts = ec2_hosts(DESCRIBE_OUTPUT, slots=2, address="private-dns")
    assert hosts == [Host("ip-10-0-0-10.ec2.internal", 2), Host("ip-10-0-0-100.ec2.internal", 2),
                     Host("ip-10-0-0-9.ec2.internal", 2)]


def test_ec2_gpu_counts_per_instance_type():
    output = {"Reservations": [{"Instances": [
        _instance("10.0.0.1", "p3.2xlarge"), _instance("10.0.0.2", "p3.8xlarge"),
        _instance("10.0.0.3", "p3dn.24xlarge"), _instance("10.0.0.4", "p5.48xlarge")]}]}
    assert [h.slots for h in ec2_hosts(output)] == [1, 4, 8, 8]


@pytest.mark.parametrize("output, message", [
    ({"Reservations": [{"Instances": [_instance("10.0.0.1", "m5.large", instance_id="i-abc")]}]},
     "instance i-abc is a m5.large, whose GPU count is not known here: pass --slots"),
    ({"Reservations": [{"Instances": [_instance("10.0.0.1", state="stopped")]}]},
     "no running instances matched"),
    ({"Reservations": []}, "no running instances matched"),
    ({"Instances": []}, "describe-instances output has no 'Reservations' list"),
    ({"Reservations": [{"Instances": [_instance("10.0.0.1", instance_id="i-x", dns=False)]}]},
     "instance i-x has no PrivateDnsName"),
])
def test_ec2_json_problems_are_one_line(output, message):
    with pytest.raises(HostError) as err:
        ec2_hosts(output, address="private-dns" if "Dns" in message else "private-ip")
    assert str(err.value) == message


def test_ec2_output_that_is_not_json_is_rejected():
    with pytest.raises(HostError, match="describe-instances output is not JSON"):
        ec2_hosts("An error occurred (UnauthorizedOperation)")


def test_describe_instances_command_filters_running_instances_by_tag():
    tags = parallelcluster_filters("mycluster", queue="gpu")
    assert describe_instances_command(tags, region="us-east-1") == [
        "aws", "ec2", "describe-instances", "--output", "json", "--filters",
        "Name=instance-state-name,Values=running",
        "Name=tag:parallelcluster:cluster-name,Values=mycluster",
        "Name=tag:parallelcluster:node-type,Values=Compute",
        "Name=tag:parallelcluster:queue-name,Values=gpu",
        "--region", "us-east-1"]
    with pytest.raises(HostError, match="no instance filter"):
        describe_instances_command({})


# --- the reachability check, against ports on 127.0.0.1 only ---

@pytest.fixture
def closed_port():
    """A port that is bound but not listening: connections are refused, and no one else can take it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


def test_tcp_check_passes_an_open_port_and_reports_a_closed_one(listening_port, closed_port):
    assert unreachable(["127.0.0.1"], tcp_probe(listening_port, timeout=1)) == {}
    failed = unreachable(["127.0.0.1", "localhost"], tcp_probe(closed_port, timeout=1))
    assert list(failed) == ["127.0.0.1", "localhost"]  # every failing host, in order
    assert "refused" in failed["127.0.0.1"].lower()


def test_tcp_check_reports_names_that_do_not_resolve():
    failed = unreachable(["no-such-host.invalid"], tcp_probe(22, timeout=1))
    assert failed == {"no-such-host.invalid": "name does not resolve"}


def test_wait_retries_until_a_late_host_answers():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    starts_listening = threading.Timer(0.3, sock.listen)
    starts_listening.start()
    try:
        assert unreachable(["127.0.0.1"], tcp_probe(port, timeout=1), wait=30, interval=0.1) == {}
    finally:
        starts_listening.cancel()
        sock.close()


def test_ssh_check_reports_a_host_it_cannot_log_in_to(closed_port):
    failed = unreachable(["127.0.0.1"], ssh_probe(closed_port, timeout=2))
    assert list(failed) == ["127.0.0.1"]
    assert "refused" in failed["127.0.0.1"] or "not installed" in failed["127.0.0.1"]


# --- the command line ---

def hostfile_cli(*args, env=None, stdin=None):
    return subprocess.run([sys.executable, os.path.join(LAUNCH, "hostfile.py"), *args], check=False,
                          capture_output=True, text=True, input=stdin, timeout=60,
                          env=env if env is not None else dict(os.environ))


def test_cli_prints_a_hostfile_the_h_value_or_the_process_count(tmp_path):
    assert hostfile_cli("list", "node1:4", "node2", "--slots", "2").stdout == (
        "node1 slots=4\nnode2 slots=2\n")
    assert hostfile_cli("list", "node1:4,node2:4", "--format", "H").stdout == "node1:4,node2:4\n"
    assert hostfile_cli("list", "node1:4", "node2:4", "--format", "np").stdout == "8\n"
    out = tmp_path / "hosts"
    result = hostfile_cli("list", "--file", "-", "-o", str(out), stdin="a slots=2\nb slots=2\n")
    assert result.returncode == 0 and result.stdout == ""
    assert out.read_text() == "a slots=2\nb slots=2\n"


def test_cli_reads_the_slurm_allocation_from_the_environment():
    env = dict(os.environ, SLURM_JOB_NODELIST="node[01-02],gpu-7", SLURM_TASKS_PER_NODE="8(x2),4")
    env.pop("SLURM_NTASKS_PER_NODE", None)
    result = hostfile_cli("slurm", "--format", "H", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "node01:8,node02:8,gpu-7:4\n"


def test_cli_gives_an_exclusive_gpu_job_a_worker_per_gpu():
    env = dict(os.environ, SLURM_JOB_NODELIST="gpu[1-2]", SLURM_TASKS_PER_NODE="96(x2)",
               SLURM_GPUS_PER_NODE="h100:8")
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_NTASKS"):
        env.pop(name, None)
    result = hostfile_cli("slurm", "--format", "np", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "16\n"


def test_cli_gives_a_gres_gpu_job_a_worker_per_gpu():
    # sbatch --exclusive --gres=gpu:8: SLURM_JOB_GPUS and SLURM_GPUS_ON_NODE, no GPUS_PER_NODE.
    env = dict(os.environ, SLURM_JOB_NODELIST="gpu[1-2]", SLURM_TASKS_PER_NODE="96(x2)",
               SLURM_JOB_GPUS="0,1,2,3,4,5,6,7", SLURM_GPUS_ON_NODE="8")
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_NTASKS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS"):
        env.pop(name, None)
    result = hostfile_cli("slurm", "--format", "H", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "gpu1:8,gpu2:8\n"


@pytest.mark.parametrize("args, message", [
    (["list"], "hostfile: error: no hosts given"),
    (["list", "a", "a"], "hostfile: error: duplicate host 'a' (listed 2 times)"),
    (["list", "a", "--slots", "0"], "hostfile: error: --slots: slots must be a positive integer, got 0"),
    (["slurm", "--nodelist", "node[01-03,07", "--slots", "1"],
     "hostfile: error: malformed node list 'node[01-03,07': '[' is never closed"),
    (["aws", "--tag", "Project"], "hostfile: error: malformed tag 'Project': expected KEY=VALUE"),
])
def test_cli_bad_input_is_one_line_and_exit_code_2(args, message):
    result = hostfile_cli(*args)
    assert result.returncode == 2
    assert result.stderr == message + "\n" and result.stdout == ""


def test_cli_without_a_slurm_allocation_says_so():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = hostfile_cli("slurm", "--slots", "1", env=env)
    assert result.returncode == 2
    assert result.stderr == ("hostfile: error: SLURM_JOB_NODELIST is not set: run inside a "
                             "Slurm allocation or pass --nodelist\n")


def test_cli_parses_saved_aws_json(tmp_path):
    saved = tmp_path / "instances.json"
    saved.write_text(json.dumps(DESCRIBE_OUTPUT))
    result = hostfile_cli("aws", "--json", str(saved))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "10.0.0.9 slots=8\n10.0.0.10 slots=8\n10.0.0.100 slots=8\n"


def test_cli_without_the_aws_cli_says_so_in_one_line(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # an empty folder: no `aws` anywhere
    result = hostfile_cli("aws", "--cluster", "mycluster", env=env)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("hostfile: error: the AWS CLI ('aws') is not installed")


def test_cli_check_reports_every_host_that_does_not_answer_in_one_line(listening_port, closed_port):
    ok = hostfile_cli("list", "127.0.0.1", "localhost", "--check", "tcp",
                      "--port", str(listening_port), "--timeout", "1")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "127.0.0.1 slots=1\nlocalhost slots=1\n"
    bad = hostfile_cli("list", "127.0.0.1", "localhost", "--check", "tcp",
                       "--port", str(closed_port), "--timeout", "1", "--format", "np")
    assert bad.returncode == 1 and bad.stdout == ""
    # One line (localhost's reason depends on which of its addresses refused last).
    assert bad.stderr.count("\n") == 1
    assert bad.stderr.startswith(f"hostfile: error: 2 of 2 hosts do not answer (tcp port {closed_port}): "
                                 f"127.0.0.1 (port {closed_port}: Connection refused), localhost (")


def test_hosts_that_do_not_answer_are_named_in_one_line_whatever_their_reasons_say():
    failed = {"node03": "port 22: Connection refused", "node04": "Permission denied\n (publickey)."}
    assert unanswered_line(failed, 4, "ssh -o BatchMode=yes") == (
        "2 of 4 hosts do not answer (ssh -o BatchMode=yes): "
        "node03 (port 22: Connection refused), node04 (Permission denied (publickey).)")
