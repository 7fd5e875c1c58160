package replay

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// benchOutputs are features records as the default windows give them.
func benchOutputs(b testing.TB, n int) ([]pipeline.Output, []window.Spec) {
	specs, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		b.Fatal(err)
	}
	outs := make([]pipeline.Output, n)
	for i := range outs {
		f := codec.Features{
			EventID: "ev-" + strconv.Itoa(i), EntityID: "card-" + strconv.Itoa(i%100_000),
			EventTime: 1793491200000 + int64(i), HasPrevious: i%3 != 0, MsSincePrevious: int64(i % 977),
			SourceTopic: "transactions", SourcePartition: 1, SourceOffset: int64(i),
		}
		for _, s := range specs {
			f.Windows = append(f.Windows, codec.WindowAgg{Name: s.Name, WindowMs: s.WindowMs, BucketMs: s.BucketMs,
				Count: int64(i % 50), SumMinor: int64(i) * 31, MinMinor: 100, MaxMinor: int64(i%1000) * 100})
		}
		outs[i] = pipeline.Output{Key: []byte(f.EntityID), Value: codec.AppendFeatures(nil, &f)}
	}
	return outs, specs
}

// BenchmarkSinks measures the file sinks alone, per features record, on the
// default four windows: the part of a replay this package owns.
func BenchmarkSinks(b *testing.B) {
	outs, specs := benchOutputs(b, 1<<16)
	for _, tt := range []struct {
		name string
		open func(string) (Sink, error)
	}{
		{"parquet", func(p string) (Sink, error) { return NewParquetSink(p, specs) }},
		{"jsonl", func(p string) (Sink, error) { return NewJSONLSink(p) }},
	} {
		b.Run(tt.name, func(b *testing.B) {
			s, err := tt.open(filepath.Join(b.TempDir(), "out"))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := s.Write(&outs[i&(len(outs)-1)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.StopTimer()
			if err := s.Abort(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkJSONLParse measures turning one JSON line into a transaction.
func BenchmarkJSONLParse(b *testing.B) {
	line := []byte(`{"event_id":"ev-123456","entity_id":"card-0042","amount_minor":12345,"currency":"EUR","event_time":1793491200123}`)
	b.ReportAllocs()
	var tx codec.Transaction
	for b.Loop() {
		if rej := parseJSONTransaction(line, &tx); rej != nil {
			b.Fatal(rej)
		}
	}
}
