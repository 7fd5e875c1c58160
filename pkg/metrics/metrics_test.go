package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestNamesFollowConventions keeps the exported names honest: a velocity_
// prefix, _total on counters, a unit on histograms, and no entity label.
func TestNamesFollowConventions(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	// Touch every vector so it is gathered.
	m.RecordsIn.WithLabelValues("0").Inc()
	m.Features.WithLabelValues("0").Inc()
	m.DeadLetters.WithLabelValues("late").Inc()
	m.LateApplied.WithLabelValues("0").Inc()
	m.ReorderBuffer.WithLabelValues("0").Set(1)
	m.WatermarkLag.WithLabelValues("0").Set(1)
	m.Entities.WithLabelValues("0").Set(1)
	m.EntitiesEvicted.WithLabelValues("idle").Inc()
	m.CheckpointBytes.WithLabelValues("0").Set(1)
	m.ConsumerLag.WithLabelValues("0").Set(1)
	m.Latency.Observe(0.001)
	m.CheckpointSeconds.Observe(0.01)
	m.GroupKeyMissing.WithLabelValues("device").Inc()
	m.HopDuplicates.WithLabelValues("device").Inc()
	m.HopStaleIdle.WithLabelValues("device").Inc()
	m.GroupPartitions.WithLabelValues("device").Set(1)
	m.GroupRestoring.WithLabelValues("device").Set(0)
	m.GroupPaused.WithLabelValues("device").Set(0)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ours int
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "velocity_") {
			continue // Go and process collectors
		}
		ours++
		switch mf.GetType().String() {
		case "COUNTER":
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s lacks _total", name)
			}
		case "HISTOGRAM":
			if !strings.HasSuffix(name, "_seconds") {
				t.Errorf("histogram %s lacks a unit", name)
			}
		}
		for _, metric := range mf.GetMetric() {
			for _, l := range metric.GetLabel() {
				switch l.GetName() {
				// group: a definition's re-keyed groups, at most 8, named in it.
				case "partition", "reason", "cause", "group":
				default:
					t.Errorf("%s has label %q: labels must stay bounded", name, l.GetName())
				}
			}
		}
	}
	if ours < 24 {
		t.Errorf("gathered %d velocity_ metrics, want all 24", ours)
	}
}

func TestForgetPartition(t *testing.T) {
	m := New(prometheus.NewRegistry())
	m.ReorderBuffer.WithLabelValues("3").Set(5)
	m.ReorderBuffer.WithLabelValues("4").Set(6)
	m.ForgetPartition("3")
	if n := testutil.CollectAndCount(m.ReorderBuffer); n != 1 {
		t.Fatalf("%d reorder-buffer series after forgetting partition 3, want 1", n)
	}
}
