package checkpoint

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// The target: a snapshot of 1 M entities (default windows, a few
// events each) written in ≤ 1 s, restored in ≤ 1 s, ≤ 200 MB.
const (
	benchEntities        = 1_000_000
	benchEventsPerEntity = 3
)

// benchConfig is the service's default configuration (cmd/velocity-consumer flags).
func benchConfig(b *testing.B) pipeline.Config {
	specs, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		b.Fatal(err)
	}
	dec, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		b.Fatal(err)
	}
	return pipeline.Config{
		Topic: "transactions", Partition: 0, Specs: specs,
		Window:    window.Options{MaxEntities: 5_000_000, HistoryTTLMs: (7 * 24 * time.Hour).Milliseconds()},
		Watermark: watermark.Config{AllowedLateness: 1000, DedupeHorizon: (24 * time.Hour).Milliseconds(), IdleTimeout: 2 * time.Second},
		Decoder:   dec,
	}
}

var (
	benchOnce  sync.Once
	benchState []byte
	benchNext  int64
	benchSetup time.Duration
)

// benchSnapshot builds, once per test binary, a processor holding 1 M
// entities with 3 events each spread over 2 hours of event time (so every
// window has buckets), and its encoded state. The dedupe set holds all 3 M
// event ids: they are inside the default 24 h horizon.
func benchSnapshot(b *testing.B) (*pipeline.Processor, []byte) {
	cfg := benchConfig(b)
	var proc *pipeline.Processor
	benchOnce.Do(func() {
		start := time.Now()
		p, err := pipeline.New(cfg, 0)
		if err != nil {
			b.Fatal(err)
		}
		base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
		n := benchEntities * benchEventsPerEntity
		discard := func(*pipeline.Output) {}
		var tx codec.Transaction
		for i := range n {
			tx = codec.Transaction{
				EventID:     fmt.Sprintf("ev-%08d", i),
				EntityID:    fmt.Sprintf("card-%07d", (i*7919)%benchEntities),
				AmountMinor: int64(i % 100_000),
				Currency:    "EUR",
				EventTime:   base + int64(i)*(2*3600*1000)/int64(n),
			}
			p.Process(pipeline.Record{Topic: cfg.Topic, Offset: int64(i), Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)}, discard)
		}
		if p.Entities() != benchEntities {
			b.Fatalf("%d entities, want %d", p.Entities(), benchEntities)
		}
		benchState = p.AppendSnapshot(nil)
		benchNext = p.Next()
		benchSetup = time.Since(start)
		proc = p
	})
	if proc == nil {
		var err error
		if proc, err = pipeline.Restore(cfg, benchState); err != nil {
			b.Fatal(err)
		}
	}
	return proc, benchState
}

// BenchmarkSnapshotWrite1M: encode the processor's state, frame it and save it
// durably (FileStore: write, fsync, rename, fsync the directory).
func BenchmarkSnapshotWrite1M(b *testing.B) {
	proc, state := benchSnapshot(b)
	st, err := NewFileStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	key := Key{Group: "bench", Topic: "transactions", Partition: 0}
	buf := make([]byte, 0, len(state))
	b.ReportAllocs()
	b.SetBytes(int64(len(state)))
	b.ResetTimer()
	for b.Loop() {
		buf = proc.AppendSnapshot(buf[:0])
		if err := st.Save(context.Background(), key, Snapshot{Next: proc.Next(), State: buf}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(buf))/1e6, "MB/snapshot")
}

// BenchmarkSnapshotEncode1M: the encoding alone (no I/O).
func BenchmarkSnapshotEncode1M(b *testing.B) {
	proc, state := benchSnapshot(b)
	buf := make([]byte, 0, len(state))
	b.ReportAllocs()
	b.SetBytes(int64(len(state)))
	b.ResetTimer()
	for b.Loop() {
		buf = proc.AppendSnapshot(buf[:0])
	}
}

// BenchmarkSnapshotRestore1M: load from the FileStore (read, checksum) and
// rebuild a processor.
func BenchmarkSnapshotRestore1M(b *testing.B) {
	_, state := benchSnapshot(b)
	cfg := benchConfig(b)
	st, err := NewFileStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	key := Key{Group: "bench", Topic: "transactions", Partition: 0}
	if err := st.Save(context.Background(), key, Snapshot{Next: benchNext, State: state}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(state)))
	b.ResetTimer()
	for b.Loop() {
		l, err := st.Load(context.Background(), key)
		if err != nil {
			b.Fatal(err)
		}
		p, err := pipeline.Restore(cfg, l.State)
		if err != nil {
			b.Fatal(err)
		}
		if p.Entities() != benchEntities {
			b.Fatalf("restored %d entities", p.Entities())
		}
	}
	b.ReportMetric(float64(len(state))/1e6, "MB/snapshot")
	// pipeline layout: magic 4 | next 8 | lastSweep 8 | len 8 | watermark stage | len 8 | window table
	stage := binary.BigEndian.Uint64(state[20:])
	b.Logf("setup (3 M events through the pipeline) took %s; snapshot %.1f MB = watermark stage (reorder buffer + dedupe set) %.1f MB + window table %.1f MB",
		benchSetup.Round(time.Millisecond), float64(len(state))/1e6, float64(stage)/1e6, float64(len(state)-36-int(stage))/1e6)
}
