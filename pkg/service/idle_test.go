package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/internal/kfaketest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// TestIdleRuleWaitsForRecordsNotYetFetched: a partition whose fetches bring
// nothing for longer than --idle-timeout while the broker holds records for it
// (a slow fetch, a broker that answers late, a process frozen and woken up) is
// not idle: its reorder buffer is not released early, and an event older than
// the pending one, fetched late, is still counted before it, as replay counts
// it. It failed before the idle release waited for the broker's word: the
// newer event was released alone (count 1) and the older one counted after it.
func TestIdleRuleWaitsForRecordsNotYetFetched(t *testing.T) {
	c := newFakeCluster(t, 1)
	brokers := c.ListenAddrs()

	// The input's first record is fetched, the second waits at the broker.
	hold := make(chan struct{})
	held := holdFetchesFrom(c, 1, hold)
	rec := cardRecord
	const base = idleBase
	produce(t, brokers, []*kgo.Record{rec("newer", base+10_000)})

	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.Watermark = watermark.Config{AllowedLateness: 5000, IdleTimeout: 300 * time.Millisecond}
	startService(t, cfg)
	select {
	case <-held: // offset 0 was fetched; the fetch of offset 1 waits
	case <-time.After(30 * time.Second):
		t.Fatal("the service never fetched past offset 0")
	}
	// Within the lateness of the first: held in the reorder buffer, released
	// before it in (event time, offset) order.
	produce(t, brokers, []*kgo.Record{rec("older", base+9_500)})
	time.Sleep(5 * cfg.Watermark.IdleTimeout) // idle by the wall clock alone
	close(hold)

	counts := firstWindowCounts(t, readOutputs(t, brokers, 2, 60*time.Second))
	// Replay's: the older event (offset 1) first, alone; then the newer one
	// (offset 0) with both in its 10 s window.
	if want := map[int64]int64{0: 2, 1: 1}; counts[0] != want[0] || counts[1] != want[1] {
		t.Errorf("10s counts by input offset %v, want %v (as replay counts them)", counts, want)
	}
}

// TestIdleRuleWaitsForTheRestOfAPartialPoll: a poll hands a partition fewer
// records than its fetch brought (it takes at most maxPollRecords), and the
// batch's high watermark is the fetch's, past them. The partition then looked
// caught up to the broker's last stable offset while the rest waited in the
// client for the next poll; a poll loop held up for longer than --idle-timeout
// (a slow rebalance callback, a stalled process) let the idle rule release the
// reorder buffer before the older event among the rest was read, which was
// then counted after newer ones. The verdict now takes a batch's high
// watermark only when its records reach it, and never while the client holds
// fetched records not yet polled.
func TestIdleRuleWaitsForTheRestOfAPartialPoll(t *testing.T) {
	brokers := newCluster(t, 1)
	const base, n = int64(1_795_000_000_000), maxPollRecords + 500
	const older = maxPollRecords + 300 // after the first poll's records
	var recs []*kgo.Record
	for i := range n {
		et := base + int64(i)
		if i == older {
			et = base + maxPollRecords - 200 // within the lateness of the newest event polled first
		}
		recs = append(recs, &kgo.Record{Topic: inTopic, Partition: 0, Key: []byte("card-1"), Timestamp: time.UnixMilli(et),
			Value: codec.EncodeTransaction(&codec.Transaction{EventID: fmt.Sprint("e", i), EntityID: "card-1", AmountMinor: 100, Currency: "EUR", EventTime: et})})
	}
	produce(t, brokers, recs)

	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.Watermark = watermark.Config{AllowedLateness: 5000, IdleTimeout: 200 * time.Millisecond}
	svc, err := New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	// The loop's second poll, which would take the rest at once, waits for
	// ten idle timeouts.
	var polls atomic.Int32
	svc.beforePoll = func() {
		if polls.Add(1) == 2 {
			time.Sleep(10 * cfg.Watermark.IdleTimeout)
		}
	}
	runUntilCleanup(t, svc)

	got := readOutputs(t, brokers, n, 60*time.Second)
	// In (event time, offset) order the older event comes after offset
	// maxPollRecords-201 and before maxPollRecords-200: its count is its
	// position in that order, and every event after it counts it.
	for _, off := range []int64{older, maxPollRecords - 1, maxPollRecords + 200} {
		outs := got[streamtest.Source{Partition: 0, Offset: off}]
		if len(outs) != 1 || outs[0].Dead {
			t.Fatalf("input %d: outputs %+v, want one features record", off, outs)
		}
		f, err := codec.DecodeFeatures(outs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		var want int64
		switch off {
		case older:
			want = maxPollRecords - 200 + 2 // the events up to its time (offsets 0 to maxPollRecords-200), and itself
		default:
			want = off + 2 // every event before it (all in its 10 s window), the older event and itself
		}
		if f.Windows[0].Count != want {
			t.Errorf("input %d: 10s count %d, want %d (as replay counts it)", off, f.Windows[0].Count, want)
		}
	}
}

// TestIdleRuleReadsPastTransactionMarkers: under a transactional producer the
// input's last offsets are transaction markers (and aborted records), which no
// input record reaches. The partition is idle once it has read past them: its
// pending events (all of them, within the lateness) are released and published
// once the input goes quiet, and the aborted records count nowhere.
func TestIdleRuleReadsPastTransactionMarkers(t *testing.T) {
	brokers := newCluster(t, 1)
	const base = int64(1_795_000_000_000)
	rec := func(id string, et, amount int64) *kgo.Record {
		return &kgo.Record{Topic: inTopic, Partition: 0, Key: []byte("card-1"),
			Value: codec.EncodeTransaction(&codec.Transaction{EventID: id, EntityID: "card-1", AmountMinor: amount, Currency: "EUR", EventTime: et})}
	}
	txn := upstreamTxns(t, brokers)
	var committed, aborted []*kgo.Record
	for i := range 50 {
		committed = append(committed, rec(fmt.Sprint("c", i), base+int64(i)*10, 100))
		aborted = append(aborted, rec(fmt.Sprint("a", i), base+int64(i)*10, 1_000_000))
	}
	txn(committed, kgo.TryCommit)
	txn(aborted, kgo.TryAbort) // the log ends with aborted records and their marker

	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	// Every event is within the lateness of the newest: all pending until the
	// idle rule releases them.
	cfg.Watermark = watermark.Config{AllowedLateness: 60_000, IdleTimeout: 200 * time.Millisecond}
	startService(t, cfg)
	got := readOutputs(t, brokers, len(committed), 30*time.Second)
	if len(got) != len(committed) {
		t.Fatalf("%d outputs 30 s after the input went quiet, want %d: the pending events were never released", len(got), len(committed))
	}
	for src, outs := range got {
		if src.Offset >= int64(len(committed)) {
			t.Fatalf("an output names offset %d, past the committed records", src.Offset)
		}
		f, err := codec.DecodeFeatures(outs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		if want := src.Offset + 1; len(outs) != 1 || f.Windows[0].Count != want || f.Windows[0].SumMinor != 100*want {
			t.Fatalf("input %d: %d outputs, count %d sum %d; want one, %d and %d (no aborted amount)", src.Offset, len(outs), f.Windows[0].Count, f.Windows[0].SumMinor, want, 100*want)
		}
	}
}

// TestIdleChecksShareOneRequest: partitions that are quiet with records left at
// the broker (here their fetches are held) ask for the input's last stable
// offsets every tick until they have read them. They ask together: one
// request answers every partition waiting, at most one a tick, where each
// partition sent its own before (8 partitions: about 8 a tick). Once the
// fetches go on, every record is read and counted.
func TestIdleChecksShareOneRequest(t *testing.T) {
	const parts = 8
	c := newFakeCluster(t, parts)
	brokers := c.ListenAddrs()

	// Once every partition has asked for offset 1 (it has read its first
	// record), fetches from offset 1 sleep until hold is closed.
	hold := make(chan struct{})
	held := make(chan struct{})
	var once sync.Once
	asked := map[int32]bool{}
	c.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			for _, p := range tp.Partitions {
				if p.FetchOffset >= 1 {
					asked[p.Partition] = true
				}
			}
		}
		if len(asked) == parts {
			once.Do(func() { close(held) })
			select {
			case <-hold:
			default:
				c.SleepControl(func() { <-hold })
			}
		}
		return nil, nil, false
	})
	var lists atomic.Int64
	c.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		lists.Add(1)
		return nil, nil, false
	})

	const base = int64(1_795_000_000_000)
	recs := func(n int) []*kgo.Record {
		var out []*kgo.Record
		for p := range int32(parts) {
			id := fmt.Sprintf("p%d-%d", p, n)
			out = append(out, &kgo.Record{Topic: inTopic, Partition: p, Key: []byte(fmt.Sprint("card-", p)), Timestamp: time.UnixMilli(base + int64(n)),
				Value: codec.EncodeTransaction(&codec.Transaction{EventID: id, EntityID: fmt.Sprint("card-", p), AmountMinor: 100, Currency: "EUR", EventTime: base + int64(n)})})
		}
		return out
	}
	produce(t, brokers, recs(0))
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	// Every event is within the lateness of the newest: pending, so every
	// quiet partition asks for the idle verdict.
	cfg.Watermark = watermark.Config{AllowedLateness: 60_000, IdleTimeout: 200 * time.Millisecond}
	svc, _ := startService(t, cfg)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the service never fetched past offset 0 of every partition")
	}
	produce(t, brokers, recs(1)) // left at the broker: the partitions are not idle

	every := svc.tickEvery()
	time.Sleep(3 * cfg.Watermark.IdleTimeout) // quiet past the idle timeout: every partition asks
	before, begin := lists.Load(), time.Now()
	time.Sleep(30 * every)
	n, window := lists.Load()-before, time.Since(begin)
	// At most one request an interval, and one more for an interval cut by
	// either end of the window.
	if most := int64(window/every) + 2; n > most {
		t.Errorf("%d ListOffsets requests in %s of ticks every %s for %d quiet partitions, want at most %d: one request for them all", n, window.Round(time.Millisecond), every, parts, most)
	}
	if n == 0 {
		t.Errorf("no ListOffsets request in %s: the quiet partitions did not ask for the idle verdict", window.Round(time.Millisecond))
	}
	close(hold)
	if got := readOutputs(t, brokers, 2*parts, 60*time.Second); len(got) != 2*parts {
		t.Fatalf("%d inputs with outputs after the fetches went on, want %d", len(got), 2*parts)
	}
}

// TestIdleVerdictNeedsAnAnswerToItsOwnQuestion: a partition quiet with an event
// pending asks the broker for its end; the answer is late, and the broker it
// comes from answers with the end it had when asked (a leader frozen with the
// request queued does that when it wakes). Meanwhile the partition read on,
// went quiet again, and one more record waits at the broker. The late answer
// is about the earlier spell, before those records: it must not release the
// reorder buffer, or the record still waiting, older than the pending events,
// is counted after them. It failed before the answer had to match its
// question: a spell that ended while the partition was busy was never counted,
// and the late answer passed for the new spell's (count 2 for the newest event,
// 3 in replay).
func TestIdleVerdictNeedsAnAnswerToItsOwnQuestion(t *testing.T) {
	c := newFakeCluster(t, 1)
	brokers := c.ListenAddrs()

	// The first idle check (latest offset, read_committed) waits until
	// answerLate is closed, then gets the end as it was when asked (1).
	answerLate := make(chan struct{})
	asked := make(chan struct{})
	controlIdleChecks(c, func(n int32, lr *kmsg.ListOffsetsRequest) kmsg.Response {
		if n != 1 {
			return nil
		}
		close(asked)
		c.SleepControl(func() { <-answerLate })
		return kfaketest.AnswerListOffsets(lr, func(sp *kmsg.ListOffsetsResponseTopicPartition) {
			sp.Offset, sp.Timestamp, sp.LeaderEpoch = 1, -1, 0
		})
	})
	// Fetches from offset 2 on wait until fetchOn is closed.
	fetchOn := make(chan struct{})
	holdFetchesFrom(c, 2, fetchOn)
	rec := cardRecord
	const base = idleBase
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.Watermark = watermark.Config{AllowedLateness: 5000, IdleTimeout: 300 * time.Millisecond}
	produce(t, brokers, []*kgo.Record{rec("a", base+10_000)}) // offset 0: pending
	startService(t, cfg)
	select {
	case <-asked: // quiet with a pending: the first check is out, and held
	case <-time.After(30 * time.Second):
		t.Fatal("the partition never asked for the idle verdict")
	}
	produce(t, brokers, []*kgo.Record{rec("b", base+9_800)}) // offset 1: read, pending
	produce(t, brokers, []*kgo.Record{rec("c", base+9_600)}) // offset 2: waits at the broker
	time.Sleep(4 * cfg.Watermark.IdleTimeout)                // read b, then quiet again
	close(answerLate)                                        // the answer to the first question: end 1
	time.Sleep(4 * cfg.Watermark.IdleTimeout)                // a release now would come before c
	close(fetchOn)

	counts := firstWindowCounts(t, readOutputs(t, brokers, 3, 60*time.Second))
	// Replay's order is c, b, a (event time): 1, 2, 3.
	if want := map[int64]int64{0: 3, 1: 2, 2: 1}; counts[0] != want[0] || counts[1] != want[1] || counts[2] != want[2] {
		t.Errorf("10s counts by input offset %v, want %v (as replay counts them)", counts, want)
	}
}

// idleBase is the idle tests' first event time.
const idleBase = int64(1_795_000_000_000)

// cardRecord is a transaction of card-1 at event time t, on the input's
// partition 0.
func cardRecord(id string, t int64) *kgo.Record {
	return &kgo.Record{Topic: inTopic, Partition: 0, Key: []byte("card-1"), Timestamp: time.UnixMilli(t),
		Value: codec.EncodeTransaction(&codec.Transaction{EventID: id, EntityID: "card-1", AmountMinor: 100, Currency: "EUR", EventTime: t})}
}

// holdFetchesFrom makes the cluster's fetches of any partition from offset on
// sleep until release is closed (fetches name topics by id; the idle tests'
// services fetch nothing else meanwhile). The channel it returns receives once
// a fetch waits.
func holdFetchesFrom(c *kfake.Cluster, offset int64, release <-chan struct{}) <-chan struct{} {
	held := make(chan struct{}, 1)
	c.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			for _, p := range tp.Partitions {
				if p.FetchOffset >= offset {
					select {
					case <-release:
					default:
						select {
						case held <- struct{}{}:
						default:
						}
						c.SleepControl(func() { <-release })
					}
				}
			}
		}
		return nil, nil, false
	})
	return held
}

// firstWindowCounts are the first window's counts of the outputs, by input
// offset; every input must have one features record.
func firstWindowCounts(t *testing.T, got map[streamtest.Source][]streamtest.Output) map[int64]int64 {
	t.Helper()
	counts := map[int64]int64{}
	for src, outs := range got {
		if len(outs) != 1 || outs[0].Dead {
			t.Fatalf("input %d: outputs %+v, want one features record", src.Offset, outs)
		}
		f, err := codec.DecodeFeatures(outs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		counts[src.Offset] = f.Windows[0].Count
	}
	return counts
}

// TestIdleVerdictAsksAgainAfterAnOldAnswer: the broker's word is about the
// moment it was asked. An answer that comes back later than --idle-timeout
// after the question (a slow broker; a process frozen between asking and
// reading it wakes up with records the answer does not cover) is not used: the
// partition asks again and is released on the fresh answer only.
func TestIdleVerdictAsksAgainAfterAnOldAnswer(t *testing.T) {
	c := newFakeCluster(t, 1)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.Watermark = watermark.Config{AllowedLateness: 5000, IdleTimeout: 300 * time.Millisecond}

	// The first idle check is answered (truly: nothing more to read) three idle
	// timeouts after it was asked; later ones at once.
	checks := controlIdleChecks(c, func(n int32, _ *kmsg.ListOffsetsRequest) kmsg.Response {
		if n == 1 {
			c.SleepControl(func() { time.Sleep(3 * cfg.Watermark.IdleTimeout) })
		}
		return nil
	})
	produce(t, brokers, []*kgo.Record{cardRecord("a", idleBase)}) // pending until the idle rule releases it
	startService(t, cfg)
	got := readOutputs(t, brokers, 1, 30*time.Second)
	if len(got) != 1 {
		t.Fatalf("%d outputs, want the pending event released", len(got))
	}
	if n := checks.Load(); n < 2 {
		t.Errorf("released after %d idle checks: the answer that came %s after its question was used", n, 3*cfg.Watermark.IdleTimeout)
	}
}

// controlIdleChecks hands the cluster's idle verdict questions (lsoLookup: the
// latest offsets, read_committed) to answer, with their number from 1; answer
// returns the response, or nil for the cluster's own. It returns the count of
// questions so far.
func controlIdleChecks(c *kfake.Cluster, answer func(n int32, lr *kmsg.ListOffsetsRequest) kmsg.Response) *atomic.Int32 {
	checks := new(atomic.Int32)
	c.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		lr := req.(*kmsg.ListOffsetsRequest)
		if lr.IsolationLevel != 1 || len(lr.Topics) == 0 || len(lr.Topics[0].Partitions) == 0 || lr.Topics[0].Partitions[0].Timestamp != -1 {
			return nil, nil, false
		}
		if resp := answer(checks.Add(1), lr); resp != nil {
			return resp, nil, true
		}
		return nil, nil, false
	})
	return checks
}

// TestWarmUpRepeatsTheLastIdleRelease: a new owner without a snapshot of the
// partition (per-instance file stores, a lost store) rebuilds its state by a
// warm-up read up to the committed offset, and must hold pending only what
// the previous owner still held there. The previous owner released its
// reorder buffer on the idle timeout and committed after it; unless the
// warm-up repeats that release, the released events are pending again and
// the new owner publishes them a second time, counted after an older event
// that arrived later (not as they were published the first time). The
// commit records where the release was, in both modes. Before the default
// mode's commits carried it, its new owner published offsets 0 and 1 twice
// (the fault checker's file-features 2939272129: repeats unlike the first
// outputs and replay's, with nothing in the outputs to show an idle release).
func TestWarmUpRepeatsTheLastIdleRelease(t *testing.T) {
	for _, tc := range []struct {
		name string
		eos  bool
	}{
		{"default mode", false},
		{"exactly-once", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			brokers := newCluster(t, 1)
			cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
			cfg.ExactlyOnce = tc.eos
			cfg.Watermark = watermark.Config{AllowedLateness: 5000, IdleTimeout: 300 * time.Millisecond}
			cfg.Host = "first"
			// Both within the lateness of the newest: pending until the idle
			// rule releases them.
			produce(t, brokers, []*kgo.Record{cardRecord("a", idleBase+10_000), cardRecord("b", idleBase+10_500)})
			_, stop := startService(t, cfg)
			readOutputs(t, brokers, 2, 30*time.Second) // released on idle (and, exactly-once, committed)
			time.Sleep(5 * cfg.CheckpointInterval)     // a checkpoint after the release
			stop()                                     // and the handover's

			// The next owner has no snapshot: it warms up to the committed offset.
			next := cfg
			next.Store = checkpoint.NewMemoryStore()
			next.Host = "next"
			_, stop = startService(t, next)
			// Older than both, within the lateness: accepted, and after the
			// release counted out of order by an owner whose state is the
			// first one's.
			produce(t, brokers, []*kgo.Record{cardRecord("c", idleBase+9_000)})
			readOutputs(t, brokers, 3, 30*time.Second)
			time.Sleep(5 * next.Watermark.IdleTimeout) // idle again: anything pending is released
			time.Sleep(5 * next.CheckpointInterval)
			stop()

			got := readOutputs(t, brokers, 3, 30*time.Second)
			for off := int64(0); off < 3; off++ {
				outs := got[streamtest.Source{Partition: 0, Offset: off}]
				if len(outs) != 1 || outs[0].Dead {
					t.Errorf("input offset %d: %d outputs (dead letter: %v), want one features record: the new owner's warm-up did not repeat the idle release its commit followed",
						off, len(outs), len(outs) > 0 && outs[0].Dead)
				}
			}
		})
	}
}

// savesRefused is a snapshot store that refuses every save once refuse is
// set: with the group refusing commits too, the durable state of an instance
// stops where a SIGKILL would have stopped it.
type savesRefused struct {
	*checkpoint.MemoryStore // with its dedupe segments
	refuse                  *atomic.Bool
}

func (s savesRefused) Save(ctx context.Context, key checkpoint.Key, snap checkpoint.Snapshot) error {
	if s.refuse.Load() {
		return errors.New("refused: the instance is gone")
	}
	return s.MemoryStore.Save(ctx, key, snap)
}

// TestIdleReleaseIsDurableBeforeItsOutputs: in the default mode an owner
// releases its reorder buffer on the idle timeout and publishes the outputs
// at once; then nothing of it becomes durable (a SIGKILL before the next
// checkpoint: from the first output on, saves and commits fail). The next
// owner resumes from the last checkpoint, taken before the release, from its
// snapshot or by a warm-up read, at the position of the release or before
// it; an event older than the released ones arrives. The next owner must
// publish the released events' outputs as the first owner did, and count the
// older event after them (out of order, as the idle rule allows, its own
// windows read at its event time), not count it first and publish outputs for
// the same offsets that differ from the first ones, which no output would
// explain. Before the release's position was committed ahead of its outputs,
// every variant published offsets 0 and 1 a second time with the older event
// in.
func TestIdleReleaseIsDurableBeforeItsOutputs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		snapshot bool // the next owner has the snapshot; else a warm-up read
		// behind: the last checkpoint is of event a alone, b came after it
		// (the next owner reaches the release's position by reading b);
		// else of both, pending.
		behind bool
	}{
		{"from the snapshot, at the release", true, false},
		{"by a warm-up read, at the release", false, false},
		{"from the snapshot, before the release", true, true},
		{"by a warm-up read, before the release", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCluster(t, 1)
			brokers := c.ListenAddrs()
			var gone atomic.Bool
			kfaketest.RefuseOffsetCommits(c, kerr.CoordinatorNotAvailable.Code, func(*kmsg.OffsetCommitRequest) bool { return gone.Load() })
			store := checkpoint.NewMemoryStore()
			key := checkpoint.Key{Group: "g", Topic: inTopic, Partition: 0}
			late := watermark.Config{AllowedLateness: 5000, IdleTimeout: 300 * time.Millisecond}
			// Both within the lateness of the newest: pending until the idle
			// rule releases them.
			a, b := cardRecord("a", idleBase+10_000), cardRecord("b", idleBase+10_500)
			if tc.behind {
				// A checkpoint of a alone, pending (a graceful handover),
				// then b, and an owner that checkpoints only when it stops.
				produce(t, brokers, []*kgo.Record{a})
				cfg := testConfig(t, brokers, store)
				cfg.Watermark, cfg.Host = late, "zeroth"
				cfg.Watermark.IdleTimeout = time.Hour
				_, stop := startService(t, cfg)
				waitFor(t, "a snapshot of a", 30*time.Second, func() bool {
					l, err := store.Load(context.Background(), key)
					return err == nil && l.Next == 1
				})
				stop()
				produce(t, brokers, []*kgo.Record{b})
			} else {
				produce(t, brokers, []*kgo.Record{a, b})
			}
			cfg := testConfig(t, brokers, savesRefused{store, &gone})
			cfg.Watermark, cfg.Host = late, "first"
			if tc.behind {
				cfg.CheckpointInterval = time.Hour
			}
			// From the release's first output on, nothing more is durable.
			cfg.Observe = func(*pipeline.Output) { gone.Store(true) }
			first, err := New(cfg, zaptest.NewLogger(t).Named(cfg.Host), metrics.New(prometheus.NewRegistry()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- first.Run(ctx) }()
			firstOuts := readOutputs(t, brokers, 2, 30*time.Second)
			want := int64(2)
			if tc.behind {
				want = 1
			}
			if l, err := store.Load(context.Background(), key); err != nil || l.Next != want {
				t.Fatalf("the last snapshot before the release: next %d, %v; want %d", l.Next, err, want)
			}
			cancel()
			select {
			case <-done: // its shutdown checkpoint fails: refused
			case <-time.After(30 * time.Second):
				t.Fatal("the first instance did not stop")
			}

			next := testConfig(t, brokers, store)
			if !tc.snapshot {
				next.Store = checkpoint.NewMemoryStore()
			}
			next.Watermark, next.Host = late, "next"
			gone.Store(false)
			startService(t, next)
			// Older than both, within the lateness: accepted.
			produce(t, brokers, []*kgo.Record{cardRecord("c", idleBase+9_000)})
			got := readOutputs(t, brokers, 3, 30*time.Second)
			for off := int64(0); off < 2; off++ {
				src := streamtest.Source{Partition: 0, Offset: off}
				want := firstOuts[src]
				if len(want) != 1 {
					t.Fatalf("input offset %d: the first owner published %d outputs, want 1", off, len(want))
				}
				for i, o := range got[src] {
					if o.Dead || !bytes.Equal(o.Value, want[0].Value) {
						t.Errorf("input offset %d, output %d of %d: unlike the first owner's (dead letter: %v): the next owner did not release where the first one had",
							off, i+1, len(got[src]), o.Dead)
					}
				}
			}
			if older := got[streamtest.Source{Partition: 0, Offset: 2}]; len(older) != 1 || older[0].Dead {
				t.Errorf("the older event: outputs %+v, want one features record", older)
			}
		})
	}
}

// TestIdleReleaseWaitsForItsCommit: while the group refuses the commit that
// records where the idle release will be, the default mode releases nothing:
// an output published before that commit is durable is what a crash would
// leave unexplained (TestIdleReleaseIsDurableBeforeItsOutputs). Once the
// commit goes through, the release follows.
func TestIdleReleaseWaitsForItsCommit(t *testing.T) {
	c := newFakeCluster(t, 1)
	brokers := c.ListenAddrs()
	var refuse atomic.Bool
	refuse.Store(true)
	var refused atomic.Int32
	// Not retriable: franz-go returns it at once, and every attempt is one
	// refusal.
	kfaketest.RefuseOffsetCommits(c, kerr.OffsetMetadataTooLarge.Code, func(creq *kmsg.OffsetCommitRequest) bool {
		ahead := false
		for _, rt := range creq.Topics {
			for _, rp := range rt.Partitions {
				ahead = ahead || rp.Metadata != nil && strings.Contains(*rp.Metadata, ";idle-flush-ahead=")
			}
		}
		if ahead && refuse.Load() {
			refused.Add(1)
			return true
		}
		return false
	})
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.Watermark = watermark.Config{AllowedLateness: 5000, IdleTimeout: 300 * time.Millisecond}
	var published atomic.Int32
	cfg.Observe = func(*pipeline.Output) { published.Add(1) }
	produce(t, brokers, []*kgo.Record{cardRecord("a", idleBase+10_000), cardRecord("b", idleBase+10_500)})
	startService(t, cfg)
	waitFor(t, "a refused commit of the release's position", 30*time.Second, func() bool { return refused.Load() >= 1 })
	time.Sleep(3 * cfg.Watermark.IdleTimeout) // an attempt's outputs would be out by now
	if n := published.Load(); n != 0 {
		t.Fatalf("%d outputs published while the release's position could not be committed, want none", n)
	}
	if n := refused.Load(); n < 2 {
		t.Errorf("%d attempts to commit the release's position, want it tried again", n)
	}
	refuse.Store(false)
	readOutputs(t, brokers, 2, 30*time.Second)
}
