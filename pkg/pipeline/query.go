package pipeline

// The query API's reads of one partition's state: Lookup (an entity's windows at an
// as-of time) and Preview (the features record a hypothetical transaction would get).
//
// Invariant: neither changes the Processor. They read the window table through
// window.Table.ReadAt and Peek and the watermark stage through Seen and EachPending,
// none of which writes state (see their packages), and they touch no counter, offset
// or scratch that Process reads before writing. Like every Processor method they run on
// the partition's goroutine (pkg/service serves them from the worker's loop), so they
// never race Process, and Process's outputs and snapshots are byte for byte what they
// would have been without them.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// MaxTime bounds as-of and event times (±2^62 ms), as the window table does.
const MaxTime = 1 << 62

// LookupInfo is what a Lookup says besides the aggregates.
type LookupInfo struct {
	AsOf       int64 // the event time the answer is computed at
	Known      bool  // the table holds the entity
	Pending    int   // events of the partition waiting in the reorder buffer, not counted
	LastOffset int64 // the last input offset processed (-1: none); pending ones excepted, all are reflected
	// From and To bound the as-of times a lookup of this partition accepts now.
	From, To int64
}

// AsOfRangeError is a requested as-of time outside [From, To].
type AsOfRangeError struct{ AsOf, From, To int64 }

func (e *AsOfRangeError) Error() string {
	return fmt.Sprintf("as-of time %d is outside the range this partition can answer exactly, %d to %d", e.AsOf, e.From, e.To)
}

// AsOf returns the partition's default as-of time and the range of as-of times that
// Lookup accepts.
//
// The default is the newest counted (released) event time, or the event time of the
// last idle-entity sweep if that is later (a gap in event time): a sweep drops the
// windows of entities that are empty at its watermark, so only reads at or after it
// are exact for every entity; before any counted event, the watermark; with no event
// at all, 0.
//
// From is the last sweep's time, for the same reason (a window table answers exactly
// from any time at or after an entity's newest bucket, which ReadAt checks per
// entity). To is the default plus the largest window: past it every window of every
// entity is empty, and a caller asking is more likely off by a unit than asking that.
func (p *Processor) AsOf() (def, from, to int64) {
	var largest int64
	for _, s := range p.cfg.Specs {
		largest = max(largest, s.WindowMs)
	}
	swept := p.lastSweep != 0
	switch {
	case p.hasNewest:
		def = p.newest
		if swept {
			def = max(def, p.lastSweep)
		}
	case swept:
		def = p.lastSweep
	default:
		if wm, ok := p.stage.Watermark(); ok {
			def = max(min(wm, MaxTime), -MaxTime)
		}
	}
	from, to = -MaxTime, MaxTime
	if swept {
		from = p.lastSweep
	}
	if p.hasNewest || swept {
		to = min(def+largest, MaxTime)
	}
	return def, from, to
}

// Lookup writes entity's window aggregates at asOf into out (len(out) >= number of
// windows, in configured order); with useDefault, at the default as-of time (AsOf).
// An as-of time outside the accepted range is an *AsOfRangeError; one before the
// entity's newest bucket wraps window.ErrNotRetained. It allocates nothing when it
// succeeds.
func (p *Processor) Lookup(entity string, asOf int64, useDefault bool, out []window.Agg) (LookupInfo, error) {
	def, from, to := p.AsOf()
	if useDefault {
		asOf = def
	}
	info := LookupInfo{AsOf: asOf, Pending: p.stage.Pending(), LastOffset: p.next - 1, From: from, To: to}
	if asOf < from || asOf > to {
		return info, &AsOfRangeError{AsOf: asOf, From: from, To: to}
	}
	_, known, err := p.table.ReadAt(entity, asOf, out)
	info.Known = known
	return info, err
}

// HintLookup tells the processor that a Lookup of entity comes soon, so that its
// cache misses overlap the lookups before it: with far, about 2·HintDistance lookups
// ahead, it starts loading the entity's index entry; without, about HintDistance
// ahead, its record and events (window.Table.Prefetch and PrefetchRecord). Many
// lookups served in one go (a batch, or a turn of queued requests) each cost a chain
// of dependent misses at a million entities, which hints turn into overlapped ones.
// It never changes anything.
func (p *Processor) HintLookup(entity string, far bool) {
	if far {
		p.table.Prefetch(entity)
	} else {
		p.table.PrefetchRecord(entity)
	}
}

// Specs are the processor's windows, in output order.
func (p *Processor) Specs() []window.Spec { return slices.Clone(p.cfg.Specs) }

// Preview is the outcome of a hypothetical transaction.
type Preview struct {
	// Outcome is "" when the transaction would get a features record, else the
	// dead-letter reason it would get (duplicate, late, invalid:<field>), with Detail.
	Outcome codec.Reason
	Detail  string
	// Features is the record it would get (Outcome ""): in the output topic's
	// form, with SourceOffset the partition's next offset, where it would land if
	// produced now. Its Windows are owned by the Preview (reused by the next call
	// given the same Preview).
	Features codec.Features
	// Waits is whether it would wait in the reorder buffer (its event time is after
	// the watermark it would make), to be counted after the pending events of its
	// entity that come before it, which Features includes.
	Waits bool
}

// Preview computes what Process would do with tx if it were the partition's next
// record, against the state as it is now, without changing it (see the invariant
// above): the decoder's rules (validate, a decoder of our schema with the service's
// limits, checks the fields; nil skips that), then duplicate (only when hasEventID:
// a transaction without an id has nothing to be a duplicate of), late, and the
// features the window rule gives, counting first the entity's pending events that
// would be released before it.
func (p *Processor) Preview(tx *codec.Transaction, hasEventID bool, validate codec.Decoder, pv *Preview) {
	*pv = Preview{Features: codec.Features{Windows: pv.Features.Windows[:0]}}
	maxSeen, hasMax := p.stage.MaxSeen()
	if validate != nil {
		var dec codec.Transaction
		if rej := validate.Decode(codec.EncodeTransaction(tx), maxSeen, hasMax, &dec); rej != nil {
			pv.Outcome, pv.Detail = rej.Reason, rej.Detail
			return
		}
	}
	if hasEventID && p.stage.Seen(tx.EventID) {
		pv.Outcome, pv.Detail = codec.ReasonDuplicate, "event_id already accepted on this partition"
		return
	}
	if cap(pv.Features.Windows) < len(p.cfg.Specs) {
		pv.Features.Windows = make([]codec.WindowAgg, len(p.cfg.Specs))
	}
	aggs := make([]window.Agg, len(p.cfg.Specs))
	late := false
	var before []window.PeekEvent
	wm, hasWM := p.stage.Watermark()
	if hasWM && tx.EventTime < wm {
		behind := uint64(wm) - uint64(tx.EventTime)
		if p.cfg.Late != LateApply || behind > uint64(p.lateHorizon) {
			pv.Outcome, pv.Detail = codec.ReasonLate, fmt.Sprintf("event_time %d is %d ms behind the watermark %d", tx.EventTime, behind, wm)
			return
		}
		late = true // counted at once, ahead of anything pending
	} else {
		newMax := tx.EventTime
		if hasMax {
			newMax = max(maxSeen, newMax)
		}
		pv.Waits = tx.EventTime > newMax-p.cfg.Watermark.AllowedLateness
		before = p.pendingBefore(tx.EntityID, tx.EventTime)
	}
	gap, hasPrev, err := p.table.Peek(tx.EntityID, tx.EventTime, tx.AmountMinor, before, aggs)
	switch {
	case errors.Is(err, window.ErrExpired):
		pv.Outcome, pv.Detail = codec.ReasonLate, "its bucket has left a window of the entity's newest event: "+err.Error()
		return
	case err != nil:
		pv.Outcome, pv.Detail = codec.Invalid("amount_minor"), err.Error()
		return
	}
	f := &pv.Features
	f.EventID, f.EntityID, f.EventTime = tx.EventID, tx.EntityID, tx.EventTime
	f.Windows = f.Windows[:len(p.cfg.Specs)]
	for i, s := range p.cfg.Specs {
		a := aggs[i]
		f.Windows[i] = codec.WindowAgg{Name: s.Name, WindowMs: s.WindowMs, BucketMs: s.BucketMs,
			Count: a.Count, SumMinor: a.Sum, MinMinor: a.Min, MaxMinor: a.Max}
	}
	f.MsSincePrevious, f.HasPrevious = gap, hasPrev
	f.Late = late
	f.SourceTopic, f.SourcePartition, f.SourceOffset = p.cfg.Topic, p.cfg.Partition, p.next
}

// pendingBefore lists the entity's pending events at or before t in release order
// ((event time, offset): a new record's offset is after all of them). O(pending).
func (p *Processor) pendingBefore(entity string, t int64) []window.PeekEvent {
	type pend struct{ t, off, a int64 }
	var ps []pend
	p.stage.EachPending(func(ev *watermark.Event) bool {
		if ev.EntityID == entity && ev.EventTime <= t {
			ps = append(ps, pend{ev.EventTime, ev.Offset, ev.Amount})
		}
		return true
	})
	if len(ps) == 0 {
		return nil
	}
	slices.SortFunc(ps, func(a, b pend) int { return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.off, b.off)) })
	out := make([]window.PeekEvent, len(ps))
	for i, q := range ps {
		out[i] = window.PeekEvent{Time: q.t, Amount: q.a}
	}
	return out
}
