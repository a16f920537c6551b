// The latency suite's steady producer for Kafka (benchmarks/latency.py), the counterpart of
// benchmarks/_paced.py: the same schedule (message k due at t0 + k / rate; each turn sends every
// message due by then) and the same body (its send time, microseconds since the epoch as 16 ASCII
// digits, then padding to the body size).
//
//   java -cp '<kafka jars>/*' PacedKafkaProducer.java BOOTSTRAP TOPIC PARTITIONS RATE SECONDS BODY_SIZE
//
// Creates the topic, prints {"ready": true}, waits for a line on stdin, sends (the client's
// defaults: acks=all, linger.ms=5 in 4.x is overridden to 0 so a record leaves at once, like a
// RocketMQ send), flushes, then prints one JSON line: records sent, achieved rate, worst lag.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class PacedKafkaProducer {
    static final int TS_DIGITS = 16;

    static long nowMicros() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1_000_000L + t.getNano() / 1000;
    }

    static byte[] body(long sentUs, int size) {
        byte[] head = String.format("%0" + TS_DIGITS + "d", sentUs).getBytes(StandardCharsets.US_ASCII);
        byte[] out = new byte[Math.max(size, head.length)];
        java.util.Arrays.fill(out, (byte) 'x');
        System.arraycopy(head, 0, out, 0, head.length);
        return out;
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        double rate = Double.parseDouble(args[3]);
        double seconds = Double.parseDouble(args[4]);
        int bodySize = Integer.parseInt(args[5]);

        Properties ap = new Properties();
        ap.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(ap)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        }
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
            while (producer.partitionsFor(topic).size() < partitions) {
                Thread.sleep(100);
            }
            System.out.println("{\"ready\": true}");
            System.out.flush();
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
            long total = (long) (rate * seconds);
            long sent = 0;
            long turns = 0;
            double worstLag = 0;
            long t0 = System.nanoTime();
            while (sent < total) {
                long now = System.nanoTime();
                double elapsed = (now - t0) / 1e9;
                long due = Math.min(total, (long) (elapsed * rate) + 1) - sent;
                if (due <= 0) {
                    long wait = (long) ((sent / rate - elapsed) * 1e9);
                    if (wait > 0) {
                        Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                    }
                    continue;
                }
                worstLag = Math.max(worstLag, elapsed - sent / rate);
                byte[] value = body(nowMicros(), bodySize);
                for (long j = 0; j < due; j++) {
                    int partition = (int) (turns % partitions);
                    producer.send(new ProducerRecord<>(topic, partition, null, value));
                }
                sent += due;
                turns++;
            }
            producer.flush();
            double elapsed = (System.nanoTime() - t0) / 1e9;
            System.out.printf("{\"sent\": %d, \"turns\": %d, \"elapsed_s\": %.3f, \"achieved_per_s\": %.1f, "
                    + "\"worst_lag_ms\": %.2f}%n", sent, turns, elapsed, sent / elapsed, worstLag * 1000);
            System.out.flush();
        }
    }
}
