"""The faults the suite injects, and the schedule that injects them.

Each fault takes a target, injects, holds for a random time, heals, and returns what it did.
A fault claims what it acts on (the driver, a broker, the name server, the link to broker-a
through the proxy, the link to broker-b through the veth, the producer) so that faults run
concurrently (``concurrency`` > 1) never act on the same thing at once. With one lane the
choices (kinds, targets, holds, gaps) depend on the seed alone, so a seed replays a schedule.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .checker import read_topic, settled_max_offsets
from .driver import QUERIES

if TYPE_CHECKING:
    from .suite import Run

log = logging.getLogger(__name__)

__all__ = ["DRIVER_SIDE", "FAULTS", "Fault", "lanes_of", "run_schedule"]


@dataclass(frozen=True)
class Fault:
    name: str
    help: str
    #: target for this injection (rng: the lane's random source)
    pick: Callable[[Run, random.Random], str]
    #: what it claims while it runs
    claims: Callable[[str], frozenset[str]]
    apply: Callable[[Run, random.Random, str], dict[str, Any]]
    #: "netns" when it needs a network namespace (root)
    needs: str | None = None


def _hold(run: Run, rng: random.Random) -> float:
    lo, hi = run.cfg.hold_s
    return round(rng.uniform(lo, hi), 2)


def _broker(run: Run, rng: random.Random) -> str:
    return rng.choice(("broker-a", "broker-b"))


def _driver(run: Run, rng: random.Random) -> str:
    return "driver"


def _only(name: str) -> Callable[[Run, random.Random], str]:
    return lambda run, rng: name


def _itself(target: str) -> frozenset[str]:
    return frozenset({target})


# -- the driver and its workers ------------------------------------------------------------------


def _wait_running(run: Run, timeout_s: float = 90.0) -> bool:
    """Until the driver started last has finished a batch of some query (a fault then lands on
    a pipeline at work, not on one still starting); False after ``timeout_s`` or once the
    schedule's time is up."""
    deadline = min(time.monotonic() + timeout_s, run.schedule_end)
    while time.monotonic() < deadline:
        since = run.driver.started_at
        if run.driver.pid is not None and any(run.driver.progressed_since(since, (q,)) for q in QUERIES):
            return True
        time.sleep(0.2)
    return False


def _kill_driver(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    working = _wait_running(run)
    if not working and time.monotonic() >= run.schedule_end:
        return {"skipped": "the driver finished no batch since its last start before the schedule's end"}
    time.sleep(rng.uniform(0.0, 2.0))  # a random point of a batch: planning, tasks, the sink's commit
    down = round(rng.uniform(0.0, 2.0), 2)
    with run.driver.lock:
        pid = run.driver.kill()
        time.sleep(down)
        new = run.driver.start()
    return {"pid": pid, "down_s": down, "was_working": working, "new_pid": new}


def _pause_driver(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    working = _wait_running(run)
    if not working and time.monotonic() >= run.schedule_end:
        return {"skipped": "the driver finished no batch since its last start before the schedule's end"}
    hold = _hold(run, rng)
    with run.driver.lock:
        pid = run.driver.pid
        if pid is None:
            return {"skipped": "no driver running"}
        stopped = run.suspender.stop(pid)
    time.sleep(hold)
    for p in stopped:
        run.suspender.resume(p)
    return {"pid": pid, "processes": len(stopped), "hold_s": hold, "was_working": working}


def _a_worker(run: Run, rng: random.Random, timeout_s: float = 30.0) -> int | None:
    """A task worker of the driver chosen at random (waiting for one to exist)."""
    _wait_running(run)
    deadline = min(time.monotonic() + timeout_s, run.schedule_end)
    while time.monotonic() < deadline:
        pids = sorted(w.pid for w in run.driver.task_workers())
        if pids:
            return rng.choice(pids)
        time.sleep(0.1)
    return None


def _kill_worker(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    pid = _a_worker(run, rng)
    if pid is None:
        return {"skipped": "no Python worker of the driver found before the schedule's end"}
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return {"skipped": f"worker {pid} ended first"}
    return {"pid": pid}


def _pause_worker(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    hold = _hold(run, rng)
    pid = _a_worker(run, rng)
    if pid is None:
        return {"skipped": "no Python worker of the driver found before the schedule's end"}
    stopped = run.suspender.stop(pid, tree=False)
    time.sleep(hold)
    for p in stopped:
        run.suspender.resume(p)
    return {"pid": pid, "hold_s": hold}


# -- brokers and the name server -----------------------------------------------------------------


def _kill_server(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    pid = run.cluster.pid(target)
    down = round(rng.uniform(0.5, run.cfg.hold_s[0]), 2)
    run.cluster.kill(target)
    time.sleep(down)
    t = time.monotonic()
    run.cluster.start(target)
    return {"pid": pid, "down_s": down, "restart_s": round(time.monotonic() - t, 1)}


def _pause_server(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    pid = run.cluster.pid(target)
    if pid is None:
        return {"skipped": f"{target} is not running"}
    hold = _hold(run, rng)
    stopped = run.suspender.stop(pid)
    time.sleep(hold)
    for p in stopped:
        run.suspender.resume(p)
    return {"pid": pid, "hold_s": hold}


def _caught_up(run: Run, broker: str, timeout_s: float) -> bool:
    """Until every query finished a batch ending exactly at the max offsets of topic A's queues
    on ``broker`` (the producer is paused: nothing new comes), then until topics B and C stop
    growing there (Apache RocketMQ makes a committed message readable a moment after its END).
    Exactly: after an earlier wipe a query's last end may still be the old store's offset,
    above anything the new store holds."""
    ns = run.cluster.namesrv_addr
    ends = {mq: off for mq, off in settled_max_offsets(ns, run.topic_a, quiet_s=0.5).items() if mq.broker == broker}
    deadline = time.monotonic() + timeout_s
    while True:
        if all(all(run.driver.read_up_to(q).get(mq) == off for mq, off in ends.items()) for q in QUERIES):
            break
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    settled_max_offsets(ns, *(t for t in run.topics if t != run.topic_a), quiet_s=1.0, timeout_s=30.0)
    return True


def _replace_store(run: Run, target: str, caught_up: bool, snapshot: dict[str, Any]) -> int | None:
    """Records the wipe with what ``target`` held (``snapshot``), then kills it, deletes its
    store, starts it and creates the topics again; returns the pid it had."""
    run.record_wipe(target, caught_up, snapshot)
    pid = run.cluster.pid(target)
    run.cluster.kill(target)
    run.cluster.wipe(target)
    run.cluster.start(target)
    run.cluster.create_topics(run.topics, brokers=(target,))
    return pid


def _wipe_broker(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    """A broker restarted with a new, empty disk. Beforehand the producer pauses and the
    suite waits until every query read and committed all of topic A on that broker, and
    reads what the broker holds of every topic: those copies are counted as ``wiped`` (lost
    with the disk, on purpose), not as lost. What comes after is the pipeline's to handle:
    the broker's queues start again at offset 0 behind the checkpoints' offsets."""
    run.producer.pause()
    try:
        # a wipe starts from a routed cluster: right after a name server restart the brokers
        # have not registered again yet (up to their 30 s period), and the reads below need routes
        run.cluster.wait_healthy(120.0)
        caught_up = _caught_up(run, target, 120.0)
        snapshot = {t: read_topic(run.cluster.namesrv_addr, t, brokers=[target]) for t in run.topics}
        pid = _replace_store(run, target, caught_up, snapshot)
    finally:
        run.producer.resume()
    return {"pid": pid, "caught_up": caught_up, "wiped": {t: len(c) for t, c in snapshot.items()}}


def _settled(ns: str, topics: Sequence[str], target: str, direct: dict[str, str],
             timeout_s: float = 30.0) -> dict[str, list[Any]]:
    """What ``target`` holds of ``topics`` once it has stopped changing: three reads 0.5 s apart
    that agree (a second of quiet: a dispatch stalled by a pause of the broker's JVM is not taken
    for done). A broker acknowledges a send once its commit log has it; its queues list it a
    moment later (Apache RocketMQ dispatches them in a thread of their own), so a read made as
    the clients are cut off may miss a message a producer was told is stored."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, int] | None = None
    agreed = 0
    while True:
        snapshot = {t: read_topic(ns, t, brokers=[target], direct=direct) for t in topics}
        sizes = {t: len(c) for t, c in snapshot.items()}
        agreed = agreed + 1 if sizes == seen else 0
        if agreed >= 2:
            return snapshot
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target} was still storing {timeout_s:.0f}s after its clients were cut off: "
                               f"{seen} then {sizes} messages")
        seen = sizes
        time.sleep(0.5)


def _wipe_broker_now(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    """broker-a's store lost at once, while the queries read it: no waiting for them. Clients
    are cut off first (the proxy refuses and resets: what the broker holds is final), what it
    holds is read past the proxy, then it is killed, wiped, started and given its topics again.
    What the queries had not read is lost with the store (``lost_with_store``, allowed);
    nothing else may be lost, and nothing read twice."""
    proxy = run.cluster.proxy
    ns = run.cluster.namesrv_addr
    run.producer.pause()
    try:
        # as _wipe_broker: from a routed cluster (after a name server restart the routes list no
        # queue of the broker until it registers again, and the snapshot read none: seed 4501 on
        # Apache RocketMQ counted 5,890 wiped messages as lost by the broker)
        run.cluster.wait_healthy(120.0)
        proxy.refuse()
        proxy.reset_all()
        snapshot = _settled(ns, run.topics, target, {target: run.cluster.direct_addr(target)})
        pid = _replace_store(run, target, False, snapshot)
    finally:
        proxy.heal()
        run.producer.resume()
    return {"pid": pid, "wiped": {t: len(c) for t, c in snapshot.items()}}


# -- the network ---------------------------------------------------------------------------------


def _proxy_fault(inject: Callable[[Run, random.Random], dict[str, Any]]
                 ) -> Callable[[Run, random.Random, str], dict[str, Any]]:
    def apply(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
        hold = _hold(run, rng)
        detail = inject(run, rng)
        try:
            time.sleep(hold)
        finally:
            run.cluster.proxy.heal()
        return {**detail, "hold_s": hold}

    return apply


def _delay(run: Run, rng: random.Random) -> dict[str, Any]:
    ms = round(rng.uniform(50, 800))
    jitter = round(ms * rng.uniform(0, 0.5))
    run.cluster.proxy.delay(ms, jitter_ms=jitter)
    return {"delay_ms": ms, "jitter_ms": jitter}


def _loss(run: Run, rng: random.Random) -> dict[str, Any]:
    p = round(rng.uniform(0.05, 0.4), 2)
    run.cluster.proxy.drop(p, rto_ms=200)
    return {"probability": p}


def _half_open(run: Run, rng: random.Random) -> dict[str, Any]:
    run.cluster.proxy.blackhole()
    return {}


def _refuse(run: Run, rng: random.Random) -> dict[str, Any]:
    run.cluster.proxy.refuse()
    return {"reset": run.cluster.proxy.reset_all()}


def _reset(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    hold = _hold(run, rng)
    end = time.monotonic() + hold
    resets = rounds = 0
    while True:
        resets += run.cluster.proxy.reset_all()
        rounds += 1
        left = end - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(left, rng.uniform(0.3, 2.0)))
    return {"rounds": rounds, "connections_reset": resets, "hold_s": hold}


def _partition(run: Run, rng: random.Random, target: str) -> dict[str, Any]:
    ns = run.cluster.netns
    assert ns is not None
    hold = _hold(run, rng)
    ns.partition()
    try:
        time.sleep(hold)
    finally:
        ns.heal()
    return {"hold_s": hold}


_LINK_A = frozenset({"link-a"})

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("kill-driver", "SIGKILL the Spark driver with its JVM and Python workers, restart it on its checkpoints",
          _driver, _itself, _kill_driver),
    Fault("pause-driver", "SIGSTOP the driver, its JVM and workers for a while, then SIGCONT",
          _driver, _itself, _pause_driver),
    Fault("kill-worker", "SIGKILL one Python worker of the driver's executor (its task fails and is retried)",
          _driver, _itself, _kill_worker),
    Fault("pause-worker", "SIGSTOP one Python worker of the executor for a while, then SIGCONT",
          _driver, _itself, _pause_worker),
    Fault("kill-broker", "SIGKILL broker-a or broker-b, restart it with its store",
          _broker, _itself, _kill_server),
    Fault("pause-broker", "SIGSTOP broker-a or broker-b for a while, then SIGCONT",
          _broker, _itself, _pause_server),
    Fault("wipe-broker", "restart broker-a or broker-b with an empty store (a lost disk), topics created again",
          _broker, lambda b: frozenset({b, "link-a" if b == "broker-a" else "link-b", "producer"}), _wipe_broker),
    Fault("wipe-broker-now", "restart broker-a with an empty store at once, while the queries read it (what they "
          "had not read is lost with it, allowed)", _only("broker-a"),
          lambda b: frozenset({b, "link-a", "producer"}), _wipe_broker_now),
    Fault("restart-namesrv", "SIGKILL the name server, start it again (routes return as brokers register)",
          _only("namesrv"), _itself, _kill_server),
    Fault("delay", "add 50-800 ms (+ jitter) each way between every client and broker-a (the proxy)",
          _only("link-a"), lambda t: _LINK_A, _proxy_fault(_delay)),
    Fault("loss", "packet loss to broker-a as TCP shows it: chunks held back 200 ms (the proxy)",
          _only("link-a"), lambda t: _LINK_A, _proxy_fault(_loss)),
    Fault("half-open", "connections to broker-a stay open and pass nothing (the proxy blackholes them)",
          _only("link-a"), lambda t: _LINK_A, _proxy_fault(_half_open)),
    Fault("refuse", "broker-a's port refuses connections and open ones are reset (the proxy)",
          _only("link-a"), lambda t: _LINK_A, _proxy_fault(_refuse)),
    Fault("reset", "every connection to broker-a reset (RST), again and again for a while (the proxy)",
          _only("link-a"), lambda t: _LINK_A, _reset),
    Fault("partition", "the veth link to broker-b's network namespace goes down, then up (needs root)",
          _only("link-b"), _itself, _partition, needs="netns"),
)}


#: faults of the Spark side; the others act on the cluster (brokers, name server, network)
DRIVER_SIDE = ("kill-driver", "pause-driver", "kill-worker", "pause-worker")


def lanes_of(kinds: list[str], concurrency: int) -> list[list[str]]:
    """The kinds each lane draws from: one lane, every kind; two or more, the first lane the
    Spark side's and the others the cluster's (when both sides have kinds), so that faults of
    both sides mix while each lane's choices still depend on the seed alone (their claims never
    meet)."""
    driver = [k for k in kinds if k in DRIVER_SIDE]
    cluster = [k for k in kinds if k not in DRIVER_SIDE]
    if concurrency == 1 or not driver or not cluster:
        return [kinds[:] for _ in range(concurrency)]
    return [driver] + [cluster[:] for _ in range(concurrency - 1)]


def run_schedule(run: Run, kinds: list[str], duration_s: float, concurrency: int, seed: int) -> None:
    """Injects faults of ``kinds`` for ``duration_s``: ``concurrency`` lanes (see
    :func:`lanes_of`), each drawing from its own random source (seeded from ``seed``): first
    every kind of the lane once in a shuffled order (so a short run covers them all), then
    kinds at random; a gap of ``cfg.gap_s`` between two faults of a lane. A fault running at
    the end finishes (and heals) first."""
    end = run.schedule_end = time.monotonic() + duration_s
    claimed: set[str] = set()
    lock = threading.Lock()
    lane_kinds = lanes_of(kinds, concurrency)

    def lane(index: int) -> None:
        rng = random.Random(f"{seed}/{index}")
        kinds = lane_kinds[index]
        todo = kinds[:]
        rng.shuffle(todo)
        while True:
            gap = rng.uniform(*run.cfg.gap_s)
            time.sleep(max(0.0, min(gap, end - time.monotonic())))
            if time.monotonic() >= end:
                return
            with lock:
                choice = None
                for kind in (todo + [rng.choice(kinds)] if todo else [rng.choice(kinds)]):
                    fault = FAULTS[kind]
                    target = fault.pick(run, rng)
                    claims = fault.claims(target)
                    if not claims & claimed:
                        choice = (fault, target, claims)
                        break
                if choice is None:
                    time.sleep(0.2)
                    continue
                fault, target, claims = choice
                if fault.name in todo:
                    todo.remove(fault.name)
                claimed.update(claims)
            try:
                run.inject(fault.name, target, functools.partial(fault.apply, run, rng, target))
            finally:
                with lock:
                    claimed.difference_update(claims)

    lanes = [threading.Thread(target=lane, args=(i,), name=f"nemesis-{i}", daemon=True) for i in range(concurrency)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
