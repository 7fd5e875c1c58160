package feature

import (
	"math"
)

// dset is one entity's values of one distinct count: for each value kept, its 64-bit
// hash and the time it was last counted (the largest counted event time carrying
// it), in units of the feature's unit (the gcd of its windows' bucket widths, so
// that "last ≥ a bucket boundary" compares exactly).
//
// Invariants, which make every output a function of the counted events alone and
// not of when pruning happened to run:
//   - Sampling: the set holds exactly the values whose hash has its top shift bits
//     zero (shift 0: every value) and whose last time is at or after the entity's
//     prune point (values below it, which no accepted event can count, may linger
//     until pruned). shift only grows while values are dropped, and returns to 0 as
//     soon as nothing dropped can be counted any more (dropMax below the prune point).
//   - dropMax is the largest last time of any value not held because of sampling
//     (math.MinInt64: none). Every value last counted after dropMax is held, so a
//     window starting after dropMax is counted exactly.
//   - The live values (at or after the prune point) number at most MaxExact.
//
// Storage is one []uint64 per set: c hashes, then c 32-bit offsets from base packed
// two per word, 12 bytes a value (64 values: 768 bytes).
type dset struct {
	buf     []uint64
	base    int64 // offsets are from this unit
	dropMax int64 // in units; meaningful only while shift > 0
	n, c    uint16
	shift   uint8
}

func (s *dset) hash(i int) uint64 { return s.buf[i] }

func (s *dset) unit(i int) int64 {
	w := s.buf[int(s.c)+i/2]
	return s.base + int64(uint32(w>>(32*(uint(i)&1))))
}

func (s *dset) setUnit(i int, u int64) {
	off := uint64(uint32(u - s.base))
	p := &s.buf[int(s.c)+i/2]
	sh := 32 * (uint(i) & 1)
	*p = *p&^(0xFFFFFFFF<<sh) | off<<sh
}

// sampled reports whether h is kept at shift.
func sampled(h uint64, shift uint8) bool {
	return shift == 0 || h>>(64-uint(shift)) == 0
}

func (s *dset) release() { *s = dset{} }

// prune drops values last counted before unit lo (no accepted event can count them)
// and returns shift to 0 when nothing dropped by sampling can be counted either.
func (s *dset) prune(lo int64) {
	j := 0
	for i := range int(s.n) {
		if u := s.unit(i); u >= lo {
			h := s.hash(i)
			s.buf[j] = h
			s.setUnit(j, u)
			j++
		}
	}
	s.n = uint16(j)
	s.resetIfClear(lo)
}

func (s *dset) resetIfClear(lo int64) {
	if s.shift > 0 && s.dropMax < lo {
		s.shift, s.dropMax = 0, math.MinInt64
	}
}

// fit makes u representable as an offset from base: after pruning below lo every
// held value and u lie within the feature's largest window of each other, which
// Spec.Validate keeps below 2^31 units.
func (s *dset) fit(u, lo int64) {
	if s.n == 0 {
		s.base = u
		return
	}
	if u >= s.base && u-s.base <= math.MaxUint32 {
		return
	}
	s.prune(lo)
	nb := u
	for i := range int(s.n) {
		nb = min(nb, s.unit(i))
	}
	old := *s
	s.base = nb
	for i := range int(s.n) { // rewrite the offsets from the new base
		s.setUnit(i, old.unit(i))
	}
}

// grow gives room for one more value, doubling up to m.
func (s *dset) grow(m int) {
	c := max(4, min(2*int(s.c), m))
	nb := make([]uint64, c+(c+1)/2)
	copy(nb, s.buf[:s.n])
	old := *s
	s.buf, s.c = nb, uint16(c)
	for i := range int(s.n) {
		s.setUnit(i, old.unit(i))
	}
}

// add counts value h at unit u for an entity whose prune point is lo (u ≥ lo), with
// at most m live values held.
func (s *dset) add(h uint64, u, lo int64, m int) {
	s.resetIfClear(lo)
	if !sampled(h, s.shift) {
		s.dropMax = max(s.dropMax, u)
		return
	}
	for i := range int(s.n) {
		if s.buf[i] == h {
			if u > s.unit(i) {
				s.fit(u, lo)
				// fit may have pruned and moved values; find h again.
				for j := range int(s.n) {
					if s.buf[j] == h {
						s.setUnit(j, u)
						return
					}
				}
				break // pruned: its last time was below lo, it is new again
			}
			return
		}
	}
	if int(s.n) >= m {
		s.prune(lo) // the bound is on live values: stale ones must not trigger sampling
	}
	for int(s.n) >= m && s.shift < 64 {
		s.raise()
		if !sampled(h, s.shift) {
			s.dropMax = max(s.dropMax, u)
			return
		}
	}
	s.fit(u, lo)
	if s.n == s.c {
		s.grow(m)
	}
	i := int(s.n)
	s.n++
	s.buf[i] = h
	s.setUnit(i, u)
}

// raise samples one more hash bit, dropping the values that leave the sample.
func (s *dset) raise() {
	if s.shift == 0 {
		s.dropMax = math.MinInt64
	}
	s.shift++
	j := 0
	for i := range int(s.n) {
		h, u := s.hash(i), s.unit(i)
		if sampled(h, s.shift) {
			s.buf[j] = h
			s.setUnit(j, u)
			j++
		} else {
			s.dropMax = max(s.dropMax, u)
		}
	}
	s.n = uint16(j)
}

// count writes into out[w] the distinct count of the window starting at unit thr[w]
// (values last counted at or after it) and reports whether every one was exact. A
// window starting after dropMax holds only values the set holds (see the
// invariants), so its count is exact; otherwise the held values in it are the
// 2^−shift sample of its values and each counts 2^shift. (Counting the held values
// after dropMax once each would be exact for them but biased overall: dropMax is
// itself the time of a value the sample left out.)
func (s *dset) count(thr []int64, out []int64) (exact bool) {
	exact = true
	for w, t := range thr {
		out[w] = 0
		if s.shift > 0 && t <= s.dropMax {
			exact = false
		}
		thr[w] = t - s.base // compared with offsets below; thr is the caller's scratch
	}
	// One pass over the offsets for every window, two offsets a word.
	offs := s.buf[int(s.c) : int(s.c)+(int(s.n)+1)/2]
	for i := range int(s.n) {
		off := int64(uint32(offs[i>>1] >> (32 * (uint(i) & 1))))
		for w, t := range thr {
			if off >= t {
				out[w]++
			}
		}
	}
	for w, t := range thr {
		if s.shift > 0 && t+s.base <= s.dropMax {
			out[w] = scaled(out[w], s.shift)
		}
	}
	return exact
}

// scaled is n·2^shift, saturated at math.MaxInt64.
func scaled(n int64, shift uint8) int64 {
	if n == 0 {
		return 0
	}
	if shift >= 63 || n > math.MaxInt64>>shift {
		return math.MaxInt64
	}
	return n << shift
}
