package main

import (
	"os"
	"testing"
	"unsafe"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// BenchmarkSeedSequence is our side of the comparison with the seed Python library
// (bench/python/seed_window.py): the same event sequence file, every event counted into
// its entity's window(s) and the aggregates read back, starting from an empty table
// each pass, as the Python script does. One op is one whole pass; ns/event is the
// per-event cost the two are compared on.
//
// It needs a sequence file and is skipped without one:
//
//	velocity-bench seq --out /tmp/seq.bin
//	VELOCITY_BENCH_SEQ=/tmp/seq.bin go test -run '^$' -bench SeedSequence -count 5 ./cmd/velocity-bench/
func BenchmarkSeedSequence(b *testing.B) {
	path := os.Getenv("VELOCITY_BENCH_SEQ")
	if path == "" {
		b.Skip("set VELOCITY_BENCH_SEQ to a file from `velocity-bench seq`")
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	evs, err := ReadSeq(f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	// Entity ids as the pipeline hands them to the table: the decoder's entity string
	// points into the record it just read, and a fetch holds its records one after
	// another. So each event gets its own copy of its id, in event order in one
	// buffer, built outside the timed loop (the Python side builds its strings at
	// load time too). A slice of one string per entity indexed by the event's entity
	// number, as this benchmark first did, costs two cache misses per event (string
	// header, then bytes) that the pipeline never pays: about a third of the time.
	arena := make([]byte, 0, len(evs)*len(EntityID(0)))
	for _, e := range evs {
		arena = append(arena, EntityID(e.Entity)...)
	}
	ids := make([]string, len(evs))
	for i, at := 0, 0; i < len(evs); i++ {
		n := len(EntityID(evs[i].Entity))
		ids[i] = unsafe.String(&arena[at], n)
		at += n
	}
	for _, c := range []struct {
		name, specs string
		lookahead   int
	}{
		{"windows=1(5m:5s)", "5m:5s", 0},
		{"windows=4", "1m:1s,5m:5s,1h:1m,24h:1h", 0},
		// The same passes with the table's prefetch hints: Prefetch for the event
		// 2·lookahead ahead, PrefetchRecord for the one lookahead ahead.
		{"windows=1(5m:5s),lookahead=4", "5m:5s", 4},
		{"windows=1(5m:5s),lookahead=8", "5m:5s", 8},
		{"windows=4,lookahead=8", "1m:1s,5m:5s,1h:1m,24h:1h", 8},
	} {
		specs, err := window.ParseSpecs(c.specs)
		if err != nil {
			b.Fatal(err)
		}
		d := c.lookahead
		b.Run(c.name, func(b *testing.B) {
			out := make([]window.Agg, len(specs))
			var sink int64
			expired := 0
			b.ReportAllocs()
			cpu0 := cpuclock.Nanos()
			for b.Loop() {
				tbl, err := window.NewTable(specs, window.Options{})
				if err != nil {
					b.Fatal(err)
				}
				for i, e := range evs {
					if d > 0 {
						if j := i + 2*d; j < len(evs) {
							tbl.Prefetch(ids[j])
						}
						if j := i + d; j < len(evs) {
							tbl.PrefetchRecord(ids[j])
						}
					}
					// An event older than its entity's retained buckets is refused
					// (ErrExpired) and counted here; the 2 s disorder never gets there.
					if _, _, err := tbl.Apply(ids[i], e.T, e.Amount, out); err != nil {
						expired++
						continue
					}
					sink += out[0].Count + out[0].Sum
				}
			}
			cpu := cpuclock.Nanos() - cpu0
			if sink == 0 || expired > 0 {
				b.Fatalf("sink=%d expired=%d: the sequence was not applied as expected", sink, expired)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(evs)), "ns/event")
			b.ReportMetric(float64(cpu)/float64(b.N)/float64(len(evs)), "cpu-ns/event")
		})
	}
}
