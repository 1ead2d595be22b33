"""Emulated network links: rates in tc's units, the shaped namespace, and its errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hvdtrain.errors import ConfigError
from hvdtrain.cluster.links import burst_bytes, check_can_shape, parse_rate, shaped_command

BIN = os.path.dirname(sys.executable)


def _can_shape() -> str | None:
    """Why this machine cannot shape a link, or None."""
    try:
        check_can_shape("1gbit")
    except ConfigError as exc:
        return str(exc)
    return None


needs_shaping = pytest.mark.skipif(_can_shape() is not None,
                                   reason=f"cannot shape links here: {_can_shape()}")


@pytest.mark.parametrize("text, bits", [
    ("10gbit", 10 * 10**9), ("1gbit", 10**9), ("100mbit", 10**8), ("2.5gbit", 25 * 10**8),
    ("500kbit", 5 * 10**5), (" 25Gbit ", 25 * 10**9),
])
def test_rates_use_tcs_decimal_units(text, bits):
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["1gb", "fast", "0mbit", "-1gbit", "1 gbps", ""])
def test_a_bad_rate_is_one_line_naming_it(text):
    with pytest.raises(ConfigError, match=r"--link-rate must be a rate in tc's units .* got"):
        parse_rate(text)


def test_the_bucket_holds_one_millisecond_of_traffic_and_at_least_two_frames():
    assert burst_bytes(10**8) == 18_000            # two jumbo frames, not 1 ms (12.5 KB)
    assert burst_bytes(10**9) == 125_000
    assert burst_bytes(10 * 10**9) == 1_250_000


@needs_shaping
def test_a_shaped_command_runs_alone_with_a_shaped_loopback():
    shown = subprocess.run(shaped_command(["sh", "-c", "ip -o link; tc qdisc show dev lo"],
                                          "100mbit"), capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    links = [line for line in shown.stdout.splitlines() if ": <" in line]
    assert len(links) == 1 and links[0].split(":")[1].strip() == "lo"  # a private namespace
    assert "qdisc tbf" in shown.stdout and "rate 100Mbit" in shown.stdout
    assert "mtu 9000" in links[0]
    # The machine's own loopback is untouched.
    outside = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True)
    assert "rate 100Mbit" not in outside.stdout


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed")
def test_without_the_privilege_to_shape_bench_stops_with_one_line(tmp_path):
    # Dropped from the bounding set, the capabilities are gone after exec, even for root.
    result = subprocess.run(
        ["setpriv", "--bounding-set=-sys_admin,-net_admin", os.path.join(BIN, "hvdtrain"),
         "bench", "--link-rate", "1gbit", "--out", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"]))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdtrain: error: --link-rate 1gbit needs root")
    assert not (tmp_path / "b").exists()


@pytest.mark.multiprocess
@pytest.mark.long  # 13 s: a bench job over a shaped link, kept out of make test with the other benches
@needs_shaping
def test_a_short_bench_job_runs_over_a_shaped_link(tmp_path):
    out = tmp_path / "bench"
    result = subprocess.run(
        [os.path.join(BIN, "hvdtrain"), "bench", "--model", "lenet", "--workers", "2",
         "--modes", "sync,local", "--n-sync", "2", "--steps", "4", "--warmup-steps", "2",
         "--window", "2", "--link-rate", "1gbit", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"]))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    assert report["link_rate"] == "1gbit"
    # Local rows time training's own rounds: int8 unless told.
    assert [(r["workers"], r["label"]) for r in report["rows"]] == [(2, "sync"),
                                                                    (2, "local, n_sync 2, int8")]
    assert "link: 1gbit" in result.stdout


# Inside the shaped namespace: a TCP transfer of N bytes over its loopback, timed from
# before the sender starts to the last byte received.
_TRANSFER = """
import socket, sys, threading, time
size = int(sys.argv[1])
server = socket.create_server(("127.0.0.1", 0))
def send():
    with socket.create_connection(server.getsockname()) as out:
        out.sendall(bytes(size))
start, got = time.perf_counter(), 0
threading.Thread(target=send, daemon=True).start()
conn, _ = server.accept()
while got < size:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    got += len(chunk)
print(got, time.perf_counter() - start)
"""


@needs_shaping
def test_a_transfer_over_the_shaped_link_takes_at_least_what_its_rate_allows():
    # 2.5 MB at 100 Mbit/s: 0.2 s at the very least; unshaped, this loopback takes ~1 ms.
    size, rate = 2_500_000, "100mbit"
    result = subprocess.run(shaped_command([sys.executable, "-c", _TRANSFER, str(size)], rate),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    got, seconds = result.stdout.split()
    # The first full bucket passes at once; every other byte waits for its tokens.
    allowed = (size - burst_bytes(parse_rate(rate))) * 8 / parse_rate(rate)
    assert int(got) == size and float(seconds) >= allowed


def test_the_emulated_cluster_imports_nothing_from_the_benchmarks_that_use_it():
    import ast
    import pathlib

    import hvdtrain.cluster

    for path in pathlib.Path(hvdtrain.cluster.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            assert not any(m.startswith("hvdtrain.benchmarks") for m in modules), path.name
