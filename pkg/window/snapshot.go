package window

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strings"
	"unsafe"
)

// Snapshot format, version 1 (all integers varint/uvarint unless noted):
//
//	"VWT" 0x01                          magic and version
//	nspecs, then per spec: W ms, b ms   the table's windows, checked on restore
//	nentities, then per entity:
//	  id length, id bytes
//	  newest (varint), prevT (varint)
//	  shape byte: 0 header-only, 1 raw, 2 rings
//	  raw:   n, then per event: t (varint), amount (uvarint)
//	  rings: per window: n, then per bucket: k (varint), cnt, sum, min, max (uvarint)
//	crc32-C of everything above, 4 bytes little endian
//
// Entities are written in least-recently-active-first order when MaxEntities > 0
// (the LRU order is state the cap depends on) and in id order otherwise, so the same
// state always gives the same bytes. The reader checks the checksum first and then
// every invariant the engine relies on, so altered input is an error, never a panic
// or a half-loaded table.
const snapMagic = "VWT\x01"

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// AppendSnapshot appends a deterministic encoding of the whole table to dst.
func (t *Table) AppendSnapshot(dst []byte) []byte {
	ts := t.BeginSnapshot()
	ts.Step(math.MaxInt)
	dst = ts.AppendTo(dst)
	t.EndSnapshot(ts)
	return dst
}

// PendingSnapshot is a snapshot of the table as it was at BeginSnapshot, taken in
// steps while the table goes on: Step encodes a share of the entities, and an entity
// the table is about to change, evict or hand to a new id is encoded first, as it was
// (copy before write). Once Step reports it complete, AppendTo gives exactly the bytes
// AppendSnapshot would have given at BeginSnapshot, and may run on another goroutine
// while the table goes on, since it reads only the encodings.
//
// Why steps: encoding every entity at once stopped a partition for a time
// proportional to the table (25 000 entities, 4 MB: 20-190 ms on this machine, most of
// it cache misses on the entities), which at the checkpoint interval was the whole of
// the event-to-feature p99.
type PendingSnapshot struct {
	t     *Table   // nil once complete
	kept  []uint64 // bit per slot below n0: encoded (or not to be)
	n0    int      // slots that existed at BeginSnapshot
	next  int      // next slot Step looks at
	byLRU bool     // snapshot order is least recently active first, else by id

	head  []byte // magic and specs
	n     int    // entities at BeginSnapshot
	body  []byte // the entities' encodings, in the order they were taken
	spans []span // one per encoding, in body order
}

// span is one entity's encoding: body[start:end], whose id is body[idStart:idEnd];
// seq is its activity number (the LRU order) when byLRU.
type span struct {
	start, idStart, idEnd, end int
	seq                        uint64
}

// BeginSnapshot starts a snapshot of the table as it is now. Advance it with Step
// (on the table's goroutine, between Apply calls) until Step returns true; then
// AppendTo, then EndSnapshot on the table's goroutine, which hands the buffers back
// for the next snapshot. A snapshot still in steps when the next one begins is
// completed first.
func (t *Table) BeginSnapshot() *PendingSnapshot {
	if t.snap != nil {
		t.snap.Step(math.MaxInt)
	}
	ts := t.spareSnap
	t.spareSnap = nil
	if ts == nil {
		ts = &PendingSnapshot{}
	}
	ts.t, ts.n0, ts.next, ts.byLRU, ts.n = t, len(t.slab), 0, t.maxEntities > 0, t.idx.n
	ts.kept = slices.Grow(ts.kept[:0], (ts.n0+63)/64)[:(ts.n0+63)/64]
	clear(ts.kept)
	ts.body, ts.spans = ts.body[:0], ts.spans[:0]
	ts.head = append(ts.head[:0], snapMagic...)
	ts.head = binary.AppendUvarint(ts.head, uint64(len(t.specs)))
	for _, sp := range t.specs {
		ts.head = binary.AppendUvarint(ts.head, uint64(sp.WindowMs))
		ts.head = binary.AppendUvarint(ts.head, uint64(sp.BucketMs))
	}
	t.snap = ts
	return ts
}

// Step encodes up to budget more entities and reports whether the snapshot is
// complete. Call it on the table's goroutine.
func (ts *PendingSnapshot) Step(budget int) bool {
	t := ts.t
	if t == nil {
		return true
	}
	for ts.next < ts.n0 && budget > 0 {
		s := ts.next
		ts.next++
		if ts.kept[s/64]&(1<<(s%64)) == 0 {
			ts.kept[s/64] |= 1 << (s % 64)
			if t.slab[s].id != "" {
				ts.take(uint32(s))
				budget--
			}
		}
	}
	if ts.next < ts.n0 {
		return false
	}
	t.snap, ts.t = nil, nil
	return true
}

// Done reports whether Step has completed the snapshot.
func (ts *PendingSnapshot) Done() bool { return ts.t == nil }

// keep encodes slot's entity as it is, unless the snapshot has it already: the table
// calls it before changing or removing an entity while a snapshot is in steps.
func (ts *PendingSnapshot) keep(slot uint32) {
	if int(slot) >= ts.n0 || ts.kept[slot/64]&(1<<(slot%64)) != 0 {
		return
	}
	ts.kept[slot/64] |= 1 << (slot % 64)
	if ts.t.slab[slot].id != "" {
		ts.take(slot)
	}
}

// skip marks slot as not part of the snapshot: a new entity in a slot that was free
// at BeginSnapshot (one evicted since was kept before it went).
func (ts *PendingSnapshot) skip(slot uint32) {
	if int(slot) < ts.n0 {
		ts.kept[slot/64] |= 1 << (slot % 64)
	}
}

func (ts *PendingSnapshot) take(slot uint32) {
	t := ts.t
	e := &t.slab[slot]
	sp := span{start: len(ts.body)}
	if ts.byLRU {
		sp.seq = t.lru[slot].seq
	}
	ts.body = binary.AppendUvarint(ts.body, uint64(len(e.id)))
	sp.idStart = len(ts.body)
	sp.idEnd = sp.idStart + len(e.id)
	ts.body = t.appendEntity(ts.body, e)
	sp.end = len(ts.body)
	ts.spans = append(ts.spans, sp)
}

// appendEntity appends e's encoding after its id's length.
func (t *Table) appendEntity(dst []byte, e *entity) []byte {
	dst = append(dst, e.id...)
	dst = binary.AppendVarint(dst, e.newest)
	dst = binary.AppendVarint(dst, e.prevT)
	switch {
	case e.rings != nil:
		dst = append(dst, 2)
		for _, r := range t.rings(e) {
			dst = binary.AppendUvarint(dst, uint64(r.n))
			mask := len(r.buf) - 1
			for j := range r.n {
				bk := &r.buf[(r.head+j)&mask]
				dst = binary.AppendVarint(dst, bk.k)
				dst = binary.AppendUvarint(dst, uint64(bk.cnt))
				dst = binary.AppendUvarint(dst, uint64(bk.sum))
				dst = binary.AppendUvarint(dst, uint64(bk.min))
				dst = binary.AppendUvarint(dst, uint64(bk.max))
			}
		}
	case len(e.raw) > 0:
		dst = append(dst, 1)
		dst = binary.AppendUvarint(dst, uint64(len(e.raw)))
		for _, ev := range e.raw {
			dst = binary.AppendVarint(dst, ev.t)
			dst = binary.AppendUvarint(dst, uint64(ev.a))
		}
	default:
		dst = append(dst, 0)
	}
	return dst
}

// Size is at most how many bytes AppendTo appends.
func (ts *PendingSnapshot) Size() int {
	return len(ts.head) + binary.MaxVarintLen64 + len(ts.body) + 4
}

// AppendTo appends the finished snapshot: entities least recently active first when
// the table has a MaxEntities cap (that order is state the cap depends on), in id
// order otherwise, so the same state always gives the same bytes. It panics if Step
// has not completed the snapshot.
func (ts *PendingSnapshot) AppendTo(dst []byte) []byte {
	if !ts.Done() {
		panic("window: PendingSnapshot.AppendTo before Step completed it")
	}
	start := len(dst)
	dst = slices.Grow(dst, ts.Size())
	dst = append(dst, ts.head...)
	dst = binary.AppendUvarint(dst, uint64(ts.n))
	body := ts.body
	if ts.byLRU {
		slices.SortFunc(ts.spans, func(a, b span) int { return cmp.Compare(a.seq, b.seq) })
	} else {
		slices.SortFunc(ts.spans, func(a, b span) int {
			return bytes.Compare(body[a.idStart:a.idEnd], body[b.idStart:b.idEnd])
		})
	}
	for _, sp := range ts.spans {
		dst = append(dst, body[sp.start:sp.end]...)
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
}

// EndSnapshot takes back ts's buffers for the next snapshot. Call it on the table's
// goroutine after AppendTo returned; ts must not be used afterwards. A snapshot
// still in steps is abandoned.
func (t *Table) EndSnapshot(ts *PendingSnapshot) {
	if ts == nil {
		return
	}
	if t.snap == ts {
		t.snap = nil
	}
	ts.t = nil
	t.spareSnap = ts
}

// RestoreTable rebuilds a table from AppendSnapshot output. It returns an error (never
// panics) on truncated or altered input and when the snapshot's windows differ from
// specs. If the snapshot holds more entities than opts.MaxEntities, the least recently
// active ones are evicted and counted, as if the cap had applied all along.
func RestoreTable(specs []Spec, opts Options, data []byte) (*Table, error) {
	t, err := NewTable(specs, opts)
	if err != nil {
		return nil, err
	}
	if len(data) < len(snapMagic)+4 {
		return nil, errors.New("window snapshot: truncated")
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if string(body[:len(snapMagic)-1]) != snapMagic[:len(snapMagic)-1] {
		return nil, errors.New("window snapshot: not a window snapshot (bad magic)")
	}
	if body[len(snapMagic)-1] != snapMagic[len(snapMagic)-1] {
		return nil, fmt.Errorf("window snapshot: unsupported version %d, this build reads version %d", body[len(snapMagic)-1], snapMagic[len(snapMagic)-1])
	}
	if crc32.Checksum(body, crcTable) != sum {
		return nil, errors.New("window snapshot: checksum mismatch (corrupt or truncated)")
	}
	d := decoder{b: body[len(snapMagic):]}
	if err := t.decode(&d); err != nil {
		return nil, fmt.Errorf("window snapshot: %w", err)
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("window snapshot: %d trailing bytes", len(d.b))
	}
	for t.maxEntities > 0 && t.idx.n > t.maxEntities {
		t.remove(t.lruTail - 1)
		t.capEvictions++
	}
	return t, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("truncated or malformed integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errors.New("truncated or malformed integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// nonNeg reads a uvarint that must fit in a non-negative int64.
func (d *decoder) nonNeg() int64 {
	v := d.uvarint()
	if v > math.MaxInt64 {
		d.err = errors.New("value out of range")
		return 0
	}
	return int64(v)
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errors.New("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errors.New("truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (t *Table) decode(d *decoder) error {
	ns := d.uvarint()
	if d.err == nil && ns != uint64(len(t.specs)) {
		return fmt.Errorf("snapshot has %d windows, configured %d (%s); window specs cannot change across a restore", ns, len(t.specs), FormatSpecs(t.specs))
	}
	for i, sp := range t.specs {
		w, b := d.uvarint(), d.uvarint()
		if d.err == nil && (w != uint64(sp.WindowMs) || b != uint64(sp.BucketMs)) {
			return fmt.Errorf("snapshot window %d is %dms:%dms, configured %s; window specs cannot change across a restore", i, w, b, FormatSpecs(t.specs[i:i+1]))
		}
	}
	n := d.uvarint()
	// Every entity takes at least 5 bytes; bounding the count by the input keeps a
	// forged count from allocating gigabytes.
	if d.err == nil && n > uint64(len(d.b))/5 {
		return fmt.Errorf("entity count %d exceeds what %d bytes can hold", n, len(d.b))
	}
	if d.err != nil {
		return d.err
	}
	t.slab = make([]entity, 0, n)
	t.idx = newIndex(int(n))
	for range n {
		if err := t.decodeEntity(d); err != nil {
			return fmt.Errorf("entity %d: %w", len(t.slab), err)
		}
	}
	return d.err
}

func (t *Table) decodeEntity(d *decoder) error {
	idLen := d.uvarint()
	if d.err == nil && (idLen == 0 || idLen > 1<<20) {
		return fmt.Errorf("entity id length %d out of range", idLen)
	}
	// id aliases the input until the entity takes its own copy below (reallocRaw for
	// raw entities, strings.Clone otherwise): one allocation per entity fewer.
	idb := d.bytes(idLen)
	id := unsafe.String(unsafe.SliceData(idb), len(idb))
	e := entity{id: id, newest: d.varint(), prevT: d.varint()}
	shape := d.byte()
	if d.err != nil {
		return d.err
	}
	if _, _, dup := t.lookup(id); dup {
		return fmt.Errorf("entity %q appears twice", id)
	}
	if e.newest > maxTime || e.newest < -maxTime || e.prevT > maxTime || e.prevT < -maxTime {
		return fmt.Errorf("entity %q: time out of range", id)
	}
	switch shape {
	case 0:
		e.id = strings.Clone(id)
	case 1:
		if err := t.decodeRaw(d, &e); err != nil { // copies the id with the events
			return fmt.Errorf("entity %q: %w", id, err)
		}
	case 2:
		if err := t.decodeRings(d, &e); err != nil {
			return fmt.Errorf("entity %q: %w", id, err)
		}
		e.id = strings.Clone(id)
	default:
		return fmt.Errorf("entity %q: unknown shape %d", id, shape)
	}
	slot := uint32(len(t.slab))
	t.slab = append(t.slab, e)
	t.setBlob(t.insert(id, slot), &t.slab[slot])
	if t.maxEntities > 0 {
		t.lruPushFront(slot) // written least recent first
	}
	return nil
}

func (t *Table) decodeRaw(d *decoder, e *entity) error {
	n := d.uvarint()
	if d.err == nil && (n == 0 || n > rawMax) {
		return fmt.Errorf("%d raw events, want 1..%d", n, rawMax)
	}
	if d.err != nil {
		return d.err
	}
	e.reallocRaw(int(n))
	for range n {
		ev := rawEvent{t: d.varint(), a: d.nonNeg()}
		if d.err != nil {
			return d.err
		}
		if len(e.raw) > 0 && ev.t < e.raw[len(e.raw)-1].t {
			return errors.New("raw events out of order")
		}
		e.raw = append(e.raw, ev)
	}
	if e.raw[n-1].t != e.newest {
		return errors.New("newest raw event does not match the entity's newest time")
	}
	// Every raw event must still be inside some window (pruneRaw's invariant), and no
	// window's sum may overflow (Apply's invariant).
	minLo := int64(math.MaxInt64)
	for i, b := range t.bms {
		lo := (floorDiv(e.newest, b) - t.nbs[i] + 1) * b
		minLo = min(minLo, lo)
		var sum int64
		for _, ev := range e.raw {
			if ev.t >= lo {
				if sum > math.MaxInt64-ev.a {
					return errors.New("window sum overflows")
				}
				sum += ev.a
			}
		}
	}
	if e.raw[0].t < minLo {
		return errors.New("raw event outside every window")
	}
	return nil
}

func (t *Table) decodeRings(d *decoder, e *entity) error {
	rs := make([]ring, len(t.bms))
	for i, b := range t.bms {
		r := &rs[i]
		top := floorDiv(e.newest, b)
		n := d.uvarint()
		if d.err == nil && (n == 0 || n > uint64(t.nbs[i]) || n > uint64(len(d.b))/5) {
			return fmt.Errorf("window %s: %d buckets out of range", t.specs[i].Name, n)
		}
		if d.err != nil {
			return d.err
		}
		r.buf = make([]bucket, ringCap(int(n)))
		for j := range int(n) {
			bk := bucket{k: d.varint(), cnt: d.nonNeg(), sum: d.nonNeg(), min: d.nonNeg(), max: d.nonNeg()}
			if d.err != nil {
				return d.err
			}
			switch {
			case bk.k < top-t.nbs[i]+1 || bk.k > top:
				return fmt.Errorf("window %s: bucket %d outside [%d, %d]", t.specs[i].Name, bk.k, top-t.nbs[i]+1, top)
			case j > 0 && bk.k <= r.buf[j-1].k:
				return fmt.Errorf("window %s: buckets out of order", t.specs[i].Name)
			case bk.cnt == 0 || bk.min > bk.max || bk.sum < bk.max || (bk.cnt == 1 && (bk.sum != bk.min || bk.min != bk.max)):
				return fmt.Errorf("window %s: inconsistent bucket %d", t.specs[i].Name, bk.k)
			case r.sum > math.MaxInt64-bk.sum || r.cnt > math.MaxInt64-bk.cnt:
				return fmt.Errorf("window %s: totals overflow", t.specs[i].Name)
			}
			r.buf[j] = bk
			r.n++
			r.cnt += bk.cnt
			r.sum += bk.sum
		}
		if r.buf[r.n-1].k != top {
			return fmt.Errorf("window %s: newest bucket missing", t.specs[i].Name)
		}
		r.recompute()
	}
	e.rings = &rs[0]
	return nil
}
