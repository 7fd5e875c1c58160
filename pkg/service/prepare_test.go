package service

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// outageDecoder is our fast decoder behind a Prepare that fails while down,
// as the schema-registry decoder does while the registry is unreachable.
type outageDecoder struct {
	codec.Decoder
	down     atomic.Bool
	attempts atomic.Int64
}

func (d *outageDecoder) Prepare(context.Context, []byte) error {
	if d.down.Load() {
		d.attempts.Add(1)
		return errors.New("schema registry unavailable (test)")
	}
	return nil
}

// While the decoder cannot prepare, partitions hold their records: nothing is
// dead-lettered and nothing is skipped. When it can again, every record is
// processed exactly as without the outage.
func TestServiceHoldsPartitionsWhileDecoderCannotPrepare(t *testing.T) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 11, 1500, partitions)
	produce(t, brokers, st.Records)
	fast, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	dec := &outageDecoder{Decoder: fast}
	dec.down.Store(true)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.Decoder = dec
	startService(t, cfg)

	// Backoff from 200 ms: by 3 attempts per partition the hold has been
	// retried and still let nothing through.
	waitFor(t, "retries while down", 20*time.Second, func() bool { return dec.attempts.Load() >= 3*partitions })
	if got := readOutputs(t, brokers, 1, time.Second); len(got) != 0 {
		t.Fatalf("%d source offsets have output while the decoder could not prepare; want none", len(got))
	}
	before := dec.attempts.Load()
	time.Sleep(300 * time.Millisecond)
	if after := dec.attempts.Load(); after-before > 4*partitions {
		t.Fatalf("%d attempts in 300 ms: the hold retries without backoff", after-before)
	}

	dec.down.Store(false)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
}
