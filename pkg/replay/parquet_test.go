package replay

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/parquet-go/parquet-go"
)

// examplesParquet replays the EXAMPLES stream to a Parquet file and returns its
// path and the same replay's JSON-lines features, the reference.
func examplesParquet(t *testing.T) (string, []jsonFeatures) {
	t.Helper()
	dir := t.TempDir()
	in := filepath.Join("testdata", "examples.jsonl")
	replayFiles(t, in, filepath.Join(dir, "f.jsonl"), filepath.Join(dir, "d.jsonl"), exampleConfig(t))
	want := readLines[jsonFeatures](t, filepath.Join(dir, "f.jsonl"))

	path := filepath.Join(dir, "features.parquet")
	s, err := NewParquetSink(path, exampleConfig(t).Specs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), mustOpenJSONL(t, in), Config{Pipeline: exampleConfig(t), Features: s}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	return path, want
}

var wantParquetColumns = []string{
	"event_id", "entity_id", "event_time",
	"count_10s", "sum_minor_10s", "min_minor_10s", "max_minor_10s",
	"count_1m", "sum_minor_1m", "min_minor_1m", "max_minor_1m",
	"ms_since_previous", "late", "source_topic", "source_partition", "source_offset",
}

// flatRow is one features record as the Parquet columns hold it.
func flatRow(f jsonFeatures) map[string]any {
	m := map[string]any{
		"event_id": f.EventID, "entity_id": f.EntityID, "event_time": f.EventTime,
		"ms_since_previous": nil, "late": f.Late, "source_topic": f.SourceTopic,
		"source_partition": int64(f.SourcePartition), "source_offset": f.SourceOffset,
	}
	if f.MsSincePrevious != nil {
		m["ms_since_previous"] = *f.MsSincePrevious
	}
	for _, w := range f.Windows {
		m["count_"+w.Window] = w.Count
		m["sum_minor_"+w.Window] = w.SumMinor
		m["min_minor_"+w.Window] = w.MinMinor
		m["max_minor_"+w.Window] = w.MaxMinor
	}
	return m
}

// TestParquetSinkReadBack reads the file back with parquet-go's reader: the
// columns, their types, the window metadata, and every row against the
// JSON-lines output of the same replay.
func TestParquetSinkReadBack(t *testing.T) {
	path, want := examplesParquet(t)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range pf.Schema().Columns() {
		cols = append(cols, c[0])
	}
	if !reflect.DeepEqual(cols, wantParquetColumns) {
		t.Fatalf("columns %v\nwant %v", cols, wantParquetColumns)
	}
	if v, _ := pf.Lookup("velocity.windows"); v != "10s:1s,1m:10s" {
		t.Errorf("velocity.windows metadata %q", v)
	}
	types := map[string]string{}
	for _, fld := range pf.Schema().Fields() {
		types[fld.Name()] = fld.Type().String()
		if fld.Optional() != (fld.Name() == "ms_since_previous") {
			t.Errorf("column %s optional=%v", fld.Name(), fld.Optional())
		}
	}
	for col, typ := range map[string]string{"event_id": "STRING", "event_time": "TIMESTAMP(isAdjustedToUTC=true,unit=MILLIS)", "count_1m": "INT(64,true)", "late": "BOOLEAN", "source_partition": "INT(32,true)"} {
		if types[col] != typ {
			t.Errorf("column %s has type %s, want %s", col, types[col], typ)
		}
	}

	r := parquet.NewReader(pf)
	defer r.Close()
	var got []map[string]any
	rows := make([]parquet.Row, 4)
	for {
		n, err := r.ReadRows(rows)
		for _, row := range rows[:n] {
			m := map[string]any{}
			for _, v := range row {
				name := cols[v.Column()]
				switch {
				case v.IsNull():
					m[name] = nil
				case v.Kind() == parquet.ByteArray:
					m[name] = string(v.ByteArray())
				case v.Kind() == parquet.Boolean:
					m[name] = v.Boolean()
				case v.Kind() == parquet.Int32:
					m[name] = int64(v.Int32())
				default:
					m[name] = v.Int64()
				}
			}
			got = append(got, m)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i := range want {
		if w := flatRow(want[i]); !reflect.DeepEqual(got[i], w) {
			t.Errorf("row %d:\n got %v\nwant %v", i, got[i], w)
		}
	}
}

// pyarrowReader prints a Parquet file's schema and rows as JSON. pyarrow is
// an independent implementation (Arrow's C++ reader), so it catches files
// that only parquet-go would accept.
const pyarrowReader = `
import json, sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
rows = []
for r in t.to_pylist():
    r["event_time"] = int(r["event_time"].timestamp() * 1000)
    rows.append(r)
print(json.dumps({
    "columns": t.schema.names,
    "types": {f.name: str(f.type) for f in t.schema},
    "nullable": {f.name: f.nullable for f in t.schema},
    "metadata": {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items() if k.startswith(b"velocity.")},
    "rows": rows,
}))
`

// TestParquetPyarrowReadsIt reads the replay's Parquet file with pyarrow. It
// skips when python3 or pyarrow is missing, unless VELOCITY_REQUIRE_KAFKA is
// set (CI, where .ci/run installs pyarrow), where a missing reader fails.
func TestParquetPyarrowReadsIt(t *testing.T) {
	if err := exec.Command("python3", "-c", "import pyarrow.parquet").Run(); err != nil {
		if os.Getenv("VELOCITY_REQUIRE_KAFKA") == "" {
			t.Skipf("python3 with pyarrow not available (%v): pip install pyarrow", err)
		}
		t.Fatalf("python3 with pyarrow is required here (VELOCITY_REQUIRE_KAFKA is set): %v", err)
	}
	path, want := examplesParquet(t)
	out, err := exec.Command("python3", "-c", pyarrowReader, path).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("pyarrow could not read %s: %v\n%s", path, err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var got struct {
		Columns  []string          `json:"columns"`
		Types    map[string]string `json:"types"`
		Nullable map[string]bool   `json:"nullable"`
		Metadata map[string]string `json:"metadata"`
		Rows     []map[string]any  `json:"rows"`
	}
	dec := json.NewDecoder(bytesReader(out))
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !reflect.DeepEqual(got.Columns, wantParquetColumns) {
		t.Errorf("columns %v\nwant %v", got.Columns, wantParquetColumns)
	}
	for col, typ := range map[string]string{"event_id": "string", "event_time": "timestamp[ms, tz=UTC]", "count_10s": "int64", "ms_since_previous": "int64", "late": "bool", "source_partition": "int32", "source_offset": "int64"} {
		if got.Types[col] != typ {
			t.Errorf("pyarrow type of %s is %s, want %s", col, got.Types[col], typ)
		}
	}
	if got.Nullable["event_id"] || !got.Nullable["ms_since_previous"] {
		t.Errorf("nullable: %v; want only ms_since_previous", got.Nullable)
	}
	if got.Metadata["velocity.windows"] != "10s:1s,1m:10s" {
		t.Errorf("metadata %v", got.Metadata)
	}
	if len(got.Rows) != len(want) {
		t.Fatalf("pyarrow read %d rows, want %d", len(got.Rows), len(want))
	}
	for i := range want {
		w := flatRow(want[i])
		for col, wv := range w {
			gv := got.Rows[i][col]
			if n, ok := gv.(json.Number); ok {
				gv, _ = n.Int64()
			}
			if !reflect.DeepEqual(gv, wv) {
				t.Errorf("row %d column %s: pyarrow %v (%T), want %v", i, col, gv, gv, wv)
			}
		}
	}
}
