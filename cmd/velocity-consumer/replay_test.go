package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/velocity-consumer/velocity-consumer/pkg/replay"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

const replayExample = "../../pkg/replay/testdata/examples.jsonl"

// TestReplayFlagErrors checks that a wrong replay command line is refused with
// a sentence naming what to fix, before anything is read or written.
func TestReplayFlagErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no output", []string{"--input-file", replayExample}, "--output (VELOCITY_OUTPUT) is required"},
		{"no input", []string{"--output", filepath.Join(dir, "a.jsonl")}, "give --input-topic"},
		{"unknown file type", []string{"--input-file", "x.csv", "--output", filepath.Join(dir, "a.jsonl")}, "want a .avro"},
		{"unknown output type", []string{"--input-file", replayExample, "--output", filepath.Join(dir, "a.csv")}, "want topic:NAME, NAME.jsonl or NAME.parquet"},
		{"parquet dlq", []string{"--input-file", replayExample, "--output", filepath.Join(dir, "a.jsonl"), "--dlq", filepath.Join(dir, "d.parquet")}, "--dlq"},
		{"bad partitions", []string{"--input-topic", "t", "--partitions", "0,x", "--output", filepath.Join(dir, "a.jsonl")}, "--partitions"},
		{"bad from", []string{"--input-topic", "t", "--from", "yesterday", "--output", filepath.Join(dir, "a.jsonl")}, "--from (VELOCITY_FROM)"},
		{"output into the input topic", []string{"--input-topic", "t", "--brokers", "127.0.0.1:1", "--output", "topic:t"}, "is the input topic"},
		{"a range on a file", []string{"--input-file", replayExample, "--from", "3", "--output", filepath.Join(dir, "a.jsonl")}, "replayed whole"},
		{"both inputs", []string{"--input-file", replayExample, "--input-topic", "t", "--output", filepath.Join(dir, "a.jsonl")}, "not both"},
		{"from after to, offsets", []string{"--input-topic", "t", "--from", "200", "--to", "100", "--output", filepath.Join(dir, "a.jsonl")}, "--from 200 is after --to 100"},
		{"from after to, times", []string{"--input-topic", "t", "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-01T00:00:00Z", "--output", filepath.Join(dir, "a.jsonl")}, "is after --to"},
		{"to start", []string{"--input-topic", "t", "--from", "5", "--to", "start", "--output", filepath.Join(dir, "a.jsonl")}, "is after --to"},
		{"warm-up after from", []string{"--input-topic", "t", "--from", "100", "--warm-up-from", "150", "--output", filepath.Join(dir, "a.jsonl")}, "--warm-up-from 150 is after --from 100"},
		{"shared semantics flags are validated", []string{"--input-file", replayExample, "--output", filepath.Join(dir, "a.jsonl"), "--windows", "5m:7s"}, "--windows"},
		{"no definition file", []string{"--input-file", replayExample, "--output", filepath.Join(dir, "a.jsonl"), "--features", filepath.Join(dir, "none.yaml")}, "--features (VELOCITY_FEATURES)"},
		{"a definition and --windows", []string{"--input-file", replayExample, "--output", filepath.Join(dir, "a.jsonl"), "--features", cardDefinitionFile, "--windows", "5m:5s"}, "--windows and --features exclude each other"},
		{"a definition with another --writer-schema", []string{"--input-file", replayExample, "--output", filepath.Join(dir, "a.jsonl"), "--features", cardDefinitionFile, "--writer-schema", "../../schemas/transaction.avsc"}, "--writer-schema names another"},
		{"a path the schema lacks", []string{"--input-file", replayExample, "--output", filepath.Join(dir, "a.jsonl"), "--features", "testdata/card_features_bad_path.yaml"}, "card_features_bad_path.yaml:5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := cmdReplay(context.Background(), append(tt.args, "--quiet", "--log-level", "error"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
			if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
				t.Errorf("a refused command left files: %v", m)
			}
		})
	}
}

// TestReplayCommandMatchesRunFlags checks that replay registers every
// semantics flag run has, with the same defaults: the two modes must be
// configured identically to produce identical features.
func TestReplayCommandMatchesRunFlags(t *testing.T) {
	var r runFlags
	re := newEnvFlags("run", "")
	r.register(re)
	var p replayFlags
	pe := newEnvFlags("replay", "")
	p.register(pe)
	var probe pipelineFlags
	pf := newEnvFlags("probe", "")
	probe.register(pf)
	n := 0
	pf.fs.VisitAll(func(f *flag.Flag) {
		n++
		rf, pfl := re.fs.Lookup(f.Name), pe.fs.Lookup(f.Name)
		if rf == nil || pfl == nil || rf.DefValue != pfl.DefValue {
			t.Errorf("flag --%s: run %v, replay %v", f.Name, rf, pfl)
		}
	})
	if n < 5 {
		t.Fatalf("only %d semantics flags found", n)
	}
}

// TestReplayCommandFiles runs the command on the worked example to each file
// output and checks the outputs exist under their final names only.
func TestReplayCommandFiles(t *testing.T) {
	for _, out := range []string{"f.jsonl", "f.parquet"} {
		t.Run(out, func(t *testing.T) {
			dir := t.TempDir()
			err := cmdReplay(context.Background(), []string{
				"--input-file", replayExample, "--windows", "10s:1s,1m:10s", "--allowed-lateness", "2s",
				"--output", filepath.Join(dir, out), "--dlq", filepath.Join(dir, "dlq.jsonl"), "--quiet", "--log-level", "error",
			})
			if err != nil {
				t.Fatal(err)
			}
			m, _ := filepath.Glob(filepath.Join(dir, "*"))
			if len(m) != 2 || !strings.HasSuffix(m[0], "dlq.jsonl") || !strings.HasSuffix(m[1], out) {
				t.Fatalf("files %v, want dlq.jsonl and %s", m, out)
			}
			dlq, _ := os.ReadFile(filepath.Join(dir, "dlq.jsonl"))
			if got := bytes.Count(dlq, []byte("\n")); got != 3 {
				t.Errorf("%d dead letters, want 3", got)
			}
		})
	}
}

// TestReplayCommandAvroFile replays an Avro container file through the
// command: the file's header schema is the writer schema.
func TestReplayCommandAvroFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "txns.avro")
	f, err := os.Create(in)
	if err != nil {
		t.Fatal(err)
	}
	w, err := goavro.NewOCFWriter(goavro.OCFConfig{W: f, Schema: schemas.Transaction})
	if err != nil {
		t.Fatal(err)
	}
	var recs []any
	for i := range 100 {
		recs = append(recs, map[string]any{"event_id": "e" + strconv.Itoa(i), "entity_id": "c" + strconv.Itoa(i%7),
			"amount_minor": int64(i), "currency": "EUR", "event_time": int64(1793491200000 + i*1000)})
	}
	recs = append(recs, map[string]any{"event_id": "bad", "entity_id": "c1", "amount_minor": int64(1), "currency": "eur", "event_time": int64(1793491300000)})
	if err := w.Append(recs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, dlq := filepath.Join(dir, "f.jsonl"), filepath.Join(dir, "d.jsonl")
	if err := cmdReplay(context.Background(), []string{"--input-file", in, "--output", out, "--dlq", dlq, "--quiet", "--log-level", "error"}); err != nil {
		t.Fatal(err)
	}
	fb, _ := os.ReadFile(out)
	db, _ := os.ReadFile(dlq)
	if n := bytes.Count(fb, []byte("\n")); n != 100 || !bytes.Contains(fb, []byte(`"source_topic":"txns.avro","source_partition":0,"source_offset":99}`)) {
		t.Errorf("%d features lines, want 100 with file lineage", n)
	}
	if !bytes.Contains(db, []byte(`"reason":"invalid:currency"`)) || !bytes.Contains(db, []byte(`"source_offset":100`)) {
		t.Errorf("dead letters %s, want invalid:currency at offset 100", db)
	}
}

// TestReplayInterrupted cancels the command's context (what Ctrl-C does)
// before it finishes: it must fail, and leave no file at all.
func TestReplayInterrupted(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var b strings.Builder
	for i := range 200_000 {
		b.WriteString(`{"event_id":"e` + strconv.Itoa(i) + `","entity_id":"c` + strconv.Itoa(i%1000) + `","amount_minor":1,"event_time":` + strconv.Itoa(1793491200000+i) + "}\n")
	}
	if err := os.WriteFile(in, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	out := filepath.Join(dir, "out.parquet")
	err := cmdReplay(ctx, []string{"--input-file", in, "--output", out, "--dlq", filepath.Join(dir, "d.jsonl"), "--quiet", "--log-level", "error"})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("err = %v, want an interruption", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 1 {
		t.Errorf("files after the interruption: %v, want only the input", m)
	}
}

// TestProgressSnapshot checks the rate and ETA derived from the counters, and
// that the bar fits the terminal width.
func TestProgressSnapshot(t *testing.T) {
	tests := []struct {
		name             string
		records, done    int64
		total            int64
		elapsed          time.Duration
		wantRate         float64
		wantETA          time.Duration
		wantBarSubstring string
	}{
		{"half way", 500, 500, 1000, 10 * time.Second, 50, 10 * time.Second, " 50.0%"},
		{"file bytes", 100, 250, 1000, 5 * time.Second, 20, 15 * time.Second, " 25.0%"},
		{"unknown total", 100, 0, 0, time.Second, 100, -1, "100 records"},
		{"nothing yet", 0, 0, 1000, time.Second, 0, -1, "0 records"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &replay.Progress{Unit: "offsets"}
			p.Records.Store(tt.records)
			p.Done.Store(tt.done)
			p.Total.Store(tt.total)
			s := snapshotProgress(p, tt.elapsed)
			if s.rate != tt.wantRate || s.eta != tt.wantETA {
				t.Errorf("rate %v eta %v, want %v and %v", s.rate, s.eta, tt.wantRate, tt.wantETA)
			}
			var b bytes.Buffer
			drawBar(&b, s, 80)
			line := strings.TrimSuffix(strings.TrimPrefix(b.String(), "\r"), "\x1b[K")
			if len(line) > 80 || !strings.Contains(line, tt.wantBarSubstring) {
				t.Errorf("bar %q (%d wide), want at most 80 wide containing %q", line, len(line), tt.wantBarSubstring)
			}
			s.log(zap.NewNop()) // must not panic on any reading
		})
	}
}

// TestReplayWarnsAtMaxEntities: when the --max-entities cap evicts entities,
// replay says so, as the live service does (docs/contract.md, "Entities": the
// features of an evicted entity lack its history); under the cap it stays quiet.
func TestReplayWarnsAtMaxEntities(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var b strings.Builder
	for i := range 30 {
		b.WriteString(`{"event_id":"e` + strconv.Itoa(i) + `","entity_id":"c` + strconv.Itoa(i%3) + `","amount_minor":1,"event_time":` + strconv.Itoa(1793491200000+i) + "}\n")
	}
	if err := os.WriteFile(in, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		max         string
		wantEvicted uint64 // 0: no warning
	}{{"3", 0}, {"2", 28}} {
		t.Run("max "+tt.max, func(t *testing.T) {
			var r replayFlags
			e := newEnvFlags("replay", replayUsage)
			r.register(e)
			if err := e.Parse([]string{"--input-file", in, "--output", filepath.Join(t.TempDir(), "f.jsonl"), "--quiet", "--max-entities", tt.max}); err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.InfoLevel)
			if err := runReplay(context.Background(), &r, zap.New(core)); err != nil {
				t.Fatal(err)
			}
			warned := logs.FilterMessageSnippet("--max-entities reached").All()
			switch {
			case tt.wantEvicted == 0 && len(warned) != 0:
				t.Errorf("warned under the cap: %v", warned[0].ContextMap())
			case tt.wantEvicted > 0 && (len(warned) != 1 || warned[0].Level != zap.WarnLevel || warned[0].ContextMap()["evicted"] != tt.wantEvicted):
				t.Errorf("warnings %v, want one warning with evicted=%d", warned, tt.wantEvicted)
			}
		})
	}
}

// TestFileReplayConnectsToNoBroker: a file replayed to files talks to no
// broker, so it logs no "kafka connection" line (which would tell the user
// it did); its connection flags are still checked. Topic inputs and outputs
// do connect.
func TestFileReplayConnectsToNoBroker(t *testing.T) {
	parse := func(t *testing.T, args ...string) *replayFlags {
		t.Helper()
		var r replayFlags
		e := newEnvFlags("replay", replayUsage)
		r.register(e)
		if err := e.Parse(append(args, "--quiet")); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	dir := t.TempDir()
	r := parse(t, "--input-file", replayExample, "--output", filepath.Join(dir, "f.jsonl"), "--dlq", filepath.Join(dir, "d.jsonl"))
	core, logs := observer.New(zap.DebugLevel)
	if err := runReplay(context.Background(), r, zap.New(core)); err != nil {
		t.Fatal(err)
	}
	if l := logs.FilterMessageSnippet("kafka").All(); len(l) != 0 {
		t.Errorf("a file-to-file replay logged %q", l[0].Message)
	}
	if logs.FilterMessage("replay complete").Len() != 1 {
		t.Errorf("no \"replay complete\" line: %v", logs.All())
	}

	bad := parse(t, "--input-file", replayExample, "--output", filepath.Join(dir, "g.jsonl"), "--sasl-mechanism", "MD5")
	if err := runReplay(context.Background(), bad, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "MD5") {
		t.Errorf("a bad --sasl-mechanism on a file replay: %v, want an error naming it", err)
	}

	for _, tt := range []struct {
		args []string
		want bool
	}{
		{[]string{"--input-file", "x.jsonl", "--output", "f.parquet", "--dlq", "d.jsonl"}, false},
		{[]string{"--input-file", "x.jsonl", "--output", "topic:features"}, true},
		{[]string{"--input-file", "x.jsonl", "--output", "f.jsonl", "--dlq", "topic:dlq"}, true},
		{[]string{"--input-topic", "t", "--output", "f.jsonl"}, true},
	} {
		if got := parse(t, tt.args...).needsKafka(); got != tt.want {
			t.Errorf("%v: needsKafka %v, want %v", tt.args, got, tt.want)
		}
	}
}
