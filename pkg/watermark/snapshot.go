package watermark

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
)

// Snapshot layout, version 1 (version 2 below), all integers little-endian:
//
//	"VCWM" version:u8 flags:u8 (bit 0 hasMax, bit 1 pressure) maxSeen:i64
//	pending:u32, then per event in release order:
//	    offset:i64 eventTime:i64 amount:i64 aux:i64 size:i32
//	    len(eventID):u32 eventID len(entityID):u32 entityID
//	    with flag bit 2 (ext) only: len(ext):u8 ext:u64...
//	ids:u32, then per live id in acceptance order: hashHi:u64 hashLo:u64 eventTime:i64
//	crc32c:u32 over every byte before it
//
// Version 2, the segmented snapshot (segments.go), differs only in the ids section:
//
//	base:u64 segments:u32, then per segment: first:u64 count:u64 level:u8
//	    len(ref):u32 ref
//
// Configuration is not stored: lateness, horizon and marks come from the Config passed to
// Restore, so an operator may change them across a restart.
const (
	snapMagic    = "VCWM"
	snapVersion  = 1
	flagHasMax   = 1 << 0
	flagPressure = 1 << 1
	// flagExt: some pending event carries Ext words, so every event states how many
	// it has. Without it the bytes are exactly those of a build that had no Ext.
	flagExt       = 1 << 2
	snapHeaderLen = len(snapMagic) + 1 + 1 + 8
	eventMinLen   = 4*8 + 4 + 4 + 4
	idEntryLen    = 8 + 8 + 8
	crcLen        = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendSnapshot appends the stage's state to dst. The bytes depend only on the logical
// state (see the package documentation), so the same history gives the same bytes, and
// a restored stage snapshots to exactly the bytes it was restored from.
//
// It always writes version 1, with the ids inline, whatever Config.Segments says.
func (s *Stage) AppendSnapshot(dst []byte) []byte {
	start := len(dst)
	dst, p := s.BeginSnapshotWith(dst, false)
	dst, _ = p.Finish(dst, start) // no segment to write: cannot fail
	s.EndSnapshot(p)
	return dst
}

// PendingSnapshot is the rest of a snapshot begun by BeginSnapshot: the list of
// accepted ids, which at a 24 h horizon holds millions of entries and is most of the
// bytes. Finish may run on another goroutine while the Stage goes on (the ids it
// encodes are a view that the Stage does not write); it gives exactly the bytes
// AppendSnapshot would have given at BeginSnapshot.
type PendingSnapshot struct {
	headLen int
	view    idView
	floor   int64 // ids accepted before floor are out of the horizon: skipped
	all     bool  // no event seen yet: every id is live
	sync    bool  // ids already encoded by BeginSnapshot
	open    bool  // view not yet released
	plan    *segPlan
	store   SegmentStore
	segBuf  []byte
	segSize int // bytes of the segments Finish wrote
}

// BeginSnapshot appends the part of the stage's snapshot that is cheap to encode (the
// header and the pending events) to dst and returns it with the rest, for
// PendingSnapshot.Finish. Every PendingSnapshot must be passed to EndSnapshot, on the
// Stage's goroutine, after Finish; until then the Stage keeps the blocks the ids were
// in (which costs allocations, never correctness).
//
// With Config.Segments set (and dedupe on, and no Remember that superseded a live
// id), the snapshot is version 2: Finish writes the ids accepted since the newest
// saved snapshot as a segment and the snapshot lists segments (see segments.go);
// pass the snapshot to SnapshotSaved once it is durable.
func (s *Stage) BeginSnapshot(dst []byte) ([]byte, *PendingSnapshot) {
	return s.BeginSnapshotWith(dst, s.segments != nil)
}

// BeginSnapshotWith is BeginSnapshot with the choice made by the caller: segmented
// false gives version 1 (ids inline) even with Config.Segments set.
func (s *Stage) BeginSnapshotWith(dst []byte, segmented bool) ([]byte, *PendingSnapshot) {
	segmented = segmented && s.dedupe && !s.superseded
	version := byte(snapVersion)
	if segmented {
		version = snapVersion2
	}
	start := len(dst)
	dst = append(dst, snapMagic...)
	var flags byte
	if s.hasMax {
		flags |= flagHasMax
	}
	if s.pressure {
		flags |= flagPressure
	}
	flagsAt := len(dst) + 1
	dst = append(dst, version, flags)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.maxSeen))

	dst = binary.LittleEndian.AppendUint32(dst, uint32(s.Pending()))
	s.scratch = append(s.scratch[:0], s.heap...)
	slices.SortFunc(s.scratch, func(a, b item) int {
		switch {
		case a.less(&b):
			return -1
		case b.less(&a):
			return 1
		}
		return 0 // only an item compared with itself: seq makes keys unique
	})
	ext := false
	for i := 0; i < s.run.n && !ext; i++ {
		ext = len(s.run.at(i).ev.Ext) > 0
	}
	for i := 0; i < len(s.scratch) && !ext; i++ {
		ext = len(s.slab[s.scratch[i].slot].Ext) > 0
	}
	if ext {
		dst[flagsAt] |= flagExt
	}
	ri, hp := 0, 0
	for ri < s.run.n || hp < len(s.scratch) {
		if ri < s.run.n && (hp == len(s.scratch) || !s.scratch[hp].before(s.run.at(ri))) {
			dst = appendEvent(dst, &s.run.at(ri).ev, ext)
			ri++
		} else {
			dst = appendEvent(dst, &s.slab[s.scratch[hp].slot], ext)
			hp++
		}
	}

	p := &PendingSnapshot{floor: satSub(s.maxSeen, s.horizon), all: !s.hasMax}
	switch {
	case !s.dedupe:
		p.sync = true
		dst = binary.LittleEndian.AppendUint32(dst, 0)
	case s.superseded:
		// The ring may hold two live entries for an id, and only a probe of the id
		// table (which the Stage goes on changing) tells which is current, so these
		// are encoded now. Only --late=apply gets here, by Remember.
		p.sync = true
		countAt := len(dst)
		dst = binary.LittleEndian.AppendUint32(dst, 0)
		var n uint32
		for i := 0; i < s.ring.n; i++ {
			e := s.ring.at(i)
			if !s.live(e.t) {
				continue
			}
			if t0, ok := s.ids.get(e.k, &s.ring); !ok || t0 != e.t {
				continue
			}
			dst = appendID(dst, e)
			n++
		}
		binary.LittleEndian.PutUint32(dst[countAt:], n)
	case segmented:
		p.plan, p.store = s.planSegments(), s.segments
		if p.plan.write {
			p.view, p.open = s.ring.view(), true
			p.segBuf, s.segBuf = s.segBuf, nil
		} else {
			p.sync = true
			dst = appendSegmentList(dst, p.plan)
		}
	default:
		p.view, p.open = s.ring.view(), true
	}
	p.headLen = len(dst) - start
	return dst, p
}

// SegmentBytes is the size of the dedupe segments Finish wrote (0 if none).
func (p *PendingSnapshot) SegmentBytes() int {
	if p == nil {
		return 0
	}
	return p.segSize
}

// Size is at most how many bytes Finish appends.
func (p *PendingSnapshot) Size() int {
	switch {
	case p.sync:
		return crcLen
	case p.plan != nil:
		n := 8 + 4 + crcLen
		for range p.plan.list {
			n += 8 + 8 + 1 + 4 + maxRefLen
		}
		return n
	}
	return 4 + p.view.n*idEntryLen + crcLen
}

// Finish appends the rest of the snapshot to dst, whose bytes from start on must be
// exactly those BeginSnapshot appended, and returns the extended slice. It fails only
// when a segment cannot be written (then the snapshot must not be saved).
func (p *PendingSnapshot) Finish(dst []byte, start int) ([]byte, error) {
	if len(dst)-start != p.headLen {
		panic("watermark: PendingSnapshot.Finish on bytes other than BeginSnapshot's")
	}
	if !p.sync && p.plan != nil {
		// One buffer for every piece: PutSegment is done with it on return.
		for i := p.plan.newAt; i < len(p.plan.list); i++ {
			p.segBuf = encodeSegment(p.segBuf[:0], &p.view, p.plan.base, p.plan.list[i])
			ref, err := p.store.PutSegment(p.segBuf)
			if err != nil {
				return dst, fmt.Errorf("write dedupe segment: %w", err)
			}
			if len(ref) == 0 || len(ref) > maxRefLen {
				return dst, fmt.Errorf("write dedupe segment: the store returned a %d-byte reference", len(ref))
			}
			p.plan.list[i].ref = ref
			p.segSize += len(p.segBuf)
		}
		dst = appendSegmentList(dst, p.plan)
	} else if !p.sync {
		countAt := len(dst)
		dst = binary.LittleEndian.AppendUint32(dst, 0)
		dst = slices.Grow(dst, p.view.n*idEntryLen+crcLen)
		var n uint32
		for i := 0; i < p.view.n; i++ {
			e := p.view.at(i)
			// Skip entries already out of the horizon: they cannot affect a future
			// decision. Without superseded entries (see Stage.superseded) a live
			// entry is the id's current one.
			if !p.all && e.t < p.floor {
				continue
			}
			dst = appendID(dst, e)
			n++
		}
		binary.LittleEndian.PutUint32(dst[countAt:], n)
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli)), nil
}

// EndSnapshot releases what p kept of the stage. Call it on the Stage's goroutine once
// Finish has returned (or will never be called).
func (s *Stage) EndSnapshot(p *PendingSnapshot) {
	if p != nil && p.open {
		p.open = false
		p.view = idView{}
		s.ring.release()
	}
	if p != nil && p.segBuf != nil {
		s.segBuf, p.segBuf = p.segBuf[:0], nil
	}
}

// restoreID keeps a restored id if it is live, and reports false (with r
// failed) for one no snapshot can hold: the zero hash, or an id twice.
// Expired ids are dropped: they can influence nothing, so a repeat among
// them is harmless.
func (s *Stage) restoreID(r *reader, k idKey, t int64) bool {
	if k == (idKey{}) {
		r.fail("zero id hash")
		return false
	}
	if !s.dedupe || !s.live(t) {
		return true
	}
	sh := s.ids.shard(k)
	sh.reserve()
	slot, _, dup := sh.find(k, &s.ring)
	if dup {
		r.fail("id %016x%016x appears twice", k.hi, k.lo)
		return false
	}
	s.pushID(sh, slot, false, k, t)
	return true
}

func appendID(dst []byte, e idEntry) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, e.k.hi)
	dst = binary.LittleEndian.AppendUint64(dst, e.k.lo)
	return binary.LittleEndian.AppendUint64(dst, uint64(e.t))
}

func appendEvent(dst []byte, ev *Event, ext bool) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ev.Offset))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ev.EventTime))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ev.Amount))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ev.Aux))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(ev.Size))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(ev.EventID)))
	dst = append(dst, ev.EventID...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(ev.EntityID)))
	dst = append(dst, ev.EntityID...)
	if ext {
		dst = append(dst, byte(len(ev.Ext)))
		for _, w := range ev.Ext {
			dst = binary.LittleEndian.AppendUint64(dst, w)
		}
	}
	return dst
}

// reader decodes with strict bounds: every read checks the remaining length, so a
// truncated or altered input becomes an error, never an out-of-range panic.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.fail("%s needs %d bytes, %d left", what, n, len(r.b))
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) u32(what string) uint32 {
	if p := r.take(4, what); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *reader) u64(what string) uint64 {
	if p := r.take(8, what); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (r *reader) str(what string) string {
	n := r.u32(what + " length")
	return string(r.take(int(n), what))
}

// Restore rebuilds a Stage from AppendSnapshot output, or a segmented snapshot (whose
// ids it reads from cfg.Segments), with behaviour set by cfg. Any
// input it cannot fully validate (wrong magic or version, bad checksum, truncation,
// trailing bytes, unsorted events, repeated ids) is an error wrapping ErrCorrupt; it
// never panics and never returns a partly loaded stage. Ids outside cfg's horizon are
// dropped, since they could not affect a decision.
func Restore(cfg Config, data []byte) (*Stage, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if len(data) < snapHeaderLen+4+4+crcLen {
		return nil, fmt.Errorf("restore watermark: %w: %d bytes is shorter than any snapshot", ErrCorrupt, len(data))
	}
	body := data[:len(data)-crcLen]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(data[len(body):]); got != want {
		return nil, fmt.Errorf("restore watermark: %w: checksum %08x, stored %08x", ErrCorrupt, got, want)
	}
	if string(body[:len(snapMagic)]) != snapMagic {
		return nil, fmt.Errorf("restore watermark: %w: not a watermark snapshot (magic %q)", ErrCorrupt, body[:len(snapMagic)])
	}
	v := body[len(snapMagic)]
	if v != snapVersion && v != snapVersion2 {
		return nil, fmt.Errorf("restore watermark: %w: version %d, this build reads %d and %d", ErrCorrupt, v, snapVersion, snapVersion2)
	}
	if err := s.decode(body[len(snapMagic)+1:], v); err != nil {
		return nil, fmt.Errorf("restore watermark: %w", err)
	}
	if s.maxIDs > 0 && s.ring.n > s.maxIDs {
		// Saved under a larger cap (or none): the oldest ids go first.
		s.capIDs()
	}
	return s, nil
}

func (s *Stage) decode(b []byte, version byte) error {
	r := &reader{b: b}
	var flags byte
	if p := r.take(1, "flags"); p != nil {
		flags = p[0]
	}
	if flags&^(flagHasMax|flagPressure|flagExt) != 0 {
		r.fail("unknown flags %#x", flags)
	}
	s.hasMax = flags&flagHasMax != 0
	s.pressure = flags&flagPressure != 0
	s.maxSeen = int64(r.u64("max seen"))
	if !s.hasMax && s.maxSeen != 0 {
		r.fail("max seen %d without the has-max flag", s.maxSeen)
	}

	np := r.u32("pending count")
	if r.err == nil && uint64(np) > uint64(len(r.b)/eventMinLen) {
		r.fail("pending count %d cannot fit in %d bytes", np, len(r.b))
	}
	if r.err == nil && np > 0 && !s.hasMax {
		r.fail("%d pending events without a max seen", np)
	}
	if r.err != nil {
		return r.err
	}
	s.run.presize(int(np))
	prev := &Event{}
	for i := 0; i < int(np) && r.err == nil; i++ {
		var ev Event
		ev.Offset = int64(r.u64("offset"))
		ev.EventTime = int64(r.u64("event time"))
		ev.Amount = int64(r.u64("amount"))
		ev.Aux = int64(r.u64("aux"))
		ev.Size = int32(r.u32("size"))
		ev.EventID = r.str("event id")
		ev.EntityID = r.str("entity id")
		if flags&flagExt != 0 {
			var n int
			if p := r.take(1, "ext length"); p != nil {
				n = int(p[0])
			}
			if p := r.take(8*n, "ext"); p != nil && n > 0 {
				ev.Ext = make([]uint64, n)
				for j := range ev.Ext {
					ev.Ext[j] = binary.LittleEndian.Uint64(p[8*j:])
				}
			}
		}
		if r.err != nil {
			break
		}
		if ev.EventTime > s.maxSeen {
			r.fail("pending event at %d is after max seen %d", ev.EventTime, s.maxSeen)
			break
		}
		if i > 0 && (ev.EventTime < prev.EventTime || ev.EventTime == prev.EventTime && ev.Offset < prev.Offset) {
			r.fail("pending events out of order at %d", i)
			break
		}
		// The events come sorted, so they all form one run; arrival numbers follow
		// the snapshot order, which is the original arrival order among equal keys.
		s.run.push(queued{ev: ev, seq: uint64(i)})
		prev = &s.run.back().ev
		s.pendingBytes += eventBytes(&ev)
	}
	s.seq = uint64(np)

	if version == snapVersion2 {
		s.decodeSegmentList(r)
		if r.err != nil {
			return r.err
		}
		s.updatePressure()
		return nil
	}
	ni := r.u32("id count")
	if r.err == nil && uint64(ni)*idEntryLen != uint64(len(r.b)) {
		r.fail("id count %d does not match the %d bytes left", ni, len(r.b))
	}
	if r.err != nil {
		return r.err
	}
	// Size the tables for the count the snapshot states (already checked
	// against its length above) instead of growing them step by step. Only ids
	// still inside the horizon are kept, and a kept id may appear once: the
	// table that keeps them is the duplicate check (ids dropped as expired can
	// influence nothing, so a repeat among them is harmless).
	if s.dedupe {
		s.ids.presize(int(ni))
	}
	for range ni {
		k := idKey{hi: r.u64("id hash"), lo: r.u64("id hash")}
		t := int64(r.u64("id time"))
		if r.err != nil || !s.restoreID(r, k, t) {
			break
		}
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(r.b))
	}
	s.updatePressure() // a no-op under the same marks; applies new marks after a change
	return nil
}
