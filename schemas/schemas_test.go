package schemas

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/linkedin/goavro/v2"
)

type field struct {
	Name    string          `json:"name"`
	Type    json.RawMessage `json:"type"`
	Doc     string          `json:"doc"`
	Default json.RawMessage `json:"default"`
}

type record struct {
	Type      string  `json:"type"`
	Name      string  `json:"name"`
	Namespace string  `json:"namespace"`
	Doc       string  `json:"doc"`
	Fields    []field `json:"fields"`
}

func parse(t *testing.T, src string) record {
	t.Helper()
	if _, err := goavro.NewCodec(src); err != nil {
		t.Fatalf("goavro rejects schema: %v", err)
	}
	var r record
	if err := json.Unmarshal([]byte(src), &r); err != nil {
		t.Fatalf("schema is not JSON: %v", err)
	}
	return r
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("bad JSON %s: %v", raw, err)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// The field order and types are the wire format: other packages and external
// producers depend on them, so the test spells them out instead of trusting the file.
func TestSchemasMatchContract(t *testing.T) {
	const tsMillis = `{"logicalType":"timestamp-millis","type":"long"}`
	tests := []struct {
		name   string
		src    string
		record string
		want   [][2]string // name, compact type
	}{
		{"transaction", Transaction, "Transaction", [][2]string{
			{"event_id", `"string"`},
			{"entity_id", `"string"`},
			{"amount_minor", `"long"`},
			{"currency", `"string"`},
			{"event_time", tsMillis},
		}},
		{"velocity features", VelocityFeatures, "VelocityFeatures", [][2]string{
			{"event_id", `"string"`},
			{"entity_id", `"string"`},
			{"event_time", tsMillis},
			{"windows", ""}, // checked below
			{"ms_since_previous", `["null","long"]`},
			{"late", `"boolean"`},
			{"source_topic", `"string"`},
			{"source_partition", `"int"`},
			{"source_offset", `"long"`},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := parse(t, tt.src)
			if r.Type != "record" || r.Name != tt.record || r.Namespace != "io.velocity.v1" {
				t.Fatalf("got %s %s.%s, want record io.velocity.v1.%s", r.Type, r.Namespace, r.Name, tt.record)
			}
			if r.Doc == "" {
				t.Error("record has no doc")
			}
			var got [][2]string
			for _, f := range r.Fields {
				if f.Doc == "" {
					t.Errorf("field %s has no doc", f.Name)
				}
				typ := compact(t, f.Type)
				if f.Name == "windows" {
					typ = ""
				}
				got = append(got, [2]string{f.Name, typ})
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("fields\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	tx := parse(t, Transaction)
	if d := string(tx.Fields[3].Default); d != `""` {
		t.Errorf("currency default = %s, want \"\"", d)
	}
	vf := parse(t, VelocityFeatures)
	if d := string(vf.Fields[4].Default); d != "null" {
		t.Errorf("ms_since_previous default = %s, want null", d)
	}
}

func TestWindowAggregateFields(t *testing.T) {
	vf := parse(t, VelocityFeatures)
	var arr struct {
		Type  string `json:"type"`
		Items record `json:"items"`
	}
	if err := json.Unmarshal(vf.Fields[3].Type, &arr); err != nil {
		t.Fatal(err)
	}
	if arr.Type != "array" || arr.Items.Name != "WindowAggregate" || arr.Items.Namespace != "io.velocity.v1" {
		t.Fatalf("windows is %s of %s.%s, want array of io.velocity.v1.WindowAggregate", arr.Type, arr.Items.Namespace, arr.Items.Name)
	}
	want := [][2]string{{"window", `"string"`}, {"window_ms", `"long"`}, {"bucket_ms", `"long"`},
		{"count", `"long"`}, {"sum_minor", `"long"`}, {"min_minor", `"long"`}, {"max_minor", `"long"`}}
	var got [][2]string
	for _, f := range arr.Items.Fields {
		if f.Doc == "" {
			t.Errorf("field %s has no doc", f.Name)
		}
		got = append(got, [2]string{f.Name, compact(t, f.Type)})
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fields\n got %v\nwant %v", got, want)
	}
}
