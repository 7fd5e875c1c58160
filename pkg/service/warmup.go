package service

// Warm-up: rebuilding a partition's state without a snapshot.
//
// When a partition has a committed offset but no usable snapshot (the store
// was lost or wiped, the service was switched from another store, or in
// exactly-once mode no snapshot matches the committed transaction), the
// window state is rebuilt by replaying the tail of the partition before the
// committed offset through a fresh Processor with its outputs discarded
// (they were published by the run that committed the offset), then
// consumption continues at the committed offset.
//
// The tail starts at the first record whose timestamp is at or after
//
//	T − (largest window + allowed lateness + warmUpSlack)
//
// where T is the largest record timestamp among the last records before the
// committed offset (kadm ListOffsetsAfterMilli uses the broker's time index).
//
// What it restores exactly, provided record timestamps are within
// warmUpSlack of event times: every window aggregate of the events that
// follow (an event after the committed offset is at or after the watermark,
// so its windows reach back at most the largest window, all inside the
// tail); the watermark; the reorder buffer (events pending at the committed
// offset are re-read and released later, so none is lost).
//
// What it cannot restore:
//   - the dedupe set before the tail: a duplicate of an event older than the
//     tail is counted instead of dead-lettered (the dedupe horizon usually
//     equals the largest window, so only the slack-sized edge is missed, but
//     a longer --dedupe-horizon is only partly honoured);
//   - entities whose last event is older than the tail: their
//     ms_since_previous is null instead of the real gap (--entity-ttl history);
//   - the idle-eviction sweep points, which shift for the rest of the run;
//   - decisions the live run made from the wall clock (idle-timeout
//     releases) other than the last one, which an exactly-once commit records
//     and the warm-up repeats (see warmUp), or from events before the tail (an
//     event that was late then may be accepted during the warm-up; it only
//     touches buckets older than the largest window, so later aggregates are
//     unaffected);
//   - records already deleted by retention, and a start point chosen by
//     producer timestamps that are far from event times.
//
// The warm-up runs inside the assignment callback and so delays the start of
// this partition (and of the others assigned in the same rebalance); it is
// logged with its offsets and duration.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// warmUpSlack widens the warm-up tail to absorb the difference between record
// timestamps (what the broker indexes) and event times (what windows use).
const warmUpSlack = 5 * time.Minute

// warmUpProbe is how many records before the committed offset are read to find
// the newest record timestamp.
const warmUpProbe = 64

// warmUp builds partition p's processor from the records before committed.
// idleFlushAt, when it is in the range read, is where the previous owner
// released its whole reorder buffer on the idle timeout (its Next then): the
// warm-up releases everything pending at the same position, as that owner did,
// discarding the outputs like every other. Without it, a partition whose input
// went quiet would be rebuilt with the released events pending again, and the
// new owner would publish them (under --exactly-once, commit them) a second
// time. Earlier idle releases are not repeated: only the last one decides what
// is still pending at the committed offset.
func (s *Service) warmUp(ctx context.Context, p int32, committed, idleFlushAt int64) (*pipeline.Processor, error) {
	start := time.Now()
	var largest int64
	for _, sp := range s.cfg.Specs {
		largest = max(largest, sp.WindowMs)
	}
	span := largest + s.cfg.Watermark.AllowedLateness + warmUpSlack.Milliseconds()

	var lastTs int64 = -1
	if err := s.readRange(ctx, p, max(committed-warmUpProbe, 0), committed, func(r *kgo.Record) {
		lastTs = max(lastTs, r.Timestamp.UnixMilli())
	}); err != nil {
		return nil, fmt.Errorf("partition %d: warm-up: find the last record before offset %d: %w", p, committed, err)
	}
	from := int64(0)
	if s.cfg.Merge != nil {
		// A re-keyed group's second stage: its order is decided by every input
		// partition's watermarks since the start, which a window of recent
		// records cannot restore. It re-reads what the repartition partition
		// holds, so its state is exact unless retention deleted records the
		// state still depended on.
		listed, err := s.adm.ListStartOffsets(ctx, s.cfg.InputTopic)
		if err != nil {
			return nil, fmt.Errorf("partition %d: warm-up: list start offsets: %w", p, err)
		}
		if lo, ok := listed.Lookup(s.cfg.InputTopic, p); ok && lo.Err == nil {
			from = min(lo.Offset, committed)
		}
		lastTs = -1
	}
	if lastTs >= 0 {
		listed, err := s.adm.ListOffsetsAfterMilli(ctx, lastTs-span, s.cfg.InputTopic)
		if err != nil {
			return nil, fmt.Errorf("partition %d: warm-up: list offsets by time: %w", p, err)
		}
		if lo, ok := listed.Lookup(s.cfg.InputTopic, p); ok && lo.Err == nil {
			from = min(lo.Offset, committed)
		}
	}
	proc, err := pipeline.New(s.processorConfig(p), from)
	if err != nil {
		return nil, err
	}
	discard := func(*pipeline.Output) {}
	n := 0
	flushed := idleFlushAt < from || idleFlushAt > committed // outside the range: nothing to repeat
	if err := s.readRange(ctx, p, from, committed, func(r *kgo.Record) {
		if !flushed && r.Offset >= idleFlushAt {
			proc.Flush(discard)
			flushed = true
		}
		n++
		proc.Process(pipeline.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp.UnixMilli()}, discard)
	}); err != nil {
		return nil, fmt.Errorf("partition %d: warm-up read %d..%d: %w", p, from, committed, err)
	}
	if !flushed {
		proc.Flush(discard) // the flush came after the last record read
	}
	s.log.Warn("no snapshot for a partition with a committed offset: rebuilt its state by a warm-up read without emitting",
		zap.Int32("partition", p), zap.Int64("from", from), zap.Int64("committed", committed),
		zap.Int("records", n), zap.Int64("span_ms", span), zap.Int64("idle_flush_at", idleFlushAt), zap.Duration("took", time.Since(start)))
	return proc, nil
}

// warmUpStall is how long a warm-up read may go without a record before it
// fails (errWarmUpStalled, which acquireRetrying retries): a broker stall or
// restart must not be taken for the end of the range.
var warmUpStall = 30 * time.Second // a variable for tests

// errWarmUpStalled marks a warm-up read that stopped short of its end.
var errWarmUpStalled = errors.New("warm-up read stalled before the committed offset")

// readRange reads input partition p's records with offsets in [from, to) with
// read_committed isolation, as the group consumer does, and returns only once
// it has seen the record at to−1 or one beyond it: control records (the
// markers that end transactions, often the last offsets before a commit) are
// kept for that and not passed to fn. A read that brings nothing for
// warmUpStall fails: a warm-up that stopped at the first empty poll, as after
// a broker stall, left the rebuilt state short and reported success. The only
// range it cannot finish is one whose records retention deleted; it starts at
// the log start offset instead, and checkRetention reports the gap.
func (s *Service) readRange(ctx context.Context, p int32, from, to int64, fn func(*kgo.Record)) error {
	if from >= to {
		return nil
	}
	if start, err := s.startOffset(ctx, p); err != nil {
		return fmt.Errorf("read the log start offset: %w", err)
	} else if start >= to {
		return nil // all deleted
	} else if start > from {
		from = start
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.cfg.InputTopic: {p: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxBytes(32 << 20),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, s.clientOpts()...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	last := from - 1 // the highest offset seen
	lastProgress := time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		if ferr != nil && !mayPass(ferr) {
			return ferr
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if done || r.Offset <= last {
				return
			}
			last = r.Offset
			if r.Offset >= to {
				done = true
				return
			}
			if !r.Attrs.IsControl() {
				fn(r)
			}
			if r.Offset == to-1 {
				done = true
			}
		})
		if done {
			return nil
		}
		if fs.NumRecords() > 0 {
			lastProgress = time.Now()
		} else if time.Since(lastProgress) >= warmUpStall {
			return fmt.Errorf("%w: nothing for %s after offset %d (reading %d..%d)", errWarmUpStalled, warmUpStall, last, from, to)
		}
	}
}
