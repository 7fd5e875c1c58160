package repartition

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
)

func reportCPU(b *testing.B, cpu0 int64) {
	if b.N > 0 {
		b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
	}
}

// benchStream is a repartition partition's arrival order from k sources, each sending
// its events in order with its own time as the watermark (the common case), 2 feature
// words each. burst is how many records a source sends in a row before another gets a
// turn: 1 interleaves finely, 500 makes a source run 500 events ahead of the others,
// so that about burst × k events wait for the slowest. Sources send at the same rate,
// with times 0..9 ms apart per event.
func benchStream(k, burst, n int) []Record {
	r := rand.New(rand.NewPCG(uint64(k), uint64(burst)))
	clock := make([]int64, k)
	off := make([]int64, k)
	recs := make([]Record, 0, n)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("device-%06d", i*7919)
	}
	for len(recs) < n {
		p := r.IntN(k)
		for range burst {
			clock[p] += r.Int64N(10)
			recs = append(recs, Record{Kind: KindEvent, Watermark: clock[p], Event: Event{
				Source: int32(p), Offset: off[p], EventTime: clock[p], Topic: "transactions",
				Key: keys[r.IntN(len(keys))], EventID: "evt", Amount: 100, Ext: []uint64{uint64(off[p]), 7},
			}})
			off[p]++
		}
	}
	return recs[:n]
}

// lapMerger returns a Merger of sources and its benchmark op: Offer of the next event
// of recs and a Ready into a reused slice, returning how many events it released.
// recs is replayed lap after lap, times shifted by its span plus pad and offsets by
// its length, so that it never ends and never repeats a (source, offset).
func lapMerger(b *testing.B, sources int, recs []Record, pad int64) (*Merger, func() int) {
	var span, offs int64
	for _, r := range recs {
		span = max(span, r.EventTime+1+pad)
		offs = max(offs, r.Offset+1)
	}
	m, err := New(Config{Sources: sources, ExtWords: 2})
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]Event, 0, 1024)
	n, i := len(recs), 0
	return m, func() int {
		lap := int64(i / n)
		r := recs[i%n]
		r.EventTime += lap * span
		r.Watermark += lap * span
		r.Offset += lap * offs
		if v, err := m.Offer(&r); err != nil || v != Accepted {
			b.Fatalf("record %d: %v %v", i, v, err)
		}
		dst = m.Ready(dst[:0])
		i++
		return len(dst)
	}
}

// BenchmarkMerger: one op is Offer of one event and a Ready into a reused slice (most
// Readies release one event or none). The stream is replayed with times and offsets
// shifted each lap, so it never ends and never repeats a (source, offset).
func BenchmarkMerger(b *testing.B) {
	const n = 1 << 16
	for _, k := range []int{6, 12} {
		for _, burst := range []int{1, 20, 500} {
			b.Run(fmt.Sprintf("sources=%d/burst=%d", k, burst), func(b *testing.B) {
				m, one := lapMerger(b, k, benchStream(k, burst, n), 0)
				for range 2 * n { // grow the buffers to the steady state
					one()
				}
				pending := m.Pending()
				b.ReportAllocs()
				b.ResetTimer()
				released := 0
				cpu0 := cpuclock.Nanos()
				for b.Loop() {
					released += one()
				}
				reportCPU(b, cpu0)
				b.ReportMetric(float64(pending), "pending")
				if released == 0 {
					b.Fatal("nothing released")
				}
			})
		}
	}
}

func BenchmarkRecord(b *testing.B) {
	r := sampleEvent()
	buf, _ := AppendRecord(nil, &r)
	b.Run("encode", func(b *testing.B) {
		dst := make([]byte, 0, 128)
		b.ReportAllocs()
		b.SetBytes(int64(len(buf)))
		cpu0 := cpuclock.Nanos()
		for b.Loop() {
			dst, _ = AppendRecord(dst[:0], &r)
		}
		reportCPU(b, cpu0)
	})
	b.Run("decode", func(b *testing.B) {
		var d Decoder
		var out Record
		b.ReportAllocs()
		b.SetBytes(int64(len(buf)))
		cpu0 := cpuclock.Nanos()
		for b.Loop() {
			if err := d.Decode(buf, &out); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu0)
	})
}

// BenchmarkSnapshot: AppendSnapshot and Restore of a Merger holding about 6 000
// pending events from 12 sources (the burst=500 stream).
func BenchmarkSnapshot(b *testing.B) {
	cfg := Config{Sources: 12, ExtWords: 2}
	m, _ := New(cfg)
	for _, r := range benchStream(12, 500, 1<<15) {
		m.Offer(&r)
		m.Ready(nil)
	}
	buf := m.AppendSnapshot(nil)
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(buf)))
		b.ReportMetric(float64(m.Pending()), "pending")
		for b.Loop() {
			buf = m.AppendSnapshot(buf[:0])
		}
	})
	b.Run("restore", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			if _, err := Restore(cfg, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// disorderStream is a repartition partition's arrival order from k sources that hop
// their events at acceptance, as a first stage does: each source's event times advance
// 1 ms every perMs events (perMs × 1000 events per second of event time, the rate of a
// live input whose event time follows the wall clock), a fraction late of its events
// lies up to lateMs behind its newest (accepted: the source's watermark is its newest
// time − lateMs, which every event carries), and sources take turns every 10 events.
func disorderStream(k, perMs int, lateMs int64, late float64, n int) []Record {
	r := rand.New(rand.NewPCG(uint64(k), uint64(perMs)))
	newest := make([]int64, k)
	off := make([]int64, k)
	recs := make([]Record, 0, n)
	for len(recs) < n {
		p := r.IntN(k)
		for range 10 {
			if off[p]%int64(perMs) == 0 {
				newest[p]++
			}
			t := newest[p]
			if r.Float64() < late {
				t -= r.Int64N(lateMs + 1)
			}
			w := min(t, newest[p]-lateMs)
			recs = append(recs, Record{Kind: KindEvent, Watermark: w, Event: Event{
				Source: int32(p), Offset: off[p], EventTime: t, Topic: "transactions",
				Key: "device-000042", EventID: "evt", Amount: 100, Ext: []uint64{uint64(off[p]), 7},
			}})
			off[p]++
		}
	}
	return recs[:n]
}

// BenchmarkMergerDisorder: BenchmarkMerger's op over disorderStream, 3 sources with
// 1 s of allowed lateness, so that each source keeps about perMs × 1000 events
// pending. An event that arrives behind its source's newest is inserted into the
// source's queue of late arrivals, which moves only the late events after it (in one
// sorted queue it moved every pending event after it, a cost that grew with the
// pending events rather than with the disorder's share). (The end-to-end
// groups benchmark advances event time 3.6 ms per event, about 90 events per source
// and second, so it never shows this.)
func BenchmarkMergerDisorder(b *testing.B) {
	const n = 1 << 18
	for _, perMs := range []int{1, 10, 50} {
		for _, late := range []float64{0, 0.01} {
			b.Run(fmt.Sprintf("events_per_ms=%d/late=%g", perMs, late), func(b *testing.B) {
				// A lap starts past the lateness after the last one's newest event.
				m, one := lapMerger(b, 3, disorderStream(3, perMs, 1000, late, n), 1000)
				for range n {
					one()
				}
				pending := m.Pending()
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuclock.Nanos()
				for b.Loop() {
					one()
				}
				reportCPU(b, cpu0)
				b.ReportMetric(float64(pending), "pending")
			})
		}
	}
}
