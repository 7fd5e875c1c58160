package repartition

import (
	"errors"
	"fmt"
	"math"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// ReasonLateAfterIdle is the dead-letter reason of an event that reached the second
// stage after the idle rule had released past its event time (Verdict LateAfterIdle)
// and could not be counted out of order: its bucket had left the entity's windows.
const ReasonLateAfterIdle codec.Reason = "late_after_idle"

// Verdict is what Offer did with a record.
type Verdict uint8

const (
	// Accepted: the event is pending and will be released in order.
	Accepted Verdict = iota
	// Duplicate: this (Source, Offset) was received before; nothing but the source's
	// watermark and liveness changed. Count it; it is not a new input.
	Duplicate
	// LateAfterIdle: new, but the frontier had passed its event time while its source
	// was idle. The caller counts it out of order, or dead-letters it
	// (ReasonLateAfterIdle) when it cannot; a re-send of it is
	// a Duplicate.
	LateAfterIdle
	// Marked: a marker, applied.
	Marked
	// StaleIdle: an idle marker from an owner epoch older than the newest seen from
	// that source: its watermark was applied, its idle flag ignored.
	StaleIdle
)

func (v Verdict) String() string {
	switch v {
	case Accepted:
		return "accepted"
	case Duplicate:
		return "duplicate"
	case LateAfterIdle:
		return "late_after_idle"
	case Marked:
		return "marked"
	case StaleIdle:
		return "stale_idle"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// Errors of Offer: the record breaks the Merger's configuration or the hop's rules;
// nothing changed.
var (
	ErrUnknownSource = errors.New("repartition: source partition not below the configured source count")
	ErrExtLen        = errors.New("repartition: event has a different number of feature words than configured")
)

// Config sizes a Merger. Both fields are part of the snapshot and must match on Restore.
type Config struct {
	// Sources is the number of source partitions: the input topic's partition count,
	// known up front. A source not heard from yet holds every event back.
	Sources int
	// ExtWords is len(Event.Ext) of every event of this group (0 without features
	// that need words), at most MaxExtWords.
	ExtWords int
}

// MaxSources bounds Config.Sources (Kafka topics have far fewer partitions).
const MaxSources = 1 << 16

func (c Config) validate() error {
	if c.Sources < 1 || c.Sources > MaxSources {
		return fmt.Errorf("repartition: %d sources; want 1..%d (the input topic's partition count)", c.Sources, MaxSources)
	}
	if c.ExtWords < 0 || c.ExtWords > MaxExtWords {
		return fmt.Errorf("repartition: %d feature words; want 0..%d", c.ExtWords, MaxExtWords)
	}
	return nil
}

// Stats counts what Offer and Ready did since New or Restore (not snapshotted: they
// are the process's metrics).
type Stats struct {
	Accepted, Duplicates, LateAfterIdle, Released, Markers, StaleIdle uint64
	// Expired counts idle declarations whose lease ran out before their source
	// renewed them: the source counts in the order again (a lost owner, or one
	// whose renewals came late).
	Expired uint64
}

// NoClock is the Merger's clock before it has seen a record timestamp.
const NoClock = math.MinInt64

// noLease is a source's lease end when its idle declaration holds until the source
// sends anything else (or when it is not idle).
const noLease = math.MaxInt64

// Merger is one repartition partition's second stage: see the package documentation.
type Merger struct {
	n     int // ExtWords
	src   []source
	F     int64 // released frontier: every event below it was released (or is waiting in Ready)
	dirty bool  // F rose since the last Ready
	// minWM is the minimum watermark of the non-idle sources as advance last computed
	// it (math.MaxInt64 with none). Raising a watermark that was above it cannot change
	// it, so Offer skips the O(sources) recomputation in that, the common, case.
	minWM int64
	// clock is the largest record timestamp (Record.LogTime) seen, NoClock before
	// any: the repartition partition's own time, which re-reading it gives again.
	clock int64
	// expiry is at most the earliest lease end of the idle sources (noLease with
	// none), so Offer scans the sources for an expired lease only when the clock
	// passes it.
	expiry  int64
	pending int
	stats   Stats
	outExt  []uint64 // Ext of the events the last Ready returned
}

// source is what the Merger keeps per source partition.
//
// Its pending events are in two sorted queues. A source hops its events when it
// accepts them, in arrival order, which is event-time order but for the events that
// came late within the allowed lateness: q takes the events that arrive after its
// tail (an append), lq those that arrive behind it. One sorted queue made each of the
// latter move every pending event after its place, which with a live input's event
// times (thousands of events per second of lateness) cost more than all the rest of
// the merge (BenchmarkMergerDisorder). lq holds only the late ones, so its inserts
// are short. The source's pending sequence is the merge of the two.
//
// Invariants (checked by Restore, kept by Offer and Ready):
//   - q[qh:] and lq[lh:] are each strictly increasing in (t, off), and share no
//     (t, off); ext[i*n:(i+1)*n] are q[i]'s words and lext[i*n:(i+1)*n] lq[i]'s;
//   - every event of lq[lh:] is before q's tail (q[len(q)-1]), so lq is empty when
//     q[qh:] is (an event goes to lq only behind a pending q event, and the two are
//     released in order);
//   - an event is accepted only with t >= F, so the queues hold events below F only
//     between an Offer that raised F and the next Ready (dirty is then set);
//   - rel[rh:] is strictly increasing in (t, off) and every entry has wm <= t < F;
//   - an idle source's lease is noLease or at least the Merger's clock (a lease
//     the clock passed has ended the declaration), and a source that is not idle
//     has lease noLease.
type source struct {
	wm    int64 // largest watermark received, NoWatermark before any
	epoch uint64
	idle  bool
	// lease is the clock value up to which an idle declaration holds (noLease:
	// until the source sends anything else; always noLease when not idle).
	lease int64
	q     []entry
	qh    int
	ext   []uint64
	lq    []entry
	lh    int
	lext  []uint64
	rel   []relKey
	rh    int
}

// pending is how many events the source holds.
func (s *source) pending() int { return len(s.q) - s.qh + len(s.lq) - s.lh }

// head returns the source's first pending event and whether it is lq's (nil when
// none).
func (s *source) head() (*entry, bool) {
	if s.qh == len(s.q) {
		return nil, false // lq is empty too
	}
	e := &s.q[s.qh]
	if s.lh < len(s.lq) {
		if l := &s.lq[s.lh]; less(l.t, l.off, e.t, e.off) {
			return l, true
		}
	}
	return e, false
}

// each calls f with every pending event of the source and its words, in (t, off)
// order.
func (s *source) each(n int, f func(e *entry, ext []uint64)) {
	i, j := s.qh, s.lh
	for i < len(s.q) || j < len(s.lq) {
		if j < len(s.lq) && (i == len(s.q) || less(s.lq[j].t, s.lq[j].off, s.q[i].t, s.q[i].off)) {
			f(&s.lq[j], s.lext[j*n:(j+1)*n])
			j++
		} else {
			f(&s.q[i], s.ext[i*n:(i+1)*n])
			i++
		}
	}
}

type entry struct {
	t, off, amount int64
	topic, key, id string
}

type relKey struct{ t, off int64 }

func less(t1, o1, t2, o2 int64) bool { return t1 < t2 || (t1 == t2 && o1 < o2) }

// New returns an empty Merger: every source holds the frontier at NoWatermark until it
// sends its first record.
func New(cfg Config) (*Merger, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Merger{n: cfg.ExtWords, src: make([]source, cfg.Sources), F: NoWatermark, minWM: NoWatermark, clock: NoClock, expiry: noLease}
	for i := range m.src {
		m.src[i].wm = NoWatermark
		m.src[i].lease = noLease
	}
	return m, nil
}

// Offer applies one hop record. For an event it decides by the rules of the package
// documentation (Accepted, Duplicate or LateAfterIdle); for a marker it returns
// Marked or StaleIdle. Every record, duplicates included, raises its source's
// watermark to at least its Watermark and ends its source's idleness (an idle marker
// from the newest epoch starts it, or renews it). An error means the record breaks
// the configuration or the hop's rules, and nothing changed. The event's strings are
// kept by reference until it is released; its Ext words are copied.
//
// Before the record is applied, its LogTime advances the clock, and an idle
// declaration whose lease the clock has passed ends: its source counts in the order
// again with its watermark, as if it had sent a marker that is not idle.
func (m *Merger) Offer(r *Record) (Verdict, error) {
	if r.Source < 0 || int(r.Source) >= len(m.src) {
		return 0, ErrUnknownSource
	}
	if r.Kind == KindEvent {
		if err := checkEvent(r); err != nil {
			return 0, err
		}
		if len(r.Ext) != m.n {
			return 0, ErrExtLen
		}
	} else if r.Kind != KindMarker {
		return 0, ErrKind
	} else if r.Lease < 0 || r.Lease > MaxLease || r.Lease != 0 && !r.Idle {
		return 0, ErrLease
	}
	m.observe(r.LogTime)
	s := &m.src[r.Source]
	oldWM, oldIdle := s.wm, s.idle
	var v Verdict
	if r.Kind == KindEvent {
		v = m.classify(s, r)
		s.idle, s.lease = false, noLease
	} else {
		v = Marked
		switch {
		case !r.Idle:
			s.idle, s.lease = false, noLease
		case r.Epoch >= s.epoch:
			s.idle, s.lease = true, noLease
			if r.Lease > 0 && m.clock != NoClock {
				// The lease runs on the clock from this record on; a renewal
				// replaces it. noLease is reserved, hence the cap.
				s.lease = m.clock + min(r.Lease, noLease-1-m.clock)
				m.expiry = min(m.expiry, s.lease)
			}
		default:
			v = StaleIdle
		}
		m.stats.Markers++
		if v == StaleIdle {
			m.stats.StaleIdle++
		}
	}
	s.epoch = max(s.epoch, r.Epoch)
	if r.Watermark > s.wm {
		s.wm = r.Watermark
		s.prune()
	}
	if s.idle != oldIdle || s.wm != oldWM && oldWM <= m.minWM {
		m.advance()
	}
	return v, nil
}

// observe advances the clock to t (a record timestamp; none when t <= 0) and ends
// every idle declaration whose lease it has passed.
func (m *Merger) observe(t int64) {
	if t <= 0 || t <= m.clock {
		return
	}
	m.clock = t
	if t <= m.expiry {
		return
	}
	next, ended := int64(noLease), false
	for i := range m.src {
		s := &m.src[i]
		if !s.idle || s.lease == noLease {
			continue
		}
		if s.lease < t {
			s.idle, s.lease = false, noLease
			m.stats.Expired++
			ended = true
			continue
		}
		next = min(next, s.lease)
	}
	m.expiry = next
	if ended {
		m.advance()
	}
}

// classify decides an event and, if it is new, records it (pending, or counted late).
func (m *Merger) classify(s *source, r *Record) Verdict {
	t, off := r.EventTime, r.Offset
	if t < s.wm { // rule 1: its source promised nothing below wm after sending it
		m.stats.Duplicates++
		return Duplicate
	}
	tail := s.qh == len(s.q) || less(s.q[len(s.q)-1].t, s.q[len(s.q)-1].off, t, off)
	var i int
	if !tail { // rule 2: still pending (after q's tail nothing is: lq is before it)
		var found bool
		if _, found = search(s.q, s.qh, t, off); !found {
			i, found = search(s.lq, s.lh, t, off)
		}
		if found {
			m.stats.Duplicates++
			return Duplicate
		}
	}
	if t < m.F { // rule 3: released or dead-lettered at or above wm, or late
		j, found := s.findRel(t, off)
		if found {
			m.stats.Duplicates++
			return Duplicate
		}
		s.insertRel(j, relKey{t, off})
		m.stats.LateAfterIdle++
		return LateAfterIdle
	}
	e := entry{t: t, off: off, amount: r.Amount, topic: r.Topic, key: r.Key, id: r.EventID}
	if tail {
		s.q = append(s.q, e)
		s.ext = append(s.ext, r.Ext...)
	} else {
		s.lq, s.lext = insert(s.lq, s.lext, i, m.n, e, r.Ext)
	}
	m.pending++
	m.stats.Accepted++
	return Accepted
}

// search returns where (t, off) is or would go in the sorted q[h:] (an absolute
// index), and whether it is there.
func search(q []entry, h int, t, off int64) (int, bool) {
	lo, hi := h, len(q)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if e := &q[mid]; less(e.t, e.off, t, off) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, lo < len(q) && q[lo].t == t && q[lo].off == off
}

// insert puts e and its n words at index i of q and ext.
func insert(q []entry, ext []uint64, i, n int, e entry, words []uint64) ([]entry, []uint64) {
	q = append(q, entry{})
	copy(q[i+1:], q[i:])
	q[i] = e
	if n > 0 {
		ext = append(ext, words...) // grow by n words
		copy(ext[(i+1)*n:], ext[i*n:])
		copy(ext[i*n:(i+1)*n], words)
	}
	return q, ext
}

func (s *source) findRel(t, off int64) (int, bool) {
	if s.rh == len(s.rel) || less(s.rel[len(s.rel)-1].t, s.rel[len(s.rel)-1].off, t, off) {
		return len(s.rel), false
	}
	lo, hi := s.rh, len(s.rel)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if k := s.rel[mid]; less(k.t, k.off, t, off) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	k := s.rel[lo]
	return lo, k.t == t && k.off == off
}

func (s *source) insertRel(i int, k relKey) {
	s.rel = append(s.rel, relKey{})
	copy(s.rel[i+1:], s.rel[i:])
	s.rel[i] = k
}

// prune drops the counted-at-or-above-watermark keys that the watermark now covers.
func (s *source) prune() {
	for s.rh < len(s.rel) && s.rel[s.rh].t < s.wm {
		s.rh++
	}
	if s.rh == len(s.rel) {
		s.rel, s.rh = s.rel[:0], 0
	} else if s.rh >= 64 && 2*s.rh >= len(s.rel) {
		s.rel = s.rel[:copy(s.rel, s.rel[s.rh:])]
		s.rh = 0
	}
}

// advance raises F to the minimum watermark of the non-idle sources; with every source
// idle, to just past the newest pending event, so that all of them are released.
func (m *Merger) advance() {
	cand, active := m.activeMin()
	m.minWM = cand
	if !active {
		if m.pending == 0 {
			return
		}
		newest := int64(math.MinInt64)
		for i := range m.src {
			if s := &m.src[i]; s.qh < len(s.q) {
				newest = max(newest, s.q[len(s.q)-1].t) // lq is before q's tail
			}
		}
		cand = newest + 1 // event times are at most MaxEventTime: no overflow
	}
	if cand > m.F {
		m.F = cand
		m.dirty = true
	}
}

// activeMin returns the minimum watermark of the non-idle sources (math.MaxInt64 and
// false with none).
func (m *Merger) activeMin() (int64, bool) {
	cand, active := int64(math.MaxInt64), false
	for i := range m.src {
		if s := &m.src[i]; !s.idle {
			active = true
			cand = min(cand, s.wm)
		}
	}
	return cand, active
}

// Ready appends to dst, in (EventTime, Source, Offset) order, every pending event
// below the frontier, and returns dst. The events' Ext slices point into a buffer of
// the Merger that the next Ready reuses: copy them to keep them. It does not allocate
// once its buffers have grown to the largest release.
func (m *Merger) Ready(dst []Event) []Event {
	if !m.dirty {
		return dst
	}
	m.dirty = false
	start := len(dst)
	m.outExt = m.outExt[:0]
	n := m.n
	for {
		// Find the source whose head comes first, and the runner-up's head: the best
		// source's events are then released without another scan until its head
		// passes the runner-up's (a source that ran ahead releases in one go).
		best, second := -1, -1
		var bt, st int64
		for i := range m.src {
			h, _ := m.src[i].head()
			if h == nil {
				continue
			}
			t := h.t
			if t >= m.F {
				continue
			}
			// Sources are scanned in index order, so a tie in t goes to the lower source.
			switch {
			case best < 0 || t < bt:
				second, st = best, bt
				best, bt = i, t
			case second < 0 || t < st:
				second, st = i, t
			}
		}
		if best < 0 {
			break
		}
		s := &m.src[best]
		for {
			e, late := s.head()
			if e == nil || e.t >= m.F || second >= 0 && (e.t > st || e.t == st && second < best) {
				break
			}
			dst = append(dst, Event{Source: int32(best), Offset: e.off, EventTime: e.t, Topic: e.topic, Key: e.key, EventID: e.id, Amount: e.amount})
			if late {
				m.outExt = append(m.outExt, s.lext[s.lh*n:(s.lh+1)*n]...)
			} else {
				m.outExt = append(m.outExt, s.ext[s.qh*n:(s.qh+1)*n]...)
			}
			if e.t >= s.wm {
				// Released at or above its own source's watermark (the idle rule did it):
				// remember it until the watermark passes it. Release order within one
				// source is (t, off) ascending, so this appends unless a late key sits above.
				j, _ := s.findRel(e.t, e.off)
				s.insertRel(j, relKey{e.t, e.off})
			}
			*e = entry{} // let the strings go
			if late {
				s.lh++
			} else {
				s.qh++
			}
			m.pending--
		}
		s.compact(n)
	}
	if n > 0 {
		for i := start; i < len(dst); i++ {
			k := i - start
			dst[i].Ext = m.outExt[k*n : (k+1)*n : (k+1)*n]
		}
	}
	m.stats.Released += uint64(len(dst) - start)
	return dst
}

// compact keeps the queues' popped prefixes from growing without bound.
func (s *source) compact(n int) {
	s.q, s.ext, s.qh = compactQueue(s.q, s.ext, s.qh, n)
	s.lq, s.lext, s.lh = compactQueue(s.lq, s.lext, s.lh, n)
}

// compactQueue drops q[:h] (and its words): empty, the queue restarts at zero;
// otherwise it is moved down once the popped part is at least half of it.
func compactQueue(q []entry, ext []uint64, h, n int) ([]entry, []uint64, int) {
	if h == len(q) {
		return q[:0], ext[:0], 0
	}
	if h >= 256 && 2*h >= len(q) {
		k := copy(q, q[h:])
		clear(q[k:])
		return q[:k], ext[:copy(ext, ext[h*n:])], 0
	}
	return q, ext, h
}

// Frontier returns F: every event below it has been released or is returned by the
// next Ready; NoWatermark before every source has sent a watermark.
func (m *Merger) Frontier() int64 { return m.F }

// Pending returns how many events wait for the frontier.
func (m *Merger) Pending() int { return m.pending }

// Sources returns the configured source count.
func (m *Merger) Sources() int { return len(m.src) }

// Watermark returns the largest watermark received from source p and whether p is
// currently left out of the frontier as idle.
func (m *Merger) Watermark(p int) (wm int64, idle bool) { return m.src[p].wm, m.src[p].idle }

// Lease returns the clock value up to which source p's idle declaration holds, and
// false when p is not idle or its declaration has no lease.
func (m *Merger) Lease(p int) (int64, bool) {
	s := &m.src[p]
	return s.lease, s.idle && s.lease != noLease
}

// Clock returns the largest record timestamp seen (NoClock before any).
func (m *Merger) Clock() int64 { return m.clock }

// Stats returns the counters.
func (m *Merger) Stats() Stats { return m.stats }
