package window

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unsafe"
)

var (
	// ErrExpired: an older event whose bucket is no longer retained in every window.
	// Counting it would need history the table has already dropped, so nothing changes.
	ErrExpired = errors.New("window: event is older than the retained buckets")
	// ErrOverflow: counting the event would overflow an int64 count or sum.
	ErrOverflow = errors.New("window: count or sum would overflow int64")
	// ErrInput: the call itself is malformed (negative amount, empty entity id,
	// event time out of range, out too short). Nothing changes.
	ErrInput = errors.New("window: invalid input")
)

// Agg is one window's aggregates. An empty window is all zeros.
type Agg struct{ Count, Sum, Min, Max int64 }

// Options tune a Table; the zero value is valid.
type Options struct {
	// MaxEntities bounds the table: 0 = unlimited; when full, creating an entity
	// evicts the least recently active one (counted by CapEvictions).
	MaxEntities int
	// HistoryTTLMs: 0 = default 7 days. How far back an entity's previous event is
	// remembered for ms_since_previous: Apply reports no previous event when it is
	// more than HistoryTTL before the event applied, exactly, whenever EvictIdle
	// runs. EvictIdle evicts an entity whose newest counted event is older than
	// (watermark − HistoryTTL) and whose windows are all empty; until then it is
	// kept (as a small header once its windows are empty).
	HistoryTTLMs int64
}

const (
	defaultHistoryTTLMs = 7 * 24 * 3600 * 1000

	// rawMax is how many retained raw events an entity keeps before switching to
	// bucket rings. A raw event costs 16 bytes against 40 per bucket per window, so
	// sparse entities (most cards) stay small; the bound keeps the per-event scan
	// short (one pass over ≤ rawMax events for all windows).
	rawMax = 32

	// Event times are restricted to ±2^62 ms (±146 million years) so that bucket
	// arithmetic such as (k+1)*b and time differences can never wrap.
	maxTime = 1 << 62
)

type rawEvent struct{ t, a int64 }

// bucket is one non-empty bucket of a window: index k = floor(t/b) and its totals.
type bucket struct{ k, cnt, sum, min, max int64 }

// ring holds the non-empty buckets of one window in increasing k, all within
// [K−N+1, K] where K is the bucket of the entity's newest event (always present, so
// n ≥ 1). len(buf) is a power of two grown on demand, so a quiet entity pays for the
// buckets it uses, not for N. cnt/sum/min/max are the running totals over the ring.
type ring struct {
	buf                []bucket
	head, n            int
	cnt, sum, min, max int64
}

// entity is one slab record (64 bytes, one cache line). Exactly one of three shapes:
//   - raw != nil: sorted raw events (every event still inside some window), in an
//     allocation that also holds the id (reallocRaw), which id then points into;
//   - rings != nil: one ring per window (rings points at the first of them);
//   - both nil: a header whose windows have emptied (see EvictIdle).
type entity struct {
	id     string // "" marks a free slot
	newest int64  // largest counted event time: defines K for every window
	prevT  int64  // time of the previous counted event in apply order
	raw    []rawEvent
	rings  *ring
}

// lruLinks are an entity's neighbours in activity order as slot+1 (0 = none). They
// live in a parallel slice, allocated only when MaxEntities > 0: an unbounded table
// does not pay for them, and entity stays 64 bytes, one cache line.
type lruLinks struct {
	prev, next uint32
	seq        uint64 // Table.seq when last made most recent: the LRU order, for snapshots
}

// Table is the per-entity window state of one partition. Not safe for concurrent use.
type Table struct {
	specs       []Spec
	bms         []int64 // bucket width per window
	nbs         []int64 // buckets per window
	maxEntities int
	ttl         int64

	idx              index // id → slot in slab
	slab             []entity
	lru              []lruLinks // parallel to slab when maxEntities > 0
	free             []uint32
	lruHead, lruTail uint32 // slot+1; head = most recently active
	capEvictions     uint64

	evictHook func(entity string, slot int) // see SetEvictHook; nil = none

	snap      *PendingSnapshot // a snapshot in steps (see BeginSnapshot), or nil
	spareSnap *PendingSnapshot // buffers of the last snapshot, for the next one
	seq       uint64           // activity counter behind lruLinks.seq

	// per-call scratch, sized to the number of windows, so Apply does not allocate
	lo, hi, fsum []int64
	order        []int // ReadAt's windows by decreasing lower bound (read.go)
}

// NewTable makes an empty table for specs (as returned by ParseSpecs).
func NewTable(specs []Spec, opts Options) (*Table, error) {
	if err := validSpecs(specs); err != nil {
		return nil, err
	}
	if opts.MaxEntities < 0 || opts.MaxEntities > math.MaxUint32-1 {
		return nil, fmt.Errorf("window: MaxEntities %d out of range (0 = unlimited)", opts.MaxEntities)
	}
	if opts.HistoryTTLMs < 0 {
		return nil, fmt.Errorf("window: HistoryTTLMs %d must be >= 0 (0 = 7 days)", opts.HistoryTTLMs)
	}
	t := &Table{
		specs:       slices.Clone(specs),
		maxEntities: opts.MaxEntities,
		ttl:         opts.HistoryTTLMs,
		idx:         newIndex(0),
	}
	if t.ttl == 0 {
		t.ttl = defaultHistoryTTLMs
	}
	nw := len(specs)
	t.bms = make([]int64, nw)
	t.nbs = make([]int64, nw)
	for i, sp := range specs {
		t.bms[i] = sp.BucketMs
		t.nbs[i] = int64(sp.Buckets)
	}
	t.lo, t.hi, t.fsum = make([]int64, nw), make([]int64, nw), make([]int64, nw)
	return t, nil
}

// Specs returns the table's windows in output order.
func (t *Table) Specs() []Spec { return slices.Clone(t.specs) }

// Len is the number of entities held (including header-only ones).
func (t *Table) Len() int { return t.idx.n }

// CapEvictions is the total number of entities evicted by the MaxEntities cap.
func (t *Table) CapEvictions() uint64 { return t.capEvictions }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// Apply counts one event for entity and writes the aggregates of window i into out[i]
// (len(out) >= len(specs)), e included. prevGap = t − (event time of the entity's
// previous counted event, in apply order); hasPrev=false when the entity has no
// retained previous event: none, or one more than HistoryTTL before t (whether or
// not EvictIdle has evicted it yet, so that the answer does not depend on when it
// runs).
//
// In-order events (eventTime >= the entity's newest event) read buckets k−N+1 … k.
// An older event lands in its own bucket if that bucket is still retained in every
// window (k > K−N for each window, K = bucket of the entity's newest event) and reads
// back buckets max(k−N+1, K−N+1) … k, i.e. what is retained up to its own bucket;
// otherwise it returns an error wrapping ErrExpired and changes nothing. Buckets are
// addressed by index, never by ring slot, so an old event cannot touch a newer bucket
// (the seed library's corruption bug: a late event written into a ring slot that a
// newer bucket had already reused).
//
// Errors wrap ErrExpired, ErrOverflow or ErrInput; on error nothing changes and out is
// unspecified.
func (t *Table) Apply(entity string, eventTime, amount int64, out []Agg) (prevGap int64, hasPrev bool, err error) {
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
	slot, pos, ok := t.lookup(entity)
	if !ok {
		if entity == "" {
			return 0, false, fmt.Errorf("%w: empty entity id", ErrInput)
		}
		slot, pos = t.create(entity)
		e := &t.slab[slot]
		e.newest, e.prevT = eventTime, eventTime
		e.appendRaw(rawEvent{eventTime, amount}) // also takes its own copy of the id
		t.setBlob(pos, e)
		for i := range nw {
			out[i] = Agg{1, amount, amount, amount}
		}
		return 0, false, nil
	}
	if t.snap != nil {
		t.snap.keep(slot) // copy before write
	}
	e := &t.slab[slot]
	if eventTime < e.newest {
		for i, b := range t.bms {
			if floorDiv(eventTime, b) <= floorDiv(e.newest, b)-t.nbs[i] {
				return 0, false, fmt.Errorf("%w: entity %q event at %d is in bucket %d of window %s, which left the window of its newest event at %d",
					ErrExpired, entity, eventTime, floorDiv(eventTime, b), t.specs[i].Name, e.newest)
			}
		}
	}
	if e.rings == nil && len(e.raw) >= rawMax {
		t.pruneRaw(e, max(e.newest, eventTime))
		if len(e.raw) >= rawMax {
			t.toRings(e)
		}
	}
	if e.rings != nil {
		err = t.applyRings(e, eventTime, amount, out)
	} else {
		err = t.applyRaw(e, eventTime, amount, out)
	}
	t.setBlob(pos, e) // the raw allocation may have moved or gone (also on error)
	if err != nil {
		return 0, false, err
	}
	prevGap = eventTime - e.prevT
	e.prevT = eventTime
	e.newest = max(e.newest, eventTime)
	if t.maxEntities > 0 {
		t.lruUnlink(slot)
		t.lruPushFront(slot)
	}
	if prevGap > t.ttl {
		return 0, false, nil
	}
	return prevGap, true, nil
}

// ---- raw representation ----

func (t *Table) applyRaw(e *entity, ts, a int64, out []Agg) error {
	nw := len(t.bms)
	older := ts < e.newest
	// Per window, the read-back range is [lo, hi) in time: buckets top−N+1 … k, where
	// top = max(k, K) (so an older event reads only what is retained) and hi is the end
	// of k's bucket for an older event (everything applied so far is ≤ ts otherwise).
	// For an older event, fsum also tracks the full window up to the newest event, so
	// its own sum is checked for overflow, keeping Range and a later switch to rings
	// safe.
	minLo := int64(math.MaxInt64)
	for i, b := range t.bms {
		k := floorDiv(ts, b)
		top, hi := k, int64(math.MaxInt64)
		if older {
			top, hi = max(k, floorDiv(e.newest, b)), (k+1)*b
		}
		t.lo[i] = (top - t.nbs[i] + 1) * b
		t.hi[i] = hi
		minLo = min(minLo, t.lo[i])
		out[i] = Agg{1, a, a, a}
		t.fsum[i] = a
	}
	// One forward pass (the order memory prefetches best) computes every window:
	// events are sorted by time, and each window is a contiguous range of them.
	for _, ev := range e.raw {
		if ev.t < minLo {
			continue
		}
		for i := range nw {
			if ev.t < t.lo[i] {
				continue
			}
			if older {
				if t.fsum[i] > math.MaxInt64-ev.a {
					return fmt.Errorf("%w: entity %q window %s", ErrOverflow, e.id, t.specs[i].Name)
				}
				t.fsum[i] += ev.a
				if ev.t >= t.hi[i] {
					continue
				}
			}
			o := &out[i]
			if o.Sum > math.MaxInt64-ev.a {
				return fmt.Errorf("%w: entity %q window %s", ErrOverflow, e.id, t.specs[i].Name)
			}
			o.Count++
			o.Sum += ev.a
			o.Min = min(o.Min, ev.a)
			o.Max = max(o.Max, ev.a)
		}
	}
	if !older {
		pruneRawBelow(e, minLo)
		e.appendRaw(rawEvent{ts, a})
		return nil
	}
	// Insert after any equal times: apply order among equal times does not matter
	// for aggregates, and a stable position keeps snapshots deterministic.
	j := len(e.raw)
	for j > 0 && e.raw[j-1].t > ts {
		j--
	}
	e.appendRaw(rawEvent{})
	copy(e.raw[j+1:], e.raw[j:])
	e.raw[j] = rawEvent{ts, a}
	return nil
}

// appendRaw appends ev, growing by one slot at a time while small, so that an
// entity with 3 events holds exactly 48 bytes of them (append's doubling would give
// it 64), then doubling.
func (e *entity) appendRaw(ev rawEvent) {
	if len(e.raw) == cap(e.raw) {
		c := len(e.raw) + 1
		if len(e.raw) >= 4 {
			c = 2 * len(e.raw)
		}
		e.reallocRaw(c)
	}
	e.raw = append(e.raw, ev)
}

// reallocRaw gives e.raw capacity c in a new allocation laid out as
//
//	[id length int64][id bytes, padded to 16][events …]
//
// so that the index can compare the id without touching the slab record and the
// event scan after it hits the same cache lines (see index). The id string points
// into the allocation (keeping it alive) and those bytes are never written again:
// the events slice starts after them.
func (e *entity) reallocRaw(c int) {
	idSlots := (8 + len(e.id) + 15) / 16
	buf := make([]rawEvent, idSlots+c)
	buf[0].t = int64(len(e.id))
	head := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0].a)), idSlots*16-8)
	copy(head, e.id)
	e.id = unsafe.String(&head[0], len(e.id))
	n := copy(buf[idSlots:], e.raw)
	e.raw = buf[idSlots : idSlots+n : idSlots+c]
}

// blob is the start of e's raw allocation, or nil when it has none.
func (e *entity) blob() unsafe.Pointer {
	if e.raw == nil {
		return nil
	}
	return unsafe.Add(unsafe.Pointer(unsafe.StringData(e.id)), -8)
}

// dropRaw releases the raw events; the id moves to an allocation of its own.
func (e *entity) dropRaw() {
	if e.raw != nil {
		e.id = strings.Clone(e.id)
		e.raw = nil
	}
}

// pruneRaw drops raw events that lie before every window of an event at newest;
// they can never be read again (older events read back at most to K−N+1).
func (t *Table) pruneRaw(e *entity, newest int64) {
	minLo := int64(math.MaxInt64)
	for i, b := range t.bms {
		minLo = min(minLo, (floorDiv(newest, b)-t.nbs[i]+1)*b)
	}
	pruneRawBelow(e, minLo)
}

func pruneRawBelow(e *entity, minLo int64) {
	j := 0
	for j < len(e.raw) && e.raw[j].t < minLo {
		j++
	}
	if j > 0 {
		// Shift down in place rather than reslicing, so the backing array is reused
		// and a steady entity stops allocating.
		n := copy(e.raw, e.raw[j:])
		e.raw = e.raw[:n]
	}
}

// toRings converts a raw entity to rings. The raw list holds every counted event
// still inside some window, so each window's ring is exactly rebuilt.
func (t *Table) toRings(e *entity) {
	rs := make([]ring, len(t.bms))
	for i, b := range t.bms {
		r := &rs[i]
		lo := floorDiv(e.newest, b) - t.nbs[i] + 1
		nb := 0
		last := int64(math.MinInt64)
		for _, ev := range e.raw {
			if k := floorDiv(ev.t, b); k >= lo && k != last {
				nb++
				last = k
			}
		}
		r.buf = make([]bucket, ringCap(nb+1))
		for _, ev := range e.raw {
			k := floorDiv(ev.t, b)
			if k < lo {
				continue
			}
			if r.n > 0 && r.buf[r.n-1].k == k {
				bk := &r.buf[r.n-1]
				bk.cnt++
				bk.sum += ev.a
				bk.min = min(bk.min, ev.a)
				bk.max = max(bk.max, ev.a)
			} else {
				r.buf[r.n] = bucket{k, 1, ev.a, ev.a, ev.a}
				r.n++
			}
		}
		r.recompute()
	}
	e.dropRaw()
	e.rings = &rs[0]
}

func ringCap(n int) int {
	c := 2
	for c < n {
		c *= 2
	}
	return c
}

// ---- ring representation ----

func (t *Table) rings(e *entity) []ring {
	return unsafeRings(e.rings, len(t.bms))
}

// recompute rebuilds the running totals from the buckets; used when the expiring
// bucket held the window's min or max, which running values cannot undo.
func (r *ring) recompute() {
	mask := len(r.buf) - 1
	r.cnt, r.sum, r.min, r.max = 0, 0, math.MaxInt64, math.MinInt64
	for j := range r.n {
		bk := &r.buf[(r.head+j)&mask]
		r.cnt += bk.cnt
		r.sum += bk.sum
		r.min = min(r.min, bk.min)
		r.max = max(r.max, bk.max)
	}
	if r.n == 0 {
		r.min, r.max = 0, 0
	}
}

func (r *ring) grow() {
	nb := make([]bucket, 2*len(r.buf))
	mask := len(r.buf) - 1
	for j := range r.n {
		nb[j] = r.buf[(r.head+j)&mask]
	}
	r.buf, r.head = nb, 0
}

func (t *Table) applyRings(e *entity, ts, a int64, out []Agg) error {
	rs := t.rings(e)
	// Amounts are non-negative, so every sum this call produces is at most the
	// window's running sum plus a: checking that once rules out overflow everywhere.
	// The exact check (after expiry) only runs when the quick one fails.
	for i := range rs {
		r := &rs[i]
		if r.sum <= math.MaxInt64-a && r.cnt < math.MaxInt64 {
			continue
		}
		sum, cnt := r.sum, r.cnt
		if ts >= e.newest {
			lo := floorDiv(ts, t.bms[i]) - t.nbs[i] + 1
			mask := len(r.buf) - 1
			for j := range r.n {
				bk := &r.buf[(r.head+j)&mask]
				if bk.k >= lo {
					break
				}
				sum -= bk.sum
				cnt -= bk.cnt
			}
		}
		if sum > math.MaxInt64-a || cnt == math.MaxInt64 {
			return fmt.Errorf("%w: entity %q window %s", ErrOverflow, e.id, t.specs[i].Name)
		}
	}
	if ts < e.newest {
		t.applyRingsOlder(rs, ts, a, out)
		return nil
	}
	for i := range rs {
		r := &rs[i]
		b := t.bms[i]
		mask := len(r.buf) - 1
		last := &r.buf[(r.head+r.n-1)&mask]
		if ts < (last.k+1)*b {
			// Fast path: same bucket as the newest event; no division, no expiry.
			last.cnt++
			last.sum += a
			last.min = min(last.min, a)
			last.max = max(last.max, a)
			r.cnt++
			r.sum += a
			r.min = min(r.min, a)
			r.max = max(r.max, a)
		} else {
			k := floorDiv(ts, b)
			lo := k - t.nbs[i] + 1
			stale := false
			for r.n > 0 && r.buf[r.head].k < lo {
				old := &r.buf[r.head]
				r.cnt -= old.cnt
				r.sum -= old.sum
				if old.min == r.min || old.max == r.max {
					stale = true
				}
				r.head = (r.head + 1) & mask
				r.n--
			}
			if r.n == len(r.buf) {
				r.grow()
				mask = len(r.buf) - 1
			}
			r.buf[(r.head+r.n)&mask] = bucket{k, 1, a, a, a}
			r.n++
			if stale {
				r.recompute()
			} else {
				r.cnt++
				r.sum += a
				r.min = min(r.min, a)
				r.max = max(r.max, a)
			}
		}
		out[i] = Agg{r.cnt, r.sum, r.min, r.max}
	}
	return nil
}

// applyRingsOlder places an older event in its own bucket (found by index, inserted
// in order if absent) and reads back the retained buckets up to it.
func (t *Table) applyRingsOlder(rs []ring, ts, a int64, out []Agg) {
	for i := range rs {
		r := &rs[i]
		k := floorDiv(ts, t.bms[i])
		mask := len(r.buf) - 1
		// j: position (0 = oldest) of the first bucket with index > k.
		j := r.n
		for j > 0 && r.buf[(r.head+j-1)&mask].k > k {
			j--
		}
		if j > 0 && r.buf[(r.head+j-1)&mask].k == k {
			bk := &r.buf[(r.head+j-1)&mask]
			bk.cnt++
			bk.sum += a
			bk.min = min(bk.min, a)
			bk.max = max(bk.max, a)
		} else {
			if r.n == len(r.buf) {
				r.grow()
				mask = len(r.buf) - 1
			}
			for p := r.n; p > j; p-- {
				r.buf[(r.head+p)&mask] = r.buf[(r.head+p-1)&mask]
			}
			r.buf[(r.head+j)&mask] = bucket{k, 1, a, a, a}
			r.n++
			j++
		}
		r.cnt++
		r.sum += a
		r.min = min(r.min, a)
		r.max = max(r.max, a)
		// Read back buckets k−N+1 … k among those retained (positions < j).
		lo := k - t.nbs[i] + 1
		o := Agg{Min: math.MaxInt64, Max: math.MinInt64}
		for p := j - 1; p >= 0; p-- {
			bk := &r.buf[(r.head+p)&mask]
			if bk.k < lo {
				break
			}
			o.Count += bk.cnt
			o.Sum += bk.sum
			o.Min = min(o.Min, bk.min)
			o.Max = max(o.Max, bk.max)
		}
		out[i] = o
	}
}

// ---- table maintenance ----

func (t *Table) create(name string) (slot, pos uint32) {
	if t.maxEntities > 0 && t.idx.n >= t.maxEntities {
		t.remove(t.lruTail - 1)
		t.capEvictions++
	}
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
		if t.snap != nil {
			t.snap.skip(slot) // free at BeginSnapshot, or kept when it was freed
		}
	} else {
		if len(t.slab) == cap(t.slab) {
			t.growSlab()
		}
		t.slab = t.slab[:len(t.slab)+1]
		slot = uint32(len(t.slab) - 1)
	}
	// name may alias the caller's reused decode buffer, so the caller must give the
	// entity its own copy before returning (appendRaw does, as part of storing the
	// first event); cloning here would allocate twice per new entity.
	t.slab[slot] = entity{id: name}
	pos = t.insert(name, slot)
	if t.maxEntities > 0 {
		t.lruPushFront(slot)
	}
	return slot, pos
}

// growSlab makes room for at least one more record, as append would; once the slab
// is large it grows by the same rule (about a quarter) through makeHuge, since records
// are read at random.
func (t *Table) growSlab() {
	c := cap(t.slab)
	if c*int(unsafe.Sizeof(entity{})) < hugeMin {
		t.slab = slices.Grow(t.slab, 1)
		return
	}
	s := makeHuge[entity](len(t.slab), c+(c+3*256)/4)
	copy(s, t.slab)
	t.slab = s
}

func (t *Table) remove(slot uint32) {
	if t.snap != nil {
		t.snap.keep(slot)
	}
	if t.evictHook != nil {
		t.evictHook(t.slab[slot].id, int(slot))
	}
	if t.maxEntities > 0 {
		t.lruUnlink(slot)
	}
	t.unindex(t.slab[slot].id, slot)
	t.slab[slot] = entity{}
	t.free = append(t.free, slot)
}

func (t *Table) lruUnlink(slot uint32) {
	l := &t.lru[slot]
	if l.prev != 0 {
		t.lru[l.prev-1].next = l.next
	} else {
		t.lruHead = l.next
	}
	if l.next != 0 {
		t.lru[l.next-1].prev = l.prev
	} else {
		t.lruTail = l.prev
	}
	*l = lruLinks{}
}

func (t *Table) lruPushFront(slot uint32) {
	for int(slot) >= len(t.lru) {
		t.lru = append(t.lru, lruLinks{})
	}
	t.seq++
	t.lru[slot] = lruLinks{next: t.lruHead, seq: t.seq}
	if t.lruHead != 0 {
		t.lru[t.lruHead-1].prev = slot + 1
	}
	t.lruHead = slot + 1
	if t.lruTail == 0 {
		t.lruTail = slot + 1
	}
}

// EvictIdle evicts entities all of whose windows are empty relative to watermark
// (the entity's newest bucket has left every window ending at the watermark's bucket)
// and whose newest event is older than watermark − HistoryTTL; it returns how many.
// Entities with empty windows but recent history are shrunk to a header.
//
// Both drop history that no event at or after watermark can see. An event older
// than watermark applied afterwards (--late=apply) may therefore miss old history of
// such an entity; callers that apply late events should pass a watermark lowered by
// how far back they accept them.
func (t *Table) EvictIdle(watermark int64) int {
	cutoff := int64(math.MinInt64)
	if watermark >= math.MinInt64+t.ttl { // else watermark − ttl would wrap
		cutoff = watermark - t.ttl
	}
	// One compare per entity instead of two divisions per window: a sweep visits
	// every entity of the partition, and nearly all of them are still active.
	empty := t.emptyBefore(watermark)
	evicted := 0
	for s := range t.slab {
		e := &t.slab[s]
		if e.newest >= empty || e.id == "" {
			continue
		}
		if e.newest < cutoff {
			t.remove(uint32(s))
			evicted++
			continue
		}
		if e.raw == nil && e.rings == nil {
			continue // a header already: nothing to drop (and no index probe to find it)
		}
		if t.snap != nil {
			t.snap.keep(uint32(s))
		}
		e.dropRaw()
		e.rings = nil
		t.setBlob(t.find(e.id, uint32(s)), e)
	}
	return evicted
}

// emptyBefore is the time before which an entity's newest event leaves every window
// ending at wm's bucket empty: for newest within ±maxTime (every counted event time),
// all windows are empty exactly when newest < emptyBefore(wm).
//
// Window i holds buckets floorDiv(wm, b)−N+1 … floorDiv(wm, b), so it is empty when
// floorDiv(newest, b) ≤ floorDiv(wm, b)−N, that is when newest < (floorDiv(wm, b)−N+1)·b,
// the start of its oldest bucket (for b > 0, floorDiv(x, b) ≤ k ⟺ x < (k+1)·b); all of
// them are empty below the smallest such start.
func (t *Table) emptyBefore(wm int64) int64 {
	if wm < -maxTime {
		// Below every counted time, so no window is empty (floorDiv(newest, b) ≥
		// floorDiv(wm, b) > floorDiv(wm, b)−N); clamping keeps the sums below in range.
		return math.MinInt64
	}
	lo := int64(math.MaxInt64)
	for i, b := range t.bms {
		k := floorDiv(wm, b) - t.nbs[i] + 1 // ≥ −2^62/b − MaxBuckets: no wrap
		start := int64(math.MinInt64)
		if k >= math.MinInt64/b { // else k·b is below every time anyway
			start = k * b // ≤ wm: no wrap upward
		}
		lo = min(lo, start)
	}
	return lo
}

// Range calls fn for every entity, in increasing id order, with its aggregates
// relative to its newest event (header-only entities report empty windows). aggs is
// reused between calls. Stops when fn returns false. For tests and comparisons: it
// sorts all ids, so it is not for the hot path.
func (t *Table) Range(fn func(entity string, last int64, aggs []Agg) bool) {
	slots := t.usedSlots()
	slices.SortFunc(slots, func(a, b uint32) int { return strings.Compare(t.slab[a].id, t.slab[b].id) })
	aggs := make([]Agg, len(t.specs))
	for _, s := range slots {
		e := &t.slab[s]
		t.current(e, aggs)
		if !fn(e.id, e.newest, aggs) {
			return
		}
	}
}

// current writes e's aggregates relative to its newest event into aggs.
func (t *Table) current(e *entity, aggs []Agg) {
	switch {
	case e.rings != nil:
		for i, r := range t.rings(e) {
			aggs[i] = Agg{r.cnt, r.sum, r.min, r.max}
		}
	default:
		for i, b := range t.bms {
			lo := (floorDiv(e.newest, b) - t.nbs[i] + 1) * b
			o := Agg{}
			for _, ev := range e.raw {
				if ev.t < lo {
					continue
				}
				if o.Count == 0 {
					o.Min, o.Max = ev.a, ev.a
				}
				o.Count++
				o.Sum += ev.a
				o.Min = min(o.Min, ev.a)
				o.Max = max(o.Max, ev.a)
			}
			aggs[i] = o
		}
	}
}

// usedSlots lists the occupied slab slots in slab order.
func (t *Table) usedSlots() []uint32 {
	slots := make([]uint32, 0, t.idx.n)
	for s := range t.slab {
		if t.slab[s].id != "" {
			slots = append(slots, uint32(s))
		}
	}
	return slots
}

// slotOf is the slot of id, or -1 (for tests).
func (t *Table) slotOf(id string) int {
	if s, _, ok := t.lookup(id); ok {
		return int(s)
	}
	return -1
}
