package watermark

import "github.com/zeebo/xxh3"

// idKey is the 128-bit XXH3 hash of an event id; see the package documentation for why
// a hash and how unlikely a collision is.
type idKey struct{ hi, lo uint64 }

func hashID(id string) idKey {
	h := xxh3.HashString128(id)
	if h.Hi == 0 && h.Lo == 0 {
		// The zero key marks an empty idTable slot; fold it onto another value. This
		// doubles the collision chance of two specific hashes out of 2^128.
		h.Lo = 1
	}
	return idKey{hi: h.Hi, lo: h.Lo}
}

type idEntry struct {
	k idKey
	t int64
}

// idRing is the FIFO of accepted ids in acceptance order, kept in fixed-size blocks.
//
// Blocks, not one growable array, for two reasons. Growing never copies the live ids
// (at millions of ids a doubling copy stalled the partition for tens of ms). And an
// entry is never written again once pushed, so a snapshot can take a view of the
// blocks (idView) and encode them on another goroutine while the stage goes on
// pushing and popping: while any view is open, popped blocks are left to the
// garbage collector instead of being reused, so nothing a view reads is overwritten.
// With no view open, steady-state acceptance and expiry allocate nothing.
type idRing struct {
	blocks []*idBlock // blocks[0] holds the front entry at index head
	head   int
	n      int
	spare  []*idBlock // popped blocks, reused when no view is open
	views  int        // views taken and not yet released
	popped uint64     // entries popped so far: the absolute index of the front
}

const idBlockLen = 2048 // 48 KiB per block

type idBlock [idBlockLen]idEntry

// push appends e. The ring holds at most 2^32 entries, so that idTable's 32-bit
// positions name one entry each (that many ids would take over 100 GB).
func (r *idRing) push(e idEntry) {
	if uint64(r.n) >= 1<<32 {
		panic("watermark: more than 2^32 dedupe ids in one partition")
	}
	i := r.head + r.n
	if i/idBlockLen == len(r.blocks) {
		r.blocks = append(r.blocks, r.newBlock())
	}
	r.blocks[i/idBlockLen][i%idBlockLen] = e
	r.n++
}

func (r *idRing) newBlock() *idBlock {
	if k := len(r.spare); k > 0 {
		b := r.spare[k-1]
		r.spare = r.spare[:k-1]
		return b
	}
	return new(idBlock)
}

// pow2AtLeast is the smallest power of two >= n (and >= 1).
func pow2AtLeast(n int) int {
	size := 1
	for size < n {
		size <<= 1
	}
	return size
}

func (r *idRing) front() idEntry { return r.blocks[0][r.head] }

func (r *idRing) pop() {
	r.head++
	r.n--
	r.popped++
	if r.head < idBlockLen {
		return // an emptied ring goes on filling its front block from head
	}
	// The front block is used up: reuse it, unless a view may still read it or
	// enough are kept already (a burst's blocks go back to the collector).
	if r.views == 0 && len(r.spare) < maxSpareBlocks {
		r.spare = append(r.spare, r.blocks[0])
	}
	r.blocks[0] = nil
	r.blocks = r.blocks[1:]
	r.head = 0
}

const maxSpareBlocks = 4

func (r *idRing) at(i int) idEntry {
	i += r.head
	return r.blocks[i/idBlockLen][i%idBlockLen]
}

// pos is the position of the next entry push appends, mod 2^32 (see idTable).
func (r *idRing) pos() uint32 { return uint32(r.popped) + uint32(r.n) }

// atPos is the entry at position pos, which must be in the ring: an entry's position
// is its absolute index (popped counts those before the front), mod 2^32.
func (r *idRing) atPos(pos uint32) idEntry { return r.at(int(pos - uint32(r.popped))) }

// idView is the ring's entries at one moment. It stays valid and unchanged while the
// stage goes on, until release; reading it from another goroutine is safe, since the
// stage never writes the entries it covers (see idRing).
type idView struct {
	blocks []*idBlock
	head   int
	n      int
}

// view opens a view of the current entries. Every view must be released on the
// stage's goroutine; one that is not only costs allocations.
func (r *idRing) view() idView {
	r.views++
	return idView{blocks: append([]*idBlock(nil), r.blocks...), head: r.head, n: r.n}
}

func (r *idRing) release() {
	if r.views > 0 {
		r.views--
	}
}

func (v *idView) at(i int) idEntry {
	i += v.head
	return v.blocks[i/idBlockLen][i%idBlockLen]
}

// idTable maps an id hash to the FIFO entry (idRing) of its latest acceptance, which
// holds the id's full hash and event time: the table itself keeps 8 bytes per slot,
// a third of a {hash, time} slot, so that it touches a third of the fresh memory as it
// grows and misses the cache less (its growth from empty, first writes to pages the
// process had not touched, was most of what the dedupe stage cost end to end).
//
// It is split into idShards independent tables by the hash's top bits, so that
// growing one (a rehash of everything in it, on the partition goroutine) costs
// 1/idShards of the whole set: at millions of ids one table's doubling stalled the
// partition for ~100 ms. The hash fills every shard at the same pace, so with one
// load factor they would all double within moments of each other and the stall would
// only be cut in pieces; each shard therefore grows at its own load factor (see
// loadLimit), which spreads the doublings over the time the set takes to grow by half.
//
// Invariants, kept by the Stage (pushID, expire, capIDs), on which the table relies:
//
//   - every id in the table has its latest acceptance in the ring, and the slot points
//     at that entry. Each insert or update of a slot goes with the push of the entry it
//     points at (pushID). An entry leaves the ring only at the front (expire, capIDs),
//     and each pop is preceded by delOlder for its id with a bound above the entry's
//     time: if the slot still points at that entry, its time is below the bound and
//     the slot goes first.
//   - an id's acceptances have strictly increasing times (an accepted or remembered
//     time is inside the horizon, so it is later than an expired one, and Remember
//     replaces a live time only with a later one), so comparing the slot's time with a
//     bound, as the {hash, time} table did, decides exactly as before, and a pop's
//     delOlder removes the slot exactly when it points at the popped entry.
//   - the ring holds at most 2^32 entries (idRing.push), so a position mod 2^32 names
//     one entry.
type idTable struct {
	shards [idShards]idShard
}

const idShards = 64

// idSlot is one table slot: the low 32 bits are the id's fingerprint (fpOf, never 0),
// the high 32 its FIFO position (idRing.popped + index, mod 2^32). 0 is an empty slot.
type idSlot uint64

// fpOf is k's fingerprint: the low 32 bits of its hash's low half, which also give
// its home slot (fp & mask, as the {hash, time} table's home was; a shard of more than
// 2^32 slots would only crowd its lower half), so that growing and backward-shift
// deletion need only the slots, never the ring. 0 marks an empty slot
// and is folded onto 1; a fingerprint that matches is confirmed on the ring's full
// hash, so folding costs nothing but a rare extra look.
func fpOf(k idKey) uint32 {
	if f := uint32(k.lo); f != 0 {
		return f
	}
	return 1
}

func (m *idTable) shard(k idKey) *idShard {
	i := k.hi >> 58
	sh := &m.shards[i]
	if sh.limit == 0 {
		sh.limit = loadLimit(int(i))
	}
	return sh
}

// loadLimit is shard i's largest load factor, in 256ths: from 0.5 to 0.75 across the
// shards (a shard that just doubled is at least 0.25 full). With 8 slots to a cache
// line, linear probing's runs at 0.75 (about 8.5 slots for a missing key on average)
// stay within one or two lines.
func loadLimit(i int) int { return 128 + i }

func (m *idTable) len() int {
	n := 0
	for i := range m.shards {
		n += m.shards[i].n
	}
	return n
}

func (m *idTable) get(k idKey, r *idRing) (int64, bool) { return m.shard(k).get(k, r) }

func (m *idTable) delOlder(k idKey, floor int64, r *idRing) { m.shard(k).delOlder(k, floor, r) }

// presize gives an empty table room for n keys at once (see idShard.presize).
func (m *idTable) presize(n int) {
	per := n/idShards + n/(4*idShards) + 16 // the hash spreads keys evenly; a little slack
	for i := range m.shards {
		if m.shards[i].limit == 0 {
			m.shards[i].limit = loadLimit(i)
		}
		m.shards[i].presize(per)
	}
}

// idShard is one open-addressing table with linear probing and backward-shift
// deletion: the keys are already uniform 128-bit hashes, so the fingerprint's low bits
// index the table directly, and deleting leaves no tombstones. (The built-in map was
// tried first: under the steady insert/expire churn of a sliding horizon its probe
// sequences grew until a lookup cost ~600 ns.)
type idShard struct {
	slots []idSlot // len is 0 or a power of two, at most limit/256 full
	n     int
	limit int // load factor in 256ths at which to grow; 0 = 128 (half)
}

// find returns the slot holding k and the time of k's latest acceptance, or the
// empty slot where k would go. A fingerprint that matches is confirmed on the ring
// entry the slot points at (its id's latest acceptance, by idTable's invariants).
func (m *idShard) find(k idKey, r *idRing) (slot int, t int64, found bool) {
	fp := fpOf(k)
	mask := len(m.slots) - 1
	for i := int(fp) & mask; ; i = (i + 1) & mask {
		s := m.slots[i]
		if s == 0 {
			return i, 0, false
		}
		if uint32(s) == fp {
			if e := r.atPos(uint32(s >> 32)); e.k == k {
				return i, e.t, true
			}
		}
	}
}

func (m *idShard) get(k idKey, r *idRing) (int64, bool) {
	if m.n == 0 {
		return 0, false
	}
	_, t, ok := m.find(k, r)
	return t, ok
}

func (m *idShard) grow() {
	old := m.slots
	size := 2 * len(old)
	if size == 0 {
		size = 16
	}
	m.slots = make([]idSlot, size)
	mask := size - 1
	for _, s := range old {
		if s != 0 {
			// The keys are distinct: the first empty slot from home is s's.
			i := int(uint32(s)) & mask
			for m.slots[i] != 0 {
				i = (i + 1) & mask
			}
			m.slots[i] = s
		}
	}
}

// presize gives an empty table room for n keys at its load factor at once (doubling
// step by step on a large restore rehashed the same keys again and again).
func (m *idShard) presize(n int) {
	if want := n*256/m.load() + 1; m.n == 0 && want > len(m.slots) {
		m.slots = make([]idSlot, pow2AtLeast(max(want, 16)))
	}
}

func (m *idShard) load() int {
	if m.limit == 0 {
		return 128
	}
	return m.limit
}

// reserve makes room for one more key, so that a slot found next stays valid for
// putAt even if the key turns out to be new.
func (m *idShard) reserve() {
	if (m.n+1)*256 > len(m.slots)*m.load() {
		m.grow()
	}
}

// putAt points slot i, as returned by find after reserve, at k's ring entry at pos.
func (m *idShard) putAt(i int, found bool, k idKey, pos uint32) {
	if !found {
		m.n++
	}
	m.slots[i] = idSlot(pos)<<32 | idSlot(fpOf(k))
}

// delOlder removes k if present with a time before floor, in one probe.
func (m *idShard) delOlder(k idKey, floor int64, r *idRing) {
	if m.n == 0 {
		return
	}
	if i, t, ok := m.find(k, r); ok && t < floor {
		m.delAt(i)
	}
}

// delAt empties slot i (Knuth's algorithm R: later entries of the probe run move back
// into the hole unless their home slot lies cyclically after it, so no tombstones).
func (m *idShard) delAt(i int) {
	mask := len(m.slots) - 1
	for j := i; ; {
		j = (j + 1) & mask
		s := m.slots[j]
		if s == 0 {
			break
		}
		home := int(uint32(s)) & mask
		if i <= j && i < home && home <= j || i > j && (i < home || home <= j) {
			continue // s is still reachable from its home without crossing the hole
		}
		m.slots[i] = s
		i = j
	}
	m.slots[i] = 0
	m.n--
}
