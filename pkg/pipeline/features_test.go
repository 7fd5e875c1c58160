package pipeline

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// txDefinition is a definition over our own Transaction schema with a filter
// and two distinct counts, one of them small enough to switch to sampling.
const txDefinition = `
version: pipeline-test
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [10s:1s, 1m:10s]
features:
  - {name: n, agg: count, windows: [10s, 1m]}
  - {name: eur, agg: sum, windows: [1m], where: [{field: currency, eq: EUR}]}
  - {name: low, agg: min, windows: [10s], where: [{field: amount_minor, lt: 500}]}
  - {name: cur, agg: distinct_count, field: currency, windows: [1m]}
  - {name: ids, agg: distinct_count, field: event_id, windows: [1m], max_exact: 4}
`

func newFeaturesProcessor(t testing.TB, def string, latenessMs int64) *Processor {
	t.Helper()
	d, err := definition.Parse("test.yaml", []byte(def))
	if err != nil {
		t.Fatal(err)
	}
	c, err := definition.Compile(d, "", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	spec, err := definition.EngineSpec(d)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Topic: "tx", Decoder: c.Decoder(), Features: spec,
		Watermark: watermark.Config{AllowedLateness: latenessMs}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func featureRecords(n int) []Record {
	rng := rand.New(rand.NewPCG(5, 6))
	var recs []Record
	t := int64(1_793_491_200_000)
	for i := range n {
		t += rng.Int64N(900)
		at := t
		if rng.IntN(8) == 0 {
			at -= rng.Int64N(2500) // out of order: some within the lateness, some late
		}
		tx := codec.Transaction{EventID: "e" + string(rune('a'+i%26)) + strings.Repeat("x", i%7) + string(rune('0'+i%10)),
			EntityID: []string{"a", "b", "c", "hot", "hot", "hot"}[rng.IntN(6)], AmountMinor: rng.Int64N(1000),
			Currency: []string{"EUR", "USD", "", "GBP"}[rng.IntN(4)], EventTime: at}
		recs = append(recs, Record{Topic: "tx", Offset: int64(i), Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)})
	}
	return recs
}

// TestFeaturesSnapshotResume: under a definition, a snapshot taken at any
// point (at once, or begun there and finished after the processor went on)
// restores to a processor whose every later output is byte for byte the
// uninterrupted one's. The pending events' Ext words and the definition's
// state beside the table are in the snapshot, or the filtered and distinct
// features would differ after the cut.
func TestFeaturesSnapshotResume(t *testing.T) {
	recs := featureRecords(400)
	type out struct {
		dead  bool
		value []byte
	}
	collectAll := func(into map[int64]out) func(*Output) {
		return func(o *Output) {
			if _, dup := into[o.SourceOffset]; dup {
				t.Fatalf("offset %d emitted twice", o.SourceOffset)
			}
			into[o.SourceOffset] = out{o.Dead, bytes.Clone(o.Value)}
		}
	}
	clean := map[int64]out{}
	p := newFeaturesProcessor(t, txDefinition, 1500)
	for _, r := range recs {
		p.Process(r, collectAll(clean))
	}
	p.Flush(collectAll(clean))
	features := 0
	for _, o := range clean {
		if !o.dead {
			features++
		}
	}
	if features < 300 || features == len(recs) {
		t.Fatalf("%d features of %d records: the stream must give both features and dead letters", features, len(recs))
	}

	for _, cut := range []int{0, 1, 99, 200, 399, 400} {
		got := map[int64]out{}
		a := newFeaturesProcessor(t, txDefinition, 1500)
		for _, r := range recs[:cut] {
			a.Process(r, collectAll(got))
		}
		snap := a.AppendSnapshot(nil)
		if !bytes.HasPrefix(snap, snapMagicFeatures[:]) {
			t.Fatalf("cut %d: snapshot magic %q", cut, snap[:4])
		}
		ps := a.BeginSnapshot(nil)
		for _, r := range recs[cut:] {
			ps.Step(1)
			a.Process(r, func(*Output) {})
		}
		ps.Step(math.MaxInt)
		if deferred, err := ps.Finish(); err != nil || !bytes.Equal(deferred, snap) {
			t.Fatalf("cut %d: a snapshot finished later differs from AppendSnapshot at its beginning (%v)", cut, err)
		}
		a.EndSnapshot(ps)
		b, err := Restore(a.cfg, snap)
		if err != nil {
			t.Fatalf("cut %d: restore: %v", cut, err)
		}
		for _, r := range recs[cut:] {
			b.Process(r, collectAll(got))
		}
		b.Flush(collectAll(got))
		if len(got) != len(clean) {
			t.Fatalf("cut %d: %d outputs, want %d", cut, len(got), len(clean))
		}
		for off, c := range clean {
			if g := got[off]; g.dead != c.dead || !bytes.Equal(g.value, c.value) {
				t.Fatalf("cut %d offset %d: output differs after restore", cut, off)
			}
		}
	}
}

// TestFeaturesRestoreRefusesAnotherDefinition: a partition's state resumes only
// under the kind of processor and the definition that made it; anything else is
// an error that says so, never a half-right state.
func TestFeaturesRestoreRefusesAnotherDefinition(t *testing.T) {
	recs := featureRecords(50)
	withDef := newFeaturesProcessor(t, txDefinition, 0)
	plain := newTestProcessor(t, "10s:1s,1m:10s", 0, LateDLQ)
	other := newFeaturesProcessor(t, strings.Replace(txDefinition, "max_exact: 4", "max_exact: 5", 1), 0)
	for _, r := range recs {
		withDef.Process(r, func(*Output) {})
		plain.Process(r, func(*Output) {})
	}
	tests := []struct {
		name string
		cfg  Config
		snap []byte
		want string
	}{
		{"definition state, no definition", plain.cfg, withDef.AppendSnapshot(nil), "made under a feature definition"},
		{"default state, a definition", withDef.cfg, plain.AppendSnapshot(nil), "made without a feature definition"},
		{"another definition", other.cfg, withDef.AppendSnapshot(nil), "different feature spec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Restore(tt.cfg, tt.snap)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("restore: %v, want an error containing %q", err, tt.want)
			}
			t.Log(err)
		})
	}
}
