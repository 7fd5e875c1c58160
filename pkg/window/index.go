package window

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"unsafe"

	"github.com/velocity-consumer/velocity-consumer/internal/prefetch"
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
	seed    maphash.Seed // hash of ids longer than 16 bytes
	k       [4]uint64    // hash of short ids (hash)
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
	x := index{entries: makeHuge[indexEntry](size, size), seed: maphash.MakeSeed()}
	for i := range x.k {
		x.k[i] = rand.Uint64()
	}
	return x
}

// hash is the 32-bit tag of id. Ids of up to 16 bytes (card numbers, account ids)
// take a wyhash-style path: the id is read as two possibly overlapping words, and
// two 64×64→128-bit multiplies with per-table random keys mix them with the length,
// in straight-line Go where maphash.String goes through the runtime's AES hash
// (BenchmarkApplyHotEntity, which is mostly hashing and the bucket update, went from
// 27-37 to 23-33 cpu-ns/op). Apply, Prefetch and PrefetchRecord each hash the id.
// Longer ids use maphash. The keys are random per table, so which ids collide cannot
// be chosen from outside.
func (x *index) hash(id string) uint32 {
	n := len(id)
	if n > 16 {
		return uint32(maphash.String(x.seed, id))
	}
	b := unsafe.Slice(unsafe.StringData(id), n)
	var lo, hi uint64
	switch {
	case n >= 8:
		lo, hi = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[n-8:])
	case n >= 4:
		lo, hi = uint64(binary.LittleEndian.Uint32(b)), uint64(binary.LittleEndian.Uint32(b[n-4:]))
	case n > 0:
		lo = uint64(b[0])<<16 | uint64(b[n>>1])<<8 | uint64(b[n-1])
	}
	hi, lo = bits.Mul64(lo^x.k[0], hi^x.k[1])
	hi, lo = bits.Mul64(lo^x.k[2]^uint64(n), hi^x.k[3])
	return uint32(hi ^ lo)
}

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
	x.entries = makeHuge[indexEntry](2*len(old), 2*len(old))
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

// Prefetch is the first of two optional hints for a caller that knows which entities
// upcoming Apply calls will name: it hashes entity and starts loading its index entry,
// without waiting for it. PrefetchRecord, called some events later for the same
// entity, starts loading its record and events; by the time Apply runs, the dependent
// cache misses of the lookup (index entry, then record and events) have been
// overlapped with the work on earlier events instead of paid one after the other.
//
// Typical use over a queue of pending events ev, with a lookahead D of 4 to 8 (at
// 1 M entities both gave ~160 cpu-ns per Apply against ~520 without hints):
//
//	for i := range ev {
//		if j := i + 2*D; j < len(ev) {
//			t.Prefetch(ev[j].Entity)
//		}
//		if j := i + D; j < len(ev) {
//			t.PrefetchRecord(ev[j].Entity)
//		}
//		t.Apply(ev[i].Entity, …)
//	}
//
// Both are hints: they change nothing, allocate nothing, never fail, and may be called
// for entities that do not exist (or with stale ids); only the timing of Apply changes.
func (t *Table) Prefetch(entity string) {
	x := &t.idx
	i := x.hash(entity) & uint32(len(x.entries)-1)
	prefetch.Line(uintptr(unsafe.Pointer(&x.entries[i])))
}

// PrefetchRecord is the second hint (see Prefetch): it reads entity's index entry,
// which Prefetch should have brought into cache some events earlier, and starts
// loading the entity's slab record and the head of its raw events. It does not
// compare ids: the first entry whose 32-bit tag matches is taken, and a rare false
// match only wastes a prefetch.
func (t *Table) PrefetchRecord(entity string) {
	x := &t.idx
	tag := x.hash(entity)
	mask := uint32(len(x.entries) - 1)
	for i := tag & mask; ; i = (i + 1) & mask {
		en := &x.entries[i]
		if en.key == 0 {
			return
		}
		if uint32(en.key>>32) == tag {
			s := uint32(en.key) - 1
			if int(s) >= len(t.slab) {
				return
			}
			rec := uintptr(unsafe.Pointer(&t.slab[s]))
			if en.blob == nil {
				// Header-only, or rings: their buffers hang off the record, which is
				// as far as a hint can reach without waiting for a load.
				prefetch.Line(rec)
			} else {
				prefetchRecord(rec, uintptr(en.blob))
			}
			return
		}
	}
}
