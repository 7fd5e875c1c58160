// Package streamtest generates input streams for end-to-end tests of the live
// service and checks what comes out of its topics against internal/oracle.
// For feature definitions it generates streams in users' own schemas (card
// streams; payment streams with device and IP keys for re-keyed groups), runs
// the independent reference (integration/reference/features_reference.py) over
// them and compares a run's or replay's rows with it, group by group.
//
// It is shared by the in-process (kfake) tests of pkg/service and the
// integration tests on a real broker, so both hold the service to the same
// definition of right. It is for tests only.
package streamtest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/oracle"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Base is the event time the generated streams start at.
var Base = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// Stream is a generated input: the records to produce (with explicit
// partitions) and, per partition, the oracle's view of them in offset order.
type Stream struct {
	Topic   string
	ByPart  map[int32][]oracle.Event
	Records []*kgo.Record
}

// Generate makes n transactions over 40 entities with out-of-order jitter, late
// events, resends of earlier ids on the same partition and invalid amounts.
// Entities are pinned to partitions the way a keyed producer pins them.
func Generate(topic string, seed uint64, n, partitions int) Stream {
	rng := rand.New(rand.NewPCG(seed, 3))
	s := Stream{Topic: topic, ByPart: map[int32][]oracle.Event{}}
	now := Base
	type sentID struct {
		part int32
		id   string
	}
	var sent []sentID
	for i := range n {
		now += rng.Int64N(300)
		entity := fmt.Sprintf("card-%d", rng.IntN(40))
		part := int32(len(entity)+int(entity[len(entity)-1])) % int32(partitions)
		tx := codec.Transaction{EventID: fmt.Sprintf("id-%d-%d", seed, i), EntityID: entity, AmountMinor: rng.Int64N(50_000), Currency: "EUR", EventTime: now}
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
		s.Records = append(s.Records, &kgo.Record{Topic: topic, Partition: part, Key: []byte(entity), Value: codec.EncodeTransaction(&tx)})
		sent = append(sent, sentID{part, tx.EventID})
		off := int64(len(s.ByPart[part]))
		s.ByPart[part] = append(s.ByPart[part], oracle.Event{Offset: off, Time: tx.EventTime, Amount: tx.AmountMinor, ID: tx.EventID, Entity: entity, Invalid: invalid})
	}
	return s
}

// Source is an input position.
type Source struct {
	Partition int32
	Offset    int64
}

// Output is one record read back from the output or dead-letter topic.
type Output struct {
	Dead   bool
	Reason string
	Value  []byte
}

// ReadOutputs reads the features and dead-letter topics from the start with a
// client made from opts (seed brokers included) until want source offsets are
// accounted for or deadline passes. Each record is checked for the contract's
// key and headers as it is read.
func ReadOutputs(t testing.TB, inTopic, outTopic, dlqTopic string, want int, deadline time.Duration, opts ...kgo.Opt) map[Source][]Output {
	t.Helper()
	opts = append([]kgo.Opt{kgo.ConsumeTopics(outTopic, dlqTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted())}, opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[Source][]Output{}
	for end := time.Now().Add(deadline); len(got) < want && time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			var s Source
			o := Output{Value: r.Value}
			if r.Topic == outTopic {
				f, err := codec.DecodeFeatures(r.Value)
				if err != nil {
					t.Errorf("undecodable features record: %v", err)
					return
				}
				if string(r.Key) != f.EntityID {
					t.Errorf("features key %q for entity %q", r.Key, f.EntityID)
				}
				s = Source{f.SourcePartition, f.SourceOffset}
			} else {
				o.Dead = true
				h := map[string]string{}
				for _, kv := range r.Headers {
					h[kv.Key] = string(kv.Value)
				}
				p, _ := strconv.Atoi(h[codec.HeaderSourcePartition])
				off, _ := strconv.ParseInt(h[codec.HeaderSourceOffset], 10, 64)
				s = Source{int32(p), off}
				o.Reason = h[codec.HeaderReason]
				if h[codec.HeaderSourceTopic] != inTopic || h[codec.HeaderError] == "" {
					t.Errorf("dead letter headers incomplete: %v", h)
				}
			}
			got[s] = append(got[s], o)
		})
	}
	return got
}

// Check compares outputs with the oracle: every input offset accounted for,
// each output equal to the oracle's bytes, and any repeated output
// byte-identical to the first. With exactlyOnce, no offset may repeat.
func Check(t testing.TB, st Stream, specs []window.Spec, got map[Source][]Output, exactlyOnce bool) {
	t.Helper()
	total := 0
	for p, evs := range st.ByPart {
		total += len(evs)
		want := oracle.Compute(oracle.Config{Specs: specs, Topic: st.Topic, Partition: p}, evs)
		for off, w := range want {
			outs := got[Source{p, off}]
			if len(outs) == 0 {
				t.Fatalf("partition %d offset %d: no output (accounting invariant broken)", p, off)
			}
			if exactlyOnce && len(outs) != 1 {
				t.Fatalf("partition %d offset %d: %d outputs", p, off, len(outs))
			}
			for _, o := range outs[1:] {
				if !bytes.Equal(o.Value, outs[0].Value) || o.Dead != outs[0].Dead {
					t.Fatalf("partition %d offset %d: repeated output differs", p, off)
				}
			}
			o := outs[0]
			if o.Dead != w.Dead || o.Reason != string(w.Reason) {
				t.Fatalf("partition %d offset %d: dead=%v %q, want dead=%v %q", p, off, o.Dead, o.Reason, w.Dead, w.Reason)
			}
			if !w.Dead {
				if wantBytes := codec.AppendFeatures(nil, &w.Features); !bytes.Equal(o.Value, wantBytes) {
					f, _ := codec.DecodeFeatures(o.Value)
					t.Fatalf("partition %d offset %d:\n got  %+v\n want %+v", p, off, f, w.Features)
				}
			}
		}
	}
	if len(got) != total {
		t.Fatalf("%d source offsets have output, %d were produced", len(got), total)
	}
}
