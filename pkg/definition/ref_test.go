package definition

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/linkedin/goavro/v2"
	"github.com/zeebo/xxh3"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// refDecoder is the reference the walker is held to: goavro decodes the whole
// value into maps, and this file projects them onto a transaction with
// math/big arithmetic and direct comparisons, sharing no conversion, filter or
// hash code with the package. Only the contract's own rules (codec.Validate)
// are shared.
type refDecoder struct {
	def    *Definition
	codec  *goavro.Codec
	limits codec.Limits
	schema string
}

func newRef(def *Definition, schema string) *refDecoder {
	c, err := goavro.NewCodec(schema)
	if err != nil {
		panic(err)
	}
	return &refDecoder{def: def, codec: c, limits: codec.Limits{}.WithDefaults(), schema: schema}
}

func unwrap(v any) any {
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for k, x := range m {
			// A union branch is keyed by a type name; a record field map has
			// field names, which in these schemas never contain a dot or
			// equal a primitive name except by design of the test schemas.
			if isTypeName(k) {
				return x
			}
		}
	}
	return v
}

func isTypeName(k string) bool {
	switch k {
	case "null", "boolean", "int", "long", "float", "double", "bytes", "string", "array", "map",
		"long.timestamp-millis", "long.timestamp-micros", "bytes.decimal", "fixed.decimal":
		return true
	}
	return strings.Contains(k, ".")
}

func (r *refDecoder) get(native any, path string) any {
	v := native
	for _, seg := range strings.Split(path, ".") {
		m, ok := unwrap(v).(map[string]any)
		if !ok {
			return nil
		}
		v = m[seg]
	}
	return unwrap(v)
}

type refResult struct {
	tx  codec.Transaction
	rej *codec.Rejection
}

func (r *refDecoder) decode(value []byte, maxSeen int64, hasMaxSeen bool) refResult {
	native, rest, err := r.codec.NativeFromBinary(value)
	if err != nil {
		return refResult{rej: &codec.Rejection{Reason: codec.ReasonDecode, Detail: err.Error()}}
	}
	if len(rest) != 0 {
		return refResult{rej: &codec.Rejection{Reason: codec.ReasonDecode, Detail: "trailing"}}
	}
	in := r.def.Input
	var tx codec.Transaction
	invalid := func(path, what string) refResult {
		return refResult{rej: &codec.Rejection{Reason: codec.Invalid(path), Detail: what}}
	}
	id := func(path string) (string, bool) {
		switch v := r.get(native, path).(type) {
		case string:
			return v, true
		case []byte:
			return string(v), true
		case int32:
			return strconv.Itoa(int(v)), true
		case int64:
			return strconv.FormatInt(v, 10), true
		case nil:
			return "", false
		default:
			panic(fmt.Sprintf("reference: id %s is %T", path, v))
		}
	}
	var ok bool
	if tx.EventID, ok = id(in.EventID); !ok {
		return invalid(in.EventID, "null")
	}
	if tx.EntityID, ok = id(in.EntityID); !ok {
		return invalid(in.EntityID, "null")
	}
	if in.Amount != "" {
		v := r.get(native, in.Amount)
		var minor *big.Rat
		shift := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(in.AmountExponent)), nil))
		switch a := v.(type) {
		case nil:
			return invalid(in.Amount, "null")
		case int32:
			minor = new(big.Rat).SetInt64(int64(a))
		case int64:
			minor = new(big.Rat).SetInt64(a)
		case *big.Rat:
			minor = new(big.Rat).Mul(a, shift)
			if !minor.IsInt() {
				return invalid(in.Amount, "fraction")
			}
		case float32, float64:
			bits, x := 64, 0.0
			if f, is32 := a.(float32); is32 {
				bits, x = 32, float64(f)
			} else {
				x = a.(float64)
			}
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return invalid(in.Amount, "not finite")
			}
			dec, _ := new(big.Rat).SetString(strconv.FormatFloat(x, 'f', -1, bits))
			minor = roundRat(new(big.Rat).Mul(dec, shift), in.DoubleRounding)
		default:
			panic(fmt.Sprintf("reference: amount is %T", v))
		}
		if !minor.Num().IsInt64() {
			return invalid(in.Amount, "range")
		}
		tx.AmountMinor = minor.Num().Int64()
	}
	switch t := r.get(native, in.EventTime).(type) {
	case nil:
		return invalid(in.EventTime, "null")
	case int64:
		tx.EventTime = t
	case time.Time:
		if strings.Contains(r.codecField(in.EventTime), "micros") {
			us := t.UnixMicro()
			tx.EventTime = us / 1000
			if us%1000 < 0 {
				tx.EventTime--
			}
		} else {
			tx.EventTime = t.UnixMilli()
		}
	default:
		panic(fmt.Sprintf("reference: time is %T", t))
	}
	if rej := codec.Validate(&tx, r.limits, maxSeen, hasMaxSeen); rej != nil {
		path := map[codec.Reason]string{codec.ReasonInvalidEventID: in.EventID, codec.ReasonInvalidEntityID: in.EntityID,
			codec.ReasonInvalidAmountMinor: in.Amount, codec.ReasonInvalidEventTime: in.EventTime}[rej.Reason]
		return invalid(path, rej.Detail)
	}
	// Each re-keyed group's key: null, absent or empty is no key; a present
	// key breaks the contract's entity-key rule or is kept.
	keys := make([]string, len(r.def.Groups))
	for i, g := range r.def.Groups {
		k, _ := id(g.Key)
		if k != "" && (len(k) > codec.MaxEntityIDBytes || !utf8.ValidString(k)) {
			return invalid(g.Key, "bad key")
		}
		keys[i] = k
	}
	tx.Ext = r.ext(native, r.def.Filters, r.def.Distincts)
	for i, g := range r.def.Groups {
		gv := codec.GroupValues{Key: keys[i]}
		if gv.Key != "" {
			gv.Ext = r.ext(native, g.Filters, g.Distincts)
		}
		tx.Groups = append(tx.Groups, gv)
	}
	return refResult{tx: tx}
}

// ext is one group's words for native; nil without filters and distincts.
func (r *refDecoder) ext(native any, filters []Filter, distincts []string) []uint64 {
	if len(filters) == 0 && len(distincts) == 0 {
		return nil
	}
	ext := make([]uint64, 1+len(distincts))
	for k, f := range filters {
		all := true
		for _, pr := range f.Predicates {
			all = all && r.holds(pr, r.get(native, pr.Field))
		}
		if all {
			ext[0] |= 1 << k
		}
	}
	for j, path := range distincts {
		v := r.get(native, path)
		if v == nil {
			continue
		}
		ext[0] |= 1 << (32 + j)
		ext[1+j] = refHash(v)
	}
	return ext
}

// codecField returns the logicalType of the field at path, read from the
// schema JSON (only event_time needs it: goavro gives time.Time either way).
func (r *refDecoder) codecField(path string) string {
	var v any
	if err := json.Unmarshal([]byte(r.schema), &v); err != nil {
		panic(err)
	}
	named := map[string]any{}
	var find func(t any, segs []string) string
	find = func(t any, segs []string) string {
		switch x := t.(type) {
		case string:
			if n, ok := named[x]; ok {
				return find(n, segs)
			}
			return ""
		case []any:
			for _, b := range x {
				if b != "null" {
					return find(b, segs)
				}
			}
		case map[string]any:
			if name, ok := x["name"].(string); ok {
				named[name] = x
			}
			if len(segs) == 0 {
				lt, _ := x["logicalType"].(string)
				return lt
			}
			if fields, ok := x["fields"].([]any); ok {
				for _, f := range fields {
					fm := f.(map[string]any)
					if fm["name"] == segs[0] {
						return find(fm["type"], segs[1:])
					}
				}
			}
			if inner, ok := x["type"].(map[string]any); ok {
				return find(inner, segs)
			}
		}
		return ""
	}
	return find(v, strings.Split(path, "."))
}

func roundRat(x *big.Rat, mode Rounding) *big.Rat {
	neg := x.Sign() < 0
	a := new(big.Rat).Abs(x)
	q, m := new(big.Int).QuoRem(a.Num(), a.Denom(), new(big.Int))
	twice := new(big.Int).Mul(m, big.NewInt(2))
	switch c := twice.Cmp(a.Denom()); {
	case c > 0, c == 0 && (mode == RoundHalfAwayFromZero || q.Bit(0) == 1):
		q.Add(q, big.NewInt(1))
	}
	if neg {
		q.Neg(q)
	}
	return new(big.Rat).SetInt(q)
}

func (r *refDecoder) holds(pr Predicate, v any) bool {
	if pr.Op == OpIsNull {
		return (v == nil) == pr.IsNull
	}
	if v == nil {
		return false
	}
	switch x := v.(type) {
	case string: // string or enum symbol
		in := false
		for _, l := range pr.Values {
			in = in || l.Text == x
		}
		return in != (pr.Op == OpNe || pr.Op == OpNotIn)
	case bool:
		return (x == (strings.EqualFold(pr.Values[0].Text, "true"))) != (pr.Op == OpNe)
	}
	var val *big.Rat
	switch x := v.(type) {
	case int32:
		val = new(big.Rat).SetInt64(int64(x))
	case int64:
		val = new(big.Rat).SetInt64(x)
	case float32:
		if x != x || math.IsInf(float64(x), 0) {
			return refInf(float64(x), pr)
		}
		val = new(big.Rat).SetFloat64(float64(x))
	case float64:
		if x != x || math.IsInf(x, 0) {
			return refInf(x, pr)
		}
		val = new(big.Rat).SetFloat64(x)
	case *big.Rat:
		val = x
	default:
		panic(fmt.Sprintf("reference: predicate on %T", v))
	}
	if pr.Op == OpIn || pr.Op == OpNotIn {
		in := false
		for _, l := range pr.Values {
			c, _ := new(big.Rat).SetString(l.Text)
			in = in || val.Cmp(c) == 0
		}
		return in != (pr.Op == OpNotIn)
	}
	c, _ := new(big.Rat).SetString(pr.Values[0].Text)
	cmp := val.Cmp(c)
	return refCmp(cmp, pr.Op)
}

func refCmp(cmp int, op Op) bool {
	switch op {
	case OpEq:
		return cmp == 0
	case OpNe:
		return cmp != 0
	case OpLt:
		return cmp < 0
	case OpLe:
		return cmp <= 0
	case OpGt:
		return cmp > 0
	case OpGe:
		return cmp >= 0
	}
	panic("op")
}

// refInf: NaN satisfies nothing; ±Inf compares beyond every constant.
func refInf(x float64, pr Predicate) bool {
	if x != x {
		return false
	}
	if x > 0 {
		return refCmp(1, pr.Op)
	}
	return refCmp(-1, pr.Op)
}

func refHash(v any) uint64 {
	var enc []byte
	switch x := v.(type) {
	case string:
		enc = append([]byte{'s'}, x...)
	case []byte:
		enc = append([]byte{'b'}, x...)
	case int32:
		enc = binary.LittleEndian.AppendUint64([]byte{'i'}, uint64(int64(x)))
	case int64:
		enc = binary.LittleEndian.AppendUint64([]byte{'i'}, uint64(x))
	case bool:
		enc = []byte{'z', 0}
		if x {
			enc[1] = 1
		}
	default:
		panic(fmt.Sprintf("reference: distinct value %T", v))
	}
	return xxh3.Hash(enc)
}
