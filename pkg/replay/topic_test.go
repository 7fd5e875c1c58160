package replay

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// TestTopicSourceOnFakeCluster replays the worked example from a topic on
// franz-go's in-process cluster (kfake) and checks it gives the same features
// bytes, lineage aside, as the JSON-lines file; and reads offset ranges of a
// two-partition topic. The real broker's behaviour (time bounds, transactions)
// is checked in integration/replay_test.go.
func TestTopicSourceOnFakeCluster(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "tx"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Partition 0: the worked example; partition 1: 30 filler records.
	lines := readLines[struct {
		EventID     string `json:"event_id"`
		EntityID    string `json:"entity_id"`
		AmountMinor int64  `json:"amount_minor"`
		Currency    string `json:"currency"`
		EventTime   int64  `json:"event_time"`
	}](t, "testdata/examples.jsonl")
	var recs []*kgo.Record
	for _, l := range lines {
		tx := codec.Transaction{EventID: l.EventID, EntityID: l.EntityID, AmountMinor: l.AmountMinor, Currency: l.Currency, EventTime: l.EventTime}
		recs = append(recs, &kgo.Record{Topic: "tx", Partition: 0, Key: []byte(l.EntityID), Value: codec.EncodeTransaction(&tx)})
	}
	for i := range 30 {
		tx := codec.Transaction{EventID: "f" + strconv.Itoa(i), EntityID: "card-Z", AmountMinor: 1, EventTime: exampleT + int64(i)}
		recs = append(recs, &kgo.Record{Topic: "tx", Partition: 1, Key: []byte("card-Z"), Value: codec.EncodeTransaction(&tx)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	t.Run("examples match the file replay", func(t *testing.T) {
		src, err := OpenTopic(ctx, TopicConfig{Brokers: c.ListenAddrs(), Topic: "tx", Partitions: []int32{0}, From: Start, To: End})
		if err != nil {
			t.Fatal(err)
		}
		got := replayToMem(t, src)
		want := replayToMem(t, mustOpenJSONL(t, "testdata/examples.jsonl"))
		if len(got.features) != len(want.features) || len(got.dead) != len(want.dead) {
			t.Fatalf("%d features %d dead, want %d and %d", len(got.features), len(got.dead), len(want.features), len(want.dead))
		}
		for i := range want.features {
			w, g := want.features[i], got.features[i]
			if g.SourceTopic != "tx" {
				t.Errorf("source_topic %q, want tx", g.SourceTopic)
			}
			w.SourceTopic, g.SourceTopic = "", ""
			if !equalFeatures(w, g) {
				t.Errorf("features %d:\n got %+v\nwant %+v", i, g, w)
			}
		}
	})

	tests := []struct {
		name     string
		from, to Bound
		parts    []int32
		want     map[int32][2]int64 // first and last offset read; {0,-1} for none
	}{
		{"all of both partitions", Start, End, nil, map[int32][2]int64{0: {0, 11}, 1: {0, 29}}},
		{"offset range", OffsetBound(3), OffsetBound(9), nil, map[int32][2]int64{0: {3, 8}, 1: {3, 8}}},
		{"one partition, past the end clamped", OffsetBound(25), OffsetBound(1000), []int32{1}, map[int32][2]int64{1: {25, 29}}},
		{"empty range", OffsetBound(9), OffsetBound(9), []int32{0}, map[int32][2]int64{0: {0, -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, err := OpenTopic(ctx, TopicConfig{Brokers: c.ListenAddrs(), Topic: "tx", Partitions: tt.parts, From: tt.from, To: tt.to})
			if err != nil {
				t.Fatal(err)
			}
			if len(src.Partitions()) != len(tt.want) {
				t.Fatalf("partitions %v", src.Partitions())
			}
			prog := NewProgress(src)
			for _, p := range src.Partitions() {
				first, last := int64(0), int64(-1)
				n := 0
				err := src.Read(ctx, p, prog, func(r *Record) error {
					if n == 0 {
						first = r.Offset
					} else if r.Offset != last+1 {
						t.Errorf("partition %d: offset %d after %d", p, r.Offset, last)
					}
					last = r.Offset
					n++
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if got := [2]int64{first, last}; got != tt.want[p] {
					t.Errorf("partition %d: read %v, want %v", p, got, tt.want[p])
				}
			}
			if prog.Done.Load() != prog.Total.Load() {
				t.Errorf("progress %d of %d offsets at the end", prog.Done.Load(), prog.Total.Load())
			}
		})
	}

	if _, err := OpenTopic(ctx, TopicConfig{Brokers: c.ListenAddrs(), Topic: "missing", From: Start, To: End}); err == nil {
		t.Error("a topic that does not exist was opened")
	}

	// Retention deletes partition 1's first 5 records: a range or warm-up
	// that asks for them is truncated (the command warns), one that does not
	// is not.
	del, err := kadm.NewClient(cl).DeleteRecords(ctx, kadm.Offsets{"tx": {1: {Topic: "tx", Partition: 1, At: 5}}})
	if err == nil {
		err = del.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	warm3 := OffsetBound(3)
	for _, tt := range []struct {
		name      string
		from      Bound
		warm      *Bound
		wantFrom  int64
		truncated bool
	}{
		{"from before the log start", OffsetBound(2), nil, 5, true},
		{"from start", Start, nil, 5, false},
		{"from after the log start", OffsetBound(7), nil, 7, false},
		{"warm-up before the log start", OffsetBound(7), &warm3, 7, true},
	} {
		src, err := OpenTopic(ctx, TopicConfig{Brokers: c.ListenAddrs(), Topic: "tx", Partitions: []int32{1}, From: tt.from, To: End, WarmUpFrom: tt.warm})
		if err != nil {
			t.Fatal(err)
		}
		if r := src.Range(1); r.From != tt.wantFrom || r.Truncated != tt.truncated {
			t.Errorf("%s: range %+v, want from %d, truncated %v", tt.name, r, tt.wantFrom, tt.truncated)
		}
	}
}

// TestTopicSourceWithinAFetch: one fetch can hold a whole partition. The
// progress must move within it, and a cancellation must stop the read within
// it: otherwise a read that finishes the partition first lets a one-partition
// replay complete with exit 0 after Ctrl-C.
func TestTopicSourceWithinAFetch(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("big"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	const n = 20_000
	recs := make([]*kgo.Record, n)
	for i := range recs {
		tx := codec.Transaction{EventID: "e" + strconv.Itoa(i), EntityID: "card-" + strconv.Itoa(i%50), AmountMinor: 1, EventTime: exampleT + int64(i)}
		recs[i] = &kgo.Record{Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	src, err := OpenTopic(ctx, TopicConfig{Brokers: c.ListenAddrs(), Topic: "big", From: Start, To: End})
	if err != nil {
		t.Fatal(err)
	}

	prog := NewProgress(src)
	seen := 0
	var halfWay int64
	if err := src.Read(ctx, 0, prog, func(*Record) error {
		if seen++; seen == n/2 {
			halfWay = prog.Done.Load()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if halfWay == 0 || halfWay >= n || prog.Done.Load() != n {
		t.Errorf("progress %d half way (want some, not all), %d at the end (want %d)", halfWay, prog.Done.Load(), n)
	}

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seen = 0
	err = src.Read(cctx, 0, nil, func(*Record) error {
		if seen++; seen == 100 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || seen > 100+1024 {
		t.Errorf("cancelled at record 100: err %v after %d records, want context.Canceled within 1024 more", err, seen)
	}
}

// TestTopicSourceStalls: with the broker gone the client retries for ever;
// the read fails after StallTimeout with an error that says so, instead of
// hanging.
func TestTopicSourceStalls(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "tx"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("tx"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx := codec.Transaction{EventID: "e", EntityID: "card", AmountMinor: 1, EventTime: exampleT}
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("card"), Value: codec.EncodeTransaction(&tx)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	src, err := OpenTopic(ctx, TopicConfig{Brokers: c.ListenAddrs(), Topic: "tx", From: Start, To: End, StallTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	start := time.Now()
	err = src.Read(ctx, 0, nil, func(*Record) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "do not answer") || time.Since(start) > 10*time.Second {
		t.Fatalf("read from a broker that is gone: %v after %v, want the stall error after about 300ms", err, time.Since(start))
	}
}
