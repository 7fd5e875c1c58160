package service

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// TestLost pins down which errors drop a partition for a restart from its last
// commit instead of stopping the service: in exactly-once mode those that say
// the transaction itself is gone, however deeply wrapped; in both modes a
// snapshot save fenced by a newer owner's claim.
func TestLost(t *testing.T) {
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
		{"no producer after an offsets-only commit", fmt.Errorf("partition 1: exactly-once commit of offset 9: commit transaction: committed, and then %w: %w", errTxnProducerLost, kerr.CoordinatorNotAvailable), true, true},
		{"default mode never", fmt.Errorf("produce: %w", kerr.ProducerFenced), false, false},
		{"a leader move is not a loss", fmt.Errorf("produce: %w", kerr.NotLeaderForPartition), true, false},
		{"flush timeout is not a loss", fmt.Errorf("%w: %w", sink.ErrFlushTimeout, context.DeadlineExceeded), true, false},
		{"store error is not a loss", errors.New("checkpoint: disk full"), true, false},
		{"a newer owner claimed the partition", fmt.Errorf("partition 2: save: %w", checkpoint.ErrFenced), false, true},
		{"a newer owner claimed the partition (exactly-once)", fmt.Errorf("partition 2: save: %w", checkpoint.ErrFenced), true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := &worker{}
			if c.eos {
				w.txn = new(kgo.Client) // only its presence matters here
			}
			if got := w.lost(c.err); got != c.want {
				t.Fatalf("lost(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

// TestServiceExactlyOnceSurvivesFencing runs the exactly-once service on the
// in-process broker (under the race detector in CI's unit stage) and fences
// one partition's transactional producer from outside halfway: the service
// must keep running, count the lost transaction, restore the partition in
// place, and read_committed must still see exactly one output per input
// offset, equal to the oracle's.
func TestServiceExactlyOnceSurvivesFencing(t *testing.T) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 6, 2000, partitions)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.ExactlyOnce = true
	svc, _ := startService(t, cfg)
	produce(t, brokers, st.Records[:1000])
	readOutputs(t, brokers, 1000, 30*time.Second) // read_committed: the first half is committed

	fenceTxnID(t, brokers, svc.transactionalID(0))

	produce(t, brokers, st.Records[1000:])
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
	if err := svc.Healthy(); err != nil {
		t.Fatalf("service stopped: %v", err)
	}
	if n := testutil.ToFloat64(svc.m.TxnPartitionsLost); n != 1 {
		t.Errorf("velocity_txn_partitions_lost_total = %v, want 1", n)
	}
}

// fenceTxnID initialises the transactional id id from a client of its own, as
// a new owner of its partition would: the service's producer for it is fenced,
// and the transaction it has open is aborted.
func fenceTxnID(t *testing.T, brokers []string, id string) {
	t.Helper()
	fence, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(id))
	if err != nil {
		t.Fatal(err)
	}
	defer fence.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := fence.ProducerID(ctx); err != nil {
		t.Fatalf("fence %s: %v", id, err)
	}
}

// gatedStore is a memory store whose Loads of one partition, once armed, wait
// until the gate opens (or their context ends): a restore that takes long, as
// one of a large state or a slow store does.
type gatedStore struct {
	*checkpoint.MemoryStore
	part    int32
	armed   atomic.Bool
	entered atomic.Bool
	gate    chan struct{}
}

func (s *gatedStore) Load(ctx context.Context, key checkpoint.Key) (checkpoint.Loaded, error) {
	if key.Partition == s.part && s.armed.Load() {
		s.entered.Store(true)
		select {
		case <-s.gate:
		case <-ctx.Done():
			return checkpoint.Loaded{}, ctx.Err()
		}
	}
	return s.MemoryStore.Load(ctx, key)
}

// TestReacquireRunsBesideTheOtherPartitions: the takeover of a partition whose
// transaction was lost while the group still assigns it to us (reacquireLost)
// must not hold up the instance's other partitions. It ran on the poll
// goroutine, so while partition 0's restore waited here, partition 1 fetched
// nothing new: its records produced meanwhile got no output until the restore
// was over. Now the takeover runs on a goroutine of its own; partition 1's
// outputs are committed while partition 0's restore waits, and read_committed
// then sees exactly one output per offset, equal to the oracle's.
func TestReacquireRunsBesideTheOtherPartitions(t *testing.T) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 31, 3000, partitions)
	store := &gatedStore{MemoryStore: checkpoint.NewMemoryStore(), part: 0, gate: make(chan struct{})}
	cfg := testConfig(t, brokers, store)
	cfg.ExactlyOnce = true
	svc, _ := startService(t, cfg)
	produce(t, brokers, st.Records[:1000])
	readOutputs(t, brokers, 1000, 30*time.Second)

	var p0, p1 []*kgo.Record
	for _, r := range st.Records[1000:] {
		if r.Partition == 0 {
			p0 = append(p0, r)
		} else {
			p1 = append(p1, r)
		}
	}
	// Fence partition 0's producer; its next records' transaction fails, it
	// is dropped and, the group still assigning it to us, taken over again,
	// whose restore waits at the gate.
	store.armed.Store(true)
	fenceTxnID(t, brokers, svc.transactionalID(0))
	produce(t, brokers, p0[:50])
	waitFor(t, "partition 0's takeover to wait for its restore", 30*time.Second, store.entered.Load)

	produce(t, brokers, p1)
	if got := readOutputs(t, brokers, 1000+len(p1), 30*time.Second); len(got) < 1000+len(p1) {
		t.Fatalf("%d offsets with a committed output 30 s after %d records went to partition 1 while partition 0's takeover waited, want %d: the takeover held the other partition up",
			len(got), len(p1), 1000+len(p1))
	}
	if n := testutil.ToFloat64(svc.m.TxnPartitionsLost); n != 1 {
		t.Errorf("velocity_txn_partitions_lost_total = %v, want 1", n)
	}
	if svc.Ready() {
		t.Error("ready while a partition's takeover is in progress")
	}

	close(store.gate)
	produce(t, brokers, p0[50:])
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
	if err := svc.Healthy(); err != nil {
		t.Fatalf("service stopped: %v", err)
	}
	waitFor(t, "ready again after the takeover", 10*time.Second, svc.Ready)
}
