package watermark

import (
	"fmt"
	"testing"
)

// TestMaxDedupeIDs: past the cap the oldest accepted ids are forgotten first (a
// duplicate of one is accepted as new), the newest are still caught, the count and
// the evictions are reported, and a snapshot restored under a smaller cap drops its
// oldest ids the same way.
func TestMaxDedupeIDs(t *testing.T) {
	cfg := Config{AllowedLateness: 1000, MaxDedupeIDs: 3}
	s := mustNew(t, cfg)
	offer := func(id string, at int64) Verdict {
		return s.Offer(Event{EventID: id, EntityID: "e", EventTime: at, Offset: at})
	}
	for i, id := range []string{"a", "b", "c", "d"} {
		if v := offer(id, int64(100+i)); v != Accepted {
			t.Fatalf("%s: %v", id, v)
		}
	}
	if n, ev := s.DedupeIDs(), s.DedupeCapEvictions(); n != 3 || ev != 1 {
		t.Fatalf("DedupeIDs %d, evictions %d; want 3 and 1", n, ev)
	}
	if v := offer("d", 110); v != Duplicate {
		t.Fatalf("d again: %v, want Duplicate (still remembered)", v)
	}
	if v := offer("a", 111); v != Accepted {
		t.Fatalf("a again: %v, want Accepted (forgotten by the cap)", v)
	}
	// a's acceptance pushed b out; c, d, a remain.
	for _, c := range []struct {
		id   string
		want Verdict
	}{{"c", Duplicate}, {"b", Accepted}} {
		if v := offer(c.id, 112); v != c.want {
			t.Fatalf("%s: %v, want %v", c.id, v, c.want)
		}
	}
	// Now d, a, b remain (c was caught as a duplicate and changed nothing; b's
	// acceptance evicted c).
	snap := s.AppendSnapshot(nil)
	r, err := Restore(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	if r.DedupeIDs() != 3 {
		t.Fatalf("restored %d ids, want 3", r.DedupeIDs())
	}
	small, err := Restore(Config{AllowedLateness: 1000, MaxDedupeIDs: 1}, snap)
	if err != nil {
		t.Fatal(err)
	}
	if small.DedupeIDs() != 1 {
		t.Fatalf("restored under cap 1: %d ids", small.DedupeIDs())
	}
	// Only b, the newest, is left.
	for _, c := range []struct {
		id   string
		want Verdict
	}{{"b", Duplicate}, {"d", Accepted}} {
		if v := small.Offer(Event{EventID: c.id, EntityID: "e", EventTime: 120, Offset: 120}); v != c.want {
			t.Fatalf("after a restore under cap 1, %s: %v, want %v", c.id, v, c.want)
		}
	}
	if _, err := New(Config{MaxDedupeIDs: -1}); err == nil {
		t.Fatal("a negative cap was accepted")
	}
}

// TestMaxDedupeIDsBounds holds the set at the cap over many ids, with the horizon
// far away, so that only the cap limits it.
func TestMaxDedupeIDsBounds(t *testing.T) {
	s := mustNew(t, Config{MaxDedupeIDs: 1000})
	for i := range 10_000 {
		s.Offer(Event{EventID: fmt.Sprint("id-", i), EntityID: "e", EventTime: int64(i), Offset: int64(i)})
		s.Ready(nil)
		if s.DedupeIDs() > 1000 {
			t.Fatalf("after %d ids the set holds %d", i+1, s.DedupeIDs())
		}
	}
	if s.DedupeIDs() != 1000 || s.DedupeCapEvictions() != 9000 {
		t.Fatalf("DedupeIDs %d, evictions %d; want 1000 and 9000", s.DedupeIDs(), s.DedupeCapEvictions())
	}
	if v := s.Offer(Event{EventID: "id-9999", EntityID: "e", EventTime: 10_000, Offset: 10_000}); v != Duplicate {
		t.Fatalf("the newest id again: %v", v)
	}
	if v := s.Offer(Event{EventID: "id-0", EntityID: "e", EventTime: 10_001, Offset: 10_001}); v != Accepted {
		t.Fatalf("the oldest id again: %v (the cap forgot it)", v)
	}
}
