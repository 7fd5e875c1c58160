package codec

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// NewDecoder returns the Decoder for values written with writerSchema.
// writerSchema "" means ours, and so does any schema with the same Parsing
// Canonical Form: those get the hand-written fast path. Any other writer
// schema is parsed with goavro and resolved against ours by field name: fields
// we do not know are skipped, reordered fields are found, int widens to long,
// bytes read as string, and currency, the one field with a default, may be
// absent. A writer schema that cannot supply a field we require is an error
// here rather than a dead letter per record. Zero Limits fields take their
// defaults. Decoders are stateless and safe for concurrent use.
func NewDecoder(writerSchema string, limits Limits) (Decoder, error) {
	limits = limits.WithDefaults()
	if limits.MaxRecordBytes < 0 || limits.MaxAheadMs < 0 {
		return nil, fmt.Errorf("codec limits must not be negative: %+v", limits)
	}
	if writerSchema == "" {
		return &fastDecoder{limits: limits}, nil
	}
	// The compatibility check comes first even for a schema that looks like
	// ours: the Parsing Canonical Form drops logical types, so a writer with
	// event_time in timestamp-micros has our canonical form and a different
	// meaning.
	d, err := newGoavroDecoder(writerSchema, limits)
	if err != nil {
		return nil, err
	}
	if d.codec.CanonicalSchema() == ourTransaction.CanonicalSchema() {
		return &fastDecoder{limits: limits}, nil
	}
	return d, nil
}

// maxGoavroBlockCount bounds the items goavro accepts in one array or map
// block. goavro sizes its slice or map from the block count before reading a
// single item, and its default bound is MaxInt32: one corrupt record written
// with a schema that has an array field (a count near 2^31 in a few bytes)
// asks for 32 GiB. A record is at most Limits.MaxRecordBytes (1 MiB by
// default), so a million items per block is more than any legitimate record
// or container-file block of ours holds, and caps that allocation at 16 MiB.
const maxGoavroBlockCount = 1 << 20

// goavro documents MaxBlockCount as the process-wide knob for this; it is set
// once here, before any decoder exists, and only ever lowered.
func init() {
	if goavro.MaxBlockCount > maxGoavroBlockCount {
		goavro.MaxBlockCount = maxGoavroBlockCount
	}
}

// ourTransaction is our reader schema, parsed once; the package cannot work
// without it, so a parse failure is a build defect and panics at init.
var ourTransaction = func() *goavro.Codec {
	c, err := goavro.NewCodec(schemas.Transaction)
	if err != nil {
		panic("codec: embedded Transaction schema does not parse: " + err.Error())
	}
	return c
}()

// goavroDecoder decodes with the writer's schema through goavro (one map per
// record) and projects the result onto our Transaction. It is the slow,
// general path for writer schemas that differ from ours, and the reference
// the fast path is tested against.
type goavroDecoder struct {
	codec       *goavro.Codec
	limits      Limits
	hasCurrency bool // the writer schema has a currency field; otherwise its default "" applies
}

// readerField is one field of our schema and the primitive writer types that
// resolve to it under the Avro rules (promotion int→long, bytes→string).
type readerField struct {
	name     string
	accepts  []string
	optional bool // has a default in our schema
}

var transactionFields = []readerField{
	{"event_id", []string{"string", "bytes"}, false},
	{"entity_id", []string{"string", "bytes"}, false},
	{"amount_minor", []string{"long", "int"}, false},
	{"currency", []string{"string", "bytes"}, true},
	{"event_time", []string{"long", "int"}, false},
}

func newGoavroDecoder(writerSchema string, limits Limits) (*goavroDecoder, error) {
	c, err := goavro.NewCodec(writerSchema)
	if err != nil {
		return nil, fmt.Errorf("parse writer schema: %w", err)
	}
	var rec struct {
		Type   any `json:"type"`
		Fields []struct {
			Name string `json:"name"`
			Type any    `json:"type"`
		} `json:"fields"`
	}
	if err := json.Unmarshal([]byte(writerSchema), &rec); err != nil || rec.Type != "record" {
		return nil, fmt.Errorf("writer schema is not an Avro record schema; transactions need a record")
	}
	d := &goavroDecoder{codec: c, limits: limits}
	for _, rf := range transactionFields {
		found := false
		for _, wf := range rec.Fields {
			if wf.Name != rf.name {
				continue
			}
			found = true
			if !anyKind(primitiveKinds(wf.Type), rf.accepts) {
				return nil, fmt.Errorf("writer schema field %s has type %v, which does not resolve to our %s", rf.name, wf.Type, rf.accepts[0])
			}
		}
		switch {
		case !found && !rf.optional:
			return nil, fmt.Errorf("writer schema has no field %s, which our Transaction schema requires", rf.name)
		case found && rf.name == "currency":
			d.hasCurrency = true
		}
	}
	return d, nil
}

// primitiveKinds lists the primitive types a schema JSON value can carry: the
// type itself, or each branch of a union. Named references resolve to nothing,
// which makes such a field incompatible with our primitive fields.
func primitiveKinds(t any) []string {
	switch v := t.(type) {
	case string:
		return []string{v}
	case map[string]any:
		s, ok := v["type"].(string)
		if !ok {
			return nil
		}
		// A logical type that changes the unit (timestamp-micros, date,
		// decimal …) must not pass for our value, so it gets a kind of its
		// own that matches nothing we accept.
		switch lt, _ := v["logicalType"].(string); lt {
		case "", "timestamp-millis", "local-timestamp-millis", "uuid":
			return []string{s}
		default:
			return []string{s + "/" + lt}
		}
	case []any:
		var out []string
		for _, b := range v {
			out = append(out, primitiveKinds(b)...)
		}
		return out
	}
	return nil
}

func anyKind(have, want []string) bool {
	for _, h := range have {
		for _, w := range want {
			if h == w {
				return true
			}
		}
	}
	return false
}

func (d *goavroDecoder) Decode(value []byte, maxSeen int64, hasMaxSeen bool, tx *Transaction) *Rejection {
	if len(value) > d.limits.MaxRecordBytes {
		return tooLarge(len(value), d.limits.MaxRecordBytes)
	}
	native, rest, err := d.codec.NativeFromBinary(value)
	if err != nil {
		return &Rejection{ReasonDecode, err.Error()}
	}
	if len(rest) != 0 {
		return &Rejection{ReasonDecode, strconv.Itoa(len(rest)) + " trailing bytes after the record"}
	}
	if r := d.project(native, tx); r != nil {
		return r
	}
	return validate(tx, &d.limits, maxSeen, hasMaxSeen)
}

// project resolves one goavro-decoded record onto our Transaction, without
// validating it.
func (d *goavroDecoder) project(native any, tx *Transaction) *Rejection {
	m, ok := native.(map[string]any)
	if !ok {
		return &Rejection{ReasonDecode, fmt.Sprintf("writer schema decoded to %T, not a record", native)}
	}
	var r *Rejection
	if tx.EventID, r = stringField(m, "event_id", ReasonInvalidEventID); r != nil {
		return r
	}
	if tx.EntityID, r = stringField(m, "entity_id", ReasonInvalidEntityID); r != nil {
		return r
	}
	if tx.AmountMinor, r = longField(m, "amount_minor", ReasonInvalidAmountMinor); r != nil {
		return r
	}
	tx.Currency = ""
	if d.hasCurrency {
		if tx.Currency, r = stringField(m, "currency", ReasonInvalidCurrency); r != nil {
			return r
		}
	}
	tx.EventTime, r = longField(m, "event_time", ReasonInvalidEventTime)
	return r
}

// unwrapUnion returns the value of a goavro union ({"branch": value}) or v
// itself.
func unwrapUnion(v any) any {
	if u, ok := v.(map[string]any); ok && len(u) == 1 {
		for _, x := range u {
			return x
		}
	}
	return v
}

// A null in a field we require is the field missing, so it gets that field's
// invalid reason; a value of a type that cannot resolve is undecodable.
func stringField(m map[string]any, name string, invalid Reason) (string, *Rejection) {
	switch v := unwrapUnion(m[name]).(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case nil:
		return "", &Rejection{invalid, name + " is null"}
	default:
		return "", &Rejection{ReasonDecode, fmt.Sprintf("%s holds %T, which does not resolve to string", name, v)}
	}
}

func longField(m map[string]any, name string, invalid Reason) (int64, *Rejection) {
	switch v := unwrapUnion(m[name]).(type) {
	case int64:
		return v, nil
	case int32:
		return int64(v), nil
	case time.Time: // goavro turns timestamp-millis into time.Time
		return v.UnixMilli(), nil
	case nil:
		return 0, &Rejection{invalid, name + " is null"}
	default:
		return 0, &Rejection{ReasonDecode, fmt.Sprintf("%s holds %T, which does not resolve to long", name, v)}
	}
}
