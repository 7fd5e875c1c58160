package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// handDecoder decodes our Transaction schema and fills Ext as a definition's decoder
// would, with hashes chosen by hand so that a test can say which values a sampled
// distinct set keeps: filter 0 is currency EUR, filter 1 is amount ≥ 500, distinct
// slot 0 is the currency (absent when empty), hashed by handHash.
type handDecoder struct {
	codec.Decoder
	ext [2]uint64
}

// handHash: EUR and GBP have their top bit clear (kept at sampling shift 1), USD and
// CHF have it set (dropped at shift 1).
var handHash = map[string]uint64{"EUR": 0x01, "USD": 0x8000_0000_0000_0001, "GBP": 0x4000_0000_0000_0000, "CHF": 0x9000_0000_0000_0000}

func (d *handDecoder) Decode(value []byte, maxSeen int64, hasMax bool, tx *codec.Transaction) *codec.Rejection {
	if rej := d.Decoder.Decode(value, maxSeen, hasMax, tx); rej != nil {
		return rej
	}
	var e0 uint64
	if tx.Currency == "EUR" {
		e0 |= 1
	}
	if tx.AmountMinor >= 500 {
		e0 |= 2
	}
	d.ext[1] = 0
	if tx.Currency != "" {
		e0 |= 1 << 32
		d.ext[1] = handHash[tx.Currency]
	}
	d.ext[0] = e0
	tx.Ext = d.ext[:]
	return nil
}

// handSpec: windows 10s:1s and 1m:10s and seven features over them.
func handSpec(t testing.TB) *feature.Spec {
	t.Helper()
	ws, err := window.ParseSpecs("10s:1s,1m:10s")
	if err != nil {
		t.Fatal(err)
	}
	return &feature.Spec{Windows: ws, Filters: 2, Distincts: 1, Features: []feature.Feature{
		{Name: "n", Agg: feature.Count, Windows: []int{0, 1}, Filter: -1},
		{Name: "eur", Agg: feature.Count, Windows: []int{1}, Filter: 0},
		{Name: "eur_sum", Agg: feature.Sum, Windows: []int{0}, Filter: 0},
		{Name: "big_min", Agg: feature.Min, Windows: []int{1}, Filter: 1},
		{Name: "mx", Agg: feature.Max, Windows: []int{0}, Filter: -1},
		{Name: "cur", Agg: feature.DistinctCount, Windows: []int{1, 0}, Filter: -1, Distinct: 0},
		{Name: "cur2", Agg: feature.DistinctCount, Windows: []int{1}, Filter: -1, Distinct: 0, MaxExact: 2},
	}}
}

func newHandProcessor(t testing.TB, latenessMs int64) *Processor {
	t.Helper()
	dec, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Topic: "tx", Decoder: &handDecoder{Decoder: dec}, Features: handSpec(t),
		Watermark: watermark.Config{AllowedLateness: latenessMs}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// T0 is a multiple of a minute, so bucket edges are at round offsets from it.
const handT0 = int64(1_800_000_000_000)

func feed(t testing.TB, p *Processor, entity string, at, amount int64, currency string) {
	t.Helper()
	tx := codec.Transaction{EventID: fmt.Sprintf("e%d", p.Next()), EntityID: entity, AmountMinor: amount, Currency: currency, EventTime: at}
	p.Process(Record{Topic: "tx", Offset: p.Next(), Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}, func(o *Output) {
		if o.Dead {
			t.Fatalf("offset %d dead-lettered: %s %s", o.SourceOffset, o.Reason, o.Err)
		}
	})
}

// want is a row by column name; nil is a null min/max. exact is by distinct feature.
type wantRow struct {
	vals  map[string]any // int64 or nil
	exact map[string]bool
}

func checkRow(t *testing.T, spec *feature.Spec, row *feature.Row, w wantRow) {
	t.Helper()
	cols := spec.Columns()
	v, d := 0, 0
	for _, c := range cols {
		if c.Window < 0 {
			if got, want := row.Exact[d], w.exact[spec.Features[c.Feature].Name]; got != want {
				t.Errorf("%s = %v, want %v", c.Name, got, want)
			}
			d++
			continue
		}
		want, ok := w.vals[c.Name]
		if !ok {
			t.Fatalf("test lacks %s", c.Name)
		}
		var got any = row.Values[v]
		if row.Null[v] {
			got = nil
		}
		if want != nil {
			want = int64(want.(int))
		}
		if got != want {
			t.Errorf("%s = %v, want %v", c.Name, got, want)
		}
		v++
	}
}

// TestLookupFeaturesHandComputed reads features at hand-chosen as-of times after a
// hand-made stream and compares them with values worked out on paper.
//
// Entity a: 100 EUR at +0 s, 700 USD at +5 s, 600 EUR at +12 s, 50 GBP at +30 s, 900
// with no currency at +31.5 s; c: 200 EUR at +1 s; b: 10 CHF at +31 s. Partition
// newest +31.5 s; the first record's sweep makes the accepted range start at +0 s.
// cur2 keeps 2 values exactly: GBP (4th value) raises its sample to shift 1, dropping
// USD (top hash bit set, last at +5 s, unit 10 s: dropMax = bucket 0), so a 1m window
// starting at or before bucket 0 is estimated as held × 2.
func TestLookupFeaturesHandComputed(t *testing.T) {
	p := newHandProcessor(t, 0)
	feed(t, p, "a", handT0, 100, "EUR")
	feed(t, p, "c", handT0+1000, 200, "EUR")
	feed(t, p, "a", handT0+5000, 700, "USD")
	feed(t, p, "a", handT0+12000, 600, "EUR")
	feed(t, p, "a", handT0+30000, 50, "GBP")
	feed(t, p, "b", handT0+31000, 10, "CHF")
	feed(t, p, "a", handT0+31500, 900, "")
	spec := p.FeatureSpec()
	zeros := wantRow{vals: map[string]any{"n_10s": 0, "n_1m": 0, "eur_1m": 0, "eur_sum_10s": 0, "big_min_1m": nil, "mx_10s": nil,
		"cur_1m": 0, "cur_10s": 0, "cur2_1m": 0}, exact: map[string]bool{"cur": true, "cur2": true}}
	cases := []struct {
		name       string
		entity     string
		at         int64 // from handT0; ignored with def
		def        bool
		want       wantRow
		err        error // errors.Is; or asOfRange
		asOfRange  bool
		known      bool
		wantAsOf   int64
		skipValues bool
	}{
		{name: "default as-of", entity: "a", def: true, known: true, wantAsOf: 31500, want: wantRow{
			// 10s = buckets 22 … 31 s: the GBP 50 and the 900; 1m = buckets −2 … 3 (10 s): all five.
			vals: map[string]any{"n_10s": 2, "n_1m": 5, "eur_1m": 2, "eur_sum_10s": 0, "big_min_1m": 600, "mx_10s": 900,
				"cur_1m": 3, "cur_10s": 1, "cur2_1m": 4}, // cur2: EUR and GBP held, ×2
			exact: map[string]bool{"cur": true, "cur2": false}}},
		{name: "in the newest bucket, before the newest event: whole buckets", entity: "a", at: 31000, known: true, wantAsOf: 31000, want: wantRow{
			vals: map[string]any{"n_10s": 2, "n_1m": 5, "eur_1m": 2, "eur_sum_10s": 0, "big_min_1m": 600, "mx_10s": 900,
				"cur_1m": 3, "cur_10s": 1, "cur2_1m": 4},
			exact: map[string]bool{"cur": true, "cur2": false}}},
		{name: "future: the 10s window is empty, 1m = buckets 1 … 6, past cur2's dropMax", entity: "a", at: 60000, known: true, wantAsOf: 60000, want: wantRow{
			vals: map[string]any{"n_10s": 0, "n_1m": 3, "eur_1m": 1, "eur_sum_10s": 0, "big_min_1m": 600, "mx_10s": nil,
				"cur_1m": 2, "cur_10s": 0, "cur2_1m": 2},
			exact: map[string]bool{"cur": true, "cur2": true}}},
		{name: "future: 1m = buckets 0 … 5, cur2 still estimated", entity: "a", at: 59999, known: true, wantAsOf: 59999, want: wantRow{
			vals: map[string]any{"n_10s": 0, "n_1m": 5, "eur_1m": 2, "eur_sum_10s": 0, "big_min_1m": 600, "mx_10s": nil,
				"cur_1m": 3, "cur_10s": 0, "cur2_1m": 4},
			exact: map[string]bool{"cur": true, "cur2": false}}},
		{name: "the end of the accepted range: everything has left", entity: "a", at: 91500, known: true, wantAsOf: 91500, want: zeros},
		{name: "past the accepted range", entity: "a", at: 91501, asOfRange: true},
		{name: "before the accepted range", entity: "c", at: -1, asOfRange: true},
		{name: "before a's newest bucket", entity: "a", at: 30999, err: window.ErrNotRetained},
		{name: "past, c: its event at +1 s is in 10s = buckets 1 … 10", entity: "c", at: 10999, known: true, wantAsOf: 10999, want: wantRow{
			vals: map[string]any{"n_10s": 1, "n_1m": 1, "eur_1m": 1, "eur_sum_10s": 200, "big_min_1m": nil, "mx_10s": 200,
				"cur_1m": 1, "cur_10s": 1, "cur2_1m": 1},
			exact: map[string]bool{"cur": true, "cur2": true}}},
		{name: "past, c: one ms later it has left the 10s window", entity: "c", at: 11000, known: true, wantAsOf: 11000, want: wantRow{
			vals: map[string]any{"n_10s": 0, "n_1m": 1, "eur_1m": 1, "eur_sum_10s": 0, "big_min_1m": nil, "mx_10s": nil,
				"cur_1m": 1, "cur_10s": 0, "cur2_1m": 1},
			exact: map[string]bool{"cur": true, "cur2": true}}},
		{name: "b: CHF, matching no filter", entity: "b", def: true, known: true, wantAsOf: 31500, want: wantRow{
			vals: map[string]any{"n_10s": 1, "n_1m": 1, "eur_1m": 0, "eur_sum_10s": 0, "big_min_1m": nil, "mx_10s": 10,
				"cur_1m": 1, "cur_10s": 1, "cur2_1m": 1},
			exact: map[string]bool{"cur": true, "cur2": true}}},
		{name: "unknown entity", entity: "nobody", def: true, known: false, wantAsOf: 31500, want: zeros},
	}
	row := feature.NewRow(spec)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := p.AppendSnapshot(nil)
			info, err := p.LookupFeatures(c.entity, handT0+c.at, c.def, row)
			if after := p.AppendSnapshot(nil); !bytes.Equal(before, after) {
				t.Fatal("LookupFeatures changed the processor's state")
			}
			var re *AsOfRangeError
			switch {
			case c.asOfRange:
				if !errors.As(err, &re) || re.From != handT0 || re.To != handT0+91500 {
					t.Fatalf("err %v, want an AsOfRangeError from +0 to +91.5 s", err)
				}
				return
			case c.err != nil:
				if !errors.Is(err, c.err) {
					t.Fatalf("err %v, want %v", err, c.err)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if info.Known != c.known || info.AsOf != handT0+c.wantAsOf || info.Pending != 0 || info.LastOffset != 6 || info.From != handT0 || info.To != handT0+91500 {
				t.Fatalf("info %+v", info)
			}
			checkRow(t, spec, row, c.want)
		})
	}
}

// TestLookupFeaturesPending: an event waiting in the reorder buffer is not counted
// (as Lookup, docs/api.md), and the answer says how many wait.
func TestLookupFeaturesPending(t *testing.T) {
	p := newHandProcessor(t, 5000)
	spec := p.FeatureSpec()
	row := feature.NewRow(spec)
	feed(t, p, "a", handT0, 100, "EUR")
	feed(t, p, "a", handT0+1000, 700, "USD")
	info, err := p.LookupFeatures("a", 0, true, row)
	if err != nil || info.Known || info.Pending != 2 {
		t.Fatalf("both pending: info %+v err %v", info, err)
	}
	feed(t, p, "a", handT0+7000, 50, "GBP") // watermark +2 s: releases the first two
	info, err = p.LookupFeatures("a", 0, true, row)
	if err != nil || !info.Known || info.Pending != 1 || info.AsOf != handT0+1000 {
		t.Fatalf("one pending: info %+v err %v", info, err)
	}
	checkRow(t, spec, row, wantRow{vals: map[string]any{"n_10s": 2, "n_1m": 2, "eur_1m": 1, "eur_sum_10s": 100, "big_min_1m": 700, "mx_10s": 700,
		"cur_1m": 2, "cur_10s": 2, "cur2_1m": 2}, exact: map[string]bool{"cur": true, "cur2": true}})
}

// TestLookupFeaturesPendingInSecondStage: a re-keyed group's second stage holds the
// events its Merger has not released (docs/repartition.md); they are not counted and
// the answer says how many wait, as the reorder buffer's do at an input partition.
func TestLookupFeaturesPendingInSecondStage(t *testing.T) {
	spec := handSpec(t)
	p, err := New(Config{Topic: "__velocity-repartition-g-dev", Partition: 0, Features: spec, Merge: &MergeConfig{Group: "dev", Sources: 2}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	row := feature.NewRow(spec)
	var off int64
	send := func(rec repartition.Record) {
		t.Helper()
		v, err := repartition.AppendRecord(nil, &rec)
		if err != nil {
			t.Fatal(err)
		}
		p.Process(Record{Topic: "__velocity-repartition-g-dev", Offset: off, Value: v}, func(o *Output) {
			if o.Dead {
				t.Fatalf("dead letter: %s", o.Err)
			}
		})
		off++
	}
	event := func(src int32, srcOff, at int64) repartition.Record {
		return repartition.Record{Kind: repartition.KindEvent, Watermark: at, Event: repartition.Event{
			Source: src, Offset: srcOff, EventTime: at, Topic: "tx", Key: "dev-1", EventID: fmt.Sprint("e", src, srcOff), Amount: 10, Ext: make([]uint64, spec.Words())}}
	}
	send(event(0, 0, handT0))
	send(event(0, 1, handT0+1000))
	info, err := p.LookupFeatures("dev-1", 0, true, row)
	if err != nil || info.Known || info.Pending != 2 || p.Pending() != 2 {
		t.Fatalf("source 1 unheard, both held: info %+v err %v (merger holds %d)", info, err, p.Pending())
	}
	send(repartition.Record{Kind: repartition.KindMarker, Watermark: handT0 + 500, Event: repartition.Event{Source: 1}})
	info, err = p.LookupFeatures("dev-1", 0, true, row)
	if err != nil || !info.Known || info.Pending != 1 || info.AsOf != handT0 || info.LastOffset != 2 {
		t.Fatalf("the first released: info %+v err %v", info, err)
	}
}

// TestLookupFeaturesWithoutDefinition: the default contract has no features to read.
func TestLookupFeaturesWithoutDefinition(t *testing.T) {
	p := newTestProcessor(t, "1m:1s", 0, LateDLQ)
	if p.FeatureSpec() != nil {
		t.Fatal("FeatureSpec without a definition")
	}
	if _, err := p.LookupFeatures("a", 0, true, &feature.Row{}); !errors.Is(err, ErrNoFeatures) {
		t.Fatalf("err %v, want ErrNoFeatures", err)
	}
}

// probeDefinition has filters and distinct counts that an event in currency ZZZ
// matches none of: such an event (a probe) adds to the unfiltered count, sum, min
// and max only, by its amount. cur samples beyond 3 values.
const probeDefinition = `
version: api-probe
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [10s:1s, 1m:10s, 5m:1m]
features:
  - {name: n, agg: count, windows: [10s, 1m, 5m]}
  - {name: total, agg: sum, windows: [1m, 5m]}
  - {name: lo, agg: min, windows: [10s, 5m]}
  - {name: hi, agg: max, windows: [1m, 5m]}
  - {name: eur, agg: count, windows: [1m], where: [{field: currency, eq: EUR}]}
  - {name: eur_lo, agg: min, windows: [10s, 5m], where: [{field: currency, eq: EUR}]}
  - {name: usd_hi, agg: max, windows: [5m], where: [{field: currency, in: [USD, GBP]}]}
  - {name: big, agg: sum, windows: [10s, 1m], where: [{field: currency, in: [EUR, USD]}, {field: amount_minor, ge: 500}]}
  - {name: cur, agg: distinct_count, field: currency, windows: [1m, 5m], max_exact: 3, where: [{field: currency, ne: ZZZ}]}
  - {name: cur_all, agg: distinct_count, field: currency, windows: [10s, 5m], where: [{field: currency, ne: ZZZ}]}
`

var probeCurrencies = []string{"EUR", "USD", "GBP", "CHF", "JPY", "SEK", "NOK", "DKK", "PLN", "CZK"}

// TestLookupFeaturesEqualsProbeRow is the property: at any moment of a random stream
// (out of order, late events applied, idle sweeps), for every entity and as-of time
// the lookup accepts, LookupFeatures equals the features record the processor itself
// emits for a probe event at that time (currency ZZZ: no filter, no distinct value),
// once the probe's own amount is taken out of the unfiltered features. The probe runs
// on a copy restored from a snapshot, twice (amount 0 and 10^15, so that min and max
// are each checked against an amount that cannot move them); a probe behind the
// watermark is applied as late (--late=apply).
func TestLookupFeaturesEqualsProbeRow(t *testing.T) {
	d, err := definition.Parse("probe.yaml", []byte(probeDefinition))
	if err != nil {
		t.Fatal(err)
	}
	comp, err := definition.Compile(d, "", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	spec, err := definition.EngineSpec(d)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Topic: "tx", Decoder: comp.Decoder(), Features: spec, Late: LateApply}
	cols := spec.Columns()
	entities := []string{"a", "b", "c", "hot", "nobody"}
	checked, refused, estimated, past := 0, 0, 0, 0
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 23))
		p, err := New(cfg, 0)
		if err != nil {
			t.Fatal(err)
		}
		row := feature.NewRow(spec)
		now := handT0
		for i := range 1500 {
			now += rng.Int64N(1500)
			if rng.IntN(200) == 0 {
				now += 90_000 + rng.Int64N(120_000) // a gap: sweeps, windows emptied
			}
			at := now
			if rng.IntN(6) == 0 {
				at -= rng.Int64N(40_000) // late, applied if still retained
			}
			ent := entities[rng.IntN(3)]
			if rng.IntN(3) == 0 {
				ent = "hot"
			}
			cur := probeCurrencies[rng.IntN(len(probeCurrencies))]
			if rng.IntN(10) == 0 {
				cur = ""
			}
			tx := codec.Transaction{EventID: fmt.Sprintf("s%d-%d", seed, i), EntityID: ent, AmountMinor: rng.Int64N(2000), Currency: cur, EventTime: at}
			p.Process(Record{Topic: "tx", Offset: p.Next(), Key: []byte(ent), Value: codec.EncodeTransaction(&tx)}, func(*Output) {})
			if i%37 != 0 {
				continue
			}
			snap := p.AppendSnapshot(nil)
			def, from, to := p.AsOf()
			for _, ent := range entities {
				for _, asOf := range []int64{def, def - rng.Int64N(3000), def + rng.Int64N(400_000), from, to} {
					info, err := p.LookupFeatures(ent, asOf, false, row)
					if err != nil {
						var re *AsOfRangeError
						if !errors.Is(err, window.ErrNotRetained) && !errors.As(err, &re) {
							t.Fatalf("seed %d record %d: %s at %d: %v", seed, i, ent, asOf, err)
						}
						refused++
						continue
					}
					for _, amount := range []int64{0, codec.MaxAmountMinor} {
						probe := probeRow(t, cfg, snap, ent, asOf, amount)
						for ci, c := range cols {
							if c.Window < 0 {
								continue
							}
							f := spec.Features[c.Feature]
							v := columnIndex(cols, ci)
							got, gotNull := row.Values[v], row.Null[v]
							want, wantNull := probe.Values[v], probe.Null[v]
							if f.Filter < 0 && f.Agg != feature.DistinctCount {
								// Take the probe out: count −1, sum −amount; min (amount
								// 10^15) and max (amount 0) are the probe's only when no
								// other event is in the window.
								alone := probe.Base[c.Window].Count == 1
								switch f.Agg {
								case feature.Count:
									want--
								case feature.Sum:
									want -= amount
								case feature.Min:
									if amount == 0 {
										continue
									}
									if alone {
										want, wantNull = 0, true
									}
								case feature.Max:
									if amount != 0 {
										continue
									}
									if alone {
										want, wantNull = 0, true
									}
								}
							}
							if gotNull != wantNull || (!gotNull && got != want) {
								t.Fatalf("seed %d record %d: %s at %d (default %d, known %v), %s: lookup %d (null %v), probe row %d (null %v)",
									seed, i, ent, asOf, def, info.Known, c.Name, got, gotNull, want, wantNull)
							}
						}
						for di := range row.Exact {
							if !row.Exact[di] && amount == 0 {
								estimated++
							}
							if row.Exact[di] != probe.Exact[di] {
								t.Fatalf("seed %d record %d: %s at %d: exact %d lookup %v, probe %v", seed, i, ent, asOf, di, row.Exact[di], probe.Exact[di])
							}
						}
					}
					checked++
					if wm, _ := p.Watermark(); asOf < wm {
						past++ // the probe was applied late
					}
				}
			}
		}
	}
	if checked < 1000 || refused == 0 || estimated == 0 || past == 0 {
		t.Fatalf("%d lookups checked (%d in the past, %d with an estimate), %d refused: the stream does not exercise the property", checked, past, estimated, refused)
	}
	t.Logf("%d lookups equal their probe rows (%d behind the watermark, %d distinct estimates); %d refused (not retained, out of range)", checked, past, estimated, refused)
}

// columnIndex is the Row.Values index of value column ci of cols.
func columnIndex(cols []feature.Column, ci int) int {
	v := 0
	for _, c := range cols[:ci] {
		if c.Window >= 0 {
			v++
		}
	}
	return v
}

// probeRow restores snap and processes one ZZZ event of amount for entity at asOf,
// returning the features row the processor emits for it.
func probeRow(t *testing.T, cfg Config, snap []byte, entity string, asOf, amount int64) *feature.Row {
	t.Helper()
	q, err := Restore(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	tx := codec.Transaction{EventID: "probe", EntityID: entity, AmountMinor: amount, Currency: "ZZZ", EventTime: asOf}
	row := feature.NewRow(cfg.Features)
	var got bool
	q.Process(Record{Topic: "tx", Offset: q.Next(), Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}, func(o *Output) {
		if o.SourceOffset != q.Next()-1 {
			return // an event the probe released, not the probe
		}
		if o.Dead {
			t.Fatalf("probe of %s at %d dead-lettered: %s %s", entity, asOf, o.Reason, o.Err)
		}
		var h feature.Head
		if err := feature.ParseRow(o.Value, cfg.Features, &h, row); err != nil {
			t.Fatal(err)
		}
		for i, w := range o.Windows {
			row.Base[i] = window.Agg{Count: w.Count, Sum: w.SumMinor, Min: w.MinMinor, Max: w.MaxMinor}
		}
		got = true
	})
	if !got {
		t.Fatalf("probe of %s at %d emitted nothing", entity, asOf)
	}
	return row
}
