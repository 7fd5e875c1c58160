package replay

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// exampleConfig is the configuration of docs/contract.md's worked example: windows
// 10s:1s,1m:10s, allowed lateness 2 s, the other settings at run's defaults.
func exampleConfig(t testing.TB) pipeline.Config {
	t.Helper()
	specs, err := window.ParseSpecs("10s:1s,1m:10s")
	if err != nil {
		t.Fatal(err)
	}
	dec, err := codec.NewDecoder("", codec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return pipeline.Config{
		Specs:     specs,
		Window:    window.Options{MaxEntities: 5_000_000, HistoryTTLMs: 7 * 24 * 3600 * 1000},
		Watermark: watermark.Config{AllowedLateness: 2000, DedupeHorizon: 24 * 3600 * 1000},
		Decoder:   dec,
	}
}

// exampleT is T = 2026-11-01T00:00:00Z of the worked example, in Unix ms.
const exampleT = 1793491200000

type jsonWindow struct {
	Window   string `json:"window"`
	WindowMs int64  `json:"window_ms"`
	BucketMs int64  `json:"bucket_ms"`
	Count    int64  `json:"count"`
	SumMinor int64  `json:"sum_minor"`
	MinMinor int64  `json:"min_minor"`
	MaxMinor int64  `json:"max_minor"`
}

type jsonFeatures struct {
	EventID         string       `json:"event_id"`
	EntityID        string       `json:"entity_id"`
	EventTime       int64        `json:"event_time"`
	Windows         []jsonWindow `json:"windows"`
	MsSincePrevious *int64       `json:"ms_since_previous"`
	Late            bool         `json:"late"`
	SourceTopic     string       `json:"source_topic"`
	SourcePartition int32        `json:"source_partition"`
	SourceOffset    int64        `json:"source_offset"`
}

type jsonDead struct {
	Reason          string  `json:"reason"`
	Error           string  `json:"error"`
	SourceTopic     string  `json:"source_topic"`
	SourcePartition int32   `json:"source_partition"`
	SourceOffset    int64   `json:"source_offset"`
	Key             *string `json:"key"`
	Value           string  `json:"value"`
}

// readLines decodes every line of a JSON-lines file strictly: unknown fields
// are an error, so a misspelt field name fails the test.
func readLines[T any](t *testing.T, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		dec := json.NewDecoder(bytesReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var v T
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s line %d: %v: %s", path, len(out)+1, err, sc.Bytes())
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestExamplesGolden replays the worked example from a JSON-lines file to
// JSON-lines outputs and checks every row of its table: outcome, both
// windows' count/sum/min/max, ms_since_previous and the dead-letter reasons,
// and that features come out in release order.
func TestExamplesGolden(t *testing.T) {
	type agg struct{ count, sum, min, max int64 }
	const null = -1
	want := []struct {
		offset    int64
		eventID   string
		reason    codec.Reason // "" for features
		w10s, w1m agg
		msPrev    int64
	}{
		{0, "e1", "", agg{1, 1000, 1000, 1000}, agg{1, 1000, 1000, 1000}, null},
		{1, "e2", "", agg{2, 3500, 1000, 2500}, agg{2, 3500, 1000, 2500}, 400},
		{2, "e3", "", agg{1, 700, 700, 700}, agg{1, 700, 700, 700}, null},
		{3, "e4", "", agg{3, 3800, 300, 2500}, agg{3, 3800, 300, 2500}, 1100},
		{4, "e5", "", agg{5, 8900, 100, 5000}, agg{5, 8900, 100, 5000}, 1300},
		{5, "e6", "", agg{4, 3900, 100, 2500}, agg{4, 3900, 100, 2500}, 400},
		{6, "e7", codec.ReasonLate, agg{}, agg{}, 0},
		{7, "e2", codec.ReasonDuplicate, agg{}, agg{}, 0},
		{8, "e9", codec.ReasonInvalidEntityID, agg{}, agg{}, 0},
		{9, "e10", "", agg{6, 8940, 40, 5000}, agg{6, 8940, 40, 5000}, 0},
		{10, "e11", "", agg{3, 5100, 40, 5000}, agg{7, 9000, 40, 5000}, 7800},
		{11, "e12", "", agg{1, 80, 80, 80}, agg{1, 80, 80, 80}, 74100},
	}
	// Release order (the contract: features are emitted in release order): e1 e2 e3 are
	// released by e5, e4 e6 e5 e10 by e11, e11 by e12, e12 by the end flush.
	wantFeatureOrder := []int64{0, 1, 2, 3, 5, 4, 9, 10, 11}
	wantDeadOrder := []int64{6, 7, 8}

	dir := t.TempDir()
	featPath, deadPath := filepath.Join(dir, "features.jsonl"), filepath.Join(dir, "dlq.jsonl")
	res := replayFiles(t, filepath.Join("testdata", "examples.jsonl"), featPath, deadPath, exampleConfig(t))
	if res.Records != 12 || res.Features != 9 || res.Dead != 3 {
		t.Fatalf("result = %d records, %d features, %d dead; want 12, 9, 3", res.Records, res.Features, res.Dead)
	}

	feats := readLines[jsonFeatures](t, featPath)
	deads := readLines[jsonDead](t, deadPath)
	var gotFeatOrder, gotDeadOrder []int64
	byOffset := map[int64]jsonFeatures{}
	for _, f := range feats {
		gotFeatOrder = append(gotFeatOrder, f.SourceOffset)
		byOffset[f.SourceOffset] = f
	}
	deadBy := map[int64]jsonDead{}
	for _, d := range deads {
		gotDeadOrder = append(gotDeadOrder, d.SourceOffset)
		deadBy[d.SourceOffset] = d
	}
	if !equalInts(gotFeatOrder, wantFeatureOrder) {
		t.Errorf("features in offset order %v, want release order %v", gotFeatOrder, wantFeatureOrder)
	}
	if !equalInts(gotDeadOrder, wantDeadOrder) {
		t.Errorf("dead letters in offset order %v, want %v", gotDeadOrder, wantDeadOrder)
	}

	input := readRawLines(t, filepath.Join("testdata", "examples.jsonl"))
	for _, w := range want {
		if w.reason != "" {
			d, ok := deadBy[w.offset]
			if !ok {
				t.Errorf("offset %d (%s): no dead letter, want reason %s", w.offset, w.eventID, w.reason)
				continue
			}
			if d.Reason != string(w.reason) || d.Error == "" || d.SourceTopic != "examples.jsonl" || d.SourcePartition != 0 {
				t.Errorf("offset %d: dead letter %+v, want reason %s from examples.jsonl/0 with an error", w.offset, d, w.reason)
			}
			if v, err := base64.StdEncoding.DecodeString(d.Value); err != nil || string(v) != input[w.offset] {
				t.Errorf("offset %d: dead-letter value %q (%v), want the input line %q", w.offset, v, err, input[w.offset])
			}
			continue
		}
		f, ok := byOffset[w.offset]
		if !ok {
			t.Errorf("offset %d (%s): no features record", w.offset, w.eventID)
			continue
		}
		if f.EventID != w.eventID || f.SourceTopic != "examples.jsonl" || f.SourcePartition != 0 || f.Late {
			t.Errorf("offset %d: %s from %s/%d late=%v, want %s from examples.jsonl/0 not late", w.offset, f.EventID, f.SourceTopic, f.SourcePartition, f.Late, w.eventID)
		}
		if len(f.Windows) != 2 {
			t.Fatalf("offset %d: %d windows, want 2", w.offset, len(f.Windows))
		}
		for i, wa := range []struct {
			name     string
			win, bkt int64
			a        agg
		}{{"10s", 10_000, 1_000, w.w10s}, {"1m", 60_000, 10_000, w.w1m}} {
			g := f.Windows[i]
			got := agg{g.Count, g.SumMinor, g.MinMinor, g.MaxMinor}
			if g.Window != wa.name || g.WindowMs != wa.win || g.BucketMs != wa.bkt || got != wa.a {
				t.Errorf("offset %d window %d: %+v, want %s %d/%d %+v", w.offset, i, g, wa.name, wa.win, wa.bkt, wa.a)
			}
		}
		switch {
		case w.msPrev == null && f.MsSincePrevious != nil:
			t.Errorf("offset %d: ms_since_previous %d, want null", w.offset, *f.MsSincePrevious)
		case w.msPrev != null && (f.MsSincePrevious == nil || *f.MsSincePrevious != w.msPrev):
			t.Errorf("offset %d: ms_since_previous %v, want %d", w.offset, f.MsSincePrevious, w.msPrev)
		}
	}
}

// replayFiles runs a JSON-lines input to JSON-lines outputs and commits them.
func replayFiles(t *testing.T, in, featPath, deadPath string, pc pipeline.Config) Result {
	t.Helper()
	src, err := OpenJSONL(in)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	fs, err := NewJSONLSink(featPath)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := NewDeadJSONLSink(deadPath)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), src, Config{Pipeline: pc, Features: fs, Dead: ds})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []Sink{fs, ds} {
		if err := s.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return res
}

func readRawLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	sc := bufio.NewScanner(bytesReader(b))
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
