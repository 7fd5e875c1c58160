package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// Flat records: the features records of a feature definition (pkg/feature),
// one Avro record of primitive fields generated from the definition. The file
// sinks read them by their schema, not by a Go type, so a JSON-lines or Parquet
// file says exactly what the topic would for any definition: the schema is the
// one statement of the columns, and the same bytes are parsed for every output.

// flatKind is the Avro type of one field of a flat record.
type flatKind uint8

const (
	flatString flatKind = iota
	flatLong
	flatInt
	flatBool
	flatOptLong // ["null", "long"]
)

// flatField is one field of a flat record schema.
type flatField struct {
	name      string
	kind      flatKind
	timestamp bool // long with logicalType timestamp-millis
}

// flatSchema is a flat record schema: what a definition's output schema is.
type flatSchema struct {
	name   string
	fields []flatField
}

// parseFlatSchema reads an Avro record schema whose fields are all string,
// long (optionally timestamp-millis), int, boolean or ["null","long"]; any
// other shape is an error naming the field.
func parseFlatSchema(avsc string) (*flatSchema, error) {
	var rec struct {
		Type   string `json:"type"`
		Name   string `json:"name"`
		Fields []struct {
			Name string          `json:"name"`
			Type json.RawMessage `json:"type"`
		} `json:"fields"`
	}
	if err := json.Unmarshal([]byte(avsc), &rec); err != nil {
		return nil, fmt.Errorf("flat schema: %w", err)
	}
	if rec.Type != "record" || len(rec.Fields) == 0 {
		return nil, errors.New("flat schema: not a record with fields")
	}
	s := &flatSchema{name: rec.Name}
	for _, f := range rec.Fields {
		ff := flatField{name: f.Name}
		var prim string
		var logical struct {
			Type        string `json:"type"`
			LogicalType string `json:"logicalType"`
		}
		var union []string
		switch {
		case json.Unmarshal(f.Type, &prim) == nil:
		case json.Unmarshal(f.Type, &union) == nil:
			if len(union) != 2 || union[0] != "null" || union[1] != "long" {
				return nil, fmt.Errorf("flat schema: field %s: union %v, want [\"null\",\"long\"]", f.Name, union)
			}
			prim = "optlong"
		case json.Unmarshal(f.Type, &logical) == nil:
			prim = logical.Type
			if logical.LogicalType == "timestamp-millis" && prim == "long" {
				ff.timestamp = true
			}
		default:
			return nil, fmt.Errorf("flat schema: field %s: type %s is not flat", f.Name, f.Type)
		}
		switch prim {
		case "string":
			ff.kind = flatString
		case "long":
			ff.kind = flatLong
		case "int":
			ff.kind = flatInt
		case "boolean":
			ff.kind = flatBool
		case "optlong":
			ff.kind = flatOptLong
		default:
			return nil, fmt.Errorf("flat schema: field %s: type %q is not flat", f.Name, prim)
		}
		s.fields = append(s.fields, ff)
	}
	return s, nil
}

// flatValue is one field of a parsed record: str for strings (pointing into the
// value), num for long, int and boolean (0/1), null for a null optional long.
type flatValue struct {
	str  []byte
	num  int64
	null bool
}

// parse fills vals (one per field) from one value, which must be exactly one
// record of the schema.
func (s *flatSchema) parse(b []byte, vals []flatValue) error {
	r := viewReader{b: b, ok: true}
	for i := range s.fields {
		v := &vals[i]
		switch s.fields[i].kind {
		case flatString:
			v.str = r.bytes()
		case flatLong:
			v.num = r.long()
		case flatInt:
			// An Avro int is a zig-zag varint too, but one that must fit 32 bits.
			if v.num = r.long(); v.num != int64(int32(v.num)) {
				r.ok = false
			}
		case flatBool:
			if r.ok && r.i < len(b) && b[r.i] <= 1 {
				v.num = int64(b[r.i])
				r.i++
			} else {
				r.ok = false
			}
		case flatOptLong:
			switch u := r.long(); u {
			case 0:
				v.null, v.num = true, 0
			case 1:
				v.null, v.num = false, r.long()
			default:
				r.ok = false
			}
		}
		if !r.ok {
			return fmt.Errorf("%w: field %s at byte %d of %d", errBadValue, s.fields[i].name, r.i, len(b))
		}
	}
	if r.i != len(b) {
		return fmt.Errorf("%w: %d trailing bytes", errBadValue, len(b)-r.i)
	}
	return nil
}

// appendFlatJSON appends one JSON line with the schema's field names in schema
// order; numbers are integers, booleans true/false, a null optional long null.
func (s *flatSchema) appendJSON(b []byte, vals []flatValue) []byte {
	b = append(b, '{')
	for i := range s.fields {
		f := &s.fields[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, f.name...) // Avro names need no escaping
		b = append(b, '"', ':')
		v := &vals[i]
		switch f.kind {
		case flatString:
			b = appendJSONString(b, v.str)
		case flatBool:
			b = strconv.AppendBool(b, v.num == 1)
		case flatOptLong:
			if v.null {
				b = append(b, "null"...)
				break
			}
			fallthrough
		default:
			b = strconv.AppendInt(b, v.num, 10)
		}
	}
	return append(b, "}\n"...)
}

// FlatJSONLSink writes a feature definition's features records as JSON lines,
// one object per record with the output schema's field names in its order:
//
//	{"event_id":"e2","entity_id":"card-A","event_time":1793491200400,
//	 "txn_count_1h":2,…,"max_amount_24h":null,…,"merchants_exact":true,
//	 "ms_since_previous":400,"late":false,
//	 "source_topic":"t","source_partition":0,"source_offset":1}
type FlatJSONLSink struct {
	f      *atomicFile
	schema *flatSchema
	vals   []flatValue
	buf    []byte
}

// NewFlatJSONLSink creates name.partial for records of the output schema avsc
// (feature.Spec's generated schema); Commit renames it to name.
func NewFlatJSONLSink(name, avsc string) (*FlatJSONLSink, error) {
	fs, err := parseFlatSchema(avsc)
	if err != nil {
		return nil, err
	}
	f, err := createAtomic(name)
	if err != nil {
		return nil, err
	}
	return &FlatJSONLSink{f: f, schema: fs, vals: make([]flatValue, len(fs.fields)), buf: make([]byte, 0, 1024)}, nil
}

// Write appends one features record; dead letters are not its business.
func (s *FlatJSONLSink) Write(o *pipeline.Output) error {
	if err := s.schema.parse(o.Value, s.vals); err != nil {
		return err
	}
	s.buf = s.schema.appendJSON(s.buf[:0], s.vals)
	_, err := s.f.Write(s.buf)
	return err
}

// Commit implements Sink.
func (s *FlatJSONLSink) Commit(context.Context) error { return s.f.commit() }

// Abort implements Sink.
func (s *FlatJSONLSink) Abort() error { return s.f.abort() }
