package watermark

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
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

// BenchmarkInOrder is already sorted input: every event is the newest, so it joins the
// sorted run and never touches the heap. With L = 0 it is released by the same Offer;
// with L = 2 s about 2 000 events wait in the run. One op = Offer + Ready of one event.
// Event time advances 1 ms per event, so the dedupe horizon sets how many ids are live:
// 1 000 fit in cache, 100 000 (a 2.4 MB table) do not, and each event then pays two
// cache misses (insert the new id, delete the expired one).
func BenchmarkInOrder(b *testing.B) {
	cases := []struct {
		name     string
		lateness int64
		live     int64 // 0 = dedupe off
	}{
		{"L=0/dedupe=off", 0, 0},
		{"L=0/dedupe=on/live=1000", 0, 1000},
		{"L=0/dedupe=on/live=100000", 0, 100_000},
		{"L=2s/dedupe=off", 2000, 0},
		{"L=2s/dedupe=on/live=2000", 2000, 2000},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s := mustNew(b, Config{AllowedLateness: c.lateness, DedupeHorizon: max(c.live, c.lateness, 1), DisableDedupe: c.live == 0})
			dst := make([]Event, 0, 16)
			i := 0
			offer := func() {
				v := s.Offer(Event{Offset: int64(i), EventTime: int64(i), EventID: benchIDs[i&benchMask], EntityID: "card", Amount: 1, Size: 200})
				if v != Accepted {
					b.Fatalf("event %d: %v", i, v)
				}
				dst = s.Ready(dst[:0])
				if int64(i) >= c.lateness && len(dst) != 1 {
					b.Fatalf("event %d: released %d", i, len(dst))
				}
				i++
			}
			for range 200_000 { // reach the steady-state dedupe set
				offer()
			}
			if len(s.heap) != 0 || int64(s.run.n) != c.lateness {
				b.Fatalf("heap %d, run %d; want 0, %d", len(s.heap), s.run.n, c.lateness)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				offer()
			}
		})
	}
}

// BenchmarkOfferNow is BenchmarkInOrder's lateness-0 cases through OfferNow, which
// releases each event without a trip through the buffer, beside Offer + Ready on
// the same input in the same run. One op = one event; cpu-ns/op is the process's CPU.
func BenchmarkOfferNow(b *testing.B) {
	for _, live := range []int64{0, 1000, 100_000} {
		for _, now := range []bool{false, true} {
			name := fmt.Sprintf("live=%d/api=%s", live, map[bool]string{false: "Offer+Ready", true: "OfferNow"}[now])
			b.Run(name, func(b *testing.B) {
				s := mustNew(b, Config{DedupeHorizon: max(live, 1), DisableDedupe: live == 0})
				dst := make([]Event, 0, 16)
				i := 0
				offer := func() {
					ev := Event{Offset: int64(i), EventTime: int64(i), EventID: benchIDs[i&benchMask], EntityID: "card", Amount: 1, Size: 200}
					if now {
						if v, ok := s.OfferNow(&ev); v != Accepted || !ok {
							b.Fatalf("event %d: %v, now %v", i, v, ok)
						}
					} else {
						if v := s.Offer(ev); v != Accepted {
							b.Fatalf("event %d: %v", i, v)
						}
						if dst = s.Ready(dst[:0]); len(dst) != 1 {
							b.Fatalf("event %d: released %d", i, len(dst))
						}
						clear(dst) // as the pipeline does, to let the strings go
					}
					i++
				}
				for range 200_000 { // reach the steady-state dedupe set
					offer()
				}
				b.ReportAllocs()
				cpu0 := cpuclock.Nanos()
				for b.Loop() {
					offer()
				}
				b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
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

// BenchmarkRestoreIDs restores a stage holding 1 M dedupe ids from an inline
// (version 1) snapshot and from a segmented one whose ids sit in the segments
// 16 checkpoints left behind (read from memory, so this is the decoding cost).
func BenchmarkRestoreIDs(b *testing.B) {
	const ids, checkpoints = 1 << 20, 16
	store := newMemSegments()
	cfg := Config{DedupeHorizon: 1 << 40, Segments: store}
	s := mustNew(b, cfg)
	var seg []byte
	var out []Event
	for i := range ids {
		s.Offer(Event{Offset: int64(i), EventTime: int64(i), EventID: fmt.Sprintf("id-%d", i), EntityID: "x"})
		out = s.Ready(out[:0]) // lateness 0: released at once, so both snapshots hold only ids
		if (i+1)%(ids/checkpoints) == 0 {
			buf, p := s.BeginSnapshot(nil)
			var err error
			if seg, err = p.Finish(buf, 0); err != nil {
				b.Fatal(err)
			}
			s.EndSnapshot(p)
			store.delete(s.SnapshotSaved(p))
		}
	}
	inline := s.AppendSnapshot(nil)
	for _, c := range []struct {
		name string
		data []byte
	}{{"inline", inline}, {"segmented", seg}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				st, err := Restore(cfg, c.data)
				if err != nil {
					b.Fatal(err)
				}
				if st.ids.len() != ids {
					b.Fatalf("%d ids restored, want %d", st.ids.len(), ids)
				}
			}
		})
	}
}

// BenchmarkEncodeSegment is the encoding of a merged segment (1.3 M ids, 31 MB: four
// checkpoints' worth at about 340 000 events/s over 4 partitions) into a buffer kept
// from the last one ("warm") and into a new one ("fresh"), whose pages the kernel
// provides on first touch. It tells what a checkpoint's first merge at a level costs
// beyond the encoding itself.
func BenchmarkEncodeSegment(b *testing.B) {
	const n = 1_300_000
	var r idRing
	for i := range n {
		r.push(idEntry{k: idKey{hi: uint64(i) * 0x9e3779b97f4a7c15, lo: uint64(i) + 1}, t: int64(i)})
	}
	v := r.view()
	size := segHeadLen + n*idEntryLen + crcLen
	b.Run("warm", func(b *testing.B) {
		buf := make([]byte, 0, size)
		b.SetBytes(int64(size))
		for b.Loop() {
			buf = encodeSegment(buf[:0], &v, 0, segment{count: n})
		}
	})
	b.Run("fresh", func(b *testing.B) {
		b.SetBytes(int64(size))
		for b.Loop() {
			buf := encodeSegment(nil, &v, 0, segment{count: n})
			if len(buf) != size {
				b.Fatalf("segment of %d bytes, want %d", len(buf), size)
			}
		}
	})
}

// BenchmarkDedupeGrow fills a fresh Stage's dedupe set with 250 000 ids in order
// (nothing expires), about what one partition holds after a 1 M-event run over 4
// partitions: the set's growth from empty, with its tables' first touches of fresh
// memory, which is most of what the dedupe stage costs end to end. One op = one id.
func BenchmarkDedupeGrow(b *testing.B) {
	const n = 250_000
	b.ReportAllocs()
	cpu0 := cpuclock.Nanos()
	ops := 0
	for b.Loop() {
		s := mustNew(b, Config{DedupeHorizon: 1 << 40})
		for i := range n {
			ev := Event{Offset: int64(i), EventTime: int64(i), EventID: benchIDs[i], EntityID: "card", Amount: 1, Size: 200}
			if v, ok := s.OfferNow(&ev); v != Accepted || !ok {
				b.Fatalf("event %d: %v, now %v", i, v, ok)
			}
		}
		ops++
	}
	b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(ops*n), "cpu-ns/id")
	b.ReportMetric(0, "ns/op")
}
