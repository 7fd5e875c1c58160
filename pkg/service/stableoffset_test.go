package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
)

// TestCommittedOffsetIsNeverReadPastAPendingTransaction: while a transaction
// that commits an offset for the partition is still open, the exactly-once
// takeover's offset read must not return the offset from before it (that
// transaction may yet commit, and resuming from the older offset would publish
// its outputs a second time). It fails with a retriable error instead, which
// the takeover retries, and reads the new offset once the transaction ends.
func TestCommittedOffsetIsNeverReadPastAPendingTransaction(t *testing.T) {
	brokers := newCluster(t, 1)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	s := &Service{cfg: cfg, log: zaptest.NewLogger(t), m: metrics.New(prometheus.NewRegistry()), adm: kadm.NewClient(newClient(t, brokers))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	commit := func(cl *kgo.Client, at int64) {
		t.Helper()
		o := kadm.Offsets{}
		o.Add(kadm.Offset{Topic: inTopic, Partition: 0, At: at, LeaderEpoch: -1})
		if _, err := kadm.NewClient(cl).CommitOffsets(ctx, cfg.Group, o); err != nil {
			t.Fatal(err)
		}
	}
	commit(newClient(t, brokers), 100)

	txn, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("pending"), kgo.DefaultProduceTopic(outTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id, epoch, err := txn.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = "pending", id, epoch, cfg.Group
	if r, err := add.RequestWith(ctx, txn); err != nil || r.ErrorCode != 0 {
		t.Fatalf("add offsets to the transaction: %v, code %d", err, r.ErrorCode)
	}
	oc := kmsg.NewPtrTxnOffsetCommitRequest()
	oc.TransactionalID, oc.ProducerID, oc.ProducerEpoch, oc.Group = "pending", id, epoch, cfg.Group
	oc.Generation, oc.MemberID = -1, ""
	md, err := s.adm.Metadata(ctx, inTopic)
	if err != nil {
		t.Fatal(err)
	}
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = inTopic, md.Topics[inTopic].ID // v6 names the topic by id
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch = 0, 200, -1
	rt.Partitions = append(rt.Partitions, rp)
	oc.Topics = append(oc.Topics, rt)
	r, err := oc.RequestWith(ctx, txn)
	if err == nil {
		err = kerr.ErrorForCode(r.Topics[0].Partitions[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("commit the offset in the transaction: %v", err)
	}

	at, _, err := s.committedOffset(ctx, 0)
	if err == nil {
		t.Fatalf("read offset %d while a transaction committing 200 was open; want a retriable error", at)
	}
	if !errors.Is(err, kerr.UnstableOffsetCommit) || !mayPass(err) {
		t.Fatalf("err = %v, want UNSTABLE_OFFSET_COMMIT, which the takeover retries", err)
	}
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if at, _, err = s.committedOffset(ctx, 0); err != nil || at != 200 {
		t.Fatalf("after the commit: offset %d, %v; want 200", at, err)
	}
}
