//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/replay"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// replayT0 is 2026-11-01T00:00:00Z, the start of the synthetic streams' event time.
const replayT0 = 1793491200000

// replayStream returns n input records spread over partitions by entity,
// with record timestamps equal to event times. Every 53rd event is 5 s older
// than its predecessor (late under lateness 0), every 41st re-sends an earlier
// event_id (duplicate), every 97th has a negative amount (invalid): so the
// comparison covers dead letters as well as features.
func replayStream(topic string, n int, partitions int32) []*kgo.Record {
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		entity := fmt.Sprintf("card-%04d", i%997)
		tx := codec.Transaction{
			EventID:     "ev-" + strconv.Itoa(i),
			EntityID:    entity,
			AmountMinor: int64(100 + (i*7919)%50_000),
			Currency:    "EUR",
			EventTime:   replayT0 + int64(i)*10,
		}
		switch {
		case i%53 == 52:
			tx.EventTime -= 5000
		case i%41 == 40:
			tx.EventID = "ev-" + strconv.Itoa(i-3*int(partitions))
		case i%97 == 96:
			tx.AmountMinor = -1
		}
		recs = append(recs, &kgo.Record{
			Topic:     topic,
			Partition: int32(i%997) % partitions,
			Key:       []byte(entity),
			Value:     codec.EncodeTransaction(&tx),
			Timestamp: time.UnixMilli(tx.EventTime),
		})
	}
	return recs
}

// replayProducer produces replayStream records. franz-go counts the
// delivery timeout from a record's timestamp, and the stream's timestamps are
// weeks old, so the timeout is off; kafkatest.Produce's context bounds the wait.
func replayProducer(t *testing.T, addr string) *kgo.Client {
	return kafkatest.Client(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(0))
}

type replayPos struct {
	partition int32
	offset    int64
}

// replayTopicOutputs is what a run or a replay published, by source replayPos.
type replayTopicOutputs struct {
	features map[replayPos][]byte
	dead     map[replayPos]string // reason
	headers  map[string]int       // header keys seen on features records
}

// readReplayOutputs consumes the features and DLQ topics until n outputs arrived.
func readReplayOutputs(t *testing.T, ctx context.Context, addr, featuresTopic, dlqTopic string, n int) replayTopicOutputs {
	t.Helper()
	cl := kafkatest.Client(t, addr,
		kgo.ConsumeTopics(featuresTopic, dlqTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	out := replayTopicOutputs{features: map[replayPos][]byte{}, dead: map[replayPos]string{}, headers: map[string]int{}}
	for len(out.features)+len(out.dead) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d features + %d dead letters of %d before the deadline: %v", len(out.features), len(out.dead), n, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic == featuresTopic {
				f, err := codec.DecodeFeatures(r.Value)
				if err != nil {
					t.Fatalf("features record at %d: %v", r.Offset, err)
				}
				pos := replayPos{f.SourcePartition, f.SourceOffset}
				if _, dup := out.features[pos]; dup {
					t.Errorf("two features records for %v", pos)
				}
				out.features[pos] = r.Value
				if string(r.Key) != f.EntityID {
					t.Errorf("features key %q, want the entity id %q", r.Key, f.EntityID)
				}
				for _, h := range r.Headers {
					out.headers[h.Key]++
				}
				return
			}
			h := map[string]string{}
			for _, hd := range r.Headers {
				h[hd.Key] = string(hd.Value)
			}
			p, _ := strconv.Atoi(h[codec.HeaderSourcePartition])
			o, _ := strconv.ParseInt(h[codec.HeaderSourceOffset], 10, 64)
			out.dead[replayPos{int32(p), o}] = h[codec.HeaderReason]
		})
	}
	return out
}

// replayBinary builds velocity-consumer into the test's temporary directory.
func replayBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "velocity-consumer")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/velocity-consumer").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestReplayMatchesLiveRun runs the live service in process over a topic on
// the real broker, then replays the same topic with the built binary to
// topics and to a Parquet file: every source offset must get the same
// outcome, and every features value must be byte-identical.
//
// The live run has idle timeout 0 and allowed lateness 0: each event is
// released on arrival, so no wall-clock release can make it differ from the
// replay, and the live run publishes every offset without waiting for an end.
func TestReplayMatchesLiveRun(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	bin := replayBinary(t)
	const n, partitions = 6000, 3
	in := kafkatest.CreateTopic(t, addr, partitions, nil)
	liveOut, liveDLQ := kafkatest.CreateTopic(t, addr, 1, nil), kafkatest.CreateTopic(t, addr, 1, nil)
	replayOut, replayDLQ := kafkatest.CreateTopic(t, addr, 1, nil), kafkatest.CreateTopic(t, addr, 1, nil)
	ctx := kafkatest.Context(t, 4*time.Minute)

	prod := replayProducer(t, addr)
	if err := kafkatest.Produce(ctx, prod, replayStream(in, n, partitions)...); err != nil {
		t.Fatal(err)
	}

	specs, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(service.Config{
		Brokers: kafkatest.Seeds(addr), Group: kafkatest.Group(t),
		InputTopic: in, OutputTopic: liveOut, DLQTopic: liveDLQ,
		Specs:     specs,
		Window:    window.Options{MaxEntities: 5_000_000, HistoryTTLMs: (7 * 24 * time.Hour).Milliseconds()},
		Watermark: watermark.Config{AllowedLateness: 0, DedupeHorizon: (24 * time.Hour).Milliseconds(), IdleTimeout: 0},
		Store:     checkpoint.NewMemoryStore(),
		Host:      "live",
	}, zap.NewNop(), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- svc.Run(runCtx) }()
	live := readReplayOutputs(t, ctx, addr, liveOut, liveDLQ, n)
	stop()
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("live service: %v", err)
	}

	parquetPath := filepath.Join(t.TempDir(), "features.parquet")
	for _, output := range [][]string{
		{"--output", "topic:" + replayOut, "--dlq", "topic:" + replayDLQ},
		{"--output", parquetPath},
	} {
		args := append([]string{"replay", "--brokers", addr, "--input-topic", in, "--allowed-lateness", "0s", "--quiet", "--log-level", "warn"}, output...)
		cmd := exec.CommandContext(ctx, bin, args...)
		// The same environment a deployment would have: replay must ignore
		// the live-only idle timeout.
		cmd.Env = append(os.Environ(), "VELOCITY_IDLE_TIMEOUT=250ms")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("velocity-consumer %v: %v\n%s", args, err, out)
		}
	}
	rep := readReplayOutputs(t, ctx, addr, replayOut, replayDLQ, n)

	if len(live.features)+len(live.dead) != n || len(rep.features)+len(rep.dead) != n {
		t.Fatalf("live: %d features + %d dead, replay: %d + %d; want %d in all", len(live.features), len(live.dead), len(rep.features), len(rep.dead), n)
	}
	if len(live.dead) == 0 || len(live.features) == 0 {
		t.Fatalf("the stream should give both features (%d) and dead letters (%d)", len(live.features), len(live.dead))
	}
	mismatch := 0
	for pos, lv := range live.features {
		if rv, ok := rep.features[pos]; !ok || string(rv) != string(lv) {
			if mismatch++; mismatch <= 5 {
				lf, _ := codec.DecodeFeatures(lv)
				rf, _ := codec.DecodeFeatures(rv)
				t.Errorf("partition %d offset %d: live %+v\nreplay %+v", pos.partition, pos.offset, lf, rf)
			}
		}
	}
	for pos, reason := range live.dead {
		if rep.dead[pos] != reason {
			if mismatch++; mismatch <= 10 {
				t.Errorf("partition %d offset %d: live dead letter %q, replay %q", pos.partition, pos.offset, reason, rep.dead[pos])
			}
		}
	}
	if mismatch > 0 {
		t.Fatalf("%d of %d offsets differ between live and replay", mismatch, n)
	}
	for _, h := range []string{"velocity.emitted_at", "velocity.host"} {
		if rep.headers[h] != len(rep.features) {
			t.Errorf("header %s on %d of %d replayed features records", h, rep.headers[h], len(rep.features))
		}
	}
	t.Logf("%d offsets: %d features byte-identical, %d dead letters with the same reasons", n, len(live.features), len(live.dead))

	// A range from the middle of each partition: with a warm-up from the
	// start its features are the live ones; without, windows start empty
	// and some must differ (or the warm-up would prove nothing).
	specsPipe := replayPipeline(t, specs, 0)
	for _, warm := range []bool{true, false} {
		cfg := replay.TopicConfig{Brokers: kafkatest.Seeds(addr), Topic: in, From: replay.OffsetBound(700), To: replay.End}
		if warm {
			cfg.WarmUpFrom = &replay.Start
		}
		src, err := replay.OpenTopic(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := &collectSink{features: map[replayPos][]byte{}}
		res, err := replay.Run(ctx, src, replay.Config{Pipeline: specsPipe, Features: got, Dead: got})
		if err != nil {
			t.Fatal(err)
		}
		same, differ := 0, 0
		for pos, v := range got.features {
			if pos.offset < 700 {
				t.Fatalf("warm-up=%v: an output for offset %d, before the range", warm, pos.offset)
			}
			if string(live.features[pos]) == string(v) {
				same++
			} else {
				differ++
			}
		}
		if res.Records != int64(len(got.features)+got.dead) {
			t.Errorf("warm-up=%v: %d records gave %d features + %d dead letters", warm, res.Records, len(got.features), got.dead)
		}
		switch {
		case warm && (differ > 0 || same == 0 || res.WarmUp != 3*700):
			t.Errorf("with warm-up: %d identical, %d differ from live, %d warm-up records; want all identical after 2100 warm-up records", same, differ, res.WarmUp)
		case !warm && differ == 0:
			t.Errorf("without warm-up all %d features equal live ones: the test cannot tell warm-up from none", same)
		}
	}

	// The Parquet replay holds one row per features record, at the same positions.
	f, err := os.Open(parquetPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := parquet.Read[struct {
		Partition int32  `parquet:"source_partition"`
		Offset    int64  `parquet:"source_offset"`
		EventID   string `parquet:"event_id"`
	}](f, replayFileSize(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(live.features) {
		t.Fatalf("parquet has %d rows, want %d", len(rows), len(live.features))
	}
	for i, r := range rows {
		lf, _ := codec.DecodeFeatures(live.features[replayPos{r.Partition, r.Offset}])
		if lf.EventID != r.EventID {
			t.Fatalf("parquet row %d: %s at %d/%d, live has %q there", i, r.EventID, r.Partition, r.Offset, lf.EventID)
		}
		if i > 0 && r.Partition < rows[i-1].Partition {
			t.Fatalf("parquet row %d: partition %d after %d; partitions must come in ascending order", i, r.Partition, rows[i-1].Partition)
		}
	}
}

func replayFileSize(t *testing.T, f *os.File) int64 {
	t.Helper()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestReplayTopicRanges checks how --from/--to and --partitions resolve to
// offsets on a real broker: by offset, by record timestamp, start/end, and a
// partition subset; and that a replay of a range reads exactly that range.
func TestReplayTopicRanges(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	const n, partitions = 300, 2
	in := kafkatest.CreateTopic(t, addr, partitions, nil)
	ctx := kafkatest.Context(t, time.Minute)
	prod := replayProducer(t, addr)
	recs := replayStream(in, n, partitions)
	if err := kafkatest.Produce(ctx, prod, recs...); err != nil {
		t.Fatal(err)
	}
	// Offsets per partition in production order, with their timestamps.
	var ts [partitions][]int64
	for _, r := range recs {
		ts[r.Partition] = append(ts[r.Partition], r.Timestamp.UnixMilli())
	}
	// firstAt is the first offset of p whose timestamp is >= ms (Kafka's rule).
	firstAt := func(p int32, ms int64) int64 {
		for o, t := range ts[p] {
			if t >= ms {
				return int64(o)
			}
		}
		return int64(len(ts[p]))
	}
	at := func(ms int64) replay.Bound { return replay.TimeBound(time.UnixMilli(ms)) }
	tests := []struct {
		name     string
		from, to replay.Bound
		parts    []int32
		want     map[int32]replay.Range
		warmUp   *replay.Bound
	}{
		{"whole topic", replay.Start, replay.End, nil, map[int32]replay.Range{
			0: replayRange(0, int64(len(ts[0]))), 1: replayRange(0, int64(len(ts[1])))}, nil},
		{"offsets", replay.OffsetBound(10), replay.OffsetBound(20), nil, map[int32]replay.Range{0: replayRange(10, 20), 1: replayRange(10, 20)}, nil},
		{"offsets past the end are clamped", replay.OffsetBound(100), replay.OffsetBound(1 << 40), []int32{1}, map[int32]replay.Range{1: replayRange(100, int64(len(ts[1])))}, nil},
		{"times", at(replayT0 + 500), at(replayT0 + 1500), nil, map[int32]replay.Range{
			0: replayRange(firstAt(0, replayT0+500), firstAt(0, replayT0+1500)), 1: replayRange(firstAt(1, replayT0+500), firstAt(1, replayT0+1500))}, nil},
		{"a time after everything is an empty range", at(replayT0 + 1e9), replay.End, []int32{0}, map[int32]replay.Range{
			0: replayRange(int64(len(ts[0])), int64(len(ts[0])))}, nil},
		{"warm-up from an offset", replay.OffsetBound(10), replay.OffsetBound(20), []int32{0}, map[int32]replay.Range{
			0: {WarmUp: 4, From: 10, To: 20}}, ptrBound(replay.OffsetBound(4))},
		{"warm-up after from is no warm-up", replay.OffsetBound(10), replay.OffsetBound(20), []int32{0}, map[int32]replay.Range{
			0: replayRange(10, 20)}, ptrBound(replay.OffsetBound(15))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, err := replay.OpenTopic(ctx, replay.TopicConfig{Brokers: kafkatest.Seeds(addr), Topic: in, Partitions: tt.parts, From: tt.from, To: tt.to, WarmUpFrom: tt.warmUp})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			if len(src.Partitions()) != len(tt.want) {
				t.Fatalf("partitions %v, want those of %v", src.Partitions(), tt.want)
			}
			for _, p := range src.Partitions() {
				if got := src.Range(p); got != tt.want[p] {
					t.Errorf("partition %d: range %+v, want %+v", p, got, tt.want[p])
				}
				var offsets []int64
				err := src.Read(ctx, p, nil, func(r *replay.Record) error {
					offsets = append(offsets, r.Offset)
					if r.WarmUp != (r.Offset < tt.want[p].From) {
						t.Errorf("offset %d: warm-up %v", r.Offset, r.WarmUp)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				w := tt.want[p]
				if w.From == w.To {
					w.WarmUp = w.From // an empty range skips its warm-up
				}
				if int64(len(offsets)) != w.To-w.WarmUp || (len(offsets) > 0 && (offsets[0] != w.WarmUp || offsets[len(offsets)-1] != w.To-1)) {
					t.Errorf("partition %d: read %d records %v…, want offsets %d..%d", p, len(offsets), replayHead(offsets), w.WarmUp, w.To-1)
				}
			}
		})
	}
	if _, err := replay.OpenTopic(ctx, replay.TopicConfig{Brokers: kafkatest.Seeds(addr), Topic: in, Partitions: []int32{7}, From: replay.Start, To: replay.End}); err == nil {
		t.Error("a partition the topic does not have was accepted")
	}
}

// TestReplayRecordsDeletedWhileItRuns: a replay resolves its range against the
// log start when it begins; records deleted after that (retention, DeleteRecords)
// must fail the replay with an error that says so, not skip them as the default
// offset reset would, nor pass on the broker's bare OFFSET_OUT_OF_RANGE.
func TestReplayRecordsDeletedWhileItRuns(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	const n = 400
	in := kafkatest.CreateTopic(t, addr, 1, nil)
	ctx := kafkatest.Context(t, time.Minute)
	if err := kafkatest.Produce(ctx, replayProducer(t, addr), replayStream(in, n, 1)...); err != nil {
		t.Fatal(err)
	}
	src, err := replay.OpenTopic(ctx, replay.TopicConfig{Brokers: kafkatest.Seeds(addr), Topic: in, From: replay.Start, To: replay.End})
	if err != nil {
		t.Fatal(err)
	}
	if r := src.Range(0); r.From != 0 || r.To != n {
		t.Fatalf("range %+v, want [0, %d)", r, n)
	}
	var del kadm.Offsets
	del.Add(kadm.Offset{Topic: in, Partition: 0, At: n / 2})
	resp, err := kafkatest.Admin(t, addr).DeleteRecords(ctx, del)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	read := 0
	err = src.Read(ctx, 0, nil, func(*replay.Record) error { read++; return nil })
	if !errors.Is(err, kerr.OffsetOutOfRange) || !strings.Contains(err.Error(), "records from offset 0 on, still to read, were deleted") {
		t.Fatalf("read after the deletion: %v; want OFFSET_OUT_OF_RANGE explained as a deletion from offset 0", err)
	}
	if read != 0 {
		t.Errorf("%d records read past a deletion that began at offset 0", read)
	}
}

func replayRange(from, to int64) replay.Range {
	return replay.Range{WarmUp: from, From: from, To: to}
}

func ptrBound(b replay.Bound) *replay.Bound { return &b }

func replayHead(s []int64) []int64 { return s[:min(len(s), 5)] }

// TestReplayTransactionalTopic replays a topic written by a transactional
// producer: committed, aborted, committed, and the range ending on a commit
// marker. The replay must see exactly the committed records (as the live
// read_committed consumer does) and must end, although the last offsets of
// the range are transaction markers that carry no record.
func TestReplayTransactionalTopic(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	topic := kafkatest.CreateTopic(t, addr, 1, nil)
	ctx := kafkatest.Context(t, 90*time.Second)
	prod := kafkatest.Client(t, addr, kgo.DefaultProduceTopic(topic), kgo.TransactionalID(kafkatest.TransactionalID(t)))
	i := 0
	txn := func(n int, end kgo.TransactionEndTry) (ids []string) {
		t.Helper()
		if err := prod.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for range n {
			tx := codec.Transaction{EventID: "ev-" + strconv.Itoa(i), EntityID: "card-1", AmountMinor: 1, EventTime: replayT0 + int64(i)}
			ids = append(ids, tx.EventID)
			i++
			if err := kafkatest.Produce(ctx, prod, &kgo.Record{Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := prod.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	want := txn(5, kgo.TryCommit)
	txn(3, kgo.TryAbort)
	want = append(want, txn(2, kgo.TryCommit)...)

	// 10 data records (3 of them aborted) and 3 markers: 13 offsets. The
	// coordinator writes the last marker after EndTransaction returns; wait
	// for it, or "end" (the last stable offset) would stop before txn 3.
	var src *replay.TopicSource
	for {
		var err error
		src, err = replay.OpenTopic(ctx, replay.TopicConfig{Brokers: kafkatest.Seeds(addr), Topic: topic, From: replay.Start, To: replay.End})
		if err != nil {
			t.Fatal(err)
		}
		if src.Range(0).To == 13 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("range %+v, want 13 offsets", src.Range(0))
		case <-time.After(50 * time.Millisecond):
		}
	}
	var got []string
	dec, _ := codec.NewDecoder("", codec.Limits{})
	err := src.Read(ctx, 0, nil, func(r *replay.Record) error {
		var tx codec.Transaction
		if rej := dec.Decode(r.Value, 0, false, &tx); rej != nil {
			t.Fatalf("offset %d: %v", r.Offset, rej)
		}
		got = append(got, tx.EventID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("replayed %v, want the committed %v", got, want)
	}
}

// replayPipeline is the pipeline configuration of the live run above.
func replayPipeline(t *testing.T, specs []window.Spec, latenessMs int64) pipeline.Config {
	t.Helper()
	dec, err := codec.NewDecoder("", codec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return pipeline.Config{
		Specs:     specs,
		Window:    window.Options{MaxEntities: 5_000_000, HistoryTTLMs: (7 * 24 * time.Hour).Milliseconds()},
		Watermark: watermark.Config{AllowedLateness: latenessMs, DedupeHorizon: (24 * time.Hour).Milliseconds()},
		Decoder:   dec,
	}
}

// collectSink keeps features values by source position and counts dead letters.
type collectSink struct {
	features map[replayPos][]byte
	dead     int
}

func (c *collectSink) Write(o *pipeline.Output) error {
	if o.Dead {
		c.dead++
		return nil
	}
	c.features[replayPos{o.SourcePartition, o.SourceOffset}] = append([]byte(nil), o.Value...)
	return nil
}
func (c *collectSink) Commit(context.Context) error { return nil }
func (c *collectSink) Abort() error                 { return nil }
