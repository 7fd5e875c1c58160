package service

// The query path: the API's reads of a partition's live state (pkg/api).
//
// Design. A read is a ReadRequest handed to the partition's worker over its queries
// channel; the worker serves it in its own select loop, between two batches (or
// ticks), and signals done. Nothing else ever touches a Processor, so:
//
// Invariant 1 (no race): every read of a partition's state runs on the goroutine that
// owns it, between two of its Process calls (between batches, and every readEvery+1
// records within one); there is no lock and no copy, and the state a read sees is the
// state after a whole record, whose offset the answer reports.
//
// Invariant 2 (no stall): one turn of reads (serveReads: every request already
// queued, taken in one go) costs the worker fewer than turnItems + MaxReadItems
// lookups (about 50–500 ns each; a preview also scans the reorder buffer once), so it
// delays the partition's next records by well under a millisecond; requests queue in
// a bounded channel and a full queue is refused at once (ErrBusy), never waited for
// by the worker. Handing the worker a whole queue per wake-up is what makes many
// small requests cheap for it: one wake-up, one registry check, then the reads. After a
// turn the worker yields once (runtime.Gosched) so that the readers it answered,
// runnable behind it, write their answers before it returns to a long batch; that
// costs the partition their run time (microseconds each, at most one per queued
// request) and measured no ingestion loss (BENCHMARKS.md, "Query API").
//
// Invariant 3 (no stale owner): a request is answered only by a worker registered in
// Service.workers for its partition when the turn that serves it began (checked on
// the worker's goroutine, under the service's lock, once per turn), and a worker leaves
// the map before it stops (stopPartitions, leaveTxnLost), so once a partition has been
// revoked or lost here, no read is answered from its state here. A partition being
// restored has no worker yet: ErrNotOwned, which the API turns into 503 when the group
// says the partition is ours (restoring) or moving.
//
// Invariant 5 (no answer after a stall the group may have noticed): a worker
// registered here may belong to a process that was stopped for longer than its
// session and has not heard yet that the group moved the partition; a turn of
// reads is served only if the stall guard (stall.go, where the invariant is
// written in full) has seen no such stall since the coordinator last confirmed
// this member. Invariant 6 (no answer out of touch with the group), written in
// full there too: nor while the newest heartbeat the coordinator confirmed was
// sent longer ago than the group can be sure to wait.
//
// Invariant 4 (reads change nothing): pipeline.Processor.Lookup, LookupFeatures and
// Preview change no state (see pkg/pipeline/query.go and featurequery.go), so what the
// API receives cannot alter outputs, snapshots or offsets.
//
// Under a feature definition a lookup may read the definition's features instead of
// the unfiltered windows (ReadItem.Row). Such a read costs more than a window lookup,
// by the filters and the distinct sets it reads (about 0.3–1.2 µs for the definitions
// of pkg/pipeline's BenchmarkLookupFeatures; a distinct set is scanned once per read,
// so up to its max_exact values), which is what bounds a turn of them.

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// MaxReadItems bounds the items of one ReadRequest (see invariant 2).
const MaxReadItems = 1000

// queryQueue is how many requests may wait for one partition's worker.
const queryQueue = 256

var (
	// ErrNotOwned: this instance runs no worker for the partition now (not ours,
	// being restored, or just released).
	ErrNotOwned = errors.New("service: partition not served by this instance now")
	// ErrBusy: the partition's read queue is full.
	ErrBusy = errors.New("service: partition read queue full")
	// ErrTooManyItems: a request over MaxReadItems.
	ErrTooManyItems = errors.New("service: too many items in one read request")
)

// ReadItem is one entity's lookup or preview in a ReadRequest. The caller fills the
// inputs; the worker fills the outputs.
type ReadItem struct {
	Entity     string
	AsOf       int64 // used unless UseDefault
	UseDefault bool
	// Preview, if set, makes this item a preview of Tx (Tx.EntityID is Entity)
	// instead of a lookup; HasEventID says whether Tx.EventID was given.
	Preview    *pipeline.Preview
	Tx         codec.Transaction
	HasEventID bool
	// Row, if set (and Preview is not), makes this item a lookup of the feature
	// definition's features (pipeline.Processor.LookupFeatures), written into Row
	// (feature.NewRow of Service.Features), instead of the windows into Aggs. On a
	// service without a definition its Err is pipeline.ErrNoFeatures.
	Row *feature.Row

	// Outputs.
	Info pipeline.LookupInfo
	Aggs []window.Agg // len ≥ number of windows; the caller allocates
	Err  error
}

// ReadRequest is a batch of reads of one partition.
type ReadRequest struct {
	Items []ReadItem
	// Specs are the partition's windows, set by the worker.
	Specs []window.Spec
	// Timeout, if positive, bounds Read's wait for the worker (then
	// context.DeadlineExceeded). It costs less than a context with a deadline, which
	// allocates and registers with its parent on every call: the request keeps one
	// timer and resets it.
	Timeout time.Duration
	timer   *time.Timer
	done    chan struct{}
	// w is the worker Submit handed the request to, until Wait; only the caller's
	// goroutine touches it.
	w *worker
}

// NewReadRequest makes a request of n items with their Aggs sized for windows.
func NewReadRequest(n, windows int) *ReadRequest {
	r := &ReadRequest{Items: make([]ReadItem, n), done: make(chan struct{}, 1)}
	aggs := make([]window.Agg, n*windows)
	for i := range r.Items {
		r.Items[i].Aggs = aggs[i*windows : (i+1)*windows : (i+1)*windows]
	}
	return r
}

// Read hands req to partition p's worker and waits for its answer: Submit, then
// Wait. It returns ErrNotOwned when no worker of this instance serves p (now, or by
// the time the request reaches it), ErrBusy when p's queue is full, or ctx's error;
// then req must not be reused (the worker may still write to it).
func (s *Service) Read(ctx context.Context, p int32, req *ReadRequest) error {
	if err := s.Submit(p, req); err != nil {
		return err
	}
	return s.Wait(ctx, req)
}

// Submit hands req to partition p's worker without waiting for it; Wait then waits
// for the answer. A caller reading several partitions (or several services' ones:
// the query API's transaction call reads one partition of each group) hands every
// request over before waiting for any, so that it waits for the slowest worker, not
// for their sum, and without a goroutine per read. req.Timeout, if positive, starts
// now. Errors as Read's; after one, Wait must not be called for req (it is not
// handed over).
func (s *Service) Submit(p int32, req *ReadRequest) error {
	if len(req.Items) > MaxReadItems {
		return ErrTooManyItems
	}
	if req.done == nil {
		req.done = make(chan struct{}, 1)
	}
	s.mu.Lock()
	w := s.workers[p]
	s.mu.Unlock()
	if w == nil || w.queries == nil {
		return ErrNotOwned
	}
	// Set before the hand-over: the worker never reads these fields, and once req
	// is in the queue it may be answered at any moment.
	req.w = w
	if req.Timeout > 0 {
		if req.timer == nil {
			req.timer = time.NewTimer(req.Timeout)
		} else {
			req.timer.Reset(req.Timeout) // a stopped timer's channel holds nothing (Go ≥ 1.23)
		}
	}
	select {
	case w.queries <- req:
		return nil
	case <-w.done:
		s.unsubmit(req)
		return ErrNotOwned
	default:
		s.unsubmit(req)
		return ErrBusy
	}
}

func (s *Service) unsubmit(req *ReadRequest) {
	req.w = nil
	if req.timer != nil {
		req.timer.Stop()
	}
}

// Wait waits for the answer to req, handed over by Submit: nil when answered,
// ErrNotOwned when the worker left before serving it (or req was not handed over),
// context.DeadlineExceeded past req.Timeout (counted from Submit), or ctx's error;
// after an error req must not be reused (the worker may still write to it).
func (s *Service) Wait(ctx context.Context, req *ReadRequest) error {
	w := req.w
	if w == nil {
		return ErrNotOwned
	}
	req.w = nil
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		defer req.timer.Stop()
		timeout = req.timer.C
	}
	select {
	case <-timeout:
		return context.DeadlineExceeded
	case <-req.done:
		if req.Specs == nil { // refused: no longer registered when it was served
			return ErrNotOwned
		}
		return nil
	case <-w.done:
		// It may have served us just before leaving.
		select {
		case <-req.done:
			if req.Specs != nil {
				return nil
			}
		default:
		}
		return ErrNotOwned
	case <-ctx.Done():
		return ctx.Err()
	}
}

// serveRead answers req on the worker's goroutine (see the invariants above);
// current is whether the worker was registered for its partition when its turn of
// reads began, and hints the turn's lookahead (nil: none).
func (w *worker) serveRead(req *ReadRequest, current bool, hints *turnHints) {
	defer func() { req.done <- struct{}{} }()
	if !current {
		return // req.Specs stays nil: not ours any more
	}
	dec := w.s.previewDecoder()
	for i := range req.Items {
		it := &req.Items[i]
		w.hintNext(hints)
		if it.Preview != nil {
			it.Tx.EntityID = it.Entity
			w.proc.Preview(&it.Tx, it.HasEventID, dec, it.Preview)
			def, from, to := w.proc.AsOf()
			it.Info = pipeline.LookupInfo{AsOf: def, Pending: w.proc.Pending(), LastOffset: w.proc.Next() - 1, From: from, To: to}
			continue
		}
		if it.Row != nil {
			it.Info, it.Err = w.proc.LookupFeatures(it.Entity, it.AsOf, it.UseDefault, it.Row)
			continue
		}
		it.Info, it.Err = w.proc.Lookup(it.Entity, it.AsOf, it.UseDefault, it.Aggs)
	}
	req.Specs = w.s.cfg.Specs
}

// readEvery+1 is how many records of a batch the worker processes between two looks at
// its read queue (a power of two): a fetched batch near the peak holds thousands of
// records, several milliseconds of work, which a read would otherwise wait out.
const readEvery = 255

// serveQueued serves the reads already queued, without waiting for any: called
// between two records of a batch, where the state is as consistent as between two
// batches (a read reports the last offset it reflects).
func (w *worker) serveQueued() {
	select {
	case req := <-w.queries:
		w.serveReads(req)
	default:
	}
}

// turnItems bounds the items one turn of reads takes from the queue (see invariant
// 2): a turn stops taking requests once it holds this many, so it serves fewer than
// turnItems + MaxReadItems.
const turnItems = MaxReadItems

// serveReads serves, in one turn, the request just received and whatever else is
// already queued, up to turnItems items: a burst of reads costs the partition one
// wake-up and one look at the registry (invariant 3: the registration is read once
// per turn, on this goroutine, and a turn is well under a millisecond, the same
// window a single request's read had between that look and its answer).
func (w *worker) serveReads(first *ReadRequest) {
	var turn [queryQueue + 1]*ReadRequest
	turn[0] = first
	n, items := 1, len(first.Items)
take:
	for n < len(turn) && items < turnItems {
		select {
		case req := <-w.queries:
			turn[n] = req
			n++
			items += len(req.Items)
		default:
			break take
		}
	}
	w.s.mu.Lock()
	current := w.s.workers[w.part] == w
	w.s.mu.Unlock()
	// Invariants 5 and 6: not after a stall the group may have acted on, nor
	// out of touch with the coordinator for that long.
	current = current && w.s.stall.ok()
	// The lookahead lives on this goroutine's stack, set up here rather than in a
	// callee: a callee storing turn[:n] through a pointer would move turn to the heap.
	var th turnHints
	var hints *turnHints // a turn of a few items is served without
	if current && items >= hintMin {
		th = turnHints{far: turnCursor{turn: turn[:n]}, near: turnCursor{turn: turn[:n]}, hinting: true}
		hints = &th
		w.hintTurn(hints)
	}
	for _, req := range turn[:n] {
		w.serveRead(req, current, hints)
	}
	// The readers just answered are runnable on this goroutine's P, behind it: if
	// it goes back to a long batch they wait for it to block or be preempted (up to
	// 10 ms), with every P busy with partitions. Yielding once lets them write their
	// answers (microseconds each) first; the partition resumes after them.
	runtime.Gosched()
}

// hintMin is the fewest items in a turn for which the worker hints lookups ahead
// (hintTurn): for one or two, the hints would only hash each id twice more.
const hintMin = 4

// turnCursor walks the items of a turn in the order they are served.
type turnCursor struct {
	turn []*ReadRequest
	r, i int
}

func (c *turnCursor) next() (string, bool) {
	for c.r < len(c.turn) {
		if items := c.turn[c.r].Items; c.i < len(items) {
			c.i++
			return items[c.i-1].Entity, true
		}
		c.r, c.i = c.r+1, 0
	}
	return "", false
}

// hintTurn installs, for the turn about to be served, the lookahead that serveRead's
// lookups then meet: the first 2·HintDistance entities' index entries and the first
// HintDistance entities' records are requested now, and serveRead's item loop keeps
// each further entity that far ahead (hintNext). It only changes timing.
func (w *worker) hintTurn(h *turnHints) {
	for range 2 * pipeline.HintDistance {
		if e, ok := h.far.next(); ok {
			w.proc.HintLookup(e, true)
		}
	}
	for range pipeline.HintDistance {
		if e, ok := h.near.next(); ok {
			w.proc.HintLookup(e, false)
		}
	}
}

// hintNext moves the lookahead on by one item (see hintTurn); h nil: no lookahead.
func (w *worker) hintNext(h *turnHints) {
	if h == nil || !h.hinting {
		return
	}
	if e, ok := h.far.next(); ok {
		w.proc.HintLookup(e, true)
	}
	if e, ok := h.near.next(); ok {
		w.proc.HintLookup(e, false)
	} else {
		h.hinting = false
	}
}

// previewDecoder validates preview transactions by the input's rules and limits.
func (s *Service) previewDecoder() codec.Decoder {
	s.previewOnce.Do(func() {
		s.previewDec, _ = codec.NewDecoder("", s.cfg.Limits) // our own schema: cannot fail
	})
	return s.previewDec
}

// GroupMember returns this instance's member id in the consumer group, once Run has
// joined it (ok=false before, or while the client is not a member).
func (s *Service) GroupMember() (memberID string, ok bool) {
	select {
	case <-s.setUp:
	default:
		return "", false
	}
	if s.setUpErr != nil || s.cons == nil {
		return "", false
	}
	id, gen := s.cons.GroupMetadata()
	return id, id != "" && gen >= 0
}

// Specs are the windows every partition reports, in output order.
func (s *Service) Specs() []window.Spec { return s.cfg.Specs }

// Features is the feature definition every partition runs (Config.Features), nil
// under the default contract; Definition names it ("<label>@<hash>", as the
// velocity.definition header does). The API serves a definition's features only
// when Features is set. Shared: do not modify it.
func (s *Service) Features() *feature.Spec { return s.cfg.Features }

// Definition is Config.Definition: the name of the definition Features compiles.
func (s *Service) Definition() string { return s.cfg.Definition }

// Config returns the service's configuration after defaults (the API reads the group,
// the input topic and the brokers' client options from it).
func (s *Service) Config() Config { return s.cfg }

// turnHints is a worker's lookahead over the turn of reads it is serving (hintTurn);
// only the worker's goroutine touches it.
type turnHints struct {
	far, near turnCursor
	hinting   bool
}

// queryState is the Service's part of the query path (embedded so that service.go
// does not change shape for it).
type queryState struct {
	previewOnce sync.Once
	previewDec  codec.Decoder
}
