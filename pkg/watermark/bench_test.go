package watermark

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchIDs are reused cyclically; each benchmark sets the dedupe horizon well below the
// event time one cycle spans, so a reused id has always expired and is accepted.
var benchIDs = func() []string {
	ids := make([]string, 1<<18)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt-%08d-%08x", i, uint32(i)*2654435761)
	}
	return ids
}()

const benchMask = 1<<18 - 1

// BenchmarkInOrder is the L = 0 fast path: every event is the new maximum, so it is
// releasable at once and never touches the heap. One op = Offer + Ready of one event.
// Event time advances 1 ms per event, so the dedupe horizon sets how many ids are live:
// 1 000 fit in cache, 100 000 (a 2.4 MB table) do not, and each event then pays two
// cache misses (insert the new id, delete the expired one).
func BenchmarkInOrder(b *testing.B) {
	for _, live := range []int64{0, 1000, 100_000} {
		name := fmt.Sprintf("dedupe=on/live=%d", live)
		if live == 0 {
			name = "dedupe=off"
		}
		b.Run(name, func(b *testing.B) {
			s := mustNew(b, Config{AllowedLateness: 0, DedupeHorizon: max(live, 1), DisableDedupe: live == 0})
			dst := make([]Event, 0, 16)
			i := 0
			offer := func() {
				v := s.Offer(Event{Offset: int64(i), EventTime: int64(i), EventID: benchIDs[i&benchMask], EntityID: "card", Amount: 1, Size: 200})
				if v != Accepted {
					b.Fatalf("event %d: %v", i, v)
				}
				dst = s.Ready(dst[:0])
				if len(dst) != 1 {
					b.Fatalf("event %d: released %d", i, len(dst))
				}
				i++
			}
			for range 200_000 { // reach the steady-state dedupe set
				offer()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				offer()
			}
		})
	}
}

// BenchmarkPending keeps about `pending` events in the heap: event times advance 1 ms per
// event with a uniform jitter below the lateness (so arrival order is shuffled but
// nothing is late), and the lateness equals the pending target. With the horizon at
// twice the lateness about 2*pending ids are live. One op = Offer + Ready.
func BenchmarkPending(b *testing.B) {
	for _, pending := range []int{1000, 100_000} {
		for _, dedupe := range []bool{true, false} {
			b.Run(fmt.Sprintf("pending=%d/dedupe=%s", pending, map[bool]string{true: "on", false: "off"}[dedupe]), func(b *testing.B) {
				lateness := int64(pending)
				jitter := make([]int64, benchMask+1)
				r := rand.New(rand.NewPCG(1, 1))
				for k := range jitter {
					jitter[k] = r.Int64N(lateness / 2)
				}
				s := mustNew(b, Config{
					AllowedLateness: lateness, DedupeHorizon: 2 * lateness, DisableDedupe: !dedupe,
					HighEvents: 1 << 30, HighBytes: 1 << 60,
				})
				dst := make([]Event, 0, 64)
				i := 0
				offer := func() {
					t := int64(i) - jitter[i&benchMask]
					if v := s.Offer(Event{Offset: int64(i), EventTime: t, EventID: benchIDs[i&benchMask], EntityID: "card", Amount: 1, Size: 200}); v != Accepted {
						b.Fatalf("event %d: %v", i, v)
					}
					dst = s.Ready(dst[:0])
					i++
				}
				for range 4 * pending {
					offer()
				}
				if p := s.Pending(); p < pending/2 || p > 2*pending {
					b.Fatalf("steady state has %d pending, want about %d", p, pending)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					offer()
				}
			})
		}
	}
}

// BenchmarkSnapshot measures AppendSnapshot with 100 000 pending events and ids.
func BenchmarkSnapshot(b *testing.B) {
	s := mustNew(b, Config{AllowedLateness: 1 << 20})
	for i := range 100_000 {
		s.Offer(Event{Offset: int64(i), EventTime: int64(i ^ 0x55), EventID: benchIDs[i], EntityID: "card", Size: 200})
	}
	buf := s.AppendSnapshot(nil)
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		buf = s.AppendSnapshot(buf[:0])
	}
}
