package window

import (
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
	start := len(dst)
	dst = append(dst, snapMagic...)
	dst = binary.AppendUvarint(dst, uint64(len(t.specs)))
	for _, sp := range t.specs {
		dst = binary.AppendUvarint(dst, uint64(sp.WindowMs))
		dst = binary.AppendUvarint(dst, uint64(sp.BucketMs))
	}
	dst = binary.AppendUvarint(dst, uint64(t.idx.n))
	for _, s := range t.snapshotOrder() {
		e := &t.slab[s]
		dst = binary.AppendUvarint(dst, uint64(len(e.id)))
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
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
}

func (t *Table) snapshotOrder() []uint32 {
	if t.maxEntities > 0 {
		order := make([]uint32, 0, t.idx.n)
		for s := t.lruTail; s != 0; s = t.lru[s-1].prev {
			order = append(order, s-1)
		}
		return order
	}
	order := t.usedSlots()
	slices.SortFunc(order, func(a, b uint32) int { return strings.Compare(t.slab[a].id, t.slab[b].id) })
	return order
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
