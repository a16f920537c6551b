"""Latency benchmark: how long a message takes from its send to a Spark sink, at steady rates, for
our reader and the streaming sources Spark users compare it with (issue 33).

Every source is started first (brokers in their own processes), then the rates run in turn, and
at each rate the sources one after the other, so a change in a shared machine's load meets the
sources of one rate alike. One local[2] SparkSession runs one query at a time, each with the
default trigger (a new micro-batch as soon as the last ends) and a foreachBatch sink that
collects the batch's send times (``toArrow``) and takes each row's latency as the time the
collect returned minus the row's send time::

  floor      a trivial Python streaming data source (benchmarks/_clock_source.py): one partition,
             rows appear with the clock at the rate, each carrying the instant it appeared as its
             send time: Spark's own floor (micro-batch loop, Python source, foreachBatch)
  embedded   readStream.format("rocketmq") on the embedded broker (the rocketmq_spark.cli broker
             in a child process)
  real       the same reader on Apache RocketMQ (name server + broker from Maven Central,
             tests/real_rocketmq.py NEWEST; left out with a note when java or mvn is missing)
  kafka      Spark's own Kafka source on Kafka (KRaft, one node; benchmarks/_kafka.py)

For every source and rate a steady producer runs in its own process for warm-up + ``--seconds``:
benchmarks/_paced.py (our RemotingClient) for RocketMQ, _paced_kafka/PacedKafkaProducer.java (the
Kafka client, linger.ms=0) for Kafka; message k is due at t0 + k / rate, each turn sends the
messages due by then, and each body starts with its send time in microseconds. The topic has
``--queues`` queues / partitions (default 1, as the floor's one partition) and is new for every
run; the query starts on it before the producer does. Rows sent in the warm-up (the first
``--warmup`` seconds) are left out of the figures, and so are the micro-batches that started then.
Every run must deliver every message sent (a run that lost some fails, with a note in its row).

Per source and rate: send -> sink latency p50 / p95 / p99 / max (ms); the medians over the
non-empty micro-batches of each part of StreamingQueryProgress.durationMs (triggerExecution,
latestOffset, queryPlanning, addBatch, commitOffsets, walCommit, getBatch); the producer's
achieved rate and worst lag behind its schedule. The headline ratios (``targets`` in the JSON):
our median triggerExecution over the floor's at ``--trigger-rate`` (500 msgs/s, run too when not
among ``--rates``; target <= 1.5x) and our p99 over Kafka's at ``--p99-rate`` (1,000 msgs/s;
target <= 1.5x and <= 1 s).

``python -m benchmarks.latency [--quick] [--rates 100,1000,10000] [--seconds 20] [--warmup 3]
[--sources floor,embedded,real,kafka] [--queues 1] [--body-size 100]``; results go to
``benchmarks/results/latency.json`` and ``latency.png`` (``latency-quick.*`` with ``--quick``: one
rate of 200 msgs/s for 2 s after 1 s of warm-up, the floor and the embedded broker only; the
JSON's ``skipped`` says so). On a shared machine the figures move with the load: they are
indicative, the ratios less so than the absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from . import _provenance, _report
from ._brokers import java_missing, start_broker, tests_on_path
from ._clock_source import ClockDataSource
from ._paced import TS_DIGITS
from ._runs import key_value

SOURCES = ("floor", "embedded", "real", "kafka")
#: the parts of StreamingQueryProgress.durationMs reported (median over non-empty micro-batches)
DURATIONS = ("triggerExecution", "latestOffset", "queryPlanning", "addBatch", "commitOffsets", "walCommit",
             "getBatch")
PERCENTILES = (50, 95, 99)
TRIGGER_TARGET = 1.5  # our median triggerExecution / the floor's
P99_TARGET = 1.5  # our p99 / Kafka's
P99_ABS_TARGET_MS = 1000.0
KAFKA_JAVA = Path(__file__).resolve().parent / "_paced_kafka" / "PacedKafkaProducer.java"
_READY_TIMEOUT_S = 120.0
_DRAIN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Plan:
    rates: tuple[float, ...]
    seconds: float
    warmup_s: float
    sources: tuple[str, ...]
    queues: int = 4
    body_size: int = 100
    trigger_rate: float = 500.0
    p99_rate: float = 1000.0
    skipped: dict[str, str] = field(default_factory=dict)  # source -> why it was left out
    #: options given to our reader besides its own (--reader-option), e.g. minMessagesPerPartition=0
    reader_options: tuple[tuple[str, str], ...] = ()


FULL = Plan(rates=(100.0, 1000.0, 10000.0), seconds=20.0, warmup_s=3.0, sources=SOURCES)
QUICK = Plan(rates=(200.0,), seconds=2.0, warmup_s=1.0, sources=("floor", "embedded"), trigger_rate=200.0,
             p99_rate=200.0, skipped={"real": "--quick: Apache RocketMQ left out (JVM start-up)",
                                      "kafka": "--quick: Kafka left out (JVM start-up)"})


@dataclass
class Row:
    source: str
    rate: float
    label: str = ""
    sent: int = 0
    received: int = 0
    measured: int = 0  # rows sent after the warm-up: the latency figures are theirs
    achieved_per_s: float | None = None
    worst_lag_ms: float | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)  # p50 p95 p99 max mean
    batches: int = 0  # non-empty micro-batches after the warm-up
    rows_per_batch: float | None = None
    duration_ms: dict[str, float] = field(default_factory=dict)  # median per durationMs part
    note: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.latency_ms) and not self.note.startswith(("error", "skipped"))


# -- the sink ----------------------------------------------------------------------------------


def now_us() -> int:
    return time.time_ns() // 1000


class LatencySink:
    """The foreachBatch function: each batch's ``sent_us`` collected (Arrow), then now - sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []  # numpy arrays of send times (us)
        self.lat_us: list[Any] = []  # numpy arrays of latencies (us)
        self.received = 0
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        tbl = df.toArrow()
        t = now_us()
        sent = tbl.column("sent_us").to_numpy()
        with self._lock:
            self.sent.append(sent)
            self.lat_us.append(t - sent)
            self.received += len(sent)

    def latencies_ms(self, after_us: int) -> Any:
        """The latencies (ms) of the rows sent at or after ``after_us``."""
        import numpy as np

        with self._lock:
            if not self.sent:
                return np.zeros(0)
            sent, lat = np.concatenate(self.sent), np.concatenate(self.lat_us)
        return lat[sent >= after_us] / 1000.0


def latency_figures(lat_ms: Any) -> dict[str, float]:
    import numpy as np

    if len(lat_ms) == 0:
        return {}
    out = {f"p{q}": round(float(np.percentile(lat_ms, q)), 2) for q in PERCENTILES}
    out["max"] = round(float(lat_ms.max()), 2)
    out["mean"] = round(float(lat_ms.mean()), 2)
    return out


def _progress_dicts(q: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]


def batch_figures(progress: list[dict[str, Any]], after_us: int) -> tuple[int, float | None, dict[str, float]]:
    """(non-empty micro-batches that started at or after ``after_us``, their median rows, the
    median of each DURATIONS part over them)."""
    import statistics

    picked = []
    for d in progress:
        if not int(d.get("numInputRows", 0)):
            continue
        ts = _dt.datetime.fromisoformat(str(d["timestamp"]).replace("Z", "+00:00"))
        if ts.timestamp() * 1e6 >= after_us:
            picked.append(d)
    if not picked:
        return 0, None, {}
    parts = {k: round(float(statistics.median(int(d.get("durationMs", {}).get(k, 0)) for d in picked)), 1)
             for k in DURATIONS}
    rows = float(statistics.median(int(d["numInputRows"]) for d in picked))
    return len(picked), rows, parts


# -- the producers -----------------------------------------------------------------------------


class Producer:
    """A paced producer process: started, ready (its topic made), told to go, finished with a
    JSON line of what it sent."""

    def __init__(self, cmd: list[str], log: str) -> None:
        self._log: IO[bytes] = open(log, "ab")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, cwd=_provenance.REPO)
        self.log = log

    def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        box: list[str] = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        t.start()
        t.join(timeout)
        if not box or not box[0]:
            self.close()
            with open(self.log, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"the producer gave no answer within {timeout:.0f}s; its log:\n{tail}")
        answer: dict[str, Any] = json.loads(box[0])
        return answer

    def ready(self) -> None:
        self._line(_READY_TIMEOUT_S)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        out = self._line(timeout)
        self.proc.wait(30)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for s in (self.proc.stdin, self.proc.stdout):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()
        self._log.close()


# -- the sources -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One run: its topic (new for every run), rate, rows in all, and the floor's start file."""

    topic: str
    rate: float
    seconds: float  # warm-up + measured
    total: int
    control: str


@dataclass
class Target:
    """A running source: what it is called, how its query reads a run's topic and how its
    producer is started (None: the floor, whose rows appear on their own)."""

    label: str
    reader: Callable[[Any, Spec], Any]  # (spark, run) -> a streaming DataFrame of sent_us
    producer: Callable[[Spec], list[str]] | None  # run -> argv
    versions: dict[str, str] = field(default_factory=dict)


def _sent_us_of(col: str) -> str:
    return f"cast(cast(substring({col}, 1, {TS_DIGITS}) as string) as bigint) as sent_us"


def _rocketmq_target(label: str, ns: str, plan: Plan) -> Target:
    def reader(spark: Any, run: Spec) -> Any:
        return (spark.readStream.format("rocketmq").option("namesrvAddr", ns).option("topic", run.topic)
                .option("consumerGroup", f"lat-{uuid.uuid4().hex[:8]}").option("startingOffsets", "earliest")
                .options(**dict(plan.reader_options)).load().selectExpr(_sent_us_of("body")))

    def producer(run: Spec) -> list[str]:
        return [sys.executable, "-m", "benchmarks._paced", "--namesrv", ns, "--topic", run.topic, "--queues",
                str(plan.queues), "--rate", str(run.rate), "--seconds", str(run.seconds), "--body-size",
                str(plan.body_size)]

    return Target(label, reader, producer)


@contextlib.contextmanager
def source_target(name: str, plan: Plan, workdir: str, say: Callable[[str], None]) -> Iterator[Target]:
    """The source ``name`` running (its broker started, stopped on exit)."""
    d = os.path.join(workdir, name)
    if name == "floor":
        def clock_reader(spark: Any, run: Spec) -> Any:
            return (spark.readStream.format("rmqbench_clock").option("rate", str(run.rate))
                    .option("total", str(run.total)).option("control", run.control).load().select("sent_us"))

        yield Target("trivial Python source (Spark's floor)", clock_reader, None)
    elif name == "embedded":
        with start_broker("cli", d) as h:
            say(f"embedded broker (cli, pid {h.pid}) at {h.namesrv_addr}")
            yield _rocketmq_target("rocketmq reader, embedded broker", h.namesrv_addr, plan)
    elif name == "real":
        tests_on_path()
        from real_rocketmq import NEWEST, RealRocketMQ, provision

        rmq = RealRocketMQ(provision(NEWEST), Path(d), version=NEWEST, proxy=False)
        rmq.start()
        try:
            say(f"Apache RocketMQ {NEWEST} (name server + broker) at {rmq.namesrv_addr}")
            t = _rocketmq_target(f"rocketmq reader, Apache RocketMQ {NEWEST}", rmq.namesrv_addr, plan)
            t.versions["rocketmq"] = NEWEST
            yield t
        finally:
            rmq.stop()
    elif name == "kafka":
        from ._kafka import KAFKA_VERSION, Kafka, kafka_jars

        lib = kafka_jars()
        with Kafka(d, partitions=plan.queues) as k:
            say(f"Kafka {KAFKA_VERSION} (KRaft, one node) at {k.bootstrap}")

            def reader(spark: Any, run: Spec) -> Any:
                return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", k.bootstrap)
                        .option("subscribe", run.topic).option("startingOffsets", "earliest").load()
                        .selectExpr(_sent_us_of("value")))

            def producer(run: Spec) -> list[str]:
                return ["java", "-Xmx256m", "-cp", f"{lib}/*", str(KAFKA_JAVA), k.bootstrap, run.topic,
                        str(plan.queues), str(run.rate), str(run.seconds), str(plan.body_size)]

            yield Target(f"Spark's Kafka source, Kafka {KAFKA_VERSION}", reader, producer,
                         {"kafka": KAFKA_VERSION})
    else:
        raise ValueError(f"unknown source {name!r}; one of {SOURCES}")


def _wait(cond: Callable[[], bool], timeout: float, what: str, q: Any) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if q.exception() is not None:
            raise RuntimeError(f"the query failed while {what}: {q.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s {what}")
        time.sleep(0.05)


def _idle(q: Any) -> bool:
    """The query has started and found nothing to read yet."""
    return "Waiting for data" in str(q.status.get("message", "")) or q.lastProgress is not None


def measure(spark: Any, name: str, target: Target, rate: float, plan: Plan, workdir: str) -> Row:
    """One source at one rate: the query started on a new topic, the producer run, every message
    waited for. -> its row."""
    row = Row(name, rate, target.label)
    run_id = f"lat-{name}-{int(rate)}-{uuid.uuid4().hex[:6]}"
    seconds = plan.warmup_s + plan.seconds
    total = int(rate * seconds)
    control = os.path.join(workdir, f"{run_id}.start")
    spec = Spec(run_id, rate, seconds, total, control)
    prod = (Producer(target.producer(spec), os.path.join(workdir, f"{run_id}.log"))
            if target.producer is not None else None)
    df = target.reader(spark, spec)
    sink = LatencySink()
    q = None
    try:
        if prod is not None:
            prod.ready()
        q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", os.path.join(workdir, "ck", run_id))
             .queryName(run_id).start())
        _wait(lambda: _idle(q), _READY_TIMEOUT_S, "starting", q)
        go_us = now_us()
        if prod is None:
            tmp = control + ".tmp"
            with open(tmp, "w") as f:
                f.write(str(go_us))
            os.replace(tmp, control)
            sent = total  # the clock source produces on its own schedule: the wait below covers it
            row.achieved_per_s, row.worst_lag_ms = rate, 0.0
        else:
            prod.go()
            res = prod.result(seconds * 3 + 60)
            sent = int(res["sent"])
            row.achieved_per_s, row.worst_lag_ms = res.get("achieved_per_s"), res.get("worst_lag_ms")
        row.sent = sent
        _wait(lambda: sink.received >= sent, _DRAIN_TIMEOUT_S + (seconds if prod is None else 0.0),
              f"waiting for {sent:,} rows at the sink", q)
        q.stop()
        row.received = sink.received
        if row.received != sent:
            row.note = f"error: {row.received:,} rows at the sink of {sent:,} sent"
        after = go_us + int(plan.warmup_s * 1e6)
        lat = sink.latencies_ms(after)
        row.measured = len(lat)
        row.latency_ms = latency_figures(lat)
        progress = _progress_dicts(q)
        row.batches, row.rows_per_batch, row.duration_ms = batch_figures(progress, after)
        if not row.batches:  # a short run (--quick) whose batches all started in the warm-up
            row.batches, row.rows_per_batch, row.duration_ms = batch_figures(progress, 0)
            row.note = "; ".join(filter(None, [row.note, "batch figures over every batch (none started after the "
                                                           "warm-up)"]))
    finally:
        if q is not None and q.isActive:
            q.stop()
        if prod is not None:
            prod.close()
    return row


# -- the run -----------------------------------------------------------------------------------


def make_spark(kafka: bool, say: Callable[[str], None]) -> tuple[Any, str | None]:
    """spark_io's local[2] session (both our sources registered), the clock source too, every
    progress kept; with ``kafka`` Spark's Kafka source on its class path. -> (session, the Kafka
    connector's version or None)."""
    from .spark_io import make_spark as spark_io_session

    jars: list[str] = []
    version = None
    if kafka:
        from ._kafka import connector_jars

        jars, version = connector_jars()
    spark = spark_io_session(jars)
    spark.dataSource.register(ClockDataSource)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    say("SparkSession up" + (f" (Spark's Kafka source {version})" if version else ""))
    return spark, version


#: how a Python worker's start that outlasted Spark's wait for it shows (an overloaded machine)
_WORKER_START = "failed to connect back"


def measure_again(spark: Any, name: str, target: Target, rate: float, plan: Plan, workdir: str,
                  say: Callable[[str], None], attempts: int = 3) -> Row:
    """:func:`measure`, started again (a new query on a new topic) when its query failed to
    start because a Python worker's start outlasted Spark's wait for it to connect back: every
    query starts a planner worker of its own, and on an overloaded machine that can take longer
    than Spark waits. Nothing was sent when that happens (the producer waits for the query)."""
    for attempt in range(1, attempts + 1):
        try:
            return measure(spark, name, target, rate, plan, workdir)
        except RuntimeError as exc:
            if _WORKER_START not in str(exc) or attempt == attempts:
                raise
            say(f"{name} {rate:,.0f}/s: the query did not start (attempt {attempt} of {attempts}), again: "
                f"{str(exc).splitlines()[0][:200]}")
    raise AssertionError("unreachable")


def warm_up(spark: Any, floor: Target, plan: Plan, workdir: str, say: Callable[[str], None]) -> None:
    """The session's first query starts the Python workers and the foreachBatch callback path:
    a short run of the floor, not reported, so that no source pays for them."""
    warm = measure_again(spark, "floor", floor, 100.0, dataclasses.replace(plan, seconds=1.0, warmup_s=0.0),
                         workdir, say)
    say(f"warm-up query: {warm.sent} rows, p50 {warm.latency_ms.get('p50')} ms")


def run_plan(plan: Plan, workdir: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every source of the plan at every rate: every broker started first, then the rates in
    turn, each rate's runs back to back (so a change in the machine's load meets the sources of
    one rate alike), the sources always in the same order.
    -> ``rows``, ``versions``, ``skipped``, ``timeline``."""
    t_start = time.perf_counter()
    out: dict[str, Any] = {"rows": [], "versions": {}, "skipped": dict(plan.skipped), "timeline": []}

    def say(msg: str) -> None:
        t = time.perf_counter() - t_start
        out["timeline"].append([round(t, 1), msg])
        log(f"[{t:6.1f}s] {msg}")

    sources = list(plan.sources)
    missing = java_missing() if {"real", "kafka"} & set(sources) else None
    if missing:
        for s in ("real", "kafka"):
            if s in sources:
                sources.remove(s)
                out["skipped"][s] = f"skipped: {missing}"
    rates = sorted(set(plan.rates) | {plan.trigger_rate, plan.p99_rate})
    spark = None
    try:
        try:
            spark, kversion = make_spark("kafka" in sources, say)
        except RuntimeError as exc:  # the Kafka connector could not be fetched
            if "kafka" not in sources:
                raise
            sources.remove("kafka")
            out["skipped"]["kafka"] = f"skipped: Spark's Kafka source unavailable: {exc}"
            spark, kversion = make_spark(False, say)
        if kversion:
            out["versions"]["spark_sql_kafka"] = kversion
        with contextlib.ExitStack() as stack:
            up: dict[str, Target] = {}
            for name in dict.fromkeys(["floor", *sources]):
                try:
                    up[name] = stack.enter_context(source_target(name, plan, workdir, say))
                except Exception as exc:  # noqa: BLE001 (one source's failure must not lose the others' rows)
                    if name not in sources:
                        raise
                    say(f"{name}: error at start: {type(exc).__name__}: {exc}")
                    out["rows"].append(Row(name, 0.0, note=f"error at start: {type(exc).__name__}: {str(exc)[:500]}"))
                out["versions"].update(up[name].versions if name in up else {})
            warm_up(spark, up["floor"], plan, workdir, say)
            for rate in rates:
                for name in [n for n in sources if n in up]:
                    try:
                        row = measure_again(spark, name, up[name], rate, plan, workdir, say)
                    except Exception as exc:  # noqa: BLE001 (as above)
                        row = Row(name, rate, up[name].label, note=f"error: {type(exc).__name__}: {str(exc)[:500]}")
                    out["rows"].append(row)
                    say(f"{name:<8} {rate:>7,.0f}/s  sent {row.sent:,} (achieved {row.achieved_per_s}/s)  "
                        f"p50 {row.latency_ms.get('p50')} p99 {row.latency_ms.get('p99')} ms  "
                        f"trigger {row.duration_ms.get('triggerExecution')} ms over {row.batches} batches"
                        + (f"  NOTE {row.note}" if row.note else ""))
            out["rows"].sort(key=lambda r: (sources.index(r.source), r.rate))
    finally:
        if spark is not None:
            spark.stop()
    return out


def _row_at(rows: list[Row], source: str, rate: float) -> Row | None:
    return next((r for r in rows if r.source == source and r.rate == rate and r.ok), None)


def _target(value: float | None, target: float, rate: float, what: str, note: str) -> dict[str, Any]:
    """One target's entry: its figure, its limit (met when at or under it), and without a
    figure the note saying why."""
    return {"value": value, "target": target, "rate": rate, "met": None if value is None else value <= target,
            "what": what, **({} if value is not None else {"note": note})}


def targets(rows: list[Row], plan: Plan, skipped: dict[str, str]) -> dict[str, Any]:
    """The issue's headline ratios, each with its target, the rate it was measured at and
    whether it was met (None with a note when a side is missing)."""
    out: dict[str, Any] = {}

    def why(*sides: tuple[str, Row | None, float | None]) -> str:
        """Why a side has no figure: left out (``skipped``), not run, or its run gave none."""
        return "; ".join(f"{s}: {skipped.get(s, 'not run') if r is None else 'no figure in its run'}"
                         for s, r, v in sides if v is None)

    floor = _row_at(rows, "floor", plan.trigger_rate)
    kafka = _row_at(rows, "kafka", plan.p99_rate)
    for ours in ("embedded", "real"):
        r = _row_at(rows, ours, plan.trigger_rate)
        p = _row_at(rows, ours, plan.p99_rate)
        te = r.duration_ms.get("triggerExecution") if r else None
        fe = floor.duration_ms.get("triggerExecution") if floor else None
        value = round(te / fe, 3) if te is not None and fe else None
        out[f"trigger_ratio_{ours}_to_floor"] = _target(
            value, TRIGGER_TARGET, plan.trigger_rate,
            f"median triggerExecution per non-empty micro-batch, {ours} / floor",
            why((ours, r, te), ("floor", floor, fe)))
        p99 = p.latency_ms.get("p99") if p else None
        k99 = kafka.latency_ms.get("p99") if kafka else None
        ratio = round(p99 / k99, 3) if p99 is not None and k99 else None
        out[f"p99_ratio_{ours}_to_kafka"] = _target(
            ratio, P99_TARGET, plan.p99_rate, f"p99 send -> sink latency, {ours} / Spark's Kafka source",
            why((ours, p, p99), ("kafka", kafka, k99)))
        out[f"p99_ms_{ours}"] = _target(p99, P99_ABS_TARGET_MS, plan.p99_rate,
                                        f"p99 send -> sink latency of {ours} (ms)", why((ours, p, p99)))
    return out


# -- report ------------------------------------------------------------------------------------


def _f(v: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_report(rows: list[Row], tg: dict[str, Any], skipped: dict[str, str]) -> None:
    head = ["source", "rate/s", "achieved/s", "rows", "p50 ms", "p95 ms", "p99 ms", "max ms", "batches",
            "rows/b", *[f"{k} ms" for k in DURATIONS], "note"]
    body = []
    for r in rows:
        lm, dm = r.latency_ms, r.duration_ms
        body.append([r.source, _f(r.rate, "{:,.0f}"), _f(r.achieved_per_s, "{:,.0f}"), f"{r.measured:,}",
                     _f(lm.get("p50")), _f(lm.get("p95")), _f(lm.get("p99")), _f(lm.get("max")), str(r.batches),
                     _f(r.rows_per_batch, "{:,.0f}"), *[_f(dm.get(k), "{:,.0f}") for k in DURATIONS], r.note])
    for s, why in skipped.items():
        body.append([s, *["-"] * (len(head) - 2), why])
    print("\n".join(_report.table(head, body, left=1)))
    print()
    for key, t in tg.items():
        v = t["value"]
        met = "" if t["met"] is None else ("  met" if t["met"] else "  NOT met")
        print(f"{key:<32} {_f(v, '{:,.3f}'):>9}  target <= {t['target']:g} at {t['rate']:,.0f} msgs/s{met}"
              + (f"  ({t['note']})" if "note" in t else ""))


def draw(rows: list[Row], title: str) -> Callable[[str], None]:
    """p50 and p99 against the rate, one line per source (log-log), and the median
    triggerExecution per source and rate."""
    def plot(png: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        by_source: dict[str, list[Row]] = {}
        for r in rows:
            if r.ok:
                by_source.setdefault(r.source, []).append(r)
        panels = [(axes[0], "p50 send -> sink (ms)", lambda r: r.latency_ms["p50"]),
                  (axes[1], "p99 send -> sink (ms)", lambda r: r.latency_ms["p99"]),
                  (axes[2], "median triggerExecution (ms)", lambda r: r.duration_ms.get("triggerExecution", 0.0))]
        for ax, what, val in panels:
            for source, rs in by_source.items():
                rs = sorted(rs, key=lambda r: r.rate)
                style = {"color": "#9e9e9e", "linestyle": "--"} if source == "floor" else {}
                ax.plot([r.rate for r in rs], [max(val(r), 0.1) for r in rs], marker="o", label=source, **style)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("msgs/s", fontsize=8)
            ax.set_title(what, fontsize=9, loc="left")
            ax.tick_params(which="both", labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
        axes[1].axhline(P99_ABS_TARGET_MS, color="#d62728", linestyle="--", linewidth=1)
        if by_source:
            axes[0].legend(fontsize=7)
        else:
            axes[0].text(0.5, 0.5, "no results", ha="center", transform=axes[0].transAxes)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        plt.close(fig)

    return plot


# -- entry point -------------------------------------------------------------------------------


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of rates: {text!r}") from None
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError(f"rates must be positive: {text!r}")
    return rates


def _sources(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in SOURCES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown sources {bad}; choose from {','.join(SOURCES)}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help=f"one rate ({QUICK.rates[0]:g}/s) for {QUICK.seconds:g} s, the floor and the embedded broker "
                        "only (a smoke run)")
    p.add_argument("--rates", type=_rates, default=None,
                   help="producer rates, msgs/s, comma-separated (default 100,1000,10000)")
    p.add_argument("--seconds", type=float, default=None,
                   help=f"measured seconds per rate, after the warm-up (default {FULL.seconds:g})")
    p.add_argument("--warmup", type=float, default=None,
                   help=f"seconds sent before the measured ones, left out of the figures (default {FULL.warmup_s:g})")
    p.add_argument("--sources", type=_sources, default=None,
                   help=f"which sources (default {','.join(SOURCES)}; quick: floor,embedded)")
    p.add_argument("--queues", type=int, default=4,
                   help="queues / partitions per topic (default 4: a RocketMQ topic as the brokers create one)")
    p.add_argument("--body-size", type=int, default=100, help="bytes per message (default 100)")
    p.add_argument("--reader-option", type=key_value, action="append", metavar="KEY=VALUE",
                   help="an option for our reader (repeatable), e.g. minMessagesPerPartition=0 to compare")
    p.add_argument("--trigger-rate", type=float, default=None,
                   help="the rate of the triggerExecution ratio, run too when not among --rates (default 500)")
    p.add_argument("--p99-rate", type=float, default=None,
                   help="the rate of the p99 ratio to Kafka, run too when not among --rates (default 1000)")
    _report.add_results_dir(p)


def plan_of(args: argparse.Namespace) -> Plan:
    base = QUICK if args.quick else FULL
    sources = args.sources or base.sources
    skipped = {s: why for s, why in base.skipped.items() if s not in sources}
    rates = args.rates or base.rates
    # in a quick run without given rates the ratios are taken at its one rate
    trigger_rate = args.trigger_rate or (rates[0] if args.quick else base.trigger_rate)
    p99_rate = args.p99_rate or (rates[0] if args.quick else base.p99_rate)
    return Plan(rates=rates, seconds=args.seconds or base.seconds,
                warmup_s=base.warmup_s if args.warmup is None else args.warmup, sources=sources,
                queues=args.queues, body_size=max(args.body_size, TS_DIGITS), trigger_rate=trigger_rate,
                p99_rate=p99_rate, skipped=skipped, reader_options=tuple(args.reader_option or ()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    plan = plan_of(args)
    workdir = tempfile.mkdtemp(prefix="rocketmq-spark-latency-")
    load_start = os.getloadavg()
    argv = sys.argv[1:]
    try:
        res = run_plan(plan, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows: list[Row] = res["rows"]
    tg = targets(rows, plan, res["skipped"])
    print_report(rows, tg, res["skipped"])
    mi = _provenance.machine_info()
    mi["loadavg_at_start"] = [round(x, 2) for x in load_start]
    mi.update(_provenance.library_versions("pyspark", "pyarrow", "numpy"))
    doc = {
        "benchmark": "latency",
        "quick": bool(args.quick),
        "created": _provenance.created(),
        "git_commit": _provenance.git_commit(),
        "git_modified": _provenance.git_modified(),
        "argv": argv,  # of python -m benchmarks.latency, or of python -m benchmarks (all the suites' options)
        "plan": {**asdict(plan), "what": "each rate for warmup_s + seconds; the warm-up's rows and batches "
                 "left out of the figures"},
        "latency": "send -> sink: the instant the foreachBatch sink's toArrow() returned minus the send time "
                   "in the message (the floor: the instant the row appeared)",
        "targets": tg,
        "rows": [asdict(r) for r in rows],
        "skipped": res["skipped"],
        "versions": res["versions"],
        "machine": mi,
        "timeline": res["timeline"],
    }
    title = "latency: send -> foreachBatch sink" + (" (quick)" if args.quick else "")
    _report.write_results(_report.results_path(args, "latency"), doc, draw(rows, title))
    return 1 if any(r.note.startswith("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
