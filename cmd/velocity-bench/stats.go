package main

import (
	"math"
	"slices"
)

// Percentile returns the q-quantile (0 ≤ q ≤ 1) of sorted by the nearest-rank method:
// the smallest value with at least q of the sample at or below it. Nearest rank, not
// interpolation, because latencies are whole milliseconds and a p999 should be a
// latency some record actually had. NaN for an empty sample.
func Percentile(sorted []int64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	r := int(math.Ceil(q*float64(len(sorted)))) - 1
	r = min(max(r, 0), len(sorted)-1)
	return float64(sorted[r])
}

// Median of xs ignoring NaNs (a run that failed to measure something); the mean of the
// two middle values for an even count. NaN when nothing is left.
func Median(xs []float64) float64 {
	v := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	m := len(v) / 2
	if len(v)%2 == 1 {
		return v[m]
	}
	return (v[m-1] + v[m]) / 2
}

// offsetSet records which offsets of each partition produced an output, to check the
// one-output-per-input accounting without holding a map of a million entries.
type offsetSet struct {
	bits  map[int32][]uint64
	count int
	dups  int
}

func newOffsetSet() *offsetSet { return &offsetSet{bits: map[int32][]uint64{}} }

// Add marks (partition, offset); a second mark of the same pair counts as a duplicate.
func (s *offsetSet) Add(p int32, off int64) {
	if off < 0 {
		s.dups++ // not an offset any input had; count it against the run
		return
	}
	b := s.bits[p]
	w := int(off / 64)
	if w >= len(b) {
		b = append(b, make([]uint64, w-len(b)+1+len(b)/2)...)
		s.bits[p] = b
	}
	m := uint64(1) << (off % 64)
	if b[w]&m != 0 {
		s.dups++
		return
	}
	b[w] |= m
	s.count++
}
