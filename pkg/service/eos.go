package service

// Exactly-once output (Config.ExactlyOnce).
//
// Design: one transactional producer per assigned input partition, with the
// transactional id "velocity-<group>-<topic>-<partition>", and the offset
// commit sent inside that producer's transaction (AddOffsetsToTxn +
// TxnOffsetCommit), rather than franz-go's GroupTransactSession. Why:
//
//   - Checkpoints here are per partition, on each worker's own clock, and a
//     partition is the unit that moves between instances. A GroupTransactSession
//     has one transaction for every partition of the instance: each interval it
//     would have to stop all workers at once, and any rebalance aborts all of
//     their work, not just the moving partition's.
//   - Fencing follows the partition. The new owner of partition p initialises
//     the producer with p's transactional id before it reads the committed
//     offset, which aborts whatever transaction a crashed or zombie previous
//     owner left open and fences that owner's later writes. Only then is the
//     committed offset read, and it is final. It does so as soon as the group
//     assigns p (Service.fenceOnAssign), before franz-go's own stable offset
//     fetch, which an offset commit pending in such a transaction would
//     otherwise hold until the transaction timed out.
//   - The cost is one producer client (and its connections) per assigned
//     partition; fine for tens of partitions per instance, worth revisiting
//     for hundreds.
//
// The offset commit carries no group generation (generation -1, no member id):
// the broker accepts transactional commits without member information, and
// fencing comes from the transactional id, so a rebalance racing a checkpoint
// does not fail the commit of a partition that is still ours.
//
// Per checkpoint interval, whenever the partition's state changed (records
// processed, or events released by the idle timeout after the input went
// quiet: the offset need not have moved), whether or not anything was
// published (a second stage that read only markers commits a transaction
// holding the offset commit alone: endOffsetsOnlyTxn):
//
//	cut at next (on the worker goroutine; the gate holds what follows)
//	→ flush (all outputs of offsets < next are in the open transaction)
//	→ save the snapshot {Next: next, ID: (epoch, seq)} durably
//	→ AddOffsetsToTxn + TxnOffsetCommit(next, metadata: the ID)
//	→ EndTransaction(commit) → BeginTransaction
//	→ release the gate into the new transaction (on the worker goroutine)
//
// Everything after the cut runs beside the partition, which goes on
// processing: the outputs of the offsets from next on wait in the gate
// (worker.gate) for the next transaction, so none of them enters this one.
// Had the partition stopped from the cut to the commit instead, as it once
// did, each checkpoint's flush, save and three requests (0.2–0.6 s every 5 s)
// came off its throughput.
//
// The snapshot is saved before the commit, so after a crash in between the
// newest snapshot is ahead of the committed transaction; recovery then steps
// back to the previous snapshot, whose Next is the committed offset (see
// checkpoint.ForCommitted and Service.restore). Which of the two it is, is
// named by the snapshot ID the commit carries in its metadata
// ("velocity-snapshot:<epoch>.<seq>"): a checkpoint after an idle release
// publishes outputs without moving the offset, so two snapshots can share a
// Next, and only the ID tells the committed one from the aborted one.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/internal/retry"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

func (s *Service) transactionalID(p int32) string {
	return fmt.Sprintf("velocity-%s-%s-%d", s.cfg.Group, s.cfg.InputTopic, p)
}

// newTxnProducer creates partition p's transactional producer and initialises
// its producer id, which fences any previous owner of p and completes (aborts)
// its open transaction before this returns.
func (s *Service) newTxnProducer(ctx context.Context, p int32) (*kgo.Client, error) {
	timeout := max(time.Minute, 3*s.cfg.CheckpointInterval)
	opts := append(append([]kgo.Opt{kgo.SeedBrokers(s.cfg.Brokers...)}, sink.ProducerOpts()...),
		kgo.TransactionalID(s.transactionalID(p)),
		kgo.TransactionTimeout(timeout),
	)
	opts = append(opts, s.clientOpts()...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("partition %d: transactional producer: %w", p, err)
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, _, err := cl.ProducerID(ictx); err != nil {
		cl.Close()
		if errors.Is(err, kerr.InvalidTransactionTimeout) {
			return nil, fmt.Errorf("partition %d: initialise transactional id %s: %w: --exactly-once asks for a transaction timeout of 3 × --checkpoint-interval (at least a minute), %s here, and the brokers allow less (transaction.max.timeout.ms, 15 min by default): lower --checkpoint-interval or raise that limit",
				p, s.transactionalID(p), err, timeout)
		}
		return nil, fmt.Errorf("partition %d: initialise transactional id %s: %w", p, s.transactionalID(p), err)
	}
	if err := cl.BeginTransaction(); err != nil {
		cl.Close()
		return nil, fmt.Errorf("partition %d: begin transaction: %w", p, err)
	}
	return cl, nil
}

// committedOffset reads the group's committed offset for p (-1: none) and its
// metadata. In exactly-once mode it is called after newTxnProducer fenced the
// previous owner, which completes that owner's open transaction first, so no
// transaction holding an offset for p should still be pending. The read asks
// for stable offsets all the same (KIP-447): should one be pending (a
// coordinator that materialises a completed transaction's offsets late), the
// broker answers UNSTABLE_OFFSET_COMMIT, which the takeover retries, instead
// of the offset from before that transaction, from which the partition would
// publish the transaction's outputs a second time.
func (s *Service) committedOffset(ctx context.Context, p int32) (int64, string, error) {
	resp, err := s.adm.FetchOffsetsForTopics(kadm.RequireStable(ctx), s.cfg.Group, s.cfg.InputTopic)
	if err != nil {
		return 0, "", fmt.Errorf("partition %d: fetch committed offset: %w", p, err)
	}
	r, ok := resp.Lookup(s.cfg.InputTopic, p)
	// A partition's error first: its offset is -1 with it, which is not "none".
	if ok && r.Err != nil {
		return 0, "", fmt.Errorf("partition %d: fetch committed offset: %w", p, r.Err)
	}
	if !ok || r.At < 0 {
		return -1, "", nil
	}
	return r.At, r.Metadata, nil
}

// refreshInputTopicID records the input topic's id for commitTxn. Brokers
// that speak TxnOffsetCommit v6 (KIP-1319) name the topic by id alone and
// answer a name-only request with UNKNOWN_TOPIC_ID; earlier versions take the
// name. The request carries both, and the encoder writes the one its version
// has. Called on every exactly-once acquire, so a recreated topic's new id is
// picked up.
func (s *Service) refreshInputTopicID(ctx context.Context) error {
	md, err := s.adm.Metadata(ctx, s.cfg.InputTopic)
	if err != nil {
		if f := s.configError(err); f != nil {
			return f
		}
		return fmt.Errorf("read the input topic's id: %w", err)
	}
	td, ok := md.Topics[s.cfg.InputTopic]
	if !ok {
		return fmt.Errorf("read the input topic's id: %s is not in the metadata", s.cfg.InputTopic)
	}
	if td.Err != nil {
		return fmt.Errorf("read the input topic's id: %w", td.Err)
	}
	s.mu.Lock()
	s.inputTopicID = td.ID
	s.mu.Unlock()
	return nil
}

// retryTxnRequest runs do until it succeeds, fails for a reason no retry
// cures, or ctx (the checkpoint's bound) ends. A broker restart or a moving
// coordinator fails these requests at once ("unable to dial", NOT_COORDINATOR,
// COORDINATOR_LOAD_IN_PROGRESS), and franz-go does not retry a request issued
// this way: without this loop an exactly-once instance stopped on the first
// broker restart (TestServiceRidesOutBrokerFaults found it). Fencing and an
// aborted transaction are not retriable: they end here and reach lost.
func retryTxnRequest(ctx context.Context, do func() error) error {
	return retry.Do(ctx, 2*time.Second, txnMayPass, do)
}

// txnMayPass is mayPass, and CONCURRENT_TRANSACTIONS: the coordinator is still
// completing an earlier end of this transaction (an abort on its timeout after
// a broker restart, or a commit whose answer was lost). franz-go's error table
// does not mark it retriable, but it passes once that end is written: then the
// request succeeds, or fails with the fencing error that lost turns into a
// takeover. An instance stopped on it.
func txnMayPass(err error) bool {
	return mayPass(err) || errors.Is(err, kerr.ConcurrentTransactions)
}

// mayPass reports whether an error from a broker may pass with time, so that
// the transaction's requests and takeovers retry on it (retry.Transient: never
// an authorization failure), or a warm-up read stalled.
func mayPass(err error) bool {
	return retry.Transient(err) || errors.Is(err, errWarmUpStalled)
}

// commitTxn adds the offset commit to the open transaction, commits it and
// opens the next one. Any error leaves the transaction to be aborted (by the
// broker's timeout or the next owner's fencing): the caller must not go on
// with this producer (it stops, or drops the partition when the transaction
// was lost: worker.txnLost).
//
// offsetsOnly says that nothing was produced in the transaction: it then holds
// the offset commit alone, which franz-go does not end (endOffsetsOnlyTxn).
func (w *worker) commitTxn(ctx context.Context, next int64, note checkpoint.CommitNote, offsetsOnly bool) error {
	cl := w.txn
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return fmt.Errorf("producer id: %w", err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = w.s.transactionalID(w.part), id, epoch, w.s.cfg.Group
	err = retryTxnRequest(ctx, func() error {
		addResp, err := add.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(addResp.ErrorCode)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("add offsets to transaction: %w", err)
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = w.s.transactionalID(w.part), w.s.cfg.Group, id, epoch
	req.Generation, req.MemberID = -1, ""
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic = w.s.cfg.InputTopic
	w.s.mu.Lock()
	rt.TopicID = w.s.inputTopicID
	w.s.mu.Unlock()
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	// The metadata names the snapshot this transaction commits, so that
	// recovery resumes from exactly that one (checkpoint.ForCommitted), and
	// where the partition last flushed its reorder buffer on idle, so that a
	// warm-up without that snapshot repeats the flush (warmUp).
	meta := checkpoint.CommitMetadata(note)
	rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = w.part, next, -1, &meta
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	err = retryTxnRequest(ctx, func() error {
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if e := kerr.ErrorForCode(p.ErrorCode); e != nil {
						err = e
					}
				}
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("commit offset %d in transaction: %w", next, err)
	}
	if offsetsOnly {
		return w.endOffsetsOnlyTxn(ctx, id, epoch)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return endTxnError(err)
	}
	return cl.BeginTransaction()
}

// endTxnError wraps a failed commit of the transaction. With no definite
// answer (the connection dropped, as when a broker restarts, after the commit
// may or may not have been applied) it is errTxnOutcomeUnknown: franz-go
// refuses to retry a commit; the partition's next acquire fences the
// transactional id, which settles it either way, and then reads the committed
// offset and restores the snapshot that matches it.
func endTxnError(err error) error {
	var answer *kerr.Error
	if !errors.As(err, &answer) || kerr.IsRetriable(err) || errors.Is(err, kerr.UnknownServerError) {
		return fmt.Errorf("commit transaction: %w: %w", errTxnOutcomeUnknown, err)
	}
	return fmt.Errorf("commit transaction: %w", err)
}

// endOffsetsOnlyTxn commits the open transaction when it holds the offset
// commit and no record: an interval whose records published nothing, as a
// re-keyed group's second stage reads on a repartition partition that only
// markers reach. franz-go ends only a transaction it produced into (the
// offsets were added by our own requests, which it does not see), so the
// EndTxn is sent here, retried only while the coordinator answers
// CONCURRENT_TRANSACTIONS (as franz-go does); any other failure is the same
// as a failed commit (endTxnError).
//
// A broker with transactions v2 (KIP-890) bumps the producer epoch at every
// EndTxn and returns the new one. The client, which did not send this one,
// would produce under the old epoch and be fenced: it is replaced by a new
// producer, initialised anew (no transaction is open: that fences nothing but
// the old epoch). A producer that cannot be made loses the partition
// (errTxnProducerLost), to be taken over again from this commit.
func (w *worker) endOffsetsOnlyTxn(ctx context.Context, id int64, epoch int16) error {
	cl := w.txn
	end := kmsg.NewPtrEndTxnRequest()
	end.TransactionalID, end.ProducerID, end.ProducerEpoch, end.Commit = w.s.transactionalID(w.part), id, epoch, true
	var resp *kmsg.EndTxnResponse
	err := retry.Do(ctx, 2*time.Second, func(err error) bool { return errors.Is(err, kerr.ConcurrentTransactions) }, func() error {
		r, err := end.RequestWith(ctx, cl)
		if err == nil {
			resp, err = r, kerr.ErrorForCode(r.ErrorCode)
		}
		return err
	})
	if err != nil {
		return endTxnError(err)
	}
	if resp.Version >= 5 && resp.ProducerID >= 0 {
		w.s.log.Debug("exactly-once: committed offsets only; the broker moved the producer epoch, so the producer is made anew",
			zap.Int32("partition", w.part), zap.Int16("epoch", resp.ProducerEpoch))
		txn, err := w.s.newTxnProducer(ctx, w.part)
		if err != nil {
			return fmt.Errorf("commit transaction: committed, and then %w: %w", errTxnProducerLost, err)
		}
		w.useTxn(txn)
		cl.Close()
		return nil
	}
	// The epoch stays: franz-go ends its empty transaction without a request.
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return cl.BeginTransaction()
}

// errTxnOutcomeUnknown marks a transaction commit whose outcome did not come
// back; worker.lost treats it as a lost transaction.
var errTxnOutcomeUnknown = errors.New("outcome unknown")

// errTxnProducerLost marks a transaction committed whose producer could not be
// made anew for the next one (endOffsetsOnlyTxn); worker.lost treats it as a
// lost transaction.
var errTxnProducerLost = errors.New("no transactional producer for the next transaction")
