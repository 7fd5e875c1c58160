package feature

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// checkInvariants: every filtered-table entity and every non-empty set belongs to
// an entity of the unfiltered table, never with a newer event, and no set holds
// more than MaxExact values or values outside its sample.
func checkInvariants(t testing.TB, st *State) {
	t.Helper()
	for _, ft := range st.ftabs {
		for slot := range ft.tbl.Slots() {
			id, newest, ok := ft.tbl.SlotEntity(slot)
			if !ok {
				continue
			}
			_, bn, held := st.base.Lookup(id)
			if !held || newest > bn {
				t.Fatalf("filter %d holds %q (newest %d); unfiltered table holds it: %v (newest %d)", ft.bit, id, newest, held, bn)
			}
		}
	}
	nd := len(st.dfs)
	for i := range st.sets {
		set := &st.sets[i]
		if set.n == 0 && set.shift == 0 {
			continue
		}
		if _, _, ok := st.base.SlotEntity(i / nd); !ok {
			t.Fatalf("set %d of free slot %d holds %d values", i%nd, i/nd, set.n)
		}
		if int(set.n) > st.dfs[i%nd].maxExact {
			t.Fatalf("set holds %d values, MaxExact %d", set.n, st.dfs[i%nd].maxExact)
		}
		for v := range int(set.n) {
			if !sampled(set.hash(v), set.shift) {
				t.Fatalf("set holds a value outside its sample")
			}
		}
	}
}

// TestEvictionsMirrored: after cap and idle evictions the filtered tables and sets
// hold exactly entities the unfiltered table holds.
func TestEvictionsMirrored(t *testing.T) {
	spec := testSpec(t)
	st, err := NewState(spec, window.Options{MaxEntities: 50, HistoryTTLMs: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	g := newStreamGen(9, 400)
	row := NewRow(&spec)
	for i := range 20_000 {
		id, _, ts, a, ext := g.next()
		st.Apply(id, ts, a, ext, row)
		if i%500 == 0 {
			checkInvariants(t, st)
		}
		if i%4000 == 3999 {
			st.EvictIdle(g.now - g.maxDelay)
			checkInvariants(t, st)
		}
	}
	if st.Table().CapEvictions() == 0 {
		t.Fatal("no cap evictions")
	}
	// Far ahead: everything leaves, everywhere.
	if n := st.EvictIdle(g.now + 100*3600_000); n == 0 || st.Table().Len() != 0 {
		t.Fatalf("EvictIdle far ahead evicted %d, %d left", n, st.Table().Len())
	}
	for _, ft := range st.ftabs {
		if ft.tbl.Len() != 0 {
			t.Errorf("filter %d still holds %d entities", ft.bit, ft.tbl.Len())
		}
	}
	checkInvariants(t, st)
	for i := range st.sets {
		if st.sets[i].buf != nil {
			t.Fatalf("set %d keeps its buffer after its entity left", i)
		}
	}
}

// snapshotBytes is the whole state as bytes, to tell whether anything changed.
func snapshotBytes(st *State) string {
	return string(st.Table().AppendSnapshot(nil)) + string(st.AppendExtras(nil))
}

// TestApplyRefusesAtomically: errors of every kind leave everything unchanged,
// including an overflow only a filtered table would hit (its retained window is
// relative to its own newest event, older than the unfiltered table's).
func TestApplyRefusesAtomically(t *testing.T) {
	ws, _ := window.ParseSpecs("10s:1s")
	spec := Spec{Windows: ws, Filters: 1, Distincts: 1, Features: []Feature{
		{Name: "s", Agg: Sum, Windows: []int{0}, Filter: 0},
		{Name: "d", Agg: DistinctCount, Windows: []int{0}, Filter: -1, Distinct: 0},
	}}
	st, err := NewState(spec, window.Options{})
	if err != nil {
		t.Fatal(err)
	}
	row := NewRow(&spec)
	big := int64(math.MaxInt64/2 + 1)
	must := func(ts, a int64, ext []uint64) {
		t.Helper()
		if _, _, err := st.Apply("e", ts, a, ext, row); err != nil {
			t.Fatal(err)
		}
	}
	must(0, big, []uint64{1 | 1<<32, 7})  // filtered, value 7
	must(15_000, 0, []uint64{1 << 32, 8}) // unfiltered only: filtered newest stays at 0
	before := snapshotBytes(st)
	cases := []struct {
		name string
		ts   int64
		a    int64
		ext  []uint64
		want error
	}{
		// Bucket 9 is retained (> 15−10); the unfiltered window of the newest event
		// holds 0, but the filtered table's own window [0, 9] holds big: overflow.
		{"filtered overflow", 9_000, big, []uint64{1 | 1<<32, 9}, window.ErrOverflow},
		{"expired", 5_000, 1, []uint64{1 | 1<<32, 9}, window.ErrExpired},
		{"negative amount", 16_000, -1, []uint64{1 | 1<<32, 9}, window.ErrInput},
		{"short ext", 16_000, 1, []uint64{1 | 1<<32}, window.ErrInput},
		{"empty entity", 16_000, 1, []uint64{1}, window.ErrInput},
	}
	for _, c := range cases {
		id := "e"
		if c.name == "empty entity" {
			id = ""
		}
		_, _, err := st.Apply(id, c.ts, c.a, c.ext, row)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
		if snapshotBytes(st) != before {
			t.Fatalf("%s: the refused event changed the state", c.name)
		}
	}
	// The rule's own range for that event, [6, 9], is empty in the filtered table:
	// the same event with a small amount reads sum = its own amount.
	must(9_000, 5, []uint64{1 | 1<<32, 9})
	if row.Values[0] != 5 || row.Values[1] != 2 || !row.Exact[0] { // value 7 (t=0) is before bucket 6
		t.Errorf("after the refusals: s_10s=%d d_10s=%d exact=%v, want 5, 2, true", row.Values[0], row.Values[1], row.Exact[0])
	}
	if _, _, err := st.Apply("e", 1, 1, nil, &Row{}); !errors.Is(err, window.ErrInput) {
		t.Errorf("row of the wrong shape: %v", err)
	}
}

// TestDistinctEstimateError: beyond MaxExact the estimate says exact=false and its
// relative error over many entities stays within the published bound (relative
// standard error ≤ sqrt(2/MaxExact), docs/feature-outputs.md), without bias; at or
// below MaxExact it is exact; once the sampled values leave every window it is exact
// again.
func TestDistinctEstimateError(t *testing.T) {
	ws, _ := window.ParseSpecs("24h:1h,1h:1m")
	for _, m := range []int{16, 64} {
		spec := Spec{Windows: ws, Distincts: 1, Features: []Feature{
			{Name: "d", Agg: DistinctCount, Windows: []int{0, 1}, Filter: -1, Distinct: 0, MaxExact: m},
		}}
		for _, n := range []int{m, m + 1, 3 * m, 640} {
			t.Run(fmt.Sprintf("max=%d/n=%d", m, n), func(t *testing.T) {
				st, err := NewState(spec, window.Options{})
				if err != nil {
					t.Fatal(err)
				}
				row := NewRow(&spec)
				const entities = 1500
				var sum, sum2 float64
				r := rand.New(rand.NewPCG(uint64(n), uint64(m)))
				t0 := int64(1_700_000_000_000)
				for e := range entities {
					id := fmt.Sprint("e", e)
					// n distinct values, each seen 1-3 times, over 20 hours.
					for i := range n {
						h := mix64(uint64(e)<<32 | uint64(i))
						for range 1 + r.IntN(3) {
							ts := t0 + int64(i)*(20*3600_000/int64(n))
							if _, _, err := st.Apply(id, ts, 1, []uint64{1 << 32, h}, row); err != nil {
								t.Fatal(err)
							}
						}
					}
					est := row.Values[0]
					if n <= m {
						if !row.Exact[0] || est != int64(n) {
							t.Fatalf("entity %d: %d values ≤ MaxExact: got %d exact=%v", e, n, est, row.Exact[0])
						}
						continue
					}
					if row.Exact[0] {
						t.Fatalf("entity %d: %d values > MaxExact %d reported exact", e, n, m)
					}
					rel := float64(est-int64(n)) / float64(n)
					sum += rel
					sum2 += rel * rel
				}
				checkInvariants(t, st)
				if n <= m {
					return
				}
				mean, rms := sum/entities, math.Sqrt(sum2/entities)
				bound := math.Sqrt(2 / float64(m))
				t.Logf("MaxExact %d, %d values: relative error mean %+.4f, rms %.4f (bound %.4f)", m, n, mean, rms, bound)
				if rms > bound {
					t.Errorf("rms relative error %.4f above the published bound %.4f", rms, bound)
				}
				if math.Abs(mean) > 4*bound/math.Sqrt(entities) {
					t.Errorf("mean relative error %+.4f: biased", mean)
				}
				// 25 h later only the new value is in the 24 h window: exact again.
				if _, _, err := st.Apply("e0", t0+45*3600_000, 1, []uint64{1 << 32, 42}, row); err != nil {
					t.Fatal(err)
				}
				if !row.Exact[0] || row.Values[0] != 1 || row.Values[1] != 1 {
					t.Errorf("after the values left: d_24h=%d d_1h=%d exact=%v, want 1, 1, true", row.Values[0], row.Values[1], row.Exact[0])
				}
			})
		}
	}
}

// TestApplyAllocs: in steady state Apply allocates nothing, for the definition with
// filters and distinct counts and for one without either.
func TestApplyAllocs(t *testing.T) {
	for _, spec := range []Spec{testSpec(t), defaultLikeSpec(t)} {
		st, err := NewState(spec, window.Options{})
		if err != nil {
			t.Fatal(err)
		}
		row := NewRow(&spec)
		now := int64(1_700_000_000_000)
		ext := []uint64{1 | 1<<2 | 1<<32 | 1<<33, 0, 0}
		step := func(i int) {
			now += 100
			ext[1], ext[2] = mix64(uint64(i%8)), mix64(uint64(i%5))
			if _, _, err := st.Apply("hot", now, int64(i%1000), ext, row); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 20_000 {
			step(i)
		}
		i := 0
		if n := testing.AllocsPerRun(2000, func() { step(i); i++ }); n != 0 {
			t.Errorf("%d features: %.2f allocations per Apply, want 0", len(spec.Features), n)
		}
	}
}

func defaultLikeSpec(t testing.TB) Spec {
	t.Helper()
	ws, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		t.Fatal(err)
	}
	all := []int{0, 1, 2, 3}
	s := Spec{Windows: ws, Features: []Feature{
		{Name: "count", Agg: Count, Windows: all, Filter: -1},
		{Name: "sum", Agg: Sum, Windows: all, Filter: -1},
		{Name: "min", Agg: Min, Windows: all, Filter: -1},
		{Name: "max", Agg: Max, Windows: all, Filter: -1},
	}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}
