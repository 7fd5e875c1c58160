package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// The floor processor (`floor` in --processors) is the transport ceiling for a consumer
// that writes one record per input record: it consumes the input like ours (a group,
// read_committed, the same fetch settings) and, for each input record, produces one
// record of the features' size with our producer settings (sink.ProducerOpts:
// idempotent, acks=all, lz4, 2 ms linger) to the input record's partition. It does no
// processing at all: no decode, no state, no encode; every output shares one constant
// value. It runs as a child process (`velocity-bench floor-proc`) so that the harness
// measures its CPU exactly as it measures ours.
//
// Its outputs do not decode as features, so the harness counts them by position
// (scanOutputs with passthrough): one per output offset. That checks the count, not
// which input each answers.

// floorHeaderHost and floorHeaderStamp stand in for our velocity.host and
// velocity.emitted_at headers, so the floor's records have our headers' size on the
// wire; their values are constant (no clock read per record).
const (
	floorHeaderHost  = "velocity.host"
	floorHeaderStamp = "velocity.floor"
)

// featuresSize is the encoded size of a typical features record of the benchmark's
// workload under our default windows: a 36-byte event id, a 12-byte entity id, the
// input topic's name, event times and amounts of the workload's magnitude.
func featuresSize(inputTopic string) (int, error) {
	f, err := typicalFeatures(inputTopic)
	if err != nil {
		return 0, err
	}
	return len(codec.AppendFeatures(nil, &f)), nil
}

func typicalFeatures(inputTopic string) (codec.Features, error) {
	specs, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		return codec.Features{}, err
	}
	f := codec.Features{
		EventID:         strings.Repeat("e", 36),
		EntityID:        "entity-00001",
		EventTime:       time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(),
		MsSincePrevious: 1500,
		HasPrevious:     true,
		SourceTopic:     inputTopic,
		SourcePartition: 3,
		SourceOffset:    250_000,
	}
	for _, s := range specs {
		f.Windows = append(f.Windows, codec.WindowAgg{Name: s.Name, WindowMs: s.WindowMs, BucketMs: s.BucketMs,
			Count: 12, SumMinor: 1_234_567, MinMinor: 1_000, MaxMinor: 250_000})
	}
	return f, nil
}

func cmdFloorProc(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("floor-proc", flag.ContinueOnError)
	brokers := fs.String("brokers", "127.0.0.1:9092", "comma-separated brokers")
	group := fs.String("group", "", "consumer group; required")
	input := fs.String("input-topic", "", "input topic; required")
	output := fs.String("output-topic", "", "output topic; required")
	size := fs.Int("value-size", 0, "bytes per output value (0: the size of a typical features record)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *group == "" || *input == "" || *output == "" {
		return fmt.Errorf("--group, --input-topic and --output-topic are required")
	}
	if *size <= 0 {
		n, err := featuresSize(*input)
		if err != nil {
			return err
		}
		*size = n
	}
	bl := splitList(*brokers)
	value := make([]byte, *size)
	for i := range value {
		value[i] = byte('a' + i%26) // not all zeros: lz4 should not get an easier input than ours
	}
	host, _ := os.Hostname()
	headers := []kgo.RecordHeader{
		{Key: floorHeaderStamp, Value: []byte("1764615600000")}, // as long as a Unix-ms emitted_at
		{Key: floorHeaderHost, Value: []byte(host)},
	}
	prod, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(bl...)}, sink.ProducerOpts()...),
		kgo.DefaultProduceTopic(*output),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return err
	}
	defer prod.Close()
	cons, err := kgo.NewClient(
		kgo.SeedBrokers(bl...),
		kgo.ConsumerGroup(*group),
		kgo.ConsumeTopics(*input),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(32<<20),
		kgo.FetchMaxWait(service.DefaultFetchMaxWait),
	)
	if err != nil {
		return err
	}
	defer cons.Close()
	var firstErr atomic.Pointer[error]
	done := func(_ *kgo.Record, err error) {
		if err != nil {
			firstErr.CompareAndSwap(nil, &err)
		}
	}
	for {
		fetches := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil // SIGTERM from the harness
		}
		if e := firstErr.Load(); e != nil {
			return fmt.Errorf("produce: %w", *e)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return fmt.Errorf("fetch %s[%d]: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		fetches.EachRecord(func(in *kgo.Record) {
			prod.Produce(ctx, &kgo.Record{Key: in.Key, Value: value, Headers: headers, Partition: in.Partition}, done)
		})
	}
}
