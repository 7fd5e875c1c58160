package watermark

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/velocity-consumer/velocity-consumer/internal/prefetch"
)

// Event is one record as the stage sees it. Only Offset, EventTime, EventID and Size are
// read; the other fields travel with the event and through snapshots unchanged.
type Event struct {
	Offset    int64 // position in the partition; ties in EventTime break by Offset
	EventTime int64 // Unix milliseconds
	EventID   string
	EntityID  string
	Amount    int64
	Size      int32 // bytes charged against the byte bounds (the record's size); negative counts as 0
	Aux       int64 // opaque to this package (the pipeline stores arrival time), kept in snapshots
	// Ext is opaque to this package too (a feature definition's filter bits and
	// distinct hashes, codec.Transaction.Ext), kept in snapshots; at most 255 words.
	// The stage keeps the slice, not a copy: the caller must not reuse its array.
	Ext []uint64
}

// Defaults applied by New for zero Config fields.
const (
	DefaultDedupeHorizon int64 = 24 * 60 * 60 * 1000 // 24 h in ms
	DefaultHighEvents          = 100000
	DefaultHighBytes     int64 = 64 << 20
)

// Config configures a Stage. The zero value is valid: no lateness, 24 h dedupe, no idle
// release, default backpressure marks.
type Config struct {
	// AllowedLateness in ms, >= 0: wm = maxSeen − AllowedLateness.
	AllowedLateness int64
	// DedupeHorizon in ms; 0 = DefaultDedupeHorizon (24 h), or AllowedLateness if that is
	// longer. An id is remembered until
	// maxSeen − DedupeHorizon passes its event time. Must be >= AllowedLateness, or the
	// resend of an event still waiting in the buffer could be accepted a second time.
	DedupeHorizon int64
	// DisableDedupe turns duplicate detection off (Offer never returns Duplicate and
	// Remember does nothing): for callers that deduplicate upstream, and for measuring.
	DisableDedupe bool
	// MaxDedupeIDs caps the ids remembered for dedupe (0 = no cap). The set holds
	// every id accepted within DedupeHorizon, so it grows with rate × horizon; past
	// the cap the oldest accepted ids are forgotten first, and a duplicate of a
	// forgotten id is accepted as new. Deterministic: the same input and Config
	// forget the same ids, live or in a replay. DedupeCapEvictions counts them.
	MaxDedupeIDs int
	// IdleTimeout: 0 = never idle-release. See Stage.Idle.
	IdleTimeout time.Duration
	// Now is the clock behind IdleTimeout; nil = time.Now. It is read only when
	// IdleTimeout > 0.
	Now func() time.Time
	// HighEvents, LowEvents are the backpressure marks on the pending count.
	// 0 = DefaultHighEvents (100000) and HighEvents/2 (50000 by default).
	HighEvents, LowEvents int
	// HighBytes, LowBytes are the marks on pending bytes (sum of Event.Size).
	// 0 = DefaultHighBytes (64 MiB) and HighBytes/2 (32 MiB by default).
	HighBytes, LowBytes int64
	// Segments, when set, makes BeginSnapshot keep the dedupe ids in segments
	// written once each (see segments.go) instead of in every snapshot, and is
	// where Restore reads a segmented snapshot's ids from.
	Segments SegmentStore
	// MaxMergeBytes caps the size of a segment made by merging others (see
	// segments.go); 0 = DefaultMaxMergeBytes. A merge rewrites all the ids it
	// covers at one checkpoint, so the cap bounds that burst; the price is
	// more segments per snapshot (about the id set's size / the cap).
	MaxMergeBytes int
}

// DefaultMaxMergeBytes is the default Config.MaxMergeBytes: 16 MiB, about
// 700 000 ids.
const DefaultMaxMergeBytes = 16 << 20

// Verdict is what Offer decided about an event.
type Verdict uint8

const (
	Accepted  Verdict = iota // remembered for dedupe, waiting in the buffer (or releasable)
	Duplicate                // id already accepted within the dedupe horizon; nothing changed
	Late                     // EventTime < watermark; nothing changed
)

func (v Verdict) String() string {
	switch v {
	case Accepted:
		return "accepted"
	case Duplicate:
		return "duplicate"
	case Late:
		return "late"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// Stage is one partition's watermark, reorder buffer and dedupe set. See the package
// documentation. Not safe for concurrent use.
type Stage struct {
	lateness    int64
	horizon     int64
	dedupe      bool
	idleTimeout time.Duration
	now         func() time.Time
	highEvents  int
	lowEvents   int
	highBytes   int64
	lowBytes    int64

	maxSeen int64
	hasMax  bool

	// Reorder buffer: a sorted run (FIFO) plus a heap. An arrival at or after the run's
	// tail in (t, off) order joins the run in O(1); only out-of-order arrivals pay the
	// heap's O(log n). Both are ordered by (t, off, seq), so release is a two-way merge.
	run  eventRing
	heap []item  // min-heap by (t, off, seq); events live in slab
	slab []Event // slab[item.slot]; freed slots are zeroed so strings can be collected
	free []int32
	seq  uint64 // arrival number of the next accepted event

	pendingBytes int64
	pressure     bool

	ids  idTable // hashed event id -> event time of its latest acceptance
	ring idRing  // acceptance order, for expiry
	// superseded is set once Remember replaced a still-live entry of an id, so
	// the ring may hold two live entries for it and AppendSnapshot must look
	// each entry up in ids. Otherwise a ring entry is current exactly when it is
	// live, and the snapshot skips that probe: one cache miss per id, which at
	// millions of ids stalled the partition for hundreds of milliseconds.
	superseded bool
	maxIDs     int    // Config.MaxDedupeIDs; 0 = no cap
	capEvicted uint64 // ids forgotten because of maxIDs

	lastOffer time.Time
	clock     time.Time // set by SetClock; zero = read now
	scratch   []item    // reused by AppendSnapshot

	// Segmented snapshots (segments.go).
	segments   SegmentStore
	segSaved   []segment // the list of the newest saved snapshot
	segRestart bool      // segSaved came with a restore: start a new list
	segGarbage [][]byte  // dropped by the newest saved snapshot: deletable after the next save
	segBuf     []byte    // reused for the blob of a new segment
	maxMerge   uint64    // Config.MaxMergeBytes in ids
}

// New returns an empty Stage, or an error naming the first invalid Config field.
func New(cfg Config) (*Stage, error) {
	if cfg.AllowedLateness < 0 {
		return nil, fmt.Errorf("watermark: allowed lateness %d ms is negative; use 0 for none", cfg.AllowedLateness)
	}
	if cfg.DedupeHorizon < 0 {
		return nil, fmt.Errorf("watermark: dedupe horizon %d ms is negative; use 0 for the 24h default", cfg.DedupeHorizon)
	}
	if cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("watermark: idle timeout %v is negative; use 0 to disable idle release", cfg.IdleTimeout)
	}
	if cfg.MaxDedupeIDs < 0 {
		return nil, fmt.Errorf("watermark: max dedupe ids %d is negative; use 0 for no cap", cfg.MaxDedupeIDs)
	}
	if cfg.MaxMergeBytes < 0 {
		return nil, fmt.Errorf("watermark: max merge bytes %d is negative; use 0 for the default %d", cfg.MaxMergeBytes, DefaultMaxMergeBytes)
	}
	s := &Stage{
		lateness:    cfg.AllowedLateness,
		horizon:     cfg.DedupeHorizon,
		dedupe:      !cfg.DisableDedupe,
		idleTimeout: cfg.IdleTimeout,
		now:         cfg.Now,
		highEvents:  cfg.HighEvents,
		lowEvents:   cfg.LowEvents,
		highBytes:   cfg.HighBytes,
		lowBytes:    cfg.LowBytes,
		segments:    cfg.Segments,
		maxMerge:    uint64(cmp.Or(cfg.MaxMergeBytes, DefaultMaxMergeBytes) / idEntryLen),
		maxIDs:      cfg.MaxDedupeIDs,
	}
	if s.horizon == 0 {
		s.horizon = max(DefaultDedupeHorizon, s.lateness)
	}
	if s.dedupe && s.horizon < s.lateness {
		return nil, fmt.Errorf("watermark: dedupe horizon %d ms is shorter than the allowed lateness %d ms; "+
			"a resend of a pending event could be accepted twice, so raise the horizon", s.horizon, s.lateness)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.highEvents == 0 {
		s.highEvents = DefaultHighEvents
	}
	if s.lowEvents == 0 {
		s.lowEvents = s.highEvents / 2
	}
	if s.highBytes == 0 {
		s.highBytes = DefaultHighBytes
	}
	if s.lowBytes == 0 {
		s.lowBytes = s.highBytes / 2
	}
	if s.highEvents < 0 || s.lowEvents < 0 || s.lowEvents > s.highEvents {
		return nil, fmt.Errorf("watermark: event marks low %d / high %d must satisfy 0 <= low <= high", s.lowEvents, s.highEvents)
	}
	if s.highBytes < 0 || s.lowBytes < 0 || s.lowBytes > s.highBytes {
		return nil, fmt.Errorf("watermark: byte marks low %d / high %d must satisfy 0 <= low <= high", s.lowBytes, s.highBytes)
	}
	if s.idleTimeout > 0 {
		// Creation counts as activity: a fresh or restored stage waits a full timeout.
		s.lastOffer = s.now()
	}
	return s, nil
}

// satSub returns a − b for b >= 0, clamped at math.MinInt64 rather than wrapping, so
// that an absurd event time cannot turn the watermark into a huge positive number.
func satSub(a, b int64) int64 {
	if a < math.MinInt64+b {
		return math.MinInt64
	}
	return a - b
}

func eventBytes(ev *Event) int64 {
	if ev.Size < 0 {
		return 0
	}
	return int64(ev.Size)
}

// Watermark returns maxSeen − AllowedLateness; ok is false before any accepted event.
func (s *Stage) Watermark() (wm int64, ok bool) {
	if !s.hasMax {
		return 0, false
	}
	return satSub(s.maxSeen, s.lateness), true
}

// MaxSeen returns the largest event time accepted so far; ok is false before any.
func (s *Stage) MaxSeen() (int64, bool) { return s.maxSeen, s.hasMax }

// Pending returns how many accepted events wait to be released.
func (s *Stage) Pending() int { return s.run.n + len(s.heap) }

// PendingBytes returns the sum of Size over the pending events.
func (s *Stage) PendingBytes() int64 { return s.pendingBytes }

// Pressure reports whether the caller should stop feeding this stage: it becomes true
// once Pending() > HighEvents or PendingBytes() > HighBytes, and false again only once
// Pending() < LowEvents and PendingBytes() < LowBytes. The gap between the marks keeps a
// paused partition from flapping on every event.
func (s *Stage) Pressure() bool { return s.pressure }

func (s *Stage) updatePressure() {
	n := s.Pending()
	if s.pressure {
		if n < s.lowEvents && s.pendingBytes < s.lowBytes {
			s.pressure = false
		}
	} else if n > s.highEvents || s.pendingBytes > s.highBytes {
		s.pressure = true
	}
}

// Offer classifies ev in the contract's order (duplicate, then late). Accepted events are
// remembered for dedupe, move maxSeen, and wait in the buffer until Ready releases them.
// Duplicate and Late events change nothing, except that any Offer counts as activity for
// the idle timeout: the partition did deliver something.
func (s *Stage) Offer(ev Event) Verdict {
	v := s.admit(&ev)
	if v == Accepted {
		s.enqueue(&ev)
	}
	return v
}

// OfferNow is Offer for a caller that counts released events as it gets them. When
// ev is accepted, nothing is pending and ev is at or below the watermark (so every
// in-order event without allowed lateness), the Ready that would follow would
// return exactly ev: OfferNow then leaves it out of the buffer and returns now =
// true, and the caller takes ev as released. Otherwise it is Offer (now = false:
// accepted events wait for Ready). Either way the Stage ends in the same state as
// after Offer and Ready, so outputs and snapshots do not depend on which is used;
// it saves copying the event into the buffer and out again.
func (s *Stage) OfferNow(ev *Event) (v Verdict, now bool) {
	return s.offerNow(ev, false)
}

// OfferNowBorrowed is OfferNow for an event whose EventID and EntityID are valid
// only during the call (they point into the caller's input record, see
// codec.BorrowingDecoder): an event released at once is not kept, and one that
// waits in the buffer first gets ids of its own, one string holding both.
func (s *Stage) OfferNowBorrowed(ev *Event) (v Verdict, now bool) {
	return s.offerNow(ev, true)
}

func (s *Stage) offerNow(ev *Event, borrowed bool) (v Verdict, now bool) {
	if v = s.admit(ev); v != Accepted {
		return v, false
	}
	if s.run.n == 0 && len(s.heap) == 0 && ev.EventTime <= satSub(s.maxSeen, s.lateness) {
		// As enqueue, so that arrival numbers stay those of Offer. Pressure is left
		// as it is: the last call of updatePressure (release's, Restore's) already
		// saw the buffer empty, which is what release would show it again.
		s.seq++
		return Accepted, true
	}
	if borrowed {
		ids := ev.EventID + ev.EntityID
		ev.EventID, ev.EntityID = ids[:len(ev.EventID)], ids[len(ev.EventID):]
	}
	s.enqueue(ev)
	return Accepted, false
}

// admit is Offer without the buffering: the dedupe and lateness decisions, the id
// remembered and maxSeen moved for an accepted event.
func (s *Stage) admit(ev *Event) Verdict {
	if s.idleTimeout > 0 {
		s.lastOffer = s.current()
	}
	var (
		k     idKey
		sh    *idShard
		slot  int
		found bool
	)
	if s.dedupe {
		k = hashID(ev.EventID)
		sh = s.ids.shard(k)
		sh.reserve()
		var t0 int64
		slot, t0, found = sh.find(k, &s.ring)
		if found && s.live(t0) {
			return Duplicate
		}
	}
	if s.hasMax && ev.EventTime < satSub(s.maxSeen, s.lateness) {
		return Late
	}
	if s.dedupe {
		// Not live (checked above), so this is a first acceptance or a re-acceptance
		// after expiry; either way the new time is the one to remember. It is stored
		// before expire runs, because expire may shift slots; it survives expire since
		// its time is >= wm >= maxSeen − horizon (horizon >= lateness).
		s.pushID(sh, slot, found, k, ev.EventTime)
		if s.maxIDs > 0 && s.ring.n > s.maxIDs {
			s.capIDs()
		}
	}
	if !s.hasMax || ev.EventTime > s.maxSeen {
		s.maxSeen = ev.EventTime
		s.hasMax = true
		if s.dedupe {
			s.expire()
		}
	}
	return Accepted
}

func (s *Stage) enqueue(ev *Event) {
	if s.inOrder(ev) {
		s.run.push(queued{ev: *ev, seq: s.seq})
	} else {
		s.push(ev, s.seq)
	}
	s.seq++
	s.pendingBytes += eventBytes(ev)
	if s.pendingBytes > s.highBytes || s.Pending() > s.highEvents || s.pressure {
		s.updatePressure()
	}
}

// inOrder reports whether ev can go at the tail of the sorted run.
func (s *Stage) inOrder(ev *Event) bool {
	if s.run.n == 0 {
		return true
	}
	last := &s.run.back().ev
	// An equal (t, off) arrived later, so it belongs after: >= keeps arrival order.
	return ev.EventTime > last.EventTime || ev.EventTime == last.EventTime && ev.Offset >= last.Offset
}

// PrefetchID starts loading the dedupe slot that Offer will probe for eventID, so that
// a caller that knows its next records can overlap that cache miss (the set holds
// millions of ids at the default horizon) with the work on the records before. A hint:
// it changes nothing and never fails.
func (s *Stage) PrefetchID(eventID []byte) {
	if !s.dedupe {
		return
	}
	h := xxh3.Hash128(eventID)
	sh := &s.ids.shards[h.Hi>>58]
	if len(sh.slots) == 0 {
		return
	}
	home := int(fpOf(idKey{hi: h.Hi, lo: h.Lo})) & (len(sh.slots) - 1)
	prefetch.Line(uintptr(unsafe.Pointer(&sh.slots[home])))
}

// Upcoming returns the entity of the event i places behind the next one Ready would
// release, if the in-order run holds one there: a hint of which entities will be
// counted soon, for prefetching. Out-of-order events waiting in the heap are not
// looked at, so near one it may name an entity a little early or late; it never
// changes anything.
func (s *Stage) Upcoming(i int) (entity string, ok bool) {
	if i < 0 || i >= s.run.n {
		return "", false
	}
	return s.run.at(i).ev.EntityID, true
}

// Remember records eventID as accepted at eventTime without buffering anything: a late
// event that was applied anyway (--late=apply) must count as accepted for dedupe. It does
// not move maxSeen. An id already remembered keeps the later of the two times; a time
// already outside the horizon is not stored, since a lookup would ignore it.
func (s *Stage) Remember(eventID string, eventTime int64) {
	if !s.dedupe {
		return
	}
	if s.hasMax && eventTime < satSub(s.maxSeen, s.horizon) {
		return
	}
	k := hashID(eventID)
	sh := s.ids.shard(k)
	sh.reserve()
	slot, t0, ok := sh.find(k, &s.ring)
	if ok && s.live(t0) {
		if t0 >= eventTime {
			return
		}
		s.superseded = true
	}
	s.pushID(sh, slot, ok, k, eventTime)
	if s.maxIDs > 0 && s.ring.n > s.maxIDs {
		s.capIDs()
	}
}

// pushID records k accepted at t: its FIFO entry, and its table slot (slot and found
// as find returned them, after reserve) pointed at that entry. Every change to a slot
// but a deletion goes through here, which keeps idTable's first invariant; the caller
// keeps the second (t is later than any live or remembered time of k).
func (s *Stage) pushID(sh *idShard, slot int, found bool, k idKey, t int64) {
	sh.putAt(slot, found, k, s.ring.pos())
	s.ring.push(idEntry{k: k, t: t})
}

// capIDs forgets the oldest accepted ids until at most maxIDs remain, as expire
// does for ids out of the horizon: the FIFO's front goes, and its table entry with
// it unless the id was accepted again later (a younger entry then stands for it).
func (s *Stage) capIDs() {
	for s.ring.n > s.maxIDs {
		// delOlder first: the slot may point at this entry, which it reads.
		e := s.ring.front()
		s.ids.delOlder(e.k, e.t+1, &s.ring)
		s.ring.pop()
		s.capEvicted++
	}
}

// DedupeIDs is the number of ids the dedupe set remembers (entries of its
// acceptance FIFO: an id Remember refreshed may count twice until the older one
// expires). Its memory is about 40 bytes per id (a 24-byte FIFO entry and an
// 8-byte hash-table slot at a load of 0.25–0.75).
func (s *Stage) DedupeIDs() int { return s.ring.n }

// DedupeCapEvictions is how many ids Config.MaxDedupeIDs made the set forget.
func (s *Stage) DedupeCapEvictions() uint64 { return s.capEvicted }

// live reports whether an id accepted at t0 is still inside the dedupe horizon.
func (s *Stage) live(t0 int64) bool {
	return !s.hasMax || t0 >= satSub(s.maxSeen, s.horizon)
}

// expire drops ids at the head of the acceptance FIFO that fell out of the horizon. It
// deletes the map entry only if that entry is itself expired: the id may have been
// accepted again later, and then a younger FIFO entry still stands for it.
func (s *Stage) expire() {
	floor := satSub(s.maxSeen, s.horizon)
	for s.ring.n > 0 {
		e := s.ring.front()
		if e.t >= floor {
			return
		}
		s.ids.delOlder(e.k, floor, &s.ring) // before pop: the slot may point at e
		s.ring.pop()
	}
}

// Ready appends to dst every pending event with EventTime <= watermark, in (EventTime,
// Offset) order, removes them from the buffer and returns the extended slice.
func (s *Stage) Ready(dst []Event) []Event {
	if !s.hasMax {
		return dst
	}
	return s.release(dst, satSub(s.maxSeen, s.lateness), false)
}

// SetClock makes the idle timeout take t as the current time, until the next call,
// instead of reading Config.Now. A caller that offers a batch of events received at
// one moment reads the clock once for all of them: a read per event was 1% of the
// live service's CPU.
func (s *Stage) SetClock(t time.Time) { s.clock = t }

func (s *Stage) current() time.Time {
	if !s.clock.IsZero() {
		return s.clock
	}
	return s.now()
}

// Idle appends everything pending, sorted, if IdleTimeout > 0 and at least IdleTimeout
// has passed on the injected clock since the last Offer (or since New/Restore). Call it
// periodically in live mode; replays use FlushAll at the end of their range instead.
func (s *Stage) Idle(dst []Event) []Event {
	if s.idleTimeout <= 0 || s.Pending() == 0 {
		return dst
	}
	if s.current().Sub(s.lastOffer) < s.idleTimeout {
		return dst
	}
	return s.release(dst, 0, true)
}

// Quiet reports whether IdleTimeout > 0 and at least IdleTimeout has passed on the
// injected clock since the last Offer (or since New/Restore), pending events or not:
// the idle rule as a first stage tells its re-keyed groups' second stages
// (docs/repartition.md), which must hear it from a partition that never had input
// too, where Idle has nothing to release.
func (s *Stage) Quiet() bool {
	return s.idleTimeout > 0 && s.current().Sub(s.lastOffer) >= s.idleTimeout
}

// Touch counts as activity for the idle timeout, as an Offer does: the caller has
// just started serving the partition (the time spent restoring it is not quiet
// input).
func (s *Stage) Touch() { s.lastOffer = s.current() }

// FlushAll appends everything pending in (EventTime, Offset) order and empties the
// buffer: the end of a replay range, or shutdown. The watermark and dedupe set stay.
func (s *Stage) FlushAll(dst []Event) []Event {
	return s.release(dst, 0, true)
}

// release merges the run with the heap, taking entries at or below limit (all of them
// if all is set) in (EventTime, Offset, arrival) order.
func (s *Stage) release(dst []Event, limit int64, all bool) []Event {
	for {
		hasRun := s.run.n > 0 && (all || s.run.front().ev.EventTime <= limit)
		hasHeap := len(s.heap) > 0 && (all || s.heap[0].t <= limit)
		var ev Event
		switch {
		case hasRun && (!hasHeap || !s.heap[0].before(s.run.front())):
			ev = s.run.pop()
		case hasHeap:
			ev = s.pop()
		default:
			s.updatePressure()
			return dst
		}
		s.pendingBytes -= eventBytes(&ev)
		dst = append(dst, ev)
	}
}

// ErrCorrupt is wrapped by every Restore error caused by the snapshot bytes themselves.
var ErrCorrupt = errors.New("corrupt watermark snapshot")
