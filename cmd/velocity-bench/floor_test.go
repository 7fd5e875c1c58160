package main

import (
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

func TestFeaturesSizeIsAFeaturesRecord(t *testing.T) {
	n, err := featuresSize("vb-abc-1-input-in")
	if err != nil {
		t.Fatal(err)
	}
	// 4 default windows of 7 fields each, two ids, the topic: well over 100 bytes,
	// and an encoding of it must decode (the size is of a real record).
	if n < 100 || n > 400 {
		t.Errorf("featuresSize = %d, want a features record's size (100..400 bytes)", n)
	}
	longer, _ := featuresSize("vb-abc-1-input-in-longer")
	if longer != n+len("-longer") {
		t.Errorf("featuresSize grows by %d with a 7-byte longer topic, want 7", longer-n)
	}
	f, _ := typicalFeatures("vb-abc-1-input-in")
	got, err := codec.DecodeFeatures(codec.AppendFeatures(nil, &f))
	if err != nil || len(got.Windows) != 4 || got.SourceTopic != "vb-abc-1-input-in" {
		t.Errorf("the sized record does not decode as our features: %+v, %v", got, err)
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
