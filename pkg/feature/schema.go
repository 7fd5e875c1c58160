package feature

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// Head is the non-feature part of an output record: the event's identity, its
// ms_since_previous and late flag, and the lineage of the input record.
type Head struct {
	EventID         string
	EntityID        string
	EventTime       int64 // ms since the Unix epoch (timestamp-millis)
	MsSincePrevious int64 // meaningful only when HasPrevious; else the field is null
	HasPrevious     bool
	Late            bool
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
}

// SchemaName is the generated record's full name.
const SchemaName = "io.velocity.v1.VelocityFeatureRow"

// AvroSchema returns the output record's Avro schema for spec (which must be valid),
// as JSON: a flat record of event_id, entity_id, event_time, the Columns in order,
// then ms_since_previous, late, source_topic, source_partition, source_offset. The
// same spec always gives the same text.
func AvroSchema(spec *Spec) string {
	type field struct {
		Name string `json:"name"`
		Type any    `json:"type"`
		Doc  string `json:"doc,omitempty"`
	}
	var fields []any
	add := func(name string, typ any, doc string) {
		fields = append(fields, field{Name: name, Type: typ, Doc: doc})
	}
	nullable := func(name, doc string) {
		// encoding/json drops a nil default with omitempty; write it explicitly.
		fields = append(fields, struct {
			Name    string   `json:"name"`
			Type    []string `json:"type"`
			Default *int     `json:"default"`
			Doc     string   `json:"doc,omitempty"`
		}{name, []string{"null", "long"}, nil, doc})
	}
	add("event_id", "string", "event_id of the event these features describe.")
	add("entity_id", "string", "Entity of the event; also the record key.")
	add("event_time", map[string]string{"type": "long", "logicalType": "timestamp-millis"}, "Event time, Unix epoch milliseconds UTC.")
	for _, c := range spec.Columns() {
		f := &spec.Features[c.Feature]
		switch c.Kind {
		case KindLong:
			add(c.Name, "long", columnDoc(spec, f, c))
		case KindNullableLong:
			nullable(c.Name, columnDoc(spec, f, c))
		case KindBoolean:
			add(c.Name, "boolean", "True when every window of "+f.Name+" was counted exactly; false when some is an estimate (docs/feature-outputs.md).")
		}
	}
	nullable("ms_since_previous", "Milliseconds since the entity's previous counted event in apply order; null for its first event in the retained history.")
	add("late", "boolean", "True when the event arrived behind the watermark and was applied anyway (--late=apply).")
	add("source_topic", "string", "Topic the event was read from.")
	add("source_partition", "int", "Partition the event was read from.")
	add("source_offset", "long", "Offset of the event in its partition.")
	dot := strings.LastIndexByte(SchemaName, '.')
	b, err := json.Marshal(map[string]any{
		"type":      "record",
		"name":      SchemaName[dot+1:],
		"namespace": SchemaName[:dot],
		"doc":       "Features of one counted event, one field per feature and window, generated from a feature definition.",
		"fields":    fields,
	})
	if err != nil {
		panic(err) // only strings, maps and slices: cannot fail
	}
	return string(b)
}

func columnDoc(spec *Spec, f *Feature, c Column) string {
	what := f.Agg.String()
	if f.Agg == Sum || f.Agg == Min || f.Agg == Max {
		what += " of the amount in minor units"
	}
	if f.Agg == DistinctCount {
		what = fmt.Sprintf("distinct values of slot %d (an estimate when %s_exact is false)", f.Distinct, f.Name)
	}
	doc := fmt.Sprintf("%s over the %s window", what, spec.Windows[c.Window].Name)
	if f.Filter >= 0 {
		doc += fmt.Sprintf(", events matching filter %d only", f.Filter)
	}
	if c.Kind == KindNullableLong {
		doc += "; null when no such event is in the window"
	}
	return doc + "."
}

// AppendRow appends the Avro binary encoding of one output record (AvroSchema(spec))
// to dst: head and row in field order. It does not allocate when dst has room. row
// must fit spec (NewRow).
func AppendRow(dst []byte, spec *Spec, head *Head, row *Row) []byte {
	dst = codec.AppendString(dst, head.EventID)
	dst = codec.AppendString(dst, head.EntityID)
	dst = codec.AppendLong(dst, head.EventTime)
	c := 0
	for fi := range spec.Features {
		f := &spec.Features[fi]
		nullable := f.Agg == Min || f.Agg == Max
		for range f.Windows {
			switch {
			case !nullable:
				dst = codec.AppendLong(dst, row.Values[c])
			case row.Null[c]:
				dst = append(dst, 0) // union branch 0: null
			default:
				dst = append(dst, 2) // union branch 1: long
				dst = codec.AppendLong(dst, row.Values[c])
			}
			c++
		}
	}
	for _, x := range row.Exact {
		dst = appendBool(dst, x)
	}
	if head.HasPrevious {
		dst = append(dst, 2)
		dst = codec.AppendLong(dst, head.MsSincePrevious)
	} else {
		dst = append(dst, 0)
	}
	dst = appendBool(dst, head.Late)
	dst = codec.AppendString(dst, head.SourceTopic)
	dst = codec.AppendLong(dst, int64(head.SourcePartition))
	return codec.AppendLong(dst, head.SourceOffset)
}

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// ErrBadRow wraps every ParseRow failure.
var ErrBadRow = errors.New("feature: bad output record")

// ParseRow decodes one record written by AppendRow for spec (any Avro writer's
// encoding of AvroSchema(spec) decodes the same) into head and row (made by NewRow
// for spec), for the file sinks. Strings in head are copies. It rejects truncated
// input, bad union branches and booleans, ints out of range and trailing bytes.
func ParseRow(data []byte, spec *Spec, head *Head, row *Row) error {
	if !row.fits(spec) {
		return fmt.Errorf("%w: %w", ErrBadRow, errRowShape)
	}
	r := rowReader{b: data}
	head.EventID = r.str("event_id")
	head.EntityID = r.str("entity_id")
	head.EventTime = r.long("event_time")
	c := 0
	for fi := range spec.Features {
		f := &spec.Features[fi]
		nullable := f.Agg == Min || f.Agg == Max
		for range f.Windows {
			row.Null[c] = false
			if nullable {
				switch r.long("union branch") {
				case 0:
					row.Values[c], row.Null[c] = 0, true
				case 1:
					row.Values[c] = r.long("min/max")
				default:
					r.fail("union branch", "out of range")
				}
			} else {
				row.Values[c] = r.long("value")
			}
			c++
		}
	}
	for i := range row.Exact {
		row.Exact[i] = r.boolean("exact")
	}
	switch r.long("ms_since_previous branch") {
	case 0:
		head.MsSincePrevious, head.HasPrevious = 0, false
	case 1:
		head.MsSincePrevious, head.HasPrevious = r.long("ms_since_previous"), true
	default:
		r.fail("ms_since_previous", "union branch out of range")
	}
	head.Late = r.boolean("late")
	head.SourceTopic = r.str("source_topic")
	p := r.long("source_partition")
	if p < math.MinInt32 || p > math.MaxInt32 {
		r.fail("source_partition", "int out of range")
	}
	head.SourcePartition = int32(p)
	head.SourceOffset = r.long("source_offset")
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return fmt.Errorf("%w: %w", ErrBadRow, r.err)
	}
	return nil
}

type rowReader struct {
	b   []byte
	err error
}

func (r *rowReader) fail(field, what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%s: %s", field, what)
	}
}

func (r *rowReader) long(field string) int64 {
	if r.err != nil {
		return 0
	}
	var u uint64
	for i := 0; i < 10; i++ {
		if i >= len(r.b) {
			r.fail(field, "truncated")
			return 0
		}
		c := r.b[i]
		if i == 9 && c > 1 {
			r.fail(field, "varint overflows 64 bits")
			return 0
		}
		u |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			r.b = r.b[i+1:]
			return int64(u>>1) ^ -int64(u&1)
		}
	}
	r.fail(field, "varint longer than 10 bytes")
	return 0
}

func (r *rowReader) str(field string) string {
	n := r.long(field)
	if r.err != nil {
		return ""
	}
	if n < 0 || n > int64(len(r.b)) {
		r.fail(field, "length beyond the record")
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *rowReader) boolean(field string) bool {
	if r.err != nil {
		return false
	}
	if len(r.b) == 0 {
		r.fail(field, "truncated")
		return false
	}
	c := r.b[0]
	if c > 1 {
		r.fail(field, "boolean byte out of range")
		return false
	}
	r.b = r.b[1:]
	return c == 1
}
