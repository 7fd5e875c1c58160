package service

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// blockingSaveStore is a memory store that holds one save of partition part,
// the first whose Next is at least from, until the test closes unblock; it
// sends that snapshot's Next on blocked when the save begins to wait.
type blockingSaveStore struct {
	*checkpoint.MemoryStore
	part    int32
	from    int64
	armed   atomic.Bool
	blocked chan int64
	unblock chan struct{}
}

func (s *blockingSaveStore) Save(ctx context.Context, key checkpoint.Key, snap checkpoint.Snapshot) error {
	if key.Partition == s.part && snap.Next >= s.from && !s.armed.Swap(true) {
		s.blocked <- snap.Next
		select {
		case <-s.unblock:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.MemoryStore.Save(ctx, key, snap)
}

// TestExactlyOnceProcessesOnWhileItsTransactionCommits: an exactly-once
// checkpoint's save, and with it the transaction's commit, is held up, and
// records keep arriving. The partition goes on processing them (it used to
// stop from the cut until the commit), and none of their outputs reaches the
// log before the transaction that covers the offsets below the cut has
// committed: they belong to the next one. Then, whatever ends the held
// checkpoint, read_committed sees exactly one output per input offset, equal
// to the oracle's:
//   - it commits: the outputs held go into the next transaction;
//   - the partition is fenced meanwhile: the commit fails, the outputs held are
//     dropped, and the partition, taken over in place, makes them again;
//   - the service is stopped meanwhile: its last checkpoint, after the held
//     one, commits them, and a new instance resumes after them.
func TestExactlyOnceProcessesOnWhileItsTransactionCommits(t *testing.T) {
	for _, end := range []string{"commits", "fenced", "stopped"} {
		t.Run(end, func(t *testing.T) {
			const partitions = 2
			brokers := newCluster(t, partitions)
			st := streamtest.Generate(inTopic, 7, 2000, partitions)
			store := &blockingSaveStore{MemoryStore: checkpoint.NewMemoryStore(), part: 0, from: 200,
				blocked: make(chan int64, 1), unblock: make(chan struct{})}
			unblock := func() {
				select {
				case <-store.unblock:
				default:
					close(store.unblock)
				}
			}
			t.Cleanup(unblock)
			cfg := testConfig(t, brokers, store)
			cfg.ExactlyOnce = true
			var newest atomic.Int64 // the newest input offset of partition 0 that an output accounts for
			newest.Store(-1)
			cfg.Observe = func(o *pipeline.Output) {
				if o.Hop || o.SourcePartition != 0 {
					return
				}
				for cur := newest.Load(); o.SourceOffset > cur && !newest.CompareAndSwap(cur, o.SourceOffset); cur = newest.Load() {
				}
			}
			svc, stop := startService(t, cfg)
			produce(t, brokers, st.Records[:1000])
			var next int64
			select {
			case next = <-store.blocked:
			case <-time.After(30 * time.Second):
				t.Fatal("no checkpoint of partition 0 reached the store")
			}
			produce(t, brokers, st.Records[1000:])
			waitFor(t, "partition 0 to process records past the checkpoint that waits for its save", 20*time.Second,
				func() bool { return newest.Load() >= next })

			// Nothing of the offsets from the cut on is in the log, committed or not.
			log := streamtest.ReadOutputs(t, inTopic, outTopic, dlqTopic, len(st.Records), 2*time.Second,
				kgo.SeedBrokers(brokers...), kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
			for src := range log {
				if src.Partition == 0 && src.Offset >= next {
					t.Fatalf("partition 0 offset %d is in the log while the transaction that commits offset %d is still open: it went into that transaction", src.Offset, next)
				}
			}

			switch end {
			case "fenced":
				fenceTxnID(t, brokers, svc.transactionalID(0))
				unblock()
			case "stopped":
				stopped := make(chan struct{})
				go func() { stop(); close(stopped) }()
				// Not ready once the poll loop has ended: the shutdown's
				// checkpoints then wait for the held one.
				waitFor(t, "the shutdown to begin", 10*time.Second, func() bool { return !svc.Ready() })
				unblock()
				<-stopped
				svc, _ = startService(t, cfg)
			default:
				unblock()
			}
			got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
			streamtest.Check(t, st, cfg.Specs, got, true)
			if err := svc.Healthy(); err != nil {
				t.Fatalf("service stopped: %v", err)
			}
			wantLost := 0.0
			if end == "fenced" {
				wantLost = 1
			}
			if n := testutil.ToFloat64(svc.m.TxnPartitionsLost); n != wantLost {
				t.Errorf("velocity_txn_partitions_lost_total = %v, want %v", n, wantLost)
			}
		})
	}
}
