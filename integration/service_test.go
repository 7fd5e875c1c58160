//go:build integration

package integration

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// liveTopics creates the input, output and dead-letter topics of one test.
func liveTopics(t *testing.T, addr string, partitions int32) (in, out, dlq string) {
	t.Helper()
	return kafkatest.CreateTopic(t, addr, partitions, nil),
		kafkatest.CreateTopic(t, addr, partitions, nil),
		kafkatest.CreateTopic(t, addr, partitions, nil)
}

func liveConfig(t *testing.T, addr, in, out, dlq string, store checkpoint.Store) service.Config {
	t.Helper()
	specs, err := window.ParseSpecs("10s:1s,1m:10s,1h:1m")
	if err != nil {
		t.Fatal(err)
	}
	return service.Config{
		Brokers: kafkatest.Seeds(addr), Group: kafkatest.Group(t),
		InputTopic: in, OutputTopic: out, DLQTopic: dlq,
		Specs: specs, Limits: codec.DefaultLimits(),
		// Lateness 0 and no idle release: the outputs are a function of the
		// input alone, so the oracle can predict every byte.
		Watermark:          watermark.Config{AllowedLateness: 0},
		Store:              store,
		CheckpointInterval: 300 * time.Millisecond,
		SessionTimeout:     10 * time.Second,
		Host:               t.Name(),
		ClientOpts:         []kgo.Opt{kgo.DialTimeout(5 * time.Second)},
	}
}

// runService starts the service and returns a stop function that waits for a
// graceful shutdown (checkpoint, commit, leave) and fails the test on error.
func runService(t *testing.T, cfg service.Config, name string) (svc *service.Service, stop func()) {
	t.Helper()
	svc, err := service.New(cfg, zaptest.NewLogger(t).Named(name), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("service %s: %v", name, err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("service %s did not shut down within 60s", name)
		}
	}
	t.Cleanup(stop)
	return svc, stop
}

func produceAll(t *testing.T, addr string, recs []*kgo.Record) {
	t.Helper()
	cl := kafkatest.Client(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := kafkatest.Produce(kafkatest.Context(t, 60*time.Second), cl, recs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func setTopic(recs []*kgo.Record, topic string) {
	for _, r := range recs {
		r.Topic = topic
	}
}

// TestLiveServiceMatchesOracle runs the live service on the real broker over
// four partitions and checks every features record and dead letter against the
// oracle, and that each input offset has exactly one output.
func TestLiveServiceMatchesOracle(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	const partitions = 4
	in, out, dlq := liveTopics(t, addr, partitions)
	st := streamtest.Generate(in, 21, 8000, partitions)
	produceAll(t, addr, st.Records)

	cfg := liveConfig(t, addr, in, out, dlq, checkpoint.NewMemoryStore())
	runService(t, cfg, "live")
	got := streamtest.ReadOutputs(t, in, out, dlq, len(st.Records), 90*time.Second, kgo.SeedBrokers(kafkatest.Seeds(addr)...))
	streamtest.Check(t, st, cfg.Specs, got, true)
}

// TestLiveServiceRebalanceKafkaStore runs two members of one group with the
// kafka checkpoint store: the second joins mid-stream and takes partitions
// over from snapshots in the compacted topic, then the first leaves. Outputs
// must match the oracle; an offset may repeat only byte for byte.
func TestLiveServiceRebalanceKafkaStore(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	const partitions = 4
	in, out, dlq := liveTopics(t, addr, partitions)
	st := streamtest.Generate(in, 22, 8000, partitions)

	group := kafkatest.Group(t)
	openStore := func() checkpoint.Store {
		s, err := checkpoint.NewKafkaStore(context.Background(), checkpoint.KafkaConfig{
			Brokers: kafkatest.Seeds(addr), Topic: "__velocity-snapshots-" + group,
		})
		if err != nil {
			t.Fatalf("kafka store: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	cfgA := liveConfig(t, addr, in, out, dlq, openStore())
	cfgA.Group = group
	cfgB := cfgA
	cfgB.Store = openStore() // another instance: its own store client, same topic

	a, stopA := runService(t, cfgA, "a")
	produceAll(t, addr, st.Records[:3000])
	waitUntil(t, "a owns every partition", 60*time.Second, func() bool { return a.Ready() })
	b, _ := runService(t, cfgB, "b")
	waitUntil(t, "b takes partitions over", 60*time.Second, func() bool { return b.Ready() && b.Assigned() > 0 })
	produceAll(t, addr, st.Records[3000:6000])
	time.Sleep(time.Second)
	stopA()
	produceAll(t, addr, st.Records[6000:])
	waitUntil(t, "b owns every partition", 60*time.Second, func() bool { return b.Assigned() == partitions })

	got := streamtest.ReadOutputs(t, in, out, dlq, len(st.Records), 120*time.Second, kgo.SeedBrokers(kafkatest.Seeds(addr)...))
	streamtest.Check(t, st, cfgA.Specs, got, false)
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(timeout); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting until %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
