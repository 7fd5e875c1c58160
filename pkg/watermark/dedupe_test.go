package watermark

import (
	"math"
	"math/rand/v2"
	"testing"
)

// setID stores k at time t as the Stage does: a FIFO entry, and the slot pointed at it.
func setID(sh *idShard, r *idRing, k idKey, t int64) {
	sh.reserve()
	slot, _, found := sh.find(k, r)
	sh.putAt(slot, found, k, r.pos())
	r.push(idEntry{k: k, t: t})
}

// TestIDTableMatchesMap drives one open-addressing shard, the sharded table and a
// built-in map with the same random inserts, updates and deletes. Keys share few low
// bits, so the shard's probe runs are long and wrap around the end of its slots, which
// is where backward-shift deletion goes wrong if it is going to; and many keys share
// one fingerprint, so a matching fingerprint must be told apart on the ring's hash.
func TestIDTableMatchesMap(t *testing.T) {
	seeds := 20
	if raceEnabled {
		seeds = 4 // single-goroutine, and its long probe runs are ~30x slower under -race
	}
	for seed := range seeds {
		r := rand.New(rand.NewPCG(uint64(seed), 99))
		var tab idShard
		var sharded idTable
		var ring, sring idRing
		ref := map[idKey]int64{}
		keys := make([]idKey, 3000)
		for i := range keys {
			// lo near the top of the index range forces wrap-around once the shard is
			// 8192 wide (3000 keys at most 0.75 full), and at every smaller width; its
			// low 32 bits, the fingerprint, take 512 values, about 6 keys each.
			keys[i] = idKey{hi: r.Uint64() | 1, lo: uint64(8188+r.IntN(8)+8192*r.IntN(64)) | r.Uint64()<<32}
		}
		for step := range 20000 {
			k := keys[r.IntN(len(keys))]
			switch r.IntN(3) {
			case 0, 1:
				v := int64(step)
				setID(&tab, &ring, k, v)
				setID(sharded.shard(k), &sring, k, v)
				ref[k] = v
			case 2:
				tab.delOlder(k, math.MaxInt64, &ring)
				sharded.delOlder(k, math.MaxInt64, &sring)
				delete(ref, k)
			}
			if tab.n != len(ref) || sharded.len() != len(ref) {
				t.Fatalf("seed %d step %d: len %d (sharded %d), want %d", seed, step, tab.n, sharded.len(), len(ref))
			}
			if step%500 == 0 {
				for _, k := range keys {
					got, ok := tab.get(k, &ring)
					sgot, sok := sharded.get(k, &sring)
					want, wok := ref[k]
					if ok != wok || got != want || sok != wok || sgot != want {
						t.Fatalf("seed %d step %d: get(%v) = %d, %v (sharded %d, %v); want %d, %v", seed, step, k, got, ok, sgot, sok, want, wok)
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

// TestIDTableSpreadsGrowth checks that the shards do not all double at once: the hash
// fills them evenly, so with one load factor every shard's rehash would land within a
// few thousand inserts of the others' and stall the partition together.
func TestIDTableSpreadsGrowth(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	var tab idTable
	var ring idRing
	const size = 4096 // watch every shard's doubling from 4096 to 8192 slots
	at := make([]int, 0, idShards)
	var seen [idShards]bool
	for n := 1; len(at) < idShards && n < 4_000_000; n++ {
		k := idKey{hi: r.Uint64(), lo: r.Uint64() | 1}
		setID(tab.shard(k), &ring, k, int64(n))
		i := k.hi >> 58
		if !seen[i] && len(tab.shards[i].slots) == 2*size {
			seen[i] = true
			at = append(at, n)
		}
	}
	if len(at) != idShards {
		t.Fatalf("only %d shards reached %d slots", len(at), 2*size)
	}
	first, last := at[0], at[len(at)-1]
	// Limits from 0.5 to 0.75 put the last doubling ~1.5x as many inserts in as
	// the first; one load factor would put them within a few percent.
	if float64(last) < 1.4*float64(first) {
		t.Fatalf("shards doubled between %d and %d inserts: not spread", first, last)
	}
}
