package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// upstreamTxns is a transactional producer of the input, as a user's upstream
// producer: each call produces recs in one transaction and commits or aborts it.
func upstreamTxns(t *testing.T, brokers []string) func(recs []*kgo.Record, end kgo.TransactionEndTry) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("upstream"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return func(recs []*kgo.Record, end kgo.TransactionEndTry) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTransactionalInputCountsCommittedRecordsOnly: the input's producer uses
// transactions and aborts every other one. The records of the aborted ones and
// the transaction markers take offsets of their own, and yield nothing
// (docs/contract.md, the promise): every committed record has exactly its
// oracle's output, at its own offset, and the aborted records, of the same
// entities with large amounts, are in no entity's windows.
func TestTransactionalInputCountsCommittedRecordsOnly(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) {
			brokers := newCluster(t, 1)
			st := streamtest.Generate(inTopic, 11, 600, 1)
			txn := upstreamTxns(t, brokers)
			evs := st.ByPart[0]
			for i := 0; i < len(st.Records); i += 100 {
				chunk := st.Records[i:min(i+100, len(st.Records))]
				txn(chunk, kgo.TryCommit)
				for j, r := range chunk {
					evs[i+j].Offset = r.Offset // past the markers and aborted records before it
				}
				// At the newest event time so far: on time, so that a leak would
				// be counted in the windows, not dead-lettered as late.
				newest := evs[0].Time
				for _, e := range evs[:i+len(chunk)] {
					newest = max(newest, e.Time)
				}
				var aborted []*kgo.Record
				for j := range 20 {
					tx := codec.Transaction{EventID: fmt.Sprintf("aborted-%d-%d", i, j), EntityID: string(chunk[j].Key),
						AmountMinor: 1_000_000, Currency: "EUR", EventTime: newest}
					aborted = append(aborted, &kgo.Record{Topic: inTopic, Partition: 0, Key: chunk[j].Key, Value: codec.EncodeTransaction(&tx)})
				}
				txn(aborted, kgo.TryAbort)
			}
			if last := evs[len(evs)-1].Offset; last < int64(len(evs))+100 {
				t.Fatalf("the last committed record is at offset %d: the aborted transactions took no offsets", last)
			}

			cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
			cfg.ExactlyOnce = eos
			startService(t, cfg)
			got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
			streamtest.Check(t, st, cfg.Specs, got, eos)
		})
	}
}
