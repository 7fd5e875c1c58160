package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

const (
	inTopic, outTopic, dlqTopic = "tx", "features", "dlq"
	testSpecs                   = "10s:1s,1m:10s"
)

func newCluster(t *testing.T, partitions int) []string {
	t.Helper()
	return newFakeCluster(t, partitions).ListenAddrs()
}

// newFakeCluster is newCluster's cluster, for a test that controls its answers.
func newFakeCluster(t *testing.T, partitions int) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), inTopic, outTopic, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func produce(t *testing.T, brokers []string, recs []*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func testConfig(t *testing.T, brokers []string, store checkpoint.Store) Config {
	t.Helper()
	specs, err := window.ParseSpecs(testSpecs)
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Brokers: brokers, Group: "g", InputTopic: inTopic, OutputTopic: outTopic, DLQTopic: dlqTopic,
		Specs: specs, Limits: codec.DefaultLimits(),
		// Lateness 0 and no idle release: outputs depend only on the input, not
		// on when the wall clock ticked, so they can be compared with the oracle.
		Watermark:          watermark.Config{AllowedLateness: 0},
		Store:              store,
		CheckpointInterval: 200 * time.Millisecond,
		Host:               "test",
	}
}

func readOutputs(t *testing.T, brokers []string, want int, deadline time.Duration) map[streamtest.Source][]streamtest.Output {
	t.Helper()
	return streamtest.ReadOutputs(t, inTopic, outTopic, dlqTopic, want, deadline, kgo.SeedBrokers(brokers...))
}

func startService(t *testing.T, cfg Config) (svc *Service, stop func()) {
	t.Helper()
	svc, err := New(cfg, zaptest.NewLogger(t).Named(cfg.Host), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("service %s: %v", cfg.Host, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("service %s did not stop", cfg.Host)
			}
		})
	}
	t.Cleanup(stop)
	return svc, stop
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(timeout); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestServiceMatchesOracle(t *testing.T) {
	const partitions = 3
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 1, 3000, partitions)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	startService(t, cfg)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
}

// TestServiceRebalance runs two members of one group: the second joins halfway
// and takes partitions over through the shared checkpoint store, then the
// first leaves. Outputs must still match the oracle, with any repeat identical;
// in exactly-once mode read_committed must see no repeat at all.
func TestServiceRebalance(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) { testRebalance(t, eos) })
	}
}

func testRebalance(t *testing.T, eos bool) {
	const partitions = 4
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 2, 4000, partitions)
	store := checkpoint.NewMemoryStore()
	cfgA := testConfig(t, brokers, store)
	cfgA.Host, cfgA.ExactlyOnce = "a", eos
	cfgB := cfgA
	cfgB.Host = "b"

	a, stopA := startService(t, cfgA)
	produce(t, brokers, st.Records[:2000])
	waitFor(t, "a to own all partitions", 20*time.Second, func() bool { return a.numWorkers() == partitions })
	b, _ := startService(t, cfgB)
	// Cooperative-sticky: b takes some partitions while a keeps the others.
	waitFor(t, "b to take partitions from a", 30*time.Second, func() bool { return b.numWorkers() > 0 && a.numWorkers() < partitions })
	produce(t, brokers, st.Records[2000:3000])
	time.Sleep(300 * time.Millisecond)
	stopA()
	waitFor(t, "b to own all partitions", 30*time.Second, func() bool { return b.numWorkers() == partitions })
	produce(t, brokers, st.Records[3000:])
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfgA.Specs, got, eos)
}

// TestServiceRestartResumesFromSnapshot stops the service gracefully halfway
// and starts a new one on the same file store: nothing is lost or recounted,
// in either mode.
func TestServiceRestartResumesFromSnapshot(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) { testRestart(t, eos) })
	}
}

func testRestart(t *testing.T, eos bool) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 3, 2000, partitions)
	store, err := checkpoint.NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, brokers, store)
	cfg.ExactlyOnce = eos
	produce(t, brokers, st.Records[:1000])
	_, stop := startService(t, cfg)
	readOutputs(t, brokers, 1000, 30*time.Second)
	stop()
	produce(t, brokers, st.Records[1000:])
	startService(t, cfg)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
}

// TestServiceResumesFromTheSnapshotWhenTheGroupLostItsOffsets: the brokers
// delete an empty group's offsets after offsets.retention.minutes (modelled
// here by deleting the group while the service is stopped). The snapshots are
// still in the store, so the restarted service resumes from them in both modes:
// every input offset keeps exactly one output under read_committed, instead of
// a rebuild from the start of the log publishing the first half again.
func TestServiceResumesFromTheSnapshotWhenTheGroupLostItsOffsets(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) {
			const partitions = 2
			brokers := newCluster(t, partitions)
			st := streamtest.Generate(inTopic, 5, 2000, partitions)
			store, err := checkpoint.NewFileStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t, brokers, store)
			cfg.ExactlyOnce = eos
			// A group that ran a while: several checkpoints by one owner, the
			// state the brokers' expiry finds (checkpoint.CommittedBefore).
			_, stop := startService(t, cfg)
			for _, half := range [][]*kgo.Record{st.Records[:500], st.Records[500:1000]} {
				produce(t, brokers, half)
				time.Sleep(3 * cfg.CheckpointInterval)
			}
			readOutputs(t, brokers, 1000, 30*time.Second)
			stop()

			adm := kadm.NewClient(newClient(t, brokers))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := adm.DeleteGroup(ctx, cfg.Group); err != nil {
				t.Fatalf("delete the group: %v", err)
			}
			// The group and its offsets are gone: the fetch finds no group.
			if offsets, err := adm.FetchOffsets(ctx, cfg.Group); !errors.Is(err, kerr.GroupIDNotFound) && len(offsets.Sorted()) != 0 {
				t.Fatalf("the deleted group still has committed offsets: %v (%v)", offsets.Sorted(), err)
			}

			produce(t, brokers, st.Records[1000:])
			startService(t, cfg)
			got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
			streamtest.Check(t, st, cfg.Specs, got, true)
		})
	}
}

// TestServiceCreatesMissingOutputTopics starts on a cluster that has only the
// input topic: the output and dead-letter topics are created with the input's
// partition count, and the outputs arrive.
func TestServiceCreatesMissingOutputTopics(t *testing.T) {
	const partitions = 3
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, inTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	st := streamtest.Generate(inTopic, 4, 500, partitions)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	startService(t, cfg)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)

	adm := kadm.NewClient(newClient(t, brokers))
	md, err := adm.Metadata(context.Background(), outTopic, dlqTopic)
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{outTopic, dlqTopic} {
		if n := len(md.Topics[topic].Partitions); n != partitions {
			t.Errorf("%s created with %d partitions, want the input's %d", topic, n, partitions)
		}
	}
}

func newClient(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestConfigFetchDefaults pins the fetch batching defaults and the floor that
// franz-go would otherwise reject only when the client is created.
func TestConfigFetchDefaults(t *testing.T) {
	base := func() Config {
		return Config{Brokers: []string{"b:9092"}, Group: "g", InputTopic: "in", OutputTopic: "out", DLQTopic: "dlq", Store: checkpoint.NewMemoryStore()}
	}
	for _, tc := range []struct {
		name     string
		minBytes int32
		maxWait  time.Duration
		wantMin  int32
		wantWait time.Duration
		wantErr  bool
	}{
		{"zero values take the defaults", 0, 0, DefaultFetchMinBytes, DefaultFetchMaxWait, false},
		{"answer at once", 1, 5 * time.Second, 1, 5 * time.Second, false},
		{"the floor itself", 1 << 20, MinFetchMaxWait, 1 << 20, MinFetchMaxWait, false},
		{"below franz-go's floor", 1, 5 * time.Millisecond, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			c.FetchMinBytes, c.FetchMaxWait = tc.minBytes, tc.maxWait
			err := c.defaults()
			if tc.wantErr {
				if err == nil {
					t.Fatalf("fetch wait %v accepted", tc.maxWait)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.FetchMinBytes != tc.wantMin || c.FetchMaxWait != tc.wantWait {
				t.Fatalf("got %d bytes / %v, want %d / %v", c.FetchMinBytes, c.FetchMaxWait, tc.wantMin, tc.wantWait)
			}
		})
	}
}

// TestServiceBackpressureResumes bounds pending produce bytes at 1, so every
// batch pauses its partition until its outputs are acknowledged. A paused
// partition gets no more batches: it must still resume (the tick sees the
// acknowledgements and wakes the poll loop) and answer every record.
func TestServiceBackpressureResumes(t *testing.T) {
	const partitions = 3
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 5, 3000, partitions)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.MaxPendingProduceBytes = 1
	startService(t, cfg)
	// In steps, so that records arrive while partitions are paused.
	for i := 0; i < len(st.Records); i += 100 {
		produce(t, brokers, st.Records[i:i+100])
		time.Sleep(20 * time.Millisecond)
	}
	got := readOutputs(t, brokers, len(st.Records), 30*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
}

// TestServicePausedPartitionComesBackUnpaused: a partition paused when it is
// revoked stays paused inside franz-go. When the group hands it back, its new
// worker must fetch it again (it stayed paused for good, silently, before).
// The pause here is a decoder outage (records held, fetching paused), which
// lasts for as long as the test wants.
func TestServicePausedPartitionComesBackUnpaused(t *testing.T) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 4, 3000, partitions)
	fast, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	dec := &outageDecoder{Decoder: fast}
	store := checkpoint.NewMemoryStore()
	cfgA := testConfig(t, brokers, store)
	cfgA.Host, cfgA.Decoder = "a", dec
	cfgB := testConfig(t, brokers, store)
	cfgB.Host = "b"

	a, _ := startService(t, cfgA)
	produce(t, brokers, st.Records[:1000])
	readOutputs(t, brokers, 1000, 30*time.Second)
	dec.down.Store(true)
	produce(t, brokers, st.Records[1000:2000])
	waitFor(t, "a to pause both partitions", 20*time.Second, func() bool {
		return len(a.cons.PauseFetchPartitions(nil)[inTopic]) == partitions
	})

	b, stopB := startService(t, cfgB)
	waitFor(t, "b to take a partition", 30*time.Second, func() bool { return b.numWorkers() == 1 })
	dec.down.Store(false)
	readOutputs(t, brokers, 2000, 30*time.Second)
	stopB()
	waitFor(t, "a to own both partitions again", 30*time.Second, func() bool { return a.numWorkers() == partitions })

	produce(t, brokers, st.Records[2000:])
	got := readOutputs(t, brokers, len(st.Records), 30*time.Second)
	streamtest.Check(t, st, cfgA.Specs, got, false)
}

// TestServiceAssignmentBeforeSetUp: the group may assign partitions while Run
// is still setting up (franz-go joins inside kgo.NewClient). The assignment
// waits for the set-up instead of using a consumer that is not recorded yet.
func TestServiceAssignmentBeforeSetUp(t *testing.T) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 8, 400, partitions)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	svc, err := New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	// Long enough for the in-process broker to finish the join and the
	// offset fetch: the assignment arrives inside this window.
	svc.beforeSetUp = func() { time.Sleep(time.Second) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	got := readOutputs(t, brokers, len(st.Records), 30*time.Second)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	streamtest.Check(t, st, cfg.Specs, got, true)
}
