package sink

import (
	"bytes"
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
)

// batchAckProducer hands records in batches to another goroutine, which calls
// their promises, as the client does: the tracker's producing side and its
// promises run on different cores and share only what the sink shares.
type batchAckProducer struct {
	batch []*kgo.Record
	out   chan []*kgo.Record
}

func (p *batchAckProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	p.batch = append(p.batch, r)
	if len(p.batch) == 64 {
		p.out <- p.batch
		p.batch = make([]*kgo.Record, 0, 64)
	}
}

// BenchmarkFeaturesAckedElsewhere is one features record through the tracker, its
// promise called on another goroutine in batches (cpu-ns/op: both goroutines).
func BenchmarkFeaturesAckedElsewhere(b *testing.B) {
	p := &batchAckProducer{out: make(chan []*kgo.Record, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for batch := range p.out {
			for _, r := range batch {
				promise(r, nil)
			}
		}
	}()
	tr := New(p, "out", "dlq", "h").NewTracker(func(int64) {})
	tr.SetClock(1_700_000_000_000)
	k, v := []byte("card-1234"), bytes.Repeat([]byte{7}, 107)
	b.ReportAllocs()
	cpu0 := cpuclock.Nanos()
	for b.Loop() {
		tr.Features(k, v, 1)
	}
	close(p.out)
	<-done
	b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
}
