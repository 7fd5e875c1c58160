package replay

import (
	"context"
	"encoding/base64"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// memSink keeps decoded outputs, for tests.
type memSink struct {
	features  []codec.Features
	values    [][]byte
	dead      []pipeline.Output
	committed bool
	aborted   bool
}

func (m *memSink) Write(o *pipeline.Output) error {
	if o.Dead {
		d := *o
		d.Key = append([]byte(nil), o.Key...)
		d.Value = append([]byte(nil), o.Value...)
		m.dead = append(m.dead, d)
		return nil
	}
	f, err := codec.DecodeFeatures(o.Value)
	if err != nil {
		return err
	}
	m.features = append(m.features, f)
	m.values = append(m.values, append([]byte(nil), o.Value...))
	return nil
}
func (m *memSink) Commit(context.Context) error { m.committed = true; return nil }
func (m *memSink) Abort() error                 { m.aborted = true; return nil }

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestJSONLSource checks how each kind of line becomes a record: a value in our
// Avro schema that the processor decodes, or a decode dead letter carrying the
// line; and that offsets count non-blank lines.
func TestJSONLSource(t *testing.T) {
	const ok = `{"event_id":"a","entity_id":"c1","amount_minor":5,"currency":"EUR","event_time":1793491200000}`
	tests := []struct {
		name      string
		line      string
		wantTx    *codec.Transaction // nil: source rejects it
		wantInErr string             // substring of the rejection detail
	}{
		{"all fields", ok, &codec.Transaction{EventID: "a", EntityID: "c1", AmountMinor: 5, Currency: "EUR", EventTime: 1793491200000}, ""},
		{"unknown fields are ignored", `{"event_id":"a","entity_id":"c1","amount_minor":5,"event_time":1793491200000,"mcc":"5411","extra":{"x":[1,2]}}`,
			&codec.Transaction{EventID: "a", EntityID: "c1", AmountMinor: 5, EventTime: 1793491200000}, ""},
		{"missing currency is the schema default", `{"event_id":"a","entity_id":"c1","amount_minor":5,"event_time":1793491200000}`,
			&codec.Transaction{EventID: "a", EntityID: "c1", AmountMinor: 5, EventTime: 1793491200000}, ""},
		{"null entity_id reads as empty", `{"event_id":"a","entity_id":null,"amount_minor":5,"event_time":1793491200000}`,
			&codec.Transaction{EventID: "a", AmountMinor: 5, EventTime: 1793491200000}, ""},
		{"escaped unicode in ids", `{"event_id":"\u00e9","entity_id":"c\"1","amount_minor":0,"event_time":1793491200000}`,
			&codec.Transaction{EventID: "é", EntityID: `c"1`, EventTime: 1793491200000}, ""},
		// The bytes reach the validator as they are (it dead-letters them as
		// invalid:event_id, as in an Avro record): encoding/json would make
		// both of these "b\uFFFD", one id, and the second a false duplicate.
		{"invalid UTF-8 kept", "{\"event_id\":\"b\xff\",\"entity_id\":\"c1\",\"amount_minor\":5,\"event_time\":1793491200000}",
			&codec.Transaction{EventID: "b\xff", EntityID: "c1", AmountMinor: 5, EventTime: 1793491200000}, ""},
		{"lone surrogate escape kept", `{"event_id":"a","entity_id":"c\ud800","amount_minor":5,"event_time":1793491200000}`,
			&codec.Transaction{EventID: "a", EntityID: "c\xed\xa0\x80", AmountMinor: 5, EventTime: 1793491200000}, ""},
		{"field names match exactly", `{"EVENT_ID":"x","event_id":"a","Entity_Id":"y","entity_id":"c1","amount_minor":5,"event_time":1793491200000}`,
			&codec.Transaction{EventID: "a", EntityID: "c1", AmountMinor: 5, EventTime: 1793491200000}, ""},
		{"a name in another case is not the field", `{"event_id":"a","ENTITY_ID":"c1","amount_minor":5,"event_time":1793491200000}`,
			&codec.Transaction{EventID: "a", AmountMinor: 5, EventTime: 1793491200000}, ""},
		{"not JSON", `event_id=a`, nil, "not a JSON transaction object"},
		{"null", `null`, nil, "not a JSON transaction object"},
		{"a JSON array", `[1,2]`, nil, "not a JSON transaction object"},
		{"amount as a string", `{"event_id":"a","entity_id":"c1","amount_minor":"5","event_time":1793491200000}`, nil, "amount_minor: want a JSON integer"},
		{"fractional amount", `{"event_id":"a","entity_id":"c1","amount_minor":5.5,"event_time":1793491200000}`, nil, "amount_minor: want a JSON integer"},
		{"exponent amount", `{"event_id":"a","entity_id":"c1","amount_minor":1e3,"event_time":1793491200000}`, nil, "amount_minor: want a JSON integer"},
		{"event_time beyond 64 bits", `{"event_id":"a","entity_id":"c1","amount_minor":5,"event_time":99999999999999999999}`, nil, "event_time: want a JSON integer"},
		{"missing event_time", `{"event_id":"a","entity_id":"c1","amount_minor":5}`, nil, "event_time is missing"},
		{"event_id as a number", `{"event_id":7,"entity_id":"c1","amount_minor":5,"event_time":1793491200000}`, nil, "event_id: want a JSON string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The line under test sits between a good line and blank lines, so
			// its offset (1) must skip the blanks but count the first line.
			path := writeFile(t, "in.jsonl", ok+"\n\n  \n"+tt.line+"\n")
			src, err := OpenJSONL(path)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			var got []Record
			err = src.Read(context.Background(), 0, nil, func(r *Record) error {
				c := *r
				c.Value = append([]byte(nil), r.Value...)
				got = append(got, c)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 {
				t.Fatalf("got %d records, want 2", len(got))
			}
			r := got[1]
			if r.Offset != 1 || string(r.Original) != tt.line {
				t.Errorf("offset %d original %q, want 1 and the line", r.Offset, r.Original)
			}
			if tt.wantTx == nil {
				if r.Reject == nil || r.Reject.Reason != codec.ReasonDecode || !strings.Contains(r.Reject.Detail, tt.wantInErr) || !strings.Contains(r.Reject.Detail, "line 4") {
					t.Fatalf("reject = %+v, want decode naming line 4 and %q", r.Reject, tt.wantInErr)
				}
				return
			}
			if r.Reject != nil {
				t.Fatalf("rejected: %v", r.Reject)
			}
			if want := codec.EncodeTransaction(tt.wantTx); string(r.Value) != string(want) {
				t.Errorf("value %x, want %x", r.Value, want)
			}
			if string(r.Key) != tt.wantTx.EntityID {
				t.Errorf("key %q, want the entity id %q", r.Key, tt.wantTx.EntityID)
			}
		})
	}
}

// TestJSONLSourceStopsOnCancel checks that a cancelled context ends the read
// with its error rather than a silent, short success.
func TestJSONLSourceStopsOnCancel(t *testing.T) {
	var b strings.Builder
	for range 5000 {
		b.WriteString(`{"event_id":"a","entity_id":"c","amount_minor":1,"event_time":1793491200000}` + "\n")
	}
	src, err := OpenJSONL(writeFile(t, "in.jsonl", b.String()))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err = src.Read(ctx, 0, nil, func(*Record) error {
		if n++; n == 10 {
			cancel()
		}
		return nil
	})
	if err != context.Canceled || n >= 5000 {
		t.Fatalf("read %d records, err %v; want context.Canceled well before the end", n, err)
	}
}

// writeOCF writes records with schema into an Avro object container file.
func writeOCF(t *testing.T, schema string, records []map[string]any) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "txns.avro")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := goavro.NewOCFWriter(goavro.OCFConfig{W: f, Schema: schema, CompressionName: goavro.CompressionDeflateLabel})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]any, len(records))
	for i, r := range records {
		items[i] = r
	}
	if err := w.Append(items); err != nil {
		t.Fatal(err)
	}
	return p
}

// newerTransaction is a later writer schema: a field added in the middle, the
// currency field dropped (ours has a default), event_time moved first.
const newerTransaction = `{"type":"record","name":"Transaction","namespace":"io.velocity.v1","fields":[
 {"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"event_id","type":"string"},
 {"name":"mcc","type":"string"},
 {"name":"entity_id","type":"string"},
 {"name":"amount_minor","type":"long"}]}`

// TestOCFSource replays the worked example from Avro container files written
// with our schema and with a newer writer schema, and checks both give the
// same features, byte for byte, as the JSON-lines file.
func TestOCFSource(t *testing.T) {
	want := replayToMem(t, mustOpenJSONL(t, filepath.Join("testdata", "examples.jsonl")))
	lines := readLines[struct {
		EventID     string `json:"event_id"`
		EntityID    string `json:"entity_id"`
		AmountMinor int64  `json:"amount_minor"`
		Currency    string `json:"currency"`
		EventTime   int64  `json:"event_time"`
	}](t, filepath.Join("testdata", "examples.jsonl"))

	tests := []struct {
		name   string
		schema string
		record func(i int) map[string]any
	}{
		{"our schema", schemas.Transaction, func(i int) map[string]any {
			l := lines[i]
			return map[string]any{"event_id": l.EventID, "entity_id": l.EntityID, "amount_minor": l.AmountMinor, "currency": l.Currency, "event_time": l.EventTime}
		}},
		{"newer writer schema", newerTransaction, func(i int) map[string]any {
			l := lines[i]
			return map[string]any{"event_id": l.EventID, "entity_id": l.EntityID, "amount_minor": l.AmountMinor, "mcc": "5411", "event_time": l.EventTime}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs := make([]map[string]any, len(lines))
			for i := range lines {
				recs[i] = tt.record(i)
			}
			src, err := OpenOCF(writeOCF(t, tt.schema, recs))
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			got := replayToMemSchema(t, src, src.WriterSchema())
			if len(got.values) != len(want.values) || len(got.dead) != len(want.dead) {
				t.Fatalf("%d features %d dead, want %d and %d", len(got.values), len(got.dead), len(want.values), len(want.dead))
			}
			for i := range want.values {
				// Lineage names the file, so compare with the source topic swapped.
				w, g := want.features[i], got.features[i]
				w.SourceTopic, g.SourceTopic = "", ""
				if !equalFeatures(w, g) {
					t.Errorf("features %d:\n got %+v\nwant %+v", i, g, w)
				}
				if got.features[i].SourceTopic != "txns.avro" {
					t.Errorf("source_topic %q, want the file's base name", got.features[i].SourceTopic)
				}
			}
			for i := range want.dead {
				if got.dead[i].Reason != want.dead[i].Reason || got.dead[i].SourceOffset != want.dead[i].SourceOffset {
					t.Errorf("dead %d: %s@%d, want %s@%d", i, got.dead[i].Reason, got.dead[i].SourceOffset, want.dead[i].Reason, want.dead[i].SourceOffset)
				}
				if string(got.dead[i].Key) != lines[got.dead[i].SourceOffset].EntityID {
					t.Errorf("dead %d: key %q, want the entity id", i, got.dead[i].Key)
				}
			}
		})
	}
}

func TestOCFSourceRejectsOtherFiles(t *testing.T) {
	if _, err := OpenOCF(writeFile(t, "x.avro", `{"event_id":"a"}`)); err == nil {
		t.Fatal("a JSON file opened as an Avro container")
	}
}

func mustOpenJSONL(t *testing.T, path string) *JSONLSource {
	t.Helper()
	s, err := OpenJSONL(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func replayToMem(t *testing.T, src Source) *memSink {
	return replayToMemSchema(t, src, "")
}

func replayToMemSchema(t *testing.T, src Source, writerSchema string) *memSink {
	t.Helper()
	pc := exampleConfig(t)
	dec, err := codec.NewDecoder(writerSchema, codec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pc.Decoder = dec
	m := &memSink{}
	res, err := Run(context.Background(), src, Config{Pipeline: pc, Features: m, Dead: m})
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != res.Features+res.Dead {
		t.Fatalf("%d records gave %d features + %d dead letters", res.Records, res.Features, res.Dead)
	}
	return m
}

func equalFeatures(a, b codec.Features) bool {
	if len(a.Windows) != len(b.Windows) {
		return false
	}
	for i := range a.Windows {
		if a.Windows[i] != b.Windows[i] {
			return false
		}
	}
	a.Windows, b.Windows = nil, nil
	return a.EventID == b.EventID && a.EntityID == b.EntityID && a.EventTime == b.EventTime &&
		a.MsSincePrevious == b.MsSincePrevious && a.HasPrevious == b.HasPrevious && a.Late == b.Late &&
		a.SourceTopic == b.SourceTopic && a.SourcePartition == b.SourcePartition && a.SourceOffset == b.SourceOffset
}

// warmUpFirst marks the first n records of a source as warm-up.
type warmUpFirst struct {
	Source
	n int64
}

func (w warmUpFirst) Read(ctx context.Context, p int32, prog *Progress, fn func(*Record) error) error {
	return w.Source.Read(ctx, p, prog, func(r *Record) error {
		r.WarmUp = r.Offset < w.n
		return fn(r)
	})
}

// TestWarmUp replays the worked example with its first records as warm-up:
// outputs of the range are exactly those of a full replay, including the
// features of events released only after the range began; nothing of the
// warm-up is written, even its outputs released later (e1…e3, released by e5).
func TestWarmUp(t *testing.T) {
	full := replayToMem(t, mustOpenJSONL(t, filepath.Join("testdata", "examples.jsonl")))
	for _, n := range []int64{0, 1, 4, 7, 12} {
		t.Run("first "+strconv.FormatInt(n, 10), func(t *testing.T) {
			m := &memSink{}
			res, err := Run(context.Background(), warmUpFirst{mustOpenJSONL(t, filepath.Join("testdata", "examples.jsonl")), n},
				Config{Pipeline: exampleConfig(t), Features: m, Dead: m})
			if err != nil {
				t.Fatal(err)
			}
			var want [][]byte
			for i, f := range full.features {
				if f.SourceOffset >= n {
					want = append(want, full.values[i])
				}
			}
			if len(m.values) != len(want) {
				t.Fatalf("%d features, want %d", len(m.values), len(want))
			}
			for i := range want {
				if string(m.values[i]) != string(want[i]) {
					t.Errorf("features %d differ from the full replay's", i)
				}
			}
			for _, d := range m.dead {
				if d.SourceOffset < n {
					t.Errorf("dead letter for warm-up offset %d", d.SourceOffset)
				}
			}
			if res.WarmUp != n || res.Records != 12-n || res.Records != res.Features+res.Dead {
				t.Errorf("result %+v, want %d warm-up and %d records all accounted for", res, n, 12-n)
			}
		})
	}
}

// TestJSONLInvalidUTF8DeadLettered replays ids that are not UTF-8, raw and as
// lone surrogate escapes, end to end: each is dead-lettered as invalid:<field>
// as the same bytes in an Avro record are, not read as U+FFFD (which made the
// second line a duplicate of the first, and the last two lines one entity).
func TestJSONLInvalidUTF8DeadLettered(t *testing.T) {
	lines := []string{
		`{"event_id":"b` + "\xff" + `","entity_id":"k","amount_minor":1,"currency":"","event_time":1793491200000}`,
		`{"event_id":"b` + "\xfe" + `","entity_id":"k","amount_minor":1,"currency":"","event_time":1793491200000}`,
		`{"event_id":"c","entity_id":"k` + "\xff" + `","amount_minor":1,"currency":"","event_time":1793491200000}`,
		`{"event_id":"d","entity_id":"k` + "\uFFFD" + `","amount_minor":1,"currency":"","event_time":1793491200000}`,
		`{"event_id":"e\ud800","entity_id":"k","amount_minor":1,"currency":"","event_time":1793491200000}`,
		`{"event_id":"e\udfff","entity_id":"k","amount_minor":1,"currency":"","event_time":1793491200000}`,
	}
	in := writeFile(t, "in.jsonl", strings.Join(lines, "\n")+"\n")
	dir := t.TempDir()
	feat, dead := filepath.Join(dir, "f.jsonl"), filepath.Join(dir, "d.jsonl")
	replayFiles(t, in, feat, dead, exampleConfig(t))

	wantDead := map[int64]string{0: "invalid:event_id", 1: "invalid:event_id", 2: "invalid:entity_id", 4: "invalid:event_id", 5: "invalid:event_id"}
	gotDead := map[int64]string{}
	for _, d := range readLines[jsonDead](t, dead) {
		gotDead[d.SourceOffset] = d.Reason
		if !strings.Contains(d.Error, "not valid UTF-8") {
			t.Errorf("offset %d: error %q, want it to say the field is not valid UTF-8", d.SourceOffset, d.Error)
		}
	}
	if !maps.Equal(gotDead, wantDead) {
		t.Errorf("dead letters by offset %v, want %v", gotDead, wantDead)
	}
	fs := readLines[jsonFeatures](t, feat)
	if len(fs) != 1 || fs[0].SourceOffset != 3 || fs[0].EntityID != "k\uFFFD" || fs[0].Windows[0].Count != 1 || fs[0].MsSincePrevious != nil {
		t.Errorf("features %+v, want one record for offset 3: the first event of entity \"k\\uFFFD\"", fs)
	}
}

// TestJSONLDeadLetterKeepsTheLineAsRead: a dead letter's value is the line
// byte for byte as the file holds it, without only the \n that ends it, as
// the live DLQ keeps a record's value unchanged. Spaces around a line, a tab
// or the \r of a CRLF file are not trimmed, whatever the reason.
func TestJSONLDeadLetterKeepsTheLineAsRead(t *testing.T) {
	lines := []string{
		"  not json at all \t", // decode, spaces and a tab around it
		`{"event_id":"x1","entity_id":"","amount_minor":5,"event_time":1793491200000}` + "\r", // invalid:entity_id, CRLF
		"\t" + `{"event_id":"x2","entity_id":"c1","amount_minor":5,"event_time":1793491200000}` + " ",
		`  {"event_id":"x2","entity_id":"c1","amount_minor":5,"event_time":1793491200000}`, // duplicate
	}
	dir := t.TempDir()
	in := writeFile(t, "in.jsonl", strings.Join(lines, "\n")+"\n")
	feat, dead := filepath.Join(dir, "f.jsonl"), filepath.Join(dir, "d.jsonl")
	res := replayFiles(t, in, feat, dead, exampleConfig(t))
	if res.Records != 4 || res.Features != 1 || res.Dead != 3 {
		t.Fatalf("%d records, %d features, %d dead; want 4, 1, 3", res.Records, res.Features, res.Dead)
	}
	wantReason := map[int64]string{0: "decode", 1: "invalid:entity_id", 3: "duplicate"}
	for _, d := range readLines[jsonDead](t, dead) {
		v, err := base64.StdEncoding.DecodeString(d.Value)
		if err != nil {
			t.Fatal(err)
		}
		if d.Reason != wantReason[d.SourceOffset] {
			t.Errorf("offset %d: reason %s, want %s", d.SourceOffset, d.Reason, wantReason[d.SourceOffset])
		}
		if want := lines[d.SourceOffset]; string(v) != want {
			t.Errorf("offset %d (%s): dead-letter value %q, want the line as read %q", d.SourceOffset, d.Reason, v, want)
		}
	}
}
