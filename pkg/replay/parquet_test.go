package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// examplesParquet replays the worked example to a Parquet file and returns its
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
	pf := openParquetFile(t, path)
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

	got := readParquetMaps(t, pf, cols)
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i := range want {
		if w := flatRow(want[i]); !reflect.DeepEqual(got[i], w) {
			t.Errorf("row %d:\n got %v\nwant %v", i, got[i], w)
		}
	}
}

// openParquetFile opens a Parquet file for reading until the test ends.
func openParquetFile(t *testing.T, path string) *parquet.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return pf
}

// readParquetMaps reads every row of pf as a map from column name (cols, in
// schema order) to value: strings, booleans, int64 (int32 widened) or nil.
func readParquetMaps(t *testing.T, pf *parquet.File, cols []string) []map[string]any {
	t.Helper()
	r := parquet.NewReader(pf)
	defer r.Close()
	var got []map[string]any
	rows := make([]parquet.Row, 64)
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
			return got
		}
		if err != nil {
			t.Fatal(err)
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

// TestParquetPyarrowReadsIt reads the replay's Parquet file with pyarrow, a
// reader that shares no code with ours. Without python3 and pyarrow it
// skips, saying so, unless VELOCITY_REQUIRE_PYTHON=1 (make test and CI set
// it, and .ci/run installs pyarrow): then a missing reader fails the test, so
// that CI cannot pass by skipping it.
func TestParquetPyarrowReadsIt(t *testing.T) {
	if err := exec.Command("python3", "-c", "import pyarrow.parquet").Run(); err != nil {
		if v := os.Getenv("VELOCITY_REQUIRE_PYTHON"); v == "" || v == "0" {
			t.Skipf("python3 with pyarrow not available (%v): python3 -m pip install pyarrow (VELOCITY_REQUIRE_PYTHON=1 makes this a failure)", err)
		}
		t.Fatalf("python3 with pyarrow is required (VELOCITY_REQUIRE_PYTHON=1): %v; install it with python3 -m pip install pyarrow", err)
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

// TestParquetSinkManyRowGroups writes more rows than a batch and a row group
// hold, and reads every row back with parquet-go, then the totals with
// pyarrow when it is available: batches and row groups must join without
// losing, repeating or reordering a row.
func TestParquetSinkManyRowGroups(t *testing.T) {
	const n = 10_000
	outs, specs := benchOutputs(t, n)
	path := filepath.Join(t.TempDir(), "many.parquet")
	s, err := newParquetSink(path, specs, 3000)
	if err != nil {
		t.Fatal(err)
	}
	for i := range outs {
		if err := s.Write(&outs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
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
	// Row groups are cut at the first batch boundary past 3000 rows.
	if got := len(pf.RowGroups()); got != 4 || pf.NumRows() != n {
		t.Fatalf("%d row groups, %d rows; want 4 and %d", got, pf.NumRows(), n)
	}
	type row struct {
		EventID  string `parquet:"event_id"`
		Count1m  int64  `parquet:"count_1m"`
		Max24h   int64  `parquet:"max_minor_24h"`
		MsPrev   *int64 `parquet:"ms_since_previous"`
		Offset   int64  `parquet:"source_offset"`
		Topic    string `parquet:"source_topic"`
		EntityID string `parquet:"entity_id"`
	}
	rows, err := parquet.Read[row](f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		want, err := codec.DecodeFeatures(outs[i].Value)
		if err != nil {
			t.Fatal(err)
		}
		msPrev := (*int64)(nil)
		if want.HasPrevious {
			msPrev = &want.MsSincePrevious
		}
		if r.EventID != want.EventID || r.EntityID != want.EntityID || r.Count1m != want.Windows[0].Count || r.Max24h != want.Windows[3].MaxMinor ||
			r.Offset != want.SourceOffset || r.Topic != want.SourceTopic || (r.MsPrev == nil) != (msPrev == nil) || (r.MsPrev != nil && *r.MsPrev != *msPrev) {
			t.Fatalf("row %d: %+v, want %+v", i, r, want)
		}
	}

	if exec.Command("python3", "-c", "import pyarrow.parquet").Run() != nil {
		return // TestParquetPyarrowReadsIt reports a missing pyarrow
	}
	out, err := exec.Command("python3", "-c", `
import sys, pyarrow.parquet as pq, pyarrow.compute as pc
f = pq.ParquetFile(sys.argv[1]); t = f.read()
print(f.num_row_groups, t.num_rows, pc.sum(t["source_offset"]).as_py(), t["ms_since_previous"].null_count)`, path).Output()
	if err != nil {
		t.Fatalf("pyarrow: %v", err)
	}
	wantSum, wantNulls := 0, 0
	for i := range n {
		wantSum += i
		if i%3 == 0 {
			wantNulls++
		}
	}
	if got, want := strings.TrimSpace(string(out)), fmt.Sprintf("4 %d %d %d", n, wantSum, wantNulls); got != want {
		t.Errorf("pyarrow: row groups, rows, sum of offsets, null ms_since_previous = %s, want %s", got, want)
	}
}
