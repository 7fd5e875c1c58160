package watermark

import "github.com/zeebo/xxh3"

// idKey is the 128-bit XXH3 hash of an event id; see the package documentation for why
// a hash and how unlikely a collision is.
type idKey struct{ hi, lo uint64 }

func hashID(id string) idKey {
	h := xxh3.HashString128(id)
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

func (r *idRing) front() idEntry { return r.buf[r.head] }

func (r *idRing) pop() {
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
}

func (r *idRing) at(i int) idEntry { return r.buf[(r.head+i)&(len(r.buf)-1)] }
