package feature

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// ref is the brute-force reference: it keeps every counted event of every entity
// (dropping them only where the documented evictions say so) and computes each
// feature by the documented rule, literally, by scanning them. It shares no code
// with the State.
type ref struct {
	spec  Spec
	max   int
	ttl   int64
	ents  map[string]*refEnt
	clock int64
}

type refEvent struct {
	t, a int64
	ext  []uint64
}

type refEnt struct {
	events        []refEvent
	newest, prevT int64
	active        int64
}

func newRef(spec Spec, opts window.Options) *ref {
	ttl := opts.HistoryTTLMs
	if ttl == 0 {
		ttl = 7 * 24 * 3600 * 1000
	}
	return &ref{spec: spec, max: opts.MaxEntities, ttl: ttl, ents: map[string]*refEnt{}}
}

// bucket is floor(t/b) without tricks.
func bucket(t, b int64) int64 {
	k := t / b
	if k*b > t {
		k--
	}
	return k
}

type refOut struct {
	values  []int64
	null    []bool
	exact   []bool // what the reference can say: the true count is known exactly
	gap     int64
	hasPrev bool
}

func (r *ref) apply(id string, t, a int64, ext []uint64) (refOut, error) {
	e := r.ents[id]
	if e != nil && t < e.newest {
		for _, w := range r.spec.Windows {
			if bucket(t, w.BucketMs) <= bucket(e.newest, w.BucketMs)-int64(w.Buckets) {
				return refOut{}, window.ErrExpired
			}
		}
	}
	var out refOut
	if e == nil {
		if r.max > 0 && len(r.ents) >= r.max {
			var lru string
			for name, x := range r.ents {
				if lru == "" || x.active < r.ents[lru].active {
					lru = name
				}
			}
			delete(r.ents, lru)
		}
		e = &refEnt{newest: t, prevT: t}
		r.ents[id] = e
	} else {
		out.gap = t - e.prevT
		out.hasPrev = out.gap <= r.ttl
		if !out.hasPrev {
			out.gap = 0
		}
	}
	r.clock++
	e.active = r.clock
	e.prevT = t
	e.newest = max(e.newest, t)
	e.events = append(e.events, refEvent{t, a, slices.Clone(ext)})
	// The rule never reads below K−N+1 in any window and K only grows, so events
	// before every window of the newest event can go (this keeps the scans short).
	floor := int64(math.MaxInt64)
	for _, w := range r.spec.Windows {
		floor = min(floor, (bucket(e.newest, w.BucketMs)-int64(w.Buckets)+1)*w.BucketMs)
	}
	e.events = slices.DeleteFunc(e.events, func(ev refEvent) bool { return ev.t < floor })
	out.values, out.null, out.exact = r.features(e, t, e.newest, false)
	return out, nil
}

// features computes every column for an event at t of an entity whose newest
// counted event is at top (read: a lookup at asOf = t instead, windows ending at
// t's bucket).
func (r *ref) features(e *refEnt, t, top int64, read bool) (vals []int64, null, exact []bool) {
	matches := func(ev refEvent, filter int) bool {
		return filter < 0 || ev.ext[0]&(1<<uint(filter)) != 0
	}
	for _, f := range r.spec.Features {
		for _, wi := range f.Windows {
			w := r.spec.Windows[wi]
			k := bucket(t, w.BucketMs)
			lo := max(k, bucket(top, w.BucketMs)) - int64(w.Buckets) + 1
			if read {
				lo = k - int64(w.Buckets) + 1
			}
			var n, sum int64
			mn, mx := int64(math.MaxInt64), int64(math.MinInt64)
			distinct := map[uint64]bool{}
			for _, ev := range e.events {
				kb := bucket(ev.t, w.BucketMs)
				if kb < lo || !matches(ev, f.Filter) {
					continue
				}
				if f.Agg == DistinctCount {
					// No upper bound: values counted after an out-of-order event count.
					if ev.ext[0]&(1<<(32+uint(f.Distinct))) != 0 {
						distinct[ev.ext[1+f.Distinct]] = true
					}
					continue
				}
				if kb > k {
					continue
				}
				n++
				sum += ev.a
				mn, mx = min(mn, ev.a), max(mx, ev.a)
			}
			v, isNull := int64(0), false
			switch f.Agg {
			case Count:
				v = n
			case Sum:
				v = sum
			case Min:
				v, isNull = mn, n == 0
			case Max:
				v, isNull = mx, n == 0
			case DistinctCount:
				v = int64(len(distinct))
			}
			if isNull {
				v = 0
			}
			vals = append(vals, v)
			null = append(null, isNull)
		}
	}
	for range r.spec.distinctFeatures() {
		exact = append(exact, true)
	}
	return vals, null, exact
}

func (r *ref) evictIdle(wm int64) int {
	n := 0
	for id, e := range r.ents {
		empty := true
		for _, w := range r.spec.Windows {
			if bucket(e.newest, w.BucketMs) > bucket(wm, w.BucketMs)-int64(w.Buckets) {
				empty = false
			}
		}
		if !empty {
			continue
		}
		if e.newest < wm-r.ttl {
			delete(r.ents, id)
			n++
		} else {
			e.events = nil
		}
	}
	return n
}

// testSpec has every aggregate, filters that sometimes / never / always match,
// distinct counts with and without a filter, a small MaxExact that streams exceed,
// and windows whose bucket edges events hit often.
func testSpec(t testing.TB) Spec {
	t.Helper()
	ws, err := window.ParseSpecs("10s:1s,1m:5s,5m:1m,1500ms:500ms")
	if err != nil {
		t.Fatal(err)
	}
	s := Spec{
		Windows: ws, Filters: 3, Distincts: 2,
		Features: []Feature{
			{Name: "cnt", Agg: Count, Windows: []int{0, 1, 2, 3}, Filter: -1},
			{Name: "amt", Agg: Sum, Windows: []int{1, 2}, Filter: 0},
			{Name: "lo", Agg: Min, Windows: []int{2, 0}, Filter: 1}, // never matches
			{Name: "hi", Agg: Max, Windows: []int{2, 0, 3}, Filter: 2},
			{Name: "declines", Agg: Count, Windows: []int{0}, Filter: 0},
			{Name: "merchants", Agg: DistinctCount, Windows: []int{0, 1, 2}, Filter: -1, Distinct: 0, MaxExact: 8},
			{Name: "declined_cards", Agg: DistinctCount, Windows: []int{2, 3}, Filter: 0, Distinct: 1},
			{Name: "mn", Agg: Min, Windows: []int{1}, Filter: -1},
			{Name: "sum_all", Agg: Sum, Windows: []int{3, 2}, Filter: -1},
		},
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}

func mix64(x uint64) uint64 { // splitmix64 finaliser: a stand-in for the value hash
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

type streamGen struct {
	r        *rand.Rand
	now      int64
	ids      []string
	pool     []int // per entity: how many distinct slot-0 values it draws from
	maxDelay int64 // largest out-of-order delay
}

func newStreamGen(seed uint64, entities int) *streamGen {
	g := &streamGen{r: rand.New(rand.NewPCG(seed, 77)), now: 1_700_000_000_000, maxDelay: 400_000}
	for i := range entities {
		g.ids = append(g.ids, fmt.Sprintf("card-%d", i))
		p := 1 + g.r.IntN(6)    // within MaxExact 8: always exact
		if i%5 == 4 || i == 1 { // entity 1 is hot and exceeds MaxExact
			p = 30 + g.r.IntN(100) // beyond it
		}
		g.pool = append(g.pool, p)
	}
	return g
}

func (g *streamGen) next() (id string, ent int, t, a int64, ext []uint64) {
	r := g.r
	switch {
	case r.IntN(4) == 0:
		ent = r.IntN(min(3, len(g.ids))) // hot entities
	default:
		ent = r.IntN(len(g.ids))
	}
	g.now += int64(r.IntN(700))
	t = g.now
	switch r.IntN(10) {
	case 0: // out of order, sometimes expired
		t -= int64(r.IntN(int(g.maxDelay)))
	case 1: // exactly on a bucket edge, or just before one
		b := []int64{500, 1000, 5000, 60000}[r.IntN(4)]
		t = t/b*b - int64(r.IntN(2))
	}
	a = int64(r.IntN(10_000))
	var e0 uint64
	if r.IntN(2) == 0 {
		e0 |= 1 // filter 0: half the events
	}
	e0 |= 1 << 2 // filter 2: every event; filter 1: none
	var h0, h1 uint64
	if r.IntN(5) != 0 {
		e0 |= 1 << 32
		h0 = mix64(uint64(ent)<<20 | uint64(r.IntN(g.pool[ent])))
	}
	if r.IntN(2) == 0 {
		e0 |= 1 << 33
		h1 = mix64(1<<40 | uint64(r.IntN(20)))
	}
	return g.ids[ent], ent, t, a, []uint64{e0, h0, h1}
}

// compare checks one output of the State against the reference's.
func compare(t *testing.T, what string, spec *Spec, row *Row, want refOut, gap int64, hasPrev bool, approx *int) {
	t.Helper()
	if hasPrev != want.hasPrev || (hasPrev && gap != want.gap) {
		t.Fatalf("%s: ms_since_previous %d/%v, want %d/%v", what, gap, hasPrev, want.gap, want.hasPrev)
	}
	cols := spec.Columns()
	di := -1
	exactOf := map[int]bool{}
	for fi, f := range spec.Features {
		if f.Agg == DistinctCount {
			di++
			exactOf[fi] = row.Exact[di]
		}
	}
	for c := range want.values {
		col := cols[c]
		if spec.Features[col.Feature].Agg == DistinctCount && !exactOf[col.Feature] {
			*approx++
			continue // compared statistically in TestDistinctEstimateError
		}
		if row.Values[c] != want.values[c] || row.Null[c] != want.null[c] {
			t.Fatalf("%s: %s = %d (null %v), want %d (null %v)", what, col.Name, row.Values[c], row.Null[c], want.values[c], want.null[c])
		}
	}
}

// TestAgainstReference compares every output of the State with the reference over
// seeded adversarial streams: many entities and a few hot ones, out-of-order and
// expired events, events on bucket edges, filters that never and always match,
// distinct values beyond MaxExact, the entity cap, idle evictions, and a snapshot
// and restore in the middle after which outputs must go on identically.
func TestAgainstReference(t *testing.T) {
	cases := []struct {
		name     string
		seed     uint64
		entities int
		events   int
		opts     window.Options
	}{
		{"unbounded", 1, 40, 30_000, window.Options{}},
		{"cap", 2, 60, 30_000, window.Options{MaxEntities: 25}},
		{"cap-tight", 3, 10, 30_000, window.Options{MaxEntities: 2}},
		{"short-ttl", 4, 30, 30_000, window.Options{HistoryTTLMs: 200_000}},
		{"one-entity", 5, 1, 8_000, window.Options{}},
		{"many", 6, 2000, 30_000, window.Options{MaxEntities: 1500}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := testSpec(t)
			st, err := NewState(spec, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			rf := newRef(spec, c.opts)
			g := newStreamGen(c.seed, c.entities)
			row := NewRow(&spec)
			var approx, expired, older, nulls, exactSmall int
			events := c.events
			for i := range events {
				id, ent, ts, a, ext := g.next()
				want, werr := rf.apply(id, ts, a, ext)
				gap, hasPrev, err := st.Apply(id, ts, a, ext, row)
				if (werr == nil) != (err == nil) || (werr != nil && !errors.Is(err, werr)) {
					t.Fatalf("event %d (%s t=%d): error %v, want %v", i, id, ts, err, werr)
				}
				if err != nil {
					expired++
					continue
				}
				if ts < g.now {
					older++
				}
				compare(t, fmt.Sprintf("event %d (%s t=%d)", i, id, ts), &spec, row, want, gap, hasPrev, &approx)
				if g.pool[ent] <= 8 && !row.Exact[0] {
					t.Fatalf("event %d: entity with %d values (≤ MaxExact 8) reported approximate", i, g.pool[ent])
				}
				if g.pool[ent] <= 8 {
					exactSmall++
				}
				for c := range row.Null {
					if row.Null[c] {
						nulls++
					}
				}
				if i%3000 == 2999 {
					// Every event from here on is at or after wm (the caller's contract).
					wm := g.now - g.maxDelay - 1
					if n, want := st.EvictIdle(wm), rf.evictIdle(wm); n != want {
						t.Fatalf("EvictIdle(%d) evicted %d, reference %d", wm, n, want)
					}
				}
				if i == events/2 {
					st = snapshotRestore(t, st, spec, c.opts)
				}
				if i%1000 == 0 {
					checkReads(t, st, rf, &spec, g.now, row)
				}
			}
			if st.Table().Len() != len(rf.ents) {
				t.Errorf("state holds %d entities, reference %d", st.Table().Len(), len(rf.ents))
			}
			t.Logf("expired %d, older counted %d, approximate distinct columns %d, null min/max %d, cap evictions %d", expired, older, approx, nulls, st.Table().CapEvictions())
			if expired == 0 || older == 0 || nulls == 0 || exactSmall == 0 {
				t.Error("the stream did not exercise expired, older, null or exact outputs")
			}
			if c.entities >= 30 && approx == 0 {
				t.Error("the stream never exceeded MaxExact")
			}
		})
	}
}

// checkReads compares ReadAt of a few entities at asOf with the reference's read.
func checkReads(t *testing.T, st *State, rf *ref, spec *Spec, asOf int64, row *Row) {
	t.Helper()
	n := 0
	for id, e := range rf.ents {
		if n++; n > 20 {
			break
		}
		newest, known, err := st.ReadAt(id, asOf, row)
		if err != nil || !known || newest != e.newest {
			t.Fatalf("ReadAt(%s, %d): newest %d known %v err %v; want %d", id, asOf, newest, known, err, e.newest)
		}
		vals, null, _ := rf.features(e, asOf, asOf, true)
		var approx int
		compare(t, "ReadAt "+id, spec, row, refOut{values: vals, null: null}, 0, false, &approx)
	}
	if _, known, err := st.ReadAt("nobody", asOf, row); known || err != nil {
		t.Fatalf("ReadAt of an unknown entity: known %v err %v", known, err)
	}
	for c := range row.Values {
		if row.Values[c] != 0 {
			t.Fatalf("ReadAt of an unknown entity: column %d = %d", c, row.Values[c])
		}
	}
}

// snapshotRestore snapshots st (unfiltered table and extras), restores a new State
// from the bytes, and checks the restored one snapshots to the same bytes.
func snapshotRestore(t *testing.T, st *State, spec Spec, opts window.Options) *State {
	t.Helper()
	tb := st.Table().AppendSnapshot(nil)
	ex := st.AppendExtras(nil)
	base, err := window.RestoreTable(spec.Windows, opts, tb)
	if err != nil {
		t.Fatal(err)
	}
	st2, err := Restore(spec, opts, base, ex)
	if err != nil {
		t.Fatal(err)
	}
	if tb2, ex2 := st2.Table().AppendSnapshot(nil), st2.AppendExtras(nil); string(tb2) != string(tb) || string(ex2) != string(ex) {
		t.Fatal("a restored State snapshots to different bytes")
	}
	return st2
}
