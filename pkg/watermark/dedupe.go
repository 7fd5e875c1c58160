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

// idRing is a growable FIFO of accepted ids in acceptance order. It reuses its backing
// array, so steady-state acceptance and expiry allocate nothing.
type idRing struct {
	buf  []idEntry // len(buf) is 0 or a power of two
	head int
	n    int
}

func (r *idRing) push(e idEntry) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = e
	r.n++
}

func (r *idRing) grow() {
	size := 2 * len(r.buf)
	if size == 0 {
		size = 64
	}
	buf := make([]idEntry, size)
	for i := 0; i < r.n; i++ {
		buf[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
	}
	r.buf = buf
	r.head = 0
}

// presize gives an empty ring room for n entries at once: a restore knows its
// count, and doubling step by step reallocated and copied gigabytes for large ones.
func (r *idRing) presize(n int) {
	if r.n == 0 && n > len(r.buf) {
		r.buf, r.head = make([]idEntry, pow2AtLeast(n)), 0
	}
}

// pow2AtLeast is the smallest power of two >= n (and >= 1).
func pow2AtLeast(n int) int {
	size := 1
	for size < n {
		size <<= 1
	}
	return size
}

func (r *idRing) front() idEntry { return r.buf[r.head] }

func (r *idRing) pop() {
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
}

func (r *idRing) at(i int) idEntry { return r.buf[(r.head+i)&(len(r.buf)-1)] }

// idTable maps an id hash to the event time of its latest acceptance. It is an
// open-addressing table with linear probing and backward-shift deletion: the keys are
// already uniform 128-bit hashes, so the low bits index the table directly, and deleting
// leaves no tombstones. (The built-in map was tried first: under the steady insert/expire
// churn of a sliding horizon its probe sequences grew until a lookup cost ~600 ns.)
// The all-zero key marks an empty slot; hashID never returns it.
type idTable struct {
	slots []idEntry // len is 0 or a power of two, at most half full
	n     int
}

func (m *idTable) len() int { return m.n }

// find returns the slot holding k, or the empty slot where k would go.
func (m *idTable) find(k idKey) (int, bool) {
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

func (m *idTable) get(k idKey) (int64, bool) {
	if m.n == 0 {
		return 0, false
	}
	i, ok := m.find(k)
	return m.slots[i].t, ok
}

func (m *idTable) set(k idKey, t int64) {
	m.reserve()
	i, ok := m.find(k)
	m.putAt(i, ok, k, t)
}

func (m *idTable) grow() {
	old := m.slots
	size := 2 * len(old)
	if size == 0 {
		size = 1024
	}
	m.slots = make([]idEntry, size)
	for _, e := range old {
		if e.k != (idKey{}) {
			i, _ := m.find(e.k)
			m.slots[i] = e
		}
	}
}

// presize gives an empty table room for n keys at its load factor at once (see
// idRing.presize for why).
func (m *idTable) presize(n int) {
	if m.n == 0 && 2*n > len(m.slots) {
		m.slots = make([]idEntry, pow2AtLeast(max(2*n, 1024)))
	}
}

// reserve makes room for one more key, so that a slot found next stays valid for
// putAt even if the key turns out to be new.
func (m *idTable) reserve() {
	if 2*(m.n+1) > len(m.slots) {
		m.grow()
	}
}

// putAt stores k at slot i, as returned by find after reserve.
func (m *idTable) putAt(i int, found bool, k idKey, t int64) {
	if !found {
		m.slots[i].k = k
		m.n++
	}
	m.slots[i].t = t
}

// delOlder removes k if present with a time before floor, in one probe.
func (m *idTable) delOlder(k idKey, floor int64) {
	if m.n == 0 {
		return
	}
	if i, ok := m.find(k); ok && m.slots[i].t < floor {
		m.delAt(i)
	}
}

// del removes k if present.
func (m *idTable) del(k idKey) {
	if m.n == 0 {
		return
	}
	if i, ok := m.find(k); ok {
		m.delAt(i)
	}
}

// delAt empties slot i (Knuth's algorithm R: later entries of the probe run move back
// into the hole unless their home slot lies cyclically after it, so no tombstones).
func (m *idTable) delAt(i int) {
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
