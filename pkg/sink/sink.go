// Package sink publishes features records and dead letters to Kafka and lets a
// partition wait until everything it produced has been acknowledged.
//
// It wraps one franz-go producer client (idempotent, acks=all). Each input
// partition produces through its own Tracker; Tracker.Flush waits only for that
// partition's records, which is what the checkpoint protocol needs ("flush the
// outputs of offsets before next, then snapshot, then commit"), without stalling
// the other partitions. A produce that fails after the client's own retries is
// never swallowed: it is kept as the Tracker's error, returned by Flush and Err,
// and the caller stops the service so the partition restarts from its last
// checkpoint.
package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// Producer is the subset of *kgo.Client the sink uses (a test can fake it).
type Producer interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
}

// Sink publishes to the output and dead-letter topics.
type Sink struct {
	prod        Producer
	outputTopic string
	dlqTopic    string
	host        []byte
	prefix      []byte    // written before every features value; see WithFeaturesPrefix
	build       []byte    // the velocity.build header's value; see WithBuild
	definition  []byte    // the velocity.definition header's value; see WithDefinition
	chunks      sync.Pool // *chunk: arena chunks whose records were all acknowledged
	// slabs are slabs whose records were all acknowledged, for reuse (at most
	// maxFreeSlabs; beyond, the garbage collector takes them). A mutex, not a
	// sync.Pool: a tracker takes one slab per slabLen records, and a pool
	// drops its items at every garbage collection.
	slabMu sync.Mutex
	slabs  []*slab
}

// New returns a Sink producing through prod. host is recorded in a header of
// every features record (processing facts go in headers, never in values).
func New(prod Producer, outputTopic, dlqTopic, host string) *Sink {
	s := &Sink{prod: prod, outputTopic: outputTopic, dlqTopic: dlqTopic, host: []byte(host)}
	s.chunks.New = func() any { return &chunk{buf: make([]byte, 0, arenaChunk)} }
	return s
}

// pending is one produced record with what its promise needs. The record's
// Context points back at it, so one promise function serves every record and
// producing allocates no closure. The embedded Context is Background: the
// client must never abandon a record on a cancelled context while a checkpoint
// counts it as in flight.
type pending struct {
	context.Context
	rec     kgo.Record
	t       *Tracker
	ep      *Epoch
	c       *chunk // holds rec.Key and rec.Value, or nil
	s       *slab  // the slab this pending lives in
	arrival int64  // Unix ns, or ≤ 0 for dead letters
	size    int64
	// hdrs backs a features record's rec.Headers: inside the pending, the
	// headers share its cache lines instead of costing a miss of their own.
	// A dead letter's headers (more, and rare) are allocated.
	hdrs [featuresHeaders]kgo.RecordHeader
}

// featuresHeaders is how many headers a features record carries at most:
// emitted_at, host, build and definition.
const featuresHeaders = 4

// slab is a block of pendings that one tracker hands out in order and that is
// reused whole once every record in it was acknowledged. Pendings recycled one by
// one (a pool) came back in no order and cold, last written by the goroutine
// that acknowledged them: filling one cost a cache miss per record, which
// profiles at the peak showed as the largest part of the sink's own cost. A
// slab is filled front to back, which the hardware prefetches, and the
// acknowledging side only reads a pending and counts its slab down.
type slab struct {
	p    [slabLen]pending
	next int          // the next pending to hand out; the owning tracker's goroutine only
	refs atomic.Int32 // records handed out and not yet acknowledged, plus 1 while current
}

const (
	slabLen      = 256
	maxFreeSlabs = 256 // 256 × slabLen records of about 350 bytes: ~22 MiB at most
)

// newSlab returns a slab of s's pendings. The features headers' keys and the
// sink's constant values are written here once, not per record: every
// pending of a sink's slabs carries the same host, build and definition, and a
// dead letter brings a header slice of its own, so only emitted_at's value
// changes.
func (s *Sink) newSlab() *slab {
	sl := &slab{}
	hdrs := s.constantHeaders()
	for i := range sl.p {
		p := &sl.p[i]
		p.Context, p.s = context.Background(), sl
		p.rec.Context = p // never written again: the client may read it after the promise
		p.hdrs = hdrs
	}
	return sl
}

// constantHeaders are a features record's headers but emitted_at's value:
// emitted_at, host, then build (WithBuild) and definition (WithDefinition) when
// set, in that order, without gaps.
func (s *Sink) constantHeaders() [featuresHeaders]kgo.RecordHeader {
	h := [featuresHeaders]kgo.RecordHeader{{Key: HeaderEmittedAt}, {Key: HeaderHost, Value: s.host}}
	n := 2
	if len(s.build) > 0 {
		h[n] = kgo.RecordHeader{Key: HeaderBuild, Value: s.build}
		n++
	}
	if len(s.definition) > 0 {
		h[n] = kgo.RecordHeader{Key: HeaderDefinition, Value: s.definition}
	}
	return h
}

// featuresHeaderCount is how many of a pending's hdrs a features record
// carries (constantHeaders).
func (s *Sink) featuresHeaderCount() int {
	n := 2
	if len(s.build) > 0 {
		n++
	}
	if len(s.definition) > 0 {
		n++
	}
	return n
}

// getSlab returns a free slab, reused or new.
func (s *Sink) getSlab() *slab {
	s.slabMu.Lock()
	var sl *slab
	if n := len(s.slabs); n > 0 {
		sl, s.slabs = s.slabs[n-1], s.slabs[:n-1]
	}
	s.slabMu.Unlock()
	if sl == nil {
		sl = s.newSlab()
	}
	sl.next = 0
	sl.refs.Store(1)
	return sl
}

// releaseSlab drops one reference to sl; whoever drops the last frees it.
func (s *Sink) releaseSlab(sl *slab) {
	if sl.refs.Add(-1) != 0 {
		return
	}
	s.slabMu.Lock()
	if len(s.slabs) < maxFreeSlabs {
		s.slabs = append(s.slabs, sl)
	}
	s.slabMu.Unlock()
}

// nextPending hands out the next pending of the tracker's slab, cleared of
// everything its previous record left (the client stamps partition, offset,
// producer id and epoch, timestamp and attributes into a record).
func (t *Tracker) nextPending() *pending {
	sl := t.slab
	if sl == nil || sl.next == slabLen {
		if sl != nil {
			t.sink.releaseSlab(sl)
		}
		sl = t.sink.getSlab()
		t.slab = sl
	}
	p := &sl.p[sl.next]
	sl.next++
	sl.refs.Add(1)
	r := &p.rec
	r.Key, r.Value, r.Headers, r.Topic = nil, nil, nil, ""
	r.Timestamp, r.Partition, r.Attrs = time.Time{}, 0, kgo.RecordAttrs{}
	r.ProducerEpoch, r.ProducerID, r.LeaderEpoch, r.Offset = 0, 0, 0, 0
	p.c = nil
	return p
}

// chunk is a piece of arena memory shared by the keys and values of many
// records. refs counts those records still in flight plus one while the
// chunk is the tracker's current one; whoever drops it to 0 recycles the
// chunk. Without recycling, the copies of every produced byte were the
// service's largest allocation and set the pace of garbage collection.
type chunk struct {
	buf  []byte
	refs atomic.Int32
}

// WithFeaturesPrefix makes every features value start with prefix (the
// Confluent wire-format magic byte and schema id when a schema registry is
// configured) and returns s. Dead letters keep the source bytes unchanged.
// Call it before the first Features.
func (s *Sink) WithFeaturesPrefix(prefix []byte) *Sink {
	s.prefix = append([]byte(nil), prefix...)
	return s
}

// WithBuild puts build in a velocity.build header of every record (features
// and dead letters), so that a backtest can tell which code produced which
// record; empty leaves the header out. Call it before the first record.
func (s *Sink) WithBuild(build string) *Sink {
	s.build = []byte(build)
	return s
}

// WithDefinition puts definition (a feature definition's "<label>@<hash>") in a
// velocity.definition header of every record, features and dead letters, beside
// velocity.build: which definition made a record is lineage as much as which
// code did. Empty (no --features) leaves it out. Call it before the first record.
func (s *Sink) WithDefinition(definition string) *Sink {
	s.definition = []byte(definition)
	return s
}

// ProducerOpts are the options the sink's client must have: idempotent writes
// with acks from all in-sync replicas, so a retried produce is not duplicated.
//
// Records are never failed for UNKNOWN_TOPIC_OR_PARTITION before their
// delivery timeout. Every topic the service writes to exists before its first
// produce (EnsureTopics), but a broker goes on answering so for a partition it
// has not taken on yet, for seconds after the topic was created on a loaded
// machine; the client's default of four such answers turned a repartition
// topic that two instances created at once into a fatal produce error. A topic
// deleted under a running service still fails, at the delivery timeout.
func ProducerOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.UnknownTopicRetries(-1),
		kgo.RecordPartitioner(Partitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(2 * time.Millisecond),
		defaultCompression,
		kgo.RecordDeliveryTimeout(2 * time.Minute),
		kgo.MaxBufferedBytes(64 << 20),
	}
}

// Header names on features records. Dead-letter headers are in pkg/codec.
const (
	HeaderEmittedAt = "velocity.emitted_at" // Unix ms when the features record was produced
	HeaderHost      = "velocity.host"
	// HeaderBuild names the build that produced a record (features and dead
	// letters alike): "velocity-consumer/<version>[+<revision>] <go version>".
	HeaderBuild = "velocity.build"
	// HeaderDefinition names the feature definition that produced a record
	// (--features): "<label>@<hash>", the hash over the definition's canonical
	// form (pkg/definition).
	HeaderDefinition = "velocity.definition"
	// HeaderGroup names the re-keyed group (docs/repartition.md) on a features
	// record of its second stage and on a dead letter that stage decided.
	HeaderGroup = "velocity.group"
)

// Epoch is the set of records a Tracker produced between two Cuts. A
// checkpoint waits for the epoch that ends at its offset while the partition
// goes on producing into the next one.
//
// The producing goroutine never writes an Epoch per record: it counts the
// records of the open epoch in a field of its own and hands the count over
// once, at the Cut (seal). Only promises write acked, so the epoch's cache
// line does not move between the producing core and the acknowledging one on
// every record.
type Epoch struct {
	acked atomic.Int64 // records of the epoch acknowledged or failed
	total atomic.Int64 // records produced into the epoch; -1 until sealed
	once  sync.Once
	done  chan struct{}
}

func newEpoch() *Epoch {
	e := &Epoch{done: make(chan struct{})}
	e.total.Store(-1)
	return e
}

func (e *Epoch) finish() { e.once.Do(func() { close(e.done) }) }

// release is called once per acknowledged or failed record. The epoch is done
// when it is sealed and every record in it is released; whichever of release
// and seal sees that last closes it. (If release's load of total misses seal's
// store, the release came first in the order of these atomics, so seal's load
// of acked sees it.)
func (e *Epoch) release() {
	if e.acked.Add(1) == e.total.Load() {
		e.finish()
	}
}

// seal closes the epoch at n records.
func (e *Epoch) seal(n int64) {
	e.total.Store(n)
	if e.acked.Load() == n {
		e.finish()
	}
}

// Wait blocks until every record of the epoch has been acknowledged or has
// failed (see Tracker.Err), or ctx ends.
func (e *Epoch) Wait(ctx context.Context) error {
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrFlushTimeout, ctx.Err())
	}
}

// Tracker counts one input partition's in-flight records.
//
// Its counters are split by writer. The producing goroutine (Features, Dead,
// Cut) owns produced, producedBytes and epochN and updates them with plain
// stores; promises own acked and ackedBytes. In flight is produced − acked.
// Per record, no counter takes a locked read-modify-write on a cache line the
// other side writes too: with one shared counter, that line moved between the
// producing core and the acknowledging core twice per record, which profiles
// of the service at its peak showed as a tenth of the sink's cost.
type Tracker struct {
	sink  *Sink
	epoch *Epoch // the open epoch; only the producing goroutine touches the field
	// produced and producedBytes count every record produced so far (atomic
	// only so that Flush and PendingBytes may read them from elsewhere);
	// epochN counts those of the open epoch.
	produced      atomic.Int64
	producedBytes atomic.Int64
	epochN        int64
	// cur is the arena chunk that keys and values are copied into: one chunk
	// for many records instead of two allocations per record.
	cur *chunk
	// slab holds the pendings handed out next (see slab).
	slab *slab
	// nowMs and nowText are the emitted_at clock set by SetClock, and nowTime
	// the same instant as the records' timestamp: 0 = read the clock per record.
	nowMs   int64
	nowText []byte
	nowTime time.Time
	// onAck is called for every acknowledged features record with its arrival
	// stamp (Unix ns), for the latency histogram. May be nil.
	onAck func(arrival int64)

	_ [64]byte // the promises' counters on cache lines of their own
	// acked and ackedBytes count the records acknowledged or failed.
	acked      atomic.Int64
	ackedBytes atomic.Int64
	// waiters counts Flush calls waiting: only then does a promise take mu to
	// wake them.
	waiters atomic.Int32
	mu      sync.Mutex
	cond    *sync.Cond
	err     error
}

const arenaChunk = 256 << 10

// NewTracker returns a tracker for one input partition.
func (s *Sink) NewTracker(onAck func(arrival int64)) *Tracker {
	t := &Tracker{sink: s, onAck: onAck, epoch: newEpoch()}
	t.cond = sync.NewCond(&t.mu)
	return t
}

// copyInto sets p.rec's Key to a copy of key (nil stays nil) and its Value to
// a copy of prefix followed by value, both in one piece of the arena.
func (t *Tracker) copyInto(p *pending, key, prefix, value []byte) {
	n := len(key) + len(prefix) + len(value)
	var b []byte
	if n > arenaChunk/4 {
		b = make([]byte, 0, n) // rare and large: its own allocation
	} else {
		c := t.cur
		if c == nil || cap(c.buf)-len(c.buf) < n {
			t.retire()
			c = t.sink.chunks.Get().(*chunk)
			c.buf = c.buf[:0]
			c.refs.Store(1)
			t.cur = c
		}
		c.refs.Add(1)
		p.c = c
		at := len(c.buf)
		c.buf = c.buf[:at+n]
		b = c.buf[at : at : at+n]
	}
	if key != nil {
		b = append(b, key...)
		p.rec.Key = b[:len(key):len(key)]
	}
	if value == nil && prefix == nil {
		return // a null value (a tombstone's) stays null, not empty
	}
	b = append(append(b, prefix...), value...)
	p.rec.Value = b[len(key):]
}

// retire gives up the tracker's reference to its current chunk.
func (t *Tracker) retire() {
	if t.cur != nil {
		t.sink.release(t.cur)
		t.cur = nil
	}
}

func (s *Sink) release(c *chunk) {
	if c.refs.Add(-1) == 0 {
		s.chunks.Put(c)
	}
}

// SetClock sets the time (Unix ms) that the velocity.emitted_at header of the
// features records produced from now on carries, until the next call. A caller that
// produces a batch of records at once sets it once per batch: reading the clock and
// formatting it per record was several percent of the service's CPU (the clock is a
// system call on some virtual machines). Without SetClock, each record reads the clock.
func (t *Tracker) SetClock(unixMs int64) {
	if unixMs != t.nowMs {
		t.nowMs = unixMs
		t.nowText = strconv.AppendInt(nil, unixMs, 10) // shared by the records: never written
		t.nowTime = time.UnixMilli(unixMs)
	}
}

// Features produces one features record. key and value are copied.
func (t *Tracker) Features(key, value []byte, arrival int64) {
	p := t.nextPending()
	emitted, stamp := t.nowText, t.nowTime
	if t.nowMs == 0 {
		ms := time.Now().UnixMilli()
		emitted, stamp = strconv.AppendInt(nil, ms, 10), time.UnixMilli(ms)
	}
	p.rec.Topic = t.sink.outputTopic
	p.rec.Timestamp = stamp   // the emitted_at instant
	p.hdrs[0].Value = emitted // the other headers are the slab's constants (newSlab)
	p.rec.Headers = p.hdrs[:t.sink.featuresHeaderCount()]
	t.copyInto(p, key, t.sink.prefix, value)
	t.produce(p, arrival)
}

// DeadLetter describes one record for the dead-letter topic.
type DeadLetter struct {
	Key, Value      []byte // the original bytes, unchanged
	Reason          codec.Reason
	Err             string
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	// Group is the re-keyed group whose second stage decided it ("" for the
	// input partition's own dead letters): the velocity.group header.
	Group string
}

// Dead produces one dead letter with the contract's headers. Bytes are copied.
func (t *Tracker) Dead(d DeadLetter) {
	p := t.nextPending()
	p.rec.Topic = t.sink.dlqTopic
	p.rec.Timestamp = t.nowTime
	h := make([]kgo.RecordHeader, 5, 7)
	h[0] = kgo.RecordHeader{Key: codec.HeaderReason, Value: []byte(d.Reason)}
	h[1] = kgo.RecordHeader{Key: codec.HeaderError, Value: []byte(d.Err)}
	h[2] = kgo.RecordHeader{Key: codec.HeaderSourceTopic, Value: []byte(d.SourceTopic)}
	h[3] = kgo.RecordHeader{Key: codec.HeaderSourcePartition, Value: strconv.AppendInt(nil, int64(d.SourcePartition), 10)}
	h[4] = kgo.RecordHeader{Key: codec.HeaderSourceOffset, Value: strconv.AppendInt(nil, d.SourceOffset, 10)}
	if len(t.sink.build) > 0 {
		h = append(h, kgo.RecordHeader{Key: HeaderBuild, Value: t.sink.build})
	}
	if len(t.sink.definition) > 0 {
		h = append(h, kgo.RecordHeader{Key: HeaderDefinition, Value: t.sink.definition})
	}
	if d.Group != "" {
		h = append(h, kgo.RecordHeader{Key: HeaderGroup, Value: []byte(d.Group)})
	}
	p.rec.Headers = h
	t.copyInto(p, d.Key, nil, d.Value)
	t.produce(p, -1)
}

// Hop produces one hop record to partition partition of a repartition topic
// (docs/repartition.md): a first stage's output like its features, in the same
// epochs, so a checkpoint flushes it before the input offset that produced it is
// committed. It carries no headers: the second stage reads only the value, and
// its own outputs carry the lineage. Key and value are copied.
func (t *Tracker) Hop(topic string, partition int32, key, value []byte) {
	p := t.nextPending()
	p.rec.Topic = topic
	p.rec.Partition = partition
	p.rec.Timestamp = t.nowTime
	p.rec.Headers = nil
	t.copyInto(p, key, nil, value)
	t.produce(p, -1)
}

// Cut seals the open epoch (every record produced so far) and opens a new one
// for the records that follow. It must be called from the producing goroutine.
func (t *Tracker) Cut() *Epoch {
	e, n := t.epoch, t.epochN
	t.epoch, t.epochN = newEpoch(), 0
	e.seal(n)
	return e
}

func (t *Tracker) produce(p *pending, arrival int64) {
	p.t, p.ep, p.arrival = t, t.epoch, arrival
	p.size = int64(len(p.rec.Key) + len(p.rec.Value))
	// Counted before Produce, which may call the promise at once (a failure).
	t.epochN++
	t.producedBytes.Store(t.producedBytes.Load() + p.size) // the only writer: no locked add
	t.produced.Store(t.produced.Load() + 1)
	t.sink.prod.Produce(context.Background(), &p.rec, promise)
}

// promise ends every record's life: it counts the outcome and gives back the
// record's share of its slab and of the arena. It only reads the pending: the
// tracker clears it when it hands it out again (nextPending), so that its
// cache lines are written on one core only.
func promise(r *kgo.Record, err error) {
	p := r.Context.(*pending)
	t, ep, c, sl := p.t, p.ep, p.c, p.s
	if err != nil {
		t.mu.Lock()
		if t.err == nil {
			t.err = fmt.Errorf("produce to %s: %w", r.Topic, err)
		}
		t.mu.Unlock()
	} else if p.arrival > 0 && t.onAck != nil {
		t.onAck(p.arrival)
	}
	t.ackedBytes.Add(p.size)
	if c != nil {
		t.sink.release(c)
	}
	t.sink.releaseSlab(sl) // p may be handed out again from here on
	ep.release()
	t.acked.Add(1)
	// A Flush counts itself in waiters before it checks under mu, and it holds
	// mu until it waits: an acknowledgement that it did not see wakes it.
	if t.waiters.Load() > 0 {
		t.mu.Lock()
		t.cond.Broadcast()
		t.mu.Unlock()
	}
}

// PendingBytes is the size of this partition's records not yet acknowledged.
// Exact on the producing goroutine; elsewhere a recent value.
func (t *Tracker) PendingBytes() int64 {
	acked := t.ackedBytes.Load() // first: what is acknowledged was produced before
	return t.producedBytes.Load() - acked
}

// inflight is how many records are produced and not yet acknowledged.
func (t *Tracker) inflight() int64 {
	acked := t.acked.Load()
	return t.produced.Load() - acked
}

// Err returns the first produce failure, if any.
func (t *Tracker) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// ErrFlushTimeout is returned by Flush when ctx ends before every record is acknowledged.
var ErrFlushTimeout = errors.New("sink: flush interrupted before all records were acknowledged")

// Flush waits until every record produced through t has been acknowledged or
// failed, then returns the first failure. It returns ErrFlushTimeout (wrapped
// with ctx's error) if ctx ends first.
func (t *Tracker) Flush(ctx context.Context) error {
	done := make(chan struct{})
	t.waiters.Add(1)
	defer t.waiters.Add(-1)
	go func() {
		t.mu.Lock()
		for t.inflight() > 0 && ctx.Err() == nil {
			t.cond.Wait()
		}
		t.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.mu.Lock()
		t.cond.Broadcast() // let the waiter see ctx is done and exit
		t.mu.Unlock()
		<-done
	}
	if err := t.Err(); err != nil {
		return err
	}
	if t.inflight() > 0 {
		return fmt.Errorf("%w: %w", ErrFlushTimeout, ctx.Err())
	}
	return nil
}
