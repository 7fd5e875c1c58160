//go:build integration

package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/replay"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Replay benchmark sizes: a million events over 100 000 entities is enough for the
// fetch, the pipeline and the sink to reach their steady rates (BENCHMARKS.md,
// "Replay", states the figures for these sizes).
const (
	benchEvents     = 1_000_000
	benchPartitions = 4
	benchEntities   = 100_000
)

var benchTopic = struct {
	once sync.Once
	name string
	err  error
}{}

// replayBenchTopic produces the benchmark's input once per test binary: 1 M
// transactions over 100 k entities, event time advancing 1 ms per event with
// a little disorder (within the default 1 s lateness), spread over 4
// partitions by entity as a keyed producer would.
func replayBenchTopic(b *testing.B, addr string) string {
	benchTopic.once.Do(func() {
		benchTopic.name = kafkatest.CreateTopic(b, addr, benchPartitions, nil)
		cl := kafkatest.Client(b, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(0),
			kgo.ProducerBatchCompression(kgo.Lz4Compression()), kgo.ProducerBatchMaxBytes(1<<20))
		ctx := kafkatest.Context(b, 5*time.Minute)
		recs := make([]*kgo.Record, 0, 50_000)
		for i := range benchEvents {
			entity := "card-" + strconv.Itoa((i*7919)%benchEntities)
			tx := codec.Transaction{
				EventID: "ev-" + strconv.Itoa(i), EntityID: entity,
				AmountMinor: int64(100 + (i*31)%100_000), Currency: "EUR",
				EventTime: replayT0 + int64(i) - int64((i*13)%200),
			}
			recs = append(recs, &kgo.Record{
				Topic: benchTopic.name, Partition: int32((i*7919)%benchEntities) % benchPartitions,
				Key: []byte(entity), Value: codec.EncodeTransaction(&tx),
			})
			if len(recs) == cap(recs) || i == benchEvents-1 {
				if benchTopic.err = kafkatest.Produce(ctx, cl, recs...); benchTopic.err != nil {
					return
				}
				recs = recs[:0]
			}
		}
	})
	if benchTopic.err != nil {
		b.Fatal(benchTopic.err)
	}
	return benchTopic.name
}

// BenchmarkReplay replays 1 M events from the real broker to Parquet and to
// JSON lines with the default windows and lateness, through the same code as
// `velocity-consumer replay` (pkg/replay), and reports events/s. Each
// iteration is one whole replay, so run a fixed number of them:
//
//	go test -tags integration -run '^$' -bench BenchmarkReplay -benchtime 1x -count 3 ./integration/
func BenchmarkReplay(b *testing.B) {
	addr := kafkatest.Broker(b)
	topic := replayBenchTopic(b, addr)
	specs, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		b.Fatal(err)
	}
	dec, err := codec.NewDecoder("", codec.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	pc := pipeline.Config{
		Specs:     specs,
		Window:    window.Options{MaxEntities: 5_000_000, HistoryTTLMs: (7 * 24 * time.Hour).Milliseconds()},
		Watermark: watermark.Config{AllowedLateness: 1000, DedupeHorizon: (24 * time.Hour).Milliseconds()},
		Decoder:   dec,
	}
	for _, tt := range []struct {
		name string
		open func(path string) (replay.Sink, error)
	}{
		{"parquet", func(p string) (replay.Sink, error) { return replay.NewParquetSink(p+".parquet", specs) }},
		{"jsonl", func(p string) (replay.Sink, error) { return replay.NewJSONLSink(p + ".jsonl") }},
		// The fetch and the pipeline alone, to tell the sinks' cost from the rest.
		{"discard", func(string) (replay.Sink, error) { return discardSink{}, nil }},
	} {
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			var records, size int64
			var cpu time.Duration
			for b.Loop() {
				cpu0 := cpuTime()
				ctx := context.Background()
				src, err := replay.OpenTopic(ctx, replay.TopicConfig{Brokers: kafkatest.Seeds(addr), Topic: topic, From: replay.Start, To: replay.End})
				if err != nil {
					b.Fatal(err)
				}
				out := filepath.Join(b.TempDir(), "features")
				s, err := tt.open(out)
				if err != nil {
					b.Fatal(err)
				}
				res, err := replay.Run(ctx, src, replay.Config{Pipeline: pc, Features: s})
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Commit(ctx); err != nil {
					b.Fatal(err)
				}
				if res.Records != benchEvents {
					b.Fatalf("replayed %d records, want %d", res.Records, benchEvents)
				}
				records += res.Records
				cpu += cpuTime() - cpu0
				if st, err := os.Stat(out + "." + tt.name); err == nil {
					size = st.Size()
				}
			}
			b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "events/s")
			// The machine is shared: CPU time says what the replay costs when
			// wall-clock time includes waiting for other processes' turns.
			b.ReportMetric(float64(records)/cpu.Seconds(), "events/cpu-s")
			b.ReportMetric(float64(size)/benchEvents, "file_B/event")
			b.Logf("%s: %d events, file %d bytes, %v CPU", tt.name, benchEvents, size, cpu)
		})
	}
}

type discardSink struct{}

func (discardSink) Write(*pipeline.Output) error { return nil }
func (discardSink) Commit(context.Context) error { return nil }
func (discardSink) Abort() error                 { return nil }

// cpuTime is the user+system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
