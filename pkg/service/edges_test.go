package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/velocity-consumer/velocity-consumer/internal/kfaketest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
)

// TestServiceWaitsForItsInputTopic: started before its input topic exists,
// the service is not ready and creates no output topic (it could only guess
// their partition count, and used to create them with one). Once the topic
// appears with 3 partitions, the outputs are created with 3 and the stream is
// processed. A stop while it waits ends Run without an error.
func TestServiceWaitsForItsInputTopic(t *testing.T) {
	defer func(d time.Duration) { inputTopicPoll = d }(inputTopicPoll)
	inputTopicPoll = 100 * time.Millisecond
	const partitions = 3
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	adm := kadm.NewClient(newClient(t, brokers))
	// partitionsOf is a topic's partition count, 0 if it does not exist. It
	// asks through a client of its own: franz-go answers a repeated metadata
	// request from its cache for a while.
	partitionsOf := func(topic string) int {
		t.Helper()
		md, err := kadm.NewClient(newClient(t, brokers)).Metadata(context.Background(), topic)
		if err != nil {
			t.Fatal(err)
		}
		td, ok := md.Topics[topic]
		if !ok || td.Err != nil {
			return 0
		}
		return len(td.Partitions)
	}

	t.Run("stop while waiting", func(t *testing.T) {
		cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
		cfg.Group = "g-stop"
		svc, err := New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if err := svc.Run(ctx); err != nil {
			t.Fatalf("Run stopped while waiting for its input topic: %v, want nil", err)
		}
	})

	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	svc, _ := startService(t, cfg)
	time.Sleep(5 * inputTopicPoll)
	if svc.Ready() {
		t.Fatal("ready while its input topic does not exist")
	}
	if partitionsOf(outTopic) != 0 || partitionsOf(dlqTopic) != 0 {
		t.Fatal("created output topics before the input existed")
	}
	if _, err := adm.CreateTopic(context.Background(), partitions, 1, nil, inTopic); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the service to be ready", 30*time.Second, svc.Ready)
	for _, topic := range []string{outTopic, dlqTopic} {
		if n := partitionsOf(topic); n != partitions {
			t.Errorf("%s created with %d partitions, want the input's %d", topic, n, partitions)
		}
	}
	st := streamtest.Generate(inTopic, 5, 300, partitions)
	produce(t, brokers, st.Records)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
}

// TestServiceStopsOnARejectedSessionTimeout: a --session-timeout the brokers
// refuse can never join the group. The service used to stay up (and ready)
// retrying for ever; it stops with an error that names the flag.
func TestServiceStopsOnARejectedSessionTimeout(t *testing.T) {
	brokers := newCluster(t, 2) // kfake allows 6s..5m, as Kafka does by default
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.SessionTimeout = time.Second
	svc, err := New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = svc.Run(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Run = %v after %v, want it to stop on its own", err, ctx.Err())
	}
	if !strings.Contains(err.Error(), "--session-timeout") || svc.Healthy() == nil {
		t.Fatalf("Run = %v (healthy: %v), want an error naming --session-timeout", err, svc.Healthy())
	}
	if svc.Ready() {
		t.Error("still ready after stopping")
	}
}

// TestServiceDeadLettersTombstones: through the broker, a tombstone's dead
// letter has a null value and an empty value's an empty one (the original
// bytes, unchanged), each a decode dead letter that says which it was.
func TestServiceDeadLettersTombstones(t *testing.T) {
	brokers := newCluster(t, 1)
	produce(t, brokers, []*kgo.Record{
		{Topic: inTopic, Partition: 0, Key: []byte("card-A"), Value: nil},
		{Topic: inTopic, Partition: 0, Key: []byte("card-A"), Value: []byte{}},
	})
	startService(t, testConfig(t, brokers, checkpoint.NewMemoryStore()))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(got) < 2 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r) })
	}
	if len(got) != 2 {
		t.Fatalf("%d dead letters, want 2", len(got))
	}
	header := func(r *kgo.Record, k string) string {
		for _, h := range r.Headers {
			if h.Key == k {
				return string(h.Value)
			}
		}
		return ""
	}
	for i, want := range []string{"null (a tombstone)", "empty"} {
		r := got[i]
		if header(r, codec.HeaderReason) != string(codec.ReasonDecode) || !strings.Contains(header(r, codec.HeaderError), want) {
			t.Errorf("dead letter %d: reason %q, error %q; want decode, saying the value is %s", i, header(r, codec.HeaderReason), header(r, codec.HeaderError), want)
		}
	}
	if got[0].Value != nil || got[1].Value == nil {
		t.Errorf("dead-letter values %v, %v: want null for the tombstone and empty for the empty value", got[0].Value, got[1].Value)
	}
}

// TestServiceWarnsOfKeysThatAreNotEntityIDs: records keyed by something else
// than their entity_id (null included) are processed, counted in
// velocity_key_mismatch_total and warned about once, not per record.
func TestServiceWarnsOfKeysThatAreNotEntityIDs(t *testing.T) {
	brokers := newCluster(t, 1)
	var recs []*kgo.Record
	for i, key := range [][]byte{[]byte("card-A"), []byte("acct-9"), nil, []byte("acct-9")} {
		tx := codec.Transaction{EventID: "e" + strconv.Itoa(i), EntityID: "card-A", AmountMinor: 1, EventTime: 1793491200000 + int64(i)}
		recs = append(recs, &kgo.Record{Topic: inTopic, Partition: 0, Key: key, Value: codec.EncodeTransaction(&tx)})
	}
	produce(t, brokers, recs)
	core, logs := observer.New(zap.InfoLevel)
	m := metrics.New(prometheus.NewRegistry())
	svc, err := New(testConfig(t, brokers, checkpoint.NewMemoryStore()), zap.New(core), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	got := readOutputs(t, brokers, len(recs), 30*time.Second)
	if len(got) != len(recs) {
		t.Fatalf("%d outputs, want %d", len(got), len(recs))
	}
	// The metric is brought up to date on the partition's next tick.
	mismatches := func() float64 { return testutil.ToFloat64(m.KeyMismatch.WithLabelValues("0")) }
	waitFor(t, "velocity_key_mismatch_total to count the records", 10*time.Second, func() bool { return mismatches() >= 3 })
	time.Sleep(300 * time.Millisecond) // a few more ticks: nothing more may be counted or warned
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := mismatches(); n != 3 {
		t.Errorf("velocity_key_mismatch_total = %v, want 3", n)
	}
	if n := logs.FilterMessageSnippet("other than their entity_id").Len(); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
}

// runWithTxnFaults runs a kfake cluster with the service's topics whose
// injected faults (inject adds kfake control functions) outlast franz-go's own
// retries: the exactly-once service runs with one retry, as a broker restart
// of a few seconds outlasts franz-go's default retries against a refused dial.
// It runs the service over a stream and checks exactly one output per offset
// for read_committed and that the service kept running.
func runWithTxnFaults(t *testing.T, seed uint64, inject func(c *kfake.Cluster)) {
	t.Helper()
	const partitions = 2
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, inTopic, outTopic, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	inject(c)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.ExactlyOnce = true
	cfg.ClientOpts = []kgo.Opt{kgo.RequestRetries(1), kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond })}
	svc, _ := startService(t, cfg)
	st := streamtest.Generate(inTopic, seed, 2000, partitions)
	produce(t, brokers, st.Records)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
	if err := svc.Healthy(); err != nil {
		t.Fatalf("stopped: %v", err)
	}
}

// dropConnection is a kfake control function that closes the connection
// instead of answering, for the first n requests it sees; count counts them.
func dropConnection(c *kfake.Cluster, n int32, count *atomic.Int32) func(kmsg.Request) (kmsg.Response, error, bool) {
	return func(kmsg.Request) (kmsg.Response, error, bool) {
		if count.Add(1) > n {
			return nil, nil, false
		}
		c.KeepControl()
		return nil, errors.New("connection dropped by the test"), true
	}
}

// TestServiceExactlyOnceRetriesTransientTxnErrors: the requests that put the
// offset commit into a partition's transaction fail now and then while a
// broker restarts or a coordinator moves: the connection drops, or the answer
// is COORDINATOR_LOAD_IN_PROGRESS. They are retried; the instance used to stop
// on the first one. read_committed still sees exactly one output per offset.
func TestServiceExactlyOnceRetriesTransientTxnErrors(t *testing.T) {
	var dropped, loading atomic.Int32
	runWithTxnFaults(t, 9, func(c *kfake.Cluster) {
		c.ControlKey(int16(kmsg.AddOffsetsToTxn), dropConnection(c, 2, &dropped))
		c.ControlKey(int16(kmsg.TxnOffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if loading.Add(1) > 3 {
				return nil, nil, false
			}
			c.KeepControl()
			r := req.(*kmsg.TxnOffsetCommitRequest)
			resp := r.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
			for _, rt := range r.Topics {
				st := kmsg.NewTxnOffsetCommitResponseTopic()
				st.Topic, st.TopicID = rt.Topic, rt.TopicID
				for _, rp := range rt.Partitions {
					sp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
					sp.Partition, sp.ErrorCode = rp.Partition, kerr.CoordinatorLoadInProgress.Code
					st.Partitions = append(st.Partitions, sp)
				}
				resp.Topics = append(resp.Topics, st)
			}
			return resp, nil, true
		})
	})
	if dropped.Load() < 3 || loading.Load() < 4 {
		t.Fatalf("the faults were not all injected: %d AddOffsetsToTxn, %d TxnOffsetCommit requests", dropped.Load(), loading.Load())
	}
}

// TestServiceExactlyOnceRetriesConcurrentTransactions: while the coordinator
// completes a transaction it is ending (its timeout ran out during a broker
// restart and freeze: it aborts it), AddOffsetsToTxn answers
// CONCURRENT_TRANSACTIONS, which franz-go's error table does not mark
// retriable. The instance stopped on it ("add offsets to transaction:
// CONCURRENT_TRANSACTIONS", found by TestServiceRidesOutBrokerFaults on a
// loaded machine); it retries, and then commits or, once the abort is done, finds
// the transaction lost and takes the partition over again.
func TestServiceExactlyOnceRetriesConcurrentTransactions(t *testing.T) {
	var busy atomic.Int32
	runWithTxnFaults(t, 12, func(c *kfake.Cluster) {
		c.ControlKey(int16(kmsg.AddOffsetsToTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if busy.Add(1) > 3 {
				return nil, nil, false
			}
			c.KeepControl()
			resp := req.(*kmsg.AddOffsetsToTxnRequest).ResponseKind().(*kmsg.AddOffsetsToTxnResponse)
			resp.ErrorCode = kerr.ConcurrentTransactions.Code
			return resp, nil, true
		})
	})
	if busy.Load() < 4 {
		t.Fatalf("only %d AddOffsetsToTxn requests: the fault was not injected", busy.Load())
	}
	// The same answer to the commit itself: franz-go's EndTransaction retries
	// it (this holds it to that).
	var ending atomic.Int32
	runWithTxnFaults(t, 13, func(c *kfake.Cluster) {
		c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if ending.Add(1) > 2 {
				return nil, nil, false
			}
			c.KeepControl()
			resp := req.(*kmsg.EndTxnRequest).ResponseKind().(*kmsg.EndTxnResponse)
			resp.ErrorCode = kerr.ConcurrentTransactions.Code
			return resp, nil, true
		})
	})
	if ending.Load() < 3 {
		t.Fatalf("only %d EndTxn requests: the fault was not injected", ending.Load())
	}
}

// TestServiceExactlyOnceCommitOutcomeUnknown: the connection drops on the
// transaction's commit (EndTxn), so whether it was committed is unknown. The
// partition is dropped and taken over again (the takeover fences the
// transactional id, reads the committed offset and restores the snapshot that
// matches it), instead of the instance stopping. Exactly one output per
// offset for read_committed.
func TestServiceExactlyOnceCommitOutcomeUnknown(t *testing.T) {
	var dropped atomic.Int32
	runWithTxnFaults(t, 10, func(c *kfake.Cluster) {
		c.ControlKey(int16(kmsg.EndTxn), dropConnection(c, 3, &dropped))
	})
	if dropped.Load() < 4 {
		t.Fatalf("only %d EndTxn requests: the fault was not injected", dropped.Load())
	}
}

// TestServiceExactlyOnceReacquireRidesOutABrokerRestart: a broker restarting
// drops the connection on a transaction's commit (EndTxn), so its outcome is
// unknown and the partition is dropped, to be taken over in place
// (reacquireLost) once the group says it is still ours. The broker is not back
// by then: the takeover's first attempts to initialise the transactional id
// fail on dropped connections too. The service stopped on the first of them
// ("reacquire after a lost transaction"), where a takeover on assignment
// (acquireRetrying) rides them out; it now retries too, and read_committed
// sees exactly one output per offset.
func TestServiceExactlyOnceReacquireRidesOutABrokerRestart(t *testing.T) {
	const partitions, initDrops = 2, 6
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, inTopic, outTopic, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// The commits fail until the service counts a lost transaction; from then
	// on the next initDrops producer initialisations do.
	var svcP atomic.Pointer[Service]
	var inits atomic.Int32
	lost := func() bool { s := svcP.Load(); return s != nil && testutil.ToFloat64(s.m.TxnPartitionsLost) > 0 }
	c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		if lost() {
			return nil, nil, false
		}
		c.KeepControl()
		return nil, errors.New("connection dropped by the test"), true
	})
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !lost() || inits.Add(1) > initDrops {
			return nil, nil, false
		}
		c.KeepControl()
		return nil, errors.New("connection dropped by the test"), true
	})
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.ExactlyOnce = true
	cfg.ClientOpts = []kgo.Opt{kgo.RequestRetries(1), kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond })}
	svc, _ := startService(t, cfg)
	svcP.Store(svc)
	st := streamtest.Generate(inTopic, 14, 2000, partitions)
	produce(t, brokers, st.Records[:1000])
	waitFor(t, "a lost transaction taken over again, or the service to stop", 60*time.Second, func() bool {
		return svc.Healthy() != nil || inits.Load() > initDrops && svc.Assigned() == partitions
	})
	if err := svc.Healthy(); err != nil {
		t.Fatalf("stopped: %v", err)
	}
	produce(t, brokers, st.Records[1000:])
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
	if err := svc.Healthy(); err != nil {
		t.Fatalf("stopped: %v", err)
	}
}

// TestMayPass: the service retries what internal/retry deems transient (tested
// there, with the dial, coordinator, EOF and authorization cases) and a warm-up
// read that stalled; nothing else.
func TestMayPass(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"transient", fmt.Errorf("commit: %w", kerr.CoordinatorLoadInProgress), true},
		{"a stalled warm-up", fmt.Errorf("partition 1: warm-up: %w", errWarmUpStalled), true},
		{"fenced", kerr.ProducerFenced, false},
		{"not authorized", kerr.TransactionalIDAuthorizationFailed, false},
	} {
		if got := mayPass(tt.err); got != tt.want {
			t.Errorf("%s (%v): retriable %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestServiceTakeoverRetriesTransientErrors: right after a broker restart the
// snapshot store's requests can fail for a moment (LEADER_NOT_AVAILABLE while
// leaders are elected). The takeover is retried instead of stopping the
// service, which it used to.
func TestServiceTakeoverRetriesTransientErrors(t *testing.T) {
	const partitions = 2
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, inTopic, outTopic, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	store, err := checkpoint.NewKafkaStore(context.Background(), checkpoint.KafkaConfig{Brokers: brokers, Topic: "snapshots", Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var refused atomic.Int32
	c.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.ListOffsetsRequest)
		if len(r.Topics) == 0 || r.Topics[0].Topic != "snapshots" || refused.Load() >= 4 {
			c.KeepControl()
			return nil, nil, false
		}
		refused.Add(1)
		c.KeepControl()
		return kfaketest.AnswerListOffsets(r, func(sp *kmsg.ListOffsetsResponseTopicPartition) {
			sp.ErrorCode = kerr.LeaderNotAvailable.Code
		}), nil, true
	})
	cfg := testConfig(t, brokers, store)
	cfg.ClientOpts = []kgo.Opt{kgo.RequestRetries(1), kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond })}
	svc, _ := startService(t, cfg)
	st := streamtest.Generate(inTopic, 11, 1000, partitions)
	produce(t, brokers, st.Records)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
	if err := svc.Healthy(); err != nil {
		t.Fatalf("stopped: %v", err)
	}
	if refused.Load() < 4 {
		t.Fatalf("only %d ListOffsets requests for the snapshot topic were refused: the fault was not injected", refused.Load())
	}
}

// TestServiceRidesOutABrokerRestartWhileCreatingTopics: the brokers answered
// the ping, then dropped the connections of the first CreateTopics requests (a
// broker restarting). The service used to stop at once ("does not exist and
// could not be created"); it retries, creates the output topics and processes
// the stream. A refusal that cannot pass still stops it at once
// (TestServiceStopsOnARejectedSessionTimeout, the ACL tests).
func TestServiceRidesOutABrokerRestartWhileCreatingTopics(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, inTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var dropped atomic.Int32
	c.ControlKey(int16(kmsg.CreateTopics), dropConnection(c, 3, &dropped))
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	svc, _ := startService(t, cfg)
	waitFor(t, "the service to be ready", 60*time.Second, svc.Ready)
	if n := dropped.Load(); n < 4 {
		t.Fatalf("%d CreateTopics requests, want the 3 dropped ones and the ones that created the topics", n)
	}
	st := streamtest.Generate(inTopic, 5, 200, 2)
	produce(t, brokers, st.Records)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
}

// TestServiceExactlyOnceTakesOverAPendingOffsetCommit: the previous owner of a
// partition died between the TxnOffsetCommit of its transaction and the
// EndTxn, leaving an offset commit pending for the group. franz-go's group
// consumer fetches the offsets of an assigned partition with RequireStable, so
// the broker answers UNSTABLE_OFFSET_COMMIT until that transaction ends; the
// new owner fenced the old transactional id (which aborts it) only after that
// fetch, in AdjustFetchOffsetsFn, and so waited for the old transaction's
// timeout (a minute here; the fault checker found a second stage stuck so).
// The new owner now fences in OnPartitionsAssigned, before the fetch, and
// publishes the stream well within the dead owner's transaction timeout.
func TestServiceExactlyOnceTakesOverAPendingOffsetCommit(t *testing.T) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.ExactlyOnce = true
	st := streamtest.Generate(inTopic, 11, 400, partitions)
	produce(t, brokers, st.Records)

	// An earlier owner committed offset 0 for partition 0 (the group exists);
	// the dead owner's transaction commits offset 3 and never ends.
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: inTopic, Partition: 0, At: 0, LeaderEpoch: -1})
	if err := kadm.NewClient(newClient(t, brokers)).CommitAllOffsets(context.Background(), cfg.Group, offs); err != nil {
		t.Fatal(err)
	}
	svc0, err := New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	dead, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(svc0.transactionalID(0)), kgo.TransactionTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dead.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	id, epoch, err := dead.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = svc0.transactionalID(0), id, epoch, cfg.Group
	if resp, err := add.RequestWith(ctx, dead); err != nil || resp.ErrorCode != 0 {
		t.Fatalf("AddOffsetsToTxn: %v, code %d", err, resp.ErrorCode)
	}
	commit := kmsg.NewPtrTxnOffsetCommitRequest()
	commit.TransactionalID, commit.Group, commit.ProducerID, commit.ProducerEpoch, commit.Generation = svc0.transactionalID(0), cfg.Group, id, epoch, -1
	md, err := kadm.NewClient(newClient(t, brokers)).Metadata(ctx, inTopic)
	if err != nil {
		t.Fatal(err)
	}
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = inTopic, md.Topics[inTopic].ID // v6 names the topic by id (KIP-1319)
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch = 0, 3, -1
	rt.Partitions = append(rt.Partitions, rp)
	commit.Topics = append(commit.Topics, rt)
	if resp, err := commit.RequestWith(ctx, dead); err != nil || resp.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("TxnOffsetCommit: %v, %+v", err, resp)
	}
	dead.Close() // no EndTxn: the offset commit stays pending

	// Stable offsets are refused while it is pending: the state the new owner meets.
	fo, err := kadm.NewClient(newClient(t, brokers)).FetchOffsets(kadm.RequireStable(ctx), cfg.Group)
	if err == nil {
		if r, ok := fo.Lookup(inTopic, 0); ok {
			err = r.Err
		}
	}
	if !errors.Is(err, kerr.UnstableOffsetCommit) {
		t.Fatalf("stable offset fetch: %v, want UNSTABLE_OFFSET_COMMIT: the test does not build the state it means to", err)
	}

	start := time.Now()
	svc, _ := startService(t, cfg)
	got := readOutputs(t, brokers, len(st.Records), 30*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, true)
	if err := svc.Healthy(); err != nil {
		t.Fatalf("stopped: %v", err)
	}
	t.Logf("every output read_committed %v after the start", time.Since(start).Round(time.Millisecond))
}

// TestServiceExactlyOnceNamesTheIntervalWhenTheTimeoutIsRefused: the
// transaction timeout is 3 × --checkpoint-interval, and brokers refuse one
// above transaction.max.timeout.ms (15 min by default). The service stops, and
// the error says which flag to change, not only the broker's code.
func TestServiceExactlyOnceNamesTheIntervalWhenTheTimeoutIsRefused(t *testing.T) {
	brokers := newCluster(t, 1)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.ExactlyOnce, cfg.CheckpointInterval = true, 6*time.Minute
	produce(t, brokers, streamtest.Generate(inTopic, 3, 5, 1).Records)
	svc, err := New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = svc.Run(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Run = %v after %v, want it to stop on its own", err, ctx.Err())
	}
	if !errors.Is(err, kerr.InvalidTransactionTimeout) || !strings.Contains(err.Error(), "--checkpoint-interval") {
		t.Fatalf("Run = %v, want INVALID_TRANSACTION_TIMEOUT with the flag to change", err)
	}
}

// TestServiceRidesOutConnectionsCutOff: a broker restarting, or a proxy in front
// of one whose backend went away, closes a new connection as soon as its first
// request arrives. franz-go takes that for a missing SASL or TLS setting and
// does not retry it. An instance started then used to exit at once ("reach
// brokers ... check --brokers and that the cluster is up": its ping tries each
// broker once); now it waits for the brokers, within the same 30 s. A running
// one failed every buffered output when its idempotent producer's first
// InitProducerID met it ("unable to initialize a producer ID") and stopped (the
// fault checker's network paths, kafka seed 432698159); its clients now retry
// such an EOF like any other, the configuration having been checked at start.
// Either way the service goes on, and its outputs match the oracle's.
func TestServiceRidesOutConnectionsCutOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  kmsg.Key // the request whose connection is cut off, its first n times
		n    int32
	}{
		{"at start", kmsg.ApiVersions, 4},
		{"the producer id", kmsg.InitProducerID, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, inTopic, outTopic, dlqTopic))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			brokers := c.ListenAddrs()
			st := streamtest.Generate(inTopic, 17, 600, 2)
			produce(t, brokers, st.Records)
			var seen atomic.Int32 // the test's own producer is done: every request counted is the service's
			c.ControlKey(int16(tc.key), dropConnection(c, tc.n, &seen))
			cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
			svc, _ := startService(t, cfg)
			got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
			if err := svc.Healthy(); err != nil {
				t.Fatalf("stopped: %v", err)
			}
			streamtest.Check(t, st, cfg.Specs, got, false)
			if n := seen.Load(); n <= tc.n {
				t.Fatalf("%d %s requests, want more than the %d cut off: the fault was not injected", n, tc.key.Name(), tc.n)
			}
		})
	}
}
