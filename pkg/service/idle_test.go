package service

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
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
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, inTopic, outTopic, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()

	// Fetches from offset 1 on sleep until hold is closed: the input's first
	// record is fetched, the second waits at the broker. (Fetches name topics
	// by id; the service fetches nothing else before hold closes.)
	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	c.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			for _, p := range tp.Partitions {
				if p.FetchOffset >= 1 {
					select {
					case <-hold:
					default:
						select {
						case held <- struct{}{}:
						default:
						}
						c.SleepControl(func() { <-hold })
					}
				}
			}
		}
		return nil, nil, false
	})

	const base = int64(1_795_000_000_000)
	rec := func(id string, t int64) *kgo.Record {
		return &kgo.Record{Topic: inTopic, Partition: 0, Key: []byte("card-1"), Timestamp: time.UnixMilli(t),
			Value: codec.EncodeTransaction(&codec.Transaction{EventID: id, EntityID: "card-1", AmountMinor: 100, Currency: "EUR", EventTime: t})}
	}
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

	got := readOutputs(t, brokers, 2, 60*time.Second)
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
	// Replay's: the older event (offset 1) first, alone; then the newer one
	// (offset 0) with both in its 10 s window.
	if want := map[int64]int64{0: 2, 1: 1}; counts[0] != want[0] || counts[1] != want[1] {
		t.Errorf("10s counts by input offset %v, want %v (as replay counts them)", counts, want)
	}
}
