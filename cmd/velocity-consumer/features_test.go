package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

const (
	cardSchemaFile     = "../../examples/features/card_transaction.avsc"
	cardDefinitionFile = "testdata/card_features_tenths.yaml"
	referenceScript    = "../../integration/reference/features_reference.py"
)

func readJSONObjects(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		streamtest.IntNumbers(m)
		out = append(out, m)
	}
	return out
}

// compareWithReference holds features and dead letters (keyed by source
// offset) to the reference, offset by offset: every offset is exactly one of
// them, with the reference's reason or fields. A distinct count the service
// reports as an estimate (<feature>_exact false) is only allowed where the
// reference says the entity held more distinct values than max_exact, and is
// then checked against the published error bound instead of equality.
func compareWithReference(t *testing.T, ref map[int64]streamtest.ReferenceLine, features, dead map[int64]map[string]any, distinct map[string]int) (exact, estimates int) {
	t.Helper()
	if len(features)+len(dead) != len(ref) {
		t.Errorf("%d features + %d dead letters for %d input offsets", len(features), len(dead), len(ref))
	}
	bad := 0
	for off, want := range ref {
		f, d := features[off], dead[off]
		switch {
		case want.Dead != "":
			if d == nil || d["reason"] != want.Dead {
				t.Errorf("offset %d: want a %s dead letter, got dead %v features %v", off, want.Dead, d, f)
				bad++
			}
			continue
		case f == nil:
			t.Errorf("offset %d: want features %v, got dead letter %v", off, want.Features, d)
			bad++
			continue
		}
		w := maps(want.Features)
		for name, maxExact := range distinct {
			ex, _ := f[name+"_exact"].(bool)
			w[name+"_exact"] = ex
			if ex {
				exact++
				continue
			}
			estimates++
			if !want.Over[name] {
				t.Errorf("offset %d: %s reported as an estimate, but the entity never held more than max_exact values", off, name)
				bad++
			}
			for k, v := range w {
				if strings.HasPrefix(k, name+"_") && k != name+"_exact" {
					if !streamtest.DistinctEstimateOK(f[k].(int64), v.(int64), maxExact) {
						t.Errorf("offset %d: estimate %s = %d, exact %d: beyond the error bound", off, k, f[k], v)
						bad++
					}
					w[k] = f[k]
				}
			}
		}
		if !reflect.DeepEqual(f, w) {
			t.Errorf("offset %d:\n got %v\nwant %v", off, f, w)
			bad++
		}
		if bad > 10 {
			t.Fatal("too many mismatches")
		}
	}
	return exact, estimates
}

func maps(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestFeatureDefinitionReplayEqualsReference replays a seeded adversarial card
// stream (nested records, a decimal amount, micros, a null merchant, duplicates,
// late and invalid records, a hot card beyond the exact distinct bound) through
// a definition with filters and distinct counts, and holds every output to the
// independent reference (integration/reference/features_reference.py): the
// JSON-lines output field by field, the dead letters by reason. The Parquet
// output must say what the JSON lines say.
func TestFeatureDefinitionReplayEqualsReference(t *testing.T) {
	streamtest.RequireReference(t)
	schema, err := os.ReadFile(cardSchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	input := filepath.Join(dir, "cards.avro")
	const lateness = 5 * time.Second
	recs := streamtest.CardStream(streamtest.CardStreamConfig{Seed: 11, N: 4000, Cards: 60, HotShare: 0.08, Merchants: 50, HotDistinct: 400, Lateness: lateness})
	f, err := os.Create(input)
	if err != nil {
		t.Fatal(err)
	}
	if err := streamtest.WriteCardOCF(f, string(schema), recs); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	out, dlq := filepath.Join(dir, "f.jsonl"), filepath.Join(dir, "d.jsonl")
	err = cmdReplay(context.Background(), []string{"--input-file", input, "--features", cardDefinitionFile,
		"--output", out, "--dlq", dlq, "--allowed-lateness", lateness.String(), "--quiet", "--log-level", "error"})
	if err != nil {
		t.Fatal(err)
	}
	ref := streamtest.RunReference(t, referenceScript, cardDefinitionFile, input, lateness, filepath.Base(input), 0) // a file source names itself
	features, dead := map[int64]map[string]any{}, map[int64]map[string]any{}
	for _, m := range readJSONObjects(t, out) {
		features[m["source_offset"].(int64)] = m
	}
	for _, m := range readJSONObjects(t, dlq) {
		dead[m["source_offset"].(int64)] = m
	}
	exact, estimates := compareWithReference(t, ref, features, dead, map[string]int{"distinct_merchants": 64, "distinct_mcc": 16})
	reasons := map[string]int{}
	for _, d := range dead {
		reasons[d["reason"].(string)]++
	}
	t.Logf("%d features (%d exact distinct counts, %d estimates), dead letters %v", len(features), exact, estimates, reasons)
	for _, r := range []string{"duplicate", "late", "invalid:amount", "invalid:txn_id", "invalid:card.id", "invalid:ts"} {
		if reasons[r] == 0 {
			t.Errorf("the stream produced no %s dead letter: it does not exercise that path", r)
		}
	}
	if estimates == 0 || exact == 0 {
		t.Errorf("%d exact distinct counts and %d estimates: the stream must exercise both", exact, estimates)
	}
}

// TestFeaturesWithWriterSchemaFlag: a definition without input.schema reads the
// schema --writer-schema names (not our Transaction), and the decoder it gives
// reads a record of that schema into the mapped transaction.
func TestFeaturesWithWriterSchemaFlag(t *testing.T) {
	dir := t.TempDir()
	def, err := os.ReadFile(cardDefinitionFile)
	if err != nil {
		t.Fatal(err)
	}
	noSchema := strings.Replace(string(def), "  schema: ../../../examples/features/card_transaction.avsc\n", "", 1)
	if noSchema == string(def) {
		t.Fatal("the test definition no longer names its schema as expected")
	}
	path := filepath.Join(dir, "def.yaml")
	if err := os.WriteFile(path, []byte(noSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	var p pipelineFlags
	e := newEnvFlags("replay", "")
	p.register(e)
	if err := e.Parse([]string{"--features", path, "--writer-schema", cardSchemaFile}); err != nil {
		t.Fatal(err)
	}
	st, err := p.settings()
	if err != nil {
		t.Fatalf("settings: %v", err)
	}
	dec, err := st.decoder(st.writerSchema)
	if err != nil {
		t.Fatalf("decoder: %v", err)
	}
	schema, _ := os.ReadFile(cardSchemaFile)
	recs := streamtest.CardStream(streamtest.CardStreamConfig{Seed: 3, N: 50, Cards: 5, Merchants: 5, HotDistinct: 5, Lateness: time.Second})
	vals, err := streamtest.EncodeCards(string(schema), recs)
	if err != nil {
		t.Fatal(err)
	}
	decoded := 0
	for i, v := range vals {
		var tx codec.Transaction
		if rej := dec.Decode(v, 0, false, &tx); rej == nil {
			decoded++
			if want := recs[i]["card"].(map[string]any)["id"]; tx.EntityID != want {
				t.Fatalf("record %d: entity %q, want %q", i, tx.EntityID, want)
			}
		}
	}
	if decoded < 30 {
		t.Fatalf("decoded %d of %d records", decoded, len(vals))
	}
	// Without the flag the same definition falls back to our Transaction schema,
	// which has no card.id: refused at start by whoever compiles it.
	var q pipelineFlags
	e = newEnvFlags("replay", "")
	q.register(e)
	if err := e.Parse([]string{"--features", path}); err != nil {
		t.Fatal(err)
	}
	st, err = q.settings()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.decoder(st.writerSchema); err == nil || !strings.Contains(err.Error(), "io.velocity.v1.Transaction has no field") {
		t.Fatalf("decoder over our Transaction schema: %v, want an error naming the missing field", err)
	}
}

// TestRekeyedGroupFlags: a definition with re-keyed groups gives the input's
// service its hops and one second-stage service per group, named from the consumer
// group and --group-topic; the settings groups cannot work with are refused with
// the reason.
func TestRekeyedGroupFlags(t *testing.T) {
	const def = "../../examples/features/payment_groups.yaml"
	base := []string{"--features", def, "--checkpoint-store", "memory"}
	for _, tc := range []struct {
		name string
		args []string
		want string // substring of the error
	}{
		{"late apply", []string{"--late", "apply"}, "--late=apply cannot be used with re-keyed groups"},
		{"no idle timeout", []string{"--idle-timeout", "0s"}, "--idle-timeout 0 cannot be used with re-keyed groups"},
		{"template without the group", []string{"--group-topic", "per-group"}, "must contain {group}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseRun(t, nil, append(slices.Clone(base), tc.args...)...)
			if err == nil {
				_, err = r.serviceConfig()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	t.Run("a group's topic is the input", func(t *testing.T) {
		r, err := parseRun(t, nil, append(slices.Clone(base), "--input-topic", "device", "--group-topic", "{group}")...)
		if err != nil {
			t.Fatal(err)
		}
		c, err := r.serviceConfig()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.groupConfigs(c, nil); err == nil || !strings.Contains(err.Error(), "which is the input, output or dead-letter topic") {
			t.Fatalf("error %v, want the collision named", err)
		}
	})
	t.Run("services", func(t *testing.T) {
		r, err := parseRun(t, nil, append(slices.Clone(base), "--group", "pay", "--output-topic", "pay-velocity")...)
		if err != nil {
			t.Fatal(err)
		}
		c, err := r.serviceConfig()
		if err != nil {
			t.Fatal(err)
		}
		var hops []string
		for _, h := range c.Hops {
			hops = append(hops, h.Name+"→"+h.Topic)
		}
		if want := []string{"device→__velocity-repartition-pay-device", "ip→__velocity-repartition-pay-ip"}; !slices.Equal(hops, want) {
			t.Fatalf("hops %v, want %v", hops, want)
		}
		gs, err := r.groupConfigs(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, g := range gs {
			if g.Merge == nil || g.Hops != nil || g.Decoder != nil || g.Features == nil || !slices.Equal(g.Specs, g.Features.Windows) {
				t.Fatalf("group %s: not a second stage of its own features: %+v", g.Group, g)
			}
			got = append(got, strings.Join([]string{g.Merge.Name, g.Group, g.InputTopic, g.OutputTopic, g.DLQTopic}, " "))
		}
		want := []string{
			"device pay.device __velocity-repartition-pay-device pay-velocity.device velocity-dlq",
			"ip pay.ip __velocity-repartition-pay-ip pay-velocity.ip velocity-dlq",
		}
		if !slices.Equal(got, want) {
			t.Fatalf("second stages\n%v\nwant\n%v", got, want)
		}
	})
}

// TestRekeyedGroupsReplayFromFileEqualsReference: `replay` of a file under a
// definition with re-keyed groups writes each group to its own file, computed in
// memory, and every group's rows and every dead letter equal the independent
// reference's.
func TestRekeyedGroupsReplayFromFileEqualsReference(t *testing.T) {
	streamtest.RequireReference(t)
	const (
		schemaFile = "../../internal/streamtest/" + streamtest.PaymentSchemaFile
		defFile    = "../../internal/streamtest/" + streamtest.PaymentGroupsFile
		lateness   = 5 * time.Second
	)
	schema, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	paths, err := streamtest.WritePaymentOCFs(dir, string(schema), streamtest.PaymentStream(streamtest.PaymentStreamConfig{Seed: 3, N: 3000, Partitions: 1, Lateness: lateness}))
	if err != nil {
		t.Fatal(err)
	}
	out, dlq := filepath.Join(dir, "rows.jsonl"), filepath.Join(dir, "dead.jsonl")
	if err := cmdReplay(context.Background(), []string{"--input-file", paths[0], "--features", defFile,
		"--output", out, "--dlq", dlq, "--allowed-lateness", lateness.String(), "--quiet", "--log-level", "error"}); err != nil {
		t.Fatal(err)
	}
	ref := streamtest.RunGroupReference(t, referenceScript, defFile, paths, lateness, filepath.Base(paths[0]))
	ref.CompareDeadLetters(t, streamtest.DeadReasons(t, streamtest.ReadJSONLines(t, dlq)))
	for g := range ref.Groups {
		file := out
		if g != ref.InPlace {
			file = filepath.Join(dir, "rows."+g+".jsonl")
		}
		st := ref.CompareGroup(t, g, streamtest.ReadJSONLines(t, file))
		t.Logf("group %s: %+v", g, st)
		if st.Rows == 0 {
			t.Errorf("group %s: no rows compared", g)
		}
	}
}
