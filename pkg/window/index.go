package window

import "hash/maphash"

// index maps entity ids to slab slots: open addressing with linear probing over one
// []uint64, each entry the low 32 bits of the id's hash (tag) and slot+1 (0 = empty).
//
// Why not map[string]uint32: at 1 M entities a lookup there costs a control-word
// miss, a slot miss and a miss on the key's bytes before the entity itself is even
// touched; here it is one miss on the entry, and the id is compared on the slab
// record the caller needs next anyway. It is also 8 bytes per entry at ≤ 5/8 load
// instead of ~40. The tag holds the home position's bits, so growing and the
// backward-shift delete (no tombstones, probe runs stay short) never rehash ids.
type index struct {
	entries []uint64
	n       int
	seed    maphash.Seed
}

func newIndex(capacity int) index {
	size := 16
	for size*5 < capacity*8 {
		size *= 2
	}
	return index{entries: make([]uint64, size), seed: maphash.MakeSeed()}
}

func (x *index) hash(id string) uint32 { return uint32(maphash.String(x.seed, id)) }

// lookup returns the slot of id. slab resolves candidate slots to their ids.
func (t *Table) lookup(id string) (uint32, bool) {
	x := &t.idx
	tag := x.hash(id)
	mask := uint32(len(x.entries) - 1)
	for i := tag & mask; ; i = (i + 1) & mask {
		en := x.entries[i]
		if en == 0 {
			return 0, false
		}
		if uint32(en>>32) == tag {
			if s := uint32(en) - 1; t.slab[s].id == id {
				return s, true
			}
		}
	}
}

// insert adds id → slot; id must not be present.
func (t *Table) insert(id string, slot uint32) {
	x := &t.idx
	if (x.n+1)*8 > len(x.entries)*5 {
		x.grow()
	}
	x.place(uint64(x.hash(id))<<32 | uint64(slot+1))
	x.n++
}

func (x *index) place(en uint64) {
	mask := uint32(len(x.entries) - 1)
	i := uint32(en>>32) & mask
	for x.entries[i] != 0 {
		i = (i + 1) & mask
	}
	x.entries[i] = en
}

func (x *index) grow() {
	old := x.entries
	x.entries = make([]uint64, 2*len(old))
	for _, en := range old {
		if en != 0 {
			x.place(en)
		}
	}
}

// remove deletes id (which must be present at slot) and closes the gap by shifting
// later entries of the probe run back, so lookups never need tombstones.
func (t *Table) unindex(id string, slot uint32) {
	x := &t.idx
	mask := uint32(len(x.entries) - 1)
	i := x.hash(id) & mask
	for uint32(x.entries[i]) != slot+1 {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; x.entries[j] != 0; j = (j + 1) & mask {
		home := uint32(x.entries[j]>>32) & mask
		// Move entry j into the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			x.entries[i] = x.entries[j]
			i = j
		}
	}
	x.entries[i] = 0
	x.n--
}
