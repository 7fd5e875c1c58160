package window

import (
	"cmp"
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

func mustTable(t testing.TB, specs string, opts Options) *Table {
	t.Helper()
	sp, err := ParseSpecs(specs)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := NewTable(sp, opts)
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// currentOf returns the entity's aggregates relative to its newest event.
func currentOf(t testing.TB, tbl *Table, id string) []Agg {
	t.Helper()
	var got []Agg
	tbl.Range(func(e string, _ int64, aggs []Agg) bool {
		if e == id {
			got = slices.Clone(aggs)
			return false
		}
		return true
	})
	if got == nil {
		t.Fatalf("entity %q not in table", id)
	}
	return got
}

// makeBusy pushes an entity past the raw→ring switch so the ring code is under test.
func makeBusy(t testing.TB, tbl *Table, id string, at int64) {
	t.Helper()
	out := make([]Agg, len(tbl.specs))
	for range rawMax + 5 {
		if _, _, err := tbl.Apply(id, at, 0, out); err != nil {
			t.Fatal(err)
		}
	}
	if e := &tbl.slab[tbl.slotOf(id)]; e.rings == nil {
		t.Fatalf("entity %q still raw after %d events", id, rawMax+5)
	}
}

// TestExamplesTable replays the worked example's counted events (docs/contract.md) in release order.
func TestExamplesTable(t *testing.T) {
	tbl := mustTable(t, "10s:1s,1m:10s", Options{})
	T := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	type row struct {
		id       string
		entity   string
		amount   int64
		at       int64
		w10, w1m Agg
		gap      int64
		hasPrev  bool
	}
	rows := []row{
		{"e1", "card-A", 1000, 0, Agg{1, 1000, 1000, 1000}, Agg{1, 1000, 1000, 1000}, 0, false},
		{"e2", "card-A", 2500, 400, Agg{2, 3500, 1000, 2500}, Agg{2, 3500, 1000, 2500}, 400, true},
		{"e3", "card-B", 700, 900, Agg{1, 700, 700, 700}, Agg{1, 700, 700, 700}, 0, false},
		{"e4", "card-A", 300, 1500, Agg{3, 3800, 300, 2500}, Agg{3, 3800, 300, 2500}, 1100, true},
		{"e6", "card-A", 100, 1900, Agg{4, 3900, 100, 2500}, Agg{4, 3900, 100, 2500}, 400, true},
		{"e5", "card-A", 5000, 3200, Agg{5, 8900, 100, 5000}, Agg{5, 8900, 100, 5000}, 1300, true},
		{"e10", "card-A", 40, 3200, Agg{6, 8940, 40, 5000}, Agg{6, 8940, 40, 5000}, 0, true},
		{"e11", "card-A", 60, 11000, Agg{3, 5100, 40, 5000}, Agg{7, 9000, 40, 5000}, 7800, true},
		{"e12", "card-B", 80, 75000, Agg{1, 80, 80, 80}, Agg{1, 80, 80, 80}, 74100, true},
	}
	out := make([]Agg, 2)
	for _, r := range rows {
		if r.id == "e12" {
			// card-B's windows are empty long before e12: it must survive as a header
			// so ms_since_previous is still 74 100 (TTL is 7 days).
			if n := tbl.EvictIdle(T + 74000); n != 0 {
				t.Fatalf("EvictIdle evicted %d entities within the history TTL", n)
			}
			if e := &tbl.slab[tbl.slotOf("card-B")]; e.raw != nil || e.rings != nil {
				t.Fatalf("idle card-B kept its buckets: %+v", e)
			}
		}
		gap, hasPrev, err := tbl.Apply(r.entity, T+r.at, r.amount, out)
		if err != nil {
			t.Fatalf("%s: %v", r.id, err)
		}
		if out[0] != r.w10 || out[1] != r.w1m || gap != r.gap || hasPrev != r.hasPrev {
			t.Errorf("%s: got %v %v gap %d prev %v; want %v %v gap %d prev %v", r.id, out[0], out[1], gap, hasPrev, r.w10, r.w1m, r.gap, r.hasPrev)
		}
	}
}

// Lesson 1: a late event older than the window reused a live bucket's ring slot and
// overwrote it (count 1 / sum 5 instead of count 1 / sum 100).
func TestLesson1LateEventNeverOverwritesLiveBucket(t *testing.T) {
	for _, busy := range []bool{false, true} {
		name := "raw"
		if busy {
			name = "rings"
		}
		t.Run(name, func(t *testing.T) {
			tbl := mustTable(t, "5m:5s", Options{})
			const live = 1_800_000_000_000 // bucket k
			if busy {
				makeBusy(t, tbl, "card", live-200_000)
			}
			out := make([]Agg, 1)
			if _, _, err := tbl.Apply("card", live, 100, out); err != nil {
				t.Fatal(err)
			}
			before := currentOf(t, tbl, "card")
			// Exactly one window (N=60 buckets of 5 s) earlier: same slot in a dense
			// ring of 60, bucket k−60, outside the window.
			_, _, err := tbl.Apply("card", live-300_000, 5, out)
			if !errors.Is(err, ErrExpired) {
				t.Fatalf("late event beyond the window: err %v, want ErrExpired", err)
			}
			if after := currentOf(t, tbl, "card"); !slices.Equal(after, before) {
				t.Fatalf("rejected late event changed state: %v → %v", before, after)
			}
			// A late event still inside the window lands in its own bucket k−59 and
			// leaves the live bucket alone.
			if _, _, err := tbl.Apply("card", live-295_000, 5, out); err != nil {
				t.Fatal(err)
			}
			if out[0] != (Agg{1, 5, 5, 5}) {
				t.Fatalf("late event read back %v, want only itself (bucket k−59 alone)", out[0])
			}
			if _, _, err := tbl.Apply("card", live, 0, out); err != nil {
				t.Fatal(err)
			}
			want := Agg{Count: before[0].Count + 2, Sum: before[0].Sum + 5, Min: 0, Max: 100}
			if out[0] != want {
				t.Fatalf("live window after late event = %v, want %v", out[0], want)
			}
		})
	}
}

// Lesson 2: float running sums drifted (29 000 became 28 999.999 998 8 after 1 M
// adds/subtracts). Here every read over 1 M events must equal an independent
// integer sum exactly.
func TestLesson2ExactSumsAfterMillionAddsAndSubtracts(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	tbl := mustTable(t, "10s:10ms", Options{}) // N = 1000, one event per bucket
	amount := func(i int) int64 { return int64(1 + (i*7919)%57) }
	prefix := make([]int64, n+1)
	for i := range n {
		prefix[i+1] = prefix[i] + amount(i)
	}
	out := make([]Agg, 1)
	for i := range n {
		if _, _, err := tbl.Apply("card", int64(i)*10, amount(i), out); err != nil {
			t.Fatal(err)
		}
		lo := max(0, i-999)
		if want := prefix[i+1] - prefix[lo]; out[0].Sum != want || out[0].Count != int64(i-lo+1) {
			t.Fatalf("event %d: count %d sum %d, want %d %d", i, out[0].Count, out[0].Sum, i-lo+1, want)
		}
	}
	// The seed's own numbers: a window that should hold exactly 29 000.
	tbl = mustTable(t, "10s:10ms", Options{})
	for i := range n {
		if _, _, err := tbl.Apply("card", int64(i)*10, 29, out); err != nil {
			t.Fatal(err)
		}
	}
	if out[0].Sum != 29_000 || out[0].Count != 1000 {
		t.Fatalf("after %d slides: %v, want count 1000 sum 29000", n, out[0])
	}
}

// Lesson 3: the seed's windows held N−1 buckets: a 300 s window of 5 s buckets counted
// 295 000 of the 300 000 events of the last 300 s.
func TestLesson3WindowHoldsAllNBuckets(t *testing.T) {
	tbl := mustTable(t, "5m:5s", Options{})
	const t0 = 1_800_000_000_000 // a multiple of 5 s
	out := make([]Agg, 1)
	// One event just before the window, which must not count.
	if _, _, err := tbl.Apply("card", t0-1, 1000, out); err != nil {
		t.Fatal(err)
	}
	for i := range int64(300_000) {
		if _, _, err := tbl.Apply("card", t0+i, 1, out); err != nil {
			t.Fatal(err)
		}
	}
	if want := (Agg{300_000, 300_000, 1, 1}); out[0] != want {
		t.Fatalf("last event's window = %v, want %v", out[0], want)
	}
}

func TestOverflowIsAnErrorAndChangesNothing(t *testing.T) {
	for _, busy := range []bool{false, true} {
		tbl := mustTable(t, "10s:1s,1m:10s", Options{})
		if busy {
			makeBusy(t, tbl, "card", 0)
		}
		out := make([]Agg, 2)
		if _, _, err := tbl.Apply("card", 1000, math.MaxInt64-10, out); err != nil {
			t.Fatal(err)
		}
		before := currentOf(t, tbl, "card")
		for _, at := range []int64{1000, 2000, 500} { // same bucket, new bucket, older
			if _, _, err := tbl.Apply("card", at, 11, out); !errors.Is(err, ErrOverflow) {
				t.Fatalf("busy=%v at %d: err %v, want ErrOverflow", busy, at, err)
			}
			if after := currentOf(t, tbl, "card"); !slices.Equal(after, before) {
				t.Fatalf("busy=%v: overflowing event changed state %v → %v", busy, before, after)
			}
		}
		if _, _, err := tbl.Apply("card", 2000, 10, out); err != nil || out[1].Sum != math.MaxInt64 {
			t.Fatalf("busy=%v: exact fit: %v %v", busy, out, err)
		}
		// Once the huge amount has left every window, room is back: the exact check
		// after expiry must not refuse what the quick check cannot prove.
		if _, _, err := tbl.Apply("card", 200_000, 100, out); err != nil || out[1] != (Agg{1, 100, 100, 100}) {
			t.Fatalf("busy=%v: after expiry: %v %v", busy, out, err)
		}
	}
}

func TestApplyRejectsBadInput(t *testing.T) {
	tbl := mustTable(t, "10s:1s,1m:10s", Options{})
	out := make([]Agg, 2)
	tests := []struct {
		name   string
		entity string
		at, a  int64
		out    []Agg
	}{
		{"negative amount", "card", 0, -1, out},
		{"empty entity", "", 0, 1, out},
		{"short out", "card", 0, 1, out[:1]},
		{"time beyond range", "card", 1<<62 + 1, 1, out},
		{"time before range", "card", -(1 << 62) - 1, 1, out},
	}
	for _, tc := range tests {
		if _, _, err := tbl.Apply(tc.entity, tc.at, tc.a, tc.out); !errors.Is(err, ErrInput) {
			t.Errorf("%s: err %v, want ErrInput", tc.name, err)
		}
	}
	if tbl.Len() != 0 {
		t.Fatalf("rejected input created %d entities", tbl.Len())
	}
}

func TestNegativeTimesUseFloorBuckets(t *testing.T) {
	tbl := mustTable(t, "2s:1s", Options{})
	out := make([]Agg, 1)
	for _, ev := range []struct{ at, a int64 }{{-2500, 1}, {-1500, 10}, {-1, 100}, {0, 1000}} {
		if _, _, err := tbl.Apply("card", ev.at, ev.a, out); err != nil {
			t.Fatal(err)
		}
	}
	// Buckets −1 (−1000..−1) and 0: −1 and 0 count, −1500 (bucket −2) does not.
	if want := (Agg{2, 1100, 100, 1000}); out[0] != want {
		t.Fatalf("got %v, want %v", out[0], want)
	}
}

func TestOlderEventReadsBackOnlyUpToItsBucket(t *testing.T) {
	for _, busy := range []bool{false, true} {
		tbl := mustTable(t, "10s:1s", Options{})
		if busy {
			makeBusy(t, tbl, "card", 0)
		}
		out := make([]Agg, 1)
		for _, at := range []int64{3000, 5000, 12000} {
			if _, _, err := tbl.Apply("card", at, 7, out); err != nil {
				t.Fatal(err)
			}
		}
		// At 4 500 (bucket 4): retained from K−N+1 = 3, so buckets 3..4: the 3 000 event
		// and itself; not the newer 5 000 and 12 000 events, not the busy events at 0.
		gap, hasPrev, err := tbl.Apply("card", 4500, 1, out)
		if err != nil || out[0] != (Agg{2, 8, 1, 7}) || gap != -7500 || !hasPrev {
			t.Fatalf("busy=%v: older read-back %v gap %d %v %v", busy, out[0], gap, hasPrev, err)
		}
		// Bucket 2 is not retained (K−N = 2): rejected.
		if _, _, err := tbl.Apply("card", 2999, 1, out); !errors.Is(err, ErrExpired) {
			t.Fatalf("busy=%v: err %v, want ErrExpired", busy, err)
		}
		if got := currentOf(t, tbl, "card")[0]; got != (Agg{4, 22, 1, 7}) {
			t.Fatalf("busy=%v: current %v", busy, got)
		}
	}
}

func TestEvictIdle(t *testing.T) {
	const hour = 3600_000
	tests := []struct {
		name        string
		ttl         int64
		lastAt      int64
		wm          int64
		wantEvicted int
		wantShrunk  bool
	}{
		{"window still holds it", 0, 0, 23 * hour, 0, false},
		{"empty but within TTL is shrunk", 0, 0, 25 * hour, 0, true},
		{"empty and past TTL is evicted", 2 * 24 * hour, 0, 49 * hour, 1, false},
		{"not empty although past TTL", 1, 0, 20 * hour, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tbl := mustTable(t, DefaultSpecs, Options{HistoryTTLMs: tc.ttl})
			out := make([]Agg, 4)
			makeBusy(t, tbl, "busy", tc.lastAt)
			if _, _, err := tbl.Apply("quiet", tc.lastAt, 5, out); err != nil {
				t.Fatal(err)
			}
			if got := tbl.EvictIdle(tc.wm); got != 2*tc.wantEvicted {
				t.Fatalf("evicted %d, want %d", got, 2*tc.wantEvicted)
			}
			if tbl.Len() != 2-2*tc.wantEvicted {
				t.Fatalf("Len %d after eviction", tbl.Len())
			}
			if tc.wantEvicted > 0 {
				if _, hasPrev, _ := tbl.Apply("quiet", tc.wm, 1, out); hasPrev {
					t.Fatal("evicted entity still reports a previous event")
				}
				return
			}
			for _, id := range []string{"busy", "quiet"} {
				e := &tbl.slab[tbl.slotOf(id)]
				if shrunk := e.raw == nil && e.rings == nil; shrunk != tc.wantShrunk {
					t.Fatalf("%s: shrunk=%v, want %v", id, shrunk, tc.wantShrunk)
				}
			}
			// Kept or not, a previous event more than the TTL back is not reported.
			ttl := cmp.Or(tc.ttl, defaultHistoryTTLMs)
			wantPrev := tc.wm-tc.lastAt <= ttl
			gap, hasPrev, err := tbl.Apply("quiet", tc.wm, 1, out)
			if err != nil || hasPrev != wantPrev || wantPrev && gap != tc.wm-tc.lastAt {
				t.Fatalf("gap %d %v %v, want previous event %v", gap, hasPrev, err, wantPrev)
			}
		})
	}
}

func TestMaxEntitiesEvictsLeastRecentlyActive(t *testing.T) {
	tbl := mustTable(t, "10s:1s", Options{MaxEntities: 2})
	out := make([]Agg, 1)
	apply := func(id string, at int64) bool {
		_, hasPrev, err := tbl.Apply(id, at, 1, out)
		if err != nil {
			t.Fatal(err)
		}
		return hasPrev
	}
	apply("A", 0)
	apply("B", 1)
	apply("A", 2) // B is now least recently active
	// A failed apply is not activity: it must not save A from eviction... nor B.
	if _, _, err := tbl.Apply("B", -100_000, 1, out); !errors.Is(err, ErrExpired) {
		t.Fatalf("err %v", err)
	}
	apply("C", 3)
	if tbl.Len() != 2 || tbl.CapEvictions() != 1 {
		t.Fatalf("Len %d CapEvictions %d, want 2 1", tbl.Len(), tbl.CapEvictions())
	}
	if !apply("A", 4) {
		t.Fatal("A was evicted; B was the least recently active")
	}
	if apply("B", 5) { // recreated: no history; evicts C
		t.Fatal("B kept history after eviction")
	}
	if tbl.CapEvictions() != 2 || tbl.Len() != 2 {
		t.Fatalf("CapEvictions %d Len %d", tbl.CapEvictions(), tbl.Len())
	}
	if apply("C", 6) {
		t.Fatal("C should have been the one evicted for B")
	}
}

func TestRangeStopsAndSpecsIsACopy(t *testing.T) {
	tbl := mustTable(t, "10s:1s", Options{})
	out := make([]Agg, 1)
	for _, id := range []string{"b", "a", "c"} {
		if _, _, err := tbl.Apply(id, 0, 1, out); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	tbl.Range(func(id string, _ int64, _ []Agg) bool { ids = append(ids, id); return len(ids) < 2 })
	if !slices.Equal(ids, []string{"a", "b"}) {
		t.Fatalf("Range visited %v, want [a b] in id order", ids)
	}
	sp := tbl.Specs()
	sp[0].BucketMs = 7
	if tbl.Specs()[0].BucketMs != 1000 {
		t.Fatal("Specs exposes internal state")
	}
}

// TestApplyDoesNotAllocateInSteadyState: once an entity exists and its storage has
// reached the size its activity needs, counting an event allocates nothing (the
// hot-path target), in both the raw-list and the ring shape.
func TestApplyDoesNotAllocateInSteadyState(t *testing.T) {
	for _, tc := range []struct {
		name string
		step int64 // event-time distance: 2 h keeps ~12 raw events, 100 ms means rings
	}{{"raw list", 2 * 3600_000}, {"rings", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := mustTable(t, DefaultSpecs, Options{})
			out := make([]Agg, 4)
			now := int64(1_800_000_000_000)
			for range 3 * 86_400_000 / tc.step { // three days: every window full, storage settled
				now += tc.step
				if _, _, err := tbl.Apply("card", now, now%1000, out); err != nil {
					t.Fatal(err)
				}
			}
			if isRings := tbl.slab[tbl.slotOf("card")].rings != nil; isRings != (tc.step < 1000) {
				t.Fatalf("entity shape rings=%v, not the one under test", isRings)
			}
			allocs := testing.AllocsPerRun(1000, func() {
				now += tc.step
				if _, _, err := tbl.Apply("card", now, now%1000, out); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Fatalf("%v allocations per event, want 0", allocs)
			}
		})
	}
}
