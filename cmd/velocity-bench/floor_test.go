package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

func TestParseProcSpecKinds(t *testing.T) {
	for _, tc := range []struct {
		in      string
		kind    string
		eos     bool
		late    time.Duration
		name    string
		wantErr bool
	}{
		{in: "floor", kind: "floor", name: "floor"},
		{in: " floor ", kind: "floor", name: "floor"},
		{in: "ours", kind: "ours", name: "ours"},
		{in: "ours:eos", kind: "ours", eos: true, name: "ours:eos"},
		{in: "ours:late=250ms", kind: "ours", late: 250 * time.Millisecond, name: "ours:late=250ms"},
		{in: "kstreams:eos", kind: "kstreams", eos: true, name: "kstreams:eos"},
		{in: "floor:eos", wantErr: true},
		{in: "floor:late=1s", wantErr: true},
		{in: "floors", wantErr: true},
		{in: "passthrough", wantErr: true},
	} {
		p, err := ParseProcSpec(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("ParseProcSpec(%q) = %+v, want an error", tc.in, p)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseProcSpec(%q): %v", tc.in, err)
			continue
		}
		if p.Kind != tc.kind || p.EOS != tc.eos || p.Lateness != tc.late || p.Name != tc.name {
			t.Errorf("ParseProcSpec(%q) = %+v, want kind %s eos %v late %v name %q", tc.in, p, tc.kind, tc.eos, tc.late, tc.name)
		}
	}
	ps, err := ParseProcSpecs("floor,ours,ours:eos")
	if err != nil || len(ps) != 3 || ps[0].Kind != "floor" || ps[2].Name != "ours:eos" {
		t.Errorf("ParseProcSpecs(floor,ours,ours:eos) = %+v, %v", ps, err)
	}
}

func TestFloorCommand(t *testing.T) {
	e := procEnv{Brokers: "127.0.0.1:9", Self: "/bin/velocity-bench"}
	cmd, err := e.command(ProcSpec{Kind: "floor", Name: "floor"}, "in", "out", "dlq", "grp", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(cmd.Args, " ")
	want := "/bin/velocity-bench floor-proc --brokers 127.0.0.1:9 --group grp --input-topic in --output-topic out"
	if cmd.Path != "/bin/velocity-bench" || got != want {
		t.Errorf("floor command = %s %q, want %q", cmd.Path, got, want)
	}
}

func TestFloorValuesAreDistinctFeaturesRecords(t *testing.T) {
	vals, err := floorValues("vb-abc-1-input-in", 64)
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 64 {
		t.Fatalf("%d values, want 64", len(vals))
	}
	seen := map[string]bool{}
	total := 0
	for i, v := range vals {
		f, err := codec.DecodeFeatures(v)
		if err != nil {
			t.Fatalf("value %d does not decode as features: %v", i, err)
		}
		if len(f.Windows) != 4 || f.SourceTopic != "vb-abc-1-input-in" || len(f.EventID) != 36 || !strings.HasPrefix(f.EntityID, "card-") {
			t.Errorf("value %d is not shaped like our features: %+v", i, f)
		}
		if seen[string(v)] {
			t.Errorf("value %d repeats an earlier one: the pool would compress better than ours", i)
		}
		seen[string(v)] = true
		total += len(v)
	}
	// 36 + 12 byte ids, the topic, 4 windows of 7 fields: about 150-250 bytes.
	if mean := total / len(vals); mean < 120 || mean > 300 {
		t.Errorf("mean value size %d bytes, want a features record's (120..300)", mean)
	}
	again, _ := floorValues("vb-abc-1-input-in", 64)
	for i := range vals {
		if !bytes.Equal(vals[i], again[i]) {
			t.Fatalf("value %d differs between two pools: the floor must be the same in every run", i)
		}
	}
}

func TestReportFloorColumns(t *testing.T) {
	runs := []Result{
		{Round: 1, Mode: "throughput", Processor: "floor", Entities: 10, EventsPerSec: 400, CPUSecPerMEvt: 2},
		{Round: 1, Mode: "throughput", Processor: "ours", Entities: 10, EventsPerSec: 200, CPUSecPerMEvt: 6},
		{Round: 1, Mode: "throughput", Processor: "ours:eos", Entities: 10, EventsPerSec: 100, CPUSecPerMEvt: 8},
		{Round: 2, Mode: "throughput", Processor: "floor", Entities: 10, EventsPerSec: 500, CPUSecPerMEvt: 2},
		{Round: 2, Mode: "throughput", Processor: "ours", Entities: 10, EventsPerSec: 400, CPUSecPerMEvt: 5},
		{Round: 2, Mode: "throughput", Processor: "ours:eos", Entities: 10, Err: "boom"},
	}
	rep := Report(runs)
	row := func(proc string) []string {
		for _, line := range strings.Split(rep, "\n") {
			if strings.HasPrefix(line, "| "+proc+" |") {
				f := strings.Split(line, "|")
				for i := range f {
					f[i] = strings.TrimSpace(f[i])
				}
				return f[1 : len(f)-1]
			}
		}
		t.Fatalf("no row for %s in\n%s", proc, rep)
		return nil
	}
	if !strings.Contains(rep, "| ours/floor events/s | ours/floor CPU |") {
		t.Fatalf("no floor columns in\n%s", rep)
	}
	for _, tc := range []struct {
		proc      string
		cols      int
		evs, cpu  string // ours/floor columns, the last two
		peerRatio string // ours/peer events/s
	}{
		// Round 1: 200/400 = 0.5, round 2: 400/500 = 0.8 → 0.65; CPU 3 and 2.5 → 2.75.
		{proc: "ours", cols: 14, evs: "0.65", cpu: "2.75", peerRatio: "—"},
		// Only round 1 succeeded: 100/400, 8/2.
		{proc: "ours:eos", cols: 14, evs: "0.25", cpu: "4.00", peerRatio: "—"},
		// The floor is the ceiling, not a peer: no ratios on its own row.
		{proc: "floor", cols: 14, evs: "—", cpu: "—", peerRatio: "—"},
	} {
		f := row(tc.proc)
		if len(f) != tc.cols {
			t.Errorf("%s: %d columns, want %d: %q", tc.proc, len(f), tc.cols, f)
			continue
		}
		if f[12] != tc.evs || f[13] != tc.cpu || f[9] != tc.peerRatio {
			t.Errorf("%s: ours/floor %s, %s and ours/peer %s; want %s, %s and %s", tc.proc, f[12], f[13], f[9], tc.evs, tc.cpu, tc.peerRatio)
		}
	}
	// Without a floor the table keeps its old shape.
	if strings.Contains(Report(runs[1:2]), "ours/floor") {
		t.Error("floor columns without a floor run")
	}
}
