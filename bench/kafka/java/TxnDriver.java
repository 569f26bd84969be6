// The Kafka side of bench/scale.py's transactional benchmarks: Kafka's own Java client driving
// what Sluice's Python client drives there, in the same shape (one client process, one producer per
// thread). Compiled by bench/kafka/driver.py with javac against the fetched kafka-clients jar.
//
//   producers BOOTSTRAP TOPIC N SECONDS RECORDS_PER_TXN
//       N transactional producers, each in its own thread, commit transactions of RECORDS_PER_TXN
//       1 KiB records in a loop for SECONDS; prints
//       "RESULT commits=C seconds=S p50_ms=X p99_ms=Y" (percentiles as Sluice's bench computes them).
//   txnids BOOTSTRAP TOPIC N PREFIX
//       N transactional ids PREFIX-0..N-1, each initialised and committing one transaction of one
//       record; prints "RESULT ids=N seconds=S".
//   probe BOOTSTRAP TRANSACTIONAL_ID
//       prints "READY", waits for a line on stdin, then calls initTransactions until it succeeds;
//       prints "RESULT seconds=S" (from the line to success), so the JVM's start is not timed.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CyclicBarrier;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class TxnDriver {
    private TxnDriver() {}

    static KafkaProducer<byte[], byte[]> producer(String bootstrap, String txnId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "262144");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "600000");
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static double pick(List<Double> sorted, double q) {
        if (sorted.isEmpty()) return 0.0;
        int i = (int) Math.round(q * sorted.size()) - 1;
        return sorted.get(Math.min(sorted.size() - 1, Math.max(0, i)));
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "producers" -> producers(args[1], args[2], Integer.parseInt(args[3]), Double.parseDouble(args[4]),
                    Integer.parseInt(args[5]));
            case "txnids" -> txnids(args[1], args[2], Integer.parseInt(args[3]), args[4]);
            case "probe" -> probe(args[1], args[2]);
            default -> throw new IllegalArgumentException("unknown mode " + args[0]);
        }
    }

    static void producers(String bootstrap, String topic, int n, double seconds, int perTxn) throws Exception {
        byte[] value = new byte[1024];
        java.util.Arrays.fill(value, (byte) 'a');
        List<KafkaProducer<byte[], byte[]>> ps = new ArrayList<>();
        String run = Long.toHexString(System.nanoTime());
        for (int i = 0; i < n; i++) {
            KafkaProducer<byte[], byte[]> p = producer(bootstrap, "scale-" + run + "-" + i);
            p.initTransactions();
            ps.add(p);
        }
        List<Double> latencies = Collections.synchronizedList(new ArrayList<>());
        List<String> errors = Collections.synchronizedList(new ArrayList<>());
        CyclicBarrier start = new CyclicBarrier(n + 1);
        long[] stopAt = new long[1];
        List<Thread> threads = new ArrayList<>();
        for (KafkaProducer<byte[], byte[]> p : ps) {
            Thread t = new Thread(() -> {
                List<Double> mine = new ArrayList<>();
                try {
                    start.await();
                    while (System.nanoTime() < stopAt[0]) {
                        p.beginTransaction();
                        for (int k = 0; k < perTxn; k++) p.send(new ProducerRecord<>(topic, value));
                        long t0 = System.nanoTime();
                        p.commitTransaction();
                        mine.add((System.nanoTime() - t0) / 1e6);
                    }
                } catch (Exception e) {
                    errors.add(e.toString());
                }
                latencies.addAll(mine);
            });
            t.start();
            threads.add(t);
        }
        stopAt[0] = System.nanoTime() + (long) (seconds * 1e9);
        long t0 = System.nanoTime();
        start.await();
        for (Thread t : threads) t.join();
        double elapsed = (System.nanoTime() - t0) / 1e9;
        for (KafkaProducer<byte[], byte[]> p : ps) p.close();
        if (!errors.isEmpty()) throw new RuntimeException(errors.size() + " producer(s) failed, first: " + errors.get(0));
        List<Double> s = new ArrayList<>(latencies);
        Collections.sort(s);
        System.out.printf("RESULT commits=%d seconds=%.3f p50_ms=%.3f p99_ms=%.3f%n", s.size(), elapsed,
                pick(s, 0.50), pick(s, 0.99));
    }

    static void txnids(String bootstrap, String topic, int n, String prefix) {
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) {
            try (KafkaProducer<byte[], byte[]> p = producer(bootstrap, prefix + "-" + i)) {
                p.initTransactions();
                p.beginTransaction();
                p.send(new ProducerRecord<>(topic, new byte[] {'x'}));
                p.commitTransaction();
            }
        }
        System.out.printf("RESULT ids=%d seconds=%.3f%n", n, (System.nanoTime() - t0) / 1e9);
    }

    static void probe(String bootstrap, String txnId) throws Exception {
        try (KafkaProducer<byte[], byte[]> p = producer(bootstrap, txnId)) {
            System.out.println("READY");
            System.out.flush();
            new BufferedReader(new InputStreamReader(System.in)).readLine();
            long t0 = System.nanoTime();
            p.initTransactions();
            System.out.printf("RESULT seconds=%.3f%n", (System.nanoTime() - t0) / 1e9);
        }
    }
}
