// Test peer that drives the Apache RocketMQ Java client (classic remoting protocol).
//
//   java -cp <classes>:<lib>/* JavaPeer <command>     (arguments: one JSON object on stdin)
//
// Every result is one JSON object per line on stdout; whatever the client prints goes to
// stderr. Exit code 0 on success, 1 with a stack trace on stderr when something fatal
// happens (bad arguments, a client that does not start). A failed send is not fatal: its
// line is {"status": "EXCEPTION", "error", "errorClass", "responseCode"}.
//
// All commands: "namesrv" (required), "topic" (required), "group", "namespace" (the client's
// setNamespace: topics and groups are wrapped as ns%name), "namespaceV2" (setNamespaceV2: the
// requests carry the ext fields ns and nsd, names are not wrapped).
//   produce                messages: [{body | bodyB64, tags, keys: [..], props: {..}, queueId,
//                          brokerName, delayLevel, deliverTimeMs}], compressThreshold (4096),
//                          sendTimeoutMs (10000), retries (2)
//                          -> per message {status, msgId, offsetMsgId, queueId, queueOffset, brokerName}
//   produce-transactional  like produce (no queueId) plus per message local: commit|rollback|unknown,
//                          waitCheckMs (0): wait until every "unknown" one has been checked back
//                          (a check answers COMMIT for "unknown", the local decision otherwise)
//                          -> per message {status, msgId, offsetMsgId (always null: the client drops
//                          it), queueId, queueOffset (of the half queue), brokerName, transactionId,
//                          localState, local, checked}
//   tx-bench               count, threads (16), bodySize (100), warmup (0: messages sent and
//                          committed before the clock starts): count transactional messages of one
//                          body, sent by `threads` threads sharing one TransactionMQProducer
//                          (sendMessageInTransaction: a half message, then the listener's
//                          COMMIT_MESSAGE, ended by the client's END_TRANSACTION), send-timeout 10 s
//                          -> {count, sent, failed, notCommitted, seconds, threads} (seconds: from
//                          the first send to the last one returned, JVM start-up excluded;
//                          visibleSeconds: to when the topic's queues held every committed message,
//                          the client's ENDs being oneway; null if not within 60 s)
//   consume                count (1), timeoutMs (60000), subExpression ("*"), from: first|last
//                          -> a message line per delivery (redeliveries included) until `count`
//                          distinct msgIds, then {done: true, received: distinct count}
//   pull                   count (unbounded), timeoutMs (60000), idleMs (3000), fromOffsets:
//                          earliest (the group must have no committed offsets: a new one)|
//                          latest|committed, pullBatchSize, countOnly
//                          -> a message line per message, or only {count, seconds} with countOnly
//                          (seconds: from assign to the last message received)
// Message lines: topic, queueId, queueOffset, msgId (UNIQ_KEY), offsetMsgId, tags, keys, bodyB64,
// props (user properties), sysProps (the rest), bornTimestamp, storeTimestamp, bornHost, storeHost,
// reconsumeTimes, sysFlag, commitLogOffset, bodyCRC, storeSize.

import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;

public final class JavaPeer {

    private static PrintStream out;
    private static final long T0 = System.nanoTime();

    private static long ms(long since) {
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - since);
    }

    public static void main(String[] argv) throws Exception {
        // Keep stdout for our JSON lines only: anything the client prints goes to stderr.
        out = new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
        System.setOut(System.err);
        int rc = 0;
        try {
            if (argv.length != 1) {
                throw new IllegalArgumentException("usage: JavaPeer produce|produce-transactional|tx-bench|consume|pull");
            }
            Map<String, Object> args = asMap(Json.parse(readAll(System.in)), "arguments");
            req(args, "namesrv");
            switch (argv[0]) {
                case "produce" -> produce(args);
                case "produce-transactional" -> produceTransactional(args);
                case "tx-bench" -> txBench(args);
                case "consume" -> consume(args);
                case "pull" -> pull(args);
                default -> throw new IllegalArgumentException("unknown command " + argv[0]);
            }
        } catch (Throwable e) {
            e.printStackTrace(System.err);
            rc = 1;
        } finally {
            out.flush();
            System.err.flush();
        }
        // The client leaves non-daemon threads behind on some paths; do not wait for them.
        System.exit(rc);
    }

    // ---------------------------------------------------------------- output

    private static synchronized void emit(Map<String, Object> line) {
        out.print(Json.write(line));
        out.print('\n');
        out.flush();
    }

    private static void log(String text) {
        System.err.println("[JavaPeer] " + text);
        System.err.flush();
    }

    private static String instanceName(String role) {
        return "jpeer-" + role + "-" + ProcessHandle.current().pid() + "-" + System.nanoTime();
    }

    // ---------------------------------------------------------------- produce

    private static Message buildMessage(String topic, Map<String, Object> spec) {
        byte[] body;
        if (spec.get("bodyB64") != null) {
            body = Base64.getDecoder().decode(str(spec, "bodyB64", null));
        } else {
            body = str(spec, "body", "").getBytes(StandardCharsets.UTF_8);
        }
        Message msg = new Message(topic, body);
        if (spec.get("tags") != null) {
            msg.setTags(str(spec, "tags", null));
        }
        if (spec.get("keys") != null) {
            List<String> keys = new ArrayList<>();
            for (Object k : asList(spec.get("keys"), "keys")) {
                keys.add(String.valueOf(k));
            }
            msg.setKeys(keys);
        }
        if (spec.get("props") != null) {
            for (Map.Entry<String, Object> e : asMap(spec.get("props"), "props").entrySet()) {
                msg.putUserProperty(e.getKey(), String.valueOf(e.getValue()));
            }
        }
        if (spec.get("delayLevel") != null) {
            msg.setDelayTimeLevel((int) num(spec, "delayLevel", 0));
        }
        if (spec.get("deliverTimeMs") != null) {
            msg.setDeliverTimeMs(num(spec, "deliverTimeMs", 0));
        }
        return msg;
    }

    private static MessageQueue pickQueue(DefaultMQProducer producer, String topic, Map<String, Object> spec)
            throws MQClientException {
        int queueId = (int) num(spec, "queueId", -1);
        String broker = str(spec, "brokerName", null);
        for (MessageQueue mq : producer.fetchPublishMessageQueues(topic)) {
            if (mq.getQueueId() == queueId && (broker == null || broker.equals(mq.getBrokerName()))) {
                return mq;
            }
        }
        throw new IllegalArgumentException("no writable queue " + queueId + " of topic " + topic);
    }

    @SuppressWarnings("deprecation")
    private static void configureNamespace(org.apache.rocketmq.client.ClientConfig client, Map<String, Object> args) {
        String ns = str(args, "namespace", null);
        if (ns != null) {
            client.setNamespace(ns);
        }
        String v2 = str(args, "namespaceV2", null);
        if (v2 != null) {
            client.setNamespaceV2(v2);
        }
    }

    private static void configureProducer(DefaultMQProducer producer, Map<String, Object> args, String role) {
        configureNamespace(producer, args);
        producer.setNamesrvAddr(req(args, "namesrv"));
        producer.setInstanceName(instanceName(role));
        producer.setVipChannelEnabled(false);
        producer.setCompressMsgBodyOverHowmuch((int) num(args, "compressThreshold", 4096));
        producer.setSendMsgTimeout((int) num(args, "sendTimeoutMs", 10_000));
        int retries = (int) num(args, "retries", 2);
        producer.setRetryTimesWhenSendFailed(retries);
    }

    private static Map<String, Object> sendError(Throwable e) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("status", "EXCEPTION");
        line.put("error", String.valueOf(e.getMessage()));
        line.put("errorClass", e.getClass().getName());
        if (e instanceof MQBrokerException be) {
            line.put("responseCode", be.getResponseCode());
        } else if (e instanceof MQClientException ce) {
            line.put("responseCode", ce.getResponseCode());
        }
        return line;
    }

    private static void produce(Map<String, Object> args) throws Exception {
        String topic = req(args, "topic");
        DefaultMQProducer producer = new DefaultMQProducer(str(args, "group", "jpeer-producer"));
        configureProducer(producer, args, "producer");
        producer.start();
        try {
            for (Object o : asList(args.get("messages"), "messages")) {
                Map<String, Object> spec = asMap(o, "message");
                Message msg = buildMessage(topic, spec);
                Map<String, Object> line;
                try {
                    SendResult r = spec.get("queueId") != null
                            ? producer.send(msg, pickQueue(producer, topic, spec))
                            : producer.send(msg);
                    line = sendLine(r);
                } catch (MQClientException | MQBrokerException e) {
                    log("send failed: " + e);
                    line = sendError(e);
                }
                emit(line);
            }
        } finally {
            producer.shutdown();
        }
    }

    private static Map<String, Object> sendLine(SendResult r) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("status", String.valueOf(r.getSendStatus()));
        line.put("msgId", r.getMsgId());
        line.put("offsetMsgId", r.getOffsetMsgId());
        line.put("queueId", r.getMessageQueue() == null ? null : r.getMessageQueue().getQueueId());
        line.put("queueOffset", r.getQueueOffset());
        line.put("brokerName", r.getMessageQueue() == null ? null : r.getMessageQueue().getBrokerName());
        return line;
    }

    // ---------------------------------------------------------------- transactions

    private static void produceTransactional(Map<String, Object> args) throws Exception {
        String topic = req(args, "topic");
        long waitCheckMs = num(args, "waitCheckMs", 0);
        // UNIQ_KEY of each message we sent -> its "local" decision; checks counted per UNIQ_KEY.
        Map<String, String> decisions = new ConcurrentHashMap<>();
        Map<String, AtomicInteger> checks = new ConcurrentHashMap<>();

        TransactionMQProducer producer = new TransactionMQProducer(str(args, "group", "jpeer-tx-producer"));
        configureProducer(producer, args, "txproducer");
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return state(String.valueOf(arg), false);
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                String id = MessageClientIDSetter.getUniqID(msg);
                if (id == null) {
                    id = msg.getTransactionId();
                }
                String local = id == null ? null : decisions.get(id);
                log("check-back for " + id + " (transactionId " + msg.getTransactionId() + ", local " + local
                        + ", reconsume/checkTimes " + msg.getProperty(MessageConst.PROPERTY_TRANSACTION_CHECK_TIMES)
                        + ")");
                if (local == null) {
                    return LocalTransactionState.UNKNOW;  // not ours (an older run of the group?)
                }
                checks.computeIfAbsent(id, k -> new AtomicInteger()).incrementAndGet();
                return state(local, true);
            }
        });
        producer.start();
        List<Map<String, Object>> lines = new ArrayList<>();
        List<String> ids = new ArrayList<>();
        boolean heartbeatSent = false;
        try {
            for (Object o : asList(args.get("messages"), "messages")) {
                Map<String, Object> spec = asMap(o, "message");
                String local = str(spec, "local", "commit");
                state(local, false);  // validates
                if (spec.get("queueId") != null) {
                    throw new IllegalArgumentException("queueId is not supported for transactional messages");
                }
                Message msg = buildMessage(topic, spec);
                // Set the id up front so a check-back arriving during the send finds the decision.
                MessageClientIDSetter.setUniqID(msg);
                String id = MessageClientIDSetter.getUniqID(msg);
                decisions.put(id, local);
                Map<String, Object> line;
                try {
                    TransactionSendResult r = producer.sendMessageInTransaction(msg, local);
                    line = sendLine(r);
                    line.put("transactionId", r.getTransactionId());
                    line.put("localState", String.valueOf(r.getLocalTransactionState()));
                    if (r.getMsgId() != null && !r.getMsgId().equals(id)) {
                        decisions.put(r.getMsgId(), local);
                    }
                } catch (MQClientException e) {
                    log("transactional send failed: " + e);
                    line = sendError(e);
                }
                line.put("local", local);
                lines.add(line);
                ids.add(id);
                if (!heartbeatSent) {
                    // The broker checks back only producers it knows from a heartbeat; the one
                    // sent at start went nowhere (no route yet), the next is 30 s away.
                    producer.getDefaultMQProducerImpl().getMqClientFactory().sendHeartbeatToAllBrokerWithLock();
                    heartbeatSent = true;
                }
            }
            long deadline = System.currentTimeMillis() + waitCheckMs;
            while (System.currentTimeMillis() < deadline) {
                boolean all = true;
                for (int i = 0; i < ids.size(); i++) {
                    if ("unknown".equals(lines.get(i).get("local")) && !"EXCEPTION".equals(lines.get(i).get("status"))
                            && !checks.containsKey(ids.get(i))) {
                        all = false;
                    }
                }
                if (all) {
                    break;
                }
                Thread.sleep(100);
            }
            // Give an in-flight check-back answer (sent oneway) a moment to leave.
            Thread.sleep(waitCheckMs > 0 ? 300 : 0);
        } finally {
            producer.shutdown();
        }
        for (int i = 0; i < lines.size(); i++) {
            Map<String, Object> line = lines.get(i);
            AtomicInteger n = checks.get(ids.get(i));
            line.put("checked", n == null ? 0 : n.get());
            emit(line);
        }
    }

    private static void txBench(Map<String, Object> args) throws Exception {
        String topic = req(args, "topic");
        long count = num(args, "count", 10_000);
        int threads = (int) num(args, "threads", 16);
        long warmup = num(args, "warmup", 0);
        byte[] body = new byte[(int) num(args, "bodySize", 100)];
        java.util.Arrays.fill(body, (byte) 'x');
        TransactionMQProducer producer = new TransactionMQProducer(str(args, "group", "jpeer-tx-bench"));
        configureProducer(producer, args, "txbench");
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        producer.start();
        AtomicInteger failed = new AtomicInteger();
        AtomicInteger notCommitted = new AtomicInteger();
        long started;
        long ended;
        long visible = -1;
        try {
            runTx(producer, topic, body, warmup, threads, failed, notCommitted);
            failed.set(0);
            notCommitted.set(0);
            started = System.nanoTime();
            runTx(producer, topic, body, count, threads, failed, notCommitted);
            ended = System.nanoTime();
            // the ENDs go oneway: when are the committed messages all in the topic's queues?
            long want = warmup + count - failed.get() - notCommitted.get();
            long limit = ended + TimeUnit.SECONDS.toNanos(60);
            while (System.nanoTime() < limit) {
                long stored = 0;
                try {
                    for (MessageQueue mq : producer.fetchPublishMessageQueues(topic)) {
                        stored += producer.maxOffset(mq);
                    }
                } catch (MQClientException e) {  // a busy broker: asked again
                    log("maxOffset: " + e);
                    continue;
                }
                if (stored >= want) {
                    visible = System.nanoTime();
                    break;
                }
                Thread.sleep(5);
            }
        } finally {
            producer.shutdown();
        }
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("count", count);
        line.put("sent", count - failed.get());
        line.put("failed", failed.get());
        line.put("notCommitted", notCommitted.get());
        line.put("seconds", (ended - started) / 1e9);
        line.put("visibleSeconds", visible < 0 ? null : (visible - started) / 1e9);
        line.put("threads", threads);
        emit(line);
    }

    private static void runTx(TransactionMQProducer producer, String topic, byte[] body, long count, int threads,
                              AtomicInteger failed, AtomicInteger notCommitted) throws InterruptedException {
        java.util.concurrent.atomic.AtomicLong next = new java.util.concurrent.atomic.AtomicLong();
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread w = new Thread(() -> {
                while (next.getAndIncrement() < count) {
                    try {
                        TransactionSendResult r = producer.sendMessageInTransaction(new Message(topic, body), null);
                        if (r.getLocalTransactionState() != LocalTransactionState.COMMIT_MESSAGE) {
                            notCommitted.incrementAndGet();
                        }
                    } catch (MQClientException | RuntimeException e) {
                        failed.incrementAndGet();
                        log("transactional send failed: " + e);
                    }
                }
            }, "tx-bench-" + t);
            w.start();
            workers.add(w);
        }
        for (Thread w : workers) {
            w.join();
        }
    }

    private static LocalTransactionState state(String local, boolean check) {
        return switch (local) {
            case "commit" -> LocalTransactionState.COMMIT_MESSAGE;
            case "rollback" -> LocalTransactionState.ROLLBACK_MESSAGE;
            case "unknown" -> check ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.UNKNOW;
            default -> throw new IllegalArgumentException("local must be commit|rollback|unknown, not " + local);
        };
    }

    // ---------------------------------------------------------------- consume

    private static void consume(Map<String, Object> args) throws Exception {
        String topic = req(args, "topic");
        int count = (int) num(args, "count", 1);
        long timeoutMs = num(args, "timeoutMs", 60_000);
        String from = str(args, "from", "first");
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(str(args, "group", "jpeer-consumer"));
        configureNamespace(consumer, args);
        consumer.setNamesrvAddr(req(args, "namesrv"));
        consumer.setInstanceName(instanceName("consumer"));
        consumer.setVipChannelEnabled(false);
        consumer.setMessageModel(MessageModel.CLUSTERING);
        consumer.setConsumeFromWhere(switch (from) {
            case "first" -> ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET;
            case "last" -> ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET;
            default -> throw new IllegalArgumentException("from must be first|last, not " + from);
        });
        if (args.containsKey("heartbeatMs")) {
            // The heartbeat that carries a rebalance's new subscription version is dropped
            // when the client's periodic heartbeat holds the heartbeat lock (both fire about a
            // second after start); a real broker then answers every pull SUBSCRIPTION_NOT_LATEST
            // until the next periodic heartbeat, 30 s later by default.
            consumer.setHeartbeatBrokerInterval((int) num(args, "heartbeatMs", 30_000));
        }
        consumer.subscribe(topic, str(args, "subExpression", "*"));
        Map<String, Boolean> seen = new ConcurrentHashMap<>();
        CountDownLatch enough = new CountDownLatch(1);
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
            for (MessageExt m : msgs) {
                emit(messageLine(m));
                seen.put(m.getMsgId(), Boolean.TRUE);
                if (seen.size() >= count) {
                    enough.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        log("push consumer started at +" + ms(T0) + " ms");
        try {
            if (count > 0) {
                enough.await(timeoutMs, TimeUnit.MILLISECONDS);
            }
            log("received " + seen.size() + " at +" + ms(T0) + " ms");
        } finally {
            consumer.shutdown();  // also persists the consumed offsets
            log("shut down at +" + ms(T0) + " ms");
        }
        Map<String, Object> done = new LinkedHashMap<>();
        done.put("done", true);
        done.put("received", seen.size());
        emit(done);
    }

    // ---------------------------------------------------------------- pull

    private static void pull(Map<String, Object> args) throws Exception {
        String topic = req(args, "topic");
        long count = num(args, "count", Long.MAX_VALUE);
        long timeoutMs = num(args, "timeoutMs", 60_000);
        long idleMs = num(args, "idleMs", 3_000);
        boolean countOnly = Boolean.TRUE.equals(args.get("countOnly"));
        String fromOffsets = str(args, "fromOffsets", "earliest");
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(str(args, "group", "jpeer-pull"));
        configureNamespace(consumer, args);
        consumer.setNamesrvAddr(req(args, "namesrv"));
        consumer.setInstanceName(instanceName("pull"));
        consumer.setVipChannelEnabled(false);
        consumer.setAutoCommit(false);
        if (fromOffsets.equals("earliest")) {
            // Not seekToBegin after assign: assign starts each queue's pull task at once, and a
            // task that is mid-run when seek replaces it can take the seek offset for itself; the
            // new task then resumes where the old one got to, after seek dropped what the old one
            // had fetched (seen in CI: 704 of 20,000 never delivered). A new group's first pull
            // offset comes from consumeFromWhere instead, with no second task.
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        }
        if (args.get("pullBatchSize") != null) {
            consumer.setPullBatchSize((int) num(args, "pullBatchSize", 10));
        }
        consumer.start();
        long received = 0;
        long started;
        long lastAt;
        try {
            List<MessageQueue> mqs = new ArrayList<>(consumer.fetchMessageQueues(topic));
            started = System.nanoTime();
            lastAt = started;
            consumer.assign(mqs);
            switch (fromOffsets) {
                case "earliest" -> { }
                case "latest" -> {
                    for (MessageQueue mq : mqs) {
                        consumer.seekToEnd(mq);
                    }
                }
                case "committed" -> { }
                default -> throw new IllegalArgumentException("fromOffsets must be earliest|latest|committed");
            }
            log("assigned " + mqs.size() + " queues at +" + ms(T0) + " ms");
            long deadline = started + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
            while (received < count) {
                long now = System.nanoTime();
                if (now >= deadline || now - lastAt >= TimeUnit.MILLISECONDS.toNanos(idleMs)) {
                    break;
                }
                long wait = Math.max(1, Math.min(500, TimeUnit.NANOSECONDS.toMillis(deadline - now)));
                List<MessageExt> got = consumer.poll(wait);
                if (got == null || got.isEmpty()) {
                    continue;
                }
                lastAt = System.nanoTime();
                for (MessageExt m : got) {
                    received++;
                    if (!countOnly) {
                        emit(messageLine(m));
                    }
                }
            }
            log("polled " + received + " messages at +" + ms(T0) + " ms");
        } finally {
            consumer.shutdown();
            log("shut down at +" + ms(T0) + " ms");
        }
        if (countOnly) {
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("count", received);
            line.put("seconds", (lastAt - started) / 1e9);
            emit(line);
        }
    }

    // ---------------------------------------------------------------- message lines

    private static Map<String, Object> messageLine(MessageExt m) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("topic", m.getTopic());
        line.put("queueId", m.getQueueId());
        line.put("queueOffset", m.getQueueOffset());
        line.put("msgId", m.getMsgId());
        line.put("offsetMsgId", offsetMsgId(m));
        line.put("tags", m.getTags());
        List<Object> keys = new ArrayList<>();
        String k = m.getKeys();
        if (k != null && !k.isEmpty()) {
            for (String part : k.split(MessageConst.KEY_SEPARATOR)) {
                if (!part.isEmpty()) {
                    keys.add(part);
                }
            }
        }
        line.put("keys", keys);
        byte[] body = m.getBody() == null ? new byte[0] : m.getBody();
        line.put("bodyB64", Base64.getEncoder().encodeToString(body));
        Map<String, Object> props = new TreeMap<>();
        Map<String, Object> sys = new TreeMap<>();
        if (m.getProperties() != null) {
            for (Map.Entry<String, String> e : m.getProperties().entrySet()) {
                (MessageConst.STRING_HASH_SET.contains(e.getKey()) ? sys : props).put(e.getKey(), e.getValue());
            }
        }
        line.put("props", props);
        line.put("sysProps", sys);
        line.put("bornTimestamp", m.getBornTimestamp());
        line.put("storeTimestamp", m.getStoreTimestamp());
        line.put("bornHost", hostString(m.getBornHost()));
        line.put("storeHost", hostString(m.getStoreHost()));
        line.put("reconsumeTimes", m.getReconsumeTimes());
        line.put("sysFlag", m.getSysFlag());
        line.put("commitLogOffset", m.getCommitLogOffset());
        line.put("bodyCRC", m.getBodyCRC());
        line.put("storeSize", m.getStoreSize());
        return line;
    }

    private static String offsetMsgId(MessageExt m) {
        try {
            return (String) m.getClass().getMethod("getOffsetMsgId").invoke(m);
        } catch (ReflectiveOperationException e) {
            return m.getMsgId();  // a plain MessageExt: msgId is the offset id
        }
    }

    private static String hostString(SocketAddress a) {
        if (a instanceof InetSocketAddress i) {
            String host = i.getAddress() != null ? i.getAddress().getHostAddress() : i.getHostString();
            return host + ":" + i.getPort();
        }
        return a == null ? null : a.toString();
    }

    // ---------------------------------------------------------------- argument helpers

    private static String readAll(InputStream in) throws java.io.IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        in.transferTo(buf);
        return buf.toString(StandardCharsets.UTF_8);
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> asMap(Object o, String what) {
        if (o instanceof Map) {
            return (Map<String, Object>) o;
        }
        throw new IllegalArgumentException(what + " must be a JSON object");
    }

    @SuppressWarnings("unchecked")
    private static List<Object> asList(Object o, String what) {
        if (o instanceof List) {
            return (List<Object>) o;
        }
        throw new IllegalArgumentException(what + " must be a JSON array");
    }

    private static String str(Map<String, Object> m, String key, String dflt) {
        Object v = m.get(key);
        return v == null ? dflt : String.valueOf(v);
    }

    private static String req(Map<String, Object> m, String key) {
        Object v = m.get(key);
        if (v == null || String.valueOf(v).isEmpty()) {
            throw new IllegalArgumentException("argument \"" + key + "\" is required");
        }
        return String.valueOf(v);
    }

    private static long num(Map<String, Object> m, String key, long dflt) {
        Object v = m.get(key);
        if (v == null) {
            return dflt;
        }
        if (v instanceof Number n) {
            return n.longValue();
        }
        return Long.parseLong(String.valueOf(v));
    }

    // ---------------------------------------------------------------- minimal JSON

    static final class Json {
        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        static Object parse(String text) {
            Json p = new Json(text);
            p.ws();
            Object v = p.value();
            p.ws();
            if (p.i != p.s.length()) {
                throw p.error("trailing characters");
            }
            return v;
        }

        private IllegalArgumentException error(String what) {
            return new IllegalArgumentException("bad JSON at " + i + ": " + what);
        }

        private void ws() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
                i++;
            }
        }

        private boolean eat(char c) {
            ws();
            if (i < s.length() && s.charAt(i) == c) {
                i++;
                return true;
            }
            return false;
        }

        private void expect(char c) {
            if (!eat(c)) {
                throw error("expected '" + c + "'");
            }
        }

        private Object value() {
            ws();
            if (i >= s.length()) {
                throw error("unexpected end");
            }
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                if (eat('}')) {
                    return m;
                }
                do {
                    ws();
                    if (i >= s.length() || s.charAt(i) != '"') {
                        throw error("expected a key");
                    }
                    String key = string();
                    expect(':');
                    m.put(key, value());
                } while (eat(','));
                expect('}');
                return m;
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                if (eat(']')) {
                    return l;
                }
                do {
                    l.add(value());
                } while (eat(','));
                expect(']');
                return l;
            }
            if (c == '"') {
                return string();
            }
            if (s.startsWith("true", i)) {
                i += 4;
                return Boolean.TRUE;
            }
            if (s.startsWith("false", i)) {
                i += 5;
                return Boolean.FALSE;
            }
            if (s.startsWith("null", i)) {
                i += 4;
                return null;
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
                i++;
            }
            String n = s.substring(start, i);
            if (n.isEmpty()) {
                throw error("unexpected character '" + c + "'");
            }
            if (n.contains(".") || n.contains("e") || n.contains("E")) {
                return Double.parseDouble(n);
            }
            return Long.parseLong(n);
        }

        private String string() {
            i++;  // opening quote
            StringBuilder b = new StringBuilder();
            while (true) {
                if (i >= s.length()) {
                    throw error("unterminated string");
                }
                char c = s.charAt(i++);
                if (c == '"') {
                    return b.toString();
                }
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n' -> b.append('\n');
                    case 't' -> b.append('\t');
                    case 'r' -> b.append('\r');
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'u' -> {
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                    }
                    default -> b.append(e);  // " \ /
                }
            }
        }

        static String write(Object v) {
            StringBuilder b = new StringBuilder();
            write(b, v);
            return b.toString();
        }

        private static void write(StringBuilder b, Object v) {
            if (v == null) {
                b.append("null");
            } else if (v instanceof String str) {
                quote(b, str);
            } else if (v instanceof Boolean || v instanceof Integer || v instanceof Long) {
                b.append(v);
            } else if (v instanceof Number n) {
                double d = n.doubleValue();
                b.append(Double.isFinite(d) ? String.valueOf(d) : "null");
            } else if (v instanceof Map<?, ?> m) {
                b.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : m.entrySet()) {
                    if (!first) {
                        b.append(',');
                    }
                    first = false;
                    quote(b, String.valueOf(e.getKey()));
                    b.append(':');
                    write(b, e.getValue());
                }
                b.append('}');
            } else if (v instanceof Collection<?> c) {
                b.append('[');
                boolean first = true;
                for (Object o : c) {
                    if (!first) {
                        b.append(',');
                    }
                    first = false;
                    write(b, o);
                }
                b.append(']');
            } else {
                quote(b, String.valueOf(v));
            }
        }

        private static void quote(StringBuilder b, String str) {
            b.append('"');
            for (int k = 0; k < str.length(); k++) {
                char c = str.charAt(k);
                switch (c) {
                    case '"' -> b.append("\\\"");
                    case '\\' -> b.append("\\\\");
                    case '\n' -> b.append("\\n");
                    case '\r' -> b.append("\\r");
                    case '\t' -> b.append("\\t");
                    default -> {
                        if (c < 0x20) {
                            b.append(String.format("\\u%04x", (int) c));
                        } else {
                            b.append(c);
                        }
                    }
                }
            }
            b.append('"');
        }
    }
}
