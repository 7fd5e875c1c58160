package refwm

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

func (r *idRing) push(e idEntry) {
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

// idTable maps an id hash to the event time of its latest acceptance. It is split into
// idShards independent tables by the hash's top bits, so that growing one (a rehash
// of everything in it, on the partition goroutine) costs 1/idShards of the whole
// set: at millions of ids one table's doubling stalled the partition for ~100 ms.
// The hash fills every shard at the same pace, so with one load factor they would all
// double within moments of each other and the stall would only be cut in pieces;
// each shard therefore grows at its own load factor (see loadLimit), which spreads
// the doublings over the time the set takes to grow by half.
type idTable struct {
	shards [idShards]idShard
}

const idShards = 64

func (m *idTable) shard(k idKey) *idShard {
	i := k.hi >> 58
	sh := &m.shards[i]
	if sh.limit == 0 {
		sh.limit = loadLimit(int(i))
	}
	return sh
}

// loadLimit is shard i's largest load factor, in 256ths: from 0.35 to 0.6 across the
// shards. Linear probing stays short below 0.6, and a shard that just doubled is at
// least 0.17 full.
func loadLimit(i int) int { return 90 + i }

func (m *idTable) len() int {
	n := 0
	for i := range m.shards {
		n += m.shards[i].n
	}
	return n
}

func (m *idTable) get(k idKey) (int64, bool) { return m.shard(k).get(k) }

func (m *idTable) set(k idKey, t int64) { m.shard(k).set(k, t) }

func (m *idTable) delOlder(k idKey, floor int64) { m.shard(k).delOlder(k, floor) }

func (m *idTable) del(k idKey) { m.shard(k).del(k) }

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
// deletion: the keys are already uniform 128-bit hashes, so the low bits index the
// table directly, and deleting leaves no tombstones. (The built-in map was tried
// first: under the steady insert/expire churn of a sliding horizon its probe
// sequences grew until a lookup cost ~600 ns.) The all-zero key marks an empty slot;
// hashID never returns it.
type idShard struct {
	slots []idEntry // len is 0 or a power of two, at most limit/256 full
	n     int
	limit int // load factor in 256ths at which to grow; 0 = 128 (half)
}

// find returns the slot holding k, or the empty slot where k would go.
func (m *idShard) find(k idKey) (int, bool) {
	mask := len(m.slots) - 1
	for i := int(k.lo) & mask; ; i = (i + 1) & mask {
		e := &m.slots[i]
		if e.k == k {
			return i, true
		}
		if e.k == (idKey{}) {
			return i, false
		}
	}
}

func (m *idShard) get(k idKey) (int64, bool) {
	if m.n == 0 {
		return 0, false
	}
	i, ok := m.find(k)
	return m.slots[i].t, ok
}

func (m *idShard) set(k idKey, t int64) {
	m.reserve()
	i, ok := m.find(k)
	m.putAt(i, ok, k, t)
}

func (m *idShard) grow() {
	old := m.slots
	size := 2 * len(old)
	if size == 0 {
		size = 16
	}
	m.slots = make([]idEntry, size)
	for _, e := range old {
		if e.k != (idKey{}) {
			i, _ := m.find(e.k)
			m.slots[i] = e
		}
	}
}

// presize gives an empty table room for n keys at its load factor at once (doubling
// step by step on a large restore rehashed the same keys again and again).
func (m *idShard) presize(n int) {
	if want := n*256/m.load() + 1; m.n == 0 && want > len(m.slots) {
		m.slots = make([]idEntry, pow2AtLeast(max(want, 16)))
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

// putAt stores k at slot i, as returned by find after reserve.
func (m *idShard) putAt(i int, found bool, k idKey, t int64) {
	if !found {
		m.slots[i].k = k
		m.n++
	}
	m.slots[i].t = t
}

// delOlder removes k if present with a time before floor, in one probe.
func (m *idShard) delOlder(k idKey, floor int64) {
	if m.n == 0 {
		return
	}
	if i, ok := m.find(k); ok && m.slots[i].t < floor {
		m.delAt(i)
	}
}

// del removes k if present.
func (m *idShard) del(k idKey) {
	if m.n == 0 {
		return
	}
	if i, ok := m.find(k); ok {
		m.delAt(i)
	}
}

// delAt empties slot i (Knuth's algorithm R: later entries of the probe run move back
// into the hole unless their home slot lies cyclically after it, so no tombstones).
func (m *idShard) delAt(i int) {
	mask := len(m.slots) - 1
	for j := i; ; {
		j = (j + 1) & mask
		e := m.slots[j]
		if e.k == (idKey{}) {
			break
		}
		home := int(e.k.lo) & mask
		if i <= j && i < home && home <= j || i > j && (i < home || home <= j) {
			continue // e is still reachable from its home without crossing the hole
		}
		m.slots[i] = e
		i = j
	}
	m.slots[i] = idEntry{}
	m.n--
}
