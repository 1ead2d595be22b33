"""The ring-allreduce cost model: known cases, and the predict command on a bench file."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from hvdtrain.cli import main
from hvdtrain.benchmarks.predict import workload
from hvdtrain.benchmarks.round_form import RoundForm
from hvdtrain.benchmarks.costmodel import (Hierarchy, Link, Workload, exchange_seconds, floor_of_whole_payload,
                                predict, ring_allreduce_seconds, step_seconds)

GBIT = 10**9


def test_two_workers_sharing_one_gigabit_link_send_the_payload_twice():
    # Issue 17's measurement: one exchange of AlexNet-64's 80.8 MB took 1.39 s at 1 Gbit/s.
    link = Link(GBIT, latency=0.0, workers_per_link=2)
    assert ring_allreduce_seconds(80.8e6, 2, link) == pytest.approx(80.8e6 * 8 / GBIT * 2)


def test_a_ring_sends_two_n_minus_one_over_n_of_the_payload_in_two_n_minus_one_messages():
    link = Link(8e9, latency=1e-5)  # one gigabyte per second
    assert ring_allreduce_seconds(1e9, 4, link) == pytest.approx(6 * 1e-5 + 1.5)
    # Many workers: bandwidth cost tends to twice the payload, latency grows linearly.
    assert ring_allreduce_seconds(1e9, 512, Link(8e9, 0.0)) == pytest.approx(2 * 511 / 512)
    assert ring_allreduce_seconds(1e9, 1, link) == 0.0


def test_local_sgd_pays_one_exchange_every_n_sync_steps():
    work = Workload(compute_seconds=1.0, gradient_bytes=1e9, state_bytes=1e9, batch_per_worker=32)
    link = Link(8e9, latency=0.0)
    exchange = ring_allreduce_seconds(1e9, 2, link)
    assert step_seconds(work, "local", 2, link, n_sync=10) == pytest.approx(1.0 + exchange / 10)
    assert step_seconds(work, "independent", 2, link) == 1.0
    assert step_seconds(work, "sync", 2, link) == pytest.approx(1.0 + exchange)


def test_async_waits_only_for_what_the_steps_between_rounds_do_not_cover():
    work = Workload(compute_seconds=1.0, gradient_bytes=1e9, state_bytes=1e9, batch_per_worker=32)
    link = Link(8e9, latency=0.0)  # one exchange: 1 s on 2 workers
    assert step_seconds(work, "async", 2, link, n_sync=10) == 1.0  # hidden
    slow = Link(8e8, latency=0.0)  # 10 s: 10 steps cover all of it
    assert step_seconds(work, "async", 2, slow, n_sync=10) == 1.0
    slower = Link(4e8, latency=0.0)  # 20 s: wait 10 s every 10 steps
    assert step_seconds(work, "async", 2, slower, n_sync=10) == pytest.approx(2.0)
    assert step_seconds(work, "local", 2, slower, n_sync=10) == pytest.approx(3.0)


def test_sync_hides_communication_behind_back_propagation_but_not_the_last_bucket():
    link = Link(8e9, latency=0.0)  # 1e9 bytes on 2 workers: 1 s
    hidden = Workload(1.0, 1e9, 1e9, 32, bucket_bytes=1e8, overlap=0.6)
    # 1 s of communication, 0.6 s of it behind the step; at least the last 0.1 s shows.
    assert step_seconds(hidden, "sync", 2, link) == pytest.approx(1.4)
    fully = Workload(10.0, 1e9, 1e9, 32, bucket_bytes=1e8, overlap=0.6)
    assert step_seconds(fully, "sync", 2, link) == pytest.approx(10.1)


def test_no_link_makes_an_exchange_faster_than_the_hosts_floor():
    fast, slow = Link(8e12, latency=0.0), Link(8e6, latency=0.0)  # 1 TB/s and 1 MB/s
    assert exchange_seconds(1e6, 0.04, 2, fast) == pytest.approx(0.02)  # F = 0.04 s: see below
    assert exchange_seconds(1e6, 0.04, 2, slow) == pytest.approx(1.0)  # the link dominates
    # The floor grows with the share (N - 1)/N of the payload each worker handles; F is
    # kept for the whole payload: 0.02 s measured on 2 workers is F = 0.04 s.
    assert floor_of_whole_payload(0.02, 2) == pytest.approx(0.04)
    assert exchange_seconds(1e6, 0.04, 8, fast) == pytest.approx(0.04 * 7 / 8)
    assert exchange_seconds(1e6, 0.04, 1, fast) == 0.0


def test_sync_adds_its_extra_compute_and_the_floored_exchange():
    work = Workload(0.1, 1e6, 1e6, 32, gradient_floor=0.04, state_floor=0.1, sync_extra=0.01)
    fast = Link(8e12, latency=0.0)
    assert step_seconds(work, "sync", 2, fast) == pytest.approx(0.1 + 0.01 + 0.02)
    assert step_seconds(work, "local", 2, fast, n_sync=10) == pytest.approx(0.1 + 0.005)
    assert step_seconds(work, "independent", 2, fast) == 0.1


def test_prediction_reports_images_efficiency_and_communication_share():
    work = Workload(0.5, 1e9, 1e9, 64)
    p = predict(work, "sync", 4, Link(8e9, latency=0.0))
    assert p.images_per_sec == pytest.approx(4 * 64 / 2.0)
    assert (p.efficiency, p.communication_share) == pytest.approx((0.25, 0.75))


def test_sync_modes_extra_compute_counts_against_efficiency_but_not_as_waiting():
    # 0.5 s compute + 0.25 s of sync's own gradient path + 1.5 s of exchange.
    work = Workload(0.5, 1e9, 1e9, 64, sync_extra=0.25)
    p = predict(work, "sync", 4, Link(8e9, latency=0.0))
    assert p.efficiency == pytest.approx(0.5 / 2.25)
    assert p.communication_share == pytest.approx(1.5 / 2.25)


def test_the_last_bucket_is_the_remainder_the_first_layers_fill_not_a_whole_cap():
    link = Link(8e9, latency=0.0)  # 1e9 bytes on 2 workers: 1 s
    # Buckets of 400 MB over 1 GB: 400 + 400 + a last one of 200 MB (0.2 s).
    known = Workload(10.0, 1e9, 1e9, 32, bucket_bytes=4e8, overlap=0.6, last_bucket_bytes=2e8)
    assert step_seconds(known, "sync", 2, link) == pytest.approx(10.2)
    unknown = replace(known, last_bucket_bytes=None)  # bounded by the cap
    assert step_seconds(unknown, "sync", 2, link) == pytest.approx(10.4)
    # Overlap 0 hides nothing: the last bucket does not change the step.
    assert step_seconds(replace(known, overlap=0.0), "sync", 2, link) == pytest.approx(11.0)
    assert step_seconds(replace(unknown, overlap=0.0), "sync", 2, link) == pytest.approx(11.0)


def _bench(tmp_path, link_rate=None, compute=0.4, exchanges=(None, None), groups=None):
    rows = [dict(model="alexnet", mode=mode, label=label, n_sync=n, workers=2, step_seconds=s,
                 bytes_per_step=b, parameters=1_000_000, batch_per_worker=32, bucket_mb=25.0,
                 fp16_allreduce=False, total_images_per_sec=64 / s, total_ci95=1.0,
                 seconds_per_exchange=e, gradient_group_bytes=groups)
            for mode, label, n, s, b, e in (
                ("sync", "sync", None, compute + 0.2, 4e6, exchanges[0]),
                ("local", "local, n_sync 10", 10, compute + 0.05, 4e5, exchanges[1]),
                ("independent", "independent", None, compute, 0.0, None))]
    path = tmp_path / f"bench-{link_rate}.json"
    path.write_text(json.dumps({"rows": rows, "link_rate": link_rate}))
    return str(path)


def test_predict_writes_tables_and_a_plot_from_a_bench_file(tmp_path, capsys):
    out = tmp_path / "predict"
    assert main(["predict", _bench(tmp_path), "--workers", "2,8", "--link-rate", "1gbit",
                 "--latency", "0", "--out", str(out)]) == 0
    report = json.loads((out / "predict.json").read_text())
    rows = {(r["mode"], r["workers"]): r for r in report["rows"]}
    assert set(rows) == {(m, w) for m in ("sync", "local", "independent") for w in (2, 8)}
    # 4 MB of gradients on 2 workers at 1 Gbit/s: 32 ms after 0.4 s of compute.
    assert rows[("sync", 2)]["images_per_sec"] == pytest.approx(64 / (0.4 + 4e6 * 8 / GBIT))
    assert rows[("independent", 8)]["images_per_sec"] == pytest.approx(8 * 32 / 0.4)
    assert (out / "predict.png").stat().st_size > 1000 and (out / "predict.csv").exists()
    assert "| 1gbit | local n_sync 10 | 8 |" in capsys.readouterr().out


def test_checks_compare_emulated_benches_with_the_shared_link_prediction(tmp_path, capsys):
    assert main(["predict", _bench(tmp_path), "--check", _bench(tmp_path, "100mbit"),
                 "--latency", "0", "--out", str(tmp_path / "p")]) == 0
    checks = json.loads((tmp_path / "p" / "predict.json").read_text())["checks"]
    sync = next(c for c in checks if c["label"] == "sync")
    predicted = 64 / (0.4 + 4e6 * 8 / 1e8 * 2)  # both workers' traffic on one 100 Mbit link
    assert sync["predicted"] == pytest.approx(predicted)
    assert sync["error"] == pytest.approx(predicted / (64 / 0.6) - 1)


def test_checks_of_a_bench_on_emulated_hosts_give_each_worker_a_link_of_its_own(tmp_path):
    shaped = json.loads(open(_bench(tmp_path, "100mbit")).read())
    shaped["topology"] = {"kind": "emulated-hosts", "workers_per_link": 1,
                          "hosts": [{"name": "h1"}, {"name": "h2"}]}
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(shaped))
    assert main(["predict", _bench(tmp_path), "--check", str(path), "--latency", "0",
                 "--out", str(tmp_path / "p")]) == 0
    sync = json.loads((tmp_path / "p" / "predict.json").read_text())["checks"][0]
    assert sync["predicted"] == pytest.approx(64 / (0.4 + 4e6 * 8 / 1e8))  # a NIC each


def test_an_unshaped_bench_gives_the_floor_and_a_shaped_one_does_not(tmp_path):
    unshaped = json.loads(open(_bench(tmp_path, exchanges=(0.15, 0.3))).read())
    work = workload(unshaped, overlap=0.0)
    # Measured on 2 workers, kept for the whole payload: twice the time.
    assert (work.gradient_floor, work.state_floor) == pytest.approx((0.3, 0.6))
    assert work.sync_extra == pytest.approx(0.6 - 0.4 - 0.15)  # beyond compute and exchange
    bare = workload(unshaped, overlap=0.0, floor=False)
    assert (bare.gradient_floor, bare.state_floor, bare.sync_extra) == (0.0, 0.0, 0.0)
    shaped = json.loads(open(_bench(tmp_path, "1gbit", exchanges=(0.15, 0.3))).read())
    assert workload(shaped, overlap=0.0).gradient_floor == 0.0


def test_checks_take_the_compute_of_the_checked_bench_itself(tmp_path):
    # The machine ran 25% slower during the shaped bench; its own independent rows say so.
    assert main(["predict", _bench(tmp_path), "--check",
                 _bench(tmp_path, "100mbit", compute=0.5), "--latency", "0",
                 "--out", str(tmp_path / "p")]) == 0
    checks = json.loads((tmp_path / "p" / "predict.json").read_text())["checks"]
    assert [c["label"] for c in checks] == ["sync", "local, n_sync 10"]
    assert checks[0]["predicted"] == pytest.approx(64 / (0.5 + 4e6 * 8 / 1e8 * 2))


def test_a_bench_without_independent_workers_or_link_is_refused_in_one_line(tmp_path, capsys):
    bench = json.loads(open(_bench(tmp_path)).read())
    bench["rows"] = bench["rows"][:2]
    path = tmp_path / "no-independent.json"
    path.write_text(json.dumps(bench))
    assert main(["predict", str(path)]) != 0
    assert main(["predict", _bench(tmp_path), "--check", _bench(tmp_path)]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line]
    assert errors == [
        "hvdtrain: error: predict needs a bench with an independent row (--modes ...,independent)",
        "hvdtrain: error: --check takes benches run with --link-rate; this one has no link_rate"]


def _rewritten(tmp_path, name, bench_path, **changes):
    """The bench at `bench_path` with `changes(row) -> dict` applied to each row, saved as
    `name`."""
    bench = json.loads(open(bench_path).read())
    bench["rows"] = [dict(row, **{k: f(row) for k, f in changes.items()}) for row in bench["rows"]]
    path = tmp_path / name
    path.write_text(json.dumps(bench))
    return str(path)


def test_predict_refuses_a_bench_whose_rows_timed_two_optimizers_in_one_line(tmp_path, capsys):
    # auto took SGD for the independent rows and LAMB for the sync row at 16 x 64.
    mixed = _rewritten(tmp_path, "mixed.json", _bench(tmp_path),
                       optimizer=lambda r: "lamb" if r["mode"] == "sync" else "sgd")
    assert main(["predict", mixed, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hvdtrain: error: {mixed} holds rows of --optimizer lamb and sgd: predict "
                   f"from a bench of one optimizer (`hvdtrain bench --optimizer`)")
    assert not (tmp_path / "p").exists()


def test_predict_refuses_a_check_bench_of_another_optimizer(tmp_path, capsys):
    lamb = _rewritten(tmp_path, "lamb.json", _bench(tmp_path, "100mbit"),
                      optimizer=lambda r: "lamb")
    assert main(["predict", _bench(tmp_path), "--check", lamb, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hvdtrain: error: --check {lamb} timed --optimizer lamb and "
                   f"{_bench(tmp_path)} --optimizer sgd: check a bench of the same optimizer")


def test_rows_without_an_optimizer_are_sgd_below_lambs_global_batch_else_refused(tmp_path,
                                                                               capsys):
    # Benches from before rows recorded it ran --optimizer auto: SGD at 2 x 32 in every
    # version, so predict goes on and says so in predict.json...
    assert main(["predict", _bench(tmp_path), "--out", str(tmp_path / "p")]) == 0
    assert json.loads((tmp_path / "p" / "predict.json").read_text())["optimizer"] == "sgd"
    # ...but at 16 x 64 auto took LAMB in sync mode (since it exists), so it is unknown.
    large = _rewritten(tmp_path, "large.json", _bench(tmp_path), workers=lambda r: 16,
                       batch_per_worker=lambda r: 64)
    capsys.readouterr()
    assert main(["predict", large, "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hvdtrain: error: {large}: its sync row at 16 x 64 does not say "
                          f"which optimizer it timed") and len(err.splitlines()) == 1
    # Rows that record one are taken as they say, at any size.
    recorded = _rewritten(tmp_path, "recorded.json", large, optimizer=lambda r: "sgd")
    assert main(["predict", recorded, "--out", str(tmp_path / "r")]) == 0


def test_floors_of_benches_on_different_worker_counts_average_like_with_like(tmp_path):
    bench = json.loads(open(_bench(tmp_path, exchanges=(0.15, 0.3))).read())
    # The same hosts on 4 workers: each worker handles 3/4 of the payload, not 1/2.
    bench["rows"] += [dict(row, workers=4, seconds_per_exchange=row["seconds_per_exchange"] * 1.5)
                      for row in bench["rows"] if row["seconds_per_exchange"]]
    work = workload(bench, overlap=0.0)
    assert (work.gradient_floor, work.state_floor) == pytest.approx((0.3, 0.6))


def test_sync_extra_compute_is_derived_with_the_overlap_it_will_predict_with(tmp_path):
    # An unshaped bench: independent 0.4 s, sync 0.6 s, of which a 0.15 s exchange.
    unshaped = json.loads(open(_bench(tmp_path, exchanges=(0.15, 0.3), groups=[3e6, 1e6])).read())
    unlimited = Link(math.inf, latency=0.0)
    for overlap in (0.0, 0.2, 0.5):
        work = workload(unshaped, overlap=overlap)
        assert work.last_bucket_bytes == 1e6
        # Predicting the bench's own conditions gives back its measured sync step.
        assert step_seconds(work, "sync", 2, unlimited) == pytest.approx(0.6)
    # With half the step able to hide the exchange, only the last group (1 of 4 MB) shows.
    assert workload(unshaped, overlap=0.5).sync_extra == pytest.approx(0.6 - 0.4 - 0.15 / 4)


def test_each_local_mode_is_predicted_with_the_state_its_own_rounds_carried(tmp_path):
    # Local mode averaged the momentum too (8e6 bytes a round, 0.4 s), async mode the
    # weights alone (4e6, 0.2 s): the bench measured each with its resolved defaults.
    bench = json.loads(open(_bench(tmp_path, exchanges=(0.15, 0.4))).read())
    local = next(r for r in bench["rows"] if r["mode"] == "local")
    local["bytes_per_step"] = 8e5
    bench["rows"].append(dict(local, mode="async", label="async, n_sync 10",
                              bytes_per_step=4e5, seconds_per_exchange=0.2))
    path = tmp_path / "modes.json"
    path.write_text(json.dumps(bench))
    by_mode = {mode: workload(bench, overlap=0.0, mode=mode) for mode in ("local", "async")}
    assert (by_mode["local"].state_bytes, by_mode["async"].state_bytes) == (8e6, 4e6)
    assert (by_mode["local"].state_floor, by_mode["async"].state_floor) == pytest.approx((0.8, 0.4))
    assert main(["predict", str(path), "--workers", "8", "--link-rate", "10mbit", "--latency",
                 "0", "--out", str(tmp_path / "p")]) == 0
    rows = {r["mode"]: r for r in json.loads((tmp_path / "p" / "predict.json").read_text())["rows"]}
    link = Link(1e7, latency=0.0)
    local_round = exchange_seconds(8e6, 0.8, 8, link)
    assert rows["local"]["images_per_sec"] == pytest.approx(8 * 32 / (0.4 + local_round / 10))
    # An async round hides behind the next period's 4 s of compute; what is left shows.
    async_wait = exchange_seconds(4e6, 0.4, 8, link) - 10 * 0.4
    assert async_wait > 0
    assert rows["async"]["images_per_sec"] == pytest.approx(8 * 32 / (0.4 + async_wait / 10))


def test_a_hierarchical_step_is_a_sync_step_inside_the_host_and_a_round_every_n_sync():
    work = Workload(compute_seconds=1.0, gradient_bytes=1e9, state_bytes=2e9, batch_per_worker=32)
    network = Link(8e9, latency=0.0)  # a gigabyte per second between hosts
    nvlink = Link(8e10, latency=0.0)
    hosts = Hierarchy(workers_per_host=4, host_link=nvlink)
    within = ring_allreduce_seconds(1e9, 4, nvlink)  # 0.15 s every step
    # A round cut in host shards: 4 rings over the 4 hosts, of a quarter of the state each,
    # all 4 through a host's link: 3 s, where a ring over all 16 workers took 3.75 s.
    round_ = ring_allreduce_seconds(2e9 / 4, 4, Link(8e9, latency=0.0, workers_per_link=4))
    assert round_ == pytest.approx(3.0)
    assert step_seconds(work, "local", 16, network, n_sync=10, hierarchy=hosts) == \
        pytest.approx(1.0 + within + round_ / 10)
    # Unlimited links inside a host cost only their floor: here none, so a flat step's
    # compute, with the sharded round.
    floorless = Hierarchy(workers_per_host=4)
    assert step_seconds(work, "local", 16, network, 10, floorless) == \
        pytest.approx(1.0 + round_ / 10)
    # One worker a host is flat local SGD.
    assert step_seconds(work, "local", 16, network, 10, Hierarchy(1, nvlink)) == \
        pytest.approx(step_seconds(work, "local", 16, network, 10))


def test_hierarchical_async_hides_its_round_behind_the_periods_whole_steps():
    work = Workload(compute_seconds=1.0, gradient_bytes=1e9, state_bytes=1e9, batch_per_worker=32)
    hosts = Hierarchy(workers_per_host=2, host_link=Link(1.6e10, latency=0.0))  # 0.5 s a step
    slower = Link(4e8, latency=0.0)  # a round between the 2 hosts, in 2 host shards: 20 s
    # The 10 steps of a period last 15 s with their inner exchanges; 5 s of the round show.
    assert step_seconds(work, "async", 4, slower, n_sync=10, hierarchy=hosts) == \
        pytest.approx(1.5 + 5 / 10)
    assert step_seconds(work, "local", 4, slower, n_sync=10, hierarchy=hosts) == \
        pytest.approx(1.5 + 20 / 10)


def _hierarchical_bench(tmp_path, compute=0.4):
    """A bench on 2 emulated hosts x 2 slots at 100 Mbit/s with a hierarchical row."""
    shaped = json.loads(open(_bench(tmp_path, "100mbit", compute=compute)).read())
    local = next(r for r in shaped["rows"] if r["mode"] == "local")
    shaped["rows"] = [dict(r, workers=4) for r in shaped["rows"]]
    shaped["rows"].append(dict(local, workers=4, hierarchical=True, hosts=2, n_sync=20,
                               label="hierarchical local, n_sync 20", step_seconds=0.5,
                               total_images_per_sec=4 * 32 / 0.5, bytes_per_step=2e5))
    shaped["topology"] = {"kind": "emulated-hosts", "workers_per_link": 1, "slots": 2,
                          "hosts": [{"name": "h1"}, {"name": "h2"}]}
    path = tmp_path / "hosts-2x2.json"
    path.write_text(json.dumps(shaped))
    return str(path)


def test_predict_takes_hierarchical_rows_on_hosts_of_the_checked_benches_size(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["predict", _bench(tmp_path), "--check", _hierarchical_bench(tmp_path),
                 "--workers", "2,4,8", "--link-rate", "1gbit", "--latency", "0",
                 "--out", str(out)]) == 0
    report = json.loads(out.joinpath("predict.json").read_text())
    assert report["workers_per_host"] == 2
    hierarchical = [r for r in report["rows"] if r["hierarchical"]]
    # Two hosts of two at least: 2 workers is one host, not a hierarchy.
    assert [(r["mode"], r["n_sync"], r["workers"]) for r in hierarchical] == \
        [("local", 20, 4), ("local", 20, 8)]
    # The unlimited host link costs nothing; the round is cut in 2 host shards, each a
    # ring over the hosts, both through a host's link.
    link = Link(1e9, latency=0.0, workers_per_link=2)
    round_ = ring_allreduce_seconds(4e6 / 2, 4, link)
    assert hierarchical[1]["images_per_sec"] == pytest.approx(8 * 32 / (0.4 + round_ / 20))
    assert hierarchical[1]["bytes_per_round"] == 4e6 / 2
    check = next(c for c in report["checks"] if c["label"].startswith("hierarchical"))
    shards = ring_allreduce_seconds(4e6 / 2, 2, Link(1e8, 0.0, workers_per_link=2))
    predicted = 4 * 32 / (0.4 + shards / 20)
    assert check["predicted"] == pytest.approx(predicted)
    assert check["error"] == pytest.approx(predicted / (4 * 32 / 0.5) - 1)
    assert "| 1gbit | hierarchical local n_sync 20 | 8 |" in capsys.readouterr().out


def test_predict_refuses_a_host_of_one_worker_and_a_bad_host_link_in_one_line(tmp_path, capsys):
    assert main(["predict", _bench(tmp_path), "--workers-per-host", "1"]) != 0
    assert main(["predict", _bench(tmp_path), "--host-link-rate", "fast"]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line]
    assert errors == [
        "hvdtrain: error: --workers-per-host must be at least 2 (one worker a host is flat "
        "local SGD), got 1",
        "hvdtrain: error: --host-link-rate must be 'none' or a rate in tc's units (100gbit, "
        "10gbit), got 'fast'"]


# --- other hardware, and wall time to a target ---

def _sweep(tmp_path, targets=(0.85, 0.85, 0.85), more=(), base_config=None):
    runs = [dict(name=n, workers=w, mode=m, n_sync=k, examples_to_target=e, target=t)
            for (n, w, m, k, e), t in zip((("w1", 1, "sync", None, 1000),
                                           ("w8-sync", 8, "sync", None, 4000),
                                           ("w8-n10-cold", 8, "local", 10, 2000)), targets)]
    runs.append(dict(name="w2-n10-cold", workers=2, mode="local", n_sync=10,
                     examples_to_target="", target=targets[0]))  # never reached it
    runs += [dict(run, target=targets[0]) for run in more]
    path = tmp_path / "sweep.json"
    sweep = {"runs": runs} if base_config is None else {"runs": runs, "base_config": base_config}
    path.write_text(json.dumps(sweep))
    return str(path)


def test_step_seconds_and_batch_size_put_the_benchs_bytes_on_other_hardware(tmp_path):
    out = tmp_path / "p"
    assert main(["predict", _bench(tmp_path, exchanges=(0.5, 0.5)), "--workers", "8",
                 "--link-rate", "1gbit", "--latency", "0", "--step-seconds", "0.9",
                 "--batch-size", "128", "--n-sync", "50", "--out", str(out)]) == 0
    rows = {r["mode"]: r for r in json.loads((out / "predict.json").read_text())["rows"]}
    assert rows["local"]["n_sync"] == 50 and rows["sync"]["n_sync"] == 1
    # The bench's 4 MB of gradients, with no floor from this machine's unshaped bench.
    exchange = 2 * 7 / 8 * 4e6 * 8 / GBIT
    assert rows["sync"]["images_per_sec"] == pytest.approx(8 * 128 / (0.9 + exchange))
    assert rows["local"]["images_per_sec"] == pytest.approx(8 * 128 / (0.9 + exchange / 50))


def test_time_to_target_divides_each_setups_examples_by_its_predicted_rate(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["predict", _bench(tmp_path), "--workers", "2,8", "--link-rate", "1gbit",
                 "--latency", "0", "--step-seconds", "0.9", "--batch-size", "128",
                 "--time-to-target", _sweep(tmp_path), "--out", str(out)]) == 0
    report = json.loads((out / "predict.json").read_text())["time_to_target"]
    rates = {(r["mode"], r["workers"]): r["images_per_sec"]
             for r in json.loads((out / "predict.json").read_text())["rows"]}
    speedups = {(r["mode"], r["workers"]): r["speedup"] for r in report["rows"]}
    alone = 1000 / (128 / 0.9)  # the one-worker run's seconds to the target
    assert speedups == {("sync", 8): pytest.approx(alone / (4000 / rates[("sync", 8)])),
                        ("local", 8): pytest.approx(alone / (2000 / rates[("local", 8)]))}
    assert report["target"] == 0.85 and report["alone_examples"] == 1000
    assert "| 1gbit | local n_sync 10 | cold | 8 | 2000 | 2.00 |" in capsys.readouterr().out


def test_time_to_target_keeps_each_start_apart_and_notes_the_adaptive_periods_it_leaves_out(
        tmp_path, capsys):
    # The same setup from a warm start needed fewer examples; an adaptive period has no
    # number to cost.
    sweep = _sweep(tmp_path, more=[
        dict(name="w8-n10-warm", workers=8, mode="local", n_sync=10, start="warm",
             examples_to_target=1500),
        dict(name="w8-nauto-cold", workers=8, mode="local", n_sync="auto", start="cold",
             examples_to_target=1800)])
    out = tmp_path / "p"
    assert main(["predict", _bench(tmp_path), "--workers", "8", "--link-rate", "1gbit",
                 "--latency", "0", "--time-to-target", sweep, "--out", str(out)]) == 0
    report = json.loads((out / "predict.json").read_text())["time_to_target"]
    examples = {(r["mode"], r["start"]): r["examples_to_target"] for r in report["rows"]}
    assert examples == {("sync", "cold"): 4000, ("local", "cold"): 2000, ("local", "warm"): 1500}
    printed = capsys.readouterr().out
    assert "| 1gbit | local n_sync 10 | warm | 8 | 1500 | 1.50 |" in printed
    assert ("hvdtrain: note: --time-to-target leaves out w8-nauto-cold (n_sync auto): predict "
            "costs a fixed period only (--n-sync N)\n") in printed


def test_time_to_target_averages_a_setups_seeds_that_reached_it_and_says_how_many_did(
        tmp_path, capsys):
    # Seeds overwrote one another: the last seed's examples stood for the setup.
    seeds = [dict(name=f"w8-n10-cold-s{s}", workers=8, mode="local", n_sync=10, seed=s,
                  examples_to_target=e) for s, e in ((1, 2000), (2, 2600), (3, ""))]
    seeds += [dict(name="w1-s2", workers=1, mode="sync", n_sync=None, seed=2,
                   examples_to_target=1400)]
    out = tmp_path / "p"
    assert main(["predict", _bench(tmp_path), "--workers", "8", "--link-rate", "1gbit",
                 "--latency", "0", "--time-to-target", _sweep(tmp_path, more=seeds),
                 "--out", str(out)]) == 0
    report = json.loads((out / "predict.json").read_text())["time_to_target"]
    local = next(r for r in report["rows"] if r["mode"] == "local")
    # _sweep's own w8-n10-cold run (2000) is a fourth run of the setup.
    assert local["examples_to_target"] == pytest.approx((2000 + 2000 + 2600) / 3)
    assert (local["runs_reached"], local["runs"]) == (3, 4)
    assert report["alone_examples"] == pytest.approx(1200)  # w1 at 1000 and w1-s2 at 1400
    assert report["alone_runs"] == [2, 2]
    printed = capsys.readouterr().out
    assert "| 1gbit | local n_sync 10 | cold | 8 | 2200 | 1.83 |" in printed
    assert "(which needed 1200 examples, 2 of 2 runs reaching it, at" in printed


def test_time_to_target_costs_a_compressed_sweeps_runs_with_the_rows_of_its_rounds(tmp_path, capsys):
    # A sweep of int8 rounds was costed as if its rounds were float32's.
    path = _sweep(tmp_path, base_config={"round_compression": "int8", "round_fragments": 1})
    bench = tmp_path / "int8.json"
    bench.write_text(json.dumps(_with_int8_rows(tmp_path, "100mbit")))
    out = tmp_path / "p"
    assert main(["predict", str(bench), "--workers", "8", "--link-rate", "100mbit", "--latency", "0",
                 "--time-to-target", path, "--out", str(out)]) == 0
    report = json.loads((out / "predict.json").read_text())
    int8 = next(r for r in report["rows"] if r["mode"] == "local"
                and (r["round_compression"], r["round_fragments"]) == ("int8", 1))
    sync = next(r for r in report["rows"] if (r["mode"], r["workers"]) == ("sync", 8))
    speedups = {r["mode"]: r for r in report["time_to_target"]["rows"]}
    assert speedups["local"]["images_per_sec"] == int8["images_per_sec"]
    assert speedups["sync"]["images_per_sec"] == sync["images_per_sec"]  # sync has no form
    assert report["time_to_target"]["round_form"] == {"round_fragments": 1,
                                                      "round_compression": "int8"}
    assert "Wall time to 85.00% test accuracy (local rounds, int8)" in capsys.readouterr().out


def _int8_and_int4_sweep(tmp_path) -> str:
    """A sweep under --optimizer auto at 64 a worker: SGD's int8 rounds at 8 workers,
    LAMB's rescaled int4 rounds at 16 (a global batch of 1,024); its base config says
    neither (round_compression None)."""
    runs = [dict(name="w1", workers=1, mode="sync", n_sync="", round_fragments=1,
                 round_compression="none", examples_to_target=1000, target=0.85),
            dict(name="w8-n10-cold", workers=8, mode="local", n_sync=10, round_fragments=1,
                 round_compression="int8", examples_to_target=2000, target=0.85),
            dict(name="w16-n10-cold", workers=16, mode="local", n_sync=10, round_fragments=1,
                 round_compression="int4", examples_to_target=2400, target=0.85)]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"runs": runs, "base_config": {"round_compression": None}}))
    return str(path)


def test_time_to_target_costs_each_local_run_with_the_rows_of_its_own_rounds(tmp_path, capsys):
    # One form for the whole sweep costed the int4 runs with int8's bytes.
    bench = _with_int8_rows(tmp_path, "100mbit")
    local = next(r for r in bench["rows"] if r.get("round_compression") == "int8"
                 and r.get("round_fragments", 1) == 1)
    bench["rows"].append(dict(local, label="local, n_sync 10, int4", round_compression="int4",
                              bytes_per_step=5.2e4, largest_burst_bytes=5.2e5))
    path = tmp_path / "int4.json"
    path.write_text(json.dumps(bench))
    out = tmp_path / "p"
    assert main(["predict", str(path), "--workers", "8,16", "--link-rate", "100mbit",
                 "--latency", "0", "--time-to-target", _int8_and_int4_sweep(tmp_path),
                 "--out", str(out)]) == 0
    report = json.loads((out / "predict.json").read_text())
    rates = {(r["workers"], r["round_compression"]): r["images_per_sec"]
             for r in report["rows"] if r["mode"] == "local" and r["round_fragments"] == 1}
    assert rates[(16, "int4")] > rates[(16, "int8")]  # half the bytes a round
    speedups = {r["workers"]: r for r in report["time_to_target"]["rows"] if r["mode"] == "local"}
    assert speedups[8]["images_per_sec"] == rates[(8, "int8")]
    assert speedups[16]["images_per_sec"] == rates[(16, "int4")]
    assert (speedups[8]["round_compression"], speedups[16]["round_compression"]) == ("int8", "int4")
    assert report["time_to_target"]["round_form"] is None  # two forms: each row names its own
    printed = capsys.readouterr().out
    assert "Wall time to 85.00% test accuracy, against one worker" in printed
    assert "| 100mbit | local n_sync 10, int8 | cold | 8 | 2000 |" in printed
    assert "| 100mbit | local n_sync 10, int4 | cold | 16 | 2400 |" in printed


def test_time_to_target_names_the_form_of_some_local_runs_the_bench_cannot_cost(tmp_path, capsys):
    path = tmp_path / "int8.json"
    path.write_text(json.dumps(_with_int8_rows(tmp_path, "100mbit")))
    assert main(["predict", str(path), "--workers", "8,16", "--link-rate", "100mbit",
                 "--time-to-target", _int8_and_int4_sweep(tmp_path),
                 "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err == (
        "hvdtrain: error: --time-to-target: some of the sweep's local runs sent rounds of "
        "--round-compression int4 --round-fragments 1, and the bench has no local or async "
        "rows of them to cost them with: run `hvdtrain bench` with those options (its "
        "--fp16-allreduce sends uncompressed rounds as fp16)\n")


def test_a_sweep_that_gave_no_round_compression_sent_local_modes_default_int8_rounds():
    from hvdtrain.benchmarks.predicted_speedup import sweep_round_form

    # Its base config saves None (made concrete per mode); sweeps before the switch saved none.
    assert sweep_round_form({"base_config": {"round_compression": None}}) == RoundForm(1, "int8")
    assert sweep_round_form({"base_config": {"round_compression": "none"}}) == RoundForm()
    assert sweep_round_form({"base_config": {"round_compression": None,
                                             "fp16_allreduce": True}}) == RoundForm(1, "int8")
    assert sweep_round_form({}) == RoundForm()  # from before base configs were saved


def test_a_bench_from_before_fp16_rounds_were_named_costs_its_fp16_allreduce_rounds_as_fp16():
    # Its local rows said round_compression none, and their bytes were float16's.
    old = dict(mode="local", n_sync=10, fp16_allreduce=True, round_compression="none")
    assert RoundForm.of(old) == RoundForm(1, "fp16")
    assert RoundForm.of(dict(old, fp16_allreduce=False)) == RoundForm()


def test_time_to_target_notes_a_sweep_whose_gradients_travelled_unlike_the_benchs(
        tmp_path, capsys):
    path = _sweep(tmp_path, base_config={"fp16_allreduce": True, "round_compression": "int8"})
    bench = tmp_path / "int8.json"
    bench.write_text(json.dumps(_with_int8_rows(tmp_path)))
    assert main(["predict", str(bench), "--workers", "8", "--link-rate", "1gbit",
                 "--time-to-target", path, "--out", str(tmp_path / "p")]) == 0
    assert ("hvdtrain: note: the sweep's gradients travelled as float16 (--fp16-allreduce), "
            "the bench's as float32: sync mode is costed with the bench's bytes\n"
            ) in capsys.readouterr().out


def test_time_to_target_refuses_a_compressed_sweep_the_bench_has_no_rows_for(tmp_path, capsys):
    path = _sweep(tmp_path, base_config={"round_compression": "none", "fp16_allreduce": True})
    assert main(["predict", _bench(tmp_path), "--workers", "8", "--link-rate", "1gbit",
                 "--time-to-target", path, "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err == (
        "hvdtrain: error: --time-to-target: the sweep's local runs sent rounds of "
        "--round-compression fp16 --round-fragments 1, and the bench has no local or async "
        "rows of them to cost them with: run `hvdtrain bench` with those options (its "
        "--fp16-allreduce sends uncompressed rounds as fp16)\n")


def test_batch_size_without_step_seconds_is_refused_in_one_line(tmp_path, capsys):
    # Alone it would multiply the bench's images/sec by 128 over the bench's batch of 32.
    assert main(["predict", _bench(tmp_path), "--batch-size", "128",
                 "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err == (
        "hvdtrain: error: --batch-size 128 goes with --step-seconds (the batch of that measured "
        "step); the bench's own step time is for its own batch\n")
    assert not (tmp_path / "p").exists()


def test_a_bench_or_sweep_that_is_not_json_is_named_in_one_line(tmp_path, capsys):
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    assert main(["predict", str(passwd)]) == 2
    assert main(["predict", _bench(tmp_path), "--time-to-target", str(listing),
                 "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"hvdtrain: error: {passwd} is not a bench.json: it is not JSON (Expecting value: "
        "line 1 column 1 (char 0))",
        f"hvdtrain: error: {listing} is not a sweep.json: it has no 'runs' list"]


def test_time_to_target_refuses_a_sweep_whose_runs_had_different_targets(tmp_path, capsys):
    assert main(["predict", _bench(tmp_path), "--workers", "8", "--link-rate", "1gbit",
                 "--time-to-target", _sweep(tmp_path, (0.85, 0.84, 0.85))]) != 0
    err = capsys.readouterr().err
    assert "runs have different targets (84.00%, 85.00%); run the sweep again with one --target" \
        in err and err.count("\n") == 1


def test_a_fragmented_rows_rounds_are_predicted_with_its_own_bytes_and_largest_burst(tmp_path):
    # The bench's local row at 4 fragments: a round sends 1e6 bytes on average (the
    # bench's bytes per round, which a training run counts: tests/test_bench.py), 1.6e6
    # at most; the unfragmented row's rounds send 4e6.
    bench = json.loads(open(_bench(tmp_path)).read())
    local = next(r for r in bench["rows"] if r["mode"] == "local")
    bench["rows"].append(dict(local, label="local, n_sync 10, 4 fragments", round_fragments=4,
                              bytes_per_step=1e5, bytes_per_round=1e6,
                              largest_burst_bytes=1.6e6))
    path = tmp_path / "fragments.json"
    path.write_text(json.dumps(bench))
    assert main(["predict", str(path), "--workers", "8", "--link-rate", "10mbit", "--latency",
                 "0", "--out", str(tmp_path / "p")]) == 0
    rows = {(r["mode"], r["round_fragments"]): r
            for r in json.loads((tmp_path / "p" / "predict.json").read_text())["rows"]}
    whole, fragmented = rows[("local", 1)], rows[("local", 4)]
    assert (whole["bytes_per_round"], fragmented["bytes_per_round"]) == (4e6, 1e6)
    assert (whole["largest_burst_bytes"], fragmented["largest_burst_bytes"]) == (4e6, 1.6e6)
    link = Link(1e7, latency=0.0)
    assert fragmented["images_per_sec"] == pytest.approx(
        8 * 32 / (0.4 + exchange_seconds(1e6, 0.0, 8, link) / 10))
    assert fragmented["burst_over_compute"] == pytest.approx(
        exchange_seconds(1.6e6, 0.0, 8, link) / 0.4)
    assert "sync" not in {mode for mode, fragments in rows if fragments > 1}


def _with_int8_rows(tmp_path, link_rate=None) -> dict:
    """A bench whose local rows are also measured in int8: a whole round sends 1.03e6
    bytes (about a quarter of the 4e6 in float32, with a scale per 1,024 values), a round
    of one of 4 fragments 2.6e5 on average and 3.1e5 at most."""
    bench = json.loads(open(_bench(tmp_path, link_rate)).read())
    local = next(r for r in bench["rows"] if r["mode"] == "local")
    bench["rows"] += [dict(local, label="local, n_sync 10, int8", round_compression="int8",
                           bytes_per_step=1.03e5, largest_burst_bytes=1.03e6),
                      dict(local, label="local, n_sync 10, 4 fragments, int8",
                           round_compression="int8", round_fragments=4, bytes_per_step=2.6e4,
                           largest_burst_bytes=3.1e5)]
    return bench


def test_compressed_rows_are_predicted_apart_from_uncompressed_ones(tmp_path, capsys):
    path = tmp_path / "int8.json"
    path.write_text(json.dumps(_with_int8_rows(tmp_path)))
    assert main(["predict", str(path), "--workers", "8", "--link-rate", "10mbit", "--latency",
                 "0", "--out", str(tmp_path / "p")]) == 0
    rows = {(r["round_fragments"], r["round_compression"]): r
            for r in json.loads((tmp_path / "p" / "predict.json").read_text())["rows"]
            if r["mode"] == "local"}
    assert [(key, r["bytes_per_round"], r["largest_burst_bytes"]) for key, r in rows.items()] == [
        ((1, "none"), 4e6, 4e6), ((1, "int8"), 1.03e6, 1.03e6), ((4, "int8"), 2.6e5, 3.1e5)]
    link = Link(1e7, latency=0.0)
    assert rows[(1, "int8")]["images_per_sec"] == pytest.approx(
        8 * 32 / (0.4 + exchange_seconds(1.03e6, 0.0, 8, link) / 10))
    assert "| 10mbit | local n_sync 10, 4 fragments, int8 | 8 |" in capsys.readouterr().out
    # Without a row of its fragments, an int8 round is a share of the whole int8 round's.
    bench = json.loads(path.read_text())
    assert workload(bench, 0.0, mode="local", form=RoundForm(2, "int8")).state_bytes == 1.03e6 / 2


def test_a_compressed_setup_the_bench_has_no_rows_of_is_refused_in_one_line(tmp_path, capsys):
    # The checked bench measured int8 rounds; the bench predicting them did not, and an
    # uncompressed round's bytes do not stand for an int8 one's.
    shaped = tmp_path / "int8-100mbit.json"
    shaped.write_text(json.dumps(_with_int8_rows(tmp_path, "100mbit")))
    assert main(["predict", _bench(tmp_path), "--check", str(shaped), "--latency", "0",
                 "--out", str(tmp_path / "p")]) != 0
    err = capsys.readouterr().err
    assert err == ("hvdtrain: error: the bench has no multi-worker local or async rows of "
                   "--round-compression int8: run `hvdtrain bench` with --round-compression "
                   "int8 to predict its rounds\n")
