package definition

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/linkedin/goavro/v2"
)

// kind is an Avro type as the walker sees it.
type kind uint8

const (
	kNull kind = iota
	kBoolean
	kInt
	kLong
	kFloat
	kDouble
	kBytes
	kString
	kRecord
	kEnum
	kArray
	kMap
	kUnion
	kFixed
)

var kindNames = [...]string{"null", "boolean", "int", "long", "float", "double", "bytes", "string", "record", "enum", "array", "map", "union", "fixed"}

func (k kind) String() string { return kindNames[k] }

// node is one type of the writer schema, with named types resolved: a
// reference to a named type is the same *node as its definition, so a
// recursive schema is a cyclic graph.
type node struct {
	kind      kind
	name      string // full name of a record, enum or fixed
	logical   string // logicalType as written, "" without one
	precision int    // decimal only
	scale     int    // decimal only
	size      int    // fixed only
	symbols   []string
	fields    []avroField
	items     *node   // array items, map values
	branches  []*node // union
}

type avroField struct {
	name string
	typ  *node
}

// isDecimal reports whether n is a decimal goavro honours: bytes or fixed with
// the logical type (goavro refuses a schema whose decimal lacks a valid
// precision, so parseSchema never sees one here).
func (n *node) isDecimal() bool {
	return n.logical == "decimal" && (n.kind == kBytes || n.kind == kFixed)
}

// describe renders n for error messages: its type, logical type and name.
func (n *node) describe() string {
	switch {
	case n.isDecimal():
		return fmt.Sprintf("%s decimal(%d,%d)", n.kind, n.precision, n.scale)
	case n.logical != "":
		return n.kind.String() + " " + n.logical
	case n.kind == kUnion:
		parts := make([]string, len(n.branches))
		for i, b := range n.branches {
			parts[i] = b.describe()
		}
		return "union [" + strings.Join(parts, ", ") + "]"
	case n.name != "":
		return n.kind.String() + " " + n.name
	}
	return n.kind.String()
}

// parseSchema reads an Avro schema. goavro parses it first so that a schema
// goavro refuses is refused here too (the decoder is held to goavro's reading),
// then the JSON is walked again to build the graph the walker needs.
func parseSchema(schema string) (*node, *goavro.Codec, error) {
	codec, err := goavro.NewCodec(schema)
	if err != nil {
		return nil, nil, fmt.Errorf("writer schema does not parse: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(schema)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, nil, fmt.Errorf("writer schema is not JSON: %w", err)
	}
	p := &schemaParser{named: map[string]*node{}}
	n, err := p.parse(v, "")
	if err != nil {
		return nil, nil, fmt.Errorf("writer schema: %w", err)
	}
	if n.kind != kRecord {
		return nil, nil, fmt.Errorf("writer schema is a %s, not a record; transactions need a record", n.describe())
	}
	return n, codec, nil
}

type schemaParser struct {
	named map[string]*node
}

var primitives = map[string]kind{
	"null": kNull, "boolean": kBoolean, "int": kInt, "long": kLong, "float": kFloat,
	"double": kDouble, "bytes": kBytes, "string": kString,
}

func (p *schemaParser) parse(v any, ns string) (*node, error) {
	switch t := v.(type) {
	case string:
		if k, ok := primitives[t]; ok {
			return &node{kind: k}, nil
		}
		// A short name means the type in the enclosing namespace (the Avro
		// specification) but goavro looks for the name as written first. When
		// both exist and differ, the two readings disagree, so the schema is
		// refused rather than read one way or the other.
		asWritten, okWritten := p.named[t]
		var inNS *node
		okNS := false
		if !strings.Contains(t, ".") && ns != "" {
			inNS, okNS = p.named[ns+"."+t]
		}
		switch {
		case okWritten && okNS && asWritten != inNS:
			return nil, fmt.Errorf("type name %q is ambiguous: it can mean %s or %s; write the full name", t, t, ns+"."+t)
		case okNS:
			return inNS, nil
		case okWritten:
			return asWritten, nil
		}
		return nil, fmt.Errorf("unknown type name %q", t)
	case []any:
		n := &node{kind: kUnion}
		for _, b := range t {
			bn, err := p.parse(b, ns)
			if err != nil {
				return nil, err
			}
			n.branches = append(n.branches, bn)
		}
		return n, nil
	case map[string]any:
		return p.parseComplex(t, ns)
	}
	return nil, fmt.Errorf("type %v is neither a name, a union nor an object", v)
}

func (p *schemaParser) parseComplex(m map[string]any, ns string) (*node, error) {
	typ, _ := m["type"].(string)
	if typ == "" {
		// {"type": {...}} or {"type": [...]} wraps another type.
		if inner, ok := m["type"]; ok {
			return p.parse(inner, ns)
		}
		return nil, fmt.Errorf("object without a type")
	}
	lt, _ := m["logicalType"].(string)
	switch typ {
	case "record", "error", "enum", "fixed":
		full, childNS := fullName(m, ns)
		n := &node{name: full, logical: lt}
		// Registered before the fields are read, so that a record may refer
		// to itself.
		p.named[full] = n
		switch typ {
		case "enum":
			n.kind = kEnum
			syms, _ := m["symbols"].([]any)
			for _, s := range syms {
				str, _ := s.(string)
				n.symbols = append(n.symbols, str)
			}
		case "fixed":
			n.kind = kFixed
			size, err := intAttr(m, "size")
			if err != nil {
				return nil, fmt.Errorf("fixed %s: %w", full, err)
			}
			n.size = size
			if lt == "decimal" {
				if err := decimalAttrs(n, m); err != nil {
					return nil, fmt.Errorf("fixed %s: %w", full, err)
				}
			}
		default:
			n.kind = kRecord
			fields, _ := m["fields"].([]any)
			for _, f := range fields {
				fm, ok := f.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("record %s: a field is not an object", full)
				}
				name, _ := fm["name"].(string)
				ft, err := p.parse(fm["type"], childNS)
				if err != nil {
					return nil, fmt.Errorf("record %s field %s: %w", full, name, err)
				}
				n.fields = append(n.fields, avroField{name: name, typ: ft})
			}
		}
		return n, nil
	case "array", "map":
		key := "items"
		k := kArray
		if typ == "map" {
			key, k = "values", kMap
		}
		items, err := p.parse(m[key], ns)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", typ, key, err)
		}
		return &node{kind: k, items: items, logical: lt}, nil
	}
	k, ok := primitives[typ]
	if !ok {
		// A reference written as {"type": "Name"}.
		return p.parse(typ, ns)
	}
	n := &node{kind: k, logical: lt}
	if lt == "decimal" && k == kBytes {
		if err := decimalAttrs(n, m); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func fullName(m map[string]any, ns string) (full, childNS string) {
	name, _ := m["name"].(string)
	if strings.Contains(name, ".") {
		return name, name[:strings.LastIndexByte(name, '.')]
	}
	if s, ok := m["namespace"].(string); ok {
		ns = s
	}
	if ns == "" {
		return name, ""
	}
	return ns + "." + name, ns
}

func intAttr(m map[string]any, key string) (int, error) {
	num, ok := m[key].(json.Number)
	if !ok {
		return 0, fmt.Errorf("%s is missing or not a number", key)
	}
	i, err := num.Int64()
	if err != nil || i < 0 || i > 1<<30 {
		return 0, fmt.Errorf("%s %s is not a non-negative integer", key, num)
	}
	return int(i), nil
}

func decimalAttrs(n *node, m map[string]any) error {
	prec, err := intAttr(m, "precision")
	if err != nil {
		return fmt.Errorf("decimal: %w", err)
	}
	n.precision = prec
	if _, ok := m["scale"]; ok {
		if n.scale, err = intAttr(m, "scale"); err != nil {
			return fmt.Errorf("decimal: %w", err)
		}
	}
	return nil
}
