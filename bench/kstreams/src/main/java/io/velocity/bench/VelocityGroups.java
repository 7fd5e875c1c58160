package io.velocity.bench;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams peer of the several-keys benchmark (velocity-bench groups=N): the
 * features of 1, 2 or 3 key dimensions of one payments stream, the way a team would
 * hand-roll a multi-key velocity service in Kafka Streams.
 *
 * <p>The input is examples/features/payment_event.avsc records (the copy in
 * cmd/velocity-bench/testdata), keyed and partitioned by card id. One {@code processValues} step decodes each record once into a
 * compact value holding what the groups need (card, device, IP, event id, amount, event
 * time) and the input record's lineage (topic, partition, offset). Then per group:
 * <ul>
 *   <li>card, the key the input is partitioned by: processed in place;
 *   <li>device and ip: {@code selectKey} to the group's key and {@code repartition()}, so
 *       Streams writes the compact value to its own repartition topic
 *       ({@code <application id>-<group>-repartition}, created by Streams, the input's
 *       partition count) and a second sub-topology reads it back co-partitioned by the
 *       new key. A record without the key (null or empty) is filtered out before the
 *       hop and yields no row for that group.
 * </ul>
 * Each group's processor keeps a persistent RocksDB KeyValueStore (with changelog) of
 * per-key state: one ring of (bucket, count, sum) per window, the newest and previous
 * event time, and for the device group the cards seen with the time each was last seen.
 * For every record it counts the event into each window, reads count and sum back over
 * the window (the same rule as the single-key peer, VelocityStreams, and ours:
 * buckets from the key's newest event's window start up to the event's own bucket), and
 * forwards one row per record to the group's output topic (OUTPUT for card,
 * OUTPUT.device, OUTPUT.ip), in the Avro binary of the flat record ours generates for
 * the same definition (feature.AvroSchema): event_id, entity_id = the group's key,
 * event_time, attempts_&lt;w&gt; per window, spend_&lt;w&gt; per window, then for
 * device distinct_cards_24h and distinct_cards_exact, then ms_since_previous, late,
 * source_topic, source_partition, source_offset of the INPUT record. The windows are
 * velocity-bench's benchGroups (groups.go); velocity-bench decodes both sides' rows
 * with one decoder and fails a row of any other shape.
 *
 * <p>distinct_cards_24h is exact: the device's state holds every card id (as a string)
 * with the latest event time it was seen at; an entry whose time is before the start
 * of the first bucket of the 24h window of the device's newest event is dropped, and
 * the count is the number of entries left (so for an out-of-order event it also counts
 * cards seen after it, as ours does). distinct_cards_exact is therefore always true.
 * Ours is exact up to 64 cards per device and window and samples beyond; the benchmark
 * workload has 16 cards per device, so both are exact there.
 *
 * <p>Like the single-key peer, and unlike ours: events are applied in arrival order (a
 * re-keyed group's in whatever order the repartition topic interleaves the input
 * partitions), with no reorder buffer and no watermark, no dedupe and no dead letters.
 * So a re-keyed group's rows depend on that interleaving: when one input partition's
 * task runs minutes of event time ahead of another (an input produced before the
 * start, as in the benchmark), a device or IP sees its events out of order by more
 * than its shortest window, and the rows differ from run to run
 * (`velocity-bench groups-check` tells these apart from a computing error; ours
 * releases each group's events in event-time order instead, docs/repartition.md).
 */
final class VelocityGroups {
    private VelocityGroups() {}

    // Where a group's key is in the compact value (Hop).
    static final int KEY_CARD = 0, KEY_DEVICE = 1, KEY_IP = 2;

    /** One key dimension: its name, key, windows (W, b in ms) and whether it counts distinct cards. */
    static final class GroupDef {
        final String name;
        final int keyField;
        final long[] windowMs, bucketMs;
        final boolean distinctCards;

        GroupDef(String name, int keyField, long[] windowMs, long[] bucketMs, boolean distinctCards) {
            this.name = name;
            this.keyField = keyField;
            this.windowMs = windowMs;
            this.bucketMs = bucketMs;
            this.distinctCards = distinctCards;
        }

        int windows() {
            return windowMs.length;
        }
    }

    // velocity-bench's benchGroups, in order (groups.go): card 1m:1s, 1h:1m, 24h:1h;
    // device 5m:5s, 24h:1h + distinct cards over 24h; ip 5m:5s, 1h:1m.
    static final GroupDef[] GROUPS = {
        new GroupDef("card", KEY_CARD, new long[] {60_000L, 3_600_000L, 86_400_000L},
                new long[] {1_000L, 60_000L, 3_600_000L}, false),
        new GroupDef("device", KEY_DEVICE, new long[] {300_000L, 86_400_000L},
                new long[] {5_000L, 3_600_000L}, true),
        new GroupDef("ip", KEY_IP, new long[] {300_000L, 3_600_000L},
                new long[] {5_000L, 60_000L}, false),
    };

    /** The topology of the first n groups (1..3) from input to output and output.&lt;group&gt;. */
    static Topology topology(String input, String output, int n) {
        if (n < 1 || n > GROUPS.length) {
            throw new IllegalArgumentException("groups=" + n + ": want 1.." + GROUPS.length);
        }
        StreamsBuilder b = new StreamsBuilder();
        KStream<byte[], byte[]> events = b.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .processValues(Decode::new, Named.as("decode"));
        for (int g = 0; g < n; g++) {
            GroupDef def = GROUPS[g];
            String store = def.name + "-state";
            b.addStateStore(Stores.keyValueStoreBuilder(
                    Stores.persistentKeyValueStore(store), Serdes.String(), Serdes.ByteArray()));
            KStream<byte[], byte[]> keyed = events;
            if (g > 0) {
                keyed = events
                        .filter((k, v) -> Hop.hasKey(v, def.keyField), Named.as(def.name + "-has-key"))
                        .selectKey((k, v) -> Hop.keyBytes(v, def.keyField), Named.as(def.name + "-key"))
                        .repartition(Repartitioned.<byte[], byte[]>as(def.name)
                                .withKeySerde(Serdes.ByteArray()).withValueSerde(Serdes.ByteArray()));
            }
            String topic = g == 0 ? output : output + "." + def.name;
            keyed.process(() -> new GroupProcessor(def, store), Named.as(def.name + "-features"), store)
                    .to(topic, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        }
        return b.build();
    }

    /**
     * The compact value between the decode step and the groups (and on the repartition
     * topics): card, device, ip (empty when absent), event id, amount, event time,
     * source topic, partition and offset, in the single-key peer's Avro primitives.
     * The keys come first so that selectKey reads only what it needs.
     */
    static final class Hop {
        String card, device, ip, eventId, srcTopic;
        long amount, t, srcPartition, srcOffset;

        static Hop parse(byte[] v) {
            VelocityStreams.Avro.In in = new VelocityStreams.Avro.In(v);
            Hop h = new Hop();
            h.card = in.string();
            h.device = in.string();
            h.ip = in.string();
            h.eventId = in.string();
            h.amount = in.longv();
            h.t = in.longv();
            h.srcTopic = in.string();
            h.srcPartition = in.longv();
            h.srcOffset = in.longv();
            return h;
        }

        String key(int field) {
            switch (field) {
                case KEY_CARD:
                    return card;
                case KEY_DEVICE:
                    return device;
                default:
                    return ip;
            }
        }

        /** The raw UTF-8 bytes of key field (0 card, 1 device, 2 ip), read without a full parse. */
        static byte[] keyBytes(byte[] v, int field) {
            VelocityStreams.Avro.In in = new VelocityStreams.Avro.In(v);
            for (int i = 0; i < field; i++) {
                in.skipString();
            }
            return in.bytes();
        }

        static boolean hasKey(byte[] v, int field) {
            return keyBytes(v, field).length > 0;
        }
    }

    /** Decodes a payment_event.avsc record once and attaches the input record's lineage. */
    static final class Decode implements FixedKeyProcessor<byte[], byte[], byte[]> {
        private FixedKeyProcessorContext<byte[], byte[]> ctx;
        private final VelocityStreams.Avro.Out out = new VelocityStreams.Avro.Out(160);

        @Override
        public void init(FixedKeyProcessorContext<byte[], byte[]> context) {
            this.ctx = context;
        }

        @Override
        public void process(FixedKeyRecord<byte[], byte[]> r) {
            // txn_id, card {id, bin}, device_id, ip, merchant, amount, ts, status: the fields
            // the groups do not use are stepped over.
            VelocityStreams.Avro.In in = new VelocityStreams.Avro.In(r.value());
            String eventId = in.string();
            String card = in.string();
            in.nullableString(); // card.bin
            String device = in.nullableString();
            String ip = in.nullableString();
            if (in.longv() == 1) { // merchant: a record of id and mcc
                in.skipString();
                in.skipString();
            }
            long amount = in.decimalUnscaled(); // decimal(18,2): the unscaled value is minor units
            long t = Math.floorDiv(in.longv(), 1000L); // timestamp-micros, floored to ms as ours does
            in.longv(); // status
            RecordMetadata md = ctx.recordMetadata().orElseThrow();
            out.reset();
            out.string(card);
            out.string(device);
            out.string(ip);
            out.string(eventId);
            out.longv(amount);
            out.longv(t);
            out.string(md.topic());
            out.longv(md.partition());
            out.longv(md.offset());
            ctx.forward(r.withValue(out.bytes()));
        }
    }

    /** One key's state in one group. */
    static final class KeyState {
        long newest, prevT;
        // Per window: non-empty buckets in increasing k, as parallel arrays, length n[w].
        final long[][] k, cnt, sum;
        final int[] n;
        // Distinct cards (device group): card ids and the latest time each was seen, length nd.
        String[] cards = new String[0];
        long[] seen = new long[0];
        int nd;

        KeyState(int windows) {
            k = new long[windows][];
            cnt = new long[windows][];
            sum = new long[windows][];
            n = new int[windows];
        }

        static KeyState fresh(GroupDef def, long t) {
            KeyState s = new KeyState(def.windows());
            s.newest = t;
            s.prevT = t;
            for (int w = 0; w < def.windows(); w++) {
                s.alloc(w, 4);
            }
            return s;
        }

        void alloc(int w, int cap) {
            k[w] = new long[cap];
            cnt[w] = new long[cap];
            sum[w] = new long[cap];
        }

        /** newest, prevT, per window n and n × (k, cnt, sum), then nd and nd × (card, seen). */
        byte[] encode() {
            int size = 16;
            for (int w = 0; w < n.length; w++) {
                size += 4 + 24 * n[w];
            }
            byte[][] utf8 = new byte[nd][];
            size += 4;
            for (int i = 0; i < nd; i++) {
                utf8[i] = cards[i].getBytes(StandardCharsets.UTF_8);
                size += 4 + utf8[i].length + 8;
            }
            ByteBuffer b = ByteBuffer.allocate(size);
            b.putLong(newest).putLong(prevT);
            for (int w = 0; w < n.length; w++) {
                b.putInt(n[w]);
                for (int i = 0; i < n[w]; i++) {
                    b.putLong(k[w][i]).putLong(cnt[w][i]).putLong(sum[w][i]);
                }
            }
            b.putInt(nd);
            for (int i = 0; i < nd; i++) {
                b.putInt(utf8[i].length).put(utf8[i]).putLong(seen[i]);
            }
            return b.array();
        }

        static KeyState decode(GroupDef def, byte[] bytes) {
            ByteBuffer b = ByteBuffer.wrap(bytes);
            KeyState s = new KeyState(def.windows());
            s.newest = b.getLong();
            s.prevT = b.getLong();
            for (int w = 0; w < def.windows(); w++) {
                int n = b.getInt();
                s.alloc(w, Math.max(4, Integer.highestOneBit(Math.max(1, n)) * 2));
                s.n[w] = n;
                for (int i = 0; i < n; i++) {
                    s.k[w][i] = b.getLong();
                    s.cnt[w][i] = b.getLong();
                    s.sum[w][i] = b.getLong();
                }
            }
            s.nd = b.getInt();
            s.cards = new String[Math.max(4, s.nd + 1)];
            s.seen = new long[s.cards.length];
            for (int i = 0; i < s.nd; i++) {
                byte[] x = new byte[b.getInt()];
                b.get(x);
                s.cards[i] = new String(x, StandardCharsets.UTF_8);
                s.seen[i] = b.getLong();
            }
            return s;
        }

        /** Counts (t, a) into window w of def; top is the key's newest event time, this one included. */
        void add(GroupDef def, int w, long t, long a, long top) {
            long bk = def.bucketMs[w], nb = def.windowMs[w] / bk;
            long kk = Math.floorDiv(t, bk);
            long lowest = Math.floorDiv(top, bk) - nb + 1;
            int drop = 0;
            while (drop < n[w] && k[w][drop] < lowest) {
                drop++;
            }
            if (drop > 0) {
                int rest = n[w] - drop;
                System.arraycopy(k[w], drop, k[w], 0, rest);
                System.arraycopy(cnt[w], drop, cnt[w], 0, rest);
                System.arraycopy(sum[w], drop, sum[w], 0, rest);
                n[w] = rest;
            }
            if (kk < lowest) {
                return; // expired out-of-order event: nothing is retained for it
            }
            int i = n[w] - 1;
            while (i >= 0 && k[w][i] > kk) {
                i--;
            }
            if (i >= 0 && k[w][i] == kk) {
                cnt[w][i]++;
                sum[w][i] += a;
                return;
            }
            if (n[w] == k[w].length) {
                int cap = k[w].length * 2;
                k[w] = Arrays.copyOf(k[w], cap);
                cnt[w] = Arrays.copyOf(cnt[w], cap);
                sum[w] = Arrays.copyOf(sum[w], cap);
            }
            int at = i + 1, rest = n[w] - at;
            System.arraycopy(k[w], at, k[w], at + 1, rest);
            System.arraycopy(cnt[w], at, cnt[w], at + 1, rest);
            System.arraycopy(sum[w], at, sum[w], at + 1, rest);
            k[w][at] = kk;
            cnt[w][at] = 1;
            sum[w][at] = a;
            n[w]++;
        }

        /**
         * Counts card at t into the distinct set over window w, drops the cards last seen
         * before that window's first bucket (of the key's newest event, top), and returns
         * the number left.
         */
        int distinct(GroupDef def, int w, String card, long t, long top) {
            long bk = def.bucketMs[w];
            long from = (Math.floorDiv(top, bk) - def.windowMs[w] / bk + 1) * bk;
            if (Math.floorDiv(t, bk) * bk >= from) {
                int i = 0;
                while (i < nd && !cards[i].equals(card)) {
                    i++;
                }
                if (i < nd) {
                    seen[i] = Math.max(seen[i], t);
                } else {
                    if (nd == cards.length) {
                        cards = Arrays.copyOf(cards, Math.max(4, nd * 2));
                        seen = Arrays.copyOf(seen, cards.length);
                    }
                    cards[nd] = card;
                    seen[nd] = t;
                    nd++;
                }
            }
            int kept = 0;
            for (int i = 0; i < nd; i++) {
                if (seen[i] >= from) {
                    cards[kept] = cards[i];
                    seen[kept] = seen[i];
                    kept++;
                }
            }
            Arrays.fill(cards, kept, nd, null);
            nd = kept;
            return nd;
        }
    }

    /** One group's features: per record, the key's state updated and one flat row forwarded. */
    static final class GroupProcessor implements Processor<byte[], byte[], byte[], byte[]> {
        private final GroupDef def;
        private final String storeName;
        private ProcessorContext<byte[], byte[]> ctx;
        private KeyValueStore<String, byte[]> store;
        private final VelocityStreams.Avro.Out out = new VelocityStreams.Avro.Out(256);
        private final long[] counts, sums;

        GroupProcessor(GroupDef def, String storeName) {
            this.def = def;
            this.storeName = storeName;
            this.counts = new long[def.windows()];
            this.sums = new long[def.windows()];
        }

        @Override
        public void init(ProcessorContext<byte[], byte[]> context) {
            this.ctx = context;
            this.store = context.getStateStore(storeName);
        }

        @Override
        public void process(Record<byte[], byte[]> r) {
            Hop h = Hop.parse(r.value());
            String key = h.key(def.keyField);
            long t = h.t;
            byte[] prev = store.get(key);
            KeyState s = prev == null ? KeyState.fresh(def, t) : KeyState.decode(def, prev);
            boolean hasPrev = prev != null;
            long gap = hasPrev ? t - s.prevT : 0;
            long top = Math.max(s.newest, t);
            for (int w = 0; w < def.windows(); w++) {
                s.add(def, w, t, h.amount, top);
                long kk = Math.floorDiv(t, def.bucketMs[w]);
                long c = 0, sm = 0;
                for (int i = 0; i < s.n[w] && s.k[w][i] <= kk; i++) {
                    c += s.cnt[w][i];
                    sm += s.sum[w][i];
                }
                counts[w] = c;
                sums[w] = sm;
            }
            int distinct = def.distinctCards ? s.distinct(def, def.windows() - 1, h.card, t, top) : 0;
            s.prevT = t;
            s.newest = top;
            store.put(key, s.encode());

            out.reset();
            out.string(h.eventId);
            out.string(key);
            out.longv(t);
            for (int w = 0; w < def.windows(); w++) {
                out.longv(counts[w]); // attempts_<w>
            }
            for (int w = 0; w < def.windows(); w++) {
                out.longv(sums[w]); // spend_<w>
            }
            if (def.distinctCards) {
                out.longv(distinct); // distinct_cards_<last window>
                out.bool(true); // distinct_cards_exact: the set is exact
            }
            if (hasPrev) {
                out.longv(1); // union branch 1: long
                out.longv(gap);
            } else {
                out.longv(0); // union branch 0: null
            }
            out.bool(t < top); // late: applied behind the key's newest event
            out.string(h.srcTopic);
            out.longv(h.srcPartition);
            out.longv(h.srcOffset);
            ctx.forward(new Record<>(key.getBytes(StandardCharsets.UTF_8), out.bytes(), r.timestamp()));
        }
    }
}
