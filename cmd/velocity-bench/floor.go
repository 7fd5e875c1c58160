package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/profiling"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// The floor processor (`floor` in --processors) is the transport ceiling for a consumer
// that writes one record per input record: it consumes the input like ours (a group,
// read_committed, the same fetch settings) and, for each input record, produces one
// record of the features' size and content with our producer settings (sink.ProducerOpts:
// idempotent, acks=all, lz4, 2 ms linger) to the input record's partition. It does no
// processing at all: no decode, no state, no encode; the outputs cycle through a pool
// of features records encoded at startup. It runs as a child process (`velocity-bench floor-proc`) so that the harness
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

// floorPoolSize is how many distinct values the floor cycles through: 1024 records of
// about 200 bytes span more than LZ4's 64 KiB window, so a batch compresses about as
// well as a batch of our features, not as well as one value repeated.
const floorPoolSize = 1024

// floorValues are n encoded features records made from the benchmark workload's
// events (its 36-byte event ids, its entity ids, its amounts) under our default
// windows, with the input topic as their source: values of our features' size and
// content, built once before the floor consumes anything.
func floorValues(inputTopic string, n int) ([][]byte, error) {
	specs, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		return nil, err
	}
	w := DefaultWorkload(100_000, n)
	g, err := NewGenerator(w)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, 0, n)
	for i := 0; ; i++ {
		ev, ok := g.Next()
		if !ok {
			break
		}
		f := codec.Features{
			EventID:         string(ev.ID[:]),
			EntityID:        EntityID(ev.Entity),
			EventTime:       w.EventTime(i, ev.DisorderMs),
			MsSincePrevious: int64(1 + i%5000),
			HasPrevious:     i%3 != 0,
			SourceTopic:     inputTopic,
			SourcePartition: int32(i % partitions),
			SourceOffset:    int64(i / partitions),
		}
		for k, s := range specs {
			c := int64(1 + (i+k)%(8<<k))
			f.Windows = append(f.Windows, codec.WindowAgg{Name: s.Name, WindowMs: s.WindowMs, BucketMs: s.BucketMs,
				Count: c, SumMinor: c * ev.AmountMin, MinMinor: ev.AmountMin / 2, MaxMinor: ev.AmountMin * 2})
		}
		out = append(out, codec.AppendFeatures(nil, &f))
	}
	return out, nil
}

func cmdFloorProc(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("floor-proc", flag.ContinueOnError)
	brokers := fs.String("brokers", "127.0.0.1:9092", "comma-separated brokers")
	group := fs.String("group", "", "consumer group; required")
	input := fs.String("input-topic", "", "input topic; required")
	output := fs.String("output-topic", "", "output topic; required")
	cpuProf := fs.String("cpu-profile", "", "write a CPU profile of the whole run to this file")
	memProf := fs.String("mem-profile", "", "write an allocation profile to this file at exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfiles, err := profiling.Start(*cpuProf, *memProf)
	if err != nil {
		return err
	}
	defer func() {
		if err := stopProfiles(); err != nil {
			fmt.Fprintf(os.Stderr, "floor-proc: %v\n", err)
		}
	}()
	if *group == "" || *input == "" || *output == "" {
		return fmt.Errorf("--group, --input-topic and --output-topic are required")
	}
	values, err := floorValues(*input, floorPoolSize)
	if err != nil {
		return err
	}
	bl := splitList(*brokers)
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
	next := 0
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
			prod.Produce(ctx, &kgo.Record{Key: in.Key, Value: values[next], Headers: headers, Partition: in.Partition}, done)
			if next++; next == len(values) {
				next = 0
			}
		})
	}
}
