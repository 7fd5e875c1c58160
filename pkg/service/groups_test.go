package service

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// groupsDefinition keys a re-keyed group by the currency of our Transaction
// schema: a few busy keys that every input partition feeds, and records without
// one.
const groupsDefinition = `
version: service-groups
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [10s:1s, 1m:10s]
features:
  - {name: n, agg: count, windows: [10s, 1m]}
groups:
  - name: cur
    key: currency
    windows: [10s:1s, 1m:10s]
    features:
      - {name: n, agg: count, windows: [10s, 1m]}
      - {name: spend, agg: sum, windows: [1m]}
      - {name: entities, agg: distinct_count, field: entity_id, windows: [1m], max_exact: 4}
`

// compileGroups compiles groupsDefinition: its decoder, and its groups' specs
// (the in-place one first).
func compileGroups(t *testing.T) (*definition.Compiled, []definition.GroupSpec) {
	t.Helper()
	d, err := definition.Parse("groups.yaml", []byte(groupsDefinition))
	if err != nil {
		t.Fatal(err)
	}
	comp, err := definition.Compile(d, "", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	specs, err := definition.EngineSpecs(d)
	if err != nil {
		t.Fatal(err)
	}
	return comp, specs
}

// TestRekeyedGroupThroughTheService runs a first-stage service and a second-stage
// service over a real group protocol (kfake), with idle release on, and the input
// produced then left quiet: the group's topic ends up with one row per accepted
// record with a currency, each the same bytes as the in-process two stages compute,
// which only the first stage's idle markers can release at the end of the input.
// Every hop record on the repartition topic is where its key says.
func TestRekeyedGroupThroughTheService(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) { testRekeyedGroup(t, eos) })
	}
}

// twoStages is a re-keyed group ("cur", keyed by currency) run by two services
// on a fake cluster: the input's first stage and the group's second stage.
type twoStages struct {
	brokers            []string
	comp               *definition.Compiled
	specs              []definition.GroupSpec
	hops               []pipeline.HopGroup
	repTopic, groupOut string
	first, second      Config
	firstSvc           *Service
}

// startTwoStages produces st to a new fake cluster of the given partitions and
// starts both stages over it, in the given mode, with an allowed lateness of
// 500 ms (so a lease of 1 s) and the given idle timeout.
func startTwoStages(t *testing.T, partitions int, st streamtest.Stream, eos bool, idle time.Duration) *twoStages {
	t.Helper()
	ts := &twoStages{brokers: newCluster(t, partitions), repTopic: "__velocity-repartition-g-cur", groupOut: "features.cur"}
	produce(t, ts.brokers, st.Records)
	ts.comp, ts.specs = compileGroups(t)
	ts.hops = []pipeline.HopGroup{{Name: "cur", Topic: ts.repTopic, Words: ts.specs[1].Spec.Words()}}
	store := checkpoint.NewMemoryStore()
	first := testConfig(t, ts.brokers, store)
	first.Specs, first.Features, first.Decoder, first.Hops = slices.Clone(ts.specs[0].Spec.Windows), ts.specs[0].Spec, ts.comp.Decoder(), ts.hops
	first.Watermark = watermark.Config{AllowedLateness: 500, IdleTimeout: idle}
	first.ExactlyOnce = eos
	second := testConfig(t, ts.brokers, store)
	second.Group, second.InputTopic, second.OutputTopic = "g.cur", ts.repTopic, ts.groupOut
	second.Specs, second.Features, second.Merge = slices.Clone(ts.specs[1].Spec.Windows), ts.specs[1].Spec, &MergeGroup{Name: "cur"}
	second.ExactlyOnce, second.Host = eos, "second"
	ts.first, ts.second = first, second
	ts.firstSvc, _ = startService(t, first)
	startService(t, second)
	return ts
}

func testRekeyedGroup(t *testing.T, eos bool) {
	const partitions = 3
	st := streamtest.Generate(inTopic, 5, 2000, partitions)
	ts := startTwoStages(t, partitions, st, eos, 400*time.Millisecond)
	brokers, comp, specs, hops, repTopic, groupOut := ts.brokers, ts.comp, ts.specs, ts.hops, ts.repTopic, ts.groupOut
	first, second := ts.first, ts.second

	// The in-process two stages over the same records: the expected rows.
	want := map[streamtest.Source][]byte{}
	var firsts [partitions]*pipeline.Processor
	var seconds [partitions]*pipeline.Processor
	var err error
	for p := range int32(partitions) {
		if firsts[p], err = pipeline.New(pipeline.Config{Topic: inTopic, Partition: p, Specs: first.Specs, Watermark: watermark.Config{AllowedLateness: 500},
			Decoder: comp.Decoder(), Features: specs[0].Spec, Hops: &pipeline.HopConfig{Groups: hops, Partitions: partitions}}, 0); err != nil {
			t.Fatal(err)
		}
		if seconds[p], err = pipeline.New(pipeline.Config{Topic: repTopic, Partition: p, Specs: second.Specs, Features: specs[1].Spec,
			Merge: &pipeline.MergeConfig{Group: "cur", Sources: partitions}}, 0); err != nil {
			t.Fatal(err)
		}
	}
	var off int64
	collect := func(o *pipeline.Output) {
		if o.Dead {
			t.Fatalf("in-process second stage dead-lettered %s/%d: %s", o.Reason, o.SourceOffset, o.Err)
		}
		want[streamtest.Source{Partition: o.SourcePartition, Offset: o.SourceOffset}] = bytes.Clone(o.Value)
	}
	route := func(o *pipeline.Output) {
		if o.Hop {
			seconds[o.Partition].Process(pipeline.Record{Topic: repTopic, Partition: o.Partition, Offset: off, Value: o.Value}, collect)
			off++
		}
	}
	next := map[int32]int64{}
	for _, r := range st.Records {
		firsts[r.Partition].Process(pipeline.Record{Topic: inTopic, Partition: r.Partition, Offset: next[r.Partition], Key: r.Key, Value: r.Value}, route)
		next[r.Partition]++
	}
	for p := range firsts {
		firsts[p].Flush(route)
		firsts[p].EndOfInput(route)
	}
	if len(want) < 500 {
		t.Fatalf("only %d rows expected: the stream does not exercise the group", len(want))
	}

	// The group's topic, read_committed.
	spec := specs[1].Spec
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(groupOut, repTopic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	got := map[streamtest.Source][]byte{}
	copies := 0
	var dec repartition.Decoder
	var rec repartition.Record
	var head feature.Head
	row := feature.NewRow(spec)
	for len(got) < len(want) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d rows of %s: %v", len(got), len(want), groupOut, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic == repTopic {
				if err := dec.Decode(r.Value, &rec); err != nil {
					t.Fatalf("repartition record %d/%d: %v", r.Partition, r.Offset, err)
				}
				if rec.Kind == repartition.KindEvent && repartition.PartitionFor(rec.Key, partitions) != r.Partition {
					t.Fatalf("hop of key %q on repartition partition %d, murmur2 says %d", rec.Key, r.Partition, repartition.PartitionFor(rec.Key, partitions))
				}
				return
			}
			if err := feature.ParseRow(r.Value, spec, &head, row); err != nil {
				t.Fatal(err)
			}
			k := streamtest.Source{Partition: head.SourcePartition, Offset: head.SourceOffset}
			if prev, ok := got[k]; ok {
				copies++
				if !bytes.Equal(prev, r.Value) {
					t.Fatalf("%v published twice with different values", k)
				}
			}
			got[k] = r.Value
		})
	}
	for k, v := range want {
		if !bytes.Equal(got[k], v) {
			t.Fatalf("input %v: the services published another row than the in-process stages", k)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows for %d expected", len(got), len(want))
	}
	if eos && copies > 0 {
		t.Fatalf("%d rows read twice under exactly-once", copies)
	}
}

// TestExactlyOnceFirstStageCommitsIdleChangesAtOnce: under exactly-once a first
// stage's hop records reach its second stages only when its transaction commits.
// With a checkpoint interval of four minutes, the idle declaration, and then the
// first records after it (with records arriving every 100 ms, so that the
// partition is never idle again), are still committed at once: the second stages
// do not wait an interval for a quiet partition, and a partition that wakes up is
// not left out of the order (its events overtaken by the other sources' commits)
// for one. Before the change neither was committed within the test's minute.
func TestExactlyOnceFirstStageCommitsIdleChangesAtOnce(t *testing.T) {
	const partitions = 2
	brokers, repTopic, st, cl := startExactlyOnceFirstStage(t, partitions, checkpoint.NewMemoryStore())
	var dec repartition.Decoder
	var rec repartition.Record
	idle := map[int32]bool{}
	events := map[streamtest.Source]bool{}
	read := func(what string, done func() bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for !done() {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("no committed %s on %s within a minute (checkpoint interval 4 min)", what, repTopic)
			}
			fs.EachRecord(func(r *kgo.Record) {
				if err := dec.Decode(r.Value, &rec); err != nil {
					t.Fatalf("repartition record %d/%d: %v", r.Partition, r.Offset, err)
				}
				switch {
				case rec.Kind == repartition.KindMarker && rec.Idle:
					idle[rec.Source] = true
				case rec.Kind == repartition.KindEvent:
					events[streamtest.Source{Partition: rec.Source, Offset: rec.Offset}] = true
				}
			})
		}
	}
	read("idle marker from every input partition", func() bool { return len(idle) == partitions })
	if len(events) == 0 {
		t.Fatal("the idle declaration's commit carried none of the input's hop records")
	}

	// Wake partition 0 with one more record: a new event, with a currency, after
	// everything so far (so accepted, and hopped).
	var n0, newest int64
	for _, r := range st.Records {
		if r.Partition == 0 {
			n0++
		}
	}
	for _, evs := range st.ByPart {
		for _, e := range evs {
			newest = max(newest, e.Time)
		}
	}
	// Then keep it busy, a record every 100 ms, so that it is never idle again:
	// only the wake-up's own commit can make the first record visible.
	stop := make(chan struct{})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; ; i++ {
			id := fmt.Sprintf("wake-%d", i)
			v := codec.EncodeTransaction(&codec.Transaction{EventID: id, EntityID: "e-wake", AmountMinor: 100, Currency: "EUR", EventTime: newest + 10_000 + int64(i)})
			produce(t, brokers, []*kgo.Record{{Topic: inTopic, Partition: 0, Key: []byte("e-wake"), Value: v}})
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	woke := streamtest.Source{Partition: 0, Offset: n0}
	read(fmt.Sprintf("hop record of the record that woke partition 0 (offset %d)", n0), func() bool { return events[woke] })
	close(stop)
	<-produced
}

// TestSecondStageCommitsAnIntervalWithoutOutputs: a re-keyed group's second
// stage whose repartition partition brings only markers (a group keyed by a
// field of few values leaves most repartition partitions without events; the
// sources' watermarks still reach every one of them) publishes nothing, and
// under exactly-once it also committed nothing: a transaction holding only an
// offset commit was never ended, so the checkpoint was skipped whole. Its
// committed offset and its snapshot stayed where its last output left them
// (forever, here), velocity_checkpoint_age_seconds grew without bound (the
// VelocityCheckpointStale alert), and a restart re-read every marker since, or
// reported the ones retention deleted as input never counted. Both modes now
// commit such an interval: the group's committed offset reaches the end of the
// partition. Then an event, released by the markers after it, is published
// (once, read_committed) and committed with them: the transactional producer
// goes on after those commits (under transactions v2 the broker bumps its
// epoch at each one, and the service replaces it).
func TestSecondStageCommitsAnIntervalWithoutOutputs(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) {
			const partitions, markers = 2, 40
			repTopic, groupOut := "__velocity-repartition-g-cur", "features.cur"
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, repTopic, groupOut, dlqTopic))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			brokers := c.ListenAddrs()
			_, specs := compileGroups(t)
			second := testConfig(t, brokers, checkpoint.NewMemoryStore())
			second.Group, second.InputTopic, second.OutputTopic = "g.cur", repTopic, groupOut
			second.Specs, second.Features, second.Merge = slices.Clone(specs[1].Spec.Windows), specs[1].Spec, &MergeGroup{Name: "cur"}
			second.ExactlyOnce, second.Host = eos, "second"
			svc, _ := startService(t, second)

			// Markers of both sources, watermarks rising, to repartition
			// partition 0, and no event.
			var recs []*kgo.Record
			for i := range markers {
				v, err := repartition.AppendRecord(nil, &repartition.Record{Kind: repartition.KindMarker, Epoch: 1,
					Watermark: streamtest.Base + int64(i)*1000, Event: repartition.Event{Source: int32(i % partitions)}})
				if err != nil {
					t.Fatal(err)
				}
				recs = append(recs, &kgo.Record{Topic: repTopic, Partition: 0, Value: v})
			}
			produce(t, brokers, recs)
			adm := kadm.NewClient(newClient(t, brokers))
			committedTo := func(end int64) {
				t.Helper()
				waitFor(t, fmt.Sprintf("group %s to commit offset %d of %s/0", second.Group, end, repTopic), 30*time.Second, func() bool {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					offs, err := adm.FetchOffsets(ctx, second.Group)
					if err != nil {
						return false
					}
					o, ok := offs.Lookup(repTopic, 0)
					return ok && o.Err == nil && o.At == end
				})
			}
			committedTo(markers)

			at := streamtest.Base + markers*1000
			ev, err := repartition.AppendRecord(nil, &repartition.Record{Kind: repartition.KindEvent, Epoch: 1, Watermark: at,
				Event: repartition.Event{Source: 0, Offset: 7, EventTime: at, Topic: "tx", Key: "EUR", EventID: "e-1", Amount: 100,
					Ext: make([]uint64, specs[1].Spec.Words())}})
			if err != nil {
				t.Fatal(err)
			}
			recs = []*kgo.Record{{Topic: repTopic, Partition: 0, Key: []byte("EUR"), Value: ev}}
			for src := range int32(partitions) {
				v, err := repartition.AppendRecord(nil, &repartition.Record{Kind: repartition.KindMarker, Epoch: 1, Watermark: at + 1000, Event: repartition.Event{Source: src}})
				if err != nil {
					t.Fatal(err)
				}
				recs = append(recs, &kgo.Record{Topic: repTopic, Partition: 0, Value: v})
			}
			produce(t, brokers, recs)
			committedTo(markers + 3)
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(groupOut), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rows := 0
			for rows == 0 {
				fs := cl.PollFetches(ctx)
				if ctx.Err() != nil {
					t.Fatalf("no row of the event on %s (read_committed) within 30 s", groupOut)
				}
				rows += fs.NumRecords()
			}
			if rows != 1 {
				t.Fatalf("%d rows for one event", rows)
			}
			if err := svc.Healthy(); err != nil {
				t.Fatalf("stopped: %v", err)
			}
			if n := testutil.ToFloat64(svc.m.TxnPartitionsLost); n != 0 {
				t.Fatalf("velocity_txn_partitions_lost_total = %v, want 0", n)
			}
		})
	}
}

// countingStore is a memory store that counts its Saves.
type countingStore struct {
	*checkpoint.MemoryStore
	saves atomic.Int64
}

func (s *countingStore) Save(ctx context.Context, key checkpoint.Key, snap checkpoint.Snapshot) error {
	s.saves.Add(1)
	return s.MemoryStore.Save(ctx, key, snap)
}

// TestExactlyOnceLeaseRenewalsCommitWithoutSnapshots: a quiet input partition of a
// re-keyed group's first stage renews its idle declaration every quarter of its
// lease (docs/repartition.md), and under exactly-once each renewal must be
// committed to reach the second stages before the lease runs out. A renewal is
// markers only, no state: it commits the last snapshot's offset again, and takes no
// snapshot. Before commitMarkers each renewal was a full checkpoint, four snapshots
// a second per quiet partition (a partition with a large state would write it that
// often while it had nothing to do).
func TestExactlyOnceLeaseRenewalsCommitWithoutSnapshots(t *testing.T) {
	store := &countingStore{MemoryStore: checkpoint.NewMemoryStore()}
	_, _, _, cl := startExactlyOnceFirstStage(t, 2, store)
	var dec repartition.Decoder
	var rec repartition.Record
	// Idle markers per input partition, as one repartition partition sees them
	// (every declaration and renewal goes to each).
	idle := map[int32]int{}
	var savesAtDeclaration int64
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for idle[0] < 8 || idle[1] < 8 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("committed idle markers %v within a minute; want 8 a partition (a declaration and its renewals every 250 ms)", idle)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Partition != 0 {
				return
			}
			if err := dec.Decode(r.Value, &rec); err != nil {
				t.Fatalf("repartition record %d/%d: %v", r.Partition, r.Offset, err)
			}
			if rec.Kind == repartition.KindMarker && rec.Idle {
				if rec.Lease != 1000 {
					t.Fatalf("idle marker with lease %d ms; want 1000 (the allowed lateness, at least 1 s)", rec.Lease)
				}
				idle[rec.Source]++
				if idle[0] >= 2 && idle[1] >= 2 && savesAtDeclaration == 0 {
					// Both declared, and renewed once: the declarations'
					// checkpoints are behind us.
					savesAtDeclaration = store.saves.Load()
				}
			}
		})
	}
	if n := store.saves.Load() - savesAtDeclaration; n > 0 {
		t.Fatalf("%d snapshots saved while %v idle markers were committed; a renewal changes no state and needs none", n, idle)
	}
}

// startExactlyOnceFirstStage starts, on a fake cluster of the given partitions,
// a re-keyed group's first stage under exactly-once (one group, "cur"; allowed
// lateness 500 ms, so a lease of 1 s; idle timeout 300 ms; a checkpoint interval
// of 4 minutes, so that only the commits made at once show within a test) over
// a generated input, and a read_committed client of its repartition topic.
func startExactlyOnceFirstStage(t *testing.T, partitions int, store checkpoint.Store) (brokers []string, repTopic string, st streamtest.Stream, cl *kgo.Client) {
	t.Helper()
	brokers = newCluster(t, partitions)
	comp, specs := compileGroups(t)
	repTopic = "__velocity-repartition-g-cur"
	first := testConfig(t, brokers, store)
	first.Specs, first.Features, first.Decoder = slices.Clone(specs[0].Spec.Windows), specs[0].Spec, comp.Decoder()
	first.Hops = []pipeline.HopGroup{{Name: "cur", Topic: repTopic, Words: specs[1].Spec.Words()}}
	first.Watermark = watermark.Config{AllowedLateness: 500, IdleTimeout: 300 * time.Millisecond}
	first.ExactlyOnce, first.CheckpointInterval = true, 4*time.Minute // the transaction timeout, 3 intervals, stays under the broker's 15 min
	st = streamtest.Generate(inTopic, 5, 200, partitions)
	produce(t, brokers, st.Records)
	startService(t, first)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(repTopic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return brokers, repTopic, st, cl
}

// TestLeaseRenewalsWaitForInput: a first stage renews its idle lease only while
// the input topic is active (worker.renewalsWanted). Over a re-keyed group on a
// fake cluster, once the input has been processed, committed and left quiet,
// the repartition topic stops receiving idle markers after the hold (a quiet
// deployment writes nothing); a record produced then to one partition still gets
// its row in the group's topic, which the second stage releases only once the
// other partitions' leases hold again: their renewals start again at the
// record's arrival. Before the change the markers came every quarter lease for
// as long as the input stayed quiet.
func TestLeaseRenewalsWaitForInput(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) { testLeaseRenewalsWaitForInput(t, eos) })
	}
}

func testLeaseRenewalsWaitForInput(t *testing.T, eos bool) {
	const partitions = 3
	st := streamtest.Generate(inTopic, 7, 300, partitions)
	ts := startTwoStages(t, partitions, st, eos, 300*time.Millisecond)
	brokers, specs, repTopic, groupOut, svc := ts.brokers, ts.specs, ts.repTopic, ts.groupOut, ts.firstSvc

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(groupOut, repTopic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var dec repartition.Decoder
	var rec repartition.Record
	var head feature.Head
	row := feature.NewRow(specs[1].Spec)
	lastIdle := map[int32]time.Time{} // when an idle marker of each source was last read
	rows := map[streamtest.Source]bool{}
	poll := func(ctx context.Context) {
		fs := cl.PollFetches(ctx)
		now := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic == repTopic {
				if err := dec.Decode(r.Value, &rec); err != nil {
					t.Fatalf("repartition record %d/%d: %v", r.Partition, r.Offset, err)
				}
				if rec.Kind == repartition.KindMarker && rec.Idle {
					lastIdle[rec.Source] = now
				}
				return
			}
			if err := feature.ParseRow(r.Value, specs[1].Spec, &head, row); err != nil {
				t.Fatal(err)
			}
			rows[streamtest.Source{Partition: head.SourcePartition, Offset: head.SourceOffset}] = true
		})
	}

	// Quiet: the markers stop once the hold has passed since the input was last
	// found active. A gap of two leases with no idle marker at all shows it.
	hold := svc.renewalHold()
	ctx, cancel := context.WithTimeout(context.Background(), hold+40*time.Second)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		poll(pctx)
		pcancel()
		if ctx.Err() != nil {
			t.Fatalf("idle markers still arriving %v after the input went quiet (last per source: %v); want none after the hold of %v", hold+40*time.Second, lastIdle, hold)
		}
		if len(lastIdle) == partitions {
			var latest time.Time
			for _, at := range lastIdle {
				if at.After(latest) {
					latest = at
				}
			}
			if time.Since(latest) > 2*time.Second {
				break
			}
		}
	}
	quietSince := time.Now()

	// One record to partition 0, newer than everything: its row needs the
	// other sources declared idle again at the second stage.
	newest := int64(0)
	for _, evs := range st.ByPart {
		for _, e := range evs {
			newest = max(newest, e.Time)
		}
	}
	tx := codec.Transaction{EventID: "after-the-quiet", EntityID: "card-after", AmountMinor: 100, Currency: "EUR", EventTime: newest + 10_000}
	produce(t, brokers, []*kgo.Record{{Topic: inTopic, Partition: 0, Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)}})
	want := streamtest.Source{Partition: 0, Offset: int64(len(st.ByPart[0]))}
	for !rows[want] {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		poll(pctx)
		pcancel()
		if ctx.Err() != nil {
			t.Fatalf("no row for the record produced after the quiet spell (%v) in %s; idle markers last read per source: %v", want, groupOut, lastIdle)
		}
	}
	for p := int32(1); p < partitions; p++ {
		if !lastIdle[p].After(quietSince) {
			t.Fatalf("source %d: no idle marker since the input was quiet, yet the row was released", p)
		}
	}
}
