package feature

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"
)

func randomRow(r *rand.Rand, spec *Spec) (*Head, *Row) {
	long := func() int64 {
		switch r.IntN(4) {
		case 0:
			return int64(r.Uint64())
		case 1:
			return []int64{0, -1, 1, math.MaxInt64, math.MinInt64, 63, 64, -64, -65}[r.IntN(9)]
		}
		return int64(r.IntN(100_000))
	}
	str := func() string {
		b := make([]byte, r.IntN(40))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return strings.ToValidUTF8(string(b), "?")
	}
	h := &Head{
		EventID: str(), EntityID: str(), EventTime: long(),
		MsSincePrevious: long(), HasPrevious: r.IntN(2) == 0, Late: r.IntN(2) == 0,
		SourceTopic: str(), SourcePartition: int32(r.Uint32()), SourceOffset: long(),
	}
	if !h.HasPrevious {
		h.MsSincePrevious = 0
	}
	row := NewRow(spec)
	for c, col := range spec.Columns() {
		if col.Kind == KindBoolean {
			continue
		}
		row.Values[c] = long()
		if col.Kind == KindNullableLong && r.IntN(3) == 0 {
			row.Values[c], row.Null[c] = 0, true
		}
	}
	for i := range row.Exact {
		row.Exact[i] = r.IntN(2) == 0
	}
	return h, row
}

// native is the goavro form of head and row.
func native(spec *Spec, h *Head, row *Row) map[string]any {
	m := map[string]any{
		"event_id": h.EventID, "entity_id": h.EntityID, "event_time": h.EventTime,
		"late": h.Late, "source_topic": h.SourceTopic, "source_partition": h.SourcePartition, "source_offset": h.SourceOffset,
	}
	m["ms_since_previous"] = nil
	if h.HasPrevious {
		m["ms_since_previous"] = goavro.Union("long", h.MsSincePrevious)
	}
	d := 0
	for c, col := range spec.Columns() {
		switch col.Kind {
		case KindLong:
			m[col.Name] = row.Values[c]
		case KindNullableLong:
			m[col.Name] = nil
			if !row.Null[c] {
				m[col.Name] = goavro.Union("long", row.Values[c])
			}
		case KindBoolean:
			m[col.Name] = row.Exact[d]
			d++
		}
	}
	return m
}

// TestAppendRowMatchesGoavro: AppendRow's bytes are goavro's for the generated
// schema, byte for byte, on random rows (extreme values, nulls, empty and long
// strings); ParseRow reads them back, and goavro reads them as the same record.
func TestAppendRowMatchesGoavro(t *testing.T) {
	spec := testSpec(t)
	codec, err := goavro.NewCodec(AvroSchema(&spec))
	if err != nil {
		t.Fatalf("generated schema does not parse: %v\n%s", err, AvroSchema(&spec))
	}
	r := rand.New(rand.NewPCG(5, 5))
	var buf []byte
	h2, row2 := &Head{}, NewRow(&spec)
	for i := range 3000 {
		h, row := randomRow(r, &spec)
		want, err := codec.BinaryFromNative(nil, native(&spec, h, row))
		if err != nil {
			t.Fatal(err)
		}
		buf = AppendRow(buf[:0], &spec, h, row)
		if !bytes.Equal(buf, want) {
			t.Fatalf("row %d: AppendRow\n%x\ngoavro\n%x", i, buf, want)
		}
		if err := ParseRow(buf, &spec, h2, row2); err != nil {
			t.Fatalf("row %d: ParseRow: %v", i, err)
		}
		if *h2 != *h || !reflect.DeepEqual(row2.Values, row.Values) || !reflect.DeepEqual(row2.Null, row.Null) || !reflect.DeepEqual(row2.Exact, row.Exact) {
			t.Fatalf("row %d: ParseRow gave %+v %+v, want %+v %+v", i, h2, row2, h, row)
		}
		back, rest, err := codec.NativeFromBinary(buf)
		if err != nil || len(rest) != 0 {
			t.Fatalf("row %d: goavro cannot read AppendRow's bytes: %v (%d left)", i, err, len(rest))
		}
		if got := back.(map[string]any)["source_offset"]; got != h.SourceOffset {
			t.Fatalf("row %d: goavro read source_offset %v, want %d", i, got, h.SourceOffset)
		}
	}
}

// TestSchemaNames: the generated field names and types, in order, for a small spec.
func TestSchemaNames(t *testing.T) {
	spec := testSpec(t)
	var s struct {
		Name, Namespace string
		Fields          []struct {
			Name    string
			Type    any
			Default any
		}
	}
	js := AvroSchema(&spec)
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		t.Fatal(err)
	}
	if s.Namespace+"."+s.Name != SchemaName {
		t.Errorf("record %s.%s, want %s", s.Namespace, s.Name, SchemaName)
	}
	var got []string
	for _, f := range s.Fields {
		typ, _ := json.Marshal(f.Type)
		got = append(got, f.Name+":"+string(typ))
	}
	want := []string{
		`event_id:"string"`, `entity_id:"string"`, `event_time:{"logicalType":"timestamp-millis","type":"long"}`,
		`cnt_10s:"long"`, `cnt_1m:"long"`, `cnt_5m:"long"`, `cnt_1500ms:"long"`,
		`amt_1m:"long"`, `amt_5m:"long"`,
		`lo_5m:["null","long"]`, `lo_10s:["null","long"]`,
		`hi_5m:["null","long"]`, `hi_10s:["null","long"]`, `hi_1500ms:["null","long"]`,
		`declines_10s:"long"`,
		`merchants_10s:"long"`, `merchants_1m:"long"`, `merchants_5m:"long"`,
		`declined_cards_5m:"long"`, `declined_cards_1500ms:"long"`,
		`mn_1m:["null","long"]`, `sum_all_1500ms:"long"`, `sum_all_5m:"long"`,
		`merchants_exact:"boolean"`, `declined_cards_exact:"boolean"`,
		`ms_since_previous:["null","long"]`, `late:"boolean"`, `source_topic:"string"`, `source_partition:"int"`, `source_offset:"long"`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fields:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(js, `"default":null`) {
		t.Error("nullable fields carry no null default")
	}
	if AvroSchema(&spec) != js {
		t.Error("AvroSchema is not deterministic")
	}
}

func TestAppendRowAllocs(t *testing.T) {
	spec := testSpec(t)
	h, row := randomRow(rand.New(rand.NewPCG(1, 1)), &spec)
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() { buf = AppendRow(buf[:0], &spec, h, row) }); n != 0 {
		t.Errorf("AppendRow: %.1f allocations per call, want 0", n)
	}
}

// TestParseRowRejects: truncations of a valid record at every length, a trailing
// byte, bad union branches and booleans, and an int out of range all fail.
func TestParseRowRejects(t *testing.T) {
	spec := testSpec(t)
	h, row := randomRow(rand.New(rand.NewPCG(2, 2)), &spec)
	good := AppendRow(nil, &spec, h, row)
	h2, row2 := &Head{}, NewRow(&spec)
	for n := range len(good) {
		if err := ParseRow(good[:n], &spec, h2, row2); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", n, len(good))
		}
	}
	if err := ParseRow(append(bytes.Clone(good), 0), &spec, h2, row2); err == nil {
		t.Error("trailing byte accepted")
	}
	bad := func(name string, b []byte) {
		t.Helper()
		if err := ParseRow(b, &spec, h2, row2); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	// A record with empty strings so that offsets are known: event_id "", entity_id "",
	// event_time 0, then the value columns.
	h0 := &Head{}
	row0 := NewRow(&spec)
	zero := AppendRow(nil, &spec, h0, row0)
	// Column lo_5m (the 7th value column) starts after 3 head bytes and 6 one-byte longs.
	b := bytes.Clone(zero)
	b[3+6] = 4 // union branch 2
	bad("union branch 2", b)
	b = bytes.Clone(zero)
	// merchants_exact: after the value columns; find it from the end: source_offset,
	// source_partition, source_topic, late, ms_since_previous are 1 byte each.
	b[len(b)-5-2] = 2
	bad("boolean 2", b)
	b = bytes.Clone(zero)
	b = append(b[:len(b)-2], 0x80, 0x80, 0x80, 0x80, 0x10, 0) // partition 2^31, beyond int32
	bad("int out of range", b)
	if err := ParseRow(good, &spec, h2, &Row{}); err == nil {
		t.Error("a row of the wrong shape accepted")
	}
}

func FuzzParseRow(f *testing.F) {
	spec := testSpec(f)
	r := rand.New(rand.NewPCG(3, 3))
	for range 8 {
		h, row := randomRow(r, &spec)
		f.Add(AppendRow(nil, &spec, h, row))
	}
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0})
	codec, err := goavro.NewCodec(AvroSchema(&spec))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, row := &Head{}, NewRow(&spec)
		err := ParseRow(data, &spec, h, row)
		_, rest, gerr := codec.NativeFromBinary(data)
		goavroOK := gerr == nil && len(rest) == 0
		if err != nil {
			// goavro truncates an int varint beyond 32 bits and a 10-byte long varint
			// beyond 64; ParseRow refuses both rather than guess.
			lax := strings.Contains(err.Error(), "int out of range") || strings.Contains(err.Error(), "overflows 64 bits")
			if goavroOK && !lax {
				t.Fatalf("ParseRow refused what goavro reads: %v", err)
			}
			return
		}
		if !goavroOK {
			t.Fatalf("ParseRow accepted what goavro refuses: %v (%d left)", gerr, len(rest))
		}
		// What parses re-encodes to the same bytes (the encoding is canonical for
		// varints written minimally; non-minimal varints are not, so compare values).
		again := AppendRow(nil, &spec, h, row)
		h2, row2 := &Head{}, NewRow(&spec)
		if err := ParseRow(again, &spec, h2, row2); err != nil || *h2 != *h || !reflect.DeepEqual(row2, row) {
			t.Fatalf("re-encoded record parses differently: %v", err)
		}
	})
}
