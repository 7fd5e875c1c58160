package window

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// errClass names which of the package's errors err wraps ("" for nil).
func errClass(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrExpired):
		return "expired"
	case errors.Is(err, ErrOverflow):
		return "overflow"
	case errors.Is(err, ErrInput):
		return "input"
	case errors.Is(err, ErrNotRetained):
		return "not-retained"
	}
	return "other: " + err.Error()
}

// TestCheckPredictsApply: on streams mixing in-order, older, expired and
// overflowing events (amounts near 2^62 so that two or three fill a window), in both
// the raw and the ring representation, Check's answer is Apply's, and Check changes
// nothing (the snapshot bytes before and after it are equal).
func TestCheckPredictsApply(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 99))
			tbl := mustTable(t, "10s:1s,1m:10s,5m:1m", Options{})
			out := make([]Agg, 3)
			now := int64(1_000_000)
			ids := []string{"a", "b", "c"}
			seen := map[string]int{}
			for range 4000 {
				id := ids[r.IntN(len(ids))]
				now += int64(r.IntN(3000))
				ts := now
				switch r.IntN(4) {
				case 0:
					ts -= int64(r.IntN(400_000)) // older, sometimes expired
				case 1:
					ts -= int64(r.IntN(20_000))
				}
				a := int64(r.IntN(1000))
				switch r.IntN(60) {
				case 0:
					a = math.MaxInt64/2 - int64(r.IntN(1000))
				case 1:
					a = -1
				}
				before := tbl.AppendSnapshot(nil)
				want := tbl.Check(id, ts, a)
				if after := tbl.AppendSnapshot(nil); string(after) != string(before) {
					t.Fatal("Check changed the table")
				}
				_, _, got := tbl.Apply(id, ts, a, out)
				if errClass(got) != errClass(want) {
					t.Fatalf("entity %s t=%d a=%d: Check said %q, Apply %q", id, ts, a, errClass(want), errClass(got))
				}
				seen[errClass(got)]++
			}
			for _, c := range []string{"", "expired", "overflow", "input"} {
				if seen[c] == 0 {
					t.Errorf("stream produced no %q outcome; the test would not notice a wrong Check for it", c)
				}
			}
		})
	}
}

// TestReadClippedMatchesRule: ReadClipped against a brute-force reading of the rule
// (buckets max(k, K)−N+1 … k over every event ever counted, K = floor(top/b)) for
// tops at and after the entity's newest event, in-order and older event times, raw
// and ring entities.
func TestReadClippedMatchesRule(t *testing.T) {
	specs, err := ParseSpecs("10s:1s,1m:10s,5m:1m")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(11, 12))
	for _, events := range []int{1, 5, 31, 200} { // raw up to 32, rings beyond
		tbl, err := NewTable(specs, Options{})
		if err != nil {
			t.Fatal(err)
		}
		out := make([]Agg, 3)
		var evs []rawEvent
		now := int64(5_000_000)
		for range events {
			now += int64(r.IntN(4000))
			a := int64(r.IntN(100))
			if _, _, err := tbl.Apply("e", now, a, out); err != nil {
				t.Fatal(err)
			}
			evs = append(evs, rawEvent{now, a})
		}
		for range 500 {
			top := now + int64(r.IntN(3))*int64(r.IntN(40_000))
			ts := top - int64(r.IntN(200_000)) + 100_000
			known, err := tbl.ReadClipped("e", ts, top, out)
			if err != nil || !known {
				t.Fatalf("ReadClipped(%d, %d): known=%v err=%v", ts, top, known, err)
			}
			for i, sp := range specs {
				k := bucketOf(ts, sp.BucketMs)
				lo := max(k, bucketOf(top, sp.BucketMs)) - int64(sp.Buckets) + 1
				var want Agg
				for _, ev := range evs {
					if kb := bucketOf(ev.t, sp.BucketMs); kb >= lo && kb <= k {
						want = want.plus(ev.a)
					}
				}
				if out[i] != want {
					t.Fatalf("%d events, t=%d top=%d window %s: got %+v, want %+v", events, ts, top, sp.Name, out[i], want)
				}
			}
		}
		// A top before the newest event's bucket cannot be answered exactly.
		if _, err := tbl.ReadClipped("e", now, now-1_000_000, out); !errors.Is(err, ErrNotRetained) {
			t.Errorf("top before newest: err=%v, want ErrNotRetained", err)
		}
		if known, err := tbl.ReadClipped("nobody", now, now, out); known || err != nil || out[0] != (Agg{}) {
			t.Errorf("unknown entity: known=%v err=%v out=%+v", known, err, out[0])
		}
	}
}

// TestEvictHook: the hook sees exactly the entities the table removes (cap, idle,
// Evict), with the slot Lookup reported for them, and not header shrinks.
func TestEvictHook(t *testing.T) {
	type ev struct {
		id   string
		slot int
	}
	tbl := mustTable(t, "1m:1s", Options{MaxEntities: 2, HistoryTTLMs: 3_600_000})
	var got []ev
	tbl.SetEvictHook(func(id string, slot int) {
		if _, _, ok := tbl.Lookup(id); !ok {
			t.Errorf("hook for %q called after the entity left the index", id)
		}
		got = append(got, ev{id, slot})
	})
	out := make([]Agg, 1)
	apply := func(id string, ts int64) {
		t.Helper()
		if _, _, err := tbl.Apply(id, ts, 1, out); err != nil {
			t.Fatal(err)
		}
	}
	slotOf := func(id string) int {
		t.Helper()
		s, _, ok := tbl.Lookup(id)
		if !ok {
			t.Fatalf("%q not held", id)
		}
		if sid, _, ok := tbl.SlotEntity(s); !ok || sid != id {
			t.Fatalf("SlotEntity(%d) = %q, %v; want %q", s, sid, ok, id)
		}
		return s
	}
	apply("a", 1000)
	apply("b", 2000)
	sa := slotOf("a")
	apply("c", 3000) // cap: evicts a, the least recently active
	if want := []ev{{"a", sa}}; !slices.Equal(got, want) {
		t.Fatalf("cap eviction: hook saw %v, want %v", got, want)
	}
	if sc := slotOf("c"); sc != sa {
		t.Errorf("new entity took slot %d, want the freed slot %d", sc, sa)
	}
	got = nil
	// Windows empty but history recent: shrunk to headers, no hook.
	if n := tbl.EvictIdle(200_000); n != 0 || len(got) != 0 {
		t.Fatalf("shrink: evicted %d, hook saw %v", n, got)
	}
	sb := slotOf("b")
	if !tbl.Evict("b") || tbl.Evict("b") {
		t.Fatal("Evict: want true then false")
	}
	if want := []ev{{"b", sb}}; !slices.Equal(got, want) {
		t.Fatalf("Evict: hook saw %v, want %v", got, want)
	}
	got = nil
	sc := slotOf("c")
	if n := tbl.EvictIdle(10_000_000); n != 1 {
		t.Fatalf("idle eviction: evicted %d, want 1", n)
	}
	if want := []ev{{"c", sc}}; !slices.Equal(got, want) {
		t.Fatalf("idle eviction: hook saw %v, want %v", got, want)
	}
	if tbl.Len() != 0 {
		t.Errorf("table holds %d entities, want 0", tbl.Len())
	}
	if _, _, ok := tbl.SlotEntity(sc); ok {
		t.Error("SlotEntity of a freed slot reports an entity")
	}
	if _, _, ok := tbl.SlotEntity(-1); ok {
		t.Error("SlotEntity(-1) reports an entity")
	}
	tbl.SetEvictHook(nil)
	apply("d", 20_000_000)
	if !tbl.Evict("d") {
		t.Error("Evict without a hook")
	}
}
