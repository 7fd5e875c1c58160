package window

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestPrefetchIsAHint: Prefetch and PrefetchRecord accept any id (present, absent,
// empty, long, of a removed entity), change nothing and allocate nothing.
func TestPrefetchIsAHint(t *testing.T) {
	tbl := mustTable(t, DefaultSpecs, Options{MaxEntities: 50})
	out := make([]Agg, 4)
	ids := []string{"", "x", "card-0000001", strings.Repeat("long-id-", 10), "absent"}
	for i := range 200 {
		id := fmt.Sprintf("e%d", i%80) // more than MaxEntities: some get evicted
		if _, _, err := tbl.Apply(id, int64(i)*1000, 5, out); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	before := tbl.AppendSnapshot(nil)
	allocs := testing.AllocsPerRun(10, func() {
		for _, id := range ids {
			tbl.Prefetch(id)
			tbl.PrefetchRecord(id)
		}
	})
	if allocs != 0 {
		t.Errorf("prefetch allocates %.1f times per pass", allocs)
	}
	if after := tbl.AppendSnapshot(nil); string(after) != string(before) {
		t.Error("prefetch changed the table")
	}
	// An empty table (no slab yet) too.
	empty := mustTable(t, DefaultSpecs, Options{})
	empty.Prefetch("a")
	empty.PrefetchRecord("a")
}

// TestIndexHashAllLengths: ids of every length around the short-id hash's cases (0–3,
// 4–7, 8–16 bytes read as overlapping words, then maphash), including ids that differ
// in one byte or only in length, are all found and never confused.
func TestIndexHashAllLengths(t *testing.T) {
	tbl := mustTable(t, "10s:1s", Options{})
	r := rand.New(rand.NewPCG(5, 5))
	model := map[string]uint32{}
	add := func(id string) {
		if _, ok := model[id]; ok || id == "" {
			return
		}
		model[id], _ = tbl.create(strings.Clone(id))
	}
	for n := 1; n <= 40; n++ {
		base := []byte(strings.Repeat("a", n))
		add(string(base))
		for p := range n { // every one-byte change
			b := append([]byte(nil), base...)
			b[p] = 'b'
			add(string(b))
		}
		for range 50 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.IntN(4)) // few distinct bytes: many near collisions
			}
			add(string(b))
		}
	}
	for id, want := range model {
		if got, _, ok := tbl.lookup(id); !ok || got != want {
			t.Fatalf("lookup(%q) = %d %v, want %d", id, got, ok, want)
		}
	}
	for _, id := range []string{"", "c", strings.Repeat("a", 41), "aab" + strings.Repeat("a", 13)} {
		if _, ok := model[id]; ok {
			continue
		}
		if _, _, ok := tbl.lookup(id); ok {
			t.Fatalf("lookup(%q) found an id never added", id)
		}
	}
	if tbl.Len() != len(model) {
		t.Fatalf("Len %d, want %d", tbl.Len(), len(model))
	}
}
