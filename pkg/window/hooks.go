package window

import (
	"fmt"
	"math"
)

// Hooks and reads for a caller that keeps state of its own beside a Table's
// entities (pkg/feature keeps filtered tables and distinct-value sets per entity and
// must drop them exactly when the table drops the entity, and read filtered tables
// with the clip this table's newest event defines). None of them changes how Apply
// counts; the reads follow the read invariant of read.go.

// SetEvictHook makes the table call fn(entity, slot) for every entity it removes,
// just before the entity's slot is freed: an eviction by the MaxEntities cap (from
// inside the Apply that creates the new entity, which may then reuse the slot), by
// EvictIdle, or by Evict. It is not called for entities trimmed by RestoreTable (the
// hook cannot be set before it returns) nor when EvictIdle shrinks an entity to a
// header (the entity stays). entity is valid only during the call. fn must not call
// back into the table. nil removes the hook.
func (t *Table) SetEvictHook(fn func(entity string, slot int)) { t.evictHook = fn }

// Lookup returns the slot that holds entity and the time of its newest counted
// event. A slot is stable from the Apply that creates the entity until the entity is
// removed (see SetEvictHook); a later entity may then reuse it. Slots are below
// Slots(). Lookup changes nothing.
func (t *Table) Lookup(entity string) (slot int, newest int64, ok bool) {
	s, _, ok := t.lookup(entity)
	if !ok {
		return 0, 0, false
	}
	return int(s), t.slab[s].newest, true
}

// Slots is one more than the largest slot any entity can hold now.
func (t *Table) Slots() int { return len(t.slab) }

// SlotEntity returns the entity held in slot and the time of its newest counted
// event, or ok=false for a free or out-of-range slot. entity is valid until the
// entity is removed.
func (t *Table) SlotEntity(slot int) (entity string, newest int64, ok bool) {
	if slot < 0 || slot >= len(t.slab) || t.slab[slot].id == "" {
		return "", 0, false
	}
	e := &t.slab[slot]
	return e.id, e.newest, true
}

// Evict removes entity (calling the evict hook) and reports whether it was held.
// It is not counted in CapEvictions.
func (t *Table) Evict(entity string) bool {
	s, _, ok := t.lookup(entity)
	if ok {
		t.remove(s)
	}
	return ok
}

// Check returns the error Apply(entity, eventTime, amount, ...) would return now
// (nil when Apply would count the event), changing nothing: Apply's input checks,
// ErrExpired, and ErrOverflow, which Apply decides per window over the entity's
// counted events in buckets max(k, K)−N+1 onwards (k the event's bucket, K its
// newest event's): the event's own window for an in-order event, the window of the
// newest event for an older one. It lets a caller with several tables refuse an
// event before any of them counts it.
func (t *Table) Check(entity string, eventTime, amount int64) error {
	if amount < 0 {
		return fmt.Errorf("%w: amount %d is negative", ErrInput, amount)
	}
	if eventTime > maxTime || eventTime < -maxTime {
		return fmt.Errorf("%w: event time %d out of range", ErrInput, eventTime)
	}
	slot, _, ok := t.lookup(entity)
	if !ok {
		if entity == "" {
			return fmt.Errorf("%w: empty entity id", ErrInput)
		}
		return nil
	}
	e := &t.slab[slot]
	if eventTime < e.newest && t.expired(eventTime, e.newest) {
		return fmt.Errorf("%w: entity %q event at %d is in a bucket that left a window of its newest event at %d", ErrExpired, entity, eventTime, e.newest)
	}
	for i, b := range t.bms {
		lo := max(floorDiv(eventTime, b), floorDiv(e.newest, b)) - t.nbs[i] + 1
		o := t.sumEntity(e, i, lo, math.MaxInt64)
		if o.Sum > math.MaxInt64-amount || o.Count == math.MaxInt64 {
			return fmt.Errorf("%w: entity %q window %s", ErrOverflow, entity, t.specs[i].Name)
		}
	}
	return nil
}

// ReadClipped writes into out[i] window i's aggregates over entity's counted events
// in buckets max(k, K)−N+1 … k, k = floor(eventTime/b) and K = floor(top/b): what
// Apply's rule reads for an event at eventTime when the newest event that defines the
// clip is at top, which a caller may take from another table (top at or after this
// table's newest event of entity). known=false (out all zeros) for an entity the
// table does not hold. It fails with ErrNotRetained when top's bucket is before the
// entity's newest event's in some window (the buckets it would need may be gone) and
// with ErrInput for out too short or times out of range. It changes nothing.
func (t *Table) ReadClipped(entity string, eventTime, top int64, out []Agg) (known bool, err error) {
	nw := len(t.specs)
	if len(out) < nw {
		return false, fmt.Errorf("%w: out has %d slots for %d windows", ErrInput, len(out), nw)
	}
	if eventTime > maxTime || eventTime < -maxTime || top > maxTime || top < -maxTime {
		return false, fmt.Errorf("%w: time %d or %d out of range", ErrInput, eventTime, top)
	}
	clear(out[:nw])
	slot, _, ok := t.lookup(entity)
	if !ok {
		return false, nil
	}
	e := &t.slab[slot]
	if top < e.newest {
		for i, b := range t.bms {
			if floorDiv(top, b) < floorDiv(e.newest, b) {
				return true, fmt.Errorf("%w: window %s holds buckets from the entity's newest event at %d on", ErrNotRetained, t.specs[i].Name, e.newest)
			}
		}
	}
	if eventTime >= e.newest && eventTime >= top {
		// Every counted event is at or before eventTime: window i is everything from
		// its lowest bucket on, as in ReadAt.
		for i, b := range t.bms {
			t.lo[i] = floorDiv(eventTime, b) - t.nbs[i] + 1
		}
		switch {
		case e.rings != nil:
			rs := t.rings(e)
			for i := range rs {
				out[i] = rs[i].sumRange(t.lo[i], math.MaxInt64)
			}
		case e.raw != nil:
			for i, b := range t.bms {
				t.lo[i] *= b
			}
			t.suffixRaw(e.raw, out)
		}
		return true, nil
	}
	for i, b := range t.bms {
		k := floorDiv(eventTime, b)
		out[i] = t.sumEntity(e, i, max(k, floorDiv(top, b))-t.nbs[i]+1, k)
	}
	return true, nil
}
