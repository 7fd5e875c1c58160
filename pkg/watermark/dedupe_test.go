package watermark

import (
	"math/rand/v2"
	"testing"
)

// TestIDTableMatchesMap drives the open-addressing table and a built-in map with the
// same random inserts, updates and deletes. Keys share few low bits, so probe runs are
// long and wrap around the end of the table, which is where backward-shift deletion
// goes wrong if it is going to.
func TestIDTableMatchesMap(t *testing.T) {
	for seed := range 20 {
		r := rand.New(rand.NewPCG(uint64(seed), 99))
		var tab idTable
		ref := map[idKey]int64{}
		keys := make([]idKey, 3000)
		for i := range keys {
			// lo near the top of the index range forces wrap-around once the table is 1024 wide.
			keys[i] = idKey{hi: r.Uint64() | 1, lo: uint64(1020 + r.IntN(8) + 1024*r.IntN(4))}
		}
		for step := range 20000 {
			k := keys[r.IntN(len(keys))]
			switch r.IntN(3) {
			case 0, 1:
				v := int64(step)
				tab.set(k, v)
				ref[k] = v
			case 2:
				tab.del(k)
				delete(ref, k)
			}
			if tab.len() != len(ref) {
				t.Fatalf("seed %d step %d: len %d, want %d", seed, step, tab.len(), len(ref))
			}
			if step%500 == 0 {
				for _, k := range keys {
					got, ok := tab.get(k)
					want, wok := ref[k]
					if ok != wok || got != want {
						t.Fatalf("seed %d step %d: get(%v) = %d, %v; want %d, %v", seed, step, k, got, ok, want, wok)
					}
				}
			}
		}
	}
}

func TestHashIDNeverZero(t *testing.T) {
	for _, id := range []string{"", "a", "e1", "evt-00000001"} {
		if hashID(id) == (idKey{}) {
			t.Fatalf("hashID(%q) is the empty-slot key", id)
		}
	}
}
