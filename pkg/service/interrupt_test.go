package service

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
)

// stallingStore is a memory store whose first Load of one partition hangs
// until its context ends: a restore (or, in exactly-once mode, the fencing
// before it) still running when the group rebalances again.
type stallingStore struct {
	*checkpoint.MemoryStore
	part        int32
	stalled     atomic.Bool
	interrupted atomic.Bool
}

func (s *stallingStore) Load(ctx context.Context, key checkpoint.Key) (checkpoint.Loaded, error) {
	if key.Partition == s.part && !s.stalled.Swap(true) {
		<-ctx.Done()
		s.interrupted.Store(true)
		return checkpoint.Loaded{}, ctx.Err()
	}
	return s.MemoryStore.Load(ctx, key)
}

// TestServiceRebalanceInterruptsTakeover: a second member joins while the
// first is still taking over its partitions. franz-go cancels the takeover's
// context; that is a rebalance, not a failure. The first member must keep
// running (not stop on "context canceled"), both members take their
// partitions in the next group session, and the outputs match the oracle.
func TestServiceRebalanceInterruptsTakeover(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) {
			const partitions = 4
			brokers := newCluster(t, partitions)
			st := streamtest.Generate(inTopic, 5, 2000, partitions)
			produce(t, brokers, st.Records[:1000])
			store := &stallingStore{MemoryStore: checkpoint.NewMemoryStore(), part: 2}
			cfgA := testConfig(t, brokers, store)
			cfgA.Host, cfgA.ExactlyOnce = "a", eos
			cfgB := cfgA
			cfgB.Host = "b"

			a, stopA := startService(t, cfgA)
			waitFor(t, "a's takeover of partition 2 to stall", 20*time.Second, store.stalled.Load)
			b, stopB := startService(t, cfgB)
			waitFor(t, "the rebalance to interrupt a's takeover", 30*time.Second, store.interrupted.Load)
			waitFor(t, "a and b to share all partitions", 30*time.Second, func() bool {
				return a.numWorkers()+b.numWorkers() == partitions && a.numWorkers() > 0 && b.numWorkers() > 0
			})
			if err := a.Healthy(); err != nil {
				t.Fatalf("a stopped after its takeover was interrupted: %v", err)
			}
			if n := testutil.ToFloat64(a.m.TakeoversInterrupted); n < 1 {
				t.Errorf("velocity_takeovers_interrupted_total = %v after an interrupted takeover, want ≥ 1", n)
			}
			produce(t, brokers, st.Records[1000:])
			got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
			streamtest.Check(t, st, cfgA.Specs, got, eos)
			stopB()
			stopA()
		})
	}
}

// TestServiceShutdownDuringTakeover: a graceful stop (SIGTERM) while a
// takeover is still running closes the group client, which cancels the
// takeover the same way. Run must return nil (exit status 0), not the
// cancellation as a fatal error.
func TestServiceShutdownDuringTakeover(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) {
			brokers := newCluster(t, 2)
			store := &stallingStore{MemoryStore: checkpoint.NewMemoryStore(), part: 1}
			cfg := testConfig(t, brokers, store)
			cfg.ExactlyOnce = eos
			// stop fails the test if Run returns an error or has not returned
			// after 30 s.
			_, stop := startService(t, cfg)
			waitFor(t, "the takeover of partition 1 to stall", 20*time.Second, store.stalled.Load)
			stop()
			if !store.interrupted.Load() {
				t.Error("the stalled takeover was not cancelled by the shutdown")
			}
		})
	}
}
