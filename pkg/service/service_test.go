package service

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/internal/oracle"
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

var base = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// stream is a generated input: records per partition and the oracle's view.
type stream struct {
	byPart map[int32][]oracle.Event
	recs   []*kgo.Record
}

// makeStream generates n transactions over a few entities, with jitter, late
// events, resends and invalid records. Entities are pinned to partitions the
// way a keyed producer would pin them.
func makeStream(seed uint64, n, partitions int) stream {
	rng := rand.New(rand.NewPCG(seed, 3))
	s := stream{byPart: map[int32][]oracle.Event{}}
	now := base
	type sentID struct {
		part int32
		id   string
	}
	var sent []sentID
	for i := range n {
		now += rng.Int64N(300)
		entity := fmt.Sprintf("card-%d", rng.IntN(40))
		part := int32(len(entity)+int(entity[len(entity)-1])) % int32(partitions)
		tx := codec.Transaction{EventID: fmt.Sprintf("id-%d", i), EntityID: entity, AmountMinor: rng.Int64N(50_000), Currency: "EUR", EventTime: now}
		var invalid codec.Reason
		switch r := rng.Float64(); {
		case r < 0.03:
			tx.EventTime -= 5_000 + rng.Int64N(20_000) // late
		case r < 0.05 && len(sent) > 0:
			if prev := sent[rng.IntN(len(sent))]; prev.part == part {
				tx.EventID = prev.id // a resend of an earlier id on the same partition
			}
		case r < 0.06:
			tx.AmountMinor = -1
			invalid = codec.Invalid("amount_minor")
		}
		rec := &kgo.Record{Topic: inTopic, Partition: part, Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}
		s.recs = append(s.recs, rec)
		sent = append(sent, sentID{part, tx.EventID})
		off := int64(len(s.byPart[part]))
		s.byPart[part] = append(s.byPart[part], oracle.Event{Offset: off, Time: tx.EventTime, Amount: tx.AmountMinor, ID: tx.EventID, Entity: entity, Invalid: invalid})
	}
	return s
}

func newCluster(t *testing.T, partitions int) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), inTopic, outTopic, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
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

type src struct {
	p   int32
	off int64
}

// output is one record read back from the output or dead-letter topic.
type output struct {
	dead   bool
	reason string
	value  []byte
}

// readOutputs reads both output topics until every one of want source offsets
// is accounted for or the deadline passes.
func readOutputs(t *testing.T, brokers []string, want int, deadline time.Duration) map[src][]output {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(outTopic, dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[src][]output{}
	end := time.Now().Add(deadline)
	for len(got) < want && time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			var s src
			o := output{value: r.Value}
			if r.Topic == outTopic {
				f, err := codec.DecodeFeatures(r.Value)
				if err != nil {
					t.Errorf("undecodable features record: %v", err)
					return
				}
				if string(r.Key) != f.EntityID {
					t.Errorf("features key %q for entity %q", r.Key, f.EntityID)
				}
				s = src{f.SourcePartition, f.SourceOffset}
			} else {
				o.dead = true
				h := map[string]string{}
				for _, kv := range r.Headers {
					h[kv.Key] = string(kv.Value)
				}
				p, _ := strconv.Atoi(h[codec.HeaderSourcePartition])
				off, _ := strconv.ParseInt(h[codec.HeaderSourceOffset], 10, 64)
				s = src{int32(p), off}
				o.reason = h[codec.HeaderReason]
				if h[codec.HeaderSourceTopic] != inTopic || h[codec.HeaderError] == "" {
					t.Errorf("dead letter headers incomplete: %v", h)
				}
			}
			got[s] = append(got[s], o)
		})
	}
	return got
}

// check compares outputs with the oracle: every offset accounted for, each
// output right, and any repeated output byte-identical to the first.
func check(t *testing.T, st stream, specs []window.Spec, got map[src][]output, exactlyOnce bool) {
	t.Helper()
	total := 0
	for p, evs := range st.byPart {
		total += len(evs)
		want := oracle.Compute(oracle.Config{Specs: specs, Topic: inTopic, Partition: p}, evs)
		for off, w := range want {
			outs := got[src{p, off}]
			if len(outs) == 0 {
				t.Fatalf("partition %d offset %d: no output (accounting invariant broken)", p, off)
			}
			if exactlyOnce && len(outs) != 1 {
				t.Fatalf("partition %d offset %d: %d outputs", p, off, len(outs))
			}
			for _, o := range outs[1:] {
				if !bytes.Equal(o.value, outs[0].value) || o.dead != outs[0].dead {
					t.Fatalf("partition %d offset %d: repeated output differs", p, off)
				}
			}
			o := outs[0]
			if o.dead != w.Dead || o.reason != string(w.Reason) {
				t.Fatalf("partition %d offset %d: dead=%v %q, want dead=%v %q", p, off, o.dead, o.reason, w.Dead, w.Reason)
			}
			if !w.Dead {
				if wantBytes := codec.AppendFeatures(nil, &w.Features); !bytes.Equal(o.value, wantBytes) {
					f, _ := codec.DecodeFeatures(o.value)
					t.Fatalf("partition %d offset %d:\n got  %+v\n want %+v", p, off, f, w.Features)
				}
			}
		}
	}
	if len(got) != total {
		t.Fatalf("%d source offsets have output, %d were produced", len(got), total)
	}
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
	st := makeStream(1, 3000, partitions)
	produce(t, brokers, st.recs)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	startService(t, cfg)
	got := readOutputs(t, brokers, len(st.recs), 60*time.Second)
	check(t, st, cfg.Specs, got, true)
}

// TestServiceRebalance runs two members of one group: the second joins halfway
// and takes partitions over through the shared checkpoint store, then the
// first leaves. Outputs must still match the oracle, with any repeat identical.
func TestServiceRebalance(t *testing.T) {
	const partitions = 4
	brokers := newCluster(t, partitions)
	st := makeStream(2, 4000, partitions)
	store := checkpoint.NewMemoryStore()
	cfgA := testConfig(t, brokers, store)
	cfgA.Host = "a"
	cfgB := cfgA
	cfgB.Host = "b"

	a, stopA := startService(t, cfgA)
	produce(t, brokers, st.recs[:2000])
	waitFor(t, "a to own all partitions", 20*time.Second, func() bool { return a.numWorkers() == partitions })
	b, _ := startService(t, cfgB)
	// Cooperative-sticky: b takes some partitions while a keeps the others.
	waitFor(t, "b to take partitions from a", 30*time.Second, func() bool { return b.numWorkers() > 0 && a.numWorkers() < partitions })
	produce(t, brokers, st.recs[2000:3000])
	time.Sleep(300 * time.Millisecond)
	stopA()
	waitFor(t, "b to own all partitions", 30*time.Second, func() bool { return b.numWorkers() == partitions })
	produce(t, brokers, st.recs[3000:])
	got := readOutputs(t, brokers, len(st.recs), 60*time.Second)
	check(t, st, cfgA.Specs, got, false)
}

// TestServiceRestartResumesFromSnapshot stops the service gracefully halfway
// and starts a new one on the same file store: nothing is lost or recounted.
func TestServiceRestartResumesFromSnapshot(t *testing.T) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := makeStream(3, 2000, partitions)
	store, err := checkpoint.NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, brokers, store)
	produce(t, brokers, st.recs[:1000])
	_, stop := startService(t, cfg)
	readOutputs(t, brokers, 1000, 30*time.Second)
	stop()
	produce(t, brokers, st.recs[1000:])
	startService(t, cfg)
	got := readOutputs(t, brokers, len(st.recs), 60*time.Second)
	check(t, st, cfg.Specs, got, true)
}
