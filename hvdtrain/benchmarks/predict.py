"""`hvdtrain predict`: images/sec on other clusters, from one bench measurement.

The bench gives the compute time of a step (its independent rows) and the bytes each
mode allreduces; `hvdtrain.benchmarks.costmodel` adds ring allreduce over the links asked for.
A bench over an unshaped link also gives the hosts' floor: how long an exchange took
when the link was not the limit, and what a sync step computes beyond an independent
one. `--check` holds the model against benches run over emulated links: it predicts
each of their rows and prints measured against predicted.

Hierarchical rows (`bench --modes hlocal,hasync`) are predicted as hosts of
`--workers-per-host` workers that run a sync step among themselves over
`--host-link-rate` (by default unlimited: the hosts' floor alone, as NVLink or a
machine's loopback is next to a network) and a round across all workers every n_sync
steps over `--link-rate`.

Local and async setups keep their rounds' form apart (`bench --round-fragments` and
`--round-compression`): a setup's rounds send the bytes its own rows measured. A
fragment count without rows of its own sends 1/F of a whole round in the same
compression; a compressed setup is never costed with uncompressed rows, and a compression
the bench has no multi-worker rows of is refused. A compressed round's bytes are the
bench's at every worker count: int8's padding and scales at another count differ by
under a value and a scale per chunk of 1,024 and per worker, left out.

A bench's rows, and those of its --check benches, must have timed one inner optimizer
(`bench --optimizer`, recorded in each row): a step's compute is averaged over its rows,
and SGD's and LAMB's steps differ. Rows of benches from before rows recorded it are
taken as SGD where `--optimizer auto` took SGD in every version, and refused where it
may have taken LAMB.

For hardware other than the bench's, `--step-seconds` and `--batch-size` give the
compute of one worker's step there (a published measurement); the bench then gives only
the bytes. `--time-to-target` turns the throughput into wall time to an accuracy, with the
examples each setup of an `hvdtrain sweep` needed to reach it (`predicted_speedup`).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, replace
from statistics import fmean
from typing import Callable

from hvdtrain import files
from hvdtrain.benchmarks import predicted_speedup
from hvdtrain.benchmarks.round_form import RoundForm
from hvdtrain.buckets import parse_bucket_spec
from hvdtrain.config import LOCAL_MODES, parse_int_list
from hvdtrain.benchmarks.costmodel import (UNLIMITED, Hierarchy, Link, Workload,
                                floor_of_whole_payload, predict, round_seconds,
                                sync_extra_seconds)
from hvdtrain.errors import ConfigError
from hvdtrain.cluster.links import parse_rate
from hvdtrain.optimizer_choice import auto_optimizer

EXAMPLE = """\
example:
  hvdtrain predict runs/bench/bench.json --workers 4,8,64,512 --link-rate 10gbit,25gbit,100gbit
  hvdtrain predict runs/bench/bench.json --check runs/bench-1gbit/bench.json
  hvdtrain predict runs/bench/bench.json --workers 16,64 --workers-per-host 8 --link-rate 25gbit \\
      --check runs/bench-2x2-100mbit/bench.json
  hvdtrain predict runs/bench-alexnet/bench.json --step-seconds 0.9 --batch-size 128 \\
      --workers 8 --link-rate 48gbit --latency 1.4 --time-to-target runs/sweep/sweep.json
"""
COLUMNS = ("model", "mode", "n_sync", "hierarchical", "round_fragments", "round_compression",
           "workers", "link_rate", "images_per_sec", "efficiency", "communication_share",
           "bytes_per_round", "largest_burst_bytes", "burst_over_compute")
# A setup to predict: (mode, n_sync, hierarchical, round form).
Setup = tuple[str, int, bool, RoundForm]
# A bench row that does not say which optimizer it timed and may have run LAMB.
UNKNOWN_OPTIMIZER = "unknown"


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "predict", help="predict images/sec for other worker counts and links (cost model)",
        description=__doc__,
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench_json", help="bench.json of `hvdtrain bench` with an independent row")
    parser.add_argument("--workers", default="2,4,8,64,512", help="worker counts (default: 2,4,8,64,512)")
    parser.add_argument("--link-rate", default="10gbit,25gbit,100gbit",
                        help="link rates in tc units (default: 10gbit,25gbit,100gbit)")
    parser.add_argument("--latency", type=float, default=50.0,
                        help="microseconds per allreduce message (default: 50)")
    parser.add_argument("--workers-per-link", type=int, default=1,
                        help="workers whose traffic shares one link (default: 1, a NIC each)")
    parser.add_argument("--workers-per-host", type=int, default=None, metavar="S",
                        help="workers per host for the hierarchical setups (hlocal, hasync); "
                             "worker counts that S does not divide are skipped for them "
                             "(default: the --check benches' own, workers / hosts of their "
                             "hierarchical rows, else 8 as on an 8-GPU instance)")
    parser.add_argument("--host-link-rate", default="none",
                        help="rate of the links inside a host, in tc units, for the "
                             "hierarchical setups' every-step exchange (default: none, "
                             "unlimited: the hosts' floor alone)")
    parser.add_argument("--overlap", type=float, default=0.0,
                        help="share of a sync step that can hide gradient communication behind "
                             "back-propagation, a fitted parameter: no bench measures it "
                             "(default: 0, none: on a 2-core CPU compute and allreduce compete "
                             "for the cores; BENCHMARKS.md fits 0.503 to a published GPU case)")
    parser.add_argument("--no-floor", action="store_true",
                        help="leave out the hosts' floor measured by an unshaped BENCH_JSON "
                             "(exchange seconds, sync mode's extra compute): the bare "
                             "latency-bandwidth model")
    parser.add_argument("--n-sync", default=None,
                        help="periods to predict the local and async setups at, comma-separated "
                             "(a round's bytes do not depend on it) (default: the bench's)")
    parser.add_argument("--step-seconds", type=float, default=None,
                        help="seconds of one worker's step without communication on the "
                             "hardware to predict for (a published measurement), instead of "
                             "the bench's own independent rows; the bench gives the bytes only, "
                             "and its hosts' floor is left out (default: the bench's)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="examples per worker in a --step-seconds step; only with "
                             "--step-seconds (default: the bench's)")
    parser.add_argument("--time-to-target", default=None, metavar="SWEEP_JSON",
                        help="sweep.json of `hvdtrain sweep --target`: each setup's examples "
                             "to the target (over --seeds, the mean of the seeds that reached "
                             "it, and how many did) over its predicted images/sec, as a "
                             "speed-up in wall time over the one-worker run; each local and "
                             "async setup is costed with the bench's rows of its own rounds' "
                             "--round-compression and --round-fragments (a sweep's row records "
                             "them: --optimizer auto's rounds are int8 below a global batch of "
                             "1,024 and int4 from it on)")
    parser.add_argument("--check", nargs="*", default=[], metavar="BENCH_JSON",
                        help="benches run with --link-rate: predict their rows and compare")
    parser.add_argument("--out", default=None,
                        help="folder for predict.json, predict.csv and predict.png "
                             "(default: the folder of BENCH_JSON)")
    parser.set_defaults(handler=run)


def row_optimizer(row: dict) -> str:
    """The inner optimizer a bench row timed. Rows from before bench recorded it trained
    `--optimizer auto` (the plain-Horovod reference: SGD). Auto's rule only ever added
    cases where it takes LAMB, from a global batch of 1,024, so where today's rule takes
    SGD every version did; where it takes LAMB an older one may have taken SGD: unknown,
    rather than a guess that would let predict average SGD's steps with LAMB's."""
    if "optimizer" in row:
        return row["optimizer"]
    if row["mode"] == "horovod":
        return "sgd"
    mode = "local" if row["mode"] == "independent" else row["mode"]
    chosen = auto_optimizer(mode, row["workers"] * row["batch_per_worker"], elastic=False,
                            nesterov=False, hierarchical=bool(row.get("hierarchical")))
    return "sgd" if chosen == "sgd" else UNKNOWN_OPTIMIZER


def bench_optimizer(bench: dict, path: str) -> str | None:
    """The one optimizer every row of the bench at `path` timed. Rows of two are refused:
    a step's compute (the independent rows' mean) and a sync step's extra would average
    SGD's and LAMB's steps, and a round's bytes would be another optimizer's."""
    found: dict[str, dict] = {}
    for row in bench["rows"]:
        found.setdefault(row_optimizer(row), row)  # the first row of each, to name
    unknown = found.get(UNKNOWN_OPTIMIZER)
    if unknown is not None:
        raise ConfigError(
            f"{path}: its {unknown.get('label', unknown['mode'])} row at {unknown['workers']} x "
            f"{unknown['batch_per_worker']} does not say which optimizer it timed (benches "
            f"from before rows recorded it trained --optimizer auto, which may have taken "
            f"lamb there and sgd at fewer workers); run `hvdtrain bench` again")
    if len(found) > 1:
        first, second = list(found)[:2]
        raise ConfigError(f"{path} holds rows of --optimizer {first} and {second}: predict "
                          f"from a bench of one optimizer (`hvdtrain bench --optimizer`)")
    return next(iter(found), None)


def same_optimizer(bench: dict, path: str, others: list[tuple[str, dict]]) -> str | None:
    """The optimizer of the bench at `path`, which every (path, bench) of `others` must
    share: --check predicts their rows with its bytes and floors."""
    optimizer = bench_optimizer(bench, path)
    for other_path, other in others:
        theirs = bench_optimizer(other, other_path)
        if theirs != optimizer:
            raise ConfigError(f"--check {other_path} timed --optimizer {theirs} and {path} "
                              f"--optimizer {optimizer}: check a bench of the same optimizer")
    return optimizer


def step_triggered(bench: dict) -> dict:
    """The bench without its --sync-seconds rows: the model knows rounds every n_sync steps
    only (how many steps a period holds depends on each worker's speed)."""
    return dict(bench, rows=[r for r in bench["rows"] if r.get("sync_seconds") is None])


def independent_compute(bench: dict) -> float | None:
    """Seconds of a step without communication: the mean over the independent rows."""
    alone = [r["step_seconds"] for r in bench["rows"] if r["mode"] == "independent"]
    return fmean(alone) if alone else None


def workload(bench: dict, overlap: float, floor: bool = True, mode: str | None = None,
             form: RoundForm = RoundForm()) -> Workload:
    """The step of the bench's model: compute from its independent rows, bytes per mode,
    the gradient group sent last, and (unless `floor` is False) the hosts' floor from
    its multi-worker rows. The state a round carries is `mode`'s own when the bench has
    rows of it (local mode averages the optimizer's slots by default, async mode does not),
    else that of the first local-mode row; of `form`: rounds of its fragments (`bench
    --round-fragments`), or else 1/fragments of a whole round's, in its compression."""
    rows = bench["rows"]
    compute = independent_compute(bench)
    if compute is None:
        raise ConfigError("predict needs a bench with an independent row (--modes ...,independent)")
    first = rows[0]
    gradient = first["parameters"] * (2 if first.get("fp16_allreduce") else 4)
    rounds = _round_rows(rows, mode, form)
    state = (_state(rounds[0]) if rounds
             else _whole_state(rows, mode, form, gradient) / form.fragments)
    groups = next((r["gradient_group_bytes"] for r in rows if r.get("gradient_group_bytes")), None)
    work = Workload(compute, gradient, state, first["batch_per_worker"],
                    bucket_bytes=parse_bucket_spec(first.get("bucket_mb", 25)).cap_bytes(
                        [gradient]), overlap=overlap,
                    last_bucket_bytes=groups[-1] if groups else None)
    return _with_floors(bench, work, rounds) if floor else work


def _round_rows(rows: list[dict], mode: str | None, form: RoundForm = RoundForm()) -> list[dict]:
    """The multi-worker rows whose rounds stand for `mode`'s of `form`: of its compression
    only, its own mode's if any, else every local mode's; of its fragments."""
    local = [r for r in rows if r["mode"] in LOCAL_MODES and r["workers"] > 1
             and RoundForm.of(r).compression == form.compression]
    own = [r for r in local if r["mode"] == mode] or local
    return [r for r in own if RoundForm.of(r).fragments == form.fragments]


def _whole_state(rows: list[dict], mode: str | None, form: RoundForm, gradient: float) -> float:
    """Bytes of a whole round in `form`'s compression: a row's; without one, a gradient's
    (a mode that sends no rounds, or a bench of one worker). A compressed round's bytes are
    measured, never guessed from an uncompressed round's."""
    whole = _round_rows(rows, mode, replace(form, fragments=1))
    if whole:
        return _state(whole[0])
    if form.compression != "none":
        raise ConfigError(f"the bench has no multi-worker local or async rows of "
                          f"--round-compression {form.compression}: run `hvdtrain bench` with "
                          f"--round-compression {form.compression} to predict its rounds")
    return gradient


def _state(row: dict) -> float:
    """Bytes of one of the row's rounds of the whole state (a fragmented row's: on average
    over its turns); a row whose rounds were cut in host shards counts one shard's."""
    return row["bytes_per_step"] * row["n_sync"] * row.get("host_shards", 1)


def largest_burst(bench: dict, mode: str, form: RoundForm, work: Workload) -> float:
    """Bytes of the largest round `mode` sends in `form`, of the whole state: the bench
    row's, or, without one, the mean round's."""
    return next((r["largest_burst_bytes"] * r.get("host_shards", 1)
                 for r in _round_rows(bench["rows"], mode, form)
                 if r.get("largest_burst_bytes")), work.state_bytes)


def _with_floors(bench: dict, work: Workload, rounds: list[dict]) -> Workload:
    """`work` with the exchange floors and sync mode's extra compute, where the link was
    not the limit. Only an unshaped bench tells them: over an emulated link the exchange
    is the link's. Each row's floor is scaled by its own worker count before averaging;
    the state's comes from `rounds`, the rows whose state `work` carries."""
    if bench.get("link_rate"):
        return work
    timed = [r for r in bench["rows"] if r["workers"] > 1 and r.get("seconds_per_exchange")]
    sync = [r for r in timed if r["mode"] == "sync"]
    local = [r for r in rounds if r.get("seconds_per_exchange")]
    if not sync or not local:
        return work
    floored = replace(
        work, gradient_floor=fmean(_whole_payload_floor(r) for r in sync),
        state_floor=fmean(_whole_payload_floor(r) for r in local))
    return replace(floored, sync_extra=fmean(
        sync_extra_seconds(floored, r["step_seconds"], r["workers"]) for r in sync))


def _whole_payload_floor(row: dict) -> float:
    return floor_of_whole_payload(row["seconds_per_exchange"], row["workers"])


def _setups(benches: list[dict]) -> list[Setup]:
    """(mode, n_sync, hierarchical, round form) of the benches' rows, in order and once
    each; the bare-Horovod reference counts as sync."""
    found = {("sync" if r["mode"] == "horovod" else r["mode"], r["n_sync"] or 1,
              bool(r.get("hierarchical")), RoundForm.of(r)): None
             for bench in benches for r in bench["rows"]}
    return list(found)


def at_periods(setups: list[Setup], periods: list[int]) -> list[Setup]:
    """The setups with each local and async one at every one of `periods` instead."""
    out = {}
    for mode, n_sync, hierarchical, form in setups:
        for period in periods if mode in LOCAL_MODES else [n_sync]:
            out[(mode, period, hierarchical, form)] = None
    return list(out)


def bench_workers_per_host(benches: list[dict]) -> int | None:
    """Workers per host of the benches' hierarchical rows (workers / host groups)."""
    return next((r["workers"] // r["hosts"] for bench in benches for r in bench["rows"]
                 if r.get("hierarchical") and r.get("hosts")), None)


def predictions(bench: dict, work_for: Callable[[str, RoundForm], Workload],
                workers: list[int], rates: list[str], latency: float, per_link: int,
                hierarchy: Hierarchy, setups: list[Setup]) -> list[dict]:
    """Each setup on each link and worker count; `work_for(mode, form)` is the workload
    of a mode's rounds of that form. Hierarchical setups run on hosts of `hierarchy`, at
    the counts it divides into two hosts or more."""
    rows = []
    for rate in rates:
        link = Link(parse_rate(rate), latency, per_link)
        for mode, n_sync, hierarchical, form in setups:
            for count in workers:
                size = hierarchy.workers_per_host
                if hierarchical and (count % size or count < 2 * size):
                    continue
                work = work_for(mode, form)
                hosts = hierarchy if hierarchical else None
                p = predict(work, mode, count, link, n_sync, hosts)
                rows.append({"model": bench["rows"][0]["model"], "mode": mode, "n_sync": n_sync,
                             "hierarchical": hierarchical, **form.columns(),
                             "workers": count, "link_rate": rate, **vars(p),
                             **_burst(bench, mode, form, work, count, link, hosts)})
    return rows


def _burst(bench: dict, mode: str, form: RoundForm, work: Workload, workers: int,
           link: Link, hierarchy: Hierarchy | None = None) -> dict:
    """A round's bytes a worker sends (on average over a fragmented round's turns), its
    largest, and how long the largest takes on `link` against a step's compute: local and
    async rows. A hierarchical round is cut in host shards: a worker sends a k-th."""
    if mode not in LOCAL_MODES:
        return {}
    largest = largest_burst(bench, mode, form, work)
    seconds = round_seconds(replace(work, state_bytes=largest), workers, link, hierarchy)
    shards = 1 if hierarchy is None else hierarchy.workers_per_host
    return {"bytes_per_round": work.state_bytes / shards,
            "largest_burst_bytes": largest / shards,
            "burst_over_compute": seconds / work.compute_seconds}


def workers_per_link(bench: dict, workers: int) -> int:
    """How many workers' traffic crossed one link in `bench`: one on emulated hosts (a NIC
    each), all of them on the shared loopback (benches from before bench.json said)."""
    return 1 if bench.get("topology", {}).get("kind") == "emulated-hosts" else workers


def checks(work_for: Callable[[str, RoundForm], Workload], shaped: dict, latency: float,
           host_link: Link = UNLIMITED) -> list[dict]:
    """Each communicating row of a bench over an emulated link, measured and predicted.

    The compute comes from that bench's own independent rows: on a shared machine it
    drifts by ±15% between runs, and what is checked is the communication. The emulated
    loopback of `bench --link-rate` carries every worker's traffic, so all of them share
    its rate; on the emulated hosts of `bench --hosts` each worker has a NIC of its own,
    as the model assumes of a cluster (with several slots a host, a ring in rank order
    still sends one worker's share across each NIC). Hierarchical rows are predicted on
    hosts of their own workers / hosts, inside which `host_link` carries the gradients.
    """
    rate = shaped.get("link_rate")
    if not rate:
        raise ConfigError("--check takes benches run with --link-rate; this one has no link_rate")
    own_compute = independent_compute(shaped)
    out = []
    for row in shaped["rows"]:
        mode = "sync" if row["mode"] == "horovod" else row["mode"]
        if mode == "independent" and own_compute is not None:
            continue
        work = work_for(mode, RoundForm.of(row))
        if own_compute is not None:
            work = replace(work, compute_seconds=own_compute)
        link = Link(parse_rate(rate), latency, workers_per_link(shaped, row["workers"]))
        hierarchy = (Hierarchy(row["workers"] // row["hosts"], host_link)
                     if row.get("hierarchical") and row.get("hosts") else None)
        p = predict(work, mode, row["workers"], link, row["n_sync"] or 1, hierarchy)
        measured = row["total_images_per_sec"]
        out.append({"link_rate": rate, "label": row["label"], "workers": row["workers"],
                    "measured": measured, "measured_ci95": row["total_ci95"],
                    "predicted": p.images_per_sec, "error": p.images_per_sec / measured - 1})
    return out


def run(args: argparse.Namespace) -> int:
    _check_numbers(args)
    bench = read_input(args.bench_json, "rows", "a bench.json")
    checked_benches = [(path, read_input(path, "rows", "a bench.json")) for path in args.check]
    optimizer = same_optimizer(bench, args.bench_json, checked_benches)
    bench = step_triggered(bench)
    shaped = [step_triggered(other) for _, other in checked_benches]
    floor = not args.no_floor and args.step_seconds is None  # a floor is this machine's

    def work_for(mode: str, form: RoundForm = RoundForm()) -> Workload:
        return on_hardware(workload(bench, args.overlap, floor=floor, mode=mode, form=form),
                           args)

    work = work_for("sync")
    rates = [r.strip() for r in args.link_rate.split(",")]
    for rate in rates:
        parse_rate(rate)
    latency = args.latency * 1e-6
    host_link = Link(host_link_bits(args.host_link_rate), latency)
    hierarchy = Hierarchy(args.workers_per_host or bench_workers_per_host(shaped) or 8, host_link)
    setups = _setups([bench, *shaped])
    if args.n_sync is not None:
        setups = at_periods(setups, parse_int_list(args.n_sync, "--n-sync"))
    rows = predictions(bench, work_for, parse_int_list(args.workers, "--workers"), rates,
                       latency, args.workers_per_link, hierarchy, setups)
    checked = [c for other in shaped for c in checks(work_for, other, latency, host_link)]
    out = args.out or os.path.dirname(os.path.abspath(args.bench_json))
    os.makedirs(out, exist_ok=True)
    to_target = time_to_target(args.time_to_target, rows, work,
                               bool(bench["rows"][0].get("fp16_allreduce")))
    files.write_json(os.path.join(out, "predict.json"), {
        "bench": args.bench_json, "optimizer": optimizer, "workload": asdict(work),
        "latency_us": args.latency,
        "workers_per_link": args.workers_per_link, "workers_per_host": hierarchy.workers_per_host,
        "host_link_rate": args.host_link_rate,
        "rows": rows, "checks": checked, "time_to_target": to_target})
    files.write_csv(os.path.join(out, "predict.csv"), rows, COLUMNS)
    _plot(rows, os.path.join(out, "predict.png"))
    print(format_tables(rows, checked))
    if to_target:
        print("\n" + predicted_speedup.format_table(**to_target))
    print(f"hvdtrain: wrote predict.json, predict.csv and predict.png in {out}", flush=True)
    return 0


def on_hardware(work: Workload, args: argparse.Namespace) -> Workload:
    """`work` with the compute of --step-seconds and --batch-size, where given."""
    if args.step_seconds is not None:
        work = replace(work, compute_seconds=args.step_seconds, sync_extra=0.0)
    if args.batch_size is not None:
        work = replace(work, batch_per_worker=args.batch_size)
    return work


def time_to_target(sweep_path: str | None, rows: list[dict], work: Workload,
                   bench_fp16: bool = False) -> dict | None:
    """The speed-up table's rows and what heads it, for --time-to-target; `bench_fp16`:
    whether the bench's gradients travelled as float16 (--fp16-allreduce)."""
    if sweep_path is None:
        return None
    sweep = read_input(sweep_path, "runs", "a sweep.json")
    reached = predicted_speedup.examples_to_target(sweep, sweep_path)
    alone = reached.one_worker()
    if alone is None:
        raise ConfigError(f"--time-to-target {sweep_path}: its one-worker run never reached "
                          "the target, or the sweep has none (--workers 1,...)")
    note = predicted_speedup.left_out_note(reached)
    if note:
        print(note, flush=True)
    one_worker = work.batch_per_worker / work.compute_seconds
    chosen = predicted_speedup.rows_of_forms(rows, reached)
    note = predicted_speedup.gradients_note(sweep, bench_fp16)
    if note:
        print(note, flush=True)
    speedups = predicted_speedup.speedups(chosen, reached, one_worker)
    form = predicted_speedup.table_form(speedups, predicted_speedup.sweep_round_form(sweep))
    return {"rows": speedups, "target": reached.target, "alone_examples": alone,
            "alone_runs": list(reached.one_worker_runs()), "alone_images_per_sec": one_worker,
            "round_form": form.columns() if form else None}


def read_input(path: str, key: str, what: str) -> dict:
    """The JSON file `path`, which must be `what`: a mapping with a list under `key`."""
    try:
        data = files.read_json(path)
    except ValueError as exc:  # not JSON, or not text at all
        raise ConfigError(f"{path} is not {what}: it is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ConfigError(f"{path} is not {what}: it has no {key!r} list")
    return data


def _check_numbers(args: argparse.Namespace) -> None:
    for path in [args.bench_json, *args.check, *filter(None, [args.time_to_target])]:
        if not os.path.isfile(path):
            raise ConfigError(f"bench file not found: {path}")
    if args.latency < 0 or args.workers_per_link <= 0 or not 0 <= args.overlap <= 1:
        raise ConfigError(f"--latency must be >= 0, --workers-per-link > 0 and --overlap in [0, 1]; "
                          f"got {args.latency}, {args.workers_per_link} and {args.overlap}")
    if (args.step_seconds is not None and args.step_seconds <= 0) or (
            args.batch_size is not None and args.batch_size <= 0):
        raise ConfigError(f"--step-seconds and --batch-size must be positive, got "
                          f"{args.step_seconds} and {args.batch_size}")
    if args.batch_size is not None and args.step_seconds is None:
        raise ConfigError(f"--batch-size {args.batch_size} goes with --step-seconds (the batch "
                          "of that measured step); the bench's own step time is for its own batch")
    if args.workers_per_host is not None and args.workers_per_host < 2:
        raise ConfigError(f"--workers-per-host must be at least 2 (one worker a host is flat "
                          f"local SGD), got {args.workers_per_host}")


def host_link_bits(text: str) -> float:
    """--host-link-rate in bits per second; 'none' is unlimited."""
    if text.strip().lower() == "none":
        return math.inf
    try:
        return parse_rate(text)
    except ConfigError:
        raise ConfigError(f"--host-link-rate must be 'none' or a rate in tc's units (100gbit, "
                          f"10gbit), got {text!r}") from None


def format_tables(rows: list[dict], checked: list[dict]) -> str:
    lines = ["| link | mode | workers | images/sec | efficiency | comm. share |", "|" + "---|" * 6]
    for r in rows:
        lines.append(f"| {r['link_rate']} | {setup_label(r)} | {r['workers']} | "
                     f"{r['images_per_sec']:.1f} | "
                     f"{r['efficiency']:.0%} | {r['communication_share']:.0%} |")
    if checked:
        lines += ["", "| link | setup | workers | measured | predicted | error |", "|" + "---|" * 6]
        lines += [f"| {c['link_rate']} | {c['label']} | {c['workers']} | {c['measured']:.1f} ± "
                  f"{c['measured_ci95']:.1f} | {c['predicted']:.1f} | {c['error']:+.1%} |"
                  for c in checked]
    return "\n".join(lines)


def setup_label(row: dict) -> str:
    """'sync', 'local n_sync 10', 'hierarchical async n_sync 20', 'local n_sync 10, 4
    fragments, int8'."""
    mode = row["mode"] + (f" n_sync {row['n_sync']}" if row["mode"] in LOCAL_MODES else "")
    return ("hierarchical " if row.get("hierarchical") else "") + mode + RoundForm.of(row).suffix


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    lines: dict[str, list[dict]] = {}
    for r in rows:
        lines.setdefault(f"{setup_label(r)}, {r['link_rate']}", []).append(r)
    for label, points in lines.items():
        ax.plot([p["workers"] for p in points], [p["images_per_sec"] for p in points],
                marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="images/sec (all workers)",
           title=f"{rows[0]['model']}: predicted throughput")
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
