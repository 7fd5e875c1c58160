// Package oracle recomputes the contract's outputs from its definitions, with
// no buckets, rings, heaps or snapshots: a slow, obviously correct reference
// that tests of the fast code (the processor, the service, replay, crash
// recovery) compare against. It is for tests only.
package oracle

import (
	"sort"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Event is one input record of one partition, already decoded.
type Event struct {
	Offset, Time, Amount int64
	ID, Entity           string
	// Invalid, if set, is the reason decoding or validation rejects the record.
	Invalid codec.Reason
}

// Result is what one input offset must yield.
type Result struct {
	Dead     bool
	Reason   codec.Reason
	Features codec.Features
}

// Config is the semantics that matter to the oracle.
type Config struct {
	Specs           []window.Spec
	LatenessMs      int64
	DedupeHorizonMs int64 // 0 = 24 h
	Topic           string
	Partition       int32
}

// Compute returns the output of every offset of evs, which must be one
// partition's records in offset order, processed to the end of the range (all
// pending events released), with the default late policy (dead-letter).
// Entities are never evicted (streams must stay within the entity TTL).
func Compute(cfg Config, evs []Event) map[int64]Result {
	horizon := cfg.DedupeHorizonMs
	if horizon == 0 {
		horizon = 24 * 3600 * 1000
	}
	out := make(map[int64]Result, len(evs))
	seen := map[string]int64{} // id -> event time it was accepted with
	var maxSeen int64
	hasMax := false
	var counted []Event
	for _, e := range evs {
		t0, dup := seen[e.ID]
		dup = dup && (!hasMax || t0 >= maxSeen-horizon)
		switch {
		case e.Invalid != "":
			out[e.Offset] = Result{Dead: true, Reason: e.Invalid}
		case dup:
			out[e.Offset] = Result{Dead: true, Reason: codec.ReasonDuplicate}
		case hasMax && e.Time < maxSeen-cfg.LatenessMs:
			out[e.Offset] = Result{Dead: true, Reason: codec.ReasonLate}
		default:
			seen[e.ID] = e.Time
			if !hasMax || e.Time > maxSeen {
				maxSeen, hasMax = e.Time, true
			}
			counted = append(counted, e)
		}
	}
	// Release order: (event time, offset).
	sort.SliceStable(counted, func(i, j int) bool {
		a, b := counted[i], counted[j]
		return a.Time < b.Time || a.Time == b.Time && a.Offset < b.Offset
	})
	byEntity := map[string][]Event{}
	for _, e := range counted {
		prev := byEntity[e.Entity]
		f := codec.Features{
			EventID: e.ID, EntityID: e.Entity, EventTime: e.Time,
			SourceTopic: cfg.Topic, SourcePartition: cfg.Partition, SourceOffset: e.Offset,
		}
		for _, s := range cfg.Specs {
			k := FloorDiv(e.Time, s.BucketMs)
			w := codec.WindowAgg{Name: s.Name, WindowMs: s.WindowMs, BucketMs: s.BucketMs}
			for _, o := range append(prev, e) {
				if ko := FloorDiv(o.Time, s.BucketMs); ko < k-int64(s.Buckets)+1 || ko > k {
					continue
				}
				if w.Count == 0 || o.Amount < w.MinMinor {
					w.MinMinor = o.Amount
				}
				if w.Count == 0 || o.Amount > w.MaxMinor {
					w.MaxMinor = o.Amount
				}
				w.Count++
				w.SumMinor += o.Amount
			}
			f.Windows = append(f.Windows, w)
		}
		if len(prev) > 0 {
			f.MsSincePrevious, f.HasPrevious = e.Time-prev[len(prev)-1].Time, true
		}
		byEntity[e.Entity] = append(prev, e)
		out[e.Offset] = Result{Features: f}
	}
	return out
}

// FloorDiv divides rounding toward negative infinity, as bucket numbers do.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
