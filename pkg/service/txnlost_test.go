package service

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// TestTxnLost pins down which errors drop an exactly-once partition for a
// restart from its last commit instead of stopping the service: only those
// that say the transaction itself is gone, however deeply wrapped, and never
// in the default mode, where there is no transaction to lose.
func TestTxnLost(t *testing.T) {
	cases := []struct {
		name string
		err  error
		eos  bool
		want bool
	}{
		{"fenced by a new owner", fmt.Errorf("partition 1: exactly-once commit of offset 9: commit transaction: %w", kerr.ProducerFenced), true, true},
		{"produce with an old epoch", fmt.Errorf("partition 1: produce to features: %w", kerr.InvalidProducerEpoch), true, true},
		{"flush wraps the produce error", fmt.Errorf("partition 1: flush before checkpoint: %w", fmt.Errorf("produce to dlq: %w", kerr.InvalidProducerEpoch)), true, true},
		{"producer id reassigned", kerr.InvalidProducerIDMapping, true, true},
		{"coordinator aborted it", kerr.InvalidTxnState, true, true},
		{"abortable", kerr.TransactionAbortable, true, true},
		{"producer state gone from the leader", fmt.Errorf("produce to dlq: %w", kerr.UnknownProducerID), true, true},
		{"default mode never", fmt.Errorf("produce: %w", kerr.ProducerFenced), false, false},
		{"a leader move is not a loss", fmt.Errorf("produce: %w", kerr.NotLeaderForPartition), true, false},
		{"flush timeout is not a loss", fmt.Errorf("%w: %w", sink.ErrFlushTimeout, context.DeadlineExceeded), true, false},
		{"store error is not a loss", errors.New("checkpoint: disk full"), true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := &worker{}
			if c.eos {
				w.txn = new(kgo.Client) // only its presence matters here
			}
			if got := w.txnLost(c.err); got != c.want {
				t.Fatalf("txnLost(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}
