package feature

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// State is one partition's feature state for a Spec: the unfiltered window.Table
// over every window, one window.Table per filter that a count, sum, min or max
// uses (over the windows those features read), and a distinct-value set per
// entity per distinct count.
//
// Invariants:
//   - Every entity of a filtered table or distinct set is an entity of the
//     unfiltered table, and its newest event in a filtered table is at or before
//     its newest in the unfiltered one: filtered tables only count events the
//     unfiltered table counted, and every removal from the unfiltered table (cap or
//     idle eviction) is mirrored through its evict hook. Hence a filtered table
//     never refuses an event the unfiltered table accepted as expired, and the
//     buckets the rule reads from it are always retained.
//   - An Apply that fails changes nothing anywhere.
type State struct {
	spec  Spec
	base  *window.Table
	ftabs []ftab
	feats []featPlan
	dfs   []dfeat
	sets  []dset // sets[slot*len(dfs)+d]: distinct count d of the entity in slot
	thr   []int64
	nv    int // value columns (Row.Values)

	snap *PendingExtras // a snapshot of the extras in steps, or nil

	ftOpts window.Options // the filtered tables' options
}

// ftab is the table of one filter bit.
type ftab struct {
	bit   uint
	specs []window.Spec
	tbl   *window.Table
	out   []window.Agg
}

// featPlan says where feature i's values come from.
type featPlan struct {
	ftab int   // -1: the unfiltered table; else index into ftabs (count … max)
	dist int   // index into dfs for a distinct count, else -1
	pos  []int // per Feature.Windows entry: index into the source's windows
	col  int   // first value column
}

// dfeat is one distinct count.
type dfeat struct {
	feat     int
	filter   int // -1 or bit
	slot     uint
	maxExact int
	unit     int64
	bms, nbs []int64 // per Feature.Windows entry
}

// NewState makes an empty State; opts apply to the unfiltered table (the cap counts
// entities there, and filtered tables follow it).
func NewState(spec Spec, opts window.Options) (*State, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	base, err := window.NewTable(spec.Windows, opts)
	if err != nil {
		return nil, fmt.Errorf("feature: %w", err)
	}
	return newState(spec, opts, base)
}

func newState(spec Spec, opts window.Options, base *window.Table) (*State, error) {
	s := &State{spec: cloneSpec(spec), base: base}
	spec = s.spec
	// Filtered tables are not capped themselves: they follow the unfiltered table's
	// cap through its evict hook.
	ftOpts := window.Options{HistoryTTLMs: opts.HistoryTTLMs}
	s.ftOpts = ftOpts
	byBit := map[int]int{}
	// Each filter's table holds the windows its features read, in Spec order.
	for _, f := range spec.Features {
		if f.Agg == DistinctCount || f.Filter < 0 {
			continue
		}
		if _, ok := byBit[f.Filter]; !ok {
			byBit[f.Filter] = len(s.ftabs)
			s.ftabs = append(s.ftabs, ftab{bit: uint(f.Filter)})
		}
	}
	for i := range s.ftabs {
		ft := &s.ftabs[i]
		var used []bool = make([]bool, len(spec.Windows))
		for _, f := range spec.Features {
			if f.Agg != DistinctCount && f.Filter == int(ft.bit) {
				for _, w := range f.Windows {
					used[w] = true
				}
			}
		}
		for w, u := range used {
			if u {
				ft.specs = append(ft.specs, spec.Windows[w])
			}
		}
		t, err := window.NewTable(ft.specs, ftOpts)
		if err != nil {
			return nil, fmt.Errorf("feature: filter %d table: %w", ft.bit, err)
		}
		ft.tbl = t
		ft.out = make([]window.Agg, len(ft.specs))
	}
	col := 0
	for fi, f := range spec.Features {
		p := featPlan{ftab: -1, dist: -1, col: col}
		col += len(f.Windows)
		switch {
		case f.Agg == DistinctCount:
			d := dfeat{feat: fi, filter: f.Filter, slot: uint(f.Distinct), maxExact: f.maxExact()}
			d.unit, _ = unitOf(spec.Windows, f.Windows)
			for _, w := range f.Windows {
				d.bms = append(d.bms, spec.Windows[w].BucketMs)
				d.nbs = append(d.nbs, int64(spec.Windows[w].Buckets))
			}
			p.dist = len(s.dfs)
			s.dfs = append(s.dfs, d)
		case f.Filter >= 0:
			p.ftab = byBit[f.Filter]
			for _, w := range f.Windows {
				p.pos = append(p.pos, slices.IndexFunc(s.ftabs[p.ftab].specs, func(sp window.Spec) bool { return sp == spec.Windows[w] }))
			}
		default:
			p.pos = slices.Clone(f.Windows)
		}
		s.feats = append(s.feats, p)
	}
	s.thr = make([]int64, len(spec.Windows))
	s.nv = spec.valueColumns()
	if len(s.ftabs) > 0 || len(s.dfs) > 0 {
		base.SetEvictHook(s.evicted)
	}
	return s, nil
}

func cloneSpec(s Spec) Spec {
	c := Spec{Windows: slices.Clone(s.Windows), Features: slices.Clone(s.Features), Filters: s.Filters, Distincts: s.Distincts}
	for i := range c.Features {
		c.Features[i].Windows = slices.Clone(c.Features[i].Windows)
	}
	return c
}

// Spec returns the State's spec (shared; do not modify).
func (s *State) Spec() *Spec { return &s.spec }

// Table is the unfiltered table: the pipeline's prefetch hints, ms_since_previous,
// entity counts and stepped snapshot use it. Its evict hook belongs to the State.
// Do not Apply to it or EvictIdle it directly (use the State's): the filtered
// tables and sets would miss the event or keep history the table dropped.
func (s *State) Table() *window.Table { return s.base }

// evicted mirrors a removal from the unfiltered table (its evict hook).
func (s *State) evicted(entity string, slot int) {
	for i := range s.ftabs {
		s.ftabs[i].tbl.Evict(entity)
	}
	if nd := len(s.dfs); nd > 0 && (slot+1)*nd <= len(s.sets) {
		for d := range nd {
			if s.snap != nil {
				s.snap.keep(slot*nd + d) // copy before write
			}
			s.sets[slot*nd+d].release()
		}
	}
}

// ErrInternal wraps a failure the State's invariants rule out (a filtered table
// refusing an event the unfiltered table counted). It means a bug, and the State
// may then be inconsistent.
var ErrInternal = errors.New("feature: internal inconsistency")

// Apply counts one event for entity at eventTime (ms) with amount (minor units,
// ≥ 0) and ext (codec.Transaction.Ext: filter bits and distinct hashes), and writes
// its features into row (made by NewRow for this State's Spec). It returns
// window.Table.Apply's prevGap and hasPrev from the unfiltered table, and its
// errors (wrapping window.ErrExpired, ErrOverflow or ErrInput); the unfiltered
// table alone decides acceptance. An overflow in a filtered table also refuses the
// event (ErrOverflow). On error nothing changes and row is unspecified.
func (s *State) Apply(entity string, eventTime, amount int64, ext []uint64, row *Row) (prevGap int64, hasPrev bool, err error) {
	if row == nil || len(row.Values) != s.nv || len(row.Null) != s.nv || len(row.Exact) != len(s.dfs) || len(row.Base) < len(s.spec.Windows) {
		return 0, false, fmt.Errorf("%w: %w", window.ErrInput, errRowShape)
	}
	if len(s.ftabs) == 0 && len(s.dfs) == 0 {
		prevGap, hasPrev, err = s.base.Apply(entity, eventTime, amount, row.Base)
		if err == nil {
			s.fill(row)
		}
		return prevGap, hasPrev, err
	}
	var e0 uint64
	if len(ext) > 0 {
		e0 = ext[0]
	}
	for i := range s.dfs {
		if j := s.dfs[i].slot; e0&(1<<(32+j)) != 0 && len(ext) <= int(1+j) {
			return 0, false, fmt.Errorf("%w: ext has %d words, distinct slot %d needs %d", window.ErrInput, len(ext), j, j+2)
		}
	}
	slot, newest, known := s.base.Lookup(entity)
	older := known && eventTime < newest
	if older {
		// An older event may overflow a filtered table whose retained window differs
		// from the unfiltered one's: refuse it before anything counts it.
		if err := s.checkOlder(entity, eventTime, amount, e0); err != nil {
			return 0, false, err
		}
	}
	prevGap, hasPrev, err = s.base.Apply(entity, eventTime, amount, row.Base)
	if err != nil {
		return 0, false, err
	}
	top := eventTime
	if older {
		top = newest
	}
	for i := range s.ftabs {
		ft := &s.ftabs[i]
		if e0&(1<<ft.bit) != 0 {
			if _, _, err := ft.tbl.Apply(entity, eventTime, amount, ft.out); err != nil {
				return prevGap, hasPrev, fmt.Errorf("%w: filter %d: %w", ErrInternal, ft.bit, err)
			}
			if !older {
				continue // an in-order event reads buckets k−N+1 … k, Apply's own range
			}
		}
		if _, err := ft.tbl.ReadClipped(entity, eventTime, top, ft.out); err != nil {
			return prevGap, hasPrev, fmt.Errorf("%w: filter %d: %w", ErrInternal, ft.bit, err)
		}
	}
	if len(s.dfs) > 0 {
		if !known {
			slot, _, _ = s.base.Lookup(entity) // a new entity has a slot only now
		}
		s.applyDistinct(slot, eventTime, top, ext, e0, row)
	}
	s.fill(row)
	return prevGap, hasPrev, nil
}

func (s *State) checkOlder(entity string, eventTime, amount int64, e0 uint64) error {
	any := false
	for i := range s.ftabs {
		any = any || e0&(1<<s.ftabs[i].bit) != 0
	}
	if !any {
		return nil
	}
	if err := s.base.Check(entity, eventTime, amount); err != nil {
		return err
	}
	for i := range s.ftabs {
		if ft := &s.ftabs[i]; e0&(1<<ft.bit) != 0 {
			if err := ft.tbl.Check(entity, eventTime, amount); err != nil {
				return fmt.Errorf("filter %d: %w", ft.bit, err)
			}
		}
	}
	return nil
}

// sizeSets makes sets cover every slot of the unfiltered table.
func (s *State) sizeSets() {
	if need := s.base.Slots() * len(s.dfs); need > len(s.sets) {
		s.sets = slices.Grow(s.sets, need-len(s.sets))[:need]
	}
}

func (s *State) applyDistinct(slot int, eventTime, top int64, ext []uint64, e0 uint64, row *Row) {
	s.sizeSets()
	nd := len(s.dfs)
	for di := range s.dfs {
		d := &s.dfs[di]
		set := &s.sets[slot*nd+di]
		lo := int64(math.MaxInt64) // prune point: the lowest bucket start any accepted event can read
		thr := s.thr[:len(d.bms)]
		for w, b := range d.bms {
			k, kt := floorDiv(eventTime, b), floorDiv(top, b)
			thr[w] = (max(k, kt) - d.nbs[w] + 1) * (b / d.unit)
			lo = min(lo, (kt-d.nbs[w]+1)*(b/d.unit))
		}
		if (d.filter < 0 || e0&(1<<uint(d.filter)) != 0) && e0&(1<<(32+d.slot)) != 0 {
			if s.snap != nil {
				s.snap.keep(slot*nd + di) // copy before write
			}
			set.add(ext[1+d.slot], floorDiv(eventTime, d.unit), lo, d.maxExact)
		}
		p := &s.feats[d.feat]
		row.Exact[di] = set.count(thr, row.Values[p.col:p.col+len(thr)])
	}
}

// fill writes the count/sum/min/max columns from the tables' outputs. The switch
// is per feature, not per column: this loop is most of what the State adds to the
// unfiltered table's Apply for a definition without filters or distinct counts.
func (s *State) fill(row *Row) {
	for fi := range s.feats {
		p := &s.feats[fi]
		vals := row.Values[p.col : p.col+len(p.pos)]
		null := row.Null[p.col : p.col+len(p.pos)]
		if p.dist >= 0 {
			clear(null)
			continue
		}
		src := row.Base
		if p.ftab >= 0 {
			src = s.ftabs[p.ftab].out
		}
		switch s.spec.Features[fi].Agg {
		case Count:
			clear(null)
			for j, w := range p.pos {
				vals[j] = src[w].Count
			}
		case Sum:
			clear(null)
			for j, w := range p.pos {
				vals[j] = src[w].Sum
			}
		case Min:
			for j, w := range p.pos {
				a := &src[w]
				vals[j], null[j] = a.Min, a.Count == 0
			}
		case Max:
			for j, w := range p.pos {
				a := &src[w]
				vals[j], null[j] = a.Max, a.Count == 0
			}
		}
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// EvictIdle runs window.Table.EvictIdle(watermark) on the unfiltered table (whose
// removals the filtered tables and sets mirror) and on every filtered table, and
// drops the distinct values no event at or after watermark can count; it returns
// how many entities the unfiltered table evicted. The same caveat as the table's
// holds: pass a watermark lowered by how far back late events are still applied.
func (s *State) EvictIdle(watermark int64) int {
	n := s.base.EvictIdle(watermark)
	for i := range s.ftabs {
		s.ftabs[i].tbl.EvictIdle(watermark)
	}
	nd := len(s.dfs)
	if nd == 0 {
		return n
	}
	for di := range s.dfs {
		d := &s.dfs[di]
		lo := int64(math.MaxInt64)
		for w, b := range d.bms {
			lo = min(lo, (floorDiv(watermark, b)-d.nbs[w]+1)*(b/d.unit))
		}
		for i := di; i < len(s.sets); i += nd {
			set := &s.sets[i]
			if set.buf == nil {
				continue
			}
			if s.snap != nil {
				s.snap.keep(i) // copy before write
			}
			set.prune(lo)
			if set.n == 0 && set.shift == 0 {
				set.release()
			}
		}
	}
	return n
}

// ReadAt writes into row the features of entity at asOf without counting anything,
// as window.Table.ReadAt reads the unfiltered table (whose newest time and known it
// returns, and whose errors, such as window.ErrNotRetained, it passes on): every
// window ends at asOf's bucket, and a distinct count counts the values last counted
// at or after the window's first bucket. An unknown entity gives a row of zeros
// (min/max null, exact true).
func (s *State) ReadAt(entity string, asOf int64, row *Row) (newest int64, known bool, err error) {
	if !row.fits(&s.spec) {
		return 0, false, fmt.Errorf("%w: %w", window.ErrInput, errRowShape)
	}
	newest, known, err = s.base.ReadAt(entity, asOf, row.Base)
	if err != nil {
		return newest, known, err
	}
	for i := range s.ftabs {
		ft := &s.ftabs[i]
		if _, _, err := ft.tbl.ReadAt(entity, asOf, ft.out); err != nil {
			return newest, known, fmt.Errorf("%w: filter %d: %w", ErrInternal, ft.bit, err)
		}
	}
	slot, _, _ := s.base.Lookup(entity)
	nd := len(s.dfs)
	for di := range s.dfs {
		d := &s.dfs[di]
		p := &s.feats[d.feat]
		vals := row.Values[p.col : p.col+len(d.bms)]
		if !known || (slot+1)*nd > len(s.sets) {
			clear(vals)
			row.Exact[di] = true
			continue
		}
		thr := s.thr[:len(d.bms)]
		for w, b := range d.bms {
			thr[w] = (floorDiv(asOf, b) - d.nbs[w] + 1) * (b / d.unit)
		}
		row.Exact[di] = s.sets[slot*nd+di].count(thr, vals)
	}
	s.fill(row)
	return newest, known, nil
}
