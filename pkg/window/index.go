package window

import (
	"hash/maphash"
	"unsafe"
)

// index maps entity ids to slab slots: open addressing with linear probing over one
// slice; key is the low 32 bits of the id's hash (tag) and slot+1 (0 = empty).
//
// Why not map[string]uint32: at 1 M entities a lookup there costs a control-word
// miss, a slot miss and a miss on the key's bytes, and only then can the entity be
// fetched. Here an entry also points at the entity's raw-event allocation, which
// starts with the id (see reallocRaw): once the entry is loaded, the id compare and
// the slab record are two independent loads the CPU overlaps, and the event scan
// that follows hits the lines the compare brought in. The tag holds the home
// position's bits, so growing and the backward-shift delete (no tombstones, so probe
// runs stay short) never rehash ids.
type index struct {
	entries []indexEntry
	n       int
	seed    maphash.Seed
}

type indexEntry struct {
	key  uint64
	blob unsafe.Pointer // the entity's raw allocation (id length, id, events), or nil
}

func newIndex(capacity int) index {
	size := 16
	for size*5 < capacity*8 {
		size *= 2
	}
	return index{entries: make([]indexEntry, size), seed: maphash.MakeSeed()}
}

func (x *index) hash(id string) uint32 { return uint32(maphash.String(x.seed, id)) }

// lookup returns the slot of id and the position of its entry.
func (t *Table) lookup(id string) (slot, pos uint32, ok bool) {
	if id == "" { // never stored, and blobID's "" means "no match"
		return 0, 0, false
	}
	x := &t.idx
	tag := x.hash(id)
	mask := uint32(len(x.entries) - 1)
	for i := tag & mask; ; i = (i + 1) & mask {
		en := &x.entries[i]
		if en.key == 0 {
			return 0, 0, false
		}
		if uint32(en.key>>32) != tag {
			continue
		}
		s := uint32(en.key) - 1
		if en.blob != nil {
			if blobID(en.blob, len(id)) == id {
				return s, i, true
			}
		} else if t.slab[s].id == id {
			return s, i, true
		}
	}
}

// blobID is the id stored at the head of a raw allocation if its length is n, else "".
func blobID(blob unsafe.Pointer, n int) string {
	if *(*int64)(blob) != int64(n) {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Add(blob, 8)), n)
}

// insert adds id → slot (id must not be present) and returns the entry's position.
func (t *Table) insert(id string, slot uint32) uint32 {
	x := &t.idx
	if (x.n+1)*8 > len(x.entries)*5 {
		x.grow()
	}
	x.n++
	return x.place(indexEntry{key: uint64(x.hash(id))<<32 | uint64(slot+1)})
}

func (x *index) place(en indexEntry) uint32 {
	mask := uint32(len(x.entries) - 1)
	i := uint32(en.key>>32) & mask
	for x.entries[i].key != 0 {
		i = (i + 1) & mask
	}
	x.entries[i] = en
	return i
}

func (x *index) grow() {
	old := x.entries
	x.entries = make([]indexEntry, 2*len(old))
	for _, en := range old {
		if en.key != 0 {
			x.place(en)
		}
	}
}

// find returns the position of the entry of id, which must be present at slot.
func (t *Table) find(id string, slot uint32) uint32 {
	x := &t.idx
	mask := uint32(len(x.entries) - 1)
	i := x.hash(id) & mask
	for uint32(x.entries[i].key) != slot+1 {
		i = (i + 1) & mask
	}
	return i
}

// setBlob records where slot's raw allocation now is (nil when it has none).
func (t *Table) setBlob(pos uint32, e *entity) {
	t.idx.entries[pos].blob = e.blob()
}

// unindex deletes id (present at slot) and closes the gap by shifting later entries
// of the probe run back, so lookups never need tombstones.
func (t *Table) unindex(id string, slot uint32) {
	x := &t.idx
	mask := uint32(len(x.entries) - 1)
	i := t.find(id, slot)
	for j := (i + 1) & mask; x.entries[j].key != 0; j = (j + 1) & mask {
		home := uint32(x.entries[j].key>>32) & mask
		// Move entry j into the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			x.entries[i] = x.entries[j]
			i = j
		}
	}
	x.entries[i] = indexEntry{}
	x.n--
}
