package definition

import (
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// Compiled is a definition compiled over one writer schema.
type Compiled struct {
	// Spec is what the aggregation engine computes (Definition.Spec).
	Spec Spec
	def  *Definition
	dec  *decoder
}

// Definition returns the definition c was compiled from.
func (c *Compiled) Definition() *Definition { return c.def }

// Decoder returns the codec.Decoder for values written with c's writer
// schema (plain Avro binary, no wire-format prefix). It is safe for
// concurrent use.
func (c *Compiled) Decoder() codec.Decoder { return c.dec }

// Compiler returns a function that compiles def over one writer schema at a
// time, for a schema registry decoder that builds one codec.Decoder per
// schema id.
func Compiler(def *Definition, limits codec.Limits) func(writerSchema string) (codec.Decoder, error) {
	return func(writerSchema string) (codec.Decoder, error) {
		c, err := Compile(def, writerSchema, limits)
		if err != nil {
			return nil, err
		}
		return c.Decoder(), nil
	}
}

// Compile resolves every path of def against writerSchema and builds the
// decoder. writerSchema "" means our Transaction schema (schemas.Transaction),
// as for codec.NewDecoder, so a definition without input.schema and without a
// registry reads the topic format the service has always read. A path the schema lacks, a type a use cannot take, a filter
// constant the field cannot hold: each is an error naming the definition's
// file, line and key.
func Compile(def *Definition, writerSchema string, limits codec.Limits) (*Compiled, error) {
	limits = limits.WithDefaults()
	if limits.MaxRecordBytes < 0 || limits.MaxAheadMs < 0 {
		return nil, fmt.Errorf("codec limits must not be negative: %+v", limits)
	}
	if limits.MaxRecordBytes > math.MaxInt32 {
		return nil, fmt.Errorf("codec limits: MaxRecordBytes %d is over 2 GiB", limits.MaxRecordBytes)
	}
	if writerSchema == "" {
		writerSchema = schemas.Transaction
	}
	root, _, err := parseSchema(writerSchema)
	if err != nil {
		return nil, err
	}
	return compileParsed(def, root, limits)
}

// compileParsed is Compile over a parsed writer schema; limits are complete.
func compileParsed(def *Definition, root *node, limits codec.Limits) (*Compiled, error) {
	var err error
	c := &compiler{def: def, root: root, slots: map[string]int{}}
	d := &decoder{limits: limits, root: &plan{}}
	// Mapping.
	in := &def.Input
	if d.eventID, err = c.idField(in.EventID, "input.event_id"); err != nil {
		return nil, err
	}
	if d.entityID, err = c.idField(in.EntityID, "input.entity_id"); err != nil {
		return nil, err
	}
	if d.eventTime, err = c.timeField(in.EventTime, "input.event_time"); err != nil {
		return nil, err
	}
	d.amount.slot = -1
	if in.Amount != "" {
		if d.amount, err = c.amountField(in); err != nil {
			return nil, err
		}
	}
	if d.distincts, d.filters, err = c.block(def.Features, def.Distincts, def.Filters); err != nil {
		return nil, err
	}
	d.ext = extWords(def.Filters, def.Distincts)
	for i := range def.Groups {
		g := &def.Groups[i]
		cg := cgroup{}
		if cg.key, err = c.id(g.Key, g.label+".key", g.keyPos, "a group key"); err != nil {
			return nil, err
		}
		if cg.distincts, cg.filters, err = c.block(g.Features, g.Distincts, g.Filters); err != nil {
			return nil, err
		}
		cg.ext = extWords(g.Filters, g.Distincts)
		d.groups = append(d.groups, cg)
	}
	if d.root, err = c.plan(root, c.trie, ""); err != nil {
		return nil, err
	}
	d.nslots = len(c.slots)
	return &Compiled{Spec: def.Spec(), def: def, dec: d}, nil
}

// extWords is the length of one group's Ext: 0 without filters and
// distincts, else the word of bits and one hash per distinct slot.
func extWords(filters []Filter, distincts []string) int {
	if len(filters) == 0 && len(distincts) == 0 {
		return 0
	}
	return 1 + len(distincts)
}

// block compiles one group's distinct slots (in slot order) and filters (in
// bit order). Their paths share the decoder's slots with every other group's,
// so a field several groups read is read once per record.
func (c *compiler) block(features []Feature, distincts []string, filters []Filter) ([]distinctRef, []cfilter, error) {
	var refs []distinctRef
	for j, path := range distincts {
		f := firstFeature(features, j)
		ref, err := c.distinctField(path, f)
		if err != nil {
			return nil, nil, err
		}
		refs = append(refs, ref)
	}
	var cfs []cfilter
	for _, flt := range filters {
		var cf cfilter
		for _, pr := range flt.Predicates {
			cp, err := c.predicate(pr)
			if err != nil {
				return nil, nil, err
			}
			cf.preds = append(cf.preds, cp)
		}
		cfs = append(cfs, cf)
	}
	return refs, cfs, nil
}

func firstFeature(features []Feature, slot int) *Feature {
	for i := range features {
		if features[i].Distinct == slot {
			return &features[i]
		}
	}
	panic("definition: distinct slot without a feature")
}

type compiler struct {
	def   *Definition
	root  *node
	slots map[string]int
	trie  *trieNode
}

// trieNode holds the mapped paths below one record: the walker's plan is
// built from it, so a field several uses read is read once.
type trieNode struct {
	children map[string]*trieNode
	slot     int // ≥ 0 at a leaf
}

func (c *compiler) errAt(p pos, field, format string, args ...any) error {
	return &Error{File: c.def.File, Line: p.line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (c *compiler) inputPos(key string) pos { return c.def.Input.pos[key] }

// resolve finds path in the writer schema, registers its slot, and returns
// the leaf's type (the non-null branch of a [null, T] union) and whether the
// value can be null (the leaf or a record on the way is nullable).
func (c *compiler) resolve(path string, at pos, field string) (leaf *node, slot int, nullable bool, err error) {
	return c.resolveAny(path, at, field, false)
}

// resolveAny is resolve that also accepts a record as the leaf, for is_null:
// its slot is set when the record is present.
func (c *compiler) resolveAny(path string, at pos, field string, records bool) (leaf *node, slot int, nullable bool, err error) {
	segs := strings.Split(path, ".")
	n := c.root
	var where []string
	for i, seg := range segs {
		var ft *node
		for _, f := range n.fields {
			if f.name == seg {
				ft = f.typ
			}
		}
		recName := "the top-level record " + n.name
		if i > 0 {
			recName = "record " + n.name + " (at " + strings.Join(where, ".") + ")"
		}
		if ft == nil {
			names := make([]string, len(n.fields))
			for k, f := range n.fields {
				names[k] = f.name
			}
			return nil, 0, false, c.errAt(at, field, "path %s: %s has no field %q (fields: %s)", path, recName, seg, strings.Join(names, ", "))
		}
		where = append(where, seg)
		inner, isNull, ok := nullableBranch(ft)
		if !ok {
			return nil, 0, false, c.errAt(at, field, "path %s: field %s is a %s; only T and [\"null\", T] unions can be mapped", path, strings.Join(where, "."), ft.describe())
		}
		nullable = nullable || isNull
		if i < len(segs)-1 {
			if inner.kind != kRecord {
				return nil, 0, false, c.errAt(at, field, "path %s: field %s is a %s, not a record, so it has no field %s", path, strings.Join(where, "."), inner.describe(), segs[i+1])
			}
			n = inner
			continue
		}
		leaf = inner
	}
	switch leaf.kind {
	case kRecord:
		if !records {
			return nil, 0, false, c.errAt(at, field, "path %s is a %s; map a field of a primitive, enum or fixed type (a record can only be tested with is_null)", path, leaf.describe())
		}
	case kArray, kMap, kNull:
		return nil, 0, false, c.errAt(at, field, "path %s is a %s; map a field of a primitive, enum or fixed type", path, leaf.describe())
	}
	slot, seen := c.slots[path]
	if !seen {
		slot = len(c.slots)
		if slot >= MaxPaths {
			return nil, 0, false, c.errAt(at, field, "more than %d fields read per record", MaxPaths)
		}
		c.slots[path] = slot
		if c.trie == nil {
			c.trie = &trieNode{children: map[string]*trieNode{}, slot: -1}
		}
		t := c.trie
		for _, seg := range segs {
			next := t.children[seg]
			if next == nil {
				next = &trieNode{children: map[string]*trieNode{}, slot: -1}
				t.children[seg] = next
			}
			t = next
		}
		t.slot = slot
	}
	return leaf, slot, nullable, nil
}

// nullableBranch unwraps T or a two-branch union of null and T.
func nullableBranch(t *node) (inner *node, nullable, ok bool) {
	if t.kind != kUnion {
		return t, false, true
	}
	if len(t.branches) != 2 {
		return nil, false, false
	}
	a, b := t.branches[0], t.branches[1]
	switch {
	case a.kind == kNull && b.kind != kNull && b.kind != kUnion:
		return b, true, true
	case b.kind == kNull && a.kind != kNull && a.kind != kUnion:
		return a, true, true
	}
	return nil, false, false
}

// plan builds the walker's steps for record n from the mapped paths below it.
func (c *compiler) plan(n *node, t *trieNode, prefix string) (*plan, error) {
	pl := &plan{}
	for _, f := range n.fields {
		label := f.name
		if prefix != "" {
			label = prefix + "." + f.name
		}
		child := t.children[f.name]
		if child == nil {
			pl.steps = append(pl.steps, step{op: stepSkip, typ: f.typ, label: label})
			continue
		}
		inner, isNull, _ := nullableBranch(f.typ) // resolve checked the shape
		st := step{typ: inner, kind: inner.kind, size: inner.size, nsym: int64(len(inner.symbols)), nullable: isNull, label: label, slot: child.slot}
		if isNull {
			st.nullIdx = 0
			if f.typ.branches[1].kind == kNull {
				st.nullIdx = 1
			}
		}
		if child.slot >= 0 && inner.kind != kRecord {
			st.op = stepLeaf
		} else {
			st.op = stepRecord
			sub, err := c.plan(inner, child, label)
			if err != nil {
				return nil, err
			}
			st.sub = sub
		}
		pl.steps = append(pl.steps, st)
	}
	return pl, nil
}

// idRef reads an id: string or bytes as is, int or long in decimal.
type idRef struct {
	slot   int
	kind   kind
	path   string
	reason codec.Reason
}

func (c *compiler) idField(path, key string) (idRef, error) {
	return c.id(path, key, c.inputPos(strings.TrimPrefix(key, "input.")), "an id")
}

// id resolves an id or a group key, written at at under key; what names it
// in the error.
func (c *compiler) id(path, key string, at pos, what string) (idRef, error) {
	leaf, slot, _, err := c.resolve(path, at, key)
	if err != nil {
		return idRef{}, err
	}
	switch {
	case leaf.isDecimal():
	case leaf.kind == kString, leaf.kind == kBytes, leaf.kind == kInt, leaf.kind == kLong:
		return idRef{slot: slot, kind: leaf.kind, path: path, reason: codec.Invalid(path)}, nil
	}
	return idRef{}, c.errAt(at, key, "path %s is a %s; %s must be a string, bytes, int or long", path, leaf.describe(), what)
}

// timeRef reads the event time; micros are floored to milliseconds.
type timeRef struct {
	slot   int
	micros bool
	path   string
	reason codec.Reason
}

func (c *compiler) timeField(path, key string) (timeRef, error) {
	at := c.inputPos("event_time")
	leaf, slot, _, err := c.resolve(path, at, key)
	if err != nil {
		return timeRef{}, err
	}
	if leaf.kind == kLong {
		switch leaf.logical {
		case "", "timestamp-millis":
			return timeRef{slot: slot, path: path, reason: codec.Invalid(path)}, nil
		case "timestamp-micros":
			return timeRef{slot: slot, micros: true, path: path, reason: codec.Invalid(path)}, nil
		}
	}
	return timeRef{}, c.errAt(at, key, "path %s is a %s; the event time must be a long of Unix milliseconds, timestamp-millis or timestamp-micros", path, leaf.describe())
}

type amountKind uint8

const (
	amountInt amountKind = iota
	amountDecimal
	amountFloat
	amountDouble
)

// amountRef reads the amount and turns it into minor units.
type amountRef struct {
	slot     int
	kind     amountKind
	scale    int // decimal
	exp      int
	rounding Rounding
	path     string
	reason   codec.Reason
}

func (c *compiler) amountField(in *Input) (amountRef, error) {
	at := c.inputPos("amount")
	leaf, slot, _, err := c.resolve(in.Amount, at, "input.amount")
	if err != nil {
		return amountRef{}, err
	}
	r := amountRef{slot: slot, path: in.Amount, reason: codec.Invalid(in.Amount), exp: in.AmountExponent, rounding: in.DoubleRounding}
	expAt := c.inputPos("amount_exponent")
	switch {
	case leaf.isDecimal():
		if !in.HasAmountExponent {
			return r, c.errAt(at, "input.amount_exponent", "missing; amount %s is a %s, and amount_exponent says how many of its fraction digits are minor units (2 for cents)", in.Amount, leaf.describe())
		}
		r.kind, r.scale = amountDecimal, leaf.scale
	case (leaf.kind == kInt || leaf.kind == kLong) && leaf.logical == "":
		if in.HasAmountExponent {
			return r, c.errAt(expAt, "input.amount_exponent", "amount %s is a %s, already in minor units; remove amount_exponent", in.Amount, leaf.describe())
		}
		r.kind = amountInt
	case leaf.kind == kFloat || leaf.kind == kDouble:
		if in.DoubleRounding == RoundNone {
			return r, c.errAt(at, "input.amount", "amount %s is a %s; binary floating point cannot hold most decimal amounts exactly, so it is refused unless double_rounding (half_even or half_away_from_zero) states how to round it", in.Amount, leaf.describe())
		}
		if !in.HasAmountExponent {
			return r, c.errAt(at, "input.amount_exponent", "missing; amount %s is a %s in major units, and amount_exponent says how many minor units make one (2 for cents)", in.Amount, leaf.describe())
		}
		r.kind = amountDouble
		if leaf.kind == kFloat {
			r.kind = amountFloat
		}
	default:
		return r, c.errAt(at, "input.amount", "path %s is a %s; the amount must be an int or long of minor units, a decimal, or (with double_rounding) a float or double", in.Amount, leaf.describe())
	}
	if r.kind != amountDouble && r.kind != amountFloat && in.DoubleRounding != RoundNone {
		return r, c.errAt(c.inputPos("double_rounding"), "input.double_rounding", "amount %s is a %s, not a float or double; remove double_rounding", in.Amount, leaf.describe())
	}
	return r, nil
}

type hashKind uint8

const (
	hashText hashKind = iota
	hashBytes
	hashInt
	hashBool
	hashEnum
)

// distinctRef reads one distinct slot's value and hashes it (hash.go).
type distinctRef struct {
	slot  int
	kind  hashKind
	enums []uint64 // hashEnum: the hash of each symbol, by ordinal
}

func (c *compiler) distinctField(path string, f *Feature) (distinctRef, error) {
	key := f.label + ".field"
	leaf, slot, _, err := c.resolve(path, f.fieldPos, key)
	if err != nil {
		return distinctRef{}, err
	}
	r := distinctRef{slot: slot}
	switch {
	case leaf.isDecimal() || leaf.kind == kFloat || leaf.kind == kDouble:
		return r, c.errAt(f.fieldPos, key, "path %s is a %s; distinct values must be strings, enums, booleans, ints, longs, bytes or fixed (equal numbers can have different decimal or binary spellings)", path, leaf.describe())
	case leaf.kind == kString:
		r.kind = hashText
	case leaf.kind == kEnum:
		r.kind = hashEnum
		for _, s := range leaf.symbols {
			r.enums = append(r.enums, hashTagged(tagText, []byte(s)))
		}
	case leaf.kind == kBytes || leaf.kind == kFixed:
		r.kind = hashBytes
	case leaf.kind == kInt || leaf.kind == kLong:
		r.kind = hashInt
	case leaf.kind == kBoolean:
		r.kind = hashBool
	default:
		return r, c.errAt(f.fieldPos, key, "path %s is a %s, which distinct_count cannot count", path, leaf.describe())
	}
	return r, nil
}

type predKind uint8

const (
	predNull predKind = iota
	predStrEq
	predStrSet
	predEnum
	predBool
	predInt
	predIntSet
	predFloat
	predDecimal
)

// cpred is one compiled predicate. A null or absent field satisfies none but
// is_null: true (predNull with isNull).
type cpred struct {
	kind   predKind
	slot   int
	negate bool // ne and not_in on strings, enums, booleans, int sets
	isNull bool
	str    string
	strs   map[string]struct{}
	enum   []bool // by ordinal: the predicate holds
	b      bool
	ints   []int64 // sorted
	ir     intRange
	fr     floatRange
}

type cfilter struct {
	preds []cpred
}

func (c *compiler) predicate(pr Predicate) (cpred, error) {
	leaf, slot, _, err := c.resolveAny(pr.Field, pr.pos, pr.label+".field", pr.Op == OpIsNull)
	if err != nil {
		return cpred{}, err
	}
	cp := cpred{slot: slot}
	opField := pr.label + "." + pr.Op.String()
	bad := func(format string, args ...any) (cpred, error) {
		return cpred{}, c.errAt(pr.pos, opField, "field %s (%s): %s", pr.Field, leaf.describe(), fmt.Sprintf(format, args...))
	}
	if pr.Op == OpIsNull {
		cp.kind, cp.isNull = predNull, pr.IsNull
		return cp, nil
	}
	eqOps := pr.Op == OpEq || pr.Op == OpNe || pr.Op == OpIn || pr.Op == OpNotIn
	cp.negate = pr.Op == OpNe || pr.Op == OpNotIn
	switch {
	case leaf.kind == kString:
		if !eqOps {
			return bad("strings take eq, ne, in and not_in, not %s", pr.Op)
		}
		if len(pr.Values) == 1 && (pr.Op == OpEq || pr.Op == OpNe) {
			cp.kind, cp.str = predStrEq, pr.Values[0].Text
			return cp, nil
		}
		cp.kind, cp.strs = predStrSet, map[string]struct{}{}
		for _, v := range pr.Values {
			cp.strs[v.Text] = struct{}{}
		}
		return cp, nil
	case leaf.kind == kEnum:
		if !eqOps {
			return bad("enums take eq, ne, in and not_in, not %s", pr.Op)
		}
		cp.kind, cp.enum = predEnum, make([]bool, len(leaf.symbols))
		for _, v := range pr.Values {
			found := false
			for k, s := range leaf.symbols {
				if s == v.Text {
					cp.enum[k], found = true, true
				}
			}
			if !found {
				return cpred{}, c.errAt(v.pos, opField, "field %s (%s) has no symbol %q; its symbols are %s", pr.Field, leaf.describe(), v.Text, strings.Join(leaf.symbols, ", "))
			}
		}
		return cp, nil
	case leaf.kind == kBoolean:
		if pr.Op != OpEq && pr.Op != OpNe {
			return bad("booleans take eq and ne, not %s", pr.Op)
		}
		v := pr.Values[0]
		if v.Tag != "!!bool" {
			return cpred{}, c.errAt(v.pos, opField, "field %s is a boolean; compare it with true or false, not %q", pr.Field, v.Text)
		}
		cp.kind, cp.b = predBool, strings.EqualFold(v.Text, "true") // YAML 1.2 also writes True and TRUE
		return cp, nil
	}
	numeric := leaf.kind == kInt || leaf.kind == kLong || leaf.kind == kFloat || leaf.kind == kDouble || leaf.isDecimal()
	if !numeric {
		return bad("filters test strings, enums, booleans and numbers")
	}
	rats := make([]*big.Rat, len(pr.Values))
	for i, v := range pr.Values {
		r, ok := parseRat(v.Text)
		if !ok || v.Tag == "!!bool" {
			return cpred{}, c.errAt(v.pos, opField, "field %s is a %s; %q is not a number", pr.Field, leaf.describe(), v.Text)
		}
		rats[i] = r
	}
	if pr.Op == OpIn || pr.Op == OpNotIn {
		if leaf.kind != kInt && leaf.kind != kLong {
			return bad("in and not_in apply to ints and longs among numbers; use comparisons")
		}
		for i, r := range rats {
			if !r.IsInt() || !r.Num().IsInt64() {
				return cpred{}, c.errAt(pr.Values[i].pos, opField, "field %s is a %s; %s is not a whole number it can hold", pr.Field, leaf.describe(), pr.Values[i].Text)
			}
			cp.ints = append(cp.ints, r.Num().Int64())
		}
		sort.Slice(cp.ints, func(a, b int) bool { return cp.ints[a] < cp.ints[b] })
		cp.kind = predIntSet
		return cp, nil
	}
	cp.negate = false // the ranges carry ne themselves
	switch {
	case leaf.kind == kInt || leaf.kind == kLong:
		cp.kind, cp.ir = predInt, newIntRange(rats[0], 0, pr.Op)
	case leaf.isDecimal():
		cp.kind, cp.ir = predDecimal, newIntRange(rats[0], leaf.scale, pr.Op)
	default:
		cp.kind, cp.fr = predFloat, newFloatRange(rats[0], pr.Op)
	}
	return cp, nil
}

// decoder is a definition compiled over one writer schema: it walks the
// value, then converts, validates and evaluates.
type decoder struct {
	limits    codec.Limits
	root      *plan
	nslots    int
	ext       int // len(tx.Ext): 0 without filters and distincts, else 1 + distincts
	eventID   idRef
	entityID  idRef
	eventTime timeRef
	amount    amountRef
	distincts []distinctRef
	filters   []cfilter
	groups    []cgroup // the re-keyed groups, in definition order
}

// cgroup is one re-keyed group compiled: its key and its own filters and
// distinct slots, evaluated into codec.GroupValues.
type cgroup struct {
	key       idRef
	ext       int // len(GroupValues.Ext) when the key is present: 0 without filters and distincts
	distincts []distinctRef
	filters   []cfilter
}

// smallSlots is the scratch size for definitions that read few fields (most):
// the scratch is zeroed for every record, so it is kept no larger than needed.
const smallSlots = 16

func (d *decoder) Decode(value []byte, maxSeen int64, hasMaxSeen bool, tx *codec.Transaction) *codec.Rejection {
	return d.decodeValue(value, maxSeen, hasMaxSeen, tx, false)
}

var _ codec.BorrowingDecoder = (*decoder)(nil)

// DecodeBorrowed implements codec.BorrowingDecoder: the ids and the groups' keys
// that are strings or bytes in the record are value's own bytes.
func (d *decoder) DecodeBorrowed(value []byte, maxSeen int64, hasMaxSeen bool, tx *codec.Transaction) *codec.Rejection {
	return d.decodeValue(value, maxSeen, hasMaxSeen, tx, true)
}

func (d *decoder) decodeValue(value []byte, maxSeen int64, hasMaxSeen bool, tx *codec.Transaction, borrow bool) *codec.Rejection {
	if len(value) > d.limits.MaxRecordBytes {
		return &codec.Rejection{Reason: codec.ReasonTooLarge, Detail: "record is " + strconv.Itoa(len(value)) +
			" bytes, over the limit of " + strconv.Itoa(d.limits.MaxRecordBytes)}
	}
	if d.nslots <= smallSlots {
		var vals [smallSlots]val
		return d.decode(value, maxSeen, hasMaxSeen, tx, vals[:], borrow)
	}
	var vals [MaxPaths]val
	return d.decode(value, maxSeen, hasMaxSeen, tx, vals[:], borrow)
}

// decode is Decode with vals, the per-record scratch of d.nslots or more
// zeroed entries on the caller's stack.
func (d *decoder) decode(value []byte, maxSeen int64, hasMaxSeen bool, tx *codec.Transaction, vals []val, borrow bool) *codec.Rejection {
	i, e, label := walk(value, 0, d.root, vals, 0)
	if e != errNone {
		return &codec.Rejection{Reason: codec.ReasonDecode, Detail: label + ": " + e.String() + " at byte " + strconv.Itoa(i)}
	}
	if i != len(value) {
		return &codec.Rejection{Reason: codec.ReasonDecode, Detail: strconv.Itoa(len(value)-i) + " trailing bytes after the record"}
	}
	var r *codec.Rejection
	if tx.EventID, r = d.eventID.read(value, vals, borrow); r != nil {
		return r
	}
	if tx.EntityID, r = d.entityID.read(value, vals, borrow); r != nil {
		return r
	}
	tx.AmountMinor = 0
	if d.amount.slot >= 0 {
		if tx.AmountMinor, r = d.amount.read(value, vals); r != nil {
			return r
		}
	}
	tx.Currency = ""
	if tx.EventTime, r = d.eventTime.read(vals); r != nil {
		return r
	}
	if r = codec.Validate(tx, d.limits, maxSeen, hasMaxSeen); r != nil {
		return d.rename(r)
	}
	tx.Ext = fillExt(tx.Ext, d.ext, d.filters, d.distincts, value, vals)
	if len(d.groups) == 0 {
		tx.Groups = tx.Groups[:0]
		return nil
	}
	// Every key is checked before any is converted, so that a rejected
	// record costs no key strings. The keys' rule comes after the contract's
	// rules on the in-place fields, in group order.
	for k := range d.groups {
		if r = d.groups[k].key.checkKey(value, vals); r != nil {
			return r
		}
	}
	n := len(d.groups)
	if cap(tx.Groups) < n {
		// Once per Transaction: the entries' Ext arrays are kept from then on.
		grown := make([]codec.GroupValues, n)
		copy(grown, tx.Groups[:cap(tx.Groups)])
		tx.Groups = grown
	}
	tx.Groups = tx.Groups[:n]
	for k := range d.groups {
		g, out := &d.groups[k], &tx.Groups[k]
		out.Key = g.key.readKey(value, vals, borrow)
		if out.Key == "" {
			// Not an event of this group: its words would never be read.
			out.Ext = out.Ext[:0]
			continue
		}
		out.Ext = fillExt(out.Ext, g.ext, g.filters, g.distincts, value, vals)
	}
	return nil
}

// fillExt writes one group's words into ext's backing array: the filter bits
// and distinct-present bits in word 0, then one hash per distinct slot (the
// layout of codec.Transaction.Ext); nothing when words is 0.
func fillExt(ext []uint64, words int, filters []cfilter, distincts []distinctRef, value []byte, vals []val) []uint64 {
	if words == 0 {
		return ext[:0]
	}
	var word0 uint64
	for k := range filters {
		if filters[k].match(value, vals) {
			word0 |= 1 << k
		}
	}
	ext = append(ext[:0], 0)
	for j := range distincts {
		h, ok := distincts[j].hash(value, vals)
		if ok {
			word0 |= 1 << (32 + j)
		}
		ext = append(ext, h)
	}
	ext[0] = word0
	return ext
}

// rename turns the contract's field names in a validation rejection into the
// user's paths, with the reasons spelled once at compile time.
func (d *decoder) rename(r *codec.Rejection) *codec.Rejection {
	var reason codec.Reason
	var path, name, unit string
	switch r.Reason {
	case codec.ReasonInvalidEventID:
		reason, path, name = d.eventID.reason, d.eventID.path, "event_id"
	case codec.ReasonInvalidEntityID:
		reason, path, name = d.entityID.reason, d.entityID.path, "entity_id"
	case codec.ReasonInvalidAmountMinor:
		if d.amount.slot < 0 {
			return r // an unmapped amount is 0, which is valid: unreachable
		}
		reason, path, name, unit = d.amount.reason, d.amount.path, "amount_minor", " in minor units"
	case codec.ReasonInvalidEventTime:
		reason, path, name = d.eventTime.reason, d.eventTime.path, "event_time"
		if d.eventTime.micros {
			unit = " in milliseconds"
		}
	default:
		return r
	}
	return &codec.Rejection{Reason: reason, Detail: path + unit + strings.TrimPrefix(r.Detail, name)}
}

// Reasons lists every velocity.reason the decoder can give, so that metrics
// can count each from the start: decode, too_large, and invalid:<path> for the
// mapped paths and then the re-keyed groups' keys.
func (c *Compiled) Reasons() []codec.Reason {
	d := c.dec
	out := []codec.Reason{codec.ReasonDecode, codec.ReasonTooLarge, d.eventID.reason, d.entityID.reason}
	if d.amount.slot >= 0 {
		out = append(out, d.amount.reason)
	}
	out = append(out, d.eventTime.reason)
	for k := range d.groups {
		out = append(out, d.groups[k].key.reason)
	}
	// Two uses may map one path (an id that is also the amount): list it once.
	seen := map[codec.Reason]bool{}
	uniq := out[:0]
	for _, r := range out {
		if !seen[r] {
			seen[r] = true
			uniq = append(uniq, r)
		}
	}
	return uniq
}

func (r *idRef) read(value []byte, vals []val, borrow bool) (string, *codec.Rejection) {
	v := &vals[r.slot]
	if !v.set {
		return "", &codec.Rejection{Reason: r.reason, Detail: r.path + " is null"}
	}
	switch r.kind {
	case kInt, kLong:
		return strconv.FormatInt(v.n, 10), nil
	}
	return text(value[v.off:v.off+v.ln], borrow), nil
}

// text is b as a string: b's own bytes with borrow (codec.BorrowingDecoder),
// else a copy.
func text(b []byte, borrow bool) string {
	if borrow {
		return unsafe.String(unsafe.SliceData(b), len(b))
	}
	return string(b)
}

// checkKey applies the contract's entity-key rule to a group's key that is
// present and not empty: at most codec.MaxEntityIDBytes of UTF-8. A null,
// absent or empty key is not an error (the record is not an event of the
// group). An int or long key is its decimal text, which always passes.
func (r *idRef) checkKey(value []byte, vals []val) *codec.Rejection {
	v := &vals[r.slot]
	if !v.set || r.kind == kInt || r.kind == kLong {
		return nil
	}
	b := value[v.off : v.off+v.ln]
	switch {
	case len(b) > codec.MaxEntityIDBytes:
		return &codec.Rejection{Reason: r.reason, Detail: r.path + " is " + strconv.Itoa(len(b)) + " bytes, over the limit of " + strconv.Itoa(codec.MaxEntityIDBytes)}
	case !utf8.Valid(b):
		return &codec.Rejection{Reason: r.reason, Detail: r.path + " is not valid UTF-8"}
	}
	return nil
}

// readKey is a group's key as text, "" when null, absent or empty; checkKey
// has passed.
func (r *idRef) readKey(value []byte, vals []val, borrow bool) string {
	v := &vals[r.slot]
	switch {
	case !v.set:
		return ""
	case r.kind == kInt || r.kind == kLong:
		return strconv.FormatInt(v.n, 10)
	case v.ln == 0:
		return ""
	}
	return text(value[v.off:v.off+v.ln], borrow)
}

func (r *timeRef) read(vals []val) (int64, *codec.Rejection) {
	v := &vals[r.slot]
	if !v.set {
		return 0, &codec.Rejection{Reason: r.reason, Detail: r.path + " is null"}
	}
	if !r.micros {
		return v.n, nil
	}
	// Floor, so that a time before the epoch lands in the millisecond that
	// contains it, as it does after the epoch.
	ms := v.n / 1000
	if v.n%1000 < 0 {
		ms--
	}
	return ms, nil
}

func (r *amountRef) read(value []byte, vals []val) (int64, *codec.Rejection) {
	v := &vals[r.slot]
	if !v.set {
		return 0, &codec.Rejection{Reason: r.reason, Detail: r.path + " is null"}
	}
	var m int64
	var p amountProblem
	switch r.kind {
	case amountInt:
		return v.n, nil
	case amountDecimal:
		b := value[v.off : v.off+v.ln]
		if u, ok := unscaled64(b); ok {
			m, p = scaleMinor(u, r.scale, r.exp)
		} else {
			m, p = scaleMinorBig(unscaledBig(b), r.scale, r.exp)
		}
	case amountDouble:
		m, p = roundFloat(math.Float64frombits(uint64(v.n)), 64, r.exp, r.rounding)
	case amountFloat:
		m, p = roundFloat(math.Float64frombits(uint64(v.n)), 32, r.exp, r.rounding)
	}
	if p != amountOK {
		return 0, &codec.Rejection{Reason: r.reason, Detail: r.path + " " + r.describe(value, v) + " " + p.String() +
			" (amount_exponent " + strconv.Itoa(r.exp) + ")"}
	}
	return m, nil
}

// describe renders a rejected amount for velocity.error; rejections only.
func (r *amountRef) describe(value []byte, v *val) string {
	switch r.kind {
	case amountDecimal:
		u := unscaledBig(value[v.off : v.off+v.ln])
		return new(big.Rat).SetFrac(u, pow10(r.scale)).FloatString(r.scale)
	case amountFloat:
		return strconv.FormatFloat(math.Float64frombits(uint64(v.n)), 'g', -1, 32)
	}
	return strconv.FormatFloat(math.Float64frombits(uint64(v.n)), 'g', -1, 64)
}

func (f *cfilter) match(value []byte, vals []val) bool {
	for k := range f.preds {
		if !f.preds[k].match(value, vals) {
			return false
		}
	}
	return true
}

func (p *cpred) match(value []byte, vals []val) bool {
	v := &vals[p.slot]
	if p.kind == predNull {
		return v.set != p.isNull
	}
	if !v.set {
		return false
	}
	switch p.kind {
	case predStrEq:
		return (string(value[v.off:v.off+v.ln]) == p.str) != p.negate
	case predStrSet:
		_, in := p.strs[string(value[v.off:v.off+v.ln])]
		return in != p.negate
	case predEnum:
		return p.enum[v.n] != p.negate
	case predBool:
		return (v.n == 1) == p.b != p.negate
	case predInt:
		return p.ir.match(v.n)
	case predIntSet:
		k := sort.Search(len(p.ints), func(i int) bool { return p.ints[i] >= v.n })
		in := k < len(p.ints) && p.ints[k] == v.n
		return in != p.negate
	case predFloat:
		return p.fr.match(math.Float64frombits(uint64(v.n)))
	case predDecimal:
		b := value[v.off : v.off+v.ln]
		if u, ok := unscaled64(b); ok {
			return p.ir.match(u)
		}
		return p.ir.matchBig(unscaledBig(b))
	}
	return false
}

func (r *distinctRef) hash(value []byte, vals []val) (uint64, bool) {
	v := &vals[r.slot]
	if !v.set {
		return 0, false
	}
	switch r.kind {
	case hashText:
		return hashTagged(tagText, value[v.off:v.off+v.ln]), true
	case hashBytes:
		return hashTagged(tagBytes, value[v.off:v.off+v.ln]), true
	case hashEnum:
		return r.enums[v.n], true
	case hashInt:
		return hashInt64(v.n), true
	case hashBool:
		return hashBoolean(v.n == 1), true
	}
	return 0, false
}
