//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/srtest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

const (
	cardSchemaPath     = "../examples/features/card_transaction.avsc"
	cardDefinitionPath = "../cmd/velocity-consumer/testdata/card_features_tenths.yaml"
	featuresReference  = "reference/features_reference.py"
)

// TestFeatureDefinitionLiveOnTheBroker runs two instances of the built binary
// under a feature definition over a topic of records in the user's own schema
// (nested records, a decimal amount, micros, an enum), and holds what they
// publish to two independent statements of right: `replay` of the same topic
// (byte for byte per source offset) and the Python reference computed from the
// partition's records as the broker holds them (field by field). Every output
// carries the definition in its velocity.definition header.
func TestFeatureDefinitionLiveOnTheBroker(t *testing.T) {
	t.Parallel()
	streamtest.RequireReference(t)
	addr := kafkatest.Broker(t)
	bin := replayBinary(t)
	schema, def, spec := loadCardDefinition(t)
	outCodec, err := goavro.NewCodec(feature.AvroSchema(spec))
	if err != nil {
		t.Fatal(err)
	}
	wantDefinition := def.Version + "@" + def.Hash()

	const partitions = 3
	in := kafkatest.CreateTopic(t, addr, partitions, nil)
	liveOut, liveDLQ := kafkatest.CreateTopic(t, addr, 1, nil), kafkatest.CreateTopic(t, addr, 1, nil)
	repOut, repDLQ := kafkatest.CreateTopic(t, addr, 1, nil), kafkatest.CreateTopic(t, addr, 1, nil)
	ctx := kafkatest.Context(t, 5*time.Minute)
	group := kafkatest.Group(t)

	// Lateness 0 and no idle release: each event is released when it arrives,
	// so the live run decides exactly as the replay and the reference do.
	semantics := []string{"--features", cardDefinitionPath, "--allowed-lateness", "0s", "--log-level", "warn"}
	// An instance that exits before the outputs are read fails the test at once,
	// with its log, instead of at the read deadline.
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	var procs []*exec.Cmd
	for i := range 2 {
		args := append([]string{"run", "--brokers", addr, "--group", group, "--input-topic", in, "--output-topic", liveOut, "--dlq-topic", liveDLQ,
			"--checkpoint-store", "memory", "--checkpoint-interval", "1s", "--metrics-addr", ""}, semantics...)
		procs = append(procs, startInstance(t, ctx, i, bin, args, []string{"VELOCITY_IDLE_TIMEOUT=0s"}, stopReading))
	}

	recs := streamtest.CardStream(streamtest.CardStreamConfig{Seed: 23, N: 5000, Cards: 60, HotShare: 0.1, Merchants: 50, HotDistinct: 300, Lateness: time.Second})
	values, err := streamtest.EncodeCards(string(schema), recs)
	if err != nil {
		t.Fatal(err)
	}
	prod := replayProducer(t, addr)
	var batch []*kgo.Record
	for i, v := range values {
		card := recs[i]["card"].(map[string]any)["id"].(string)
		batch = append(batch, &kgo.Record{Topic: in, Key: []byte(card), Value: v})
	}
	if err := kafkatest.Produce(ctx, prod, batch...); err != nil {
		t.Fatal(err)
	}
	n := len(values)

	live := readFlatOutputs(t, readCtx, addr, liveOut, liveDLQ, n, outCodec, wantDefinition)
	for _, p := range procs {
		_ = p.Process.Signal(os.Interrupt)
	}

	args := append([]string{"replay", "--brokers", addr, "--input-topic", in, "--output", "topic:" + repOut, "--dlq", "topic:" + repDLQ, "--quiet"}, semantics...)
	if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	rep := readFlatOutputs(t, ctx, addr, repOut, repDLQ, n, outCodec, wantDefinition)
	mismatch := 0
	for pos, v := range live.features {
		if string(rep.features[pos]) != string(v) {
			if mismatch++; mismatch <= 5 {
				t.Errorf("%v: live and replay features differ", pos)
			}
		}
	}
	for pos, r := range live.dead {
		if rep.dead[pos] != r {
			if mismatch++; mismatch <= 10 {
				t.Errorf("%v: live dead letter %q, replay %q", pos, r, rep.dead[pos])
			}
		}
	}
	if len(rep.features) != len(live.features) || len(rep.dead) != len(live.dead) || mismatch > 0 {
		t.Fatalf("live %d features + %d dead, replay %d + %d, %d differ", len(live.features), len(live.dead), len(rep.features), len(rep.dead), mismatch)
	}

	// The reference, per partition, from the records as the broker holds them.
	dir := t.TempDir()
	byPart := readInputPartitions(t, ctx, addr, in, partitions, n)
	files := writePartitionOCFs(t, dir, string(schema), byPart, partitions)
	exact, estimates := 0, 0
	for p := int32(0); p < partitions; p++ {
		ref := streamtest.RunReference(t, featuresReference, cardDefinitionPath, files[p], 0, in, p)
		for off, want := range ref {
			pos := replayPos{p, off}
			if want.Dead != "" {
				if live.dead[pos] != want.Dead {
					t.Errorf("%v: want a %s dead letter, live %q / features %v", pos, want.Dead, live.dead[pos], live.rows[pos] != nil)
				}
				continue
			}
			got := live.rows[pos]
			if got == nil {
				t.Errorf("%v: want features, live dead letter %q", pos, live.dead[pos])
				continue
			}
			w := maps.Clone(want.Features)
			for name, maxExact := range cardDistinct {
				if got[name+"_exact"] == true {
					exact++
				} else {
					estimates++
					if !want.Over[name] {
						t.Errorf("%v: %s is an estimate, but the entity never held more than max_exact values", pos, name)
					}
					acceptEstimates(t, pos, name, maxExact, got, w)
				}
				w[name+"_exact"] = got[name+"_exact"]
			}
			if !reflect.DeepEqual(got, w) {
				t.Errorf("%v:\n got %v\nwant %v", pos, got, w)
			}
		}
	}
	t.Logf("%d offsets on %d partitions: %d features (live = replay byte for byte; %d exact distinct counts, %d estimates), %d dead letters",
		n, partitions, len(live.features), exact, estimates, len(live.dead))
}

// loadCardDefinition reads the test definition and the schema it maps.
func loadCardDefinition(t *testing.T) ([]byte, *definition.Definition, *feature.Spec) {
	t.Helper()
	schema, err := os.ReadFile(cardSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	def, err := definition.LoadFile(cardDefinitionPath)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := definition.EngineSpec(def)
	if err != nil {
		t.Fatal(err)
	}
	return schema, def, spec
}

// cardDistinct are the test definition's distinct counts and their max_exact.
var cardDistinct = map[string]int{"distinct_merchants": 64, "distinct_mcc": 16}

// acceptEstimates checks an estimated distinct count's windows against the
// exact counts in want and, when they are within the published error, puts the
// estimates into want so that the rest of the record compares exactly.
func acceptEstimates(t *testing.T, pos replayPos, name string, maxExact int, got, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if strings.HasPrefix(k, name+"_") && k != name+"_exact" {
			if !streamtest.DistinctEstimateOK(got[k].(int64), v.(int64), maxExact) {
				t.Errorf("%v: estimate %s = %v, exact %v: beyond the error bound", pos, k, got[k], v)
			}
			want[k] = got[k]
		}
	}
}

type flatOutputs struct {
	features map[replayPos][]byte
	rows     map[replayPos]map[string]any
	dead     map[replayPos]string
}

// readFlatOutputs reads a definition's features and dead letters until every
// one of n input offsets has its output. A repeated output for an offset (a
// rebalance in the default mode publishes again what was not committed) must
// be byte-identical to the first.
func readFlatOutputs(t *testing.T, ctx context.Context, addr, featuresTopic, dlqTopic string, n int, c *goavro.Codec, wantDefinition string) flatOutputs {
	t.Helper()
	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(featuresTopic, dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	out := flatOutputs{features: map[replayPos][]byte{}, rows: map[replayPos]map[string]any{}, dead: map[replayPos]string{}}
	for len(out.features)+len(out.dead) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d features + %d dead letters of %d before the deadline: %v", len(out.features), len(out.dead), n, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, hd := range r.Headers {
				h[hd.Key] = string(hd.Value)
			}
			if h[sink.HeaderDefinition] != wantDefinition {
				t.Fatalf("%s record at %d: velocity.definition %q, want %q", r.Topic, r.Offset, h[sink.HeaderDefinition], wantDefinition)
			}
			if r.Topic == dlqTopic {
				var p int32
				var o int64
				fmt.Sscan(h[codec.HeaderSourcePartition], &p)
				fmt.Sscan(h[codec.HeaderSourceOffset], &o)
				out.dead[replayPos{p, o}] = h[codec.HeaderReason]
				return
			}
			nat, rest, err := c.NativeFromBinary(r.Value)
			if err != nil || len(rest) != 0 {
				t.Fatalf("features record at %d does not read as the generated schema: %v", r.Offset, err)
			}
			row := streamtest.FlatNative(nat.(map[string]any))
			pos := replayPos{int32(row["source_partition"].(int64)), row["source_offset"].(int64)}
			if prev, dup := out.features[pos]; dup && string(prev) != string(r.Value) {
				t.Errorf("%v published twice with different values", pos)
			}
			if string(r.Key) != row["entity_id"] {
				t.Errorf("%v: key %q, want the entity %q", pos, r.Key, row["entity_id"])
			}
			out.features[pos], out.rows[pos] = r.Value, row
		})
	}
	return out
}

// startInstance starts the built binary with args (env on top of the test's),
// calls exited when it ends, and at cleanup kills it and, if the test failed, logs
// what it printed.
func startInstance(t *testing.T, ctx context.Context, i int, bin string, args, env []string, exited func()) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	logs := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- cmd.Wait()
		exited()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		err := <-done
		if t.Failed() {
			t.Logf("instance %d (%v):\n%s", i, err, logs.String())
		}
	})
	return cmd
}

// writePartitionOCFs writes each input partition's values, as the broker holds
// them, to an Avro container file of schema (dir/p<N>.avro), for the reference.
func writePartitionOCFs(t *testing.T, dir, schema string, byPart map[int32][][]byte, partitions int32) []string {
	t.Helper()
	c, err := goavro.NewCodec(schema)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for p := range partitions {
		var natives []map[string]any
		for _, v := range byPart[p] {
			nat, _, err := c.NativeFromBinary(v)
			if err != nil {
				t.Fatal(err)
			}
			natives = append(natives, nat.(map[string]any))
		}
		file := filepath.Join(dir, fmt.Sprintf("p%d.avro", p))
		f, err := os.Create(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := streamtest.WriteCardOCF(f, schema, natives); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		files = append(files, file)
	}
	return files
}

// readInputPartitions returns each partition's record values in offset order.
func readInputPartitions(t *testing.T, ctx context.Context, addr, topic string, partitions int32, n int) map[int32][][]byte {
	t.Helper()
	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	out := map[int32][][]byte{}
	for got := 0; got < n; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d input records: %v", got, n, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if int64(len(out[r.Partition])) != r.Offset {
				t.Fatalf("partition %d: offset %d after %d records", r.Partition, r.Offset, len(out[r.Partition]))
			}
			out[r.Partition] = append(out[r.Partition], r.Value)
			got++
		})
	}
	return out
}

// TestFeatureDefinitionWithRegistry replays a topic in the Confluent wire format
// under a definition: each record's writer schema comes from the registry and is
// compiled by the definition's mapping, and the features go out under the
// schema generated from the definition, registered under the output subject.
// What it publishes equals the independent reference.
func TestFeatureDefinitionWithRegistry(t *testing.T) {
	t.Parallel()
	streamtest.RequireReference(t)
	addr := kafkatest.Broker(t)
	bin := replayBinary(t)
	reg := srtest.Start(t)
	schema, def, spec := loadCardDefinition(t)
	ctx := kafkatest.Context(t, 3*time.Minute)
	rcl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	in := kafkatest.CreateTopic(t, addr, 1, nil)
	ss, err := rcl.CreateSchema(ctx, in+"-value", sr.Schema{Schema: string(schema), Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	recs := streamtest.CardStream(streamtest.CardStreamConfig{Seed: 31, N: 1500, Cards: 30, HotShare: 0.1, Merchants: 40, HotDistinct: 200, Lateness: time.Second})
	values, err := streamtest.EncodeCards(string(schema), recs)
	if err != nil {
		t.Fatal(err)
	}
	var batch []*kgo.Record
	for _, v := range values {
		wire := append([]byte{0, 0, 0, 0, 0}, v...)
		binary.BigEndian.PutUint32(wire[1:], uint32(ss.ID))
		batch = append(batch, &kgo.Record{Topic: in, Value: wire})
	}
	if err := kafkatest.Produce(ctx, replayProducer(t, addr), batch...); err != nil {
		t.Fatal(err)
	}
	out, dlq := kafkatest.CreateTopic(t, addr, 1, nil), kafkatest.CreateTopic(t, addr, 1, nil)
	// The definition without its input.schema: with a registry, the schema of
	// each record is the registry's, and none is needed at start.
	text, err := os.ReadFile(cardDefinitionPath)
	if err != nil {
		t.Fatal(err)
	}
	noSchema := strings.Replace(string(text), "  schema: ../../../examples/features/card_transaction.avsc\n", "", 1)
	if noSchema == string(text) {
		t.Fatal("the test definition no longer names its schema as expected")
	}
	defPath := filepath.Join(t.TempDir(), "card_features.yaml")
	if err := os.WriteFile(defPath, []byte(noSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"replay", "--brokers", addr, "--input-topic", in, "--output", "topic:" + out, "--dlq", "topic:" + dlq,
		"--schema-registry", reg.URL(), "--features", defPath, "--allowed-lateness", "0s", "--quiet", "--log-level", "warn"}
	if o, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("replay: %v\n%s", err, o)
	}

	registered, err := rcl.SchemaByVersion(ctx, out+"-value", -1)
	if err != nil {
		t.Fatalf("the output subject %s-value: %v", out, err)
	}
	gen := feature.AvroSchema(spec)
	outCodec, err := goavro.NewCodec(gen)
	if err != nil {
		t.Fatal(err)
	}
	regCodec, err := goavro.NewCodec(registered.Schema.Schema)
	if err != nil || regCodec.CanonicalSchema() != outCodec.CanonicalSchema() {
		t.Fatalf("registered output schema differs from the definition's generated one (%v):\n%s", err, registered.Schema.Schema)
	}
	// Read the outputs: features values carry the generated schema's id.
	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(out, dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	rows, dead := map[int64]map[string]any{}, map[int64]string{}
	for len(rows)+len(dead) < len(values) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d features + %d dead letters of %d", len(rows), len(dead), len(values))
		}
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, hd := range r.Headers {
				h[hd.Key] = string(hd.Value)
			}
			if want := def.Version + "@" + def.Hash(); h[sink.HeaderDefinition] != want {
				t.Fatalf("%s record at %d: velocity.definition %q, want %q", r.Topic, r.Offset, h[sink.HeaderDefinition], want)
			}
			if r.Topic == dlq {
				var o int64
				fmt.Sscan(h[codec.HeaderSourceOffset], &o)
				dead[o] = h[codec.HeaderReason]
				return
			}
			if len(r.Value) < 5 || r.Value[0] != 0 || int(binary.BigEndian.Uint32(r.Value[1:5])) != registered.ID {
				t.Fatalf("features value at %d does not start with the wire prefix of schema id %d: % x", r.Offset, registered.ID, r.Value[:min(5, len(r.Value))])
			}
			nat, rest, err := outCodec.NativeFromBinary(r.Value[5:])
			if err != nil || len(rest) != 0 {
				t.Fatalf("features value at %d: %v", r.Offset, err)
			}
			row := streamtest.FlatNative(nat.(map[string]any))
			rows[row["source_offset"].(int64)] = row
		})
	}
	file := filepath.Join(t.TempDir(), "in.avro")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := streamtest.WriteCardOCF(f, string(schema), recs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	bad := 0
	for off, want := range streamtest.RunReference(t, featuresReference, cardDefinitionPath, file, 0, in, 0) {
		switch got := rows[off]; {
		case want.Dead != "":
			if dead[off] != want.Dead {
				bad++
				t.Errorf("offset %d: want a %s dead letter, got %q", off, want.Dead, dead[off])
			}
		case got == nil:
			bad++
			t.Errorf("offset %d: no features (dead letter %q)", off, dead[off])
		default:
			w := maps.Clone(want.Features)
			for name, maxExact := range cardDistinct {
				if got[name+"_exact"] != true {
					acceptEstimates(t, replayPos{0, off}, name, maxExact, got, w)
				}
				w[name+"_exact"] = got[name+"_exact"]
			}
			if !reflect.DeepEqual(got, w) {
				bad++
				t.Errorf("offset %d:\n got %v\nwant %v", off, got, w)
			}
		}
		if bad > 10 {
			t.Fatal("too many mismatches")
		}
	}
	t.Logf("%d wire-format records: %d features under registered schema id %d, %d dead letters; all equal the reference", len(values), len(rows), registered.ID, len(dead))
}
