package main

import (
	"math"
	"strings"
	"testing"
)

const scrape = `# HELP velocity_added_latency_seconds x
# TYPE velocity_added_latency_seconds histogram
velocity_added_latency_seconds_bucket{le="0.001"} 50
velocity_added_latency_seconds_bucket{le="0.002"} 90
velocity_added_latency_seconds_bucket{le="0.005"} 100
velocity_added_latency_seconds_bucket{le="+Inf"} 100
velocity_added_latency_seconds_sum 0.1
velocity_added_latency_seconds_count 100
velocity_other_bucket{le="1"} 7
`

func TestParseHistogramAndQuantiles(t *testing.T) {
	h, err := parseHistogram(strings.NewReader(scrape), addedLatencyMetric)
	if err != nil {
		t.Fatal(err)
	}
	if h.count() != 100 || len(h.le) != 4 || !math.IsInf(h.le[3], 1) {
		t.Fatalf("parsed %+v", h)
	}
	for _, tc := range []struct{ q, want float64 }{
		{0.25, 0.0005}, // half way through the first bucket, from 0
		{0.5, 0.001},
		{0.7, 0.0015}, // half way through the second
		{0.95, 0.0035},
		{1, 0.005},
	} {
		if got := h.quantile(tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	earlier, _ := parseHistogram(strings.NewReader(strings.NewReplacer(`} 50`, `} 40`, `} 90`, `} 40`, `} 100`, `} 40`).Replace(scrape)), addedLatencyMetric)
	d, err := h.since(earlier)
	if err != nil {
		t.Fatal(err)
	}
	// Between the scrapes: 10 in the first bucket, 40 in the second, 10 in the third.
	if d.count() != 60 || d.cum[0] != 10 || d.cum[1] != 50 {
		t.Fatalf("delta %+v", d)
	}
	if got := d.quantile(0.5); math.Abs(got-0.0015) > 1e-12 {
		t.Errorf("delta median = %v, want 0.0015", got)
	}
	if _, err := parseHistogram(strings.NewReader("velocity_other_bucket{le=\"1\"} 7\n"), addedLatencyMetric); err == nil {
		t.Error("a scrape without the histogram parsed")
	}
	if _, err := parseHistogram(strings.NewReader(`velocity_added_latency_seconds_bucket{le="x"} 1`+"\n"), addedLatencyMetric); err == nil {
		t.Error("a bad bound parsed")
	}
	if !math.IsNaN((histogram{}).quantile(0.5)) {
		t.Error("an empty histogram has a quantile")
	}
	inf, _ := parseHistogram(strings.NewReader(`velocity_added_latency_seconds_bucket{le="0.001"} 0
velocity_added_latency_seconds_bucket{le="+Inf"} 5
`), addedLatencyMetric)
	if got := inf.quantile(0.99); got != 0.001 {
		t.Errorf("a quantile in the +Inf bucket = %v, want the largest finite bound", got)
	}
}
