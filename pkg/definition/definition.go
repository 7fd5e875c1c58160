package definition

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"
	"go.yaml.in/yaml/v3"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Bounds a definition must stay within. MaxFilters and MaxDistincts come from
// the layout of codec.Transaction.Ext (32 filter bits and 32 presence bits in
// Ext[0]); the others bound per-record work and are far above any real need.
const (
	MaxFilters         = 32
	MaxDistincts       = 32
	MaxFeatures        = 256
	MaxPredicates      = 16   // per filter
	MaxSetValues       = 1024 // per in / not_in list
	MaxPaths           = 64   // distinct field paths read per record
	MaxPathDepth       = 16
	DefaultMaxExact    = 64
	MaxMaxExact        = 4096
	MaxAmountExponent  = 18
	maxDefinitionBytes = 1 << 20
	// MaxGroups bounds the re-keyed groups of one definition: each is a
	// repartition topic and a second stage per input partition
	// (docs/repartition.md), and its words travel with every transaction.
	MaxGroups = 8
)

// DefaultGroup is the name of the in-place group (the top-level features, kept
// per input.entity_id) when the definition does not set group.
const DefaultGroup = "entity"

// Agg is a feature's aggregate. The order matches pkg/feature's Agg.
type Agg uint8

const (
	AggCount Agg = iota
	AggSum
	AggMin
	AggMax
	AggDistinctCount
)

var aggNames = [...]string{"count", "sum", "min", "max", "distinct_count"}

func (a Agg) String() string {
	if int(a) < len(aggNames) {
		return aggNames[a]
	}
	return "agg(" + strconv.Itoa(int(a)) + ")"
}

// Rounding is the opt-in rule that turns a float or double amount into minor
// units. RoundNone (the zero value) refuses float and double amounts.
type Rounding uint8

const (
	RoundNone Rounding = iota
	// RoundHalfEven rounds the shortest decimal that reads back as the same
	// binary value to the nearest minor unit, ties to even.
	RoundHalfEven
	// RoundHalfAwayFromZero is the same with ties away from zero.
	RoundHalfAwayFromZero
)

var roundingNames = map[string]Rounding{"half_even": RoundHalfEven, "half_away_from_zero": RoundHalfAwayFromZero}

func (r Rounding) String() string {
	for k, v := range roundingNames {
		if v == r {
			return k
		}
	}
	return "none"
}

// Op is a predicate's comparison.
type Op uint8

const (
	OpEq Op = iota
	OpNe
	OpIn
	OpNotIn
	OpLt
	OpLe
	OpGt
	OpGe
	OpIsNull
)

var opNames = [...]string{"eq", "ne", "in", "not_in", "lt", "le", "gt", "ge", "is_null"}

func (o Op) String() string { return opNames[o] }

// Literal is one constant of a predicate as written. Its meaning (string,
// number, boolean, enum symbol) depends on the field's type in the writer
// schema, so it is interpreted by Compile; Text is the source text, which keeps
// a decimal such as 100.10 exact.
type Literal struct {
	Text string
	Tag  string // YAML short tag: !!str, !!int, !!float, !!bool
	pos  pos
}

// Predicate is one condition on one field. A null or absent field satisfies
// no predicate except is_null: true.
type Predicate struct {
	Field  string
	Op     Op
	Values []Literal // one for eq, ne, lt, le, gt, ge; the set for in and not_in
	IsNull bool      // is_null only: true matches null, false matches present
	pos    pos
	label  string // where it was written, such as features[2].where[0]
}

// Filter is an AND of predicates. Features with the same predicates (in any
// order) share one filter and so one bit of Ext[0].
type Filter struct {
	Predicates []Predicate
	key        string // canonical form, for sharing and the definition hash
}

// Feature is one declared feature. Its indices are into its own group's
// lists: Definition.Windows, Filters and Distincts for a top-level feature,
// the Group's for a re-keyed group's feature.
type Feature struct {
	Name     string
	Agg      Agg
	Windows  []int  // indices into the group's Windows, in output order
	Field    string // distinct_count only: the counted field's path
	Filter   int    // -1, or the index into the group's Filters (= bit in its Ext[0])
	Distinct int    // distinct_count only: the index into the group's Distincts; else -1
	MaxExact int    // distinct_count only: values counted exactly per entity
	pos      pos
	label    string // features[i], groups[g].features[i]
	fieldPos pos    // where field was written
}

// Input maps the writer schema's fields onto a transaction.
type Input struct {
	Schema    string // the writer schema file as written, relative to the definition; "" when none
	EventID   string // path of the event id (string, bytes, int or long)
	EntityID  string // path of the entity key (string, bytes, int or long)
	EventTime string // path of the event time (long ms, timestamp-millis, timestamp-micros)
	Amount    string // path of the amount; "" when no feature needs one (amount 0)
	// AmountExponent is the number of minor units per major unit as a power
	// of ten (2 for cents). Required for decimal, float and double amounts,
	// refused for int and long ones (already minor units).
	AmountExponent    int
	HasAmountExponent bool
	DoubleRounding    Rounding

	pos map[string]pos // where each key was written, for Compile's errors
}

// Definition is a parsed and validated feature definition file.
//
// Windows, Features, Filters and Distincts are the in-place group's: kept per
// input.entity_id, the key the input topic is partitioned by. Groups are the
// re-keyed groups, each kept per its own key and computed by a second stage
// fed through a repartition topic (docs/repartition.md).
type Definition struct {
	File      string // the name given to Parse, used in every error
	Version   string // the optional label
	Group     string // the in-place group's name; DefaultGroup unless the file sets group
	Input     Input
	Windows   []window.Spec
	Features  []Feature
	Filters   []Filter // in bit order
	Distincts []string // distinct slots' field paths, in slot order
	Groups    []Group  // the re-keyed groups, in the file's order; nil without groups
}

// Group is one re-keyed group: features kept per the value of Key instead of
// input.entity_id. Its windows, filters and distinct slots are its own, so its
// filter bits and distinct slots are numbered from 0 and its words
// (codec.GroupValues.Ext) are laid out for its own Spec exactly as
// codec.Transaction.Ext is for the in-place group's.
type Group struct {
	Name      string        // matches ^[a-z][a-z0-9_]{0,31}$; unique among the groups and Definition.Group
	Key       string        // path of the group's key: a string, bytes, int or long
	Windows   []window.Spec // the group's windows; its features index them
	Features  []Feature
	Filters   []Filter // in bit order
	Distincts []string // distinct slots' field paths, in slot order

	label  string // groups[i]
	keyPos pos    // where key was written
}

// pos is where a node was written, for errors.
type pos struct{ line, col int }

// Error is a definition error located in the file. Its text is
// "file:line: field: what".
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Msg)
	return b.String()
}

// LoadFile reads and parses a definition file.
func LoadFile(path string) (*Definition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("feature definition: %w", err)
	}
	return Parse(path, data)
}

// SchemaFile is the path of the input schema file, resolved against the
// directory of the definition file; "" when the definition names none.
func (d *Definition) SchemaFile() string {
	if d.Input.Schema == "" || filepath.IsAbs(d.Input.Schema) {
		return d.Input.Schema
	}
	return filepath.Join(filepath.Dir(d.File), d.Input.Schema)
}

// Parse reads a definition in YAML or JSON (JSON is read as YAML, of which it
// is a subset). name is used in errors. Unknown keys, duplicate keys, anchors
// and aliases, and anything the rules in docs/features.md refuse are errors.
func Parse(name string, data []byte) (*Definition, error) {
	if len(data) > maxDefinitionBytes {
		return nil, &Error{File: name, Msg: fmt.Sprintf("file is %d bytes, more than the limit of %d", len(data), maxDefinitionBytes)}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{File: name, Msg: "empty file; a definition needs input, windows and features"}
		}
		return nil, &Error{File: name, Msg: "not YAML or JSON: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &Error{File: name, Line: extra.Line, Msg: "more than one YAML document; a definition is one"}
	}
	p := &parser{file: name}
	d, err := p.definition(&doc)
	if err != nil {
		return nil, err
	}
	return d, nil
}

type parser struct {
	file string
}

func (p *parser) errf(n *yaml.Node, field, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// mapping checks that n is a mapping whose keys are all in allowed, each once,
// and returns key → value node.
func (p *parser) mapping(n *yaml.Node, field string, allowed ...string) (map[string]*yaml.Node, error) {
	if err := p.noAlias(n, field); err != nil {
		return nil, err
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.errf(n, field, "want a mapping, got %s", kindName(n))
	}
	vals := make(map[string]*yaml.Node, len(n.Content)/2)
	keys := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, p.errf(k, field, "keys must be plain names")
		}
		kf := join(field, k.Value)
		if !contains(allowed, k.Value) {
			return nil, p.errf(k, kf, "unknown key; allowed here: %s", strings.Join(allowed, ", "))
		}
		if prev, dup := keys[k.Value]; dup {
			return nil, p.errf(k, kf, "duplicate key (first at line %d)", prev.Line)
		}
		if err := p.noAlias(v, kf); err != nil {
			return nil, err
		}
		vals[k.Value], keys[k.Value] = v, k
	}
	return vals, nil
}

func (p *parser) noAlias(n *yaml.Node, field string) error {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return p.errf(n, field, "anchors and aliases are not supported; write the value out")
	}
	return nil
}

func (p *parser) seq(n *yaml.Node, field string) ([]*yaml.Node, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, p.errf(n, field, "want a list, got %s", kindName(n))
	}
	for i, c := range n.Content {
		if err := p.noAlias(c, index(field, i)); err != nil {
			return nil, err
		}
	}
	return n.Content, nil
}

func (p *parser) scalar(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return "", p.errf(n, field, "want a value, got %s", kindName(n))
	}
	return n.Value, nil
}

func (p *parser) int(n *yaml.Node, field string, lo, hi int) (int, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return 0, p.errf(n, field, "want a whole number, got %s", kindName(n))
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil || v < int64(lo) || v > int64(hi) {
		return 0, p.errf(n, field, "%s is not a whole number in %d..%d", n.Value, lo, hi)
	}
	return int(v), nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "null"
		}
		return strconv.Quote(n.Value)
	}
	return "nothing"
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

func index(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (p *parser) definition(doc *yaml.Node) (*Definition, error) {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, p.errf(doc, "", "empty file; a definition needs input, windows and features")
	}
	root := doc.Content[0]
	top, err := p.mapping(root, "", "version", "input", "windows", "features", "group", "groups")
	if err != nil {
		return nil, err
	}
	d := &Definition{File: p.file, Group: DefaultGroup}
	for _, req := range []string{"input", "windows", "features"} {
		if top[req] == nil {
			return nil, p.errf(root, req, "missing; a definition needs input, windows and features")
		}
	}
	if v := top["version"]; v != nil {
		if d.Version, err = p.scalar(v, "version"); err != nil {
			return nil, err
		}
		if len(d.Version) > 128 {
			return nil, p.errf(v, "version", "longer than 128 bytes")
		}
	}
	if v := top["group"]; v != nil {
		if d.Group, err = p.groupName(v, "group"); err != nil {
			return nil, err
		}
	}
	if err := p.input(top["input"], &d.Input); err != nil {
		return nil, err
	}
	if d.Windows, err = p.windows(top["windows"], "windows"); err != nil {
		return nil, err
	}
	b := block{windows: d.Windows}
	if err := p.features(top["features"], "features", &b, d.Input.Amount != ""); err != nil {
		return nil, err
	}
	d.Features, d.Filters, d.Distincts = b.features, b.filters, b.distincts
	if paths := d.paths(); len(paths) > MaxPaths {
		return nil, p.errf(top["features"], "features", "the definition reads %d fields per record, more than %d", len(paths), MaxPaths)
	}
	if v := top["groups"]; v != nil {
		if err := p.groups(v, d, top["group"]); err != nil {
			return nil, err
		}
		// One decoder reads every group's fields from each record.
		if paths := d.paths(); len(paths) > MaxPaths {
			return nil, p.errf(v, "groups", "the definition reads %d fields per record (all groups together), more than %d", len(paths), MaxPaths)
		}
	}
	return d, nil
}

// groupNameRule is the rule for group names: they become parts of topic
// names, file names and metric labels, so they are short and plain.
var groupNameRule = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

func (p *parser) groupName(n *yaml.Node, field string) (string, error) {
	s, err := p.scalar(n, field)
	if err != nil {
		return "", err
	}
	if !groupNameRule.MatchString(s) {
		return "", p.errf(n, field, "%q is not a group name: a lowercase letter, then lowercase letters, digits and _, at most 32 in all", s)
	}
	return s, nil
}

// groups parses the re-keyed groups. groupNode is the top-level group key's
// value, nil when the in-place group has the default name.
func (p *parser) groups(n *yaml.Node, d *Definition, groupNode *yaml.Node) error {
	items, err := p.seq(n, "groups")
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return p.errf(n, "groups", "empty; leave groups out when every feature is kept per input.entity_id")
	}
	if len(items) > MaxGroups {
		return p.errf(n, "groups", "%d groups, at most %d are supported", len(items), MaxGroups)
	}
	names := map[string]int{}
	keys := map[string]int{}
	for i, it := range items {
		field := index("groups", i)
		m, err := p.mapping(it, field, "name", "key", "windows", "features")
		if err != nil {
			return err
		}
		for _, req := range []string{"name", "key", "windows", "features"} {
			if m[req] == nil {
				return p.errf(it, field+"."+req, "missing; a group has a name, a key, windows and features")
			}
		}
		g := Group{label: field, keyPos: pos{m["key"].Line, m["key"].Column}}
		if g.Name, err = p.groupName(m["name"], field+".name"); err != nil {
			return err
		}
		switch prev, dup := names[g.Name]; {
		case g.Name == d.Group && groupNode != nil:
			return p.errf(m["name"], field+".name", "%s is the in-place group's name (group: at line %d); every group needs its own", g.Name, groupNode.Line)
		case g.Name == d.Group:
			return p.errf(m["name"], field+".name", "%s is the in-place group's name (the default of group:); name this group otherwise, or set group:", g.Name)
		case dup:
			return p.errf(m["name"], field+".name", "group %s already declared at line %d", g.Name, prev)
		}
		names[g.Name] = m["name"].Line
		if g.Key, err = p.path(m["key"], field+".key"); err != nil {
			return err
		}
		if g.Key == d.Input.EntityID {
			return p.errf(m["key"], field+".key", "%s is input.entity_id, whose features are the in-place group's (the top-level features); a re-keyed group needs another key", g.Key)
		}
		if prev, dup := keys[g.Key]; dup {
			return p.errf(m["key"], field+".key", "%s is already the key of %s; features with one key belong in one group", g.Key, d.Groups[prev].label)
		}
		keys[g.Key] = i
		if g.Windows, err = p.windows(m["windows"], field+".windows"); err != nil {
			return err
		}
		b := block{windows: g.Windows}
		if err := p.features(m["features"], field+".features", &b, d.Input.Amount != ""); err != nil {
			return err
		}
		g.Features, g.Filters, g.Distincts = b.features, b.filters, b.distincts
		d.Groups = append(d.Groups, g)
	}
	return nil
}

func (p *parser) input(n *yaml.Node, in *Input) error {
	m, err := p.mapping(n, "input", "schema", "event_id", "entity_id", "event_time", "amount", "amount_exponent", "double_rounding")
	if err != nil {
		return err
	}
	in.pos = map[string]pos{}
	for k, v := range m {
		in.pos[k] = pos{v.Line, v.Column}
	}
	for _, req := range []string{"event_id", "entity_id", "event_time"} {
		if m[req] == nil {
			return p.errf(n, "input."+req, "missing; give the dot path of the field in the writer schema")
		}
	}
	paths := []struct {
		key string
		dst *string
	}{{"event_id", &in.EventID}, {"entity_id", &in.EntityID}, {"event_time", &in.EventTime}, {"amount", &in.Amount}}
	for _, f := range paths {
		v := m[f.key]
		if v == nil {
			continue
		}
		if *f.dst, err = p.path(v, "input."+f.key); err != nil {
			return err
		}
	}
	if v := m["schema"]; v != nil {
		if in.Schema, err = p.scalar(v, "input.schema"); err != nil {
			return err
		}
	}
	if v := m["amount_exponent"]; v != nil {
		if in.AmountExponent, err = p.int(v, "input.amount_exponent", 0, MaxAmountExponent); err != nil {
			return err
		}
		in.HasAmountExponent = true
	}
	if v := m["double_rounding"]; v != nil {
		s, err := p.scalar(v, "input.double_rounding")
		if err != nil {
			return err
		}
		r, ok := roundingNames[s]
		if !ok {
			return p.errf(v, "input.double_rounding", "%q is not a rounding rule; use half_even or half_away_from_zero", s)
		}
		in.DoubleRounding = r
	}
	if in.Amount == "" && (in.HasAmountExponent || in.DoubleRounding != RoundNone) {
		return p.errf(n, "input.amount", "missing, but amount_exponent or double_rounding is set")
	}
	return nil
}

// avroName is the Avro rule for names: a path segment and a feature name.
var avroName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (p *parser) path(n *yaml.Node, field string) (string, error) {
	s, err := p.scalar(n, field)
	if err != nil {
		return "", err
	}
	segs := strings.Split(s, ".")
	if len(segs) > MaxPathDepth {
		return "", p.errf(n, field, "path %q is %d fields deep, more than %d", s, len(segs), MaxPathDepth)
	}
	for _, seg := range segs {
		if !avroName.MatchString(seg) {
			return "", p.errf(n, field, "%q is not a dot path of Avro field names (such as card.id)", s)
		}
	}
	return s, nil
}

func (p *parser) windows(n *yaml.Node, field string) ([]window.Spec, error) {
	items, err := p.seq(n, field)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, p.errf(n, field, "empty; give at least one W:b such as 1h:1m")
	}
	if len(items) > 64 {
		return nil, p.errf(n, field, "%d windows, at most 64 are supported", len(items))
	}
	var out []window.Spec
	seen := map[string]int{}
	for i, it := range items {
		f := index(field, i)
		s, err := p.scalar(it, f)
		if err != nil {
			return nil, err
		}
		if strings.Contains(s, ",") {
			return nil, p.errf(it, f, "one W:b per list entry, not %q", s)
		}
		specs, err := window.ParseSpecs(s)
		if err != nil {
			return nil, p.errf(it, f, "%v", err)
		}
		sp := specs[0]
		if prev, dup := seen[sp.Name]; dup {
			return nil, p.errf(it, f, "window length %s already given at line %d; each length may appear once (features name windows by length)", sp.Name, prev)
		}
		seen[sp.Name] = it.Line
		out = append(out, sp)
	}
	return out, nil
}

// block is what one group declares: its windows and features, and the
// filters and distinct slots its features share. The in-place group and each
// re-keyed group are parsed into one, so that their rules cannot drift apart.
type block struct {
	windows   []window.Spec
	features  []Feature
	filters   []Filter
	distincts []string
}

// reservedOutputs are the output record's fixed fields; no feature output may
// take their names.
var reservedOutputs = []string{"event_id", "entity_id", "event_time", "ms_since_previous", "late", "source_topic", "source_partition", "source_offset"}

// features parses a list of features into b, whose windows are set. field
// is where the list is ("features", "groups[1].features"); amount is whether
// input.amount is mapped.
func (p *parser) features(n *yaml.Node, field string, b *block, amount bool) error {
	items, err := p.seq(n, field)
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return p.errf(n, field, "empty; declare at least one feature")
	}
	if len(items) > MaxFeatures {
		return p.errf(n, field, "%d features, at most %d are supported", len(items), MaxFeatures)
	}
	// Output names are <feature>_<window> and <feature>_exact; window names
	// end in a unit and feature names are unique, so they cannot collide
	// today. The check stays so that a change to either naming rule cannot
	// produce an output schema with two fields of one name.
	outputs := map[string]string{}
	for _, r := range reservedOutputs {
		outputs[r] = "a fixed output field"
	}
	filters := map[string]int{}
	distincts := map[string]int{}
	for i, it := range items {
		f, err := p.feature(it, index(field, i), b, amount, filters, distincts)
		if err != nil {
			return err
		}
		names := make([]string, 0, len(f.Windows)+1)
		for _, w := range f.Windows {
			names = append(names, f.Name+"_"+b.windows[w].Name)
		}
		if f.Agg == AggDistinctCount {
			names = append(names, f.Name+"_exact")
		}
		for _, o := range names {
			if by, clash := outputs[o]; clash {
				return p.errf(it, index(field, i)+".name", "output field %s would clash with %s; rename the feature", o, by)
			}
			outputs[o] = "an output of feature " + f.Name
		}
		b.features = append(b.features, f)
	}
	return nil
}

func (p *parser) feature(n *yaml.Node, field string, b *block, amount bool, filters, distincts map[string]int) (Feature, error) {
	m, err := p.mapping(n, field, "name", "agg", "windows", "field", "where", "max_exact")
	if err != nil {
		return Feature{}, err
	}
	f := Feature{Filter: -1, Distinct: -1, pos: pos{n.Line, n.Column}, label: field}
	for _, req := range []string{"name", "agg", "windows"} {
		if m[req] == nil {
			return f, p.errf(n, field+"."+req, "missing")
		}
	}
	if f.Name, err = p.scalar(m["name"], field+".name"); err != nil {
		return f, err
	}
	if !avroName.MatchString(f.Name) || len(f.Name) > 100 {
		return f, p.errf(m["name"], field+".name", "%q is not a valid name: letters, digits and _, not starting with a digit, at most 100", f.Name)
	}
	for _, prev := range b.features {
		if prev.Name == f.Name {
			return f, p.errf(m["name"], field+".name", "feature %s already declared at line %d", f.Name, prev.pos.line)
		}
	}
	agg, err := p.scalar(m["agg"], field+".agg")
	if err != nil {
		return f, err
	}
	found := false
	for i, a := range aggNames {
		if a == agg {
			f.Agg, found = Agg(i), true
		}
	}
	if !found {
		return f, p.errf(m["agg"], field+".agg", "%q is not an aggregate; use one of %s", agg, strings.Join(aggNames[:], ", "))
	}
	wins, err := p.seq(m["windows"], field+".windows")
	if err != nil {
		return f, err
	}
	if len(wins) == 0 {
		return f, p.errf(m["windows"], field+".windows", "empty; name at least one of the definition's windows")
	}
	for j, w := range wins {
		wf := index(field+".windows", j)
		name, err := p.scalar(w, wf)
		if err != nil {
			return f, err
		}
		idx := -1
		for k, sp := range b.windows {
			if sp.Name == name {
				idx = k
			}
		}
		if idx < 0 {
			return f, p.errf(w, wf, "no window %q in %s (%s); name a window by its length", name, windowsOf(field), windowNames(b.windows))
		}
		for _, prev := range f.Windows {
			if prev == idx {
				return f, p.errf(w, wf, "window %s listed twice", name)
			}
		}
		f.Windows = append(f.Windows, idx)
	}
	switch {
	case f.Agg == AggDistinctCount && m["field"] == nil:
		return f, p.errf(n, field+".field", "missing; distinct_count counts the values of a field")
	case f.Agg != AggDistinctCount && m["field"] != nil:
		return f, p.errf(m["field"], field+".field", "only distinct_count takes a field; sum, min and max are over the amount")
	case f.Agg != AggDistinctCount && m["max_exact"] != nil:
		return f, p.errf(m["max_exact"], field+".max_exact", "only distinct_count takes max_exact")
	case (f.Agg == AggSum || f.Agg == AggMin || f.Agg == AggMax) && !amount:
		return f, p.errf(m["agg"], field+".agg", "%s is over the amount, and input.amount is not mapped", f.Agg)
	}
	if f.Agg == AggDistinctCount {
		if f.Field, err = p.path(m["field"], field+".field"); err != nil {
			return f, err
		}
		f.fieldPos = pos{m["field"].Line, m["field"].Column}
		f.MaxExact = DefaultMaxExact
		if v := m["max_exact"]; v != nil {
			if f.MaxExact, err = p.int(v, field+".max_exact", 1, MaxMaxExact); err != nil {
				return f, err
			}
		}
		slot, ok := distincts[f.Field]
		if !ok {
			if len(b.distincts) == MaxDistincts {
				return f, p.errf(m["field"], field+".field", "more than %d distinct fields in %s", MaxDistincts, groupOf(field))
			}
			slot = len(b.distincts)
			distincts[f.Field] = slot
			b.distincts = append(b.distincts, f.Field)
		}
		f.Distinct = slot
	}
	if v := m["where"]; v != nil {
		flt, err := p.filter(v, field+".where")
		if err != nil {
			return f, err
		}
		idx, ok := filters[flt.key]
		if !ok {
			if len(b.filters) == MaxFilters {
				return f, p.errf(v, field+".where", "more than %d different filters in %s", MaxFilters, groupOf(field))
			}
			idx = len(b.filters)
			filters[flt.key] = idx
			b.filters = append(b.filters, flt)
		}
		f.Filter = idx
	}
	return f, nil
}

// windowsOf names the windows list a feature at field refers to:
// "windows" at the top level, "groups[1].windows" in a group.
func windowsOf(field string) string {
	if i := strings.Index(field, ".features["); i >= 0 {
		return field[:i] + ".windows"
	}
	return "windows"
}

// groupOf names the group of a feature at field in a limit's error: the
// limits are per group, and the in-place group's wording is the original one.
func groupOf(field string) string {
	if i := strings.Index(field, ".features["); i >= 0 {
		return "one group (" + field[:i] + ")"
	}
	return "one definition"
}

func windowNames(specs []window.Spec) string {
	names := make([]string, len(specs))
	for i, sp := range specs {
		names[i] = sp.Name
	}
	return strings.Join(names, ", ")
}

var predicateOps = []string{"eq", "ne", "in", "not_in", "lt", "le", "gt", "ge", "is_null"}

func (p *parser) filter(n *yaml.Node, field string) (Filter, error) {
	items, err := p.seq(n, field)
	if err != nil {
		return Filter{}, err
	}
	if len(items) == 0 {
		return Filter{}, p.errf(n, field, "empty; leave where out to count every event")
	}
	if len(items) > MaxPredicates {
		return Filter{}, p.errf(n, field, "%d predicates, at most %d", len(items), MaxPredicates)
	}
	var flt Filter
	keys := make([]string, 0, len(items))
	for i, it := range items {
		pf := index(field, i)
		m, err := p.mapping(it, pf, append([]string{"field"}, predicateOps...)...)
		if err != nil {
			return Filter{}, err
		}
		if m["field"] == nil {
			return Filter{}, p.errf(it, pf+".field", "missing; a predicate names the field it tests")
		}
		pr := Predicate{pos: pos{it.Line, it.Column}, label: pf}
		if pr.Field, err = p.path(m["field"], pf+".field"); err != nil {
			return Filter{}, err
		}
		var opNode *yaml.Node
		for k, v := range m {
			if k == "field" {
				continue
			}
			if opNode != nil {
				return Filter{}, p.errf(it, pf, "more than one comparison; write one predicate per comparison (they are ANDed)")
			}
			opNode = v
			for j, name := range opNames {
				if name == k {
					pr.Op = Op(j)
				}
			}
		}
		if opNode == nil {
			return Filter{}, p.errf(it, pf, "no comparison; use one of %s", strings.Join(predicateOps, ", "))
		}
		of := pf + "." + pr.Op.String()
		switch pr.Op {
		case OpIsNull:
			if opNode.Kind != yaml.ScalarNode || opNode.ShortTag() != "!!bool" {
				return Filter{}, p.errf(opNode, of, "want true or false, got %s", kindName(opNode))
			}
			pr.IsNull = strings.EqualFold(opNode.Value, "true") // YAML 1.2 also writes True and TRUE
		case OpIn, OpNotIn:
			vals, err := p.seq(opNode, of)
			if err != nil {
				return Filter{}, err
			}
			if len(vals) == 0 || len(vals) > MaxSetValues {
				return Filter{}, p.errf(opNode, of, "want 1..%d values, got %d", MaxSetValues, len(vals))
			}
			for j, v := range vals {
				lit, err := p.literal(v, index(of, j))
				if err != nil {
					return Filter{}, err
				}
				pr.Values = append(pr.Values, lit)
			}
		default:
			lit, err := p.literal(opNode, of)
			if err != nil {
				return Filter{}, err
			}
			pr.Values = []Literal{lit}
		}
		flt.Predicates = append(flt.Predicates, pr)
		keys = append(keys, pr.canonical())
	}
	sort.Strings(keys)
	flt.key = strings.Join(keys, " && ")
	return flt, nil
}

func (p *parser) literal(n *yaml.Node, field string) (Literal, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return Literal{}, p.errf(n, field, "want a constant, got %s (test for null with is_null)", kindName(n))
	}
	return Literal{Text: n.Value, Tag: n.ShortTag(), pos: pos{n.Line, n.Column}}, nil
}

// canonical renders a predicate for sharing filters and for the hash:
// literals quoted with their tag, sets sorted.
func (pr Predicate) canonical() string {
	if pr.Op == OpIsNull {
		return pr.Field + " is_null " + strconv.FormatBool(pr.IsNull)
	}
	vals := make([]string, len(pr.Values))
	for i, v := range pr.Values {
		text := v.Text
		if v.Tag == "!!bool" {
			text = strings.ToLower(text) // True and true are one constant
		}
		vals[i] = v.Tag + strconv.Quote(text)
	}
	if pr.Op == OpIn || pr.Op == OpNotIn {
		sort.Strings(vals)
	}
	return pr.Field + " " + pr.Op.String() + " [" + strings.Join(vals, ",") + "]"
}

// paths lists every field path the definition reads, in a fixed order:
// the mapping, then distinct fields, then filter fields, then each re-keyed
// group's key, distinct fields and filter fields, each once.
func (d *Definition) paths() []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	add(d.Input.EventID)
	add(d.Input.EntityID)
	add(d.Input.EventTime)
	add(d.Input.Amount)
	for _, p := range d.Distincts {
		add(p)
	}
	for _, f := range d.Filters {
		for _, pr := range f.Predicates {
			add(pr.Field)
		}
	}
	for _, g := range d.Groups {
		add(g.Key)
		for _, p := range g.Distincts {
			add(p)
		}
		for _, f := range g.Filters {
			for _, pr := range f.Predicates {
				add(pr.Field)
			}
		}
	}
	return out
}

// canonicalForm is what Hash hashes: everything that changes what the
// definition computes, in a fixed order, and nothing that does not (comments,
// layout, key order, the schema file's location). Group and Groups are left
// out when the definition has the default group name and no re-keyed groups,
// so that a definition without groups keeps the hash it had before groups
// existed; the group names are in because they name outputs.
type canonicalForm struct {
	Format   int              `json:"format"`
	Version  string           `json:"version"`
	Input    []string         `json:"input"`
	Windows  string           `json:"windows"`
	Features []string         `json:"features"`
	Filters  []string         `json:"filters"`
	Group    string           `json:"group,omitempty"`
	Groups   []canonicalGroup `json:"groups,omitempty"`
}

type canonicalGroup struct {
	Name     string   `json:"name"`
	Key      string   `json:"key"`
	Windows  string   `json:"windows"`
	Features []string `json:"features"`
	Filters  []string `json:"filters"`
}

// Hash is the definition's version: the first 16 hex digits of the XXH3-64 of
// its canonical form. Two files that differ only in layout, comments, key
// order or the schema file's location hash the same.
func (d *Definition) Hash() string {
	c := canonicalForm{
		Format:  1,
		Version: d.Version,
		Input: []string{d.Input.EventID, d.Input.EntityID, d.Input.EventTime, d.Input.Amount,
			strconv.FormatBool(d.Input.HasAmountExponent), strconv.Itoa(d.Input.AmountExponent), d.Input.DoubleRounding.String()},
		Windows:  window.FormatSpecs(d.Windows),
		Features: canonicalFeatures(d.Features),
		Filters:  canonicalFilters(d.Filters),
	}
	if d.Group != DefaultGroup || len(d.Groups) > 0 {
		c.Group = d.Group
	}
	for _, g := range d.Groups {
		c.Groups = append(c.Groups, canonicalGroup{Name: g.Name, Key: g.Key, Windows: window.FormatSpecs(g.Windows),
			Features: canonicalFeatures(g.Features), Filters: canonicalFilters(g.Filters)})
	}
	b, err := json.Marshal(c)
	if err != nil {
		panic("definition: canonical form does not marshal: " + err.Error()) // strings and ints only
	}
	var sum [8]byte
	h := xxh3.Hash(b)
	for i := range sum {
		sum[i] = byte(h >> (56 - 8*i))
	}
	return hex.EncodeToString(sum[:])
}

func canonicalFeatures(fs []Feature) []string {
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%s %s %v field=%s filter=%d distinct=%d max_exact=%d",
			f.Name, f.Agg, f.Windows, f.Field, f.Filter, f.Distinct, f.MaxExact))
	}
	return out
}

func canonicalFilters(fs []Filter) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.key)
	}
	return out
}

// FeatureSpec is one feature as the aggregation engine needs it; it mirrors
// pkg/feature's Feature field for field.
type FeatureSpec struct {
	Name     string
	Agg      Agg
	Windows  []int // indices into Spec.Windows, in output order
	Filter   int   // -1: every event; else the bit (0..31) in Ext[0]
	Distinct int   // DistinctCount only: slot j (hash Ext[1+j], present iff Ext[0] bit 32+j); else -1
	MaxExact int   // DistinctCount only: values kept exactly per entity
}

// Spec is the plain description of what the engine computes; it mirrors
// pkg/feature's Spec so that converting one to the other is a field copy.
type Spec struct {
	Windows   []window.Spec
	Features  []FeatureSpec
	Filters   int // filter bits in use
	Distincts int // distinct slots in use
}

// Spec builds the engine's description of d's in-place group. It depends on
// the definition only, not on the writer schema.
func (d *Definition) Spec() Spec { return blockSpec(d.Windows, d.Features, d.Filters, d.Distincts) }

// Spec builds the engine's description of the re-keyed group g, whose words
// are codec.GroupValues.Ext.
func (g *Group) Spec() Spec { return blockSpec(g.Windows, g.Features, g.Filters, g.Distincts) }

func blockSpec(windows []window.Spec, features []Feature, filters []Filter, distincts []string) Spec {
	s := Spec{Windows: append([]window.Spec(nil), windows...), Filters: len(filters), Distincts: len(distincts)}
	for _, f := range features {
		fs := FeatureSpec{Name: f.Name, Agg: f.Agg, Windows: append([]int(nil), f.Windows...), Filter: f.Filter, Distinct: f.Distinct}
		if f.Agg == AggDistinctCount {
			fs.MaxExact = f.MaxExact
		}
		s.Features = append(s.Features, fs)
	}
	return s
}
