package service

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// TestInputTopicGrowsWhileRunning: a partition is added to the input topic of
// a running service. Nothing noticed it before; now:
//   - without re-keyed groups the new partition is consumed like the others
//     (every input offset keeps its output, equal to the oracle's), and the
//     service says what the growth means for the features, once, in an error
//     line and in velocity_input_partitions_added;
//   - a re-keyed group's first stage stops with an error that names the counts
//     and the way out: its second stages count the partitions of the start and
//     would refuse every hop record of the new one, as dead letters.
func TestInputTopicGrowsWhileRunning(t *testing.T) {
	for _, groups := range []bool{false, true} {
		name := "in place"
		if groups {
			name = "re-keyed groups"
		}
		t.Run(name, func(t *testing.T) {
			const before, after = 2, 4 // two added at once: one line, and the gauge at 2
			brokers := newCluster(t, before)
			st := streamtest.Generate(inTopic, 9, 1500, after) // partitions 2 and 3's records wait for the growth
			var old, added []*kgo.Record
			for _, r := range st.Records {
				if r.Partition < before {
					old = append(old, r)
				} else {
					added = append(added, r)
				}
			}
			cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
			// The consumer learns of the new partition at its next metadata refresh.
			cfg.ClientOpts = []kgo.Opt{kgo.MetadataMaxAge(time.Second), kgo.MetadataMinAge(100 * time.Millisecond)}
			if groups {
				comp, specs := compileGroups(t)
				cfg.Specs, cfg.Features, cfg.Decoder = slices.Clone(specs[0].Spec.Windows), specs[0].Spec, comp.Decoder()
				cfg.Hops = []pipeline.HopGroup{{Name: "cur", Topic: "__velocity-repartition-g-cur", Words: specs[1].Spec.Words()}}
			}
			core, logs := observer.New(zap.ErrorLevel)
			svc, err := New(cfg, zap.New(core), metrics.New(prometheus.NewRegistry()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- svc.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			produce(t, brokers, old)
			waitFor(t, "the service to take both partitions", 20*time.Second, func() bool { return svc.numWorkers() == before })
			adm := kadm.NewClient(newClient(t, brokers))
			actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer acancel()
			if _, err := adm.CreatePartitions(actx, after-before, inTopic); err != nil {
				t.Fatalf("add a partition to the input topic: %v", err)
			}

			if groups {
				select {
				case err := <-done:
					done <- err // for the cleanup
					if err == nil || !strings.Contains(err.Error(), "more partitions than the 2 it had at start") || !strings.Contains(err.Error(), "--group") {
						t.Fatalf("Run = %v, want an error naming the growth and the way out", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the first stage went on after its input topic grew")
				}
				return
			}
			produce(t, brokers, added)
			got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
			streamtest.Check(t, st, cfg.Specs, got, false)
			if err := svc.Healthy(); err != nil {
				t.Fatalf("service stopped: %v", err)
			}
			if n := testutil.ToFloat64(svc.m.InputPartitionsAdded); n != after-before {
				t.Errorf("velocity_input_partitions_added = %v, want %d", n, after-before)
			}
			if n := logs.FilterMessageSnippet("more partitions than at start").Len(); n != 1 {
				t.Errorf("%d error lines about the growth, want 1: %v", n, logs.All())
			}
		})
	}
}
