package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateExamples = flag.Bool("update-examples", false, "rewrite examples/expected/ from the replay of examples/transactions.jsonl")

// TestExamplesReplay runs the README's replay command on
// examples/transactions.jsonl (the worked example of docs/contract.md plus a
// line that does not decode) and checks what it writes: 13 input offsets, 9
// features records in release order, 4 dead letters with their reasons and
// the lines as the file holds them, and both files byte for byte as in
// examples/expected/ (which the docs show).
func TestExamplesReplay(t *testing.T) {
	dir := t.TempDir()
	feat, dead := filepath.Join(dir, "features.jsonl"), filepath.Join(dir, "dead-letters.jsonl")
	// The README's command, with the outputs in dir.
	err := cmdReplay(context.Background(), []string{
		"--input-file", examplesFile, "--windows", "10s:1s,1m:10s", "--allowed-lateness", "2s",
		"--output", feat, "--dlq", dead, "--quiet", "--log-level", "error",
	})
	if err != nil {
		t.Fatal(err)
	}
	type featuresRecord struct {
		EventID         string `json:"event_id"`
		SourceOffset    int64  `json:"source_offset"`
		MsSincePrevious *int64 `json:"ms_since_previous"`
		Windows         []struct {
			Window   string `json:"window"`
			Count    int64  `json:"count"`
			SumMinor int64  `json:"sum_minor"`
		} `json:"windows"`
	}
	var features []featuresRecord
	for _, l := range readJSONLines(t, feat) {
		var f featuresRecord
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatal(err)
		}
		features = append(features, f)
	}
	// Release order: e5 waits for the watermark until e11 arrives, after e6.
	wantOrder := []int64{0, 1, 2, 3, 5, 4, 9, 10, 11}
	if len(features) != len(wantOrder) {
		t.Fatalf("%d features records, want %d", len(features), len(wantOrder))
	}
	for i, f := range features {
		if f.SourceOffset != wantOrder[i] {
			t.Errorf("features record %d is offset %d (%s), want offset %d", i, f.SourceOffset, f.EventID, wantOrder[i])
		}
	}
	if e5 := features[5]; e5.EventID != "e5" || e5.Windows[0].Count != 5 || e5.Windows[0].SumMinor != 8900 || e5.MsSincePrevious == nil || *e5.MsSincePrevious != 1300 {
		t.Errorf("e5: %+v, want 10s count 5, sum 8900, ms_since_previous 1300", e5)
	}

	input := readJSONLines(t, examplesFile)
	wantDead := map[int64]string{6: "late", 7: "duplicate", 8: "invalid:entity_id", 12: "decode"}
	deadLines := readJSONLines(t, dead)
	if len(deadLines) != len(wantDead) {
		t.Fatalf("%d dead letters, want %d", len(deadLines), len(wantDead))
	}
	for _, l := range deadLines {
		var d struct {
			Reason       string `json:"reason"`
			SourceOffset int64  `json:"source_offset"`
			Value        string `json:"value"`
		}
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatal(err)
		}
		v, _ := base64.StdEncoding.DecodeString(d.Value)
		if d.Reason != wantDead[d.SourceOffset] || string(v) != input[d.SourceOffset] {
			t.Errorf("dead letter at offset %d: reason %s, value %q; want %s and the input line %q", d.SourceOffset, d.Reason, v, wantDead[d.SourceOffset], input[d.SourceOffset])
		}
	}

	for _, f := range []string{"features.jsonl", "dead-letters.jsonl"} {
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		golden := filepath.Join("../../examples/expected", f)
		if *updateExamples {
			if err := os.WriteFile(golden, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s differs from %s (if the change is meant, rewrite it: go test ./cmd/velocity-consumer -run TestExamplesReplay -update-examples)", f, golden)
		}
	}
}

func readJSONLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}
