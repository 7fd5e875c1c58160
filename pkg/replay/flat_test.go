package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// flatTestSchema has every field shape a definition's output schema uses.
const flatTestSchema = `{"type":"record","name":"CardVelocity","namespace":"io.velocity.features","fields":[
 {"name":"event_id","type":"string"},
 {"name":"entity_id","type":"string"},
 {"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"txn_count_1h","type":"long"},
 {"name":"max_amount_24h","type":["null","long"]},
 {"name":"merchants_24h","type":"long"},
 {"name":"merchants_exact","type":"boolean"},
 {"name":"ms_since_previous","type":["null","long"]},
 {"name":"late","type":"boolean"},
 {"name":"source_topic","type":"string"},
 {"name":"source_partition","type":"int"},
 {"name":"source_offset","type":"long"}]}`

// flatRecords encodes n random records of flatTestSchema with goavro, an
// encoder that shares no code with the sinks' parser, and returns them with
// their expected JSON form (numbers as int64, null as nil).
func flatRecords(t *testing.T, n int) ([][]byte, []map[string]any) {
	t.Helper()
	codec, err := goavro.NewCodec(flatTestSchema)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var values [][]byte
	var want []map[string]any
	optional := func() (any, any) {
		if rng.IntN(3) == 0 {
			return nil, nil
		}
		v := rng.Int64N(1 << 40)
		return goavro.Union("long", v), v
	}
	for i := range n {
		maxA, maxW := optional()
		gap, gapW := optional()
		id := []string{"e", "ü\"\\\n", "tab\tx", strings.Repeat("z", 300)}[i%4]
		native := map[string]any{
			"event_id": id, "entity_id": "card-" + string(rune('A'+i%26)),
			"event_time": int64(1_790_000_000_000 + i), "txn_count_1h": rng.Int64N(1000),
			"max_amount_24h": maxA, "merchants_24h": rng.Int64N(70), "merchants_exact": i%5 != 0,
			"ms_since_previous": gap, "late": i%7 == 0, "source_topic": "txns",
			"source_partition": int32(i % 3), "source_offset": int64(i),
		}
		b, err := codec.BinaryFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		values = append(values, b)
		w := map[string]any{}
		for k, v := range native {
			switch x := v.(type) {
			case int32:
				w[k] = int64(x)
			default:
				w[k] = x
			}
		}
		w["max_amount_24h"], w["ms_since_previous"] = maxW, gapW
		want = append(want, w)
	}
	return values, want
}

func writeFlat(t *testing.T, s Sink, values [][]byte) {
	t.Helper()
	for i, v := range values {
		if err := s.Write(&pipeline.Output{Value: v}); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if err := s.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestFlatJSONLSinkSaysWhatTheRecordSays(t *testing.T) {
	values, want := flatRecords(t, 500)
	path := filepath.Join(t.TempDir(), "f.jsonl")
	s, err := NewFlatJSONLSink(path, flatTestSchema)
	if err != nil {
		t.Fatal(err)
	}
	writeFlat(t, s, values)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	i := 0
	for ; sc.Scan(); i++ {
		line := sc.Bytes()
		if i == 0 && !bytes.HasPrefix(line, []byte(`{"event_id":`)) {
			t.Errorf("fields are not in schema order: %s", line)
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		var got map[string]any
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("line %d is not JSON: %v: %s", i, err, line)
		}
		for k, v := range got {
			if n, ok := v.(json.Number); ok {
				got[k], err = n.Int64()
				if err != nil {
					t.Fatalf("line %d field %s: %v", i, k, err)
				}
			}
		}
		if !reflect.DeepEqual(got, want[i]) {
			t.Fatalf("line %d:\n got %v\nwant %v", i, got, want[i])
		}
	}
	if i != len(want) {
		t.Fatalf("%d lines, want %d", i, len(want))
	}
}

func TestFlatSinksRefuseWhatIsNotTheirSchema(t *testing.T) {
	values, _ := flatRecords(t, 1)
	good := values[0]
	dir := t.TempDir()
	for _, bad := range [][]byte{nil, good[:len(good)-1], append(bytes.Clone(good), 0)} {
		s, err := NewFlatJSONLSink(filepath.Join(dir, "x.jsonl"), flatTestSchema)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Write(&pipeline.Output{Value: bad}); !errors.Is(err, errBadValue) {
			t.Errorf("%d bytes: %v, want errBadValue", len(bad), err)
		}
		_ = s.Abort()
	}
	for _, schema := range []string{`{"type":"record","name":"x","fields":[{"name":"a","type":"double"}]}`,
		`{"type":"record","name":"x","fields":[{"name":"a","type":["null","string"]}]}`, `[]`, `{"type":"record","name":"x","fields":[]}`} {
		if _, err := NewFlatJSONLSink(filepath.Join(dir, "y.jsonl"), schema); err == nil {
			t.Errorf("schema %s accepted", schema)
		}
	}
}

// TestFlatParquetSink writes more rows than a batch holds and reads them back
// with parquet-go, and with pyarrow (an independent reader) when available.
func TestFlatParquetSink(t *testing.T) {
	values, want := flatRecords(t, 2*parquetBatch+37)
	path := filepath.Join(t.TempDir(), "f.parquet")
	s, err := NewFlatParquetSink(path, flatTestSchema, "v7 3f2a")
	if err != nil {
		t.Fatal(err)
	}
	writeFlat(t, s, values)

	pf := openParquetFile(t, path)
	if v, _ := pf.Lookup("velocity.definition"); v != "v7 3f2a" {
		t.Errorf("velocity.definition metadata %q", v)
	}
	var cols []string
	for _, c := range pf.Schema().Columns() {
		cols = append(cols, c[0])
	}
	got := readParquetMaps(t, pf, cols)
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("row %d:\n got %v\nwant %v", i, got[i], want[i])
		}
	}

	if err := exec.Command("python3", "-c", "import pyarrow.parquet").Run(); err != nil {
		if v := os.Getenv("VELOCITY_REQUIRE_PYTHON"); v == "" || v == "0" {
			t.Skipf("python3 with pyarrow not available (%v): the parquet-go read passed; VELOCITY_REQUIRE_PYTHON=1 makes this a failure", err)
		}
		t.Fatalf("python3 with pyarrow is required (VELOCITY_REQUIRE_PYTHON=1): %v", err)
	}
	out, err := exec.Command("python3", "-c", `
import json, sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
rows = []
for r in t.to_pylist():
    r["event_time"] = int(r["event_time"].timestamp() * 1000)
    rows.append(r)
print(json.dumps({"types": {f.name: str(f.type) for f in t.schema}, "rows": rows}))
`, path).Output()
	if err != nil {
		t.Fatalf("pyarrow could not read %s: %v", path, err)
	}
	var py struct {
		Types map[string]string `json:"types"`
		Rows  []map[string]any  `json:"rows"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&py); err != nil {
		t.Fatal(err)
	}
	for col, typ := range map[string]string{"event_time": "timestamp[ms, tz=UTC]", "max_amount_24h": "int64", "merchants_exact": "bool", "source_partition": "int32"} {
		if py.Types[col] != typ {
			t.Errorf("pyarrow type of %s is %s, want %s", col, py.Types[col], typ)
		}
	}
	if len(py.Rows) != len(want) {
		t.Fatalf("pyarrow read %d rows, want %d", len(py.Rows), len(want))
	}
	for i := range want {
		for col, wv := range want[i] {
			gv := py.Rows[i][col]
			if n, ok := gv.(json.Number); ok {
				gv, _ = n.Int64()
			}
			if !reflect.DeepEqual(gv, wv) {
				t.Fatalf("row %d column %s: pyarrow %v, want %v", i, col, gv, wv)
			}
		}
	}
}

// FuzzFlatParse: any bytes, never a panic; what the parser accepts, goavro
// reads as one whole record with the same field values.
func FuzzFlatParse(f *testing.F) {
	fs, err := parseFlatSchema(flatTestSchema)
	if err != nil {
		f.Fatal(err)
	}
	c, err := goavro.NewCodec(flatTestSchema)
	if err != nil {
		f.Fatal(err)
	}
	values, _ := flatRecords(&testing.T{}, 8)
	for _, v := range values {
		f.Add(v)
	}
	f.Add([]byte{})
	vals := make([]flatValue, len(fs.fields))
	f.Fuzz(func(t *testing.T, b []byte) {
		if fs.parse(b, vals) != nil {
			return
		}
		native, rest, err := c.NativeFromBinary(b)
		if err != nil || len(rest) != 0 {
			t.Fatalf("parser accepted %x, goavro: %v, %d bytes left", b, err, len(rest))
		}
		m := native.(map[string]any)
		for i, fl := range fs.fields {
			v := vals[i]
			switch x := m[fl.name].(type) {
			case string:
				if string(v.str) != x {
					t.Fatalf("%s: %q, goavro %q", fl.name, v.str, x)
				}
			case bool:
				if (v.num == 1) != x {
					t.Fatalf("%s: %d, goavro %v", fl.name, v.num, x)
				}
			case int32:
				if v.num != int64(x) {
					t.Fatalf("%s: %d, goavro %d", fl.name, v.num, x)
				}
			case int64:
				if v.num != x {
					t.Fatalf("%s: %d, goavro %d", fl.name, v.num, x)
				}
			case nil:
				if !v.null {
					t.Fatalf("%s: %d, goavro null", fl.name, v.num)
				}
			case map[string]any:
				if v.null || v.num != x["long"].(int64) {
					t.Fatalf("%s: %d (null %v), goavro %v", fl.name, v.num, v.null, x)
				}
			default:
				if fl.timestamp {
					continue // goavro gives a time.Time; the long is checked by the round trip above
				}
				t.Fatalf("%s: goavro type %T", fl.name, x)
			}
		}
	})
}
