package window

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// oracle is the slow, obviously correct model: it keeps every counted event of every
// entity forever and recomputes each aggregate by scanning all of them.
type oracle struct {
	specs  []Spec
	max    int
	ttl    int64
	ents   map[string]*oEntity
	clock  int64 // apply sequence, for least-recently-active
	evicts uint64
}

type oEntity struct {
	events     []rawEvent
	newest     int64
	prevT      int64
	active     int64
	compacted  bool // EvictIdle shrank it and nothing was applied since
	lastEvents []rawEvent
}

func newOracle(specs []Spec, opts Options) *oracle {
	ttl := opts.HistoryTTLMs
	if ttl == 0 {
		ttl = 7 * 24 * 3600 * 1000
	}
	return &oracle{specs: specs, max: opts.MaxEntities, ttl: ttl, ents: map[string]*oEntity{}}
}

// bucketOf is floor(t/b) spelled out without tricks.
func bucketOf(t, b int64) int64 {
	k := t / b
	if k*b > t {
		k--
	}
	return k
}

func (o *oracle) apply(id string, ts, a int64) ([]Agg, int64, bool, error) {
	e := o.ents[id]
	if e != nil && ts < e.newest {
		for _, sp := range o.specs {
			if bucketOf(ts, sp.BucketMs) <= bucketOf(e.newest, sp.BucketMs)-int64(sp.Buckets) {
				return nil, 0, false, ErrExpired
			}
		}
	}
	if e == nil {
		if o.max > 0 && len(o.ents) >= o.max {
			var lru string
			for name, x := range o.ents {
				if lru == "" || x.active < o.ents[lru].active {
					lru = name
				}
			}
			delete(o.ents, lru)
			o.evicts++
		}
		e = &oEntity{newest: ts, prevT: ts}
		o.ents[id] = e
		defer func() { e.prevT = ts }()
	}
	hadPrev := len(e.events) > 0 || e.compacted
	e.events = append(e.events, rawEvent{ts, a})
	out := make([]Agg, len(o.specs))
	for i, sp := range o.specs {
		k := bucketOf(ts, sp.BucketMs)
		top := max(k, bucketOf(e.newest, sp.BucketMs))
		lo := top - int64(sp.Buckets) + 1
		var g Agg
		for _, ev := range e.events {
			if kb := bucketOf(ev.t, sp.BucketMs); kb >= lo && kb <= k {
				if g.Count == 0 || ev.a < g.Min {
					g.Min = ev.a
				}
				if g.Count == 0 || ev.a > g.Max {
					g.Max = ev.a
				}
				g.Count++
				g.Sum += ev.a
			}
		}
		out[i] = g
	}
	gap := ts - e.prevT
	e.prevT = ts
	e.newest = max(e.newest, ts)
	e.compacted = false
	o.clock++
	e.active = o.clock
	if gap > o.ttl {
		return out, 0, false, nil // remembered for the TTL only, however late the sweep
	}
	return out, gap, hadPrev, nil
}

func (o *oracle) allEmpty(e *oEntity, wm int64) bool {
	for _, sp := range o.specs {
		if bucketOf(e.newest, sp.BucketMs) > bucketOf(wm, sp.BucketMs)-int64(sp.Buckets) {
			return false
		}
	}
	return true
}

func (o *oracle) evictIdle(wm int64) int {
	n := 0
	for id, e := range o.ents {
		if !o.allEmpty(e, wm) {
			continue
		}
		if e.newest < wm-o.ttl {
			delete(o.ents, id)
			n++
		} else {
			e.compacted = true
		}
	}
	return n
}

// current is the entity's aggregates relative to its newest event.
func (o *oracle) current(e *oEntity) []Agg {
	out := make([]Agg, len(o.specs))
	if e.compacted {
		return out
	}
	for i, sp := range o.specs {
		top := bucketOf(e.newest, sp.BucketMs)
		lo := top - int64(sp.Buckets) + 1
		var g Agg
		for _, ev := range e.events {
			if kb := bucketOf(ev.t, sp.BucketMs); kb >= lo && kb <= top {
				if g.Count == 0 || ev.a < g.Min {
					g.Min = ev.a
				}
				if g.Count == 0 || ev.a > g.Max {
					g.Max = ev.a
				}
				g.Count++
				g.Sum += ev.a
			}
		}
		out[i] = g
	}
	return out
}

type streamEvent struct {
	id   string
	t, a int64
}

// genStream makes a stream with the shapes that broke or could break the engine:
// several entities, bursts (beyond the raw→ring switch), equal timestamps, gaps longer
// than every window, and older events both inside and beyond retention.
func genStream(r *rand.Rand, n int, minW, maxW int64, nEnt int) []streamEvent {
	var out []streamEvent
	now := int64(r.IntN(100000)) + 1_700_000_000_000
	// Steps are drawn on two scales so that both the finest and the widest window
	// see several events at once, and windows empty out.
	step := func() int64 {
		scale := []int64{minW/8 + 1, maxW/16 + 1}[r.IntN(2)]
		return int64(r.Int64N(scale))
	}
	for len(out) < n {
		id := fmt.Sprintf("e%d", r.IntN(nEnt))
		switch p := r.IntN(100); {
		case p < 3: // gap longer than every window
			now += maxW + r.Int64N(maxW)
		case p < 8: // burst on one entity, past the raw→ring switch
			for range 20 + r.IntN(60) {
				now += r.Int64N(minW/20 + 1)
				out = append(out, streamEvent{id, now, int64(r.IntN(1000))})
			}
			continue
		case p < 20: // older event, often within retention, sometimes not
			back := r.Int64N(maxW + maxW/4 + 1)
			out = append(out, streamEvent{id, now - back, int64(r.IntN(1000))})
			continue
		case p < 30: // equal timestamp
		default:
			now += step()
		}
		out = append(out, streamEvent{id, now, int64(r.IntN(1000))})
	}
	return out[:n]
}

func TestEngineMatchesOracle(t *testing.T) {
	specSets := []string{
		"10s:1s,1m:10s,5m:1m",
		DefaultSpecs,
		"7s:7ms,90s:45s,3s:3s",
		"1s:1ms",
	}
	optSets := []Options{{}, {MaxEntities: 3}, {HistoryTTLMs: 20000}}
	seeds := 30
	if testing.Short() {
		seeds = 5
	}
	for _, ss := range specSets {
		specs, err := ParseSpecs(ss)
		if err != nil {
			t.Fatal(err)
		}
		minW, maxW := int64(math.MaxInt64), int64(0)
		for _, sp := range specs {
			minW, maxW = min(minW, sp.WindowMs), max(maxW, sp.WindowMs)
		}
		for oi, opts := range optSets {
			for seed := range seeds {
				name := fmt.Sprintf("%s/opts%d/seed%d", ss, oi, seed)
				t.Run(name, func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(seed), uint64(oi)))
					runOracle(t, r, specs, opts, genStream(r, 1500, minW, maxW, 2+r.IntN(6)))
				})
			}
		}
	}
}

func runOracle(t *testing.T, r *rand.Rand, specs []Spec, opts Options, stream []streamEvent) {
	t.Helper()
	tbl, err := NewTable(specs, opts)
	if err != nil {
		t.Fatal(err)
	}
	or := newOracle(specs, opts)
	// suffixMin[i] = smallest event time at or after i: a watermark no later event
	// undercuts, which is EvictIdle's contract.
	suffixMin := make([]int64, len(stream)+1)
	suffixMin[len(stream)] = 1 << 62
	for i := len(stream) - 1; i >= 0; i-- {
		suffixMin[i] = min(suffixMin[i+1], stream[i].t)
	}
	out := make([]Agg, len(specs))
	var applied, expired int
	for i, ev := range stream {
		// The prefetch hints for upcoming events, as a caller with lookahead gives
		// them: they must not change any result.
		if j := i + 6; j < len(stream) {
			tbl.Prefetch(stream[j].id)
		}
		if j := i + 3; j < len(stream) {
			tbl.PrefetchRecord(stream[j].id)
		}
		want, wantGap, wantPrev, wantErr := or.apply(ev.id, ev.t, ev.a)
		gap, hasPrev, err := tbl.Apply(ev.id, ev.t, ev.a, out)
		if !errors.Is(err, wantErr) || (err == nil) != (wantErr == nil) {
			t.Fatalf("event %d %+v: err %v, oracle %v", i, ev, err, wantErr)
		}
		if err != nil {
			expired++
		} else {
			applied++
			if !slices.Equal(out[:len(specs)], want) || gap != wantGap || hasPrev != wantPrev {
				t.Fatalf("event %d %+v:\n engine %v gap %d prev %v\n oracle %v gap %d prev %v", i, ev, out, gap, hasPrev, want, wantGap, wantPrev)
			}
		}
		switch r.IntN(200) {
		case 0:
			wm := suffixMin[i+1]
			if got, want := tbl.EvictIdle(wm), or.evictIdle(wm); got != want {
				t.Fatalf("event %d: EvictIdle(%d) = %d, oracle %d", i, wm, got, want)
			}
		case 1:
			snap := tbl.AppendSnapshot(nil)
			tbl2, err := RestoreTable(specs, opts, snap)
			if err != nil {
				t.Fatalf("event %d: restore: %v", i, err)
			}
			if again := tbl2.AppendSnapshot(nil); !bytes.Equal(again, snap) {
				t.Fatalf("event %d: snapshot not deterministic across restore (%d vs %d bytes)", i, len(again), len(snap))
			}
			tbl2.capEvictions = tbl.capEvictions
			tbl = tbl2
		}
	}
	compareTable(t, tbl, or)
	if applied == 0 || expired == 0 {
		t.Logf("stream exercised applied=%d expired=%d", applied, expired)
	}
}

func compareTable(t *testing.T, tbl *Table, or *oracle) {
	t.Helper()
	if tbl.Len() != len(or.ents) {
		t.Fatalf("Len %d, oracle %d", tbl.Len(), len(or.ents))
	}
	if tbl.CapEvictions() != or.evicts {
		t.Fatalf("CapEvictions %d, oracle %d", tbl.CapEvictions(), or.evicts)
	}
	seen := 0
	tbl.Range(func(id string, last int64, aggs []Agg) bool {
		seen++
		e := or.ents[id]
		if e == nil {
			t.Fatalf("Range: entity %q not in oracle", id)
		}
		if last != e.newest {
			t.Fatalf("Range %q: last %d, oracle %d", id, last, e.newest)
		}
		if want := or.current(e); !slices.Equal(aggs, want) {
			t.Fatalf("Range %q: %v, oracle %v", id, aggs, want)
		}
		return true
	})
	if seen != len(or.ents) {
		t.Fatalf("Range visited %d, want %d", seen, len(or.ents))
	}
}

// TestEngineMatchesOracleRandomSpecs varies the windows themselves: odd bucket
// widths, single-bucket windows, windows that do not nest, N up to 64.
func TestEngineMatchesOracleRandomSpecs(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 5
	}
	widths := []int64{1, 3, 7, 10, 250, 1000, 1300}
	for seed := range seeds {
		r := rand.New(rand.NewPCG(uint64(seed), 77))
		var specs []Spec
		seen := map[int64]bool{}
		for range 1 + r.IntN(4) {
			b := widths[r.IntN(len(widths))]
			sp, err := NewSpec(b*int64(1+r.IntN(64)), b)
			if err != nil {
				t.Fatal(err)
			}
			if !seen[sp.WindowMs] {
				seen[sp.WindowMs] = true
				specs = append(specs, sp)
			}
		}
		minW, maxW := int64(math.MaxInt64), int64(0)
		for _, sp := range specs {
			minW, maxW = min(minW, sp.WindowMs), max(maxW, sp.WindowMs)
		}
		opts := Options{MaxEntities: r.IntN(4), HistoryTTLMs: int64(r.IntN(3)) * maxW}
		t.Run(fmt.Sprintf("%s/seed%d", FormatSpecs(specs), seed), func(t *testing.T) {
			runOracle(t, r, specs, opts, genStream(r, 1500, minW, maxW, 2+r.IntN(6)))
		})
	}
}
