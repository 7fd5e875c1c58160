package refwm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
)

// Segmented snapshots: each dedupe id written a few times, not at every checkpoint.
//
// At a 24 h horizon the id list is nearly all of a snapshot's bytes, and a
// checkpoint every few seconds rewrote all of it although only the ids accepted
// since the last one were new. With a SegmentStore in the Config, BeginSnapshot
// writes those new ids as a segment (an immutable blob in the store) and the
// snapshot lists the segments that together hold the live ids.
//
// The ids are numbered by acceptance (the ring's absolute index). A segment
// holds the entries of one index range, unfiltered; the list's ranges are
// contiguous and end at the newest id; the snapshot also stores base, the index
// of the oldest entry still in the ring, and Restore keeps the entries at or
// after base that are live, exactly the ids a version-1 snapshot would hold.
//
// Merging keeps the list short: a new segment has level 0, and when it would be
// the segFanIn-th of its level at the tail of the list, it absorbs those
// segments and moves up a level (a binary counter in base segFanIn). Each id is
// written about log_segFanIn(checkpoints per horizon) times, and the list holds
// at most segFanIn−1 segments per level. Segments whose range fell wholly
// before base drop out of the list. The first segmented snapshot after a
// restore writes every live id again, into segments of the top level (the
// restored ring is numbered afresh), and the segments the restored snapshot
// listed are then released like any others. It writes them in pieces of at
// most the cap below, so that writing them needs a buffer of one piece, not of
// the whole set, and the oldest pieces drop out of the list as their ids leave
// the horizon instead of the whole set staying listed (and read at every
// restore) until its last id has.
//
// The cap: no merge makes a segment of more than Config.MaxMergeBytes. The
// new segment then stays at its level beside the ones it would have absorbed,
// and the next merge of that level takes only the newest segFanIn−1 of them.
// A merge writes every id it covers within one checkpoint; uncapped, the
// fourth checkpoint of a busy partition rewrote the three before it (31 MB at
// 85 000 ids/s), and the sixteenth a hundred MB, bursts that queued the
// partitions' events behind them. With the cap a merge writes at most that
// much, an id is written at most log_segFanIn(cap / segment) + 1 times, and
// the list holds at most segFanIn × (the ids' bytes / the cap) segments (any
// segFanIn adjacent ones of a level hold more than the cap, or they would have
// merged) plus segFanIn−1 per level below those.
//
// Lifetime. A store keeps a partition's newest snapshot and the one before, so
// a segment must outlive both snapshots that list it: SnapshotSaved returns
// for deletion the segments that the snapshot before the previous one listed
// and the previous one did not. Segment references are unique (the store adds
// a nonce), so another instance writing the same partition (a zombie) never
// overwrites ours; it may delete only segments its own snapshots listed.

// ErrSegment marks a restore that failed because a segment the snapshot lists
// could not be read or did not check out (the error also wraps the cause): the
// snapshot itself was sound, so a caller may fall back to another.
var ErrSegment = errors.New("dedupe segment unusable")

// SegmentStore keeps one partition's id segments; pkg/service binds a
// pkg/checkpoint store and a partition to it.
type SegmentStore interface {
	// PutSegment stores data durably as a new segment and returns the
	// reference that names it.
	PutSegment(data []byte) (ref []byte, err error)
	// GetSegment returns the data of the segment ref names.
	GetSegment(ref []byte) ([]byte, error)
}

const (
	segFanIn     = 4
	segTopLevel  = 255 // a whole-set segment: never merged, only dropped once out of range
	segMagic     = "VCWS"
	segVersion   = 1
	segHeadLen   = len(segMagic) + 1 + 8 + 8
	maxRefLen    = 1 << 10
	snapVersion2 = 2
)

// segment is one entry of a segmented snapshot's list.
type segment struct {
	first uint64 // absolute index of its first entry
	count uint64
	level uint8
	ref   []byte
}

func (g segment) end() uint64 { return g.first + g.count }

// segPlan is what a segmented snapshot will write and list.
type segPlan struct {
	base    uint64    // absolute index of view entry 0
	list    []segment // the snapshot's list; list[newAt:] are new when write
	write   bool      // list[newAt:] are to be written by Finish
	newAt   int       // index in list of the first new segment
	dropped [][]byte  // refs in the saved list that this list no longer has
}

// planSegments decides, on the Stage's goroutine, which segment the snapshot
// begun now writes and which it lists.
func (s *Stage) planSegments() *segPlan {
	base := s.ring.popped
	end := base + uint64(s.ring.n)
	p := &segPlan{base: base}
	var kept []segment
	for _, g := range s.segSaved {
		if s.segRestart || g.end() <= base {
			p.dropped = append(p.dropped, g.ref)
		} else {
			kept = append(kept, g)
		}
	}
	switch {
	case len(kept) == 0:
		// Nothing to build on (first snapshot, or the first after a restore):
		// every live id, in pieces of at most the cap.
		if end > base {
			p.write = true
			piece := max(s.maxMerge, 1)
			for from := base; from < end; from += piece {
				kept = append(kept, segment{first: from, count: min(piece, end-from), level: segTopLevel})
			}
		}
	case kept[len(kept)-1].end() < end:
		level, i := uint8(0), len(kept)
		for {
			j := i
			for j > 0 && i-j < segFanIn-1 && kept[j-1].level == level {
				j--
			}
			if i-j < segFanIn-1 || level == segTopLevel-1 || end-max(kept[j].first, base) > s.maxMerge {
				break
			}
			i, level = j, level+1
		}
		for _, g := range kept[i:] {
			p.dropped = append(p.dropped, g.ref)
		}
		from := kept[len(kept)-1].end()
		if i < len(kept) {
			from = max(kept[i].first, base)
		}
		kept = append(kept[:i], segment{first: from, count: end - from, level: level})
		p.write, p.newAt = true, i
	}
	p.list = kept
	return p
}

// appendSegmentList appends the v2 id section: base, then each listed segment.
func appendSegmentList(dst []byte, p *segPlan) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, p.base)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p.list)))
	for _, g := range p.list {
		dst = binary.LittleEndian.AppendUint64(dst, g.first)
		dst = binary.LittleEndian.AppendUint64(dst, g.count)
		dst = append(dst, g.level)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(g.ref)))
		dst = append(dst, g.ref...)
	}
	return dst
}

// encodeSegment is a segment's blob: its own header and checksum, so that it is
// verified whatever store holds it.
//
//	"VCWS" version:u8 first:u64 count:u64, count × (hashHi:u64 hashLo:u64 eventTime:i64), crc32c:u32
//
// It holds the view's entries g.first … g.end()−1; view entry 0 is at base.
func encodeSegment(dst []byte, v *idView, base uint64, g segment) []byte {
	dst = append(dst, segMagic...)
	dst = append(dst, segVersion)
	dst = binary.LittleEndian.AppendUint64(dst, g.first)
	dst = binary.LittleEndian.AppendUint64(dst, g.count)
	// One allocation of the exact size, not a chain of doublings: a merged
	// segment is tens of MB, and the buffer is kept for the next one.
	dst = slices.Grow(dst, int(g.count)*idEntryLen+crcLen)
	for i := int(g.first - base); i < int(g.end()-base); i++ {
		dst = appendID(dst, v.at(i))
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst, castagnoli))
}

// decodeSegment checks a segment blob against the list entry that names it and
// returns its entries' bytes.
func decodeSegment(b []byte, g segment) ([]byte, error) {
	if len(b) < segHeadLen+crcLen {
		return nil, fmt.Errorf("%w: segment of %d bytes is shorter than its header", ErrCorrupt, len(b))
	}
	body := b[:len(b)-crcLen]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(b[len(body):]); got != want {
		return nil, fmt.Errorf("%w: segment checksum %08x, stored %08x", ErrCorrupt, got, want)
	}
	if string(body[:len(segMagic)]) != segMagic || body[len(segMagic)] != segVersion {
		return nil, fmt.Errorf("%w: not a version-%d id segment", ErrCorrupt, segVersion)
	}
	first := binary.LittleEndian.Uint64(body[len(segMagic)+1:])
	count := binary.LittleEndian.Uint64(body[len(segMagic)+9:])
	if first != g.first || count != g.count {
		return nil, fmt.Errorf("%w: segment holds ids %d+%d, the snapshot lists %d+%d", ErrCorrupt, first, count, g.first, g.count)
	}
	ids := body[segHeadLen:]
	if uint64(len(ids)) != count*idEntryLen || count > uint64(len(ids)) {
		return nil, fmt.Errorf("%w: segment of %d ids has %d bytes of entries", ErrCorrupt, count, len(ids))
	}
	return ids, nil
}

// decodeSegmentList reads the v2 id section and loads the live ids from the
// segments it lists.
func (s *Stage) decodeSegmentList(r *reader) {
	base := r.u64("segment base")
	n := r.u32("segment count")
	if r.err == nil && uint64(n) > uint64(len(r.b)/(8+8+1+4)) {
		r.fail("segment count %d cannot fit in %d bytes", n, len(r.b))
	}
	var list []segment
	for i := 0; i < int(n) && r.err == nil; i++ {
		g := segment{first: r.u64("segment first"), count: r.u64("segment count")}
		if p := r.take(1, "segment level"); p != nil {
			g.level = p[0]
		}
		refLen := r.u32("segment reference length")
		if r.err == nil && (refLen == 0 || refLen > maxRefLen) {
			r.fail("segment reference of %d bytes", refLen)
		}
		g.ref = append([]byte(nil), r.take(int(refLen), "segment reference")...)
		switch {
		case r.err != nil:
		case g.count == 0 || g.first+g.count < g.first:
			r.fail("segment %d covers no ids or overflows", i)
		case i == 0 && g.first > base:
			r.fail("first segment starts at %d, after base %d", g.first, base)
		case i > 0 && g.first != list[i-1].end():
			r.fail("segment %d starts at %d, not where the one before ends (%d)", i, g.first, list[i-1].end())
		case g.end() <= base:
			r.fail("segment %d ends at %d, before base %d", i, g.end(), base)
		}
		list = append(list, g)
	}
	if r.err != nil {
		return
	}
	if len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
		return
	}
	// The segments are the previous owner's: the next segmented snapshot
	// starts a fresh list (the ring is numbered afresh here) and releases them.
	s.segSaved, s.segRestart = list, true
	if !s.dedupe || len(list) == 0 {
		return
	}
	if s.segments == nil {
		r.fail("the snapshot keeps its dedupe ids in %d segments, and no segment store was given to read them", len(list))
		return
	}
	// Read and check every segment before sizing the table: the counts are
	// only trusted once their bytes are there.
	blobs := make([][]byte, len(list))
	total := 0
	for i, g := range list {
		blob, err := s.segments.GetSegment(g.ref)
		if err != nil {
			r.err = fmt.Errorf("%w: read segment %d+%d: %w", ErrSegment, g.first, g.count, err)
			return
		}
		if blobs[i], err = decodeSegment(blob, g); err != nil {
			r.err = fmt.Errorf("%w: segment %d+%d: %w", ErrSegment, g.first, g.count, err)
			return
		}
		total += len(blobs[i]) / idEntryLen
	}
	s.ids.presize(total)
	for i, g := range list {
		ids := blobs[i]
		for j := uint64(0); j < g.count; j++ {
			b := ids[j*idEntryLen:]
			k := idKey{hi: binary.LittleEndian.Uint64(b), lo: binary.LittleEndian.Uint64(b[8:])}
			t := int64(binary.LittleEndian.Uint64(b[16:]))
			if g.first+j < base && k != (idKey{}) {
				continue // popped before the snapshot: not in the set
			}
			if !s.restoreID(r, k, t) {
				return
			}
		}
	}
}

// SnapshotSaved tells the Stage that the snapshot p was taken for is durable
// in the store: its list becomes the one later snapshots build on. It returns
// the segments no snapshot the store still keeps refers to, for the caller to
// delete. Call it on the Stage's goroutine, in save order; a snapshot that was
// not saved is simply never passed (what it wrote is left behind, unreferenced).
func (s *Stage) SnapshotSaved(p *PendingSnapshot) (garbage [][]byte) {
	if p == nil || p.plan == nil {
		// A snapshot without segments: after it and the next save, nothing
		// the store keeps lists any segment.
		garbage, s.segGarbage = s.segGarbage, nil
		for _, g := range s.segSaved {
			s.segGarbage = append(s.segGarbage, g.ref)
		}
		s.segSaved, s.segRestart = nil, false
		return garbage
	}
	garbage, s.segGarbage = s.segGarbage, p.plan.dropped
	s.segSaved, s.segRestart = p.plan.list, false
	return garbage
}

// SegmentRefs returns the segments a stage snapshot (AppendSnapshot's or a
// segmented one) lists, without reading them: none for version 1.
func SegmentRefs(data []byte) ([][]byte, error) {
	// With dedupe off, Restore checks and parses the list but reads no segment.
	st, err := Restore(Config{DisableDedupe: true}, data)
	if err != nil {
		return nil, err
	}
	refs := make([][]byte, 0, len(st.segSaved))
	for _, g := range st.segSaved {
		refs = append(refs, g.ref)
	}
	return refs, nil
}
