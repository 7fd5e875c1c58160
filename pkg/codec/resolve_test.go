package codec

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// A producer that evolves its schema (adds optional fields, reorders, widens
// types) must still be readable with ours, and a schema that cannot supply a
// required field must be refused up front, not per record.
func TestWriterSchemaResolution(t *testing.T) {
	ts := time.UnixMilli(t0).UTC()
	tests := []struct {
		name   string
		schema string
		datum  map[string]any
		want   Transaction
		reason Reason // "" = accepted
	}{
		{
			name: "added optional fields are skipped",
			schema: `{"type":"record","name":"Transaction","namespace":"io.velocity.v2","fields":[
				{"name":"event_id","type":"string"},{"name":"entity_id","type":"string"},
				{"name":"amount_minor","type":"long"},{"name":"currency","type":"string","default":""},
				{"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}},
				{"name":"merchant","type":["null","string"],"default":null},
				{"name":"tags","type":{"type":"map","values":"string"},"default":{}}]}`,
			datum: map[string]any{"event_id": "e1", "entity_id": "card-A", "amount_minor": int64(1000), "currency": "EUR",
				"event_time": ts, "merchant": goavro.Union("string", "shop"), "tags": map[string]any{"k": "v"}},
			want: Transaction{EventID: "e1", EntityID: "card-A", AmountMinor: 1000, Currency: "EUR", EventTime: t0},
		},
		{
			name: "reordered fields are found by name",
			schema: `{"type":"record","name":"Txn","fields":[
				{"name":"event_time","type":"long"},{"name":"note","type":"string"},{"name":"currency","type":"string"},
				{"name":"amount_minor","type":"long"},{"name":"entity_id","type":"string"},{"name":"event_id","type":"string"}]}`,
			datum: map[string]any{"event_id": "e1", "entity_id": "card-A", "amount_minor": int64(5), "currency": "USD",
				"event_time": int64(t0), "note": "x"},
			want: Transaction{EventID: "e1", EntityID: "card-A", AmountMinor: 5, Currency: "USD", EventTime: t0},
		},
		{
			name: "missing currency takes our default",
			schema: `{"type":"record","name":"Txn","fields":[
				{"name":"event_id","type":"string"},{"name":"entity_id","type":"string"},
				{"name":"amount_minor","type":"int"},{"name":"event_time","type":"long"}]}`,
			datum: map[string]any{"event_id": "e1", "entity_id": "card-A", "amount_minor": int32(7), "event_time": int64(t0)},
			want:  Transaction{EventID: "e1", EntityID: "card-A", AmountMinor: 7, Currency: "", EventTime: t0},
		},
		{
			name: "bytes ids and nullable currency resolve",
			schema: `{"type":"record","name":"Txn","fields":[
				{"name":"event_id","type":"bytes"},{"name":"entity_id","type":["null","string"]},
				{"name":"amount_minor","type":"long"},{"name":"currency","type":["null","string"],"default":null},
				{"name":"event_time","type":"long"}]}`,
			datum: map[string]any{"event_id": []byte("e1"), "entity_id": goavro.Union("string", "card-A"), "amount_minor": int64(1),
				"currency": goavro.Union("string", "GBP"), "event_time": int64(t0)},
			want: Transaction{EventID: "e1", EntityID: "card-A", AmountMinor: 1, Currency: "GBP", EventTime: t0},
		},
		{
			name: "null entity_id is the id missing",
			schema: `{"type":"record","name":"Txn","fields":[
				{"name":"event_id","type":"string"},{"name":"entity_id","type":["null","string"]},
				{"name":"amount_minor","type":"long"},{"name":"event_time","type":"long"}]}`,
			datum:  map[string]any{"event_id": "e1", "entity_id": nil, "amount_minor": int64(1), "event_time": int64(t0)},
			reason: ReasonInvalidEntityID,
		},
		{
			name: "resolved records are validated like ours",
			schema: `{"type":"record","name":"Txn","fields":[
				{"name":"event_id","type":"string"},{"name":"entity_id","type":"string"},
				{"name":"amount_minor","type":"long"},{"name":"event_time","type":"long"},{"name":"x","type":"int"}]}`,
			datum:  map[string]any{"event_id": "e1", "entity_id": "card-A", "amount_minor": int64(-4), "event_time": int64(t0), "x": int32(1)},
			reason: ReasonInvalidAmountMinor,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := goavro.NewCodec(tt.schema)
			if err != nil {
				t.Fatal(err)
			}
			value, err := w.BinaryFromNative(nil, tt.datum)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := NewDecoder(tt.schema, Limits{})
			if err != nil {
				t.Fatalf("NewDecoder: %v", err)
			}
			if _, ok := dec.(*goavroDecoder); !ok {
				t.Fatalf("a different writer schema got %T, want the goavro resolver", dec)
			}
			var got Transaction
			r := dec.Decode(value, 0, false, &got)
			if tt.reason != "" {
				if r == nil || r.Reason != tt.reason {
					t.Fatalf("got %v (%+v), want %s", r, got, tt.reason)
				}
				return
			}
			if r != nil {
				t.Fatalf("rejected: %v", r)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("decoded %+v, want %+v", got, tt.want)
			}
			// Trailing bytes stay an error on the resolving path too.
			if r := dec.Decode(append(value, 0), 0, false, &got); r == nil || r.Reason != ReasonDecode {
				t.Fatalf("trailing byte: got %v, want decode", r)
			}
		})
	}
}

func TestIncompatibleWriterSchemaIsRefused(t *testing.T) {
	tests := []struct{ name, schema, want string }{
		{"not JSON", `{`, "parse writer schema"},
		{"not a record", `"string"`, "not an Avro record"},
		{"required field absent", `{"type":"record","name":"T","fields":[{"name":"event_id","type":"string"},
			{"name":"amount_minor","type":"long"},{"name":"event_time","type":"long"}]}`, "no field entity_id"},
		{"string where we need long", `{"type":"record","name":"T","fields":[{"name":"event_id","type":"string"},
			{"name":"entity_id","type":"string"},{"name":"amount_minor","type":"string"},{"name":"event_time","type":"long"}]}`, "amount_minor"},
		{"long where we need string", `{"type":"record","name":"T","fields":[{"name":"event_id","type":"long"},
			{"name":"entity_id","type":"string"},{"name":"amount_minor","type":"long"},{"name":"event_time","type":"long"}]}`, "event_id"},
		{"microseconds are not milliseconds", `{"type":"record","name":"T","fields":[{"name":"event_id","type":"string"},
			{"name":"entity_id","type":"string"},{"name":"amount_minor","type":"long"},
			{"name":"event_time","type":{"type":"long","logicalType":"timestamp-micros"}}]}`, "event_time"},
		{"our schema in microseconds", strings.Replace(schemas.Transaction, "timestamp-millis", "timestamp-micros", 1), "event_time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewDecoder(tt.schema, Limits{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestNegativeLimitsAreRefused(t *testing.T) {
	for _, l := range []Limits{{MaxRecordBytes: -1}, {MaxAheadMs: -1}} {
		if _, err := NewDecoder("", l); err == nil {
			t.Errorf("NewDecoder accepted %+v", l)
		}
	}
}

// Our own schema, however it is spelled (docs, whitespace, defaults), has one
// wire format and so takes the fast path.
func TestOurSchemaTakesFastPath(t *testing.T) {
	respelled := strings.ReplaceAll(schemas.Transaction, `"doc"`, `"x-doc"`)
	for _, s := range []string{"", schemas.Transaction, respelled} {
		dec, err := NewDecoder(s, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := dec.(*fastDecoder); !ok {
			t.Fatalf("schema %.40q got %T, want the fast path", s, dec)
		}
	}
}
