package window

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkEvictIdle is one idle sweep over 100 000 entities, newest events spread
// over an hour, the default windows, that finds nothing to evict: the steady case (a
// sweep runs every minute of event time over every entity of the partition).
//
//   - active: every entity still has events in its 24 h window;
//   - headers: 25 h later, every entity has been shrunk to a header by an earlier
//     sweep and is kept for the history TTL (7 days).
func BenchmarkEvictIdle(b *testing.B) {
	const n = 100_000
	const hour = 3600_000
	tbl := mustTable(b, DefaultSpecs, Options{})
	out := make([]Agg, 4)
	rng := rand.New(rand.NewPCG(1, 2))
	now := int64(1_800_000_000_000)
	for i := range n {
		id := fmt.Sprintf("card-%07d", i)
		t0 := now - rng.Int64N(hour)
		for j := range 1 + rng.IntN(3) {
			if _, _, err := tbl.Apply(id, t0+int64(j)*1000, 100, out); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name string
		wm   int64
	}{{"active", now}, {"headers", now + 25*hour}} {
		b.Run(c.name, func(b *testing.B) {
			tbl.EvictIdle(c.wm) // the sweep that shrinks, before the measured ones
			b.ReportAllocs()
			for b.Loop() {
				if got := tbl.EvictIdle(c.wm); got != 0 {
					b.Fatalf("evicted %d", got)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/entity")
		})
	}
}
