"""One run of the fault-injection suite (issue 29), modelled on Kafka's copy-under-kills,
OpenChaos's queue checker and Jepsen's total-queue: a workload that logs every send, faults on
a schedule, and a checker that reads everything back and counts.

::

    producer (send log) -> topic A (2 brokers, several queues)
        -> Spark driver process, three streaming queries (own consumer group and checkpoint each)
           -> Parquet | topic B exactly-once | topic C at-least-once (messageGroup = source queue)

A run: start the cluster (:mod:`.cluster`), create the topics, start the driver and the
producer, wait until every query finished a batch, inject faults for ``minutes``
(:mod:`.nemesis`), heal everything, stop the producer, drain the queries with
Trigger.AvailableNow, read every output back and check it (:mod:`.checker`). The result is a
table and a JSON document (``faults-<broker>.json`` in the output directory), with the command
that replays the run's schedule (the seed fixes the faults' kinds, targets, holds and gaps).
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import shlex
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checker import Copy, OutputReport, check_output, read_parquet, read_topic, settled_max_offsets
from .cluster import Cluster, start_cluster
from .driver import Driver, _tail
from .nemesis import FAULTS, run_schedule
from .procs import Suspender
from .workload import ID_DIGITS, Producer, SendLog

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_FAULTS", "SuiteConfig", "SuiteResult", "check_workdir", "judge", "output_lines", "run_suite",
           "verdict"]

#: every fault kind (wipe-broker-now joined once seeds 4603 to 4605 passed on both brokers, run
#: alone for 2 minutes each, after the four bugs seeds 4601 and 4602 found were fixed); runs
#: with a wipe read and write with failOnDataLoss=false (see SuiteConfig)
DEFAULT_FAULTS = tuple(FAULTS)
TOPIC_A, TOPIC_B, TOPIC_C = "FaultsA", "FaultsB", "FaultsC"
#: outputs, in table order: (name, topic or None, what it promises)
OUTPUTS = (("topic A (source)", TOPIC_A), ("parquet", None), ("topic B (exactly-once)", TOPIC_B),
           ("topic C (at-least-once)", TOPIC_C))


@dataclass
class SuiteConfig:
    broker: str = "embedded"
    seed: int = 0
    #: how long faults are injected (the run takes longer: start, drain, check)
    minutes: float = 2.0
    faults: tuple[str, ...] = DEFAULT_FAULTS
    out: Path = Path("fault-results")
    #: messages per second, over every queue of topic A
    rate: float = 200.0
    batch: int = 10
    #: queues per broker of topic A, and of topics B and C
    queues: int = 2
    out_queues: int = 2
    concurrency: int = 1
    trigger_ms: int = 2000
    #: seconds a fault holds (a pause, a partition, a delay), and between two faults of a lane
    hold_s: tuple[float, float] = (3.0, 10.0)
    gap_s: tuple[float, float] = (2.0, 6.0)
    use_netns: bool = True
    #: the Apache RocketMQ release of broker kind real (None: real_rocketmq.VERSION)
    release: str | None = None
    #: the queries' failOnDataLoss; None: false when wipe-broker is injected (the queues of a
    #: wiped broker start again at offset 0: with false the reader reads them again from there,
    #: with true it fails naming them, and so would every restart), else true
    fail_on_data_loss: bool | None = None
    #: more options of the three queries' reader, e.g. (("subscribePattern", "FaultsA"),); a
    #: subscribePattern replaces the option topic
    reader_options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        names = dict(self.reader_options)
        if "failOnDataLoss" in names:
            raise ValueError("reader option failOnDataLoss: the suite sets it (its verdict depends on it)")
        pattern = names.get("subscribePattern")
        if pattern is not None:
            read = {t for t in (TOPIC_A, TOPIC_B, TOPIC_C) if re.fullmatch(pattern, t)}
            if read != {TOPIC_A}:
                raise ValueError(f"reader option subscribePattern={pattern!r} matches {sorted(read)}: it must match "
                                 f"{TOPIC_A} alone (the queries would read their own outputs)")

    def command(self) -> str:
        """The command line that runs this configuration again."""
        args = ["python", "-m", "tests.faults", "run", "--brokers", self.broker, "--minutes", f"{self.minutes:g}",
                "--seed", str(self.seed), "--faults", ",".join(self.faults), "--concurrency", str(self.concurrency),
                "--rate", f"{self.rate:g}", "--queues", str(self.queues),
                "--hold", f"{self.hold_s[0]:g},{self.hold_s[1]:g}", "--gap", f"{self.gap_s[0]:g},{self.gap_s[1]:g}"]
        if not self.use_netns:
            args.append("--no-netns")
        if self.release is not None and self.broker == "real":
            args += ["--release", self.release]
        for k, v in self.reader_options:
            args += ["--reader-option", f"{k}={v}"]
        return " ".join(shlex.quote(a) for a in args)


@dataclass
class SuiteResult:
    doc: dict[str, Any]
    outputs: dict[str, OutputReport]
    table: str
    failures: list[str]
    #: fault kinds that could not run here, with why
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


class Run:
    """What the faults act on, and the run's record of events."""

    def __init__(self, cfg: SuiteConfig, workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.t0 = time.time()
        self.events: list[dict[str, Any]] = []
        self._events_lock = threading.Lock()
        self._events_file = open(workdir / "events.jsonl", "a", encoding="utf-8")
        self.suspender = Suspender()
        self.topic_a = TOPIC_A
        self.fail_on_data_loss = (cfg.fail_on_data_loss if cfg.fail_on_data_loss is not None
                                  else not {"wipe-broker", "wipe-broker-now"} & set(cfg.faults))
        self.topics = {TOPIC_A: cfg.queues, TOPIC_B: cfg.out_queues, TOPIC_C: cfg.out_queues}
        #: per wipe: the broker, whether the queries had read all of it, and what it held
        self.wipes: list[Wipe] = []
        #: time.monotonic() when no fault may start any more (faults waiting for the driver give up)
        self.schedule_end = float("inf")
        self.cluster: Cluster
        self.producer: Producer
        self.driver: Driver

    def event(self, kind: str, detail: dict[str, Any]) -> dict[str, Any]:
        ev = {"t": round(time.time() - self.t0, 2), "kind": kind, **detail}
        with self._events_lock:
            self.events.append(ev)
            self._events_file.write(json.dumps(ev, default=str) + "\n")
            self._events_file.flush()
        log.info("%7.1fs %s %s", ev["t"], kind, {k: v for k, v in detail.items() if k != "tail"})
        return ev

    def inject(self, kind: str, target: str, apply: Callable[[], dict[str, Any]]) -> None:
        start = time.time()
        try:
            detail = apply()
        except Exception as exc:
            detail = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        self.event("fault", {"fault": kind, "target": target, "start": round(start - self.t0, 2),
                             "duration_s": round(time.time() - start, 2), **detail})

    def record_wipe(self, broker: str, caught_up: bool, snapshot: dict[str, list[Copy]]) -> None:
        wipe = Wipe(broker, caught_up, snapshot, int(time.time() * 1000))
        wipe.save(self.workdir / f"wiped-{len(self.wipes)}-{broker}.json")
        self.wipes.append(wipe)

    def heal_all(self) -> None:
        """Everything back: stopped processes continued, the proxy and the link healed, every
        server running, the cluster routing every topic to both brokers, the producer on."""
        self.suspender.resume_all()
        self.cluster.proxy.heal()
        if self.cluster.netns is not None and self.cluster.netns.partitioned:
            self.cluster.netns.heal()
        for target in ("namesrv", "broker-a", "broker-b"):
            if not self.cluster.running(target):
                self.event("restart", {"target": target, "why": "found down at the end"})
                self.cluster.start(target)
        self.cluster.wait_healthy()
        self.producer.resume()

    def close(self) -> None:
        self._events_file.close()


def run_suite(cfg: SuiteConfig) -> SuiteResult:
    """Runs the suite once (see the module docstring); never raises for what it finds: the
    result's ``failures`` list it, and an error of the run itself is one of them."""
    out = Path(cfg.out)
    workdir = out / f"run-{cfg.broker}-seed{cfg.seed}"
    if workdir.exists():
        import shutil

        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    run = Run(cfg, workdir)
    unknown = [k for k in cfg.faults if k not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULTS)}")
    fail_on_data_loss = run.fail_on_data_loss
    skipped: dict[str, str] = {}
    failures: list[str] = []
    outputs: dict[str, OutputReport] = {}
    phases: dict[str, float] = {}
    drained = False
    t_start = time.monotonic()

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - t_start, 1)
        log.info("phase %s at %.1fs", name, phases[name])

    cluster = None
    producer = None
    driver = None
    try:
        cluster = run.cluster = start_cluster(cfg.broker, workdir / "cluster", use_netns=cfg.use_netns,
                                              release=cfg.release)
        phase("cluster started")
        kinds = []
        for k in cfg.faults:
            if FAULTS[k].needs == "netns" and cluster.netns is None:
                skipped[k] = f"broker-b is not in a network namespace: {cluster.netns_reason}"
            else:
                kinds.append(k)
        cluster.create_topics(run.topics)
        driver = run.driver = Driver(workdir, {"namesrv": cluster.namesrv_addr, "topic_a": TOPIC_A, "topic_b": TOPIC_B,
                                               "topic_c": TOPIC_C, "trigger_ms": cfg.trigger_ms,
                                               "fail_on_data_loss": fail_on_data_loss, "id_digits": ID_DIGITS,
                                               "reader_options": dict(cfg.reader_options)},
                                     run.event)
        driver.start()
        driver.supervise()
        producer = run.producer = Producer(cluster.namesrv_addr, TOPIC_A, str(workdir / "sends.jsonl"), rate=cfg.rate,
                                           batch=cfg.batch)
        producer.start()
        since = time.time()
        deadline = time.monotonic() + 300
        while not driver.progressed_since(since):
            if len(driver.unplanned_exits) >= 2:
                raise RuntimeError(f"the pipeline's driver exited twice before its first batches; the end of "
                                   f"{driver.log_path}:\n{_tail(driver.log_path)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pipeline finished no batch of every query within 300 s; see "
                                   f"{driver.log_path}")
            time.sleep(0.5)
        phase("pipeline running")
        if kinds:
            run_schedule(run, kinds, cfg.minutes * 60, cfg.concurrency, cfg.seed)
        else:
            time.sleep(cfg.minutes * 60)
        phase("faults over")
        run.heal_all()
        phase("healed")
        producer.stop()
        run.event("producer-stopped", dict(producer.counts))
        drained = driver.drain()
        phase("drained")
        if not drained:
            failures.append(f"the pipeline did not drain (see {workdir}/driver-*.log)")
        else:
            outputs = _check(run, workdir)
            phase("checked")
    except Exception as exc:
        failures.append(f"the run failed: {type(exc).__name__}: {exc}")
        log.exception("fault suite run failed")
    finally:
        for what, close in (("driver", driver.close if driver else None),
                            ("producer", producer.stop if producer and not producer.stopped else None),
                            ("cluster", cluster.close if cluster else None)):
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("closing the %s failed", what)
        run.suspender.resume_all()
        run.close()
    failures += verdict(outputs) if outputs else []
    # a fault that could not be injected or healed as it says (a broker that would not start
    # again, say) is a finding too, the product's or the suite's: never passed over
    failures += [f"fault {e['fault']} on {e['target']} failed: {e['error']}" for e in run.events
                 if e["kind"] == "fault" and "error" in e]
    doc = _document(cfg, run, outputs, skipped, failures, phases, drained)
    table = format_table(doc)
    result_path = out / f"faults-{cfg.broker}.json"
    doc["table"] = table.splitlines()
    with open(result_path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    return SuiteResult(doc, outputs, table, failures, skipped)


def _row(c: Copy) -> list[Any]:
    """A copy as kept in a run's files (``Copy(*row)`` reads it back)."""
    return [c.queue, c.offset, c.id, c.stored_ms]


@dataclass
class Wipe:
    """A broker's store wiped on purpose: what it held just before (topic -> copies), whether
    every query had read all of topic A there (if not, the unread part is counted as lost by the
    broker), and when (epoch ms, after that read and before the broker was killed)."""

    broker: str
    caught_up: bool
    copies: dict[str, list[Copy]]
    at_ms: int

    def save(self, path: Path) -> None:
        with open(path, "w") as f:
            json.dump({"broker": self.broker, "caught_up": self.caught_up, "at_ms": self.at_ms,
                       "copies": {t: [_row(c) for c in cs] for t, cs in self.copies.items()}}, f)

    @classmethod
    def load(cls, path: Path) -> Wipe:
        with open(path) as f:
            d = json.load(f)
        return cls(d["broker"], d["caught_up"], {t: [Copy(*c) for c in cs] for t, cs in d["copies"].items()},
                   d["at_ms"])


def _check(run: Run, workdir: Path) -> dict[str, OutputReport]:
    """Reads every output back (kept in ``readback.json.gz``) and judges it."""
    ns = run.cluster.namesrv_addr
    settled_max_offsets(ns, *run.topics)
    copies = {"A": read_topic(ns, TOPIC_A), "B": read_topic(ns, TOPIC_B), "C": read_topic(ns, TOPIC_C),
              "parquet": read_parquet(str(workdir / "parquet"))}
    with gzip.open(workdir / "readback.json.gz", "wt") as f:  # every copy read, for a post-mortem
        json.dump({name: [_row(x) for x in cs] for name, cs in copies.items()}, f)
    return judge(SendLog.load(workdir / "sends.jsonl"), copies, run.wipes)


def check_workdir(workdir: Path) -> dict[str, OutputReport]:
    """:func:`judge` again from what a run kept (its send log, read-back and wipes)."""
    with gzip.open(workdir / "readback.json.gz", "rt") as f:
        copies = {name: [Copy(*c) for c in cs] for name, cs in json.load(f).items()}
    wipes = [Wipe.load(p) for p in sorted(workdir.glob("wiped-*.json"), key=lambda p: int(p.name.split("-")[1]))]
    return judge(SendLog.load(workdir / "sends.jsonl"), copies, wipes)


def judge(sends: SendLog, copies: dict[str, list[Copy]], wipes: list[Wipe]) -> dict[str, OutputReport]:
    """The reports of topic A and the three outputs (``copies``: "A", "B", "C", "parquet")."""
    wiped = {t: [c for w in wipes for c in w.copies.get(t, [])] for t in (TOPIC_A, TOPIC_B, TOPIC_C)}
    src = check_output("topic A (source)", sends, copies["A"], wiped=wiped[TOPIC_A], order="queue")
    # the source's losses are the brokers' (acked sends that topic A lacks)
    src.lost_by_broker = list(src.lost)
    broker_lost = set(src.lost)
    # a wipe before the queries had read everything took what they had not read with it
    excused = {c.id for w in wipes if not w.caught_up for c in w.copies[TOPIC_A] if c.id is not None}
    # ... and cut short the commit under way: what it had stored there, written again once after
    # the wipe by its replay, is rewritten (id -> when it was wiped; wipes come in time order, an
    # id in two of them is doubled)
    rewrites = {c.id: w.at_ms for w in wipes if not w.caught_up for c in w.copies.get(TOPIC_B, []) if c.id is not None}
    # each id's place in topic A: (wipes of its broker before it was stored, offset)
    source: dict[int, tuple[str, tuple[int, int]]] = {}
    epoch: Counter[str] = Counter()
    for w in wipes:
        for x in w.copies[TOPIC_A]:
            if x.id is not None:
                source.setdefault(x.id, (x.queue, (epoch[w.broker], x.offset)))
        epoch[w.broker] += 1
    for x in copies["A"]:
        if x.id is not None:
            source.setdefault(x.id, (x.queue, (epoch[x.queue.rsplit(":", 1)[0]], x.offset)))
    return {
        src.name: src,
        "parquet": check_output("parquet", sends, copies["parquet"], broker_lost=broker_lost, excused=excused),
        "topic B (exactly-once)": check_output("topic B (exactly-once)", sends, copies["B"], wiped=wiped[TOPIC_B],
                                               broker_lost=broker_lost, excused=excused, rewrite_excused=rewrites),
        "topic C (at-least-once)": check_output("topic C (at-least-once)", sends, copies["C"], wiped=wiped[TOPIC_C],
                                                broker_lost=broker_lost, excused=excused, source=source,
                                                order="group"),
    }


def verdict(outputs: dict[str, OutputReport]) -> list[str]:
    """Lost 0 everywhere; duplicates 0 in topic A, Parquet and topic B; no reordering where
    order is promised; nothing unexpected."""
    out = []
    for name, r in outputs.items():
        if r.lost:
            broker = f", {len(r.lost_by_broker)} of them lost by the brokers" if r.lost_by_broker else ""
            out.append(f"{name}: {len(r.lost)} acked messages lost{broker} (e.g. ids {r.lost[:5]})")
        if r.duplicates and not name.startswith("topic C"):
            out.append(f"{name}: {r.duplicates} duplicate copies of {len(r.duplicated)} messages "
                       f"(e.g. ids {sorted(r.duplicated)[:5]})")
        if r.reordered:
            out.append(f"{name}: {len(r.reordered)} messages out of order (e.g. ids {sorted(r.reordered)[:5]})")
        if r.unexpected or r.garbled:
            out.append(f"{name}: {len(r.unexpected)} ids never sent as acked or unknown (e.g. {r.unexpected[:5]}), "
                       f"{r.garbled} bodies with no id")
    return out


def _document(cfg: SuiteConfig, run: Run, outputs: dict[str, OutputReport], skipped: dict[str, str],
              failures: list[str], phases: dict[str, float], drained: bool) -> dict[str, Any]:
    faults = [e for e in run.events if e["kind"] == "fault"]
    injected = Counter(e["fault"] for e in faults if "skipped" not in e and "error" not in e)
    targets = Counter(f"{e['fault']} {e['target']}" for e in faults if "skipped" not in e and "error" not in e)
    producer = getattr(run, "producer", None)
    driver = getattr(run, "driver", None)
    sends = None
    if (run.workdir / "sends.jsonl").exists():
        log_ = SendLog.load(run.workdir / "sends.jsonl")
        sends = {"acked": len(log_.acked), "unknown": len(log_.unknown), "failed": len(log_.failed)}
    return {
        "suite": "faults", "broker": cfg.broker, "seed": cfg.seed, "minutes": cfg.minutes,
        "concurrency": cfg.concurrency, "rate": cfg.rate, "command": cfg.command(),
        "fail_on_data_loss": run.fail_on_data_loss,
        "workdir": str(run.workdir),
        "faults_requested": list(cfg.faults), "faults_skipped": skipped,
        "faults_injected": dict(sorted(injected.items())), "faults_by_target": dict(sorted(targets.items())),
        "fault_errors": [e for e in faults if "error" in e],
        "faults_without_effect": [e for e in faults if "skipped" in e],
        "messages": sends or (dict(producer.counts) if producer is not None else {}),
        "producer_active_s": round(producer.active_s, 1) if producer is not None else 0.0,
        "driver": {"starts": driver.starts if driver else 0,
                   "exits_after_failure": driver.unplanned_exits if driver else []},
        "wipes": [{"broker": w.broker, "caught_up": w.caught_up, "held": {t: len(c) for t, c in w.copies.items()}}
                  for w in run.wipes],
        "drained": drained, "phases_s": phases,
        "outputs": {name: r.summary() for name, r in outputs.items()},
        "verdict": "pass" if not failures else "fail", "failures": failures,
        "events": run.events,
    }


def output_lines(outputs: dict[str, dict[str, Any]]) -> list[str]:
    """The per-output rows of the table (``outputs``: :meth:`OutputReport.summary` by name)."""
    lines = [f"{'output':<24}{'read':>9}{'lost':>7}{'by broker':>11}{'duplicated':>12}{'reordered':>11}"
             f"{'unexpected':>12}{'unknown found':>15}{'wiped':>8}{'lost with store':>17}"]
    for name, o in outputs.items():
        reord = "-" if o["reordered"] is None else str(o["reordered"])
        lines.append(f"{name:<24}{o['read']:>9,}{o['lost']:>7}{o['lost_by_broker']:>11}{o['duplicated']:>12}"
                     f"{reord:>11}{o['unexpected'] + o['garbled']:>12}{o['unknown_found']:>15}{o['wiped']:>8}"
                     f"{o['lost_with_store']:>17}")
    for name, o in outputs.items():
        if o.get("rewritten"):
            lines.append(f"{name}: {o['rewritten']} rows a store wiped at once held, written again after it "
                         f"(by the replay of a commit the wipe cut short; allowed), e.g. ids {o['rewritten_ids'][:5]}")
    return lines


def format_table(doc: dict[str, Any]) -> str:
    lines = [f"fault suite, {doc['broker']} broker: seed {doc['seed']}, {doc['minutes']:g} min of faults, "
             f"concurrency {doc['concurrency']}, {doc['rate']:g} msgs/s, failOnDataLoss={doc['fail_on_data_loss']}"]
    inj = doc["faults_injected"]
    lines.append("faults injected: " + (", ".join(f"{k} {v}" for k, v in inj.items()) or "none")
                 + f" (total {sum(inj.values())})")
    if doc["faults_by_target"]:
        lines.append("  by target: " + ", ".join(f"{k} {v}" for k, v in doc["faults_by_target"].items()))
    for k, why in doc["faults_skipped"].items():
        lines.append(f"fault skipped: {k}: {why}")
    if doc["faults_without_effect"]:
        lines.append(f"faults without effect: {len(doc['faults_without_effect'])} "
                     f"({'; '.join(e['fault'] + ': ' + e['skipped'] for e in doc['faults_without_effect'])})")
    for e in doc["fault_errors"]:
        lines.append(f"fault error: {e['fault']} {e['target']}: {e['error']}")
    m = doc["messages"]
    if m:
        lines.append(f"messages sent: {m.get('acked', 0):,} acked, {m.get('unknown', 0):,} with unknown outcome, "
                     f"{m.get('failed', 0):,} failed (not sent), in {doc.get('producer_active_s', 0):g} s of "
                     f"sending (pauses for wipes left out)")
    d = doc["driver"]
    lines.append(f"driver: {d['starts']} starts, {len(d['exits_after_failure'])} exits after a query failed")
    for e in doc["events"]:
        if e["kind"] == "driver-exit":
            lines.append(f"  at {e['t']:.0f}s, code {e['code']} ({e['log']}): {e.get('reason') or 'no error found'}")
    if doc["outputs"]:
        lines += output_lines(doc["outputs"])
    lines.append(f"verdict: {doc['verdict'].upper()}" + ("" if not doc["failures"] else ""))
    for f in doc["failures"]:
        lines.append(f"  - {f}")
    lines.append(f"replay: {doc['command']}")
    return "\n".join(lines)
