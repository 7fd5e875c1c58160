package window

import (
	"errors"
	"fmt"
	"math"
)

// Reads without counting: the query API's lookup (ReadAt) and preview (Peek).
//
// Invariant: neither changes the table in any way a later Apply, snapshot or eviction
// could observe. They do not create entities, touch the LRU order or its sequence
// counter, copy entities into a snapshot in progress (they write nothing, so there is
// nothing to copy first), move raw allocations or prune events. They write only the
// caller's out and the table's per-call scratch: lo, which Apply rewrites before it
// reads it, and order, which only reads use. So a read between two Applies leaves
// every output and every snapshot byte as it would have been without it. Like
// everything else on a Table they run on the table's one goroutine; ReadAt allocates
// nothing (after a table's first read, which sizes its scratch).

// ErrNotRetained: a read at a time before the bucket of the entity's newest counted
// event, in some window. The buckets it would need have left that window's ring
// (each ring keeps only the N buckets ending at the newest event's), so the answer
// could not be exact; nothing is returned rather than a smaller count.
var ErrNotRetained = errors.New("window: as-of time is before the entity's retained buckets")

// ReadAt writes into out[i] window i's aggregates at asOf for entity: its counted
// events in buckets floor(asOf/b)−N+1 … floor(asOf/b), whole buckets (the bucket of
// asOf counts entirely, as buckets hold totals, not events). It returns the time of
// the entity's newest counted event and known=false (out all zeros) for an entity the
// table does not hold. A header-only entity (windows emptied, see EvictIdle) is known,
// with empty windows.
//
// It fails with ErrNotRetained if floor(asOf/b) < floor(newest/b) in some window, and
// with ErrInput for out too short or asOf out of the table's time range. Reads at or
// after the newest event are always exact; see the read invariant above.
func (t *Table) ReadAt(entity string, asOf int64, out []Agg) (newest int64, known bool, err error) {
	nw := len(t.specs)
	if len(out) < nw {
		return 0, false, fmt.Errorf("%w: out has %d slots for %d windows", ErrInput, len(out), nw)
	}
	if asOf > maxTime || asOf < -maxTime {
		return 0, false, fmt.Errorf("%w: as-of time %d out of range", ErrInput, asOf)
	}
	clear(out[:nw])
	slot, _, ok := t.lookup(entity)
	if !ok {
		return 0, false, nil
	}
	e := &t.slab[slot]
	atOrAfter := asOf >= e.newest // then every window's bucket is at or after newest's
	for i, b := range t.bms {
		ka := floorDiv(asOf, b)
		if !atOrAfter && ka < floorDiv(e.newest, b) {
			return e.newest, true, fmt.Errorf("%w: window %s holds buckets from the entity's newest event at %d on", ErrNotRetained, t.specs[i].Name, e.newest)
		}
		t.lo[i] = ka - t.nbs[i] + 1 // lowest bucket index read
	}
	switch {
	case e.rings != nil:
		rs := t.rings(e)
		for i := range rs {
			out[i] = rs[i].sumRange(t.lo[i], math.MaxInt64)
		}
	case e.raw != nil:
		// Every raw event is at or before newest, so at or before asOf's bucket:
		// window i is the suffix of the (time-sorted) events from its lowest bucket
		// on, and one backward pass totals every window.
		for i, b := range t.bms {
			t.lo[i] *= b // as a time
		}
		t.suffixRaw(e.raw, out)
	}
	return e.newest, true, nil
}

// suffixRaw writes into out[i] the totals of the raw events at or after t.lo[i] (a
// time), for every window, in one backward pass: windows are visited in decreasing
// lower bound, each taking the running total as the pass crosses its bound.
//
// The pass keeps the running total and the next bound in locals: with them read
// through t and its slices on every event (the compiler cannot keep a slice element
// in a register across the stores to out), the bound test was most of a read of an
// entity with a few dozen events (BenchmarkReadAt/raw).
func (t *Table) suffixRaw(raw []rawEvent, out []Agg) {
	nw := len(t.bms)
	if len(t.order) != nw {
		t.order = make([]int, nw) // once per table; a scratch, not state
	}
	lo, order := t.lo[:nw], t.order[:nw]
	out = out[:nw]
	for i := range nw { // insertion sort by decreasing lo: a handful of windows
		j := i
		for ; j > 0 && lo[order[j-1]] < lo[i]; j-- {
			order[j] = order[j-1]
		}
		order[j] = i
	}
	var cnt, sum int64
	mn, mx := int64(math.MaxInt64), int64(math.MinInt64)
	total := func() Agg {
		if cnt == 0 {
			return Agg{}
		}
		return Agg{cnt, sum, mn, mx}
	}
	w := 0
	bound := lo[order[0]]
	for j := len(raw) - 1; j >= 0; j-- {
		ev := raw[j]
		for ev.t < bound {
			out[order[w]] = total()
			if w++; w == nw {
				return
			}
			bound = lo[order[w]]
		}
		cnt++
		sum += ev.a
		mn, mx = min(mn, ev.a), max(mx, ev.a)
	}
	for ; w < nw; w++ {
		out[order[w]] = total()
	}
}

// plus is a with one more event of amount x. The caller rules out overflow.
func (a Agg) plus(x int64) Agg {
	if a.Count == 0 {
		return Agg{1, x, x, x}
	}
	return Agg{a.Count + 1, a.Sum + x, min(a.Min, x), max(a.Max, x)}
}

// merge is a and b together. The caller rules out overflow.
func (a Agg) merge(b Agg) Agg {
	switch {
	case b.Count == 0:
		return a
	case a.Count == 0:
		return b
	}
	return Agg{a.Count + b.Count, a.Sum + b.Sum, min(a.Min, b.Min), max(a.Max, b.Max)}
}

// sumRange totals the ring's buckets with index in [lo, hi]. When the range covers the
// whole ring (the common case: a read at the newest event's bucket) it is the running
// totals, O(1).
func (r *ring) sumRange(lo, hi int64) Agg {
	if r.n == 0 {
		return Agg{}
	}
	mask := len(r.buf) - 1
	first, last := &r.buf[r.head], &r.buf[(r.head+r.n-1)&mask]
	if first.k >= lo && last.k <= hi {
		return Agg{r.cnt, r.sum, r.min, r.max}
	}
	var o Agg
	for j := range r.n {
		bk := &r.buf[(r.head+j)&mask]
		if bk.k < lo {
			continue
		}
		if bk.k > hi {
			break
		}
		o = o.merge(Agg{bk.cnt, bk.sum, bk.min, bk.max})
	}
	return o
}

// PeekEvent is an event a Peek counts first, as Apply would have counted it.
type PeekEvent struct{ Time, Amount int64 }

// Peek returns what Apply(id, eventTime, amount, out) would return after
// Apply had counted each of before, in order, for the same entity (before must be in
// non-decreasing time, all at or before eventTime: events waiting ahead of it in the
// reorder buffer). Events of before that Apply would refuse as expired are skipped, as
// the pipeline dead-letters them. It changes nothing (see the read invariant above):
// the preview of a hypothetical transaction.
//
// Errors wrap ErrExpired (the event's bucket has left some window: it would be
// dead-lettered as late), ErrOverflow or ErrInput, as Apply's would.
func (t *Table) Peek(id string, eventTime, amount int64, before []PeekEvent, out []Agg) (prevGap int64, hasPrev bool, err error) {
	nw := len(t.specs)
	if len(out) < nw {
		return 0, false, fmt.Errorf("%w: out has %d slots for %d windows", ErrInput, len(out), nw)
	}
	if amount < 0 {
		return 0, false, fmt.Errorf("%w: amount %d is negative", ErrInput, amount)
	}
	if eventTime > maxTime || eventTime < -maxTime {
		return 0, false, fmt.Errorf("%w: event time %d out of range", ErrInput, eventTime)
	}
	if id == "" {
		return 0, false, fmt.Errorf("%w: empty entity id", ErrInput)
	}
	var e *entity
	if slot, _, ok := t.lookup(id); ok {
		e = &t.slab[slot]
	}
	// The entity's state after before: newest, previous time, and which of before count.
	has := e != nil
	var newest, prevT, tableNewest int64
	if has {
		newest, prevT, tableNewest = e.newest, e.prevT, e.newest
	}
	// Before is in time order, so an event of it older than the entity's newest is
	// older than everything counted before it too: whether Apply would refuse it
	// depends on the table's newest event alone.
	counted := func(p PeekEvent) bool {
		return p.Amount >= 0 && p.Time <= maxTime && p.Time >= -maxTime &&
			(e == nil || p.Time >= tableNewest || !t.expired(p.Time, tableNewest))
	}
	for _, p := range before {
		if !counted(p) {
			continue
		}
		if !has {
			newest, has = p.Time, true
		}
		newest, prevT = max(newest, p.Time), p.Time
	}
	if has && eventTime < newest && t.expired(eventTime, newest) {
		return 0, false, fmt.Errorf("%w: event at %d is in a bucket that left a window of the entity's newest event at %d", ErrExpired, eventTime, newest)
	}
	// Window i reads buckets max(k−N+1, K−N+1) … k, K the bucket of the newest event
	// including this one: Apply's rule for an in-order event (K = k) and an older one.
	top := max(newest, eventTime)
	if !has {
		top = eventTime
	}
	for i, b := range t.bms {
		k := floorDiv(eventTime, b)
		lo := max(k, floorDiv(top, b)) - t.nbs[i] + 1
		var o Agg
		if e != nil && floorDiv(tableNewest, b)-t.nbs[i]+1 <= lo {
			o = t.sumEntity(e, i, lo, k)
		}
		for _, p := range before {
			if pk := floorDiv(p.Time, b); pk >= lo && pk <= k && counted(p) {
				if o.Sum > math.MaxInt64-p.Amount {
					return 0, false, fmt.Errorf("%w: window %s", ErrOverflow, t.specs[i].Name)
				}
				o = o.plus(p.Amount)
			}
		}
		if o.Sum > math.MaxInt64-amount || o.Count == math.MaxInt64 {
			return 0, false, fmt.Errorf("%w: window %s", ErrOverflow, t.specs[i].Name)
		}
		out[i] = o.plus(amount)
	}
	if !has {
		return 0, false, nil
	}
	prevGap = eventTime - prevT
	if prevGap > t.ttl {
		return 0, false, nil
	}
	return prevGap, true, nil
}

// expired reports whether an event at ts has left some window of an entity whose
// newest event is at newest (Apply's ErrExpired test).
func (t *Table) expired(ts, newest int64) bool {
	for i, b := range t.bms {
		if floorDiv(ts, b) <= floorDiv(newest, b)-t.nbs[i] {
			return true
		}
	}
	return false
}

// sumEntity totals window i of e over buckets [lo, hi].
func (t *Table) sumEntity(e *entity, i int, lo, hi int64) Agg {
	switch {
	case e.rings != nil:
		return t.rings(e)[i].sumRange(lo, hi)
	case e.raw != nil:
		b := t.bms[i]
		var o Agg
		for _, ev := range e.raw {
			if k := floorDiv(ev.t, b); k >= lo && k <= hi {
				o = o.plus(ev.a)
			}
		}
		return o
	}
	return Agg{}
}

// MaxNewest is the largest newest-event time over the entities held (ok=false for an
// empty table): after a restore, the newest counted event time of the partition as far
// as the retained state shows it. O(entities).
func (t *Table) MaxNewest() (newest int64, ok bool) {
	newest = math.MinInt64
	for s := range t.slab {
		if e := &t.slab[s]; e.id != "" {
			newest, ok = max(newest, e.newest), true
		}
	}
	return newest, ok
}
