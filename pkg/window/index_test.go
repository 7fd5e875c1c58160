package window

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestIndexMatchesMap drives create/remove through the open-addressing index, with
// growth and backward-shift deletes across the wrap-around, against a plain map.
func TestIndexMatchesMap(t *testing.T) {
	tbl := mustTable(t, "10s:1s", Options{})
	model := map[string]uint32{}
	r := rand.New(rand.NewPCG(9, 9))
	for step := range 200_000 {
		id := fmt.Sprintf("id-%d", r.IntN(5000))
		slot, _, ok := tbl.lookup(id)
		want, wantOK := model[id]
		if ok != wantOK || (ok && slot != want) {
			t.Fatalf("step %d: lookup(%q) = %d %v, model %d %v", step, id, slot, ok, want, wantOK)
		}
		switch {
		case !ok:
			model[id], _ = tbl.create(id) // Sprintf's string is the table's to keep
		case r.IntN(2) == 0:
			tbl.remove(slot)
			delete(model, id)
		}
		if tbl.Len() != len(model) {
			t.Fatalf("step %d: Len %d, model %d", step, tbl.Len(), len(model))
		}
	}
	for id, want := range model {
		if got, _, ok := tbl.lookup(id); !ok || got != want {
			t.Fatalf("final lookup(%q) = %d %v, want %d", id, got, ok, want)
		}
	}
}
