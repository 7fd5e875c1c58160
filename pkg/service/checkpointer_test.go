package service

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/internal/kfaketest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
)

// TestWarmUpReadsThroughAFetchStall: the broker stops answering fetches for
// longer than one poll in the middle of a warm-up read. The read must wait
// and deliver every record up to the committed offset; it used to take the
// first empty poll for the end and rebuild a short state.
func TestWarmUpReadsThroughAFetchStall(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, inTopic, outTopic, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	st := streamtest.Generate(inTopic, 3, 3000, 1)
	for i := 0; i < len(st.Records); i += 100 { // one batch each
		produce(t, brokers, st.Records[i:min(i+100, len(st.Records))])
	}

	var fetches atomic.Int32
	c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if fetches.Add(1) == 2 {
			time.Sleep(5 * time.Second) // longer than a poll of the old read (3 s)
		}
		return nil, nil, false
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	s := &Service{cfg: cfg, log: zaptest.NewLogger(t), m: metrics.New(prometheus.NewRegistry()), adm: kadm.NewClient(cl)}
	// Small fetches, so that the read takes several and the stall falls
	// inside it.
	s.cfg.ClientOpts = []kgo.Opt{kgo.FetchMaxBytes(2 << 10), kgo.FetchMaxPartitionBytes(2 << 10)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	to := int64(len(st.Records))
	var n int64
	if err := s.readRange(ctx, 0, 0, to, func(r *kgo.Record) { n++ }); err != nil {
		t.Fatalf("readRange: %v", err)
	}
	if n != to {
		t.Fatalf("warm-up read %d records of %d: it stopped at the stall", n, to)
	}
	if fetches.Load() < 3 {
		t.Fatalf("only %d fetches: the stall did not fall inside the read", fetches.Load())
	}
}

// TestWarmUpFailsWhenTheRangeNeverArrives: a read that can make no progress
// fails with errWarmUpStalled (which a takeover retries), never succeeds short.
func TestWarmUpFailsWhenTheRangeNeverArrives(t *testing.T) {
	brokers := newCluster(t, 1)
	st := streamtest.Generate(inTopic, 4, 50, 1)
	produce(t, brokers, st.Records)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	old := warmUpStall
	warmUpStall = 2 * time.Second
	t.Cleanup(func() { warmUpStall = old })
	s := &Service{cfg: testConfig(t, brokers, checkpoint.NewMemoryStore()), log: zaptest.NewLogger(t), m: metrics.New(prometheus.NewRegistry()), adm: kadm.NewClient(cl)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Offsets beyond the log's end stand for a range the broker never serves.
	err = s.readRange(ctx, 0, 0, int64(len(st.Records))+10, func(*kgo.Record) {})
	if err == nil || !mayPass(err) || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("readRange of a range that never arrives = %v; want errWarmUpStalled, which may pass", err)
	}
}

// TestHealthAndReadiness: /healthz follows the partitions' progress and
// /readyz the takeovers in progress, not just the fatal error.
func TestHealthAndReadiness(t *testing.T) {
	s := &Service{workers: map[int32]*worker{}, m: metrics.New(prometheus.NewRegistry())}
	s.ready.Store(true)
	if err := s.Healthy(); err != nil || !s.Ready() {
		t.Fatalf("no partitions: healthy %v ready %v; want healthy and ready", err, s.Ready())
	}
	w := &worker{part: 3}
	w.progress.Store(time.Now().UnixNano())
	s.workers[3] = w
	if err := s.Healthy(); err != nil {
		t.Fatalf("a partition that just made progress: %v", err)
	}
	w.progress.Store(time.Now().Add(-healthStallAfter - time.Second).UnixNano())
	if err := s.Healthy(); err == nil || !strings.Contains(err.Error(), "partition 3") || s.Ready() {
		t.Fatalf("a partition stuck for longer than %s: healthy = %v, ready %v; want an error naming it, not ready", healthStallAfter, err, s.Ready())
	}
	w.progress.Store(time.Now().UnixNano())
	s.restoring.Add(1)
	if s.Healthy() != nil || s.Ready() {
		t.Fatalf("during a takeover: healthy %v ready %v; want healthy, not ready", s.Healthy(), s.Ready())
	}
	s.restoring.Add(-1)
	if !s.Ready() {
		t.Fatal("after the takeover: not ready")
	}
}

// TestFailedCommitIsRetried: the group refuses every offset commit while a
// partition processes its input and checkpoints; then the input goes quiet and
// commits are accepted again. The snapshot is durable, so the committed offset
// must catch up with it at the next interval with no new input, and the
// service must not count the refused commits as anything but commit errors.
// The checkpoint used to skip a partition whose offset had not moved, so the
// group's offset stayed behind the durable state until new input arrived, and
// a handover meanwhile made the next owner re-read and republish.
func TestFailedCommitIsRetried(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, inTopic, outTopic, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	var refuse atomic.Bool
	refuse.Store(true)
	var refused atomic.Int32
	kfaketest.RefuseOffsetCommits(c, kerr.OffsetMetadataTooLarge.Code, func(*kmsg.OffsetCommitRequest) bool {
		if !refuse.Load() {
			return false
		}
		refused.Add(1)
		return true
	})
	store := checkpoint.NewMemoryStore()
	cfg := testConfig(t, brokers, store)
	svc, stop := startService(t, cfg)
	st := streamtest.Generate(inTopic, 5, 1500, 1)
	produce(t, brokers, st.Records)
	readOutputs(t, brokers, len(st.Records), 30*time.Second)
	key := checkpoint.Key{Group: cfg.Group, Topic: inTopic, Partition: 0}
	end := int64(len(st.Records))
	waitFor(t, "a snapshot of the whole input", 30*time.Second, func() bool {
		l, err := store.Load(context.Background(), key)
		return err == nil && l.Next == end
	})
	waitFor(t, "a refused commit", 10*time.Second, func() bool { return refused.Load() > 0 })
	refuse.Store(false)

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	committed := func() int64 {
		resp, err := adm.FetchOffsetsForTopics(context.Background(), cfg.Group, inTopic)
		if err != nil {
			return -1
		}
		o, ok := resp.Lookup(inTopic, 0)
		if !ok {
			return -1
		}
		return o.At
	}
	waitFor(t, "the committed offset to catch up with the durable snapshot, with no new input", 10*time.Second, func() bool {
		return committed() == end
	})
	if err := svc.Healthy(); err != nil {
		t.Fatalf("refused commits stopped the service: %v", err)
	}
	stop()
}
