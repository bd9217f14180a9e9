/*
 * txbroker's benchmark driver for the Apache RocketMQ peer (tracker issue 8).
 *
 * Written for txbroker; it is NOT RocketMQ's org.apache.rocketmq.example.benchmark.TransactionProducer,
 * which is not published on Maven Central for 4.3+/5.x. It drives the same workload through the
 * public rocketmq-client API and keeps that benchmark's option letters and meanings
 * (-w threads, -s size, -t topic, -n namesrv, -sr/-su: share of local transactions answering
 * ROLLBACK/UNKNOWN, -cr/-cu: share of check-back answers ROLLBACK/UNKNOWN), adding what a bounded,
 * comparable run needs: a duration, a warm-up, latency percentiles, a drain phase that waits for
 * check-back to resolve every UNKNOWN transaction, and an in-process consumer that measures
 * commit-to-delivery latency.
 *
 *   java -cp 'lib/*:bench-classes' TxBench tx   -n 127.0.0.1:9876 -t T -w 8 -s 1024 -d 20 [...]
 *   java -cp 'lib/*:bench-classes' TxBench send -n 127.0.0.1:9876 -t T -w 8 -s 1024 -d 20 [...]
 *
 * Periodic lines start with "STAT ", the final summary is one line "RESULT {json}".
 *
 * Timing notes (RocketMQ's transactional send, client 5.x): sendMessageInTransaction() sends the
 * half message synchronously, runs executeLocalTransaction(), then sends END_TRANSACTION ONE-WAY
 * (no broker acknowledgement) and returns. So the "transaction latency" measured here, like the
 * upstream benchmark's RT, is half-send round trip + local transaction + handing END_TRANSACTION
 * to the socket; it does not include the broker applying the commit.
 */

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;

public class TxBench {

    // ---------------------------------------------------------------- options
    static final class Opts {
        String mode;
        String namesrv = "127.0.0.1:9876";
        String topic = "TxBenchTopic";
        String group = null;
        int threads = 8;
        int size = 1024;
        double durationS = 20;
        double warmupS = 2;
        double reportS = 5;
        double sendRollback = 0, sendUnknown = 0, checkRollback = 0, checkUnknown = 0;
        double drainS = 0;          // tx: wait up to this long after sends for check-back to resolve UNKNOWNs
        boolean consume = false;    // run a push consumer in this JVM and measure delivery latency
        int consumeThreads = 4;
        double consumeWaitS = 15;   // after sends (and drain), wait this long at most for deliveries
        int checkThreads = -1;      // -1: client default check executor
        int checkQueue = 2000;
        int sendTimeoutMs = 3000;
        int sleepMs = 0;            // per-thread pause after each send (upstream's -i "send interval")

        static Opts parse(String[] a) {
            Opts o = new Opts();
            if (a.length == 0 || a[0].startsWith("-")) usage("missing mode");
            o.mode = a[0];
            if (!o.mode.equals("tx") && !o.mode.equals("send")) usage("mode must be tx or send");
            for (int i = 1; i < a.length; i++) {
                String k = a[i];
                if (k.equals("-h") || k.equals("--help")) usage(null);
                if (k.equals("-consume")) { o.consume = true; continue; }
                if (i + 1 >= a.length) usage("option " + k + " needs a value");
                String v = a[++i];
                switch (k) {
                    case "-n": o.namesrv = v; break;
                    case "-t": o.topic = v; break;
                    case "-g": o.group = v; break;
                    case "-w": o.threads = Integer.parseInt(v); break;
                    case "-s": o.size = Integer.parseInt(v); break;
                    case "-d": o.durationS = Double.parseDouble(v); break;
                    case "-warmup": o.warmupS = Double.parseDouble(v); break;
                    case "-i": o.reportS = Double.parseDouble(v); break;
                    case "-sr": o.sendRollback = Double.parseDouble(v); break;
                    case "-su": o.sendUnknown = Double.parseDouble(v); break;
                    case "-cr": o.checkRollback = Double.parseDouble(v); break;
                    case "-cu": o.checkUnknown = Double.parseDouble(v); break;
                    case "-drain": o.drainS = Double.parseDouble(v); break;
                    case "-cw": o.consumeThreads = Integer.parseInt(v); break;
                    case "-consumeWait": o.consumeWaitS = Double.parseDouble(v); break;
                    case "-ct": o.checkThreads = Integer.parseInt(v); break;
                    case "-cq": o.checkQueue = Integer.parseInt(v); break;
                    case "-timeout": o.sendTimeoutMs = Integer.parseInt(v); break;
                    case "-sleep": o.sleepMs = Integer.parseInt(v); break;
                    default: usage("unknown option " + k);
                }
            }
            if (o.size < HEADER) usage("-s must be >= " + HEADER);
            if (o.group == null) o.group = "txbench_" + o.mode + "_" + System.currentTimeMillis();
            return o;
        }

        static void usage(String err) {
            if (err != null) System.err.println("error: " + err);
            System.err.println(String.join("\n",
                "usage: TxBench (tx|send) [options]",
                "  -n ADDR        name server (127.0.0.1:9876)",
                "  -t TOPIC       topic (TxBenchTopic); create it beforehand or rely on autoCreateTopicEnable",
                "  -g GROUP       producer group (unique per run by default)",
                "  -w N           sending threads (8)",
                "  -s BYTES       message body size (1024)",
                "  -d SEC         send phase length (20)",
                "  -warmup SEC    first seconds not counted (2)",
                "  -i SEC         STAT line interval (5)",
                "  -sr/-su RATE   tx: share of local transactions answering ROLLBACK / UNKNOWN (0)",
                "  -cr/-cu RATE   tx: share of check-back answers ROLLBACK / UNKNOWN (0), drawn per check",
                "  -drain SEC     tx: after sending, wait up to SEC for check-back to resolve all UNKNOWN (0)",
                "  -consume       run a push consumer in this JVM; measure commit->delivery latency",
                "  -cw N          consumer threads (4)",
                "  -consumeWait SEC  wait at most SEC after sending for outstanding deliveries (15)",
                "  -ct N / -cq N  tx: check-back executor threads / queue (client default executor if -ct absent)",
                "  -timeout MS    send timeout (3000)",
                "  -sleep MS      per-thread pause after each send, to offer a lower load (0)"));
            System.exit(err == null ? 0 : 2);
        }
    }

    // ------------------------------------------------------ latency recorders
    /** Per-thread growable arrays of microsecond samples; merged once at the end. */
    static final class Samples {
        static final class Buf { long[] v = new long[1 << 14]; int n; }
        private final CopyOnWriteArrayList<Buf> all = new CopyOnWriteArrayList<>();
        private final ThreadLocal<Buf> local = ThreadLocal.withInitial(() -> { Buf b = new Buf(); all.add(b); return b; });

        void add(long micros) {
            Buf b = local.get();
            if (b.n == b.v.length) b.v = Arrays.copyOf(b.v, b.n * 2);
            b.v[b.n++] = micros;
        }

        /** JSON object with count, avg, min, p50, p90, p99, p999, max in milliseconds. */
        String summaryJson() {
            int total = 0;
            for (Buf b : all) total += b.n;
            long[] m = new long[total];
            int k = 0;
            for (Buf b : all) { System.arraycopy(b.v, 0, m, k, b.n); k += b.n; }
            if (total == 0) return "{\"count\":0}";
            Arrays.sort(m);
            double sum = 0;
            for (long x : m) sum += x;
            return String.format(java.util.Locale.ROOT,
                "{\"count\":%d,\"avg_ms\":%.3f,\"min_ms\":%.3f,\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"p999_ms\":%.3f,\"max_ms\":%.3f}",
                total, sum / total / 1000.0, m[0] / 1000.0, pct(m, 50) / 1000.0, pct(m, 90) / 1000.0,
                pct(m, 99) / 1000.0, pct(m, 99.9) / 1000.0, m[total - 1] / 1000.0);
        }

        static long pct(long[] sorted, double p) {
            int idx = (int) Math.ceil(p / 100.0 * sorted.length) - 1;
            return sorted[Math.max(0, Math.min(sorted.length - 1, idx))];
        }
    }

    // ----------------------------------------------------------- body layout
    // [0..8) run id, [8..16) sequence, [16] local-transaction answer, [17..17+MAX_CHECKS) check answers
    static final int MAX_CHECKS = 20;   // must exceed the broker's transactionCheckMax (15)
    static final int HEADER = 17 + MAX_CHECKS;
    static final byte COMMIT = 0, ROLLBACK = 1, UNKNOWN = 2;

    static LocalTransactionState state(byte b) {
        switch (b) {
            case COMMIT: return LocalTransactionState.COMMIT_MESSAGE;
            case ROLLBACK: return LocalTransactionState.ROLLBACK_MESSAGE;
            default: return LocalTransactionState.UNKNOW;
        }
    }

    static byte draw(ThreadLocalRandom r, double rollback, double unknown) {
        double x = r.nextDouble();
        if (x < rollback) return ROLLBACK;
        if (x < rollback + unknown) return UNKNOWN;
        return COMMIT;
    }

    // ------------------------------------------------------------------ state
    final Opts o;
    final long runId = System.currentTimeMillis() ^ ((long) ProcessHandle.current().pid() << 40);
    final AtomicLong seq = new AtomicLong();
    volatile boolean measuring = false;
    volatile boolean stop = false;

    // send side (only counted while measuring)
    final AtomicLong ok = new AtomicLong(), failed = new AtomicLong(), latSumMicros = new AtomicLong();
    final AtomicLong latMaxMicros = new AtomicLong();
    final Samples sendLat = new Samples();
    final Map<String, AtomicLong> failures = new ConcurrentHashMap<>();
    final AtomicLong localCommit = new AtomicLong(), localRollback = new AtomicLong(), localUnknown = new AtomicLong();
    final AtomicLong allOk = new AtomicLong(); // every successful send, measured or not

    // transaction outcome bookkeeping: sequence -> nanoTime of the decision
    final ConcurrentHashMap<Long, Long> commitAt = new ConcurrentHashMap<>();   // committed, awaiting delivery
    final ConcurrentHashMap<Long, Long> unknownAt = new ConcurrentHashMap<>();  // UNKNOWN, awaiting check-back
    final AtomicLong expectedDeliveries = new AtomicLong();                      // commits of measured messages
    final Samples resolveLat = new Samples();
    final AtomicLong checks = new AtomicLong(), checkCommit = new AtomicLong(), checkRollback = new AtomicLong(),
        checkUnknown = new AtomicLong(), unexpectedChecks = new AtomicLong(), lateChecks = new AtomicLong(),
        foreignChecks = new AtomicLong();
    final ConcurrentHashMap<Integer, AtomicLong> checkTimesHist = new ConcurrentHashMap<>();
    volatile long lastResolveNanos = 0;

    // consume side
    final AtomicLong delivered = new AtomicLong(), dupDeliveries = new AtomicLong(), strayDeliveries = new AtomicLong(),
        rolledBackDelivered = new AtomicLong();
    final Samples commitToDeliver = new Samples();   // from the local COMMIT decision (tx) / send start (send)
    final Samples storeToDeliver = new Samples();    // broker store timestamp -> listener, ms resolution
    final Samples bornToDeliver = new Samples();     // producer born timestamp (half send) -> listener, ms resolution
    final ConcurrentHashMap<Long, Long> firstPosition = new ConcurrentHashMap<>();  // seq -> queueId<<48 | queue offset
    final AtomicLong dupSamePosition = new AtomicLong(), dupOtherPosition = new AtomicLong();
    final List<String> dupExamples = new CopyOnWriteArrayList<>();
    final java.util.Set<Long> rolledBack = ConcurrentHashMap.newKeySet();
    volatile long probeSeq = -1;
    volatile boolean consumerOn = false;
    final CountDownLatch probeSeen = new CountDownLatch(1);

    TxBench(Opts o) { this.o = o; }

    Message build(boolean measured) {
        ThreadLocalRandom r = ThreadLocalRandom.current();
        byte[] body = new byte[o.size];
        r.nextBytes(body);
        ByteBuffer b = ByteBuffer.wrap(body);
        long s = seq.incrementAndGet();
        b.putLong(runId).putLong(measured ? s : -s);
        b.put(draw(r, o.sendRollback, o.sendUnknown));
        for (int i = 0; i < MAX_CHECKS; i++) b.put(draw(r, o.checkRollback, o.checkUnknown));
        return new Message(o.topic, body);
    }

    static long bodyRun(byte[] body) { return ByteBuffer.wrap(body).getLong(0); }
    static long bodySeq(byte[] body) { return ByteBuffer.wrap(body).getLong(8); }

    // ------------------------------------------------------------ transaction
    final class Listener implements TransactionListener {
        @Override
        public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            byte[] body = msg.getBody();
            long s = bodySeq(body);
            byte answer = body[16];
            long now = System.nanoTime();
            if (s > 0) {
                if (answer == COMMIT) { localCommit.incrementAndGet(); commitAt.put(s, now); expectedDeliveries.incrementAndGet(); }
                else if (answer == ROLLBACK) { localRollback.incrementAndGet(); rolledBack.add(s); }
                else { localUnknown.incrementAndGet(); unknownAt.put(s, now); }
            }
            return state(answer);
        }

        @Override
        public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            byte[] body = msg.getBody();
            if (body == null || body.length < HEADER || bodyRun(body) != runId) {
                foreignChecks.incrementAndGet();   // half message of another run: not ours to keep
                return LocalTransactionState.ROLLBACK_MESSAGE;
            }
            checks.incrementAndGet();
            long s = bodySeq(body);
            int times;
            try {
                times = Integer.parseInt(msg.getUserProperty(MessageConst.PROPERTY_TRANSACTION_CHECK_TIMES));
            } catch (Exception e) {
                times = 1;
            }
            times = Math.max(1, Math.min(times, MAX_CHECKS));
            checkTimesHist.computeIfAbsent(times, k -> new AtomicLong()).incrementAndGet();
            byte sent = body[16];
            if (sent != UNKNOWN) {
                // checked although the producer already answered COMMIT/ROLLBACK (one-way END_TRANSACTION
                // lost or not yet applied): answer the same again
                unexpectedChecks.incrementAndGet();
                return state(sent);
            }
            byte answer = body[16 + times];
            long now = System.nanoTime();
            Long since = unknownAt.get(s);
            if (answer == UNKNOWN) { checkUnknown.incrementAndGet(); return LocalTransactionState.UNKNOW; }
            if (since == null) {
                lateChecks.incrementAndGet();  // already resolved by an earlier check (duplicate check)
            } else if (unknownAt.remove(s, since)) {
                if (s > 0) resolveLat.add((now - since) / 1000);
                lastResolveNanos = now;
                if (answer == COMMIT) { commitAt.put(s, now); if (s > 0) expectedDeliveries.incrementAndGet(); }
                else rolledBack.add(s);
            }
            if (answer == COMMIT) { checkCommit.incrementAndGet(); return LocalTransactionState.COMMIT_MESSAGE; }
            checkRollback.incrementAndGet();
            return LocalTransactionState.ROLLBACK_MESSAGE;
        }
    }

    void record(long t0, boolean success, String failure) {
        long micros = (System.nanoTime() - t0) / 1000;
        if (success) allOk.incrementAndGet();
        if (!measuring) return;
        if (success) {
            ok.incrementAndGet();
            latSumMicros.addAndGet(micros);
            sendLat.add(micros);
            long prev;
            while (micros > (prev = latMaxMicros.get()) && !latMaxMicros.compareAndSet(prev, micros)) { }
        } else {
            failed.incrementAndGet();
            failures.computeIfAbsent(failure, k -> new AtomicLong()).incrementAndGet();
        }
    }

    // ------------------------------------------------------------------- run
    void run() throws Exception {
        final boolean tx = o.mode.equals("tx");
        DefaultMQProducer producer;
        if (tx) {
            TransactionMQProducer p = new TransactionMQProducer(o.group);
            p.setTransactionListener(new Listener());
            if (o.checkThreads > 0) {
                p.setExecutorService(new ThreadPoolExecutor(o.checkThreads, o.checkThreads, 60, TimeUnit.SECONDS,
                    new ArrayBlockingQueue<>(o.checkQueue)));
            }
            producer = p;
        } else {
            producer = new DefaultMQProducer(o.group);
        }
        producer.setNamesrvAddr(o.namesrv);
        producer.setInstanceName("txbench-" + runId);
        producer.setSendMsgTimeout(o.sendTimeoutMs);
        producer.setDefaultTopicQueueNums(8);
        producer.start();

        // warm-up/probe message: creates the route (and the topic if auto-created)
        long firstOk = sendOne(producer, tx, false);
        if (firstOk < 0) throw new IllegalStateException("first send failed; broker not usable");

        DefaultMQPushConsumer consumer = null;
        if (o.consume) {
            consumer = startConsumer();
            consumerOn = true;
            // readiness: keep sending probes until one is delivered (rebalance done)
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            boolean ready = false;
            while (System.nanoTime() < deadline) {
                probeSeq = -(seq.get() + 1);
                sendOne(producer, tx, false);
                if (probeSeen.await(1, TimeUnit.SECONDS)) { ready = true; break; }
            }
            if (!ready) throw new IllegalStateException("consumer received no probe within 60 s");
            System.out.println("STAT consumer ready");
        }

        Thread[] workers = new Thread[o.threads];
        for (int i = 0; i < o.threads; i++) {
            workers[i] = new Thread(() -> {
                while (!stop) {
                    sendOne(producer, tx, true);
                    if (o.sleepMs > 0) {
                        try { Thread.sleep(o.sleepMs); } catch (InterruptedException e) { return; }
                    }
                }
            }, "txbench-send-" + i);
            workers[i].start();
        }
        final long t0 = System.nanoTime();
        long warmEnd = t0 + (long) (o.warmupS * 1e9);
        long end = t0 + (long) ((o.warmupS + o.durationS) * 1e9);
        Thread.sleep(Math.max(0, (warmEnd - System.nanoTime()) / 1_000_000));
        measuring = true;
        final long m0 = System.nanoTime();
        long nextReport = m0 + (long) (o.reportS * 1e9);
        long lastOk = 0, lastSum = 0, lastFailed = 0; long lastT = m0;
        while (System.nanoTime() < end) {
            long sleepNs = Math.min(end, nextReport) - System.nanoTime();
            if (sleepNs > 0) Thread.sleep(sleepNs / 1_000_000, (int) (sleepNs % 1_000_000));
            long now = System.nanoTime();
            if (now >= nextReport) {
                long k = ok.get(), s = latSumMicros.get(), f = failed.get();
                double dt = (now - lastT) / 1e9;
                System.out.printf(java.util.Locale.ROOT,
                    "STAT t=%.1f tps=%.1f avg_ms=%.3f max_ms=%.3f failed=%d checks=%d pending_unknown=%d delivered=%d%n",
                    (now - m0) / 1e9, (k - lastOk) / dt, k > lastOk ? (s - lastSum) / 1000.0 / (k - lastOk) : 0.0,
                    latMaxMicros.getAndSet(0) / 1000.0, f - lastFailed, checks.get(), unknownAt.size(), delivered.get());
                lastOk = k; lastSum = s; lastFailed = f; lastT = now;
                nextReport += (long) (o.reportS * 1e9);
            }
        }
        measuring = false;
        final long m1 = System.nanoTime();
        stop = true;
        for (Thread w : workers) w.join(o.sendTimeoutMs + 5000L);
        final long sendsDone = System.nanoTime();

        // drain: check-back resolution of UNKNOWN transactions
        double drainWaited = 0;
        long unresolvedAtSendEnd = unknownAt.size();
        if (tx && o.drainS > 0 && !unknownAt.isEmpty()) {
            long dl = sendsDone + (long) (o.drainS * 1e9);
            long nextPrint = System.nanoTime() + 5_000_000_000L;
            while (!unknownAt.isEmpty() && System.nanoTime() < dl) {
                Thread.sleep(100);
                if (System.nanoTime() >= nextPrint) {
                    System.out.printf(java.util.Locale.ROOT, "STAT drain t=%.1f pending_unknown=%d checks=%d%n",
                        (System.nanoTime() - sendsDone) / 1e9, unknownAt.size(), checks.get());
                    nextPrint += 5_000_000_000L;
                }
            }
            drainWaited = (System.nanoTime() - sendsDone) / 1e9;
        }
        // deliveries still in flight
        double consumeWaited = 0;
        if (consumer != null) {
            long dl = System.nanoTime() + (long) (o.consumeWaitS * 1e9);
            while (delivered.get() < expectedDeliveries.get() && System.nanoTime() < dl) Thread.sleep(50);
            consumeWaited = (System.nanoTime() - sendsDone) / 1e9;
        }
        long leftUnknown = 0;
        for (Long s : unknownAt.keySet()) if (s > 0) leftUnknown++;

        double window = (m1 - m0) / 1e9;
        StringBuilder j = new StringBuilder();
        j.append('{');
        kv(j, "driver", "\"txbench\"");
        kv(j, "mode", q(o.mode));
        kv(j, "threads", o.threads);
        kv(j, "sleep_ms", o.sleepMs);
        kv(j, "size", o.size);
        kv(j, "topic", q(o.topic));
        kv(j, "group", q(o.group));
        kv(j, "warmup_s", o.warmupS);
        kv(j, "window_s", round3(window));
        kv(j, "ok", ok.get());
        kv(j, "failed", failed.get());
        kv(j, "ops_per_s", round3(ok.get() / window));
        kv(j, "latency", sendLat.summaryJson());
        StringBuilder fj = new StringBuilder("{");
        for (Map.Entry<String, AtomicLong> e : failures.entrySet()) kv(fj, e.getKey(), e.getValue().get());
        close(fj);
        kv(j, "failures", fj.toString());
        if (tx) {
            StringBuilder t = new StringBuilder("{");
            kv(t, "local_commit", localCommit.get());
            kv(t, "local_rollback", localRollback.get());
            kv(t, "local_unknown", localUnknown.get());
            kv(t, "rates", String.format(java.util.Locale.ROOT, "{\"sr\":%s,\"su\":%s,\"cr\":%s,\"cu\":%s}",
                o.sendRollback, o.sendUnknown, o.checkRollback, o.checkUnknown));
            kv(t, "checks", checks.get());
            kv(t, "check_commit", checkCommit.get());
            kv(t, "check_rollback", checkRollback.get());
            kv(t, "check_unknown", checkUnknown.get());
            kv(t, "unexpected_checks", unexpectedChecks.get());
            kv(t, "duplicate_checks_after_resolution", lateChecks.get());
            kv(t, "foreign_checks", foreignChecks.get());
            StringBuilder h = new StringBuilder("{");
            for (Map.Entry<Integer, AtomicLong> e : new java.util.TreeMap<>(checkTimesHist).entrySet()) kv(h, String.valueOf(e.getKey()), e.getValue().get());
            close(h);
            kv(t, "checks_by_check_number", h.toString());
            kv(t, "unknown_pending_at_send_end", unresolvedAtSendEnd);
            kv(t, "unknown_unresolved_at_end", leftUnknown);
            kv(t, "drain_limit_s", o.drainS);
            kv(t, "drain_waited_s", round3(drainWaited));
            kv(t, "all_resolved_after_send_end_s",
                unknownAt.isEmpty() && lastResolveNanos > 0 ? String.valueOf(round3(Math.max(0, lastResolveNanos - sendsDone) / 1e9)) : "null");
            kv(t, "unknown_to_resolved", resolveLat.summaryJson());
            kv(t, "end_transaction", "\"one-way (unacknowledged)\"");
            close(t);
            kv(j, "tx", t.toString());
        }
        if (consumer != null) {
            StringBuilder c = new StringBuilder("{");
            kv(c, "consumer_threads", o.consumeThreads);
            kv(c, "expected", expectedDeliveries.get());
            kv(c, "delivered", delivered.get());
            kv(c, "duplicates", dupDeliveries.get());
            kv(c, "duplicates_same_queue_offset", dupSamePosition.get());
            kv(c, "duplicates_other_queue_offset", dupOtherPosition.get());
            kv(c, "duplicate_examples", "[" + String.join(",", dupExamples) + "]");
            kv(c, "rolled_back_delivered", rolledBackDelivered.get());
            kv(c, "waited_after_send_end_s", round3(consumeWaited));
            kv(c, tx ? "commit_decision_to_delivery" : "send_start_to_delivery", commitToDeliver.summaryJson());
            kv(c, "store_to_delivery_ms_clock", storeToDeliver.summaryJson());
            kv(c, "born_to_delivery_ms_clock", bornToDeliver.summaryJson());
            close(c);
            kv(j, "consume", c.toString());
        }
        close(j);
        System.out.println("RESULT " + j);
        System.out.flush();
        if (consumer != null) consumer.shutdown();
        producer.shutdown();
        System.exit(0);
    }

    /** One send (transactional or plain); returns the latency in micros, or -1 on failure. */
    long sendOne(DefaultMQProducer producer, boolean tx, boolean measured) {
        Message msg = build(measured);
        long seqNo = bodySeq(msg.getBody());
        long t0 = System.nanoTime();
        // plain send: the reference time for delivery latency is the send start; registered before the
        // send so that a delivery racing ahead of the send's return is still matched
        boolean plainTracked = !tx && measured && consumerOn;
        if (plainTracked) commitAt.put(seqNo, t0);
        try {
            SendResult r = tx ? producer.sendMessageInTransaction(msg, null) : producer.send(msg);
            boolean good = r != null && r.getSendStatus() == SendStatus.SEND_OK;
            if (!tx && measured && good) expectedDeliveries.incrementAndGet();
            if (plainTracked && !good) commitAt.remove(seqNo);
            record(t0, good, good ? null : (r == null ? "null" : r.getSendStatus().name()));
            return good ? (System.nanoTime() - t0) / 1000 : -1;
        } catch (Throwable e) {
            if (plainTracked) commitAt.remove(seqNo);
            record(t0, false, e.getClass().getSimpleName());
            return -1;
        }
    }

    DefaultMQPushConsumer startConsumer() throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer("txbench_consumer_" + runId);
        c.setNamesrvAddr(o.namesrv);
        c.setInstanceName("txbench-c-" + runId);
        c.setConsumeThreadMin(o.consumeThreads);
        c.setConsumeThreadMax(o.consumeThreads);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET);
        c.subscribe(o.topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            long nowNs = System.nanoTime();
            long nowMs = System.currentTimeMillis();
            for (MessageExt m : msgs) {
                byte[] body = m.getBody();
                if (body == null || body.length < HEADER || bodyRun(body) != runId) { strayDeliveries.incrementAndGet(); continue; }
                long s = bodySeq(body);
                if (s < 0) {
                    if (s == probeSeq) probeSeen.countDown();
                    continue;
                }
                long pos = ((long) m.getQueueId() << 48) | (m.getQueueOffset() & 0xFFFFFFFFFFFFL);
                Long firstPos = firstPosition.putIfAbsent(s, pos);
                if (firstPos != null) {
                    dupDeliveries.incrementAndGet();
                    if (firstPos == pos) dupSamePosition.incrementAndGet();      // the same stored message again
                    else {
                        dupOtherPosition.incrementAndGet();                      // a second stored copy
                        if (dupExamples.size() < 5) dupExamples.add(String.format(java.util.Locale.ROOT,
                            "{\"seq\":%d,\"first\":\"q%d@%d\",\"again\":\"q%d@%d\",\"msgId\":\"%s\",\"check_times\":\"%s\"}",
                            s, firstPos >>> 48, firstPos & 0xFFFFFFFFFFFFL, m.getQueueId(), m.getQueueOffset(),
                            m.getMsgId(), m.getUserProperty(MessageConst.PROPERTY_TRANSACTION_CHECK_TIMES)));
                    }
                    continue;
                }
                if (rolledBack.contains(s)) rolledBackDelivered.incrementAndGet();
                delivered.incrementAndGet();
                Long at = commitAt.remove(s);
                if (at != null) commitToDeliver.add(Math.max(0, (nowNs - at) / 1000));
                storeToDeliver.add(Math.max(0, nowMs - m.getStoreTimestamp()) * 1000);
                bornToDeliver.add(Math.max(0, nowMs - m.getBornTimestamp()) * 1000);
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        return c;
    }

    // ------------------------------------------------------------ tiny JSON
    static String q(String s) { return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\""; }
    static double round3(double x) { return Math.round(x * 1000.0) / 1000.0; }
    static void kv(StringBuilder b, String k, Object v) {
        if (b.length() > 1) b.append(',');
        b.append(q(k)).append(':').append(v);
    }
    static void close(StringBuilder b) { b.append('}'); }

    public static void main(String[] args) throws Exception {
        Opts o = Opts.parse(args);
        System.out.println("STAT start mode=" + o.mode + " threads=" + o.threads + " size=" + o.size
            + " duration_s=" + o.durationS + " topic=" + o.topic + " group=" + o.group);
        new TxBench(o).run();
    }
}
