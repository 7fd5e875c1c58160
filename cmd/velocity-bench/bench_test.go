package main

import (
	"bytes"
	"maps"
	"math"
	"strings"
	"testing"
	"time"
)

func TestGeneratorIsDeterministicAndShaped(t *testing.T) {
	w := DefaultWorkload(100_000, 200_000)
	a, err := NewGenerator(w)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewGenerator(w)
	counts := map[uint32]int{}
	disordered := 0
	for i := 0; ; i++ {
		ea, oka := a.Next()
		eb, okb := b.Next()
		if oka != okb || ea != eb {
			t.Fatalf("event %d differs between two generators of one workload: %+v vs %+v", i, ea, eb)
		}
		if !oka {
			if i != w.Events {
				t.Fatalf("generator stopped after %d events, want %d", i, w.Events)
			}
			break
		}
		if ea.Entity >= uint32(w.Entities) || ea.AmountMin < 1 || ea.AmountMin > 1e9 {
			t.Fatalf("event %d out of range: %+v", i, ea)
		}
		if ea.DisorderMs < 0 || ea.DisorderMs > w.MaxDisorderMs {
			t.Fatalf("event %d disorder %d ms outside [0, %d]", i, ea.DisorderMs, w.MaxDisorderMs)
		}
		if ea.DisorderMs > 0 {
			disordered++
		}
		counts[ea.Entity]++
	}
	// 1 % out of order: 2000 expected, binomial sd ≈ 45.
	if disordered < 1700 || disordered > 2300 {
		t.Errorf("%d of %d events out of order, want about 1 %%", disordered, w.Events)
	}
	top := 0
	for _, c := range counts {
		top = max(top, c)
	}
	// Zipf(s=1.1, v=10) over 100 000: the hottest entity gets about 1.7 %, and the
	// stream touches far fewer than all entities.
	if share := float64(top) / float64(w.Events); share < 0.01 || share > 0.03 {
		t.Errorf("hottest entity has %.3f of events, want about 0.017", share)
	}
	if len(counts) > 90_000 || len(counts) < 10_000 {
		t.Errorf("%d distinct entities in %d events, want a skewed subset of 100 000", len(counts), w.Events)
	}
}

func TestWorkloadValidate(t *testing.T) {
	for name, w := range map[string]Workload{
		"no events":       {Events: 0, Entities: 10, ZipfS: 1.1, ZipfV: 1},
		"one entity":      {Events: 1, Entities: 1, ZipfS: 1.1, ZipfV: 1},
		"zipf s=1":        {Events: 1, Entities: 10, ZipfS: 1, ZipfV: 1},
		"disorder no max": {Events: 1, Entities: 10, ZipfS: 1.1, ZipfV: 1, OutOfOrder: 0.1},
	} {
		if err := w.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, w)
		}
	}
	if err := DefaultWorkload(1_000_000, 1).Validate(); err != nil {
		t.Errorf("default workload rejected: %v", err)
	}
}

func TestAppendEntityIDMatchesEntityID(t *testing.T) {
	for _, n := range []uint32{0, 7, 42, 999_999, 1_000_000, 12_345_678} {
		if got, want := string(appendEntityID(nil, n)), EntityID(n); got != want {
			t.Errorf("appendEntityID(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSeqRoundTrip(t *testing.T) {
	w := DefaultWorkload(1000, 5000)
	var buf bytes.Buffer
	if err := WriteSeq(&buf, w); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.Len(), 16+w.Events*seqRecordSize; got != want {
		t.Fatalf("sequence file is %d bytes, want %d", got, want)
	}
	evs, err := ReadSeq(&buf)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := NewGenerator(w)
	for i, se := range evs {
		ev, _ := g.Next()
		if se.Entity != ev.Entity || se.Amount != ev.AmountMin || se.T != w.EventTime(i, ev.DisorderMs) {
			t.Fatalf("event %d: file has %+v, generator %+v", i, se, ev)
		}
	}
	if _, err := ReadSeq(bytes.NewReader([]byte("not a sequence file"))); err == nil {
		t.Error("ReadSeq accepted a file without the magic")
	}
}

func TestPercentileNearestRank(t *testing.T) {
	s := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 5}, {0.99, 10}, {0.999, 10}, {0.1, 1}, {0, 1}, {1, 10}} {
		if got := Percentile(s, c.q); got != c.want {
			t.Errorf("Percentile(1..10, %g) = %g, want %g", c.q, got, c.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 0.5)) {
		t.Error("Percentile of an empty sample should be NaN")
	}
}

func TestMedianSkipsNaN(t *testing.T) {
	if got := Median([]float64{3, math.NaN(), 1, 2}); got != 2 {
		t.Errorf("Median = %g, want 2", got)
	}
	if got := Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("Median of an even count = %g, want 2.5", got)
	}
	if !math.IsNaN(Median([]float64{math.NaN()})) {
		t.Error("Median of only NaNs should be NaN")
	}
}

func TestOffsetSetCountsUniqueAndDuplicates(t *testing.T) {
	s := newOffsetSet()
	for _, o := range []int64{0, 1, 63, 64, 1000, 1} {
		s.Add(0, o)
	}
	s.Add(3, 1)
	s.Add(3, -1)
	if s.count != 6 || s.dups != 2 {
		t.Errorf("count=%d dups=%d, want 6 and 2", s.count, s.dups)
	}
}

func TestParseProcSpec(t *testing.T) {
	p, err := ParseProcSpec("ours:eos:late=2s")
	if err != nil || p.Kind != "ours" || !p.EOS || p.Lateness != 2*time.Second {
		t.Errorf("ours:eos:late=2s → %+v, %v", p, err)
	}
	if p, err := ParseProcSpec("ours:bin=new:eos"); err != nil || p.Bin != "new" || !p.EOS {
		t.Errorf("ours:bin=new:eos → %+v, %v", p, err)
	}
	for _, bad := range []string{"flink", "kstreams:late=1s", "ours:late=-1s", "ours:fast", "ours:bin=", "kstreams:bin=x", "floor:bin=x"} {
		if _, err := ParseProcSpec(bad); err == nil {
			t.Errorf("ParseProcSpec(%q) accepted", bad)
		}
	}
}

func TestParseVCAlt(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
		ok   bool
	}{
		{"", map[string]string{}, true},
		{"old=/tmp/a,new=/tmp/b", map[string]string{"old": "/tmp/a", "new": "/tmp/b"}, true},
		{"old", nil, false},
		{"=/tmp/a", nil, false},
		{"old=", nil, false},
		{"a=/x,a=/y", nil, false},
	} {
		got, err := parseVCAlt(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parseVCAlt(%q) error %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if tc.ok && !maps.Equal(got, tc.want) {
			t.Errorf("parseVCAlt(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestRatioPairsWithinARound(t *testing.T) {
	runs := []Result{
		{Round: 1, Mode: "throughput", Processor: "ours", Entities: 10, EventsPerSec: 300},
		{Round: 1, Mode: "throughput", Processor: "kstreams", Entities: 10, EventsPerSec: 100},
		{Round: 2, Mode: "throughput", Processor: "ours", Entities: 10, EventsPerSec: 100},
		{Round: 2, Mode: "throughput", Processor: "kstreams", Entities: 10, EventsPerSec: 50},
		{Round: 3, Mode: "throughput", Processor: "ours", Entities: 10, EventsPerSec: 999}, // no peer: left out
	}
	got := ratio(runs, "throughput", "ours", "kstreams", 10, 0, func(r Result) float64 { return r.EventsPerSec })
	if got != 2.5 {
		t.Errorf("ratio = %g, want median(3, 2) = 2.5", got)
	}
	if refFor("kstreams:eos", []string{"ours", "ours:eos", "kstreams:eos"}) != "ours:eos" {
		t.Error("an exactly-once peer should be compared with our exactly-once run")
	}
}

func TestCheckLoopback(t *testing.T) {
	if err := checkLoopback([]string{"127.0.0.1:9092", "localhost:9093", "[::1]:9092"}); err != nil {
		t.Error(err)
	}
	if err := checkLoopback([]string{"10.0.0.5:9092"}); err == nil {
		t.Error("a non-loopback broker was accepted")
	}
}

// FuzzProcSpecAndVCAlt: the parsers of --processors and --vc-alt never panic, and
// what they accept is what was written: a spec keeps its text as its name and a
// bin= option names a non-empty build; every --vc-alt pair comes back by its name.
func FuzzProcSpecAndVCAlt(f *testing.F) {
	for _, s := range []string{"ours", "ours:eos:late=2s", "ours:bin=new", "floor", "kstreams:eos", "ours:bin=", "a=/x,b=/y", "=", ",,", "ours:late=1h:bin=x:eos"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := ParseProcSpec(s); err == nil {
			if p.Name != strings.TrimSpace(s) {
				t.Fatalf("ParseProcSpec(%q): name %q", s, p.Name)
			}
			if strings.Contains(s, "bin=") && p.Kind == "ours" && p.Bin == "" {
				t.Fatalf("ParseProcSpec(%q) accepted an empty build name", s)
			}
			if p.Kind != "ours" && p.Bin != "" {
				t.Fatalf("ParseProcSpec(%q): a %s with a build", s, p.Kind)
			}
		}
		if m, err := parseVCAlt(s); err == nil {
			for _, f := range splitList(s) {
				name, path, _ := strings.Cut(f, "=")
				if m[name] != path {
					t.Fatalf("parseVCAlt(%q)[%q] = %q, want %q", s, name, m[name], path)
				}
			}
		}
	})
}
