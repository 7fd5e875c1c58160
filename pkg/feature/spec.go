package feature

import (
	"errors"
	"fmt"
	"math"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Agg is a feature's aggregate. The zero value is not an aggregate, so a Feature
// left unset fails Validate instead of silently counting.
type Agg uint8

const (
	Count         Agg = iota + 1 // number of matching events in the window
	Sum                          // sum of their amounts (minor units)
	Min                          // smallest amount; null when no event matches
	Max                          // largest amount; null when no event matches
	DistinctCount                // number of distinct values of a distinct slot
)

// String names the aggregate: count, sum, min, max,
// distinct_count.
func (a Agg) String() string {
	switch a {
	case Count:
		return "count"
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	case DistinctCount:
		return "distinct_count"
	}
	return fmt.Sprintf("Agg(%d)", uint8(a))
}

// Limits of a Spec. Filters and distinct slots are bits of codec.Transaction.Ext[0].
const (
	MaxFilters   = 32
	MaxDistincts = 32
	MaxFeatures  = 256
	// DefaultMaxExact is the distinct values a distinct count keeps exactly per
	// entity when Feature.MaxExact is 0: 64 values take 768 bytes (12 each).
	DefaultMaxExact = 64
	// MaxMaxExact bounds Feature.MaxExact: memory per entity grows with it and the
	// set is scanned linearly per event.
	MaxMaxExact = 4096
)

// Feature is one declared feature: an aggregate over some of the Spec's windows.
type Feature struct {
	// Name is the output fields' prefix (<Name>_<window name>, <Name>_exact): an
	// Avro name ([A-Za-z_][A-Za-z0-9_]*), unique in the Spec.
	Name string
	Agg  Agg
	// Windows are indices into Spec.Windows, in output order, each at most once.
	Windows []int
	// Filter is -1 for every event, else the bit (0 … Spec.Filters−1) of Ext[0] that
	// says the event matched the filter; only matching events are counted.
	Filter int
	// Distinct is, for DistinctCount only, the slot j (0 … Spec.Distincts−1) whose
	// value hash is Ext[1+j], present iff bit 32+j of Ext[0] is set. Ignored otherwise.
	Distinct int
	// MaxExact is, for DistinctCount only, how many values an entity's set keeps
	// exactly (1 … MaxMaxExact; 0 = DefaultMaxExact). Ignored otherwise.
	MaxExact int
}

// Spec is a compiled feature definition: the windows, the features over them, and
// how many filter bits and distinct slots the Ext words carry.
type Spec struct {
	Windows   []window.Spec // as window.ParseSpecs returns them; the unfiltered table's windows
	Features  []Feature
	Filters   int // filter bits in use, 0 … MaxFilters
	Distincts int // distinct slots in use, 0 … MaxDistincts
}

// Words is how many codec.Transaction.Ext words a record carries for s: none
// without filters and distinct counts, else the filter/presence word and one hash
// per distinct slot.
func (s *Spec) Words() int {
	if s.Filters == 0 && s.Distincts == 0 {
		return 0
	}
	return 1 + s.Distincts
}

// Fixed output fields around the features (see AvroSchema).
var headNames = []string{"event_id", "entity_id", "event_time"}
var tailNames = []string{"ms_since_previous", "late", "source_topic", "source_partition", "source_offset"}

func avroName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// maxExact is f's effective bound.
func (f *Feature) maxExact() int {
	if f.MaxExact == 0 {
		return DefaultMaxExact
	}
	return f.MaxExact
}

// Validate reports the first problem that would make the Spec unusable: windows
// not built by window.ParseSpecs/NewSpec or repeated, limits exceeded, a feature
// name that is not an Avro name, an output field name that two features (or a fixed
// field) would share, a window index, filter bit or distinct slot out of range, a
// bad MaxExact, or a distinct count whose largest window is more than 2^31 times
// the greatest common divisor of its windows' bucket widths (its times are kept as
// 32-bit offsets in units of that divisor; split such a feature in two).
func (s *Spec) Validate() error {
	nw := len(s.Windows)
	if nw == 0 || nw > 64 {
		return fmt.Errorf("feature spec: %d windows, want 1 … 64", nw)
	}
	seenW := map[int64]bool{}
	for i, w := range s.Windows {
		want, err := window.NewSpec(w.WindowMs, w.BucketMs)
		if err != nil {
			return fmt.Errorf("feature spec: window %d: %w", i, err)
		}
		if w != want {
			return fmt.Errorf("feature spec: window %d (%+v) is inconsistent; build windows with window.ParseSpecs or window.NewSpec", i, w)
		}
		if seenW[w.WindowMs] {
			return fmt.Errorf("feature spec: window %s appears twice", w.Name)
		}
		seenW[w.WindowMs] = true
	}
	if s.Filters < 0 || s.Filters > MaxFilters {
		return fmt.Errorf("feature spec: %d filters, want 0 … %d", s.Filters, MaxFilters)
	}
	if s.Distincts < 0 || s.Distincts > MaxDistincts {
		return fmt.Errorf("feature spec: %d distinct slots, want 0 … %d", s.Distincts, MaxDistincts)
	}
	if len(s.Features) == 0 || len(s.Features) > MaxFeatures {
		return fmt.Errorf("feature spec: %d features, want 1 … %d", len(s.Features), MaxFeatures)
	}
	names := map[string]string{}
	claim := func(name, by string) error {
		if prev, dup := names[name]; dup {
			return fmt.Errorf("feature spec: output field %q of %s is also %s", name, by, prev)
		}
		names[name] = by
		return nil
	}
	for _, n := range headNames {
		names[n] = "a fixed field"
	}
	for _, n := range tailNames {
		names[n] = "a fixed field"
	}
	featNames := map[string]int{}
	for i := range s.Features {
		f := &s.Features[i]
		where := fmt.Sprintf("feature %d (%q)", i, f.Name)
		if !avroName(f.Name) {
			return fmt.Errorf("feature spec: %s: name must match [A-Za-z_][A-Za-z0-9_]*", where)
		}
		if j, dup := featNames[f.Name]; dup {
			return fmt.Errorf("feature spec: %s: name already used by feature %d", where, j)
		}
		featNames[f.Name] = i
		if f.Agg < Count || f.Agg > DistinctCount {
			return fmt.Errorf("feature spec: %s: unknown aggregate %d", where, f.Agg)
		}
		if len(f.Windows) == 0 {
			return fmt.Errorf("feature spec: %s: no windows", where)
		}
		used := make([]bool, nw)
		for _, w := range f.Windows {
			if w < 0 || w >= nw {
				return fmt.Errorf("feature spec: %s: window index %d out of range (%d windows)", where, w, nw)
			}
			if used[w] {
				return fmt.Errorf("feature spec: %s: window %s listed twice", where, s.Windows[w].Name)
			}
			used[w] = true
			if err := claim(f.Name+"_"+s.Windows[w].Name, where); err != nil {
				return err
			}
		}
		if f.Filter < -1 || f.Filter >= s.Filters {
			return fmt.Errorf("feature spec: %s: filter %d out of range (-1 or 0 … %d)", where, f.Filter, s.Filters-1)
		}
		if f.Agg != DistinctCount {
			continue
		}
		if f.Distinct < 0 || f.Distinct >= s.Distincts {
			return fmt.Errorf("feature spec: %s: distinct slot %d out of range (0 … %d)", where, f.Distinct, s.Distincts-1)
		}
		if f.MaxExact < 0 || f.MaxExact > MaxMaxExact {
			return fmt.Errorf("feature spec: %s: max exact %d out of range (0 = %d, or 1 … %d)", where, f.MaxExact, DefaultMaxExact, MaxMaxExact)
		}
		unit, wmax := unitOf(s.Windows, f.Windows)
		if wmax/unit > math.MaxInt32 {
			return fmt.Errorf("feature spec: %s: window %dms is more than 2^31 times %dms, the common divisor of its bucket widths; split the feature", where, wmax, unit)
		}
		if err := claim(f.Name+"_exact", where); err != nil {
			return err
		}
	}
	return nil
}

// unitOf returns the greatest common divisor of the bucket widths of the windows
// wins (every bucket boundary of those windows is a multiple of it) and the largest
// window length among them.
func unitOf(specs []window.Spec, wins []int) (unit, wmax int64) {
	for _, w := range wins {
		unit = gcd(unit, specs[w].BucketMs)
		wmax = max(wmax, specs[w].WindowMs)
	}
	return unit, wmax
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Column describes one feature output field in schema order (after event_id,
// entity_id and event_time, before ms_since_previous).
type Column struct {
	Name    string // <feature>_<window name> or <feature>_exact
	Feature int    // index into Spec.Features
	Window  int    // index into Spec.Windows; -1 for an _exact column
	// Kind is the field's Avro type.
	Kind ColumnKind
}

// ColumnKind is a feature field's Avro type.
type ColumnKind uint8

const (
	KindLong         ColumnKind = iota + 1 // "long": count, sum, distinct count
	KindNullableLong                       // ["null","long"]: min, max
	KindBoolean                            // "boolean": <feature>_exact
)

// Columns lists the feature fields in schema order: for each feature in Spec order
// its windows in Feature.Windows order (Row.Values and Row.Null in that order), then
// one _exact field per distinct count in Spec order (Row.Exact in that order). The
// Spec must be valid.
func (s *Spec) Columns() []Column {
	var cols []Column
	for fi := range s.Features {
		f := &s.Features[fi]
		kind := KindLong
		if f.Agg == Min || f.Agg == Max {
			kind = KindNullableLong
		}
		for _, w := range f.Windows {
			cols = append(cols, Column{Name: f.Name + "_" + s.Windows[w].Name, Feature: fi, Window: w, Kind: kind})
		}
	}
	for fi := range s.Features {
		if f := &s.Features[fi]; f.Agg == DistinctCount {
			cols = append(cols, Column{Name: f.Name + "_exact", Feature: fi, Window: -1, Kind: KindBoolean})
		}
	}
	return cols
}

// valueColumns is the number of Row.Values entries; distinctFeatures the number of
// Row.Exact entries.
func (s *Spec) valueColumns() (n int) {
	for i := range s.Features {
		n += len(s.Features[i].Windows)
	}
	return n
}

func (s *Spec) distinctFeatures() (n int) {
	for i := range s.Features {
		if s.Features[i].Agg == DistinctCount {
			n++
		}
	}
	return n
}

// Row is the features of one event, or of one read, in the Spec's column order. Make
// it with NewRow; Apply and ReadAt overwrite every entry.
type Row struct {
	// Values[c] is value column c (Columns order, _exact columns excluded).
	Values []int64
	// Null[c] is true when Values[c] is a min or max over a window no matching event
	// falls in: the field is null.
	Null []bool
	// Exact[d] is the d-th distinct count's <feature>_exact: every window of it was
	// counted exactly.
	Exact []bool
	// Base[i] is the unfiltered table's aggregates of Spec.Windows[i] (not an output
	// field; for the caller's live view and metrics).
	Base []window.Agg
}

// NewRow makes a Row sized for spec.
func NewRow(spec *Spec) *Row {
	n := spec.valueColumns()
	return &Row{
		Values: make([]int64, n),
		Null:   make([]bool, n),
		Exact:  make([]bool, spec.distinctFeatures()),
		Base:   make([]window.Agg, len(spec.Windows)),
	}
}

var errRowShape = errors.New("feature: row does not fit the spec (make it with NewRow)")

func (r *Row) fits(spec *Spec) bool {
	return r != nil && len(r.Values) == spec.valueColumns() && len(r.Null) == len(r.Values) &&
		len(r.Exact) == spec.distinctFeatures() && len(r.Base) >= len(spec.Windows)
}
