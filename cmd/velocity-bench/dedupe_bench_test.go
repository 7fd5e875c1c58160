package main

import (
	"fmt"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// BenchmarkDedupeGrowth measures what the dedupe set's growth costs a stage that starts
// empty, as every throughput run of `velocity-bench compare` does: its profiles showed
// the set's rehashing (watermark idShard.grow) as a large part of dedupe. One op is
// Offer + Ready of one event with a fresh id, lateness 0.
//
//   - fresh: a new stage per 250 000 events (one partition's share of a 1 M-event run),
//     whose set grows from empty and doubles its way up;
//   - steady: a stage that already holds 250 000 live ids and expires one for each new
//     one (horizon = 250 000 ms at 1 ms per event), so the set keeps its size.
//
// fresh − steady bounds what sizing the set ahead (a capacity hint at construction,
// which pkg/watermark does not take yet) would save a fresh start; a steady-state
// service, whose set stopped growing, pays steady.
func BenchmarkDedupeGrowth(b *testing.B) {
	const n = 250_000
	ids := make([]string, 4*n)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt-%012d-%08x-bench-dedupe", i, uint32(i)*2654435761) // 36 bytes, as the workload's
	}
	offerAll := func(b *testing.B, s *watermark.Stage, from, count int, dst []watermark.Event) []watermark.Event {
		for i := from; i < from+count; i++ {
			ev := watermark.Event{Offset: int64(i), EventTime: int64(i), EventID: ids[i%len(ids)], EntityID: "card", Amount: 1, Size: 200}
			if v := s.Offer(ev); v != watermark.Accepted {
				b.Fatalf("event %d: %v", i, v)
			}
			dst = s.Ready(dst[:0])
		}
		return dst
	}
	b.Run("fresh", func(b *testing.B) {
		dst := make([]watermark.Event, 0, 16)
		b.ReportAllocs()
		for b.Loop() {
			s, err := watermark.New(watermark.Config{DedupeHorizon: 24 * 3600 * 1000})
			if err != nil {
				b.Fatal(err)
			}
			dst = offerAll(b, s, 0, n, dst)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
	})
	b.Run("steady", func(b *testing.B) {
		s, err := watermark.New(watermark.Config{DedupeHorizon: n})
		if err != nil {
			b.Fatal(err)
		}
		dst := offerAll(b, s, 0, 2*n, make([]watermark.Event, 0, 16)) // full, and past one turnover
		next := 2 * n
		b.ReportAllocs()
		for b.Loop() {
			dst = offerAll(b, s, next, n, dst)
			next += n
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
	})
}
