package feature

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strings"

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

// AppendExtras appends the State's filtered tables and distinct sets to dst. Take it
// at the same point as the unfiltered table's snapshot (no Apply or EvictIdle in
// between), so that Restore pairs them as they were.
func (s *State) AppendExtras(dst []byte) []byte {
	start := len(dst)
	dst = append(dst, extrasMagic...)
	dst = appendSpec(dst, &s.spec)
	dst = binary.AppendUvarint(dst, uint64(len(s.ftabs)))
	for i := range s.ftabs {
		ft := &s.ftabs[i]
		dst = binary.AppendUvarint(dst, uint64(ft.bit))
		lenAt := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		dst = ft.tbl.AppendSnapshot(dst)
		binary.LittleEndian.PutUint32(dst[lenAt:], uint32(len(dst)-lenAt-4))
	}
	nd := len(s.dfs)
	type held struct {
		id   string
		slot int
	}
	var ents []held
	var vals []int
	for di := range s.dfs {
		ents = ents[:0]
		for i := di; i < len(s.sets); i += nd {
			if set := &s.sets[i]; set.n > 0 || set.shift > 0 {
				id, _, ok := s.base.SlotEntity(i / nd)
				if ok {
					ents = append(ents, held{id, i / nd})
				}
			}
		}
		slices.SortFunc(ents, func(a, b held) int { return strings.Compare(a.id, b.id) })
		dst = binary.AppendUvarint(dst, uint64(len(ents)))
		for _, e := range ents {
			set := &s.sets[e.slot*nd+di]
			dst = binary.AppendUvarint(dst, uint64(len(e.id)))
			dst = append(dst, e.id...)
			dst = append(dst, set.shift)
			if set.shift > 0 {
				dst = binary.AppendVarint(dst, set.dropMax)
			}
			vals = vals[:0]
			for v := range int(set.n) {
				vals = append(vals, v)
			}
			slices.SortFunc(vals, func(a, b int) int {
				ha, hb := set.hash(a), set.hash(b)
				switch {
				case ha < hb:
					return -1
				case ha > hb:
					return 1
				}
				return 0
			})
			dst = binary.AppendUvarint(dst, uint64(len(vals)))
			for _, v := range vals {
				dst = binary.LittleEndian.AppendUint64(dst, set.hash(v))
				dst = binary.AppendVarint(dst, set.unit(v))
			}
		}
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
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
