//go:build integration

package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

// TestBrokerIsRealKafka checks that the harness hands out a KRaft Apache Kafka broker
// that finalizes metadata.version (an in-process fake does not), and logs what it is.
func TestBrokerIsRealKafka(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	adm := kafkatest.Admin(t, addr)
	ctx := kafkatest.Context(t, 30*time.Second)

	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		t.Fatalf("metadata from %s: %v", addr, err)
	}
	vs, err := adm.ApiVersions(ctx)
	if err != nil {
		t.Fatalf("api versions from %s: %v", addr, err)
	}
	for _, v := range vs.Sorted() {
		if v.Err != nil {
			t.Fatalf("api versions from node %d: %v", v.NodeID, v.Err)
		}
		raw := v.Raw()
		level := int16(-1)
		for _, f := range raw.FinalizedFeatures {
			if f.Name == "metadata.version" {
				level = f.MaxVersionLevel
			}
		}
		if level < 0 {
			t.Fatalf("node %d finalizes no metadata.version: not a KRaft Apache Kafka broker", v.NodeID)
		}
		t.Logf("node %d: Apache Kafka %s, cluster %s, metadata.version level %d",
			v.NodeID, v.VersionGuess(), md.Cluster, level)
	}
}

// TestOldRecordsStay: test streams carry fixed event times, weeks behind the wall
// clock, as their records' timestamps, so a topic under the default 7-day retention
// loses them at the broker's next retention check, mid-test (a replay then fails with
// OFFSET_OUT_OF_RANGE at offsets it listed a moment before). Both the harness's topics
// and the topics the service creates, with the broker's defaults, must keep them.
func TestOldRecordsStay(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	adm := kafkatest.Admin(t, addr)
	ctx := kafkatest.Context(t, 30*time.Second)

	harness := kafkatest.CreateTopic(t, addr, 1, nil)
	own := kafkatest.CreateTopic(t, addr, 1, map[string]string{"retention.ms": "3600000"})
	brokerDefault := kafkatest.Topic(t)
	if _, err := adm.CreateTopic(ctx, 1, -1, nil, brokerDefault); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopic(context.Background(), brokerDefault) })

	cfgs, err := adm.DescribeTopicConfigs(ctx, harness, own, brokerDefault)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{harness: "-1", own: "3600000", brokerDefault: "-1"}
	for _, rc := range cfgs {
		if rc.Err != nil {
			t.Fatalf("describe %s: %v", rc.Name, rc.Err)
		}
		got := "unset"
		for _, c := range rc.Configs {
			if c.Key == "retention.ms" && c.Value != nil {
				got = *c.Value
			}
		}
		if got != want[rc.Name] {
			t.Errorf("topic %s: retention.ms %s, want %s (the broker's log.retention.ms must be -1, as scripts/kafka-local.sh sets it)", rc.Name, got, want[rc.Name])
		}
	}
}

// TestProduceConsumeAcrossPartitions produces keyed records to a topic with several
// partitions and reads them back with a consumer group: every record arrives once, each
// key stays on one partition, offsets rise within a partition, and the group's committed
// offsets reach the end of every partition.
func TestProduceConsumeAcrossPartitions(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	const partitions, keys, perKey = 4, 20, 10
	topic := kafkatest.CreateTopic(t, addr, partitions, nil)
	group := kafkatest.Group(t)

	prod := kafkatest.Client(t, addr, kgo.DefaultProduceTopic(topic))
	ctx := kafkatest.Context(t, 60*time.Second)
	var recs []*kgo.Record
	for i := range perKey {
		for k := range keys {
			recs = append(recs, kgo.KeyStringRecord(fmt.Sprintf("entity-%02d", k), fmt.Sprintf("%02d/%02d", k, i)))
		}
	}
	if err := kafkatest.Produce(ctx, prod, recs...); err != nil {
		t.Fatalf("produce %d records to %s: %v", len(recs), topic, err)
	}

	cons := kafkatest.Client(t, addr,
		kgo.ConsumeTopics(topic),
		kgo.ConsumerGroup(group),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	seen := map[string]bool{}
	keyPartition := map[string]int32{}
	lastOffset := map[int32]int64{}
	for len(seen) < len(recs) {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records before the deadline: %v", len(seen), len(recs), err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			v := string(r.Value)
			if seen[v] {
				t.Errorf("record %q delivered twice", v)
			}
			seen[v] = true
			k := string(r.Key)
			if p, ok := keyPartition[k]; ok && p != r.Partition {
				t.Errorf("key %s on partitions %d and %d", k, p, r.Partition)
			}
			keyPartition[k] = r.Partition
			if last, ok := lastOffset[r.Partition]; ok && r.Offset <= last {
				t.Errorf("partition %d: offset %d after %d", r.Partition, r.Offset, last)
			}
			lastOffset[r.Partition] = r.Offset
		})
	}
	if len(lastOffset) < 2 {
		t.Errorf("records landed on %d partition(s); %d keys over %d partitions should spread", len(lastOffset), keys, partitions)
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit offsets of group %s: %v", group, err)
	}

	adm := kafkatest.Admin(t, addr)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("committed offsets of %s: %v", group, err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		c, ok := committed.Lookup(topic, o.Partition)
		if !ok || c.At != o.Offset {
			t.Errorf("partition %d: committed %v, end offset %d", o.Partition, c.At, o.Offset)
		}
	})
}

// TestTransactionsReadCommitted writes a committed, an aborted and a second committed
// transaction: a read_committed consumer sees exactly the committed records in order, a
// read_uncommitted one also sees the aborted records (so they did reach the log).
func TestTransactionsReadCommitted(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	topic := kafkatest.CreateTopic(t, addr, 1, nil)
	ctx := kafkatest.Context(t, 90*time.Second)

	prod := kafkatest.Client(t, addr,
		kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID(kafkatest.TransactionalID(t)),
	)
	txn := func(prefix string, n int, end kgo.TransactionEndTry) {
		t.Helper()
		if err := prod.BeginTransaction(); err != nil {
			t.Fatalf("begin transaction: %v", err)
		}
		for i := range n {
			r := kgo.KeyStringRecord("k", fmt.Sprintf("%s-%d", prefix, i))
			if err := kafkatest.Produce(ctx, prod, r); err != nil {
				t.Fatalf("produce %s-%d in a transaction: %v", prefix, i, err)
			}
		}
		if err := prod.EndTransaction(ctx, end); err != nil {
			t.Fatalf("end transaction (%s, commit=%v): %v", prefix, end, err)
		}
	}
	txn("committed", 5, kgo.TryCommit)
	txn("aborted", 3, kgo.TryAbort)
	txn("later", 2, kgo.TryCommit)

	// Both transactions that commit frame the aborted one, so by the time "later-1" is read
	// every aborted record that a reader would ever see has been delivered.
	read := func(level kgo.IsolationLevel) []string {
		cl := kafkatest.Client(t, addr,
			kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(level),
		)
		var got []string
		for !slices.Contains(got, "later-1") {
			fs := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				t.Fatalf("read %v before the deadline: %v", got, err)
			}
			fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", tp, p, err) })
			fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
		}
		return got
	}
	want := []string{"committed-0", "committed-1", "committed-2", "committed-3", "committed-4", "later-0", "later-1"}
	if got := read(kgo.ReadCommitted()); !slices.Equal(got, want) {
		t.Errorf("read_committed saw %v, want %v", got, want)
	}
	uncommitted := read(kgo.ReadUncommitted())
	var aborted int
	for _, v := range uncommitted {
		if strings.HasPrefix(v, "aborted-") {
			aborted++
		}
	}
	if aborted != 3 {
		t.Errorf("read_uncommitted saw %d aborted records (%v), want 3", aborted, uncommitted)
	}
}

// TestBrokerLossFailsFast starts a broker of its own, freezes it (SIGSTOP: connections
// stay open, nothing answers, the case that hangs clients without deadlines), then kills
// it, and checks that produce and fetch calls made through kafkatest's clients and
// contexts return errors within their deadlines instead of blocking.
func TestBrokerLossFailsFast(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	b := kafkatest.StartPrivateBroker(t)
	t.Logf("private broker at %s up in %v", b.Addr, time.Since(t0).Round(time.Millisecond))
	topic := kafkatest.CreateTopic(t, b.Addr, 1, nil)
	prod := kafkatest.Client(t, b.Addr, kgo.DefaultProduceTopic(topic), kgo.RecordDeliveryTimeout(5*time.Second))
	cons := kafkatest.Client(t, b.Addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err := kafkatest.Produce(kafkatest.Context(t, 30*time.Second), prod, kgo.StringRecord("before")); err != nil {
		t.Fatalf("produce while the broker is up: %v", err)
	}

	const bound = 5 * time.Second
	check := func(state string) {
		t.Helper()
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			start := time.Now()
			err := kafkatest.Produce(ctx, prod, kgo.StringRecord("after"))
			took := time.Since(start)
			if err == nil {
				t.Errorf("produce to a %s broker succeeded", state)
			} else if took > bound+2*time.Second {
				t.Errorf("produce to a %s broker took %v to fail (bound %v)", state, took, bound)
			} else {
				t.Logf("produce to a %s broker failed after %v: %v", state, took.Round(time.Millisecond), err)
			}
		}()
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			start := time.Now()
			for ctx.Err() == nil {
				cons.PollFetches(ctx)
			}
			if took := time.Since(start); took > bound+2*time.Second {
				t.Errorf("fetching from a %s broker returned after %v (bound %v)", state, took, bound)
			}
		}()
		wg.Wait()
	}

	b.Freeze(t)
	check("frozen")
	b.Kill(t)
	check("killed")

	adm := kafkatest.Admin(t, b.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if _, err := adm.BrokerMetadata(ctx); err == nil {
		t.Errorf("metadata from a killed broker succeeded")
	}
}
