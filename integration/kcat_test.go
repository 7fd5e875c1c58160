//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// kcatPath returns kcat's path, skipping t when it is missing (failing it under
// VELOCITY_REQUIRE_KAFKA=1, where .ci/run has installed it).
func kcatPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("VELOCITY_REQUIRE_KAFKA") == "1" {
			t.Fatal("kcat not on PATH (apt-get install kcat); required with VELOCITY_REQUIRE_KAFKA=1")
		}
		t.Skip("skipping: kcat not on PATH (apt-get install kcat)")
	}
	return p
}

// kcatMessage is one line of `kcat -C -J`.
type kcatMessage struct {
	Topic     string   `json:"topic"`
	Partition int32    `json:"partition"`
	Offset    int64    `json:"offset"`
	Key       *string  `json:"key"`
	Payload   *string  `json:"payload"`
	Headers   []string `json:"headers"` // name, value, name, value, ...
}

// TestKcatReadsOurRecords checks interoperability with an independent client
// (librdkafka's kcat): records produced here, headers included, read back unchanged.
func TestKcatReadsOurRecords(t *testing.T) {
	t.Parallel()
	kcat := kcatPath(t)
	addr := kafkatest.Broker(t)
	topic := kafkatest.CreateTopic(t, addr, 2, nil)
	ctx := kafkatest.Context(t, 60*time.Second)

	prod := kafkatest.Client(t, addr, kgo.DefaultProduceTopic(topic))
	type rec struct {
		key, value string
		headers    []string
	}
	want := map[string]rec{}
	var recs []*kgo.Record
	for i := range 6 {
		r := rec{
			key:   fmt.Sprintf("entity-%d", i),
			value: fmt.Sprintf(`{"event_id":"e%d","amount_minor":%d}`, i, 100*i),
			headers: []string{
				"velocity.reason", "duplicate",
				"velocity.source.offset", fmt.Sprint(i),
				"velocity.error", "ünïcode ✓",
			},
		}
		want[r.key] = r
		kr := kgo.KeyStringRecord(r.key, r.value)
		for h := 0; h < len(r.headers); h += 2 {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: r.headers[h], Value: []byte(r.headers[h+1])})
		}
		recs = append(recs, kr)
	}
	if err := kafkatest.Produce(ctx, prod, recs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}

	out := kcatRead(ctx, t, kcat, addr, topic)
	got := 0
	for _, m := range out {
		if m.Key == nil || m.Payload == nil {
			t.Errorf("kcat: record at %s[%d]@%d has a null key or value", m.Topic, m.Partition, m.Offset)
			continue
		}
		w, ok := want[*m.Key]
		switch {
		case !ok:
			t.Errorf("kcat: unexpected key %q", *m.Key)
		case *m.Payload != w.value:
			t.Errorf("kcat: key %s value %q, want %q", *m.Key, *m.Payload, w.value)
		case !slices.Equal(m.Headers, w.headers):
			t.Errorf("kcat: key %s headers %q, want %q", *m.Key, m.Headers, w.headers)
		}
		got++
	}
	if got != len(want) {
		t.Errorf("kcat read %d records, want %d: %+v", got, len(want), out)
	}
}

// TestKcatReadsOurLZ4Frames: batches compressed by the producers' own LZ4 codec
// (sink.Compression: frames of independent 64 KiB blocks, written by our block
// compressor) are read back whole by librdkafka, an LZ4 decoder independent of ours
// and of franz-go's; the broker, which decompresses every batch to validate it,
// accepted them first. One batch of about 600 KB, ten 64 KiB blocks, holds stretches
// of compressible rows and of random hex, which compresses little.
func TestKcatReadsOurLZ4Frames(t *testing.T) {
	t.Parallel()
	kcat := kcatPath(t)
	addr := kafkatest.Broker(t)
	topic := kafkatest.CreateTopic(t, addr, 1, nil)
	ctx := kafkatest.Context(t, 90*time.Second)

	lz4, err := sink.Compression("lz4")
	if err != nil {
		t.Fatal(err)
	}
	prod := kafkatest.Client(t, addr, kgo.DefaultProduceTopic(topic), lz4,
		kgo.ProducerLinger(time.Second), kgo.ProducerBatchMaxBytes(4<<20), kgo.MaxBufferedRecords(10_000))
	rng := rand.New(rand.NewPCG(7, 8))
	want := map[string]string{}
	var recs []*kgo.Record
	for i := range 3000 {
		key := fmt.Sprintf("card-%05d", i)
		value := fmt.Sprintf(`{"entity_id":"card-%05d","windows":{"1m":{"count":%d},"1h":{"count":%d}},"source":"transactions"}`, i%97, i%13, i%61)
		if i/500%2 == 1 { // 500 rows in a row of random hex: a block with nothing to find
			var b strings.Builder
			for range 8 {
				fmt.Fprintf(&b, "%016x", rng.Uint64())
			}
			value = b.String()
		}
		want[key] = value
		recs = append(recs, kgo.KeyStringRecord(key, value))
	}
	if err := kafkatest.Produce(ctx, prod, recs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}

	// The records were compressed: franz-go reports each one's batch codec.
	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for n := 0; n < len(recs); {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d records before the deadline: %v", n, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if c := r.Attrs.CompressionType(); c != 3 {
				t.Fatalf("record %s: compression type %d, want 3 (lz4)", r.Key, c)
			}
			n++
		})
	}

	out := kcatRead(ctx, t, kcat, addr, topic)
	for _, m := range out {
		if m.Key == nil || m.Payload == nil || want[*m.Key] != *m.Payload {
			t.Fatalf("kcat: record at offset %d is %+v, want one of ours", m.Offset, m)
		}
	}
	if len(out) != len(want) {
		t.Errorf("kcat read %d records, want %d", len(out), len(want))
	}
}

// kcatRead reads topic from the beginning to its end with kcat, one message per
// line of `kcat -C -J`.
func kcatRead(ctx context.Context, t *testing.T, kcat, addr, topic string) []kcatMessage {
	t.Helper()
	cmd := exec.CommandContext(ctx, kcat, "-C", "-b", addr, "-t", topic, "-o", "beginning", "-e", "-J", "-q",
		"-X", "socket.timeout.ms=10000")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat -C %s: %v\n%s", topic, err, stderr.String())
	}
	var ms []kcatMessage
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m kcatMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("kcat printed %q: %v", sc.Text(), err)
		}
		ms = append(ms, m)
	}
	return ms
}

// TestWeReadKcatRecords is the other direction: kcat produces with headers, franz-go reads.
func TestWeReadKcatRecords(t *testing.T) {
	t.Parallel()
	kcat := kcatPath(t)
	addr := kafkatest.Broker(t)
	topic := kafkatest.CreateTopic(t, addr, 1, nil)
	ctx := kafkatest.Context(t, 60*time.Second)

	cmd := exec.CommandContext(ctx, kcat, "-P", "-b", addr, "-t", topic, "-K", ":",
		"-H", "velocity.reason=late", "-H", "trace=abc")
	cmd.Stdin = bytes.NewBufferString("k1:v1\nk2:v2\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kcat -P %s: %v\n%s", topic, err, out)
	}

	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	for len(got) < 2 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %v before the deadline: %v", got, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			var hs []string
			for _, h := range r.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			got = append(got, fmt.Sprintf("%s:%s %v", r.Key, r.Value, hs))
		})
	}
	want := []string{"k1:v1 [velocity.reason=late trace=abc]", "k2:v2 [velocity.reason=late trace=abc]"}
	if !slices.Equal(got, want) {
		t.Errorf("read %q, want %q", got, want)
	}
}
