package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// bgResult is what a background checkpoint hands back to the partition
// goroutine: the snapshot it borrowed, and how far it got.
type bgResult struct {
	snap      *pipeline.PendingSnapshot
	next      int64
	note      checkpoint.CommitNote // what the commit of next records with it
	saved     bool                  // the snapshot is durable
	committed bool                  // and next is committed
	err       error
}

type batch struct {
	records []*kgo.Record
	hwm     int64
	round   *pollRound // the poll that fetched it; nil for held records
	fetched time.Time  // when that poll returned; zero for held records
}

// worker owns one partition: its Processor, its sink Tracker and its checkpoints.
// Everything but the channels and wantPause is touched only by its goroutine.
type worker struct {
	s       *Service
	part    int32
	label   string
	proc    *pipeline.Processor
	tracker *sink.Tracker
	// txn is the partition's transactional producer in exactly-once mode
	// (nil otherwise); txnRecords counts outputs in its open transaction. gate
	// stands between the tracker and txn: a checkpoint holds it from its cut
	// until the next transaction has begun (see checkpoint), so that the
	// outputs of the records processed meanwhile go into the next one.
	txn        *kgo.Client
	txnRecords int
	// markersOpen: the open transaction holds hop markers that no checkpoint
	// has cut yet (exactly-once; commitMarkers).
	markersOpen bool
	gate        *sink.Gate
	in          chan batch
	quit        chan bool // true: checkpoint before leaving
	done        chan struct{}
	queries     chan *ReadRequest // the query API's reads, served by run (query.go)

	wantPause atomic.Bool
	// fetchPaused is whether the poll loop paused fetching for us (poll loop only).
	fetchPaused bool
	emitFn      func(*pipeline.Output)
	// hwm is the partition's high watermark as the last fetch reported it (-1:
	// none yet): for the lag gauge.
	hwm int64
	// readTo is the offset after the last record of the partition's log the
	// worker has handled, its input records and the transaction markers between
	// them (the consumer keeps those for this): how far it has read (-1: nothing
	// yet; then proc.Next()). The idle verdict compares it with the broker's
	// last stable offset.
	readTo int64
	// The idle rule releases a reorder buffer, and a re-keyed group's first
	// stage tells its second stages that its input is quiet, only once the
	// broker confirms there is nothing left to read (idleVerdict): idleCheck
	// brings a check's answer back, idleChecking is set while one is out, and
	// quietGen numbers quiet spells so that the answer to a check of an earlier
	// spell is not taken for this one's.
	idleCheck    chan idleAnswer
	idleChecking bool
	quietGen     uint64

	// held are records waiting for the decoder's Prepare (the schema registry
	// was unreachable): the first could not be prepared, the rest arrived
	// after it and may not overtake it. Fetching stays paused while any are
	// held; the tick retries them at retryAt, with backoff doubling to
	// maxHoldBackoff. Nothing held has been processed, so a checkpoint taken
	// meanwhile covers exactly the records before them.
	held     []*kgo.Record
	retryAt  time.Time
	backoff  time.Duration
	holdErrs int

	// The checkpointer's state (see checkpoint, which keeps its invariant).
	//
	//	dirty      the state changed since the last snapshot was cut: records
	//	           were processed, or outputs emitted (an idle release changes
	//	           the state and publishes without moving any offset)
	//	savedNext  Next of the last durable snapshot
	//	committed  the last offset the group commit (or the transaction)
	//	           acknowledged; below savedNext after a commit failed, which
	//	           the next interval, and any handover, retries
	//	lastDurable when committed last caught up with savedNext
	epoch uint64 // this ownership's owner epoch (checkpoint.Store.Claim)
	seq   uint64 // the last snapshot sequence number used under epoch
	// idleFlushAt is Next when the reorder buffer was last released whole on
	// the idle timeout (-1: not known). Commits carry it, in both modes
	// (checkpoint.CommitNote), for a warm-up to repeat.
	idleFlushAt int64
	// flushAhead is a release the previous owner committed past the position
	// this worker resumed from (-1: none; checkpoint.CommitNote.IdleFlushAhead):
	// it happens here too as soon as Next reaches it (after the record before
	// that offset), so that the outputs are those the previous owner published.
	// Until then commits carry it, for an owner after this one.
	flushAhead int64
	dirty      bool
	savedNext  int64
	// savedNote is the note of the last durable snapshot, for a commit of
	// savedNext made later (catchUpCommit); nil before this worker saved one.
	savedNote   *checkpoint.CommitNote
	committed   int64
	lastDurable time.Time
	lastSweep   time.Time // of unlisted dedupe segments (zero: not since the partition was assigned)
	snapBuf     []byte
	sweep       *sweep // a background checkpoint still taking its snapshot, or nil
	// bgBusy is set while a background checkpoint waits for its outputs,
	// saves and commits; bgDone returns its buffer and error.
	bgBusy    bool
	bgDone    chan bgResult
	lastStats pipeline.Stats
	// lastKeyMissing and lastMerge are the re-keyed groups' counts at the last
	// gauge update (updateGroupCounters).
	lastKeyMissing []uint64
	lastMerge      pipeline.MergeStats
	lastCap        uint64
	// lastDedupeCap is the processor's count of ids the --max-dedupe-ids cap
	// made it forget, at the last gauge update; dedupeWarned is the last
	// warning about them (at most one per keyWarnEvery).
	lastDedupeCap uint64
	dedupeWarned  time.Time
	keyWarned     time.Time // last key-mismatch warning (at most one per keyWarnEvery)
	flushWarned   time.Time // last warning of a failed commit before an idle release (likewise)

	// released is set once the partition is no longer this worker's (it
	// returned, or was told to leave without a checkpoint): a background
	// checkpoint still running then saves nothing more and commits nothing.
	released atomic.Bool
	// progress is when the goroutine last finished a step (UnixNano); read by
	// Service.Healthy from other goroutines.
	progress atomic.Int64

	recordsIn, features, lateApplied prometheus.Counter
}

// startWorker starts partition p's worker on proc, restored at proc.Next().
// note is what the group's commit of committed recorded; its last idle
// release is this worker's to repeat if the state restored is not past it
// (repeatFlush).
func (s *Service) startWorker(p int32, proc *pipeline.Processor, txn *kgo.Client, epoch uint64, committed int64, note checkpoint.CommitNote) *worker {
	label := s.partitionLabel(p)
	proc.SetOwnerEpoch(epoch)
	w := &worker{
		s: s, part: p, label: label, proc: proc, txn: txn, epoch: epoch, hwm: -1,
		readTo: -1, idleCheck: make(chan idleAnswer, 1),
		in:          make(chan batch, 4),
		quit:        make(chan bool, 1),
		done:        make(chan struct{}),
		queries:     make(chan *ReadRequest, queryQueue),
		bgDone:      make(chan bgResult, 1),
		savedNext:   proc.Next(),
		committed:   committed,
		lastDurable: time.Now(),
		recordsIn:   s.m.RecordsIn.WithLabelValues(label),
		features:    s.m.Features.WithLabelValues(label),
		lateApplied: s.m.LateApplied.WithLabelValues(label),
	}
	if txn != nil {
		w.useTxn(txn)
	} else {
		w.tracker = w.newTracker(s.sinks[int(p)%len(s.sinks)])
	}
	w.emitFn = w.emit
	w.idleFlushAt, w.flushAhead = note.IdleFlushAt, -1
	if last := note.LastIdleFlush(); last >= proc.Next() {
		// The state restored is at or before the last release (a snapshot
		// cut before it, or a warm-up to a commit before it): repeated in
		// run, at once or when Next reaches it.
		w.flushAhead = last
	} else if last >= 0 {
		// A snapshot cut after it, which the state holds. (The release is
		// committed before its outputs, so no later one can be missing
		// from the note.)
		w.idleFlushAt = last
	}
	w.progress.Store(time.Now().UnixNano())
	s.mu.Lock()
	s.workers[p] = w
	s.mu.Unlock()
	go w.run()
	return w
}

// useTxn makes txn the partition's transactional producer, with a gate, a
// sink and a tracker of its own (exactly-once). Called when the worker starts,
// and on its goroutine between two transactions when the producer is replaced
// (endOffsetsOnlyTxn, which a synchronous checkpoint runs): nothing of the old
// one is in flight or held then.
func (w *worker) useTxn(txn *kgo.Client) {
	s := w.s
	w.txn = txn
	w.gate = sink.NewGate(txn)
	w.tracker = w.newTracker(sink.New(w.gate, s.cfg.OutputTopic, s.cfg.DLQTopic, s.cfg.Host).
		WithFeaturesPrefix(s.cfg.FeaturesValuePrefix).WithBuild(s.cfg.Build).WithDefinition(s.cfg.Definition))
}

func (w *worker) newTracker(snk *sink.Sink) *sink.Tracker {
	return snk.NewTracker(func(arrival int64) {
		w.s.m.Latency.Observe(float64(time.Now().UnixNano()-arrival) / 1e9)
	})
}

func (w *worker) stop(commit bool) { w.quit <- commit }

func (w *worker) run() {
	defer close(w.done)
	defer w.released.Store(true)
	if w.txn != nil {
		// Leaving without a commit abandons the open transaction: the next
		// owner's fencing (or the transaction timeout) aborts it. The
		// producer in use then, which endOffsetsOnlyTxn may have replaced.
		defer func() { w.txn.Close() }()
	}
	tick := time.NewTicker(w.s.tickEvery())
	defer tick.Stop()
	w.proc.StartServing(time.Now())
	w.proc.AnnounceOwner(w.emitFn) // a re-keyed group's first stage: the new owner's epoch
	if w.flushAhead == w.proc.Next() {
		w.repeatFlush()
	}
	// Stagger the partitions' checkpoints across the interval: all of an
	// instance's partitions start together, and checkpointing them at the same
	// instant makes one big spike of encoding, checksumming and writing on a
	// few cores instead of several small ones.
	interval := w.s.cfg.CheckpointInterval
	lastCheckpoint := time.Now().Add(-interval * time.Duration(w.part%8) / 8)
	var lastBatch time.Time
	for {
		select {
		case b := <-w.in:
			idle := w.proc.IdleDeclared()
			w.process(b)
			b.round.finish()
			w.advanceSweep(sweepSlice)
			lastBatch = time.Now()
			if idle && !w.proc.IdleDeclared() && w.txn != nil {
				// Exactly-once, a re-keyed group's first stage waking up from
				// idle: commit now, not at the next interval. Its hop records
				// reach the second stages only with its commit, and until then
				// the other sources' commits move the frontier past its new
				// events, which are then counted out of order
				// (docs/repartition.md, the idle rule): the extra commit keeps
				// that window to one batch. (The tick commits an idle
				// declaration at once for the same reason: until its markers are
				// committed, the second stages wait for this partition.)
				err := w.waitBackground()
				if err == nil {
					err = w.checkpoint()
				}
				if err != nil {
					w.leaveOrFail(err)
					return
				}
				lastCheckpoint = time.Now()
			}
		case <-tick.C:
			if time.Since(lastBatch) >= sweepIdleAfter {
				w.advanceSweep(sweepIdleSlice)
			} else {
				w.advanceSweep(sweepSlice)
			}
			if len(w.held) > 0 {
				// A partition held for the registry is not idle: do not let
				// the idle timeout release its reorder buffer meanwhile.
				w.retryHeld()
			} else {
				now := time.Now()
				w.tracker.SetClock(now.UnixMilli()) // Tick may release (emit) events
				w.proc.SetClock(now)
				// The idle rule releases the reorder buffer, and a re-keyed
				// group's first stage declares its input idle, only on the
				// verdict: quiet for the idle timeout and, by the broker's
				// word, nothing left to read. A broker outage, a slow fetch or
				// a process frozen and woken up with records waiting is not a
				// quiet input, and releasing early there would make the
				// outputs depend on it.
				verdict := w.idleVerdict()
				pending := w.proc.Pending()
				if verdict && w.txn == nil && w.proc.WaitsForIdle() {
					// The default mode: the release's position is committed
					// first (commitFlushAhead), then its outputs published.
					// Until it can be, nothing is released, and a re-keyed
					// group's first stage does not declare its input idle
					// either: its second stages would move on past the
					// events it still holds.
					if w.commitFlushAhead() {
						w.proc.Flush(w.emitFn)
					} else {
						verdict = false
					}
				} else if verdict {
					w.proc.Tick(w.emitFn)
				}
				if pending > 0 && w.proc.Pending() == 0 {
					w.idleFlushAt = w.proc.Next() // Tick releases only everything, on idle
					// The one place the wall clock decides an order (docs/contract.md,
					// the idle rule): for the reader of a difference from replay.
					w.s.log.Debug("idle rule: released the reorder buffer", zap.Int32("partition", w.part),
						zap.Int("events", pending), zap.Int64("next", w.proc.Next()), zap.Int64("read_to", w.readTo))
				}
				// A re-keyed group's first stage: its watermark to the second
				// stages, and the idle verdict.
				// Under exactly-once a declaration, and each renewal of its
				// lease, is committed at once (see the wake-up above): until its
				// markers are committed, the second stages wait for this
				// partition, and a lease not renewed in time runs out.
				w.proc.SetInputQuiet(!w.renewalsWanted())
				if w.proc.HopMarkers(verdict, w.emitFn) && w.txn != nil {
					lastCheckpoint = time.Time{}
				}
				w.updatePressure()
			}
			if time.Since(lastCheckpoint) >= w.s.cfg.CheckpointInterval && !w.bgBusy {
				lastCheckpoint = time.Now()
				if err := w.checkpointInBackground(); err != nil {
					w.leaveOrFail(err)
					return
				}
			}
			w.updateGauges()
		case req := <-w.queries:
			w.serveReads(req)
		case res := <-w.bgDone:
			if err := w.backgroundDone(res); err != nil {
				w.leaveOrFail(err)
				return
			}
		case commit := <-w.quit:
			if !commit {
				// Lost: the partition may be someone else's already. A
				// background checkpoint still running stops short of saving
				// and committing (released); what it saved before is an
				// older consistent state, which the new owner's claim fences
				// from then on.
				w.released.Store(true)
				return
			}
			// Finish the work already handed to us, then checkpoint it,
			// after any background checkpoint has finished (saves and
			// commits must stay in order).
			for {
				select {
				case b := <-w.in:
					w.process(b)
					b.round.finish()
					continue
				default:
				}
				break
			}
			w.completeSweep()
			err := w.waitBackground()
			if err == nil {
				err = w.checkpoint()
			}
			if err != nil && w.lost(err) {
				// Revoked, and another instance has already taken
				// over: it restores from our last commit.
				if w.txn != nil {
					w.s.m.TxnPartitionsLost.Inc()
				}
				w.s.log.Warn("partition taken over by another owner while being released; the new owner resumes from the last commit",
					zap.Int32("partition", w.part), zap.Error(err))
			} else if err != nil {
				w.s.fail(err)
			}
			return
		}
		w.progress.Store(time.Now().UnixNano())
		if err := w.tracker.Err(); err != nil {
			w.s.m.ProduceErrors.Inc()
			w.leaveOrFail(fmt.Errorf("partition %d: %w", w.part, err))
			return
		}
	}
}

// leaveOrFail ends the worker after err: the partition is dropped when err
// means it is not ours any more (lost), else the service stops.
func (w *worker) leaveOrFail(err error) {
	if w.lost(err) {
		w.leaveLost(err)
		return
	}
	w.s.fail(err)
	w.drainQuit()
}

// lost reports whether err means this partition is not ours to work on any
// more. In both modes: the snapshot store refused a save because a newer owner
// claimed the partition (checkpoint.ErrFenced). In exactly-once mode also:
// another producer initialised our transactional id (a new owner after a
// rebalance we have not heard of yet, or anyone else), or the coordinator
// aborted the transaction (it timed out); or its commit's outcome never came
// back (errTxnOutcomeUnknown). Whether or not it was committed, the partition
// is safe to drop: its next acquire fences the id, which settles the
// transaction, and restores the snapshot that matches the committed offset.
// It is not safe to go on with this producer.
func (w *worker) lost(err error) bool {
	if errors.Is(err, checkpoint.ErrFenced) {
		return true
	}
	if w.txn == nil {
		return false
	}
	for _, e := range []error{kerr.ProducerFenced, kerr.InvalidProducerEpoch, kerr.InvalidProducerIDMapping,
		kerr.InvalidTxnState, kerr.TransactionAbortable, kerr.UnknownProducerID, errTxnOutcomeUnknown, errTxnProducerLost} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// leaveLost drops the partition after lost: its open transaction is
// abandoned (the deferred Close; the coordinator has aborted or will abort it)
// and fetching it is paused. If the group has moved the partition, its revoke
// or lost callback follows; if the group still gives it to us, it is taken
// over again from its last commit (Service.reacquireLost).
func (w *worker) leaveLost(err error) {
	w.released.Store(true)
	if w.txn != nil {
		w.s.m.TxnPartitionsLost.Inc()
		w.s.log.Warn("exactly-once: transaction fenced or aborted; dropping the partition's uncommitted work",
			zap.Int32("partition", w.part), zap.Int64("last_committed", w.committed), zap.Error(err))
	} else {
		w.s.log.Warn("a newer owner claimed the partition; dropping it (its outputs so far are published, the new owner resumes from its own state)",
			zap.Int32("partition", w.part), zap.Int64("last_committed", w.committed), zap.Error(err))
	}
	s := w.s
	s.mu.Lock()
	if s.workers[w.part] == w { // else a revoke or lost is already releasing it
		delete(s.workers, w.part)
		s.txnLost[w.part] = time.Now()
		// Under mu, so that a revoke's resume (stopPartitions) comes after it.
		s.cons.PauseFetchPartitions(map[string][]int32{s.cfg.InputTopic: {w.part}})
		if s.wakePoll != nil {
			s.wakePoll() // so that the poll loop starts counting the grace period
		}
	}
	s.gauges.assigned.Set(float64(len(s.workers)))
	s.mu.Unlock()
	s.m.ForgetPartition(w.label)
	w.drainQuit()
}

// drainQuit waits for the stop request after a fatal error so stopPartitions
// never blocks on a worker that already left.
func (w *worker) drainQuit() {
	go func() { <-w.quit }()
}

// tickEvery is how often a worker ticks: 100 ms, or a quarter of the idle
// timeout if shorter, so that the idle rule fires within a quarter of it.
func (s *Service) tickEvery() time.Duration {
	d := 100 * time.Millisecond
	if it := s.cfg.Watermark.IdleTimeout; it > 0 && it/4 < d {
		d = max(it/4, time.Millisecond)
	}
	return d
}

func (w *worker) process(b batch) {
	records := b.records
	if len(w.held) > 0 {
		w.held = append(w.held, records...)
		records = nil
	}
	prep, _ := w.s.dec.(codec.Preparer)
	// One clock read per batch: its records arrived together, and a read per record
	// (here and for the emitted_at header) was ~4% of the machine's CPU at high rates.
	now := time.Now()
	arrival := now.UnixNano()
	w.tracker.SetClock(now.UnixMilli())
	w.proc.SetClock(now)
	in := 0
	for i, r := range records {
		if r.Attrs.IsControl() {
			continue // a transaction marker: read (readTo), not an input record
		}
		if j := i + 2*pipeline.HintDistance; j < len(records) {
			w.proc.Hint(records[j].Key, records[j].Value, 2*pipeline.HintDistance)
		}
		if j := i + pipeline.HintDistance; j < len(records) {
			w.proc.Hint(records[j].Key, records[j].Value, pipeline.HintDistance)
		}
		if prep != nil {
			if err := w.prepare(prep, r.Value); err != nil {
				w.hold(records[i:], err)
				records = records[:i]
				break
			}
		}
		w.proc.Process(pipeline.Record{
			Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Key: r.Key, Value: r.Value, Arrival: arrival, Timestamp: r.Timestamp.UnixMilli(),
		}, w.emitFn)
		if w.flushAhead >= 0 && w.proc.Next() >= w.flushAhead {
			w.repeatFlush() // where the previous owner's Next was when it released
		}
		in++
		if i&readEvery == readEvery {
			w.serveQueued() // reads wait for part of a large batch, not all of it (query.go)
		}
	}
	if len(w.held) == 0 && w.backoff > 0 {
		w.s.log.Info("schema registry answers again: partition resumes", zap.Int32("partition", w.part),
			zap.Int("failed_attempts", w.holdErrs))
		w.backoff, w.holdErrs = 0, 0
	}
	w.dirty = w.dirty || in > 0
	w.recordsIn.Add(float64(in))
	if n := len(records); n > 0 { // the held ones, if any, are not read yet
		w.readTo = max(w.readTo, records[n-1].Offset+1)
	}
	if b.hwm >= 0 {
		w.hwm = b.hwm
		w.s.m.ConsumerLag.WithLabelValues(w.label).Set(float64(max(b.hwm-w.proc.Next(), 0)))
	}
	w.updatePressure()
	if !b.fetched.IsZero() && len(records) > 0 {
		w.s.m.AddedLatency.Observe(time.Since(b.fetched).Seconds())
	}
}

// idleVerdict reports whether the partition's input is quiet: whether the idle
// rule may release its reorder buffer, and a re-keyed group's first stage tell
// its second stages so. The idle rule (no record for --idle-timeout) must hold,
// nothing may wait to be processed (a batch handed over, records held for the
// registry, fetching paused), and the broker must confirm that the partition
// holds nothing this worker has not read: its last stable offset is no further
// than readTo, the offset after the last record handled, transaction markers
// included. Not the high watermark of a fetch, which runs ahead of the records
// a poll hands over (at most maxPollRecords) and of a fetch cut by its byte
// limits; nor an offset unchanged for a while, which a slow fetch, a poll loop
// held up or a process frozen and woken up also shows. The check runs on a
// goroutine of its own, shared by every partition (lsoLookup): a slow broker
// delays the verdict, not the partition.
func (w *worker) idleVerdict() bool {
	if !w.proc.NeedsIdleVerdict() && !w.proc.WaitsForIdle() {
		return false
	}
	quiet := w.proc.Quiet() && len(w.in) == 0 && len(w.held) == 0 && !w.wantPause.Load()
	if !quiet && w.idleChecking {
		w.quietGen++
	}
	select {
	case a := <-w.idleCheck:
		w.idleChecking = false
		if quiet && a.gen == w.quietGen && a.readTo == w.readTo && a.next == w.proc.Next() &&
			time.Since(a.asked) <= w.s.cfg.Watermark.IdleTimeout &&
			a.end >= 0 && a.end <= max(w.readTo, w.proc.Next()) {
			return true
		}
		// Asked in another spell, no answer (ask again), or records to read.
	default:
	}
	if quiet && !w.idleChecking {
		w.idleChecking = true
		w.s.lso.ask(lsoAsk{part: w.part, out: w.idleCheck,
			q: idleQuestion{gen: w.quietGen, readTo: w.readTo, next: w.proc.Next(), asked: time.Now()}})
	}
	return false
}

// renewalsWanted reports whether a first stage's idle lease renewals are still
// wanted: the idle checks (lsoLookup.activity) last found the input topic active
// (records arrived somewhere, or were not yet committed) less than renewalHold
// ago, or have no word yet.
//
// Why renewals may stop then (docs/repartition.md, "Renewals wait for
// input"): a lease only has to outlast the records other sources send a second
// stage, since its clock is their timestamps. While the input is quiet, no first
// stage has anything to hop but its own markers: every declaration is already in
// place, everything pending was released when the last source declared, and a
// lease that lapses then holds back nothing. The hold has to cover the markers
// that follow the last input: a source that processed the input's last record
// declares its own idleness up to --idle-timeout after it, plus a tick and a
// broker check, and this partition's lease must still hold then, or the events
// that declaration releases would wait for the next input. The last activity
// seen is at most a quarter lease (a check's spacing) before that source's last
// record was processed, since its offset stays uncommitted until then; the last
// renewal comes within a quarter lease of the hold's end and lasts a lease. So a
// hold of the idle timeout, two leases and the longest a check may take
// (lsoTimeout) covers it with more than a lease to spare.
func (w *worker) renewalsWanted() bool {
	at := w.s.lso.activeAt.Load()
	return at == 0 || time.Since(time.Unix(0, at)) < w.s.renewalHold()
}

// idleQuestion is what a partition knew when it asked for the idle verdict.
// An answer counts only for the question it answers, asked in the quiet spell
// the partition is still in:
//   - with nothing read or processed since (readTo and next unchanged). The
//     spell's number alone does not show it: a spell that ends while the
//     partition is busy leaves idleVerdict before it counts the end, and the
//     answer to the earlier spell's question, arriving late (a broker frozen,
//     then answering with the offsets it had), would be taken for the next
//     spell's;
//   - asked at most --idle-timeout ago: the broker's word is about the moment
//     it was asked, and a process frozen between the question and its use
//     wakes up with records produced meanwhile that the word does not cover.
type idleQuestion struct {
	gen          uint64
	readTo, next int64
	asked        time.Time
}

// idleAnswer is the input partition's last stable offset as one check of
// idleVerdict found it (-1: no answer), and the question it answers.
type idleAnswer struct {
	idleQuestion
	end int64
}

// updatePressure asks the poll loop to pause fetching this partition above the
// high marks, and to resume it below the low marks. It runs after every batch
// and on every tick: a paused partition gets no batches, so only the tick sees
// its produce acknowledgements arrive or its reorder buffer drain. A change
// wakes the poll loop, which may be waiting on a poll that, with every
// partition paused, would never return.
func (w *worker) updatePressure() {
	pressure := len(w.held) > 0 || w.proc.Pressure() || w.tracker.PendingBytes() > w.s.cfg.MaxPendingProduceBytes
	if !pressure && w.wantPause.Load() {
		// Resume only once produce bytes are back under half the bound.
		pressure = w.tracker.PendingBytes() > w.s.cfg.MaxPendingProduceBytes/2
	}
	if w.wantPause.Swap(pressure) != pressure {
		w.s.mu.Lock()
		if w.s.wakePoll != nil {
			w.s.wakePoll()
		}
		w.s.mu.Unlock()
	}
}

// maxHoldBackoff caps the wait between two attempts to prepare a held record.
const maxHoldBackoff = 10 * time.Second

// keyWarnEvery spaces the warnings about records not keyed by their entity id:
// a misconfigured producer sends them all the time (the metric counts each).
const keyWarnEvery = time.Minute

// prepare runs the decoder's Prepare with a deadline, so that a registry that
// accepts connections and never answers cannot freeze the partition's
// checkpoints and shutdown for longer than one attempt.
func (w *worker) prepare(p codec.Preparer, value []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return p.Prepare(ctx, value)
}

// hold keeps records, the first of which could not be prepared, for a later
// attempt.
func (w *worker) hold(records []*kgo.Record, err error) {
	w.held = append(w.held[:0:0], records...)
	w.backoff = min(max(2*w.backoff, 200*time.Millisecond), maxHoldBackoff)
	w.retryAt = time.Now().Add(w.backoff)
	w.holdErrs++
	if w.holdErrs == 1 || w.backoff == maxHoldBackoff {
		w.s.log.Warn("cannot decode: waiting for the schema registry; nothing is dead-lettered meanwhile",
			zap.Int32("partition", w.part), zap.Int64("offset", records[0].Offset),
			zap.Int("held_records", len(records)), zap.Duration("retry_in", w.backoff), zap.Error(err))
	}
}

// retryHeld processes the held records again once their backoff has passed.
func (w *worker) retryHeld() {
	if time.Now().Before(w.retryAt) {
		return
	}
	held := w.held
	w.held = nil
	w.process(batch{records: held, hwm: -1})
}

func (w *worker) emit(o *pipeline.Output) {
	if o.Hop {
		w.tracker.Hop(o.Topic, o.Partition, o.Key, o.Value)
	} else if o.Dead {
		w.s.m.DeadLetters.WithLabelValues(string(o.Reason)).Inc()
		w.tracker.Dead(sink.DeadLetter{
			Key: o.Key, Value: o.Value, Reason: o.Reason, Err: o.Err,
			SourceTopic: o.SourceTopic, SourcePartition: o.SourcePartition, SourceOffset: o.SourceOffset,
			Group: o.Group,
		})
	} else {
		w.features.Inc()
		w.tracker.Features(o.Key, o.Value, o.Arrival)
	}
	w.txnRecords++
	if !o.Hop || o.SourceOffset >= 0 {
		w.dirty = true // the state changed even if no offset moved (an idle release)
	} else if w.txn != nil {
		// A hop marker alone changes no state (a new owner sends its markers
		// again), so an idle partition's lease renewals cost no snapshot: in
		// the default mode nothing, under exactly-once a commit of the
		// transaction that holds them (commitMarkers).
		w.markersOpen = true
	}
	if w.s.cfg.Observe != nil {
		w.s.cfg.Observe(o)
	}
}

func (w *worker) updateGauges() {
	m := w.s.m
	m.CheckpointAge.WithLabelValues(w.label).Set(time.Since(w.lastDurable).Seconds())
	m.ReorderBuffer.WithLabelValues(w.label).Set(float64(w.proc.Pending()))
	m.Entities.WithLabelValues(w.label).Set(float64(w.proc.Entities()))
	if wm, ok := w.proc.Watermark(); ok {
		m.WatermarkLag.WithLabelValues(w.label).Set(float64(time.Now().UnixMilli()-wm) / 1e3)
	}
	st := w.proc.Stats()
	if d := st.LateApplied - w.lastStats.LateApplied; d > 0 {
		w.lateApplied.Add(float64(d))
	}
	if d := st.KeyMismatch - w.lastStats.KeyMismatch; d > 0 {
		m.KeyMismatch.WithLabelValues(w.label).Add(float64(d))
		if time.Since(w.keyWarned) >= keyWarnEvery {
			w.keyWarned = time.Now()
			w.s.log.Warn("input records keyed by something other than their entity_id: an entity's events may be spread over partitions and its features computed from part of them; key the input by entity_id",
				zap.Int32("partition", w.part), zap.Uint64("records_so_far", st.KeyMismatch))
		}
	}
	if d := st.Evicted - w.lastStats.Evicted; d > 0 {
		m.EntitiesEvicted.WithLabelValues("idle").Add(float64(d))
	}
	m.DedupeIDs.WithLabelValues(w.label).Set(float64(w.proc.DedupeIDs()))
	if c := w.proc.DedupeCapEvictions(); c > w.lastDedupeCap {
		m.DedupeEvicted.WithLabelValues(w.label).Add(float64(c - w.lastDedupeCap))
		if time.Since(w.dedupeWarned) >= keyWarnEvery {
			w.dedupeWarned = time.Now()
			w.s.log.Warn("--max-dedupe-ids reached: forgot the oldest accepted event ids; duplicates of them are not caught",
				zap.Int32("partition", w.part), zap.Uint64("forgotten", c-w.lastDedupeCap))
		}
		w.lastDedupeCap = c
	}
	if c := w.proc.CapEvictions(); c > w.lastCap {
		m.EntitiesEvicted.WithLabelValues("cap").Add(float64(c - w.lastCap))
		w.s.log.Warn("--max-entities reached: evicted least recently active entities",
			zap.Int32("partition", w.part), zap.Uint64("evicted", c-w.lastCap))
		w.lastCap = c
	}
	w.lastStats = st
	w.updateGroupCounters()
}

// updateGroupCounters adds what the processor counted for re-keyed groups since
// the last update: records without a group's key (a first stage), and re-sent hop
// records and stale idle markers (a second stage).
func (w *worker) updateGroupCounters() {
	m := w.s.m
	if miss := w.proc.KeyMissing(); miss != nil {
		if w.lastKeyMissing == nil {
			w.lastKeyMissing = make([]uint64, len(miss))
		}
		for g, n := range miss {
			if d := n - w.lastKeyMissing[g]; d > 0 {
				m.GroupKeyMissing.WithLabelValues(w.s.cfg.Hops[g].Name).Add(float64(d))
			}
			w.lastKeyMissing[g] = n
		}
	}
	if g := w.s.cfg.Merge; g != nil {
		ms := w.proc.MergeStats()
		if d := ms.Duplicates - w.lastMerge.Duplicates; d > 0 {
			m.HopDuplicates.WithLabelValues(g.Name).Add(float64(d))
		}
		if d := ms.StaleIdle - w.lastMerge.StaleIdle; d > 0 {
			m.HopStaleIdle.WithLabelValues(g.Name).Add(float64(d))
		}
		if d := ms.IdleExpired - w.lastMerge.IdleExpired; d > 0 {
			m.HopIdleExpired.WithLabelValues(g.Name).Add(float64(d))
		}
		w.lastMerge = ms
	}
}

// The checkpointer. One protocol, per partition, whichever schedule runs it:
//
//	cut      the snapshot begins at the current position (Next, and a cut of
//	         the sink's epochs: every output produced before it belongs to
//	         offsets below Next or to events the snapshot shows as released)
//	persist  finish encoding → wait for exactly the outputs before the cut →
//	         save the snapshot durably → commit Next (in exactly-once mode,
//	         inside the transaction, naming the snapshot's ID)
//	settle   on the partition goroutine, record how far persist got
//
// Two schedules: checkpointInBackground (every interval) takes the snapshot
// in steps between batches and persists it on a goroutine while processing
// goes on, one at a time; checkpoint runs it synchronously (a revoke or
// shutdown, an exactly-once transaction that holds no record, and a re-keyed
// group's exactly-once commits on idle).
//
// Exactly-once, the records processed while a checkpoint persists emit into
// the next transaction, which begins only when this one has committed: the
// cut holds the partition's gate, and settle releases it once the commit
// (which begins the next transaction) succeeded. So a transaction holds
// exactly the outputs emitted between its cut and the one before, with the
// offset commit of the cut's Next: nothing of the offsets from Next on, and
// of those below it everything but the events its snapshot holds pending in
// the reorder buffer, released later into a later transaction. A commit that
// fails leaves the gate held, and the worker leaves without producing what it
// holds.
//
// Invariant (both modes, both schedules): the group's committed offset for
// this partition is never ahead of a durable snapshot, and every output for
// offsets below it is acknowledged. So committed ≤ savedNext, and savedNext
// moves only in settle, once persist has seen Save return. A cut clears dirty
// (changes after it make the state dirty again); a persist that did not save
// makes it dirty again, so nothing is taken for durable that is not.
//
// A checkpoint is due when the state is dirty, or when a commit failed earlier
// (committed < savedNext, default mode): a handover must not leave the group's
// offset behind the durable state, or the next owner re-reads and republishes
// what this one already did.

// checkpoint runs the protocol synchronously.
//
// Exactly-once, an interval whose records published nothing (a second stage
// that read only markers or re-sent hop records) is checkpointed like any
// other: its transaction holds the offset commit alone (endOffsetsOnlyTxn).
// Waiting for the next output to carry the offset, as it once did, waited
// forever on a repartition partition that no event is keyed to: neither its
// offset nor its snapshot moved, and its checkpoint age grew without bound.
func (w *worker) checkpoint() error {
	if !w.dirty {
		if w.markersOpen {
			return w.commitMarkers()
		}
		return w.catchUpCommit()
	}
	start := time.Now()
	sw := w.cut()
	sw.snap.Step(math.MaxInt)
	w.s.m.CheckpointPause.Observe(time.Since(start).Seconds())
	return w.settle(w.persist(sw))
}

// commitMarkers commits, under exactly-once, an open transaction that holds hop
// markers only (an idle declaration, a renewal of its lease, an owner's
// announcement) while the state is the last committed snapshot's: markers are no
// state, so the transaction commits that snapshot's offset and metadata again,
// and no snapshot is taken. A quiet partition renews its lease every quarter of
// it, and a snapshot each time would cost an idle partition more than a busy
// one. It runs on the partition goroutine between batches, with no background
// checkpoint in flight (both callers hold that), so nothing is emitted while it
// waits and the gate has nothing to hold. With nothing committed by this owner
// yet (savedNote), it takes a full checkpoint instead.
func (w *worker) commitMarkers() error {
	if w.released.Load() {
		return nil // the partition is going: as persist, commit nothing for it
	}
	if w.savedNote == nil || w.committed != w.savedNext {
		w.dirty = true
		return w.checkpoint()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := w.tracker.Cut().Wait(ctx); err != nil {
		w.s.m.ProduceErrors.Inc()
		return fmt.Errorf("partition %d: flush of hop markers: %w", w.part, err)
	}
	if err := w.tracker.Err(); err != nil {
		w.s.m.ProduceErrors.Inc()
		return fmt.Errorf("partition %d: %w", w.part, err)
	}
	if err := w.commitTxn(ctx, w.savedNext, *w.savedNote, false); err != nil {
		w.s.m.CommitErrors.Inc()
		return fmt.Errorf("partition %d: exactly-once commit of hop markers at offset %d: %w", w.part, w.savedNext, err)
	}
	w.txnRecords, w.markersOpen, w.lastDurable = 0, false, time.Now()
	return nil
}

// catchUpCommit commits the offset of the last durable snapshot when an
// earlier commit of it failed (default mode; exactly-once commits inside the
// transaction or not at all).
func (w *worker) catchUpCommit() error {
	if w.txn != nil || w.committed >= w.savedNext {
		w.lastDurable = time.Now() // nothing changed since the last durable checkpoint
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.commitLogged(ctx, w.savedNext, w.savedNote)
	return nil
}

// commitLogged commits next for the group (default mode). A failure is not an
// error: the snapshot is saved, so a restart resumes from it whatever the
// group's offset says; committed stays behind and the commit is retried.
func (w *worker) commitLogged(ctx context.Context, next int64, note *checkpoint.CommitNote) {
	if err := w.commit(ctx, next, note); err != nil {
		w.s.m.CommitErrors.Inc()
		w.s.log.Warn("offset commit failed; retried at the next checkpoint", zap.Int32("partition", w.part), zap.Int64("next", next), zap.Error(err))
		return
	}
	w.committed, w.lastDurable = max(w.committed, next), time.Now()
}

// checkpointInBackground runs the protocol without stalling the partition:
// the snapshot is cut here, taken in steps of about a
// millisecond between batches (advanceSweep), and then persisted on a
// goroutine while processing goes on; backgroundDone settles it. Only one runs
// at a time; an interval that finds one still running is skipped.
func (w *worker) checkpointInBackground() error {
	if !w.dirty {
		if w.markersOpen {
			return w.commitMarkers()
		}
		return w.catchUpCommit()
	}
	if w.txn != nil && w.txnRecords == 0 {
		// An exactly-once transaction without records: there are no outputs
		// to wait for, and its commit (endOffsetsOnlyTxn) may replace the
		// producer, which only the partition goroutine may do.
		return w.checkpoint()
	}
	start := time.Now()
	w.sweep = w.cut()
	w.bgBusy = true
	w.s.m.CheckpointPause.Observe(time.Since(start).Seconds())
	w.advanceSweep(sweepSlice)
	return nil
}

// cut begins a snapshot at the current position.
func (w *worker) cut() *sweep {
	w.seq++
	sw := &sweep{
		snap:  w.proc.BeginSnapshot(w.snapBuf[:0]),
		next:  w.proc.Next(),
		id:    checkpoint.ID{Epoch: w.epoch, Seq: w.seq},
		flush: w.idleFlushAt,
		ahead: w.flushAhead,
		// Exactly-once: the transaction holds no record.
		offsetsOnly: w.txn != nil && w.txnRecords == 0,
		epoch:       w.tracker.Cut(), // at the snapshot: no output in between
		start:       time.Now(),
	}
	if w.gate != nil {
		// Exactly-once: what is emitted from here on belongs to the next
		// transaction, which begins when this one has committed; until then
		// the gate holds it (released in settle).
		w.gate.Hold()
		w.txnRecords = 0
	}
	w.snapBuf = nil                       // owned by the snapshot until settle returns it
	w.dirty, w.markersOpen = false, false // the transaction being committed holds them
	return sw
}

// sweep is a checkpoint whose snapshot was cut (see
// pipeline.Processor.BeginSnapshot) and is being taken or persisted.
type sweep struct {
	snap        *pipeline.PendingSnapshot
	next        int64
	id          checkpoint.ID
	flush       int64 // idleFlushAt at the cut
	ahead       int64 // flushAhead at the cut: still to repeat, past next
	offsetsOnly bool  // exactly-once: no record in the transaction
	epoch       *sink.Epoch
	start       time.Time
}

const (
	// sweepSlice bounds one stop of the partition to advance a snapshot: after a
	// batch, so that event-to-feature latency stays flat while it is taken.
	sweepSlice = time.Millisecond
	// sweepIdleSlice is the stop on a tick when no batch came for sweepIdleAfter:
	// nothing waits, so the snapshot (and its commit) may finish sooner. A busy
	// partition keeps to sweepSlice on ticks too.
	sweepIdleSlice = 10 * time.Millisecond
	sweepIdleAfter = 50 * time.Millisecond
	// sweepStep is how many entities are encoded between clock reads.
	sweepStep = 256
)

// advanceSweep takes more of the snapshot in progress, for about d, and once
// it is complete hands it to a goroutine that persists it.
func (w *worker) advanceSweep(d time.Duration) {
	sw := w.sweep
	if sw == nil {
		return
	}
	t0 := time.Now()
	done := sw.snap.Step(sweepStep)
	for !done && time.Since(t0) < d {
		done = sw.snap.Step(sweepStep)
	}
	w.s.m.CheckpointPause.Observe(time.Since(t0).Seconds())
	if !done {
		return
	}
	w.sweep = nil
	go func() { w.bgDone <- w.persist(sw) }()
}

// completeSweep takes the rest of a snapshot in progress at once: before a
// revoke's or shutdown's checkpoint, which must follow it.
func (w *worker) completeSweep() {
	if w.sweep != nil {
		w.sweep.snap.Step(math.MaxInt)
		w.advanceSweep(0)
	}
}

// persist finishes encoding a cut snapshot, waits for the outputs before the
// cut, saves the snapshot and commits its offset. It runs on the partition
// goroutine or on a background one, so it touches none of the partition
// goroutine's fields (the tracker and the transactional client are safe to
// use from any goroutine; only a synchronous checkpoint replaces them, after
// an offsets-only commit: endOffsetsOnlyTxn). Once the
// worker is released (the partition lost or revoked) it stops before the save
// and before the commit: an old owner must not move the group's offset.
func (w *worker) persist(sw *sweep) bgResult {
	res := bgResult{snap: sw.snap, next: sw.next, note: checkpoint.CommitNote{Snapshot: sw.id, IdleFlushAt: sw.flush, IdleFlushAhead: sw.ahead}}
	state, err := sw.snap.Finish()
	if err != nil {
		w.s.m.CheckpointErrors.Inc()
		res.err = fmt.Errorf("partition %d: %w", w.part, err)
		return res
	}
	w.s.m.CheckpointBytes.WithLabelValues(w.label).Set(float64(len(state)))
	w.s.m.CheckpointWritten.WithLabelValues(w.label).Add(float64(len(state) + sw.snap.SegmentBytes()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sw.epoch.Wait(ctx); err != nil {
		w.s.m.ProduceErrors.Inc()
		res.err = fmt.Errorf("partition %d: flush before checkpoint: %w", w.part, err)
		return res
	}
	if err := w.tracker.Err(); err != nil {
		w.s.m.ProduceErrors.Inc()
		res.err = fmt.Errorf("partition %d: %w", w.part, err)
		return res
	}
	if w.released.Load() {
		return res
	}
	snap := checkpoint.Snapshot{Next: sw.next, State: state, Epoch: sw.id.Epoch, Seq: sw.id.Seq}
	if err := w.s.cfg.Store.Save(ctx, w.s.key(w.part), snap); err != nil {
		if !errors.Is(err, checkpoint.ErrFenced) {
			w.s.m.CheckpointErrors.Inc()
		}
		res.err = fmt.Errorf("partition %d: %w", w.part, err)
		return res
	}
	res.saved = true
	if w.released.Load() {
		return res
	}
	if w.txn != nil {
		// The snapshot above is durable before this commit: a crash in
		// between leaves it ahead of the committed transaction, and restore
		// steps back to the previous one, found by the ID this commit
		// carries (checkpoint.ForCommitted).
		if err := w.commitTxn(ctx, sw.next, res.note, sw.offsetsOnly); err != nil {
			w.s.m.CommitErrors.Inc()
			res.err = fmt.Errorf("partition %d: exactly-once commit of offset %d: %w", w.part, sw.next, err)
			return res
		}
		res.committed = true
	} else if err := w.commit(ctx, sw.next, &res.note); err != nil {
		// Not an error: the snapshot is saved, so a restart resumes from it
		// whatever the group's offset says; settle leaves committed behind
		// and the next checkpoint retries.
		w.s.m.CommitErrors.Inc()
		w.s.log.Warn("offset commit failed; retried at the next checkpoint", zap.Int32("partition", w.part), zap.Int64("next", sw.next), zap.Error(err))
	} else {
		res.committed = true
	}
	w.s.m.CheckpointSeconds.Observe(time.Since(sw.start).Seconds())
	if ce := w.s.log.Check(zap.DebugLevel, "checkpoint saved"); ce != nil {
		ce.Write(zap.Int32("partition", w.part), zap.Int64("next", sw.next), zap.Int("bytes", len(state)),
			zap.Time("began", sw.start), zap.Duration("took", time.Since(sw.start)))
	}
	return res
}

// settle records, on the partition goroutine, how far a persist got, and
// takes back what the snapshot borrowed.
func (w *worker) settle(res bgResult) error {
	w.proc.EndSnapshot(res.snap)
	w.snapBuf = res.snap.Bytes()[:0]
	if res.saved {
		w.savedNext = res.next
		note := res.note
		w.savedNote = &note
		w.deleteSegments(w.proc.SnapshotSaved(res.snap))
		w.sweepSegments()
	} else {
		// The state since the previous durable snapshot is not saved.
		w.dirty = true
	}
	if res.committed {
		w.committed, w.lastDurable = max(w.committed, res.next), time.Now()
		if w.gate != nil {
			// The next transaction has begun: the outputs held since the
			// cut go into it, in order, ahead of everything after them.
			w.gate.Release()
		}
	}
	// Else, exactly-once, the gate stays held: the transaction was lost, or
	// the partition released, and the worker leaves with the outputs it holds,
	// which the next owner makes again from the committed state.
	return res.err
}

// waitBackground waits for a background checkpoint still running.
func (w *worker) waitBackground() error {
	if !w.bgBusy {
		return nil
	}
	return w.backgroundDone(<-w.bgDone)
}

// backgroundDone settles a finished background checkpoint.
func (w *worker) backgroundDone(res bgResult) error {
	w.bgBusy = false
	return w.settle(res)
}

// segmentSweepEvery is how often an owner looks for dedupe segments that no
// snapshot lists; the first look is at its first save. segmentSweepAge spares
// the young ones: a segment that a checkpoint in progress (ours, or a zombie
// owner's) has written but not yet listed in a saved snapshot.
const (
	segmentSweepEvery = 10 * time.Minute
	segmentSweepAge   = 10 * time.Minute
)

// sweepSegments deletes, off the partition goroutine, the partition's segments
// that neither snapshot the store keeps lists: left by a crash between a
// segment write and the save that would have listed it, or by the previous
// owner. Call it on the partition goroutine after a save.
//
// What the store's snapshots list is read from the store, not taken from our
// own state: an instance that was frozen past its session (a zombie) and
// sweeps when it thaws must not delete what the partition's new owner listed.
// A segment listed by a snapshot saved after that read is either listed by one
// read or younger than segmentSweepAge, since each snapshot lists what the one
// before it did plus at most one new segment.
func (w *worker) sweepSegments() {
	ls, ok := w.s.cfg.Store.(checkpoint.SegmentLister)
	if !ok || !w.lastSweep.IsZero() && time.Since(w.lastSweep) < segmentSweepEvery {
		return
	}
	w.lastSweep = time.Now()
	key := w.s.key(w.part)
	w.s.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		n, err := sweepUnlisted(ctx, ls, key, time.Now())
		if err != nil {
			w.s.log.Warn("dedupe segment sweep stopped; unlisted segments stay as garbage", zap.Int32("partition", w.part), zap.Error(err))
		}
		if n > 0 {
			w.s.log.Info("deleted dedupe segments no snapshot lists", zap.Int32("partition", w.part), zap.Int("segments", n))
		}
	})
}

// sweepUnlisted deletes key's segments older than segmentSweepAge at now that
// none of the store's kept snapshots lists, and returns how many.
func sweepUnlisted(ctx context.Context, ls checkpoint.SegmentLister, key checkpoint.Key, now time.Time) (int, error) {
	listed, err := storeListed(ctx, ls, key)
	if err != nil {
		return 0, fmt.Errorf("cannot tell which segments the stored snapshots list: %w", err)
	}
	segs, err := ls.ListSegments(ctx, key)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, sg := range segs {
		if listed[string(sg.Ref)] || now.Sub(sg.Written) < segmentSweepAge {
			continue
		}
		if err := ls.DeleteSegment(ctx, key, sg.Ref); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// storeListed returns the segments that the snapshots the store keeps for key
// list. A snapshot it cannot read or parse is an error: the caller then
// deletes nothing.
func storeListed(ctx context.Context, st checkpoint.Store, key checkpoint.Key) (map[string]bool, error) {
	loaded, err := st.Load(ctx, key)
	if err != nil {
		return nil, err
	}
	if loaded.FellBack {
		return nil, fmt.Errorf("newest snapshot unreadable: %w", loaded.CorruptErr)
	}
	listed := map[string]bool{}
	states := [][]byte{loaded.State}
	if loaded.Previous != nil {
		states = append(states, loaded.Previous.State)
	}
	for _, state := range states {
		refs, err := pipeline.SegmentRefs(state)
		if err != nil {
			return nil, err
		}
		for _, ref := range refs {
			listed[string(ref)] = true
		}
	}
	return listed, nil
}

// deleteSegments removes, off the partition goroutine, dedupe segments that no
// snapshot the store keeps lists any more. A failure only leaves garbage.
func (w *worker) deleteSegments(refs [][]byte) {
	ss, ok := w.s.cfg.Store.(checkpoint.SegmentStore)
	if len(refs) == 0 || !ok {
		return
	}
	key := w.s.key(w.part)
	w.s.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, ref := range refs {
			if err := ss.DeleteSegment(ctx, key, ref); err != nil {
				w.s.log.Warn("cannot delete an unreferenced dedupe segment; it stays as garbage",
					zap.Int32("partition", w.part), zap.Error(err))
			}
		}
	})
}

// repeatFlush releases the reorder buffer where the previous owner released
// it on its idle timeout (flushAhead), as it did: everything pending, in
// (event time, offset) order.
func (w *worker) repeatFlush() {
	at := w.flushAhead
	pending := w.proc.Pending()
	w.proc.Flush(w.emitFn)
	w.idleFlushAt, w.flushAhead = at, -1
	if pending > 0 { // else the state restored was cut after the release
		w.s.log.Info("repeated the previous owner's idle release of the reorder buffer",
			zap.Int32("partition", w.part), zap.Int64("at", at), zap.Int64("next", w.proc.Next()), zap.Int("events", pending))
	}
}

// commitFlushAhead commits, in the default mode, that the partition releases
// its reorder buffer on the idle timeout at Next, before the release: it
// reports whether the commit went through, and only then may the caller
// release. The outputs of the release are published at once and the next
// checkpoint's commit covers them only later; an owner killed in between
// would leave a next owner that resumes with those events pending, counts an
// older event arriving after them before them, and publishes their outputs
// again unlike the first time, with nothing in the outputs to show why. With
// the note committed, the next owner releases at the same position (flushAhead)
// and publishes the same outputs.
//
// Invariant: the committed note names the last release. So a release waits
// for a checkpoint that covers the one before it (committed at or after it:
// the note has one field for a release ahead of the offset) and for a
// background checkpoint in progress (whose commit would replace this note with
// its own, made before the release). The offset committed is the last durable
// snapshot's, as a catch-up commit would.
func (w *worker) commitFlushAhead() bool {
	if w.bgBusy {
		return false
	}
	if w.committed < 0 && w.savedNote == nil {
		// Nothing committed, nor saved by this worker: savedNext is where
		// it started, which may be the reset offset of an empty group, not
		// an offset to commit. The first checkpoint commits one.
		return false
	}
	next := max(w.committed, w.savedNext)
	if w.idleFlushAt > next {
		return false
	}
	note := checkpoint.CommitNote{IdleFlushAt: w.idleFlushAt, IdleFlushAhead: w.proc.Next()}
	if w.savedNote != nil {
		note.Snapshot = w.savedNote.Snapshot
	}
	ctx, cancel := context.WithTimeout(context.Background(), flushCommitTimeout)
	defer cancel()
	if err := w.commit(ctx, next, &note); err != nil {
		w.s.m.CommitErrors.Inc()
		if time.Since(w.flushWarned) >= keyWarnEvery { // tried again at every tick
			w.flushWarned = time.Now()
			w.s.log.Warn("could not commit the idle release's position; the reorder buffer stays pending and the release is tried again",
				zap.Int32("partition", w.part), zap.Int64("next", next), zap.Int64("release_at", note.IdleFlushAhead), zap.Error(err))
		}
		return false
	}
	w.committed, w.lastDurable = max(w.committed, next), time.Now()
	return true
}

// flushCommitTimeout bounds the commit before an idle release, which the
// partition goroutine waits for: the broker has just answered the idle
// verdict's question, so a commit that takes longer is tried again at a later
// tick rather than holding the partition's reads.
const flushCommitTimeout = 5 * time.Second

// commit commits next for the group (default mode), with note in the
// offset's metadata when there is one: where the partition last released its
// whole reorder buffer on the idle timeout, which a new owner that has to
// rebuild the state by a warm-up read repeats (Service.warmUp). Without it
// the warm-up holds the released events pending again, and the new owner
// publishes them a second time, counted in another order than the first time
// (an older event that arrives after the release is counted before them).
func (w *worker) commit(ctx context.Context, next int64, note *checkpoint.CommitNote) error {
	if note != nil {
		meta := checkpoint.CommitMetadata(*note)
		topic, part := w.s.cfg.InputTopic, w.part
		ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
			for i := range req.Topics {
				if req.Topics[i].Topic != topic {
					continue
				}
				for j := range req.Topics[i].Partitions {
					if req.Topics[i].Partitions[j].Partition == part {
						req.Topics[i].Partitions[j].Metadata = &meta
					}
				}
			}
			return nil
		})
	}
	var cerr error
	w.s.cons.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{
		w.s.cfg.InputTopic: {w.part: {Epoch: -1, Offset: next}},
	}, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil {
					cerr = e
				}
			}
		}
	})
	return cerr
}
