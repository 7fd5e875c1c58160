package feature

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Extras format, version 1: everything of a State but the unfiltered table, which
// the caller snapshots itself (window.Table's stepped snapshot). Integers are
// uvarint/varint unless noted.
//
//	"VFX" 0x01                              magic and version
//	spec: nwindows, per window W ms, b ms;
//	      filters, distincts, nfeatures, per feature: name length, name, agg byte,
//	      filter+1, distinct, max exact, nwindows, window indices
//	nfiltered, per filtered table: filter bit, length, window.Table snapshot
//	per distinct count (Spec order): nentities, per entity in increasing id order:
//	  id length, id, shift byte, dropMax (varint, only when shift > 0),
//	  nvalues, per value in increasing hash order: hash (8 bytes LE), last unit (varint)
//	crc32-C of everything above, 4 bytes little endian
//
// The same state always gives the same bytes (ids and hashes sorted, filtered
// tables in their own deterministic format). Restore checks the checksum, then that
// the spec is the State's own, then every invariant a set relies on; anything else
// is an error, never a panic or a half-restored State.
const extrasMagic = "VFX\x01"

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// AppendExtras appends the State's filtered tables and distinct sets to dst, as they
// are now. Take it at the same point as the unfiltered table's snapshot (no Apply or
// EvictIdle in between), so that Restore pairs them as they were; BeginExtras does
// the same in steps. A snapshot in steps still pending is completed first.
func (s *State) AppendExtras(dst []byte) []byte {
	ps := s.BeginExtras()
	ps.Step(math.MaxInt)
	dst = ps.AppendTo(dst)
	s.EndExtras(ps)
	return dst
}

// PendingExtras is a snapshot of the extras as they were at BeginExtras, taken in
// steps while the State goes on, like window.PendingSnapshot (and beside the
// unfiltered table's): Step encodes a share of the distinct sets and of the
// filtered tables' entities, and a set the State is about to change or drop is
// encoded first, as it was (copy before write; the filtered tables do the same
// themselves). Once Step reports it complete, AppendTo gives exactly the bytes
// AppendExtras would have given at BeginExtras, and may run on another goroutine
// while the State goes on.
type PendingExtras struct {
	s     *State // nil once complete
	ft    []*window.PendingSnapshot
	bits  []uint   // filter bit of each of ft
	nd    int      // distinct counts
	kept  []uint64 // bit per set index below n0: encoded, or nothing to encode
	n0    int
	next  int
	head  []byte
	body  []byte
	spans []setSpan
}

// setSpan is one set's encoding body[start:end], of distinct count d, whose entity
// id is body[idStart:idEnd].
type setSpan struct {
	d                          int
	start, idStart, idEnd, end int
}

// BeginExtras starts a snapshot of the extras as they are now: call it where the
// unfiltered table's BeginSnapshot is called, Step it (on the State's goroutine,
// between Apply calls) until it returns true, then AppendTo, then EndExtras on the
// State's goroutine.
func (s *State) BeginExtras() *PendingExtras {
	if s.snap != nil {
		s.snap.Step(math.MaxInt)
	}
	ps := &PendingExtras{s: s, n0: len(s.sets), nd: len(s.dfs)}
	ps.head = append(ps.head, extrasMagic...)
	ps.head = appendSpec(ps.head, &s.spec)
	for i := range s.ftabs {
		ps.ft = append(ps.ft, s.ftabs[i].tbl.BeginSnapshot())
		ps.bits = append(ps.bits, s.ftabs[i].bit)
	}
	ps.kept = make([]uint64, (ps.n0+63)/64)
	for i := range s.sets {
		if set := &s.sets[i]; set.n == 0 && set.shift == 0 {
			ps.kept[i/64] |= 1 << (i % 64) // nothing to write, and a later entity's
		}
	}
	s.snap = ps
	return ps
}

// Step encodes up to budget more sets and budget more entities of each filtered
// table, and reports whether the snapshot is complete.
func (ps *PendingExtras) Step(budget int) bool {
	s := ps.s
	if s == nil {
		return true
	}
	done := true
	for _, ft := range ps.ft {
		done = ft.Step(budget) && done
	}
	for n := 0; ps.next < ps.n0 && n < budget; ps.next++ {
		if ps.kept[ps.next/64]&(1<<(ps.next%64)) == 0 {
			ps.take(ps.next)
			n++
		}
	}
	if !done || ps.next < ps.n0 {
		return false
	}
	s.snap, ps.s = nil, nil
	return true
}

// Done reports whether Step has completed the snapshot.
func (ps *PendingExtras) Done() bool { return ps.s == nil }

// keep encodes set i as it is unless the snapshot has it already: the State calls
// it before changing or releasing a set while a snapshot is in steps.
func (ps *PendingExtras) keep(i int) {
	if i < ps.n0 && ps.kept[i/64]&(1<<(i%64)) == 0 {
		ps.take(i)
	}
}

func (ps *PendingExtras) take(i int) {
	ps.kept[i/64] |= 1 << (i % 64)
	s := ps.s
	nd := len(s.dfs)
	// The slot still holds the entity it held at BeginExtras: removing that entity
	// would have called keep first.
	id, _, ok := s.base.SlotEntity(i / nd)
	if !ok {
		return
	}
	set := &s.sets[i]
	sp := setSpan{d: i % nd, start: len(ps.body)}
	ps.body = binary.AppendUvarint(ps.body, uint64(len(id)))
	sp.idStart = len(ps.body)
	ps.body = append(ps.body, id...)
	sp.idEnd = len(ps.body)
	ps.body = append(ps.body, set.shift)
	if set.shift > 0 {
		ps.body = binary.AppendVarint(ps.body, set.dropMax)
	}
	ps.body = binary.AppendUvarint(ps.body, uint64(set.n))
	// Values in increasing hash order: insertion sort of indices, a set is small.
	var order [64]uint16
	idx := order[:0]
	if set.n > 64 {
		idx = make([]uint16, 0, set.n)
	}
	for v := range int(set.n) {
		j := len(idx)
		idx = append(idx, uint16(v))
		for j > 0 && set.hash(int(idx[j-1])) > set.hash(v) {
			idx[j] = idx[j-1]
			j--
		}
		idx[j] = uint16(v)
	}
	for _, v := range idx {
		ps.body = binary.LittleEndian.AppendUint64(ps.body, set.hash(int(v)))
		ps.body = binary.AppendVarint(ps.body, set.unit(int(v)))
	}
	sp.end = len(ps.body)
	ps.spans = append(ps.spans, sp)
}

// AppendTo appends the finished snapshot. It panics if Step has not completed it.
func (ps *PendingExtras) AppendTo(dst []byte) []byte {
	if !ps.Done() {
		panic("feature: PendingExtras.AppendTo before Step completed it")
	}
	start := len(dst)
	dst = append(dst, ps.head...)
	dst = binary.AppendUvarint(dst, uint64(len(ps.ft)))
	for i, ft := range ps.ft {
		dst = binary.AppendUvarint(dst, uint64(ps.bits[i]))
		lenAt := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		dst = ft.AppendTo(dst)
		binary.LittleEndian.PutUint32(dst[lenAt:], uint32(len(dst)-lenAt-4))
	}
	body := ps.body
	slices.SortFunc(ps.spans, func(a, b setSpan) int {
		if a.d != b.d {
			return a.d - b.d
		}
		return bytes.Compare(body[a.idStart:a.idEnd], body[b.idStart:b.idEnd])
	})
	j := 0
	for d := range ps.nd {
		k := j
		for k < len(ps.spans) && ps.spans[k].d == d {
			k++
		}
		dst = binary.AppendUvarint(dst, uint64(k-j))
		for _, sp := range ps.spans[j:k] {
			dst = append(dst, body[sp.start:sp.end]...)
		}
		j = k
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
}

// EndExtras hands the filtered tables' snapshot buffers back; call it on the State's
// goroutine after AppendTo returned. A snapshot still in steps is abandoned.
func (s *State) EndExtras(ps *PendingExtras) {
	if ps == nil {
		return
	}
	if s.snap == ps {
		s.snap = nil
	}
	ps.s = nil
	for i, ft := range ps.ft {
		s.ftabs[i].tbl.EndSnapshot(ft)
	}
}

func appendSpec(dst []byte, s *Spec) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s.Windows)))
	for _, w := range s.Windows {
		dst = binary.AppendUvarint(dst, uint64(w.WindowMs))
		dst = binary.AppendUvarint(dst, uint64(w.BucketMs))
	}
	dst = binary.AppendUvarint(dst, uint64(s.Filters))
	dst = binary.AppendUvarint(dst, uint64(s.Distincts))
	dst = binary.AppendUvarint(dst, uint64(len(s.Features)))
	for i := range s.Features {
		f := &s.Features[i]
		dst = binary.AppendUvarint(dst, uint64(len(f.Name)))
		dst = append(dst, f.Name...)
		dst = append(dst, byte(f.Agg))
		dst = binary.AppendUvarint(dst, uint64(f.Filter+1))
		d, m := 0, 0
		if f.Agg == DistinctCount {
			d, m = f.Distinct, f.maxExact()
		}
		dst = binary.AppendUvarint(dst, uint64(d))
		dst = binary.AppendUvarint(dst, uint64(m))
		dst = binary.AppendUvarint(dst, uint64(len(f.Windows)))
		for _, w := range f.Windows {
			dst = binary.AppendUvarint(dst, uint64(w))
		}
	}
	return dst
}

// Restore builds a State for spec around base, the unfiltered table restored from
// the snapshot taken with extras (window.RestoreTable with the same windows and
// opts), and the extras AppendExtras gave. Entities of the extras that base does
// not hold (base trimmed them to a smaller MaxEntities cap) are dropped, as the cap
// would have dropped them. base's evict hook becomes the State's.
func Restore(spec Spec, opts window.Options, base *window.Table, extras []byte) (*State, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if !slices.Equal(base.Specs(), spec.Windows) {
		return nil, fmt.Errorf("feature extras: the unfiltered table's windows %s are not the spec's %s", window.FormatSpecs(base.Specs()), window.FormatSpecs(spec.Windows))
	}
	s, err := newState(spec, opts, base)
	if err != nil {
		return nil, err
	}
	if err := s.decode(extras); err != nil {
		base.SetEvictHook(nil)
		return nil, fmt.Errorf("feature extras: %w", err)
	}
	return s, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("truncated or malformed integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errors.New("truncated or malformed integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errors.New("truncated")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (s *State) decode(data []byte) error {
	if len(data) < len(extrasMagic)+4 {
		return errors.New("truncated")
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if string(body[:3]) != extrasMagic[:3] {
		return errors.New("not a feature extras snapshot (bad magic)")
	}
	if body[3] != extrasMagic[3] {
		return fmt.Errorf("unsupported version %d, this build reads version %d", body[3], extrasMagic[3])
	}
	if crc32.Checksum(body, crcTable) != sum {
		return errors.New("checksum mismatch (corrupt or truncated)")
	}
	r := reader{b: body[len(extrasMagic):]}
	want := appendSpec(nil, &s.spec)
	if got := r.take(uint64(len(want))); r.err != nil || string(got) != string(want) {
		return errors.New("written for a different feature spec; the definition cannot change across a restore")
	}
	nf := r.uvarint()
	if r.err == nil && nf != uint64(len(s.ftabs)) {
		return fmt.Errorf("%d filtered tables, the spec has %d", nf, len(s.ftabs))
	}
	for i := range s.ftabs {
		ft := &s.ftabs[i]
		bit := r.uvarint()
		if r.err == nil && bit != uint64(ft.bit) {
			return fmt.Errorf("filtered table %d is for filter %d, want %d", i, bit, ft.bit)
		}
		n := uint64(0)
		if b := r.take(4); b != nil {
			n = uint64(binary.LittleEndian.Uint32(b))
		}
		snap := r.take(n)
		if r.err != nil {
			return r.err
		}
		t, err := window.RestoreTable(ft.specs, s.ftOpts, snap)
		if err != nil {
			return fmt.Errorf("filter %d: %w", ft.bit, err)
		}
		// Keep the invariant: only entities the unfiltered table holds, never newer.
		var gone []string
		for slot := range t.Slots() {
			id, newest, ok := t.SlotEntity(slot)
			if !ok {
				continue
			}
			_, bn, held := s.base.Lookup(id)
			if !held {
				gone = append(gone, id)
				continue
			}
			if newest > bn {
				return fmt.Errorf("filter %d: entity %q has a newer event (%d) than in the unfiltered table (%d)", ft.bit, id, newest, bn)
			}
		}
		for _, id := range gone {
			t.Evict(id)
		}
		ft.tbl = t
	}
	nd := len(s.dfs)
	for di := range s.dfs {
		d := &s.dfs[di]
		n := r.uvarint()
		// Every entity takes at least 3 bytes: a forged count must not size anything.
		if r.err == nil && n > uint64(len(r.b))/3 {
			return fmt.Errorf("distinct %d: entity count %d exceeds what %d bytes can hold", di, n, len(r.b))
		}
		var prev []byte
		for range n {
			if err := s.decodeSet(&r, d, di, nd, &prev); err != nil {
				return fmt.Errorf("distinct count %q: %w", s.spec.Features[d.feat].Name, err)
			}
		}
		if r.err != nil {
			return r.err
		}
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%d trailing bytes", len(r.b))
	}
	return nil
}

func (s *State) decodeSet(r *reader, d *dfeat, di, nd int, prev *[]byte) error {
	idLen := r.uvarint()
	if r.err == nil && (idLen == 0 || idLen > 1<<20) {
		return fmt.Errorf("entity id length %d out of range", idLen)
	}
	id := r.take(idLen)
	shift := uint8(0)
	if b := r.take(1); b != nil {
		shift = b[0]
	}
	dropMax := int64(math.MinInt64)
	if shift > 0 {
		dropMax = r.varint()
	}
	nv := r.uvarint()
	if r.err != nil {
		return r.err
	}
	if *prev != nil && string(id) <= string(*prev) {
		return fmt.Errorf("entity %q out of order or repeated", id)
	}
	*prev = id
	if shift > 64 {
		return fmt.Errorf("entity %q: sampling shift %d out of range", id, shift)
	}
	if nv > uint64(d.maxExact) || nv > uint64(len(r.b))/9 || (nv == 0 && shift == 0) {
		return fmt.Errorf("entity %q: %d values out of range (1 … %d)", id, nv, d.maxExact)
	}
	slot, newest, held := s.base.Lookup(string(id))
	newestUnit := floorDiv(newest, d.unit)
	if shift > 0 && dropMax > newestUnit && held {
		return fmt.Errorf("entity %q: dropped value after the entity's newest event", id)
	}
	var set dset
	set.shift, set.dropMax = shift, dropMax
	var lastHash uint64
	for i := range int(nv) {
		var h uint64
		if b := r.take(8); b != nil {
			h = binary.LittleEndian.Uint64(b)
		}
		u := r.varint()
		if r.err != nil {
			return r.err
		}
		switch {
		case i > 0 && h <= lastHash:
			return fmt.Errorf("entity %q: value hashes out of order or repeated", id)
		case !sampled(h, shift):
			return fmt.Errorf("entity %q: value %016x outside its sample (shift %d)", id, h, shift)
		case held && u > newestUnit:
			return fmt.Errorf("entity %q: value counted after the entity's newest event", id)
		case u < -(1<<62) || u > 1<<62:
			return fmt.Errorf("entity %q: time out of range", id)
		}
		if i == 0 {
			set.base = u
		}
		if set.n > 0 {
			lo, hi := u, u
			for j := range int(set.n) {
				lo, hi = min(lo, set.unit(j)), max(hi, set.unit(j))
			}
			if hi-lo > math.MaxUint32 {
				return fmt.Errorf("entity %q: values further apart than a window", id)
			}
			set.fit(u, math.MinInt64) // rebase without pruning
		}
		if set.n == set.c {
			set.grow(d.maxExact)
		}
		set.buf[set.n] = h
		set.setUnit(int(set.n), u)
		set.n++
		lastHash = h
	}
	if !held {
		return nil // trimmed by the unfiltered table's cap
	}
	s.sizeSets()
	s.sets[slot*nd+di] = set
	return nil
}
