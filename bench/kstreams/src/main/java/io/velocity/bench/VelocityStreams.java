package io.velocity.bench;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams peer of the end-to-end comparison: velocity features the way a team
 * hand-rolls them in Kafka Streams, to measure ours against the usual alternative.
 *
 * <p>A Processor API topology (source, one processor with a persistent RocksDB
 * KeyValueStore of per-entity bucket rings, sink). For every input record it decodes the
 * Avro Transaction by hand, reads the entity's state, counts the event into its bucket of
 * each window (1m:1s, 5m:5s, 1h:1m, 24h:1h), reads count/sum/min/max back over the
 * window's buckets, writes the state back and forwards one VelocityFeatures record in the
 * same Avro binary as velocity-consumer's output (schemas/velocity_features.avsc), so the
 * benchmark harness decodes both outputs with one decoder and both sides pay for the
 * same output bytes.
 *
 * <p>Where it differs from velocity-consumer (on purpose; this is the common hand-rolled
 * shape, not a port of our pipeline): events are applied in arrival order with no
 * reorder buffer and no watermark, so an out-of-order event is counted into its own
 * bucket (like our --late=apply) and reads only buckets up to its own; nothing is ever
 * late or dead-lettered; there is no dedupe of event_id and no validation beyond
 * decoding; state is the store's, with its changelog topic as the recovery path.
 *
 * <p>Usage: java -jar velocity-kstreams.jar BROKERS INPUT OUTPUT APP_ID STATE_DIR EOS [groups=N]
 * where EOS is "eos" (processing.guarantee=exactly_once_v2) or "alo" (at_least_once).
 * With groups=N (1..3) it runs the several-keys topology of {@link VelocityGroups} over
 * payment events instead, with the same settings. It runs until SIGTERM.
 */
public final class VelocityStreams {
    static final String STORE = "velocity-state";

    // The default window set of velocity-consumer, in output order.
    static final String[] NAMES = {"1m", "5m", "1h", "24h"};
    static final long[] WINDOW_MS = {60_000L, 300_000L, 3_600_000L, 86_400_000L};
    static final long[] BUCKET_MS = {1_000L, 5_000L, 60_000L, 3_600_000L};

    public static void main(String[] args) throws Exception {
        if ((args.length != 6 && args.length != 7) || (args.length == 7 && !args[6].startsWith("groups="))) {
            System.err.println("usage: velocity-kstreams BROKERS INPUT OUTPUT APP_ID STATE_DIR eos|alo [groups=N]");
            System.exit(2);
        }
        String brokers = args[0], input = args[1], output = args[2], appId = args[3], stateDir = args[4];
        boolean eos = args[5].equals("eos");
        int groups = args.length == 7 ? Integer.parseInt(args[6].substring("groups=".length())) : 0;

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
                eos ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
        // One stream thread per core of this 2-core machine; 4 input partitions = 4 tasks.
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // velocity-consumer's sink compresses with lz4 and lingers 2 ms; give the peer the same.
        p.put(StreamsConfig.producerPrefix(ProducerConfig.COMPRESSION_TYPE_CONFIG), "lz4");
        p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 2);
        // Everything else stays at the defaults a team starts from: commit.interval.ms is
        // 30 s at-least-once and 100 ms under exactly_once_v2; the record cache is 10 MiB.

        Topology t;
        if (groups > 0) {
            t = VelocityGroups.topology(input, output, groups);
        } else {
            t = new Topology();
            t.addSource("transactions", new ByteArrayDeserializer(), new ByteArrayDeserializer(), input);
            t.addProcessor("velocity", VelocityProcessor::new, "transactions");
            t.addStateStore(Stores.keyValueStoreBuilder(
                    Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.ByteArray()), "velocity");
            t.addSink("features", output, new ByteArraySerializer(), new ByteArraySerializer(), "velocity");
        }

        KafkaStreams streams = new KafkaStreams(t, p);
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            done.countDown();
        }));
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_APPLICATION;
        });
        streams.start();
        done.await();
    }

    /** One entity's state: newest and previous event time, and one bucket ring per window. */
    static final class EntityState {
        long newest;
        long prevT;
        // Per window: non-empty buckets in increasing k, as parallel arrays of
        // (k, count, sum, min, max), length n[w].
        final long[][] k = new long[4][];
        final long[][] cnt = new long[4][];
        final long[][] sum = new long[4][];
        final long[][] min = new long[4][];
        final long[][] max = new long[4][];
        final int[] n = new int[4];

        static EntityState fresh(long t) {
            EntityState s = new EntityState();
            s.newest = t;
            s.prevT = t;
            for (int w = 0; w < 4; w++) {
                s.alloc(w, 4);
            }
            return s;
        }

        void alloc(int w, int cap) {
            k[w] = new long[cap];
            cnt[w] = new long[cap];
            sum[w] = new long[cap];
            min[w] = new long[cap];
            max[w] = new long[cap];
        }

        void grow(int w) {
            int cap = k[w].length * 2;
            k[w] = java.util.Arrays.copyOf(k[w], cap);
            cnt[w] = java.util.Arrays.copyOf(cnt[w], cap);
            sum[w] = java.util.Arrays.copyOf(sum[w], cap);
            min[w] = java.util.Arrays.copyOf(min[w], cap);
            max[w] = java.util.Arrays.copyOf(max[w], cap);
        }

        /** Serialized as longs: newest, prevT, then per window n and n*(k,cnt,sum,min,max). */
        byte[] encode() {
            int total = 2 + 4;
            for (int w = 0; w < 4; w++) {
                total += 5 * n[w];
            }
            ByteBuffer b = ByteBuffer.allocate(total * 8);
            b.putLong(newest).putLong(prevT);
            for (int w = 0; w < 4; w++) {
                b.putLong(n[w]);
                for (int i = 0; i < n[w]; i++) {
                    b.putLong(k[w][i]).putLong(cnt[w][i]).putLong(sum[w][i]).putLong(min[w][i]).putLong(max[w][i]);
                }
            }
            return b.array();
        }

        static EntityState decode(byte[] bytes) {
            ByteBuffer b = ByteBuffer.wrap(bytes);
            EntityState s = new EntityState();
            s.newest = b.getLong();
            s.prevT = b.getLong();
            for (int w = 0; w < 4; w++) {
                int n = (int) b.getLong();
                s.alloc(w, Math.max(4, Integer.highestOneBit(Math.max(1, n)) * 2));
                s.n[w] = n;
                for (int i = 0; i < n; i++) {
                    s.k[w][i] = b.getLong();
                    s.cnt[w][i] = b.getLong();
                    s.sum[w][i] = b.getLong();
                    s.min[w][i] = b.getLong();
                    s.max[w][i] = b.getLong();
                }
            }
            return s;
        }

        /** Counts (t, a) into window w: drops buckets that left the window, then adds to bucket k. */
        void add(int w, long t, long a, long top) {
            long b = BUCKET_MS[w], nb = WINDOW_MS[w] / b;
            long kk = Math.floorDiv(t, b);
            long lowest = Math.floorDiv(top, b) - nb + 1;
            // Evict from the front: buckets are sorted by k.
            int drop = 0;
            while (drop < n[w] && k[w][drop] < lowest) {
                drop++;
            }
            if (drop > 0) {
                int rest = n[w] - drop;
                System.arraycopy(k[w], drop, k[w], 0, rest);
                System.arraycopy(cnt[w], drop, cnt[w], 0, rest);
                System.arraycopy(sum[w], drop, sum[w], 0, rest);
                System.arraycopy(min[w], drop, min[w], 0, rest);
                System.arraycopy(max[w], drop, max[w], 0, rest);
                n[w] = rest;
            }
            if (kk < lowest) {
                return; // expired out-of-order event: nothing is retained for it
            }
            // Find kk's position (from the back: in-order events land at the end).
            int i = n[w] - 1;
            while (i >= 0 && k[w][i] > kk) {
                i--;
            }
            if (i >= 0 && k[w][i] == kk) {
                cnt[w][i]++;
                sum[w][i] += a;
                min[w][i] = Math.min(min[w][i], a);
                max[w][i] = Math.max(max[w][i], a);
                return;
            }
            if (n[w] == k[w].length) {
                grow(w);
            }
            int at = i + 1, rest = n[w] - at;
            System.arraycopy(k[w], at, k[w], at + 1, rest);
            System.arraycopy(cnt[w], at, cnt[w], at + 1, rest);
            System.arraycopy(sum[w], at, sum[w], at + 1, rest);
            System.arraycopy(min[w], at, min[w], at + 1, rest);
            System.arraycopy(max[w], at, max[w], at + 1, rest);
            k[w][at] = kk;
            cnt[w][at] = 1;
            sum[w][at] = a;
            min[w][at] = a;
            max[w][at] = a;
            n[w]++;
        }
    }

    static final class VelocityProcessor implements Processor<byte[], byte[], byte[], byte[]> {
        private ProcessorContext<byte[], byte[]> ctx;
        private KeyValueStore<String, byte[]> store;
        private final Avro.Out out = new Avro.Out(256);
        private final long[] aggs = new long[16];

        @Override
        public void init(ProcessorContext<byte[], byte[]> context) {
            this.ctx = context;
            this.store = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<byte[], byte[]> r) {
            Avro.In in = new Avro.In(r.value());
            String eventId = in.string();
            String entityId = in.string();
            long amount = in.longv();
            in.string(); // currency: not used by the features
            long t = in.longv();

            byte[] prev = store.get(entityId);
            EntityState s;
            boolean hasPrev;
            long gap = 0;
            if (prev == null) {
                s = EntityState.fresh(t);
                hasPrev = false;
            } else {
                s = EntityState.decode(prev);
                hasPrev = true;
                gap = t - s.prevT;
            }
            long top = Math.max(s.newest, t);
            for (int w = 0; w < 4; w++) {
                s.add(w, t, amount, top);
                // Read back buckets lowest … k(t): all of them for an in-order event,
                // only those up to its own bucket for an out-of-order one.
                long kk = Math.floorDiv(t, BUCKET_MS[w]);
                long c = 0, sm = 0, mn = Long.MAX_VALUE, mx = Long.MIN_VALUE;
                for (int i = 0; i < s.n[w] && s.k[w][i] <= kk; i++) {
                    c += s.cnt[w][i];
                    sm += s.sum[w][i];
                    mn = Math.min(mn, s.min[w][i]);
                    mx = Math.max(mx, s.max[w][i]);
                }
                if (c == 0) {
                    mn = 0;
                    mx = 0;
                }
                aggs[4 * w] = c;
                aggs[4 * w + 1] = sm;
                aggs[4 * w + 2] = mn;
                aggs[4 * w + 3] = mx;
            }
            s.prevT = t;
            s.newest = top;
            store.put(entityId, s.encode());

            RecordMetadata md = ctx.recordMetadata().orElseThrow();
            out.reset();
            out.string(eventId);
            out.string(entityId);
            out.longv(t);
            out.longv(4);
            for (int w = 0; w < 4; w++) {
                out.string(NAMES[w]);
                out.longv(WINDOW_MS[w]);
                out.longv(BUCKET_MS[w]);
                for (int j = 0; j < 4; j++) {
                    out.longv(aggs[4 * w + j]);
                }
            }
            out.longv(0); // end of the windows array
            if (hasPrev) {
                out.longv(1); // union branch 1: long
                out.longv(gap);
            } else {
                out.longv(0); // union branch 0: null
            }
            out.bool(t < s.newest); // late: applied out of order
            out.string(md.topic());
            out.longv(md.partition());
            out.longv(md.offset());
            ctx.forward(new Record<>(r.key(), out.bytes(), r.timestamp()));
        }
    }

    /** Just enough Avro binary (zig-zag varints and length-prefixed strings). */
    static final class Avro {
        static final class In {
            private final byte[] b;
            private int i;

            In(byte[] b) {
                this.b = b;
            }

            long longv() {
                long u = 0;
                int shift = 0;
                while (true) {
                    byte x = b[i++];
                    u |= (long) (x & 0x7f) << shift;
                    if ((x & 0x80) == 0) {
                        break;
                    }
                    shift += 7;
                    if (shift > 63) {
                        throw new IllegalArgumentException("varint too long");
                    }
                }
                return (u >>> 1) ^ -(u & 1);
            }

            String string() {
                int n = (int) longv();
                String s = new String(b, i, n, StandardCharsets.UTF_8);
                i += n;
                return s;
            }

            /** A string's raw bytes (also Avro bytes). */
            byte[] bytes() {
                int n = (int) longv();
                byte[] x = java.util.Arrays.copyOfRange(b, i, i + n);
                i += n;
                return x;
            }

            void skipString() {
                int n = (int) longv(); // not `i += longv()`: Java reads i before longv moves it
                i += n;
            }

            /** A ["null", "string"] union; null is returned as "". */
            String nullableString() {
                long branch = longv();
                if (branch == 0) {
                    return "";
                }
                if (branch != 1) {
                    throw new IllegalArgumentException("union branch " + branch);
                }
                return string();
            }

            /** An Avro decimal (bytes): the unscaled value, big-endian two's complement. */
            long decimalUnscaled() {
                int n = (int) longv();
                if (n < 1 || n > 8) {
                    throw new IllegalArgumentException("decimal of " + n + " bytes");
                }
                long v = b[i]; // sign-extended
                for (int j = 1; j < n; j++) {
                    v = (v << 8) | (b[i + j] & 0xff);
                }
                i += n;
                return v;
            }
        }

        static final class Out {
            private byte[] b;
            private int n;

            Out(int cap) {
                b = new byte[cap];
            }

            void reset() {
                n = 0;
            }

            private void ensure(int more) {
                if (n + more > b.length) {
                    b = java.util.Arrays.copyOf(b, Math.max(b.length * 2, n + more));
                }
            }

            void longv(long v) {
                ensure(10);
                long u = (v << 1) ^ (v >> 63);
                while ((u & ~0x7fL) != 0) {
                    b[n++] = (byte) ((u & 0x7f) | 0x80);
                    u >>>= 7;
                }
                b[n++] = (byte) u;
            }

            void bool(boolean v) {
                ensure(1);
                b[n++] = (byte) (v ? 1 : 0);
            }

            void string(String s) {
                byte[] x = s.getBytes(StandardCharsets.UTF_8);
                longv(x.length);
                ensure(x.length);
                System.arraycopy(x, 0, b, n, x.length);
                n += x.length;
            }

            byte[] bytes() {
                return java.util.Arrays.copyOf(b, n);
            }
        }
    }
}
