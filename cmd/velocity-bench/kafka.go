package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// checkLoopback refuses brokers off this machine: the harness creates and deletes
// topics and floods them, which is only acceptable on a local test broker.
func checkLoopback(brokers []string) error {
	for _, b := range brokers {
		host, _, err := net.SplitHostPort(b)
		if err != nil {
			return fmt.Errorf("broker %q: %w", b, err)
		}
		if host == "localhost" {
			continue
		}
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("broker %q is not a loopback address; velocity-bench only runs against a local broker", b)
		}
	}
	return nil
}

func newAdmin(brokers []string) (*kadm.Client, *kgo.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl, nil
}

// createTopics creates each topic with the given partitions and configs and waits until
// every partition has a leader.
func createTopics(ctx context.Context, adm *kadm.Client, partitions int32, configs map[string]string, topics ...string) error {
	cfg := make(map[string]*string, len(configs))
	for k, v := range configs {
		cfg[k] = kadm.StringPtr(v)
	}
	resp, err := adm.CreateTopics(ctx, partitions, -1, cfg, topics...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	if err := resp.Error(); err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	for range 300 { // 30 s at most
		md, err := adm.Metadata(ctx, topics...)
		if err == nil && allLed(md, topics, partitions) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("topics %v have no leader for every partition after 30 s", topics)
}

func allLed(md kadm.Metadata, topics []string, partitions int32) bool {
	for _, t := range topics {
		td, ok := md.Topics[t]
		if !ok || td.Err != nil || len(td.Partitions) != int(partitions) {
			return false
		}
		for _, p := range td.Partitions {
			if p.Err != nil || p.Leader < 0 {
				return false
			}
		}
	}
	return true
}

// deleteTopics removes a run's topics (and Kafka Streams' internal ones) so that runs
// do not fill the broker's disk; failures are reported, not fatal.
func deleteTopics(ctx context.Context, adm *kadm.Client, topics ...string) error {
	if len(topics) == 0 {
		return nil
	}
	resp, err := adm.DeleteTopics(ctx, topics...)
	if err != nil {
		return err
	}
	return resp.Error()
}

// internalTopicsOf lists the topics whose name starts with prefix (Kafka Streams names
// its changelog and repartition topics after the application id).
func internalTopicsOf(ctx context.Context, adm *kadm.Client, prefix string) []string {
	td, err := adm.ListTopics(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for name := range td {
		if len(name) > len(prefix) && name[:len(prefix)] == prefix {
			out = append(out, name)
		}
	}
	return out
}

func newProducer(brokers []string, topic string) (*kgo.Client, error) {
	return kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(time.Millisecond),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()),
		kgo.MaxBufferedRecords(200_000),
		kgo.RecordDeliveryTimeout(60*time.Second),
	)
}

// produceAll writes the whole workload to topic as fast as the broker takes it, with
// event times from the workload's schedule, and waits for every acknowledgement.
func produceAll(ctx context.Context, brokers []string, topic string, w Workload) (time.Duration, error) {
	cl, err := newProducer(brokers, topic)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	g, err := NewGenerator(w)
	if err != nil {
		return 0, err
	}
	var firstErr atomic.Pointer[error]
	start := time.Now()
	for {
		ev, ok := g.Next()
		if !ok {
			break
		}
		if e := firstErr.Load(); e != nil {
			return 0, *e
		}
		cl.Produce(ctx, g.Record(ev, w.EventTime(g.Index(), ev.DisorderMs)), func(_ *kgo.Record, err error) {
			if err != nil {
				firstErr.CompareAndSwap(nil, &err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	if e := firstErr.Load(); e != nil {
		return 0, *e
	}
	return time.Since(start), nil
}

func record(ev Event, eventTime int64) *kgo.Record {
	key := appendEntityID(make([]byte, 0, 12), ev.Entity)
	tx := codec.Transaction{
		EventID:     string(ev.ID[:]),
		EntityID:    string(key),
		AmountMinor: ev.AmountMin,
		Currency:    ev.Currency,
		EventTime:   eventTime,
	}
	return &kgo.Record{Key: key, Value: codec.EncodeTransaction(&tx)}
}

// producePaced writes events at rate per second for d, each with event_time = the wall
// clock in ms when it is handed to the producer, minus its disorder. It sends in 1 ms
// ticks (the rate's share of each tick), which is as steady as a millisecond clock
// allows. It returns how many it sent.
//
// The disorder of each out-of-order event goes into disorder by event id (about 1 % of
// events, so the map stays small): its produce time is event_time + disorder, and
// latency must be measured from that, or a processor that emits out-of-order events
// (Kafka Streams) would be charged up to 2 s it never spent.
func producePaced(ctx context.Context, cl *kgo.Client, g *Generator, rate int, d time.Duration, disorder map[string]int64) (int, error) {
	var firstErr atomic.Pointer[error]
	start := time.Now()
	sent := 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		now := time.Now()
		el := now.Sub(start)
		if el >= d {
			break
		}
		due := int(el.Seconds() * float64(rate))
		for ; sent < due; sent++ {
			ev, ok := g.Next()
			if !ok {
				return sent, errors.New("paced produce: workload exhausted; raise --events")
			}
			if ev.DisorderMs > 0 {
				disorder[string(ev.ID[:])] = ev.DisorderMs
			}
			cl.Produce(ctx, g.Record(ev, now.UnixMilli()-ev.DisorderMs), func(_ *kgo.Record, err error) {
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
			})
		}
		if e := firstErr.Load(); e != nil {
			return sent, *e
		}
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-tick.C:
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return sent, err
	}
	if e := firstErr.Load(); e != nil {
		return sent, *e
	}
	return sent, nil
}

// endOffsetSum is the sum of the high watermarks of topics' partitions: the number of
// records in them when nothing is transactional (transaction markers take offsets too).
func endOffsetSum(ctx context.Context, adm *kadm.Client, topics ...string) (int64, error) {
	lo, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return 0, err
	}
	if err := lo.Error(); err != nil {
		return 0, err
	}
	var n int64
	lo.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, nil
}

// scanResult is what a run's outputs say once read back.
type scanResult struct {
	Features, DeadLetters int
	FirstAppend           time.Time // earliest broker append time of any output
	LastAppend            time.Time
	Latencies             []int64 // ms: append time − event_time, features only, sorted
	// ToEmit and FromEmit split Latencies at the velocity.emitted_at header, for the
	// records that carry it (sorted, ms). ToInput is the first part of ToEmit: the
	// input record's broker append time − event_time (load generator and broker),
	// when the input topic stamps append times.
	ToEmit, FromEmit, ToInput []int64
	Unique                    int // distinct input (partition, offset) pairs covered
	Dups                      int // outputs for an input that already had one
	BadValues                 int // features values that did not decode
	// PerSecondMax is the largest latency of the events produced in each second after
	// minEventTime (index 0 = the first second): stalls show up as a few bad seconds,
	// and their spacing tells a periodic cause (a checkpoint interval) from noise.
	PerSecondMax []int64
	// PerSecondSplit is, per second as PerSecondMax, the largest of each part of
	// the latency: to the input's append, on to emitted_at, on to the output's
	// append (−1 where unknown).
	PerSecondSplit [][3]int64
}

// scanOutputs reads output and dlq from the start with read_committed until it has seen
// want records or timeout passes. minEventTime excludes warm-up records from the latency
// sample (they still count for accounting).
//
// If input is set, its records' timestamps (append times) are read first, to split
// each latency sample at the input's append.
//
// passthrough is for the floor processor, whose outputs are not features: each output
// counts as the answer of the input at its own partition and offset (the floor keeps
// the partition and produces in order), with no decode and no latency.
func scanOutputs(ctx context.Context, brokers []string, input, output, dlq string, want int, minEventTime int64, disorder map[string]int64, passthrough bool, timeout time.Duration) (scanResult, error) {
	var res scanResult
	var inAppend map[int32][]int64
	if input != "" {
		var err error
		if inAppend, err = readAppendTimes(ctx, brokers, input, want, timeout); err != nil {
			return res, err
		}
	}
	seen := newOffsetSet()
	err := readFromStart(ctx, brokers, true, []string{output, dlq}, want, timeout, func(r *kgo.Record) {
		ts := r.Timestamp
		if res.FirstAppend.IsZero() || ts.Before(res.FirstAppend) {
			res.FirstAppend = ts
		}
		if ts.After(res.LastAppend) {
			res.LastAppend = ts
		}
		if r.Topic == dlq {
			res.DeadLetters++
			p, off := dlqSource(r)
			seen.Add(p, off)
			return
		}
		res.Features++
		if passthrough {
			seen.Add(r.Partition, r.Offset)
			return
		}
		f, err := codec.DecodeFeatures(r.Value)
		if err != nil {
			res.BadValues++
			return
		}
		seen.Add(f.SourcePartition, f.SourceOffset)
		// Produce time = event_time + the event's disorder (0 for most).
		produced := f.EventTime + disorder[f.EventID]
		if produced >= minEventTime {
			lat := ts.UnixMilli() - produced
			res.Latencies = append(res.Latencies, lat)
			split := [3]int64{-1, -1, -1}
			if a := inAppend[f.SourcePartition]; f.SourceOffset >= 0 && f.SourceOffset < int64(len(a)) {
				split[0] = a[f.SourceOffset] - produced
				res.ToInput = append(res.ToInput, split[0])
			}
			if em, ok := emittedAt(r); ok {
				res.ToEmit = append(res.ToEmit, em-produced)
				res.FromEmit = append(res.FromEmit, ts.UnixMilli()-em)
				split[2] = ts.UnixMilli() - em
				if split[0] >= 0 {
					split[1] = em - produced - split[0]
				}
			}
			if sec := (produced - minEventTime) / 1000; sec < 3600 {
				for int64(len(res.PerSecondMax)) <= sec {
					res.PerSecondMax = append(res.PerSecondMax, 0)
				}
				res.PerSecondMax[sec] = max(res.PerSecondMax[sec], lat)
				for int64(len(res.PerSecondSplit)) <= sec {
					res.PerSecondSplit = append(res.PerSecondSplit, [3]int64{-1, -1, -1})
				}
				for i, v := range split {
					res.PerSecondSplit[sec][i] = max(res.PerSecondSplit[sec][i], v)
				}
			}
		}
	})
	slices.Sort(res.Latencies)
	slices.Sort(res.ToEmit)
	slices.Sort(res.FromEmit)
	slices.Sort(res.ToInput)
	res.Unique, res.Dups = seen.count, seen.dups
	return res, err
}

// readFromStart reads want records of topics from their start (read_committed if
// committed is set) and hands each to each: how the harness reads a run's inputs
// and outputs back. It fails if timeout passes before it
// has read want, or a fetch fails.
func readFromStart(ctx context.Context, brokers []string, committed bool, topics []string, want int, timeout time.Duration, each func(*kgo.Record)) error {
	if want <= 0 {
		return nil
	}
	n := 0
	return readUntil(ctx, brokers, committed, topics, timeout, func(r *kgo.Record) bool {
		n++
		each(r)
		return n >= want
	}, func() string { return fmt.Sprintf("read %d of %d records", n, want) })
}

// readUntil reads topics from their start (read_committed if committed is set) and
// hands each record to each until each returns true. It fails if timeout passes
// first (the error says progress()), or a fetch fails.
func readUntil(ctx context.Context, brokers []string, committed bool, topics []string, timeout time.Duration, each func(*kgo.Record) (done bool), progress func() string) error {
	opts := []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64 << 20),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := false
	for !done {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s of %v within %s: %w", progress(), topics, timeout, err)
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return fmt.Errorf("read %v: %w", topics, errs[0].Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if each(r) {
				done = true
			}
		})
	}
	return nil
}

// readAppendTimes reads want records of topic and returns each one's timestamp
// (Unix ms), by partition and offset.
func readAppendTimes(ctx context.Context, brokers []string, topic string, want int, timeout time.Duration) (map[int32][]int64, error) {
	times := map[int32][]int64{}
	err := readFromStart(ctx, brokers, false, []string{topic}, want, timeout, func(r *kgo.Record) {
		a := times[r.Partition]
		for int64(len(a)) <= r.Offset {
			a = append(a, 0)
		}
		a[r.Offset] = r.Timestamp.UnixMilli()
		times[r.Partition] = a
	})
	return times, err
}

// emittedAt is the processor's velocity.emitted_at header (Unix ms), if it has one.
func emittedAt(r *kgo.Record) (int64, bool) {
	for _, h := range r.Headers {
		if h.Key == sink.HeaderEmittedAt {
			v, err := strconv.ParseInt(string(h.Value), 10, 64)
			return v, err == nil
		}
	}
	return 0, false
}

func dlqSource(r *kgo.Record) (int32, int64) {
	p, off := int64(-1), int64(-1)
	for _, h := range r.Headers {
		switch h.Key {
		case codec.HeaderSourcePartition:
			p, _ = strconv.ParseInt(string(h.Value), 10, 32)
		case codec.HeaderSourceOffset:
			off, _ = strconv.ParseInt(string(h.Value), 10, 64)
		}
	}
	return int32(p), off
}
