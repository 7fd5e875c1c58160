//go:build integration

package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

const (
	paymentSchemaPath = "../internal/streamtest/" + streamtest.PaymentSchemaFile
	paymentGroupsPath = "../internal/streamtest/" + streamtest.PaymentGroupsFile
)

// groupOutputs is what one group's topic and the dead-letter topic hold, by source
// record: the features values, and the dead letters' reasons (with the group a
// second stage named).
type groupOutputs struct {
	features map[streamtest.Source][]byte
	rows     map[streamtest.Source]map[string]any
	copies   int // records read beyond the first of their source record
}

// TestRekeyedGroupsLiveAndReplay: a definition with an in-place group (card) and
// two re-keyed groups (device, ip) over a correlated, skewed stream of three input
// partitions. `replay` of the topic equals the independent reference for every
// group and every dead letter; two `run` instances publish, for every group, byte
// for byte what `replay` published to topics; every input record has exactly one
// row per group whose key it has, or one dead letter.
func TestRekeyedGroupsLiveAndReplay(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name  string
		extra []string
	}{{"default", nil}, {"exactly-once", []string{"--exactly-once"}}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testRekeyedGroups(t, mode.extra)
		})
	}
}

func testRekeyedGroups(t *testing.T, runExtra []string) {
	streamtest.RequireReference(t)
	addr := kafkatest.Broker(t)
	bin := replayBinary(t)
	def, err := definition.LoadFile(paymentGroupsPath)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := definition.EngineSpecs(def)
	if err != nil {
		t.Fatal(err)
	}
	wantDefinition := def.Version + "@" + def.Hash()
	schema, err := os.ReadFile(paymentSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	const lateness = 5 * time.Second
	seed := uint64(41)
	if len(runExtra) > 0 {
		seed = 42
	}
	stream := streamtest.PaymentStream(streamtest.PaymentStreamConfig{Seed: seed, N: 4500, Lateness: lateness})
	ctx := kafkatest.Context(t, 8*time.Minute)

	in := kafkatest.CreateTopic(t, addr, 3, nil)
	recs, err := streamtest.PaymentRecords(in, string(schema), stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := kafkatest.Produce(ctx, replayProducer(t, addr), recs...); err != nil {
		t.Fatal(err)
	}
	n := len(recs)

	// The reference, from the records as the broker holds them.
	dir := t.TempDir()
	byPart := readInputPartitions(t, ctx, addr, in, 3, n)
	ocfs := writePartitionOCFs(t, dir, string(schema), byPart, 3)
	ref := streamtest.RunGroupReference(t, featuresReference, paymentGroupsPath, ocfs, lateness, in)

	semantics := []string{"--features", paymentGroupsPath, "--allowed-lateness", lateness.String(), "--log-level", "warn"}

	// replay to files, held to the reference.
	outFile, dlqFile := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "dlq.jsonl")
	args := append([]string{"replay", "--brokers", addr, "--input-topic", in, "--output", outFile, "--dlq", dlqFile, "--quiet"}, semantics...)
	if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("replay to files: %v\n%s", err, out)
	}
	deadLines := streamtest.ReadJSONLines(t, dlqFile)
	var stage1Dead []map[string]any
	for _, l := range deadLines {
		if l["group"] == nil {
			stage1Dead = append(stage1Dead, l)
		} else {
			t.Errorf("a second stage dead-lettered %v without an idle marker: %s", l["group"], l["error"])
		}
	}
	ref.CompareDeadLetters(t, streamtest.DeadReasons(t, stage1Dead))
	for _, g := range specs {
		file := outFile
		if g.Name != ref.InPlace {
			file = strings.TrimSuffix(outFile, ".jsonl") + "." + g.Name + ".jsonl"
		}
		st := ref.CompareGroup(t, g.Name, streamtest.ReadJSONLines(t, file))
		t.Logf("replay group %s: %+v", g.Name, st)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Two live instances; then replay to topics; byte for byte per group.
	group := kafkatest.Group(t)
	liveOut, liveDLQ := "live-"+group, "live-dlq-"+group
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	var procs []*exec.Cmd
	for i := range 2 {
		args := append([]string{"run", "--brokers", addr, "--group", group, "--input-topic", in, "--output-topic", liveOut, "--dlq-topic", liveDLQ,
			"--checkpoint-store", "memory", "--checkpoint-interval", "1s", "--metrics-addr", "", "--idle-timeout", "3s"}, semantics...)
		args = append(args, runExtra...)
		procs = append(procs, startInstance(t, ctx, i, bin, args, nil, stopReading))
	}
	repOut, repDLQ := "rep-"+group, "rep-dlq-"+group
	args = append([]string{"replay", "--brokers", addr, "--input-topic", in, "--output", "topic:" + repOut, "--dlq", "topic:" + repDLQ, "--quiet"}, semantics...)
	if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("replay to topics: %v\n%s", err, out)
	}
	wantDead := ref.Dead
	deadN := 0
	for _, c := range wantDead {
		deadN += c
	}
	for _, g := range specs {
		c, err := goavro.NewCodec(feature.AvroSchema(g.Spec))
		if err != nil {
			t.Fatal(err)
		}
		suffix := ""
		if g.Name != ref.InPlace {
			suffix = "." + g.Name
		}
		rows := len(ref.Rows[g.Name])
		rep := readGroupTopic(t, ctx, addr, repOut+suffix, rows, c, wantDefinition)
		live := readGroupTopic(t, readCtx, addr, liveOut+suffix, rows, c, wantDefinition)
		mismatch := 0
		for pos, v := range rep.features {
			if !bytes.Equal(live.features[pos], v) {
				if mismatch++; mismatch <= 5 {
					t.Errorf("group %s %v: live and replay differ:\n live %v\n rep  %v", g.Name, pos, live.rows[pos], rep.rows[pos])
				}
			}
		}
		if mismatch > 0 || len(live.features) != len(rep.features) {
			t.Fatalf("group %s: live %d rows, replay %d, %d differ", g.Name, len(live.features), len(rep.features), mismatch)
		}
		if exactlyOnce := len(runExtra) > 0; exactlyOnce && live.copies > 0 {
			t.Fatalf("group %s: %d rows published more than once under --exactly-once", g.Name, live.copies)
		}
		t.Logf("group %s: %d rows, live = replay byte for byte", g.Name, rows)
	}
	// The repartition topics were created with the brokers' append time, the
	// clock their second stages measure idle leases on (docs/repartition.md).
	adm := kafkatest.Admin(t, addr)
	for _, g := range specs {
		if g.Name == ref.InPlace {
			continue
		}
		topic := sink.RepartitionTopicPrefix + group + "-" + g.Name
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rcs.On(topic, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, c := range rc.Configs {
			if c.Key == "message.timestamp.type" && c.Value != nil {
				got = *c.Value
			}
		}
		if got != "LogAppendTime" {
			t.Errorf("%s: message.timestamp.type %q, want LogAppendTime", topic, got)
		}
	}
	liveDead := readDeadTopic(t, readCtx, addr, liveDLQ, deadN, wantDefinition)
	repDead := readDeadTopic(t, ctx, addr, repDLQ, deadN, wantDefinition)
	if !mapsEqual(liveDead, repDead) {
		t.Fatalf("dead letters: live %d, replay %d, not the same", len(liveDead), len(repDead))
	}
	for _, p := range procs {
		_ = p.Process.Signal(os.Interrupt)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// readGroupTopic reads n features records of a group's topic (failing on a second,
// different copy of one), keyed by the source record its row names.
func readGroupTopic(t *testing.T, ctx context.Context, addr, topic string, n int, c *goavro.Codec, wantDefinition string) groupOutputs {
	t.Helper()
	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	out := groupOutputs{features: map[streamtest.Source][]byte{}, rows: map[streamtest.Source]map[string]any{}}
	for len(out.features) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("%s: read %d of %d features records before the deadline: %v", topic, len(out.features), n, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if h := headerValue(r, sink.HeaderDefinition); h != wantDefinition {
				t.Fatalf("%s record at %d: velocity.definition %q, want %q", topic, r.Offset, h, wantDefinition)
			}
			nat, rest, err := c.NativeFromBinary(r.Value)
			if err != nil || len(rest) != 0 {
				t.Fatalf("%s record at %d does not read as the group's schema: %v", topic, r.Offset, err)
			}
			row := streamtest.FlatNative(nat.(map[string]any))
			pos := streamtest.Source{Partition: int32(row["source_partition"].(int64)), Offset: row["source_offset"].(int64)}
			if prev, dup := out.features[pos]; dup {
				out.copies++
				if !bytes.Equal(prev, r.Value) {
					t.Errorf("%s: %v published twice with different values", topic, pos)
				}
			}
			if string(r.Key) != row["entity_id"] {
				t.Errorf("%s %v: key %q, want the group's key %q", topic, pos, r.Key, row["entity_id"])
			}
			out.features[pos], out.rows[pos] = r.Value, row
		})
	}
	return out
}

// readDeadTopic reads n dead letters: reason (and group, for a second stage's) by
// source record.
func readDeadTopic(t *testing.T, ctx context.Context, addr, topic string, n int, wantDefinition string) map[streamtest.Source]string {
	t.Helper()
	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	out := map[streamtest.Source]string{}
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("%s: read %d of %d dead letters before the deadline: %v", topic, len(out), n, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if h := headerValue(r, sink.HeaderDefinition); h != wantDefinition {
				t.Fatalf("%s record at %d: velocity.definition %q, want %q", topic, r.Offset, h, wantDefinition)
			}
			var pos streamtest.Source
			fmt.Sscan(headerValue(r, codec.HeaderSourcePartition), &pos.Partition)
			fmt.Sscan(headerValue(r, codec.HeaderSourceOffset), &pos.Offset)
			v := headerValue(r, codec.HeaderReason)
			if g := headerValue(r, sink.HeaderGroup); g != "" {
				v += "@" + g
			}
			out[pos] = v
		})
	}
	return out
}

func headerValue(r *kgo.Record, key string) string {
	i := slices.IndexFunc(r.Headers, func(h kgo.RecordHeader) bool { return h.Key == key })
	if i < 0 {
		return ""
	}
	return string(r.Headers[i].Value)
}
