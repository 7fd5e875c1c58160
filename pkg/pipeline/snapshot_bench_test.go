package pipeline

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// BenchmarkCheckpointPause measures how long a checkpoint stops the partition, in the
// state of one partition of the end-to-end latency run at half the peak rate (one of 4
// partitions: 25 000 entities,
// Zipf, default windows and --max-entities cap, 2 M live dedupe ids). It reports
// the one stop of AppendSnapshot against the longest single stop of the stepped
// snapshot as the service takes it (BeginSnapshot, then Step(256) between batches),
// in the same run: ns/op is one whole checkpoint's work on the partition goroutine.
func BenchmarkCheckpointPause(b *testing.B) {
	p := benchProcessor(b, window.Options{MaxEntities: 5_000_000})
	const events = 2_000_000
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rand.New(rand.NewPCG(3, 4)), 1.1, 1, 24_999)
	emit := func(*Output) {}
	t0 := exampleT
	for i := range events {
		tx := codec.Transaction{EventID: fmt.Sprintf("evt-%09d", i), EntityID: fmt.Sprintf("card-%d", zipf.Uint64()), AmountMinor: rng.Int64N(10000), Currency: "EUR", EventTime: t0 + int64(i)/67}
		p.Process(Record{Offset: int64(i), Value: codec.EncodeTransaction(&tx)}, emit)
	}
	b.Logf("%d entities", p.Entities())

	b.Run("AppendSnapshot", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			buf = p.AppendSnapshot(buf[:0])
		}
		b.ReportMetric(float64(len(buf)), "bytes")
	})
	b.Run("stepped", func(b *testing.B) {
		var buf []byte
		var stops []time.Duration
		for b.Loop() {
			start := time.Now()
			ps := p.BeginSnapshot(buf[:0])
			stops = append(stops, time.Since(start))
			for {
				start = time.Now()
				done := ps.Step(256)
				stops = append(stops, time.Since(start))
				if done {
					break
				}
			}
			buf, _ = ps.Finish()
			p.EndSnapshot(ps)
		}
		slices.Sort(stops)
		b.ReportMetric(float64(stops[len(stops)-1].Microseconds()), "max-stop-µs")
		b.ReportMetric(float64(stops[len(stops)/2].Microseconds()), "median-stop-µs")
		b.ReportMetric(float64(len(buf)), "bytes")
	})
}

// BenchmarkProcessHints is Process over fetched batches, lateness 0, dedupe on, with
// and without the lookahead hints the service gives (Hint on the records ahead in the
// batch), over two workloads: 1 M entities uniform (nearly every lookup misses the
// cache) and velocity-bench's Zipf(s=1.1, v=10) over 100 000 entities (the hot ones
// stay cached). The table is warmed with one event per entity first.
func BenchmarkProcessHints(b *testing.B) {
	for _, wl := range []struct {
		name     string
		entities int
		zipf     bool
	}{
		{"uniform-1M", 1_000_000, false},
		{"zipf-100k", 100_000, true},
	} {
		b.Run(wl.name, func(b *testing.B) { benchProcessHints(b, wl.entities, wl.zipf) })
	}
}

func benchProcessHints(b *testing.B, entities int, zipf bool) {
	const n = 1 << 21
	rng := rand.New(rand.NewPCG(5, 6))
	z := rand.NewZipf(rng, 1.1, 10, uint64(entities-1))
	recs := make([]Record, n)
	for i := range recs {
		e := i % entities // the warm-up pass touches each entity once
		if i >= entities {
			if zipf {
				e = int(z.Uint64()*7919) % entities // scatter ranks over ids
			} else {
				e = rng.IntN(entities)
			}
		}
		tx := codec.Transaction{EventID: fmt.Sprintf("evt-%09d", i), EntityID: fmt.Sprintf("card-%07d", e), AmountMinor: rng.Int64N(10000), Currency: "EUR", EventTime: exampleT + int64(i)}
		recs[i] = Record{Offset: int64(i), Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)}
	}
	emit := func(*Output) {}
	for _, hints := range []bool{false, true} {
		b.Run(fmt.Sprintf("hints=%v", hints), func(b *testing.B) {
			p := benchProcessor(b, window.Options{})
			const batch = 1000
			run := func(recs []Record) {
				for i := range recs {
					if hints {
						if j := i + 2*HintDistance; j < len(recs) {
							p.Hint(recs[j].Key, recs[j].Value, 2*HintDistance)
						}
						if j := i + HintDistance; j < len(recs) {
							p.Hint(recs[j].Key, recs[j].Value, HintDistance)
						}
					}
					p.Process(recs[i], emit)
				}
			}
			for lo := 0; lo < entities; lo += batch {
				run(recs[lo : lo+batch])
			}
			rest := recs[entities:]
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			cpu0 := cpuclock.Nanos()
			for b.Loop() {
				if i+batch > len(rest) {
					b.Fatalf("benchmark ran past its %d prepared records; lower -benchtime", len(rest))
				}
				run(rest[i : i+batch])
				i += batch
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i), "ns/record")
			b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(i), "cpu-ns/record")
		})
	}
}

// benchProcessor is a processor with the default windows, lateness 0, dedupe on.
func benchProcessor(b *testing.B, wopts window.Options) *Processor {
	b.Helper()
	sp, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		b.Fatal(err)
	}
	dec, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Config{Topic: "tx", Specs: sp, Late: LateDLQ, Decoder: dec, Window: wopts}, 0)
	if err != nil {
		b.Fatal(err)
	}
	return p
}
