package feature

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// eightFeatureSpec is the benchmark definition: 8 features over the default windows,
// two filters (bit 0 "declined", bit 1 "card not present") and two distinct counts
// (slot 0 merchant, slot 1 merchant category), one of them filtered.
func eightFeatureSpec(t testing.TB) Spec {
	t.Helper()
	ws, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		t.Fatal(err)
	}
	all := []int{0, 1, 2, 3}
	s := Spec{Windows: ws, Filters: 2, Distincts: 2, Features: []Feature{
		{Name: "tx_count", Agg: Count, Windows: all, Filter: -1},
		{Name: "tx_sum", Agg: Sum, Windows: all, Filter: -1},
		{Name: "tx_max", Agg: Max, Windows: []int{2, 3}, Filter: -1},
		{Name: "tx_min", Agg: Min, Windows: []int{3}, Filter: -1},
		{Name: "declines", Agg: Count, Windows: []int{0, 1, 2}, Filter: 0},
		{Name: "cnp_count", Agg: Count, Windows: []int{2}, Filter: 1},
		{Name: "merchants", Agg: DistinctCount, Windows: []int{2, 3}, Filter: -1, Distinct: 0},
		{Name: "declined_mcc", Agg: DistinctCount, Windows: []int{3}, Filter: 0, Distinct: 1},
	}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}

// benchStream is a pre-generated event stream: entities drawn with a skew (a tenth
// of them get half the events), time advancing by step per event, ext words with
// declines 1 in 10, card-not-present 1 in 3, a merchant out of 20 per entity and a
// category out of 8.
type benchStream struct {
	ids  []string
	ent  []uint32
	amt  []int64
	ext  [][3]uint64
	step int64
}

func newBenchStream(entities, n int, step int64) *benchStream {
	r := rand.New(rand.NewPCG(42, 42))
	s := &benchStream{step: step}
	for i := range entities {
		s.ids = append(s.ids, fmt.Sprintf("card-%07d", i))
	}
	for range n {
		e := uint32(r.IntN(entities))
		if r.IntN(2) == 0 {
			e = uint32(r.IntN(max(1, entities/10)))
		}
		var e0 uint64 = 1<<32 | 1<<33
		if r.IntN(10) == 0 {
			e0 |= 1
		}
		if r.IntN(3) == 0 {
			e0 |= 2
		}
		s.ent = append(s.ent, e)
		s.amt = append(s.amt, int64(r.IntN(100_000)))
		s.ext = append(s.ext, [3]uint64{e0, mix64(uint64(e)<<8 | uint64(r.IntN(20))), mix64(1<<40 | uint64(r.IntN(8)))})
	}
	return s
}

// threadNanos is the calling OS thread's CPU time (CLOCK_THREAD_CPUTIME_ID, ns
// resolution): with the goroutine locked to its thread it times a chunk of work
// without the time the shared machine kept it descheduled.
func threadNanos() int64 {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// BenchmarkApply compares, in the same run and interleaved in chunks of 4096 events
// so that the shared machine's noise hits both alike, window.Table.Apply (today's
// unfiltered path) with State.Apply for the default-like definition (count, sum,
// min, max over the default windows: the table plus filling the row) and for the
// 8-feature definition. Reported: CPU ns per event of each (chunks timed
// separately, in CPU time of the benchmark's thread) and their ratio. One op = one event on each of the two.
func BenchmarkApply(b *testing.B) {
	for _, c := range []struct {
		name     string
		entities int
		step     int64
	}{
		{"hot-1-entity", 1, 10},
		{"10k-entities", 10_000, 100},
		{"200k-entities", 200_000, 10},
	} {
		for _, def := range []string{"default-like", "8-features"} {
			b.Run(c.name+"/"+def, func(b *testing.B) {
				var spec Spec
				if def == "default-like" {
					spec = defaultLikeSpec(b)
				} else {
					spec = eightFeatureSpec(b)
				}
				st, err := NewState(spec, window.Options{})
				if err != nil {
					b.Fatal(err)
				}
				tbl, err := window.NewTable(spec.Windows, window.Options{})
				if err != nil {
					b.Fatal(err)
				}
				const chunk = 4096
				s := newBenchStream(c.entities, 1<<16, c.step)
				row := NewRow(&spec)
				out := make([]window.Agg, len(spec.Windows))
				now := int64(1_800_000_000_000)
				tNow := now
				pos, tPos := 0, 0
				runState := func(n int) {
					for range n {
						i := pos & (len(s.ent) - 1)
						pos++
						now += s.step
						ext := s.ext[i][:]
						if _, _, err := st.Apply(s.ids[s.ent[i]], now, s.amt[i], ext, row); err != nil {
							b.Fatal(err)
						}
					}
				}
				runTable := func(n int) {
					for range n {
						i := tPos & (len(s.ent) - 1)
						tPos++
						tNow += s.step
						if _, _, err := tbl.Apply(s.ids[s.ent[i]], tNow, s.amt[i], out); err != nil {
							b.Fatal(err)
						}
					}
				}
				// Warm up: a day of history per entity at this rate, or 2 M events.
				warm := min(int(86_400_000/c.step), 2_000_000)
				runState(warm)
				runTable(warm)
				b.ReportAllocs()
				b.ResetTimer()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var stateNs, tableNs int64
				cpu0 := cpuclock.Nanos()
				for done := 0; done < b.N; {
					n := min(chunk, b.N-done)
					t0 := threadNanos()
					runTable(n)
					t1 := threadNanos()
					runState(n)
					stateNs += threadNanos() - t1
					tableNs += t1 - t0
					done += n
				}
				b.StopTimer()
				b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(tableNs)/float64(b.N), "table-cpu-ns/event")
				b.ReportMetric(float64(stateNs)/float64(b.N), "state-cpu-ns/event")
				b.ReportMetric(float64(stateNs)/float64(tableNs), "state/table")
			})
		}
	}
}

// BenchmarkAppendRow: encoding one 8-feature output record.
func BenchmarkAppendRow(b *testing.B) {
	spec := eightFeatureSpec(b)
	h, row := randomRow(rand.New(rand.NewPCG(1, 1)), &spec)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendRow(buf[:0], &spec, h, row)
	}
	b.SetBytes(int64(len(buf)))
}

// heapPer builds what build builds and returns the heap it holds per entity
// (runtime.MemStats.HeapAlloc after GC, before and after).
func heapPer(entities int, build func() any) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	keep := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(keep)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(entities)
}

// TestMemoryPerEntity measures heap bytes per entity (20 000 entities) for the
// unfiltered table alone and the State with the same events, for:
//   - the default-like definition, 3 events per entity over 3 hours (a typical card);
//   - the 8-feature definition, 3 events and 30 events per entity;
//   - a distinct count over 24 h (default windows) of an entity with 64 distinct
//     values in 64 events over 16 hours: the target is exact and ≤ 1 KiB for the
//     distinct count (State minus table).
//
// Run with -v to see the figures (docs/feature-outputs.md quotes them).
func TestMemoryPerEntity(t *testing.T) {
	const entities = 20_000
	ws, _ := window.ParseSpecs(window.DefaultSpecs)
	distinct24h := Spec{Windows: ws, Distincts: 1, Features: []Feature{
		{Name: "merchants", Agg: DistinctCount, Windows: []int{3}, Filter: -1, Distinct: 0},
	}}
	cases := []struct {
		name     string
		spec     Spec
		events   int
		step     int64
		distinct int // values per entity (slot 0), cycling
	}{
		{"default-like, 3 events", defaultLikeSpec(t), 3, 3_600_000, 3},
		{"8 features, 3 events", eightFeatureSpec(t), 3, 3_600_000, 3},
		{"8 features, 30 events", eightFeatureSpec(t), 30, 1_800_000, 20},
		{"distinct 24h, 64 values", distinct24h, 64, 900_000, 64},
	}
	ids := make([]string, entities)
	for i := range ids {
		ids[i] = fmt.Sprintf("card-%07d", i)
	}
	for _, c := range cases {
		feed := func(apply func(id string, ts, a int64, ext []uint64)) {
			ext := make([]uint64, 3)
			for i, id := range ids {
				base := int64(1_800_000_000_000) + int64(i%1000)
				for k := range c.events {
					ext[0] = 1<<32 | 1<<33
					if k%10 == 0 {
						ext[0] |= 1
					}
					if k%3 == 0 {
						ext[0] |= 2
					}
					ext[1] = mix64(uint64(i)<<16 | uint64(k%c.distinct))
					ext[2] = mix64(uint64(k % 8))
					apply(id, base+int64(k)*c.step, int64(k%997), ext)
				}
			}
		}
		var last *State
		stateB := heapPer(entities, func() any {
			st, err := NewState(c.spec, window.Options{})
			if err != nil {
				t.Fatal(err)
			}
			row := NewRow(&c.spec)
			feed(func(id string, ts, a int64, ext []uint64) {
				if _, _, err := st.Apply(id, ts, a, ext, row); err != nil {
					t.Fatal(err)
				}
			})
			last = st
			return st
		})
		tableB := heapPer(entities, func() any {
			tbl, _ := window.NewTable(c.spec.Windows, window.Options{})
			out := make([]window.Agg, len(c.spec.Windows))
			feed(func(id string, ts, a int64, ext []uint64) {
				if _, _, err := tbl.Apply(id, ts, a, out); err != nil {
					t.Fatal(err)
				}
			})
			return tbl
		})
		t.Logf("%-26s table %6.0f B/entity, state %6.0f B/entity, definition's own %6.0f B/entity", c.name, tableB, stateB, stateB-tableB)
		if c.distinct == 64 {
			row := NewRow(&c.spec)
			if _, _, err := last.ReadAt(ids[0], 1_800_000_000_000+63*c.step, row); err != nil {
				t.Fatal(err)
			}
			if !row.Exact[0] || row.Values[0] != 64 {
				t.Errorf("64 values: merchants_24h=%d exact=%v, want 64 exact", row.Values[0], row.Exact[0])
			}
			if own := stateB - tableB; own > 1024 {
				t.Errorf("distinct count over 24 h of 64 values: %.0f B/entity, target ≤ 1024", own)
			}
		}
	}
}

// BenchmarkExtras: AppendExtras (at once: a pause of the partition), BeginExtras and
// Step (in steps) and Restore of a 100 000-entity State of the 8-feature definition
// (about 10 events per entity over a day).
func BenchmarkExtras(b *testing.B) {
	spec := eightFeatureSpec(b)
	st, err := NewState(spec, window.Options{})
	if err != nil {
		b.Fatal(err)
	}
	s := newBenchStream(100_000, 1<<20, 86_400)
	row := NewRow(&spec)
	now := int64(1_800_000_000_000)
	for i := range s.ent {
		now += s.step
		if _, _, err := st.Apply(s.ids[s.ent[i]], now, s.amt[i], s.ext[i][:], row); err != nil {
			b.Fatal(err)
		}
	}
	tb := st.Table().AppendSnapshot(nil)
	var ex []byte
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ex = st.AppendExtras(ex[:0])
		}
		b.ReportMetric(float64(len(ex)), "bytes")
		b.ReportMetric(float64(len(ex))/float64(st.Table().Len()), "bytes/entity")
	})
	// In steps: BeginExtras is the one pause that grows with the table (a scan of
	// the sets for empty ones); each Step(256) is a bounded share.
	b.Run("begin", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ps := st.BeginExtras()
			b.StopTimer()
			ps.Step(math.MaxInt)
			st.EndExtras(ps)
			b.StartTimer()
		}
	})
	b.Run("step-256", func(b *testing.B) {
		ps := st.BeginExtras()
		steps := 0
		b.ReportAllocs()
		for b.Loop() {
			if ps.Step(256) {
				st.EndExtras(ps)
				ps = st.BeginExtras()
			}
			steps++
		}
		st.EndExtras(ps)
	})
	b.Run("restore", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			base, err := window.RestoreTable(spec.Windows, window.Options{}, tb)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := Restore(spec, window.Options{}, base, ex); err != nil {
				b.Fatal(err)
			}
		}
	})
}
