package streamtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The feature definitions' independent reference
// (integration/reference/features_reference.py), run from Go tests.

// RequireReference skips without python3 and the reference's modules (fastavro,
// PyYAML), unless VELOCITY_REQUIRE_PYTHON=1 (make test, CI): then their absence
// fails the test.
func RequireReference(t testing.TB) {
	t.Helper()
	if err := exec.Command("python3", "-c", "import fastavro, yaml").Run(); err != nil {
		if v := os.Getenv("VELOCITY_REQUIRE_PYTHON"); v == "" || v == "0" {
			t.Skipf("python3 with fastavro and PyYAML not available (%v): VELOCITY_REQUIRE_PYTHON=1 makes this a failure", err)
		}
		t.Fatalf("python3 with fastavro and PyYAML is required (VELOCITY_REQUIRE_PYTHON=1): %v", err)
	}
}

// ReferenceLine is what the reference says of one input offset: a dead letter's
// reason, or the features record's fields (numbers as int64) and, per distinct
// count, whether the entity ever held more values than max_exact (only then may
// the service report an estimate).
type ReferenceLine struct {
	Partition int32           `json:"partition"` // 0 when the reference ran over one input
	Offset    int64           `json:"offset"`
	Dead      string          `json:"dead"`
	Features  map[string]any  `json:"features"`
	Over      map[string]bool `json:"distinct_over_bound"`
}

// RunReference runs the reference script over an Avro container file holding one
// partition's records in offset order, and returns its lines by offset.
func RunReference(t testing.TB, script, definition, input string, lateness time.Duration, topic string, partition int32) map[int64]ReferenceLine {
	t.Helper()
	cmd := exec.Command("python3", script, definition, input, "--lateness-ms", fmt.Sprint(lateness.Milliseconds()),
		"--topic", topic, "--partition", fmt.Sprint(partition))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference: %v\n%s", err, stderr.Bytes())
	}
	got := map[int64]ReferenceLine{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r ReferenceLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("reference line %s: %v", sc.Bytes(), err)
		}
		IntNumbers(r.Features)
		got[r.Offset] = r
	}
	return got
}

// IntNumbers turns the json.Numbers of m into int64, so that maps decoded with
// UseNumber compare with reflect.DeepEqual.
func IntNumbers(m map[string]any) {
	for k, v := range m {
		if n, ok := v.(json.Number); ok {
			i, err := n.Int64()
			if err != nil {
				panic(fmt.Sprintf("%s: %v", k, err))
			}
			m[k] = i
		}
	}
}

// Definitions with re-keyed groups (docs/repartition.md): the reference over
// several input partitions, and the comparison of what a run or replay produced
// with it, group by group.
//
//	paths, _ := WritePaymentOCFs(dir, schema, PaymentStream(cfg)) // one file per input partition
//	ref := RunGroupReference(t, script, definition, paths, lateness, inputTopic)
//	ref.CompareDeadLetters(t, dead)            // map[Source]reason of the one dead-letter output
//	ref.CompareGroup(t, ref.InPlace, rowsCard) // the in-place group's rows (--output x.jsonl)
//	ref.CompareGroup(t, "device", rowsDevice)  // group device's rows (x.device.jsonl, or its topic)
//
// Rows are flat feature records as maps: ReadJSONLines of a JSON-lines output
// (numbers as int64), or FlatNative of goavro's reading of a topic's Avro
// value. Stage-1 dead letters are one per refused input record, whatever the
// groups; a second stage's own dead letters (late_after_idle, which only an idle
// marker causes and the reference cannot predict) are not the reference's
// business: leave them out of the map given to CompareDeadLetters.

// GroupSummary is what the reference says of one group (its summary.json).
type GroupSummary struct {
	Key      string         `json:"key"`      // the key's path (input.entity_id for the in-place group)
	InPlace  bool           `json:"in_place"` // the top-level group, computed at the input partition
	Rows     int            `json:"rows"`     // feature rows: one per event of the group
	NoKey    int            `json:"no_key"`   // accepted records without a key for the group: no row
	Distinct map[string]int `json:"distinct"` // distinct_count feature -> max_exact
}

// GroupReference is the reference's verdict on a stream of several input
// partitions under a definition with re-keyed groups.
type GroupReference struct {
	// InPlace is the top-level group's name (the definition's `group`,
	// "entity" by default).
	InPlace string
	// Inputs has one line per input record: its dead letter, or its row of the
	// in-place group.
	Inputs map[Source]ReferenceLine
	// Rows has, per group (the in-place one included), its rows keyed by the
	// input record they come from. A record refused at its partition, or
	// without a key for the group, has none.
	Rows map[string]map[Source]ReferenceLine
	// Groups summarises each group, the in-place one included.
	Groups map[string]GroupSummary
	// Dead counts the input records refused, by reason.
	Dead map[string]int
}

// RunGroupReference runs the reference over inputs, Avro container files of
// the definition's input schema, the i-th holding input partition i's records
// in offset order (WritePaymentOCFs writes them), with topic as every row's
// source_topic.
func RunGroupReference(t testing.TB, script, definition string, inputs []string, lateness time.Duration, topic string) GroupReference {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{script, definition}, inputs...)
	args = append(args, "--lateness-ms", fmt.Sprint(lateness.Milliseconds()), "--topic", topic, "--partition", "0", "--group-out", dir)
	cmd := exec.Command("python3", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference: %v\n%s", err, stderr.Bytes())
	}
	var sum struct {
		InPlace string                  `json:"in_place"`
		Records int                     `json:"records"`
		Dead    map[string]int          `json:"dead"`
		Groups  map[string]GroupSummary `json:"groups"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatalf("reference summary: %v", err)
	}
	r := GroupReference{InPlace: sum.InPlace, Inputs: map[Source]ReferenceLine{}, Rows: map[string]map[Source]ReferenceLine{}, Groups: sum.Groups, Dead: sum.Dead}
	inPlace := map[Source]ReferenceLine{}
	for _, l := range referenceLines(t, out) {
		s := Source{l.Partition, l.Offset}
		if _, dup := r.Inputs[s]; dup {
			t.Fatalf("reference: two lines for %v", s)
		}
		r.Inputs[s] = l
		if l.Dead == "" {
			inPlace[s] = l
		}
	}
	if len(r.Inputs) != sum.Records {
		t.Fatalf("reference: %d lines for %d input records", len(r.Inputs), sum.Records)
	}
	r.Rows[r.InPlace] = inPlace
	for name, g := range sum.Groups {
		if g.InPlace {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name+".jsonl"))
		if err != nil {
			t.Fatalf("reference: %v", err)
		}
		rows := map[Source]ReferenceLine{}
		for _, l := range referenceLines(t, b) {
			rows[Source{l.Partition, l.Offset}] = l
		}
		if len(rows) != g.Rows {
			t.Fatalf("reference: group %s has %d rows, its summary says %d", name, len(rows), g.Rows)
		}
		r.Rows[name] = rows
	}
	return r
}

func referenceLines(t testing.TB, out []byte) []ReferenceLine {
	t.Helper()
	var lines []ReferenceLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r ReferenceLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("reference line %s: %v", sc.Bytes(), err)
		}
		IntNumbers(r.Features)
		lines = append(lines, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reference output: %v", err)
	}
	return lines
}

// RowStats says what CompareGroup compared.
type RowStats struct {
	Rows      int // distinct source records with a row
	Repeats   int // rows beyond the first for a source (at-least-once output); each equal to the first
	Exact     int // distinct counts reported exact
	Estimates int // distinct counts reported as estimates (and within the error bound)
}

// maxCompareErrors is how many mismatches CompareGroup and CompareDeadLetters
// report before giving up.
const maxCompareErrors = 20

// CompareGroup holds the rows produced for group (flat feature records, see
// ReadJSONLines and FlatNative) to the reference's rows of that group, keyed by
// (source_partition, source_offset): every reference row present, no other row,
// every field equal, and a repeated row equal to the first. A distinct count
// the row reports as an estimate (<feature>_exact false) is allowed only where
// the reference says the key held more values than max_exact, and is then held
// to DistinctEstimateOK instead of equality.
func (r GroupReference) CompareGroup(t testing.TB, group string, got []map[string]any) RowStats {
	t.Helper()
	want, ok := r.Rows[group]
	if !ok {
		t.Fatalf("the reference has no group %q", group)
	}
	distinct := r.Groups[group].Distinct
	var st RowStats
	bad := 0
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("group %s: "+format, append([]any{group}, args...)...)
		if bad++; bad >= maxCompareErrors {
			t.Fatalf("group %s: too many mismatches", group)
		}
	}
	first := map[Source]map[string]any{}
	for _, row := range got {
		p, pok := row["source_partition"].(int64)
		o, ook := row["source_offset"].(int64)
		if !pok || !ook {
			fail("a row without int64 source_partition and source_offset: %v", row)
			continue
		}
		s := Source{int32(p), o}
		if f, dup := first[s]; dup {
			st.Repeats++
			if !reflect.DeepEqual(f, row) {
				fail("%v: a repeated row differs from the first:\n first %v\n then  %v", s, f, row)
			}
			continue
		}
		first[s] = row
		w, ok := want[s]
		if !ok {
			if in, known := r.Inputs[s]; known && in.Dead != "" {
				fail("%v: a row for a record the reference refuses (%s): %v", s, in.Dead, row)
			} else {
				fail("%v: a row the reference does not have (no such input, or no key for the group): %v", s, row)
			}
			continue
		}
		ww := maps.Clone(w.Features)
		for name, maxExact := range distinct {
			ex, isBool := row[name+"_exact"].(bool)
			if !isBool {
				fail("%v: %s_exact is %v, want a boolean", s, name, row[name+"_exact"])
				continue
			}
			ww[name+"_exact"] = ex
			if ex {
				st.Exact++
				continue
			}
			st.Estimates++
			if !w.Over[name] {
				fail("%v: %s reported as an estimate, but the key never held more than max_exact (%d) values", s, name, maxExact)
			}
			for k, v := range w.Features {
				if !strings.HasPrefix(k, name+"_") || k == name+"_exact" {
					continue
				}
				g, gok := row[k].(int64)
				e, eok := v.(int64)
				if !gok || !eok || !DistinctEstimateOK(g, e, maxExact) {
					fail("%v: estimate %s = %v, exact %v: beyond the error bound", s, k, row[k], v)
				}
				ww[k] = row[k]
			}
		}
		if !reflect.DeepEqual(row, ww) {
			fail("%v:\n got  %v\n want %v", s, row, ww)
		}
	}
	st.Rows = len(first)
	for s := range want {
		if _, ok := first[s]; !ok {
			fail("%v: no row, want %v", s, want[s].Features)
		}
	}
	return st
}

// CompareDeadLetters holds the dead letters produced (reason by source record,
// from the dead-letter topic's headers or a --dlq file, see DeadReasons) to the
// reference: every record the reference refuses has one with its reason, and
// no other record has one.
func (r GroupReference) CompareDeadLetters(t testing.TB, dead map[Source]string) {
	t.Helper()
	bad := 0
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		if bad++; bad >= maxCompareErrors {
			t.Fatal("too many dead-letter mismatches")
		}
	}
	for s, l := range r.Inputs {
		got, ok := dead[s]
		switch {
		case l.Dead != "" && !ok:
			fail("%v: want a %s dead letter, got none", s, l.Dead)
		case l.Dead != "" && got != l.Dead:
			fail("%v: dead letter %s, want %s", s, got, l.Dead)
		case l.Dead == "" && ok:
			fail("%v: dead letter %s, the reference accepts the record", s, got)
		}
	}
	for s, reason := range dead {
		if _, ok := r.Inputs[s]; !ok {
			fail("%v: dead letter %s for a record that is not an input", s, reason)
		}
	}
}

// ReadJSONLines reads a JSON-lines file (a replay --output or --dlq) into maps
// whose numbers are int64, the shapes the reference's rows have.
func ReadJSONLines(t testing.TB, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		IntNumbers(m)
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// DeadReasons maps dead letters read by ReadJSONLines (a replay --dlq file) to
// their reasons by source record. A source with two dead letters of different
// reasons fails the test.
func DeadReasons(t testing.TB, lines []map[string]any) map[Source]string {
	t.Helper()
	out := map[Source]string{}
	for _, l := range lines {
		p, _ := l["source_partition"].(int64)
		o, ok := l["source_offset"].(int64)
		reason, rok := l["reason"].(string)
		if !ok || !rok {
			t.Fatalf("a dead letter without source_offset or reason: %v", l)
		}
		s := Source{int32(p), o}
		if prev, dup := out[s]; dup && prev != reason {
			t.Fatalf("%v: dead letters %s and %s", s, prev, reason)
		}
		out[s] = reason
	}
	return out
}

// FlatNative turns goavro's reading of a flat feature record (feature.AvroSchema)
// into the reference's shapes: unions unwrapped, ints widened, the timestamp back
// to Unix milliseconds.
func FlatNative(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch x := v.(type) {
		case map[string]any:
			out[k] = x["long"]
		case int32:
			out[k] = int64(x)
		case time.Time:
			out[k] = x.UnixMilli()
		default:
			out[k] = x
		}
	}
	return out
}
