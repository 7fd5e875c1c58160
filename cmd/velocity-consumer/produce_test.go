package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

const examplesFile = "../../examples/transactions.jsonl"

// TestProduceExamples writes examples/transactions.jsonl to a new topic and
// reads it back: one record per line, in file order, each transaction as the
// plain Avro a producer writes (key = entity id), the line that is not one
// as its bytes; the topic is created with --partitions.
func TestProduceExamples(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	addr := cluster.ListenAddrs()[0]
	var p produceFlags
	e := newEnvFlags("produce", produceUsage)
	p.register(e)
	if err := e.Parse([]string{"--brokers", addr, "--topic", "tx", "--input-file", examplesFile}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runProduce(context.Background(), &p, &out); err != nil {
		t.Fatal(err)
	}
	if want := "produced 13 records from " + examplesFile + " to topic tx (created with 1 partition(s))"; !strings.Contains(out.String(), want) ||
		!strings.Contains(out.String(), "12 transactions, 1 lines that are not one") {
		t.Errorf("printed %q, want it to say %q and the split", out.String(), want)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("tx"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(recs) < 13 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	if len(recs) != 13 {
		t.Fatalf("read %d records back, want 13", len(recs))
	}
	dec, err := codec.NewDecoder("", codec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	wantIDs := []string{"e1", "e2", "e3", "e4", "e5", "e6", "e7", "e2", "e9", "e10", "e11", "e12"}
	for i, r := range recs[:12] {
		var tx codec.Transaction
		if rej := dec.Decode(r.Value, 0, false, &tx); rej != nil && rej.Reason == codec.ReasonDecode {
			t.Fatalf("offset %d: %v", i, rej)
		}
		if r.Partition != 0 || r.Offset != int64(i) || tx.EventID != wantIDs[i] || string(r.Key) != tx.EntityID {
			t.Errorf("record %d: p%d@%d key %q event %q entity %q; want p0@%d, event %s keyed by its entity", i, r.Partition, r.Offset, r.Key, tx.EventID, tx.EntityID, i, wantIDs[i])
		}
	}
	if last := recs[12]; last.Key != nil || !strings.Contains(string(last.Value), `"amount_minor":"12.50"`) {
		t.Errorf("last record key %q value %q, want no key and the line's bytes", last.Key, last.Value)
	}
}

func TestProduceFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "--input-file (VELOCITY_INPUT_FILE) is required"},
		{[]string{"--input-file", "x.avro"}, "want a .jsonl"},
		{[]string{"--input-file", examplesFile, "--partitions", "0"}, "--partitions"},
		{[]string{"--input-file", examplesFile, "--brokers", " "}, "--brokers"},
		{[]string{"--input-file", examplesFile, "--schema-registry", "http://r"}, "plain Avro only"},
	} {
		var p produceFlags
		e := newEnvFlags("produce", produceUsage)
		p.register(e)
		if err := e.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		if err := runProduce(context.Background(), &p, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}
