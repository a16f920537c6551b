"""The ``rocketmq-spark`` command line, driven as a subprocess against an embedded broker."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from brokers import settles_at, wait_until
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import decode_records
from rocketmq_spark.remoting.codes import RequestCode
from rocketmq_spark.remoting.frame import RemotingCommand

pytestmark = pytest.mark.integration

#: the topic, produce, progress and reset-offset commands run against both brokers
BROKERS = ("embedded", "real")

CLI = [sys.executable, "-m", "rocketmq_spark.cli"]
DEAD_ADDR = "127.0.0.1:1"  # nothing listens on port 1


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NAMESRV_ADDR", None)
    return env


def run(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=_env(),
                          check=False)


def _one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    """Exit code 2 and exactly one line on stderr, no traceback."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def _read_all(client: RemotingClient, topic: str) -> list:
    out = []
    for q in client.message_queues(topic):
        off, end = client.min_offset(q), client.max_offset(q)
        while off < end:
            res = client.pull(q, off, 1024)
            out.extend(decode_records(res.body))
            off = res.next_offset
    return out


@pytest.fixture()
def ns(broker) -> str:  # type: ignore[no-untyped-def]
    return broker.namesrv_addr  # type: ignore[no-any-return]


# -- broker -------------------------------------------------------------------------


def test_broker_command_prints_addresses_as_json_first_and_stops_on_sigterm(tmp_path) -> None:
    proc = subprocess.Popen([*CLI, "broker", "--data-dir", str(tmp_path / "data"), "--namesrv-port", "0",
                             "--broker-port", "0", "--grpc-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["brokerName"] == "broker-a" and info["dataDir"] == str(tmp_path / "data")
        res = run("topic", "create", "VIA_CLI_BROKER", "-n", info["namesrv"])
        assert res.returncode == 0, res.stderr
        listed = run("topic", "list", "--json", "-n", info["namesrv"])
        assert [r["topic"] for r in json.loads(listed.stdout)] == ["VIA_CLI_BROKER"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_broker_command_binds_host_and_gives_out_advertise_host(tmp_path) -> None:
    """--advertise-host: registered with the name server and printed; --host: where it listens
    (nothing listens on the advertised address until something, a proxy, is put there)."""
    import socket

    proc = subprocess.Popen([*CLI, "broker", "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.2",
                             "--advertise-host", "127.0.0.1", "--namesrv-port", "0", "--broker-port", "0",
                             "--grpc-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        port = int(info["broker"].rsplit(":", 1)[1])
        assert (info["broker"], info["bind"]) == (f"127.0.0.1:{port}", f"127.0.0.2:{port}")
        assert info["grpc"].startswith("127.0.0.1:") and info["namesrv"].startswith("127.0.0.2:")
        client = RemotingClient(info["namesrv"])
        try:
            assert client.cluster_brokers() == {"broker-a": f"127.0.0.1:{port}"}
        finally:
            client.close()
        socket.create_connection(("127.0.0.2", port), timeout=5).close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        human = proc.stdout.readline() + proc.stdout.readline()  # the name server's line, then the broker's
        assert f"listening on 127.0.0.2:{port} (advertised as 127.0.0.1:{port})" in human
    finally:
        proc.kill()
        proc.wait()


# -- topic --------------------------------------------------------------------------


def test_topic_create_list_describe(ns: str, client: RemotingClient) -> None:
    res = run("topic", "create", "CLI_TOPIC", "--queues", "3", "-n", ns)
    assert res.returncode == 0, res.stderr
    assert "created topic CLI_TOPIC with 3 queues" in res.stdout

    listed = run("topic", "list", "-n", ns)
    assert listed.returncode == 0
    line = next(row for row in listed.stdout.splitlines() if row.startswith("CLI_TOPIC"))
    assert line.split() == ["CLI_TOPIC", "broker-a", "3", "3", "RW"]
    assert "TBW102" not in listed.stdout
    assert "TBW102" in run("topic", "list", "--all", "-n", ns).stdout

    qs = client.message_queues("CLI_TOPIC")
    from rocketmq_spark.codec import BatchEntry

    for i in range(7):
        client.send_batch(qs[i % 3], [BatchEntry(b"x%d" % i)])
    assert settles_at(client, "CLI_TOPIC", 7) == 7
    desc = run("topic", "describe", "CLI_TOPIC", "--json", "-n", ns)
    assert desc.returncode == 0, desc.stderr
    obj = json.loads(desc.stdout)
    assert [(q["broker"], q["queueId"], q["minOffset"], q["maxOffset"]) for q in obj["queues"]] == [
        ("broker-a", 0, 0, 3), ("broker-a", 1, 0, 2), ("broker-a", 2, 0, 2)]
    assert all(q["lastStoreTimestamp"] > 0 for q in obj["queues"])
    assert obj["brokers"][0]["address"] == client.broker_addrs()[0]
    text = run("topic", "describe", "CLI_TOPIC", "-n", ns).stdout
    assert "7 messages" in text and "MIN OFFSET" in text and "MAX OFFSET" in text


def test_topic_describe_of_a_missing_topic_is_one_line_and_creates_nothing(ns: str, client: RemotingClient) -> None:
    line = _one_error_line(run("topic", "describe", "NO_SUCH_TOPIC", "-n", ns))
    assert "NO_SUCH_TOPIC" in line and "does not exist" in line and "topic create" in line
    assert "NO_SUCH_TOPIC" not in client.topic_list()  # no route lookup auto-created it


def test_topic_create_with_a_bad_name_is_one_line(ns: str) -> None:
    line = _one_error_line(run("topic", "create", "bad name", "-n", ns))
    assert "bad name" in line and "letters, digits" in line


# -- produce ------------------------------------------------------------------------


def test_produce_generated_messages_with_tags_and_keys(ns: str, client: RemotingClient) -> None:
    res = run("produce", "-t", "CLI_GEN", "--count", "300", "--size", "64", "--tags", "a,b", "-n", ns)
    assert res.returncode == 0, res.stderr
    # stderr is not a terminal: no bar, a summary line on stdout
    assert "\r" not in res.stderr and res.stderr == ""
    assert res.stdout.startswith("produced 300 messages (generated") and "msg/s" in res.stdout
    assert settles_at(client, "CLI_GEN", 300) == 300
    recs = _read_all(client, "CLI_GEN")
    assert len(recs) == 300
    assert all(len(r.body) == 64 for r in recs)
    by_key = {r.keys[0]: r for r in recs}
    assert by_key["key-7"].tags == "b" and by_key["key-8"].tags == "a"
    assert by_key["key-7"].body.startswith(b"msg-00000007 ")
    assert len({r.msg_id for r in recs}) == 300  # each has its own UNIQ_KEY


def test_produce_json_lines_from_file_and_stdin(ns: str, client: RemotingClient, tmp_path) -> None:
    path = tmp_path / "msgs.jsonl"
    path.write_text('{"body": "hello", "tag": "TagA", "keys": ["k1", "k2"], "properties": {"region": "eu"}}\n'
                    "\n"
                    '{"body": {"order": 1}, "keys": "k3"}\n')
    res = run("produce", "-t", "CLI_JSONL", "--file", str(path), "-n", ns)
    assert res.returncode == 0, res.stderr
    assert "produced 2 messages" in res.stdout
    res = run("produce", "-t", "CLI_JSONL", "-f", "-", "-n", ns, stdin='{"body": "from stdin"}\n')
    assert res.returncode == 0, res.stderr
    assert settles_at(client, "CLI_JSONL", 3) == 3
    recs = {r.body: r for r in _read_all(client, "CLI_JSONL")}
    assert set(recs) == {b"hello", b'{"order":1}', b"from stdin"}
    assert recs[b"hello"].tags == "TagA" and recs[b"hello"].keys == ["k1", "k2"]
    assert recs[b"hello"].user_properties() == {"region": "eu"}
    assert recs[b'{"order":1}'].keys == ["k3"] and recs[b'{"order":1}'].tags is None


def test_produce_bad_json_line_is_one_line_and_sends_nothing(ns: str, client: RemotingClient, broker) -> None:
    broker.create_topic("CLI_BADJSON")  # exists, empty
    stdin = '{"body": "ok"}\n{"body": "x", "tags": "oops"}\n'
    line = _one_error_line(run("produce", "-t", "CLI_BADJSON", "-f", "-", "-n", ns, stdin=stdin))
    assert "line 2" in line and "tags" in line
    line = _one_error_line(run("produce", "-t", "CLI_BADJSON", "-f", "-", "-n", ns, stdin="not json\n"))
    assert "line 1 of stdin is not JSON" in line
    assert _read_all(client, "CLI_BADJSON") == []
    line = _one_error_line(run("produce", "-t", "CLI_BADJSON", "-f", "/no/such/file.jsonl", "-n", ns))
    assert "/no/such/file.jsonl" in line


def test_produce_draws_a_progress_bar_when_stderr_is_a_terminal(ns: str, client: RemotingClient) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([*CLI, "produce", "-t", "CLI_TTY", "--count", "2000", "--batch", "50", "-n", ns],
                                stdout=subprocess.PIPE, stderr=slave, text=True, env=_env())
        os.close(slave)
        slave = -1
        chunks: list[bytes] = []
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                break
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        out, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert proc.returncode == 0
    bar = b"".join(chunks).decode()
    assert "\r[" in bar and "2000/2000" in bar and "msg/s" in bar
    assert "[" + "#" * 30 + "] 2000/2000" in bar
    assert "produced 2,000 messages" in out

    def held() -> int:  # a real broker registers the queues of a topic it auto-created a moment later
        return sum(client.max_offset(q) for q in client.message_queues("CLI_TTY", refresh=True))

    assert wait_until(lambda: held() == 2000, 30), held()


# -- progress -----------------------------------------------------------------------


def test_progress_table_and_json(ns: str, client: RemotingClient) -> None:
    assert run("produce", "-t", "CLI_PROG", "--count", "40", "-n", ns).returncode == 0
    assert settles_at(client, "CLI_PROG", 40) == 40
    qs = client.message_queues("CLI_PROG")
    client.create_group("g_prog")
    for q in qs[:3]:
        client.update_consumer_offset("g_prog", q, 4)  # queue 3 never committed
    res = run("progress", "-g", "g_prog", "--json", "-n", ns)
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["group"] == "g_prog" and obj["topics"] == ["CLI_PROG"]
    rows = [(q["queueId"], q["brokerOffset"], q["consumerOffset"], q["lag"]) for q in obj["queues"]]
    assert rows == [(0, 10, 4, 6), (1, 10, 4, 6), (2, 10, 4, 6), (3, 10, None, 10)]
    assert obj["totalLag"] == 28
    assert obj["queues"][0]["lastTimestamp"] > 0 and obj["queues"][3]["lastTimestamp"] is None

    text = run("progress", "-g", "g_prog", "-t", "CLI_PROG", "-n", ns)
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert "total lag 28" in lines[0]
    assert lines[1].split()[:6] == ["TOPIC", "BROKER", "QUEUE", "BROKER", "OFFSET", "CONSUMER"]
    assert lines[2].split()[:6] == ["CLI_PROG", "broker-a", "0", "10", "4", "6"]
    assert lines[5].split()[:6] == ["CLI_PROG", "broker-a", "3", "10", "-", "10"]


def test_progress_of_a_missing_group_is_one_line(ns: str, client: RemotingClient, broker) -> None:
    broker.create_topic("CLI_PROG_MISSING")
    line = _one_error_line(run("progress", "-g", "no_such_group", "-n", ns))
    assert "no_such_group" in line and "no committed offsets" in line
    line = _one_error_line(run("progress", "-g", "no_such_group", "-t", "CLI_PROG_MISSING", "-n", ns))
    assert "no_such_group" in line
    line = _one_error_line(run("progress", "-g", "x", "-t", "NO_TOPIC_HERE", "-n", ns))
    assert "NO_TOPIC_HERE" in line and "does not exist" in line


# -- reset-offset -------------------------------------------------------------------


def _offsets(client: RemotingClient, group: str, topic: str) -> list[int | None]:
    return [client.query_consumer_offset(group, q) for q in client.message_queues(topic)]


def test_reset_offset_dry_run_writes_nothing_then_reset_writes_the_plan(ns: str, client: RemotingClient) -> None:
    topic, group = "CLI_RESET", "g_reset"
    assert run("produce", "-t", topic, "--count", "20", "-n", ns).returncode == 0
    assert settles_at(client, topic, 20) == 20
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    assert run("produce", "-t", topic, "--count", "20", "-n", ns).returncode == 0
    assert settles_at(client, topic, 40) == 40
    client.create_group(group)
    for q in client.message_queues(topic):
        client.update_consumer_offset(group, q, 10)
    before = _offsets(client, group, topic)

    dry = run("reset-offset", "-g", group, "-t", topic, "--timestamp", str(middle), "--dry-run", "--json", "-n", ns)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dryRun"] is True and plan["timestamp"] == middle
    assert [(r["current"], r["new"]) for r in plan["queues"]] == [(10, 5)] * 4
    assert _offsets(client, group, topic) == before  # nothing written
    text = run("reset-offset", "-g", group, "-t", topic, "--timestamp", str(middle), "--dry-run", "-n", ns)
    assert "dry run: nothing was written" in text.stdout and "10  ->" in text.stdout
    assert _offsets(client, group, topic) == before

    res = run("reset-offset", "-g", group, "-t", topic, "--timestamp", str(middle), "-n", ns)
    assert res.returncode == 0, res.stderr
    assert _offsets(client, group, topic) == [5, 5, 5, 5]
    assert "4 queues written" in res.stdout

    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(middle / 1000 - 3600)) + "Z"  # before everything
    res = run("reset-offset", "-g", group, "-t", topic, "--timestamp", iso, "-n", ns)
    assert res.returncode == 0, res.stderr
    assert _offsets(client, group, topic) == [0, 0, 0, 0]
    assert run("reset-offset", "-g", group, "-t", topic, "--timestamp", "now", "-n", ns).returncode == 0
    assert _offsets(client, group, topic) == [10, 10, 10, 10]


def test_reset_is_applied_at_the_groups_next_pull(ns: str, client: RemotingClient, broker) -> None:
    """As a 5.x broker resets (useServerSideResetOffset, the default): the offsets are written, the
    group's commits of those queues are ignored until its next pull of each, which moves there."""
    topic, group = broker.create_topic("CLI_RESET_PULL", queues=1), "g_reset_pull"
    assert run("produce", "-t", topic, "--count", "12", "-n", ns).returncode == 0
    assert settles_at(client, topic, 12) == 12
    (q,) = client.message_queues(topic)
    assert client.pull(q, 0, 32, group=group).status == "FOUND"  # the group exists once it pulled
    client.update_consumer_offset(group, q, 9)
    res = run("reset-offset", "-g", group, "-t", topic, "--timestamp", "earliest", "-n", ns)
    assert res.returncode == 0, res.stderr
    assert client.query_consumer_offset(group, q) == 0
    client.update_consumer_offset(group, q, 9)  # a consumer that has not pulled since: ignored
    assert client.query_consumer_offset(group, q) == 0
    moved = client.pull(q, 9, 32, group=group)  # its next pull is moved to the reset offset
    assert (moved.status, moved.next_offset) == ("OFFSET_ILLEGAL", 0)
    client.update_consumer_offset(group, q, 3)  # from then on its commits count again
    assert client.query_consumer_offset(group, q) == 3


@pytest.mark.brokers("embedded")
def test_reset_offset_notifies_connected_consumers_of_a_4x_broker(tmp_path) -> None:
    """With server-side resets off (the 4.x way) online consumers are told at once."""
    topic, group = "CLI_RESET_NOTIFY", "g_notify"
    pushed: list[RemotingCommand] = []
    got = threading.Event()

    def on_request(conn, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            pushed.append(cmd)
            got.set()

    with EmbeddedBroker(str(tmp_path), server_side_reset=False) as mq:
        consumer = RemotingClient(mq.namesrv_addr, on_request=on_request)
        try:
            consumer.create_topic(topic)
            body = json.dumps({"clientID": "cli-test@1", "producerDataSet": [], "consumerDataSet": [
                {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                 "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [], "unitMode": False}]})
            consumer.invoke(mq.broker_addr, RemotingCommand(RequestCode.HEART_BEAT, body=body.encode()), "heartbeat")
            res = run("reset-offset", "-g", group, "-t", topic, "--timestamp", "earliest", "-n", mq.namesrv_addr)
            assert res.returncode == 0, res.stderr
            assert "1 online consumer(s)" in res.stdout
            assert got.wait(10)
            assert pushed[0].ext_fields["group"] == group and pushed[0].ext_fields["topic"] == topic
        finally:
            consumer.close()


def test_reset_offset_bad_timestamp_and_missing_topic(ns: str) -> None:
    line = _one_error_line(run("reset-offset", "-g", "g", "-t", "T", "--timestamp", "yesterday", "-n", ns))
    assert "--timestamp" in line and "ISO-8601" in line
    line = _one_error_line(run("reset-offset", "-g", "g", "-t", "T", "--timestamp", "1700000000", "-n", ns))
    assert "1700000000000" in line  # epoch seconds: says what to pass instead
    line = _one_error_line(run("reset-offset", "-g", "g", "-t", "NOPE_TOPIC", "--timestamp", "now", "-n", ns))
    assert "NOPE_TOPIC" in line


# -- errors a newcomer meets --------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["topic", "list"],
    ["topic", "describe", "orders"],
    ["produce", "-t", "orders", "--count", "1"],
    ["progress", "-g", "g"],
    ["reset-offset", "-g", "g", "-t", "orders", "--timestamp", "now"],
    ["demo"],
])
def test_unreachable_name_server_is_one_line_exit_2(argv: list[str]) -> None:
    t0 = time.monotonic()
    line = _one_error_line(run(*argv, "-n", DEAD_ADDR))
    assert line == (f"rocketmq-spark: cannot reach name server {DEAD_ADDR} (connection refused): start one "
                    "with `rocketmq-spark broker` or pass -n host:port")
    assert time.monotonic() - t0 < 20


def test_global_namesrv_option_and_default_address() -> None:
    line = _one_error_line(run("-n", DEAD_ADDR, "topic", "list"))
    assert DEAD_ADDR in line


def test_verbose_adds_the_traceback() -> None:
    res = run("-v", "topic", "list", "-n", DEAD_ADDR)
    assert res.returncode == 2
    assert "Traceback" in res.stderr and "ConnectionFailedError" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("rocketmq-spark: cannot reach name server")


@pytest.mark.parametrize(("argv", "expected"), [
    (["frob"], "invalid choice: 'frob'"),
    (["produce", "-t", "x", "--count", "ten"], "--count"),
    (["produce", "--count", "1"], "-t/--topic"),
    (["progress"], "-g/--group"),
    (["topic", "list", "-n", "nohostport"], "not host:port"),
    (["demo", "--messages", "0"], "--messages"),
])
def test_bad_options_are_one_line_exit_2(argv: list[str], expected: str) -> None:
    line = _one_error_line(run(*argv))
    assert expected in line and "--help" in line


def test_produce_count_and_file_together_is_one_line(tmp_path) -> None:
    line = _one_error_line(run("produce", "-t", "x", "--count", "3", "-f", str(tmp_path / "m.jsonl")))
    assert "--count" in line and "--file" in line


def test_demo_refuses_a_non_empty_output_dir(tmp_path) -> None:
    (tmp_path / "old").write_text("x")
    line = _one_error_line(run("demo", "--output", str(tmp_path)))
    assert str(tmp_path) in line and "not empty" in line


# -- demo ---------------------------------------------------------------------------


@pytest.fixture()
def demo_output(tmp_path) -> Iterator[str]:
    yield str(tmp_path / "demo-out")


@pytest.mark.spark
def test_demo_runs_the_main_job_end_to_end(demo_output: str) -> None:
    t0 = time.monotonic()
    res = run("demo", "--output", demo_output, timeout=300)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, (res.stdout, res.stderr)
    out = res.stdout
    assert "[1/5] embedded broker up" in out
    assert "[2/5] produced 10,000 orders" in out
    batches = [out_line for out_line in out.splitlines() if out_line.strip().startswith("batch ")]
    assert len(batches) == 4 and batches[-1].endswith("lag 0")
    assert "total lag 0" in out
    table = out.split("[5/5]", 1)[1]
    assert table.count("orders  broker-a") == 4
    assert "NET AMOUNT" in out and "total: 10,000 orders" in out
    for name in ("alice", "bob", "grace"):
        assert f"  {name} " in out
    # Spark's own logging stays quiet: nothing at INFO, no stage progress bars
    assert " INFO " not in res.stderr and "[Stage" not in res.stderr
    assert "Setting default log level" not in res.stderr
    assert os.path.isdir(os.path.join(demo_output, "orders"))
    assert os.path.isdir(os.path.join(demo_output, "totals_by_customer"))
    assert os.path.isdir(os.path.join(demo_output, "_checkpoint"))
    print(f"demo took {elapsed:.1f}s")


@pytest.mark.spark
@pytest.mark.brokers("embedded")
def test_demo_against_a_named_cluster_reads_only_its_own_orders(ns: str, client: RemotingClient) -> None:
    assert run("produce", "-t", "demo_orders_cluster", "--count", "50", "-n", ns).returncode == 0  # not orders
    res = run("demo", "-n", ns, "--topic", "demo_orders_cluster", "--group", "g_demo_cluster",
              "--messages", "600", timeout=300)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "[1/5] using the cluster at name server" in res.stdout
    assert "total: 600 orders" in res.stdout
    qs = client.message_queues("demo_orders_cluster")
    assert [client.query_consumer_offset("g_demo_cluster", q) for q in qs] == [client.max_offset(q) for q in qs]
