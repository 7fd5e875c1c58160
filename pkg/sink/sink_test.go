package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// fakeProducer holds promises until the test acknowledges or fails them.
type fakeProducer struct {
	mu      sync.Mutex
	pending []func(error)
	got     []kgo.Record
	live    []*kgo.Record // the records as handed over, in the sink's memory
}

func (f *fakeProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A real client serialises the record before its promise; the sink then
	// reuses the record and its memory, so keep a deep copy.
	c := *r
	c.Key, c.Value = bytes.Clone(r.Key), bytes.Clone(r.Value)
	c.Headers = nil
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	f.got = append(f.got, c)
	f.live = append(f.live, r)
	f.pending = append(f.pending, func(err error) { promise(r, err) })
}

// take removes and returns the pending promises, for acknowledging later.
func (f *fakeProducer) take() []func(error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pending
	f.pending = nil
	return p
}

func (f *fakeProducer) settle(err error) {
	f.mu.Lock()
	p := f.pending
	f.pending = nil
	f.mu.Unlock()
	for _, fn := range p {
		fn(err)
	}
}

func TestFlushWaitsForThisPartitionOnly(t *testing.T) {
	fp := &fakeProducer{}
	s := New(fp, "out", "dlq", "host-1")
	var acked []int64
	a := s.NewTracker(func(arrival int64) { acked = append(acked, arrival) })
	b := s.NewTracker(nil)

	key, val := []byte("card-1"), []byte{1, 2, 3}
	a.Features(key, val, 42)
	key[0], val[0] = 'X', 9 // the sink must have copied them
	if a.PendingBytes() != 9 {
		t.Fatalf("pending bytes %d, want 9", a.PendingBytes())
	}

	// b has nothing in flight: its flush returns at once although a is pending.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := b.Flush(ctx); err != nil {
		t.Fatalf("flush of an idle tracker: %v", err)
	}

	// a's flush must wait for the acknowledgement.
	done := make(chan error, 1)
	go func() { done <- a.Flush(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("flush returned before the ack: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	fp.settle(nil)
	if err := <-done; err != nil {
		t.Fatalf("flush: %v", err)
	}
	if len(acked) != 1 || acked[0] != 42 {
		t.Fatalf("ack callback got %v", acked)
	}
	r := fp.got[0]
	if r.Topic != "out" || string(r.Key) != "card-1" || r.Value[0] != 1 {
		t.Fatalf("produced %s %q %v", r.Topic, r.Key, r.Value)
	}
	h := map[string]string{}
	for _, kv := range r.Headers {
		h[kv.Key] = string(kv.Value)
	}
	if h[HeaderHost] != "host-1" || h[HeaderEmittedAt] == "" {
		t.Fatalf("features headers %v", h)
	}
}

func TestDeadLetterHeaders(t *testing.T) {
	fp := &fakeProducer{}
	tr := New(fp, "out", "dlq", "h").NewTracker(nil)
	tr.Dead(DeadLetter{Key: []byte("k"), Value: []byte{0xff}, Reason: codec.ReasonLate, Err: "too old", SourceTopic: "tx", SourcePartition: 3, SourceOffset: 17})
	tr.Dead(DeadLetter{Key: nil, Value: []byte{1}, Reason: codec.ReasonDecode, Err: "x", SourceTopic: "tx"})
	tr.Dead(DeadLetter{Key: []byte("k"), Value: nil, Reason: codec.ReasonDecode, Err: "tombstone", SourceTopic: "tx"})
	tr.Dead(DeadLetter{Key: []byte("k"), Value: []byte{}, Reason: codec.ReasonDecode, Err: "empty", SourceTopic: "tx"})
	fp.settle(nil)
	want := map[string]string{
		codec.HeaderReason: "late", codec.HeaderError: "too old",
		codec.HeaderSourceTopic: "tx", codec.HeaderSourcePartition: "3", codec.HeaderSourceOffset: "17",
	}
	r := fp.got[0]
	if r.Topic != "dlq" || string(r.Key) != "k" || r.Value[0] != 0xff {
		t.Fatalf("dead letter %s %q %v", r.Topic, r.Key, r.Value)
	}
	for k, v := range want {
		found := false
		for _, h := range r.Headers {
			if h.Key == k && string(h.Value) == v {
				found = true
			}
		}
		if !found {
			t.Errorf("header %s=%q missing in %v", k, v, r.Headers)
		}
	}
	if fp.got[1].Key != nil {
		t.Errorf("a nil key must stay nil (not empty) in the dead letter")
	}
	// The original bytes, unchanged: a tombstone's null value and an empty
	// value are different records.
	if fp.got[2].Value != nil {
		t.Errorf("a null value (tombstone) became %q in the dead letter, want null", fp.got[2].Value)
	}
	if fp.got[3].Value == nil {
		t.Errorf("an empty value became null in the dead letter")
	}
}

func TestProduceErrorIsKeptNotSwallowed(t *testing.T) {
	fp := &fakeProducer{}
	tr := New(fp, "out", "dlq", "h").NewTracker(nil)
	tr.Features([]byte("a"), []byte("b"), 1)
	tr.Features([]byte("a"), []byte("c"), 1)
	boom := errors.New("broker said no")
	fp.settle(boom)
	if err := tr.Err(); !errors.Is(err, boom) {
		t.Fatalf("Err() = %v, want the produce failure", err)
	}
	if err := tr.Flush(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Flush() = %v, want the produce failure", err)
	}
}

func TestFlushTimesOut(t *testing.T) {
	fp := &fakeProducer{}
	tr := New(fp, "out", "dlq", "h").NewTracker(nil)
	tr.Features([]byte("a"), []byte("b"), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := tr.Flush(ctx); !errors.Is(err, ErrFlushTimeout) {
		t.Fatalf("Flush() = %v, want ErrFlushTimeout", err)
	}
	fp.settle(nil)
}

func TestFeaturesPrefix(t *testing.T) {
	big := bytes.Repeat([]byte{7}, arenaChunk) // past the arena: its own allocation
	for _, tc := range []struct {
		name          string
		prefix, value []byte
	}{
		{"no prefix writes the value alone", nil, []byte{1, 2, 3}},
		{"wire-format prefix before a small value", []byte{0, 0, 0, 0, 42}, []byte{1, 2, 3}},
		{"prefix before a value larger than the arena", []byte{0, 0, 0, 1, 0}, big},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &fakeProducer{}
			tr := New(fp, "out", "dlq", "h").WithFeaturesPrefix(tc.prefix).NewTracker(nil)
			value := append([]byte(nil), tc.value...)
			tr.Features([]byte("e"), value, 0)
			tr.Dead(DeadLetter{Value: []byte{9}, Reason: codec.ReasonDecode, SourceTopic: "tx"})
			value[0] = 0xee // the tracker must have copied it
			fp.settle(nil)
			want := append(append([]byte(nil), tc.prefix...), tc.value...)
			if !bytes.Equal(fp.got[0].Value, want) {
				t.Errorf("features value starts %x, want %x", fp.got[0].Value[:min(8, len(fp.got[0].Value))], want[:min(8, len(want))])
			}
			if !bytes.Equal(fp.got[1].Value, []byte{9}) {
				t.Errorf("dead letter value %x: the prefix must not touch source bytes", fp.got[1].Value)
			}
		})
	}
}

// TestEpochs checks that a checkpoint can wait for exactly the records
// produced before its cut while later ones are still in flight.
func TestEpochs(t *testing.T) {
	fp := &fakeProducer{}
	tr := New(fp, "out", "dlq", "h").NewTracker(nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()

	empty := tr.Cut()
	if err := empty.Wait(ctx); err != nil {
		t.Fatalf("an empty epoch must be done at once: %v", err)
	}

	tr.Features([]byte("a"), []byte("1"), 1)
	tr.Features([]byte("a"), []byte("2"), 1)
	first := fp.take()
	e1 := tr.Cut()
	tr.Features([]byte("a"), []byte("3"), 1) // the next epoch, not yet acknowledged
	later := fp.take()

	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if err := e1.Wait(short); !errors.Is(err, ErrFlushTimeout) {
		t.Fatalf("epoch done before its records were acknowledged: %v", err)
	}
	for _, ack := range first {
		ack(nil)
	}
	if err := e1.Wait(ctx); err != nil {
		t.Fatalf("epoch not done after its records were acknowledged (a later one still in flight): %v", err)
	}
	for _, ack := range later {
		ack(nil)
	}
	if err := tr.Cut().Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestEmittedAtClock checks the velocity.emitted_at header: the clock SetClock gives,
// for every record until the next call (records reuse pooled header slices, so a
// stale value would show here), and the wall clock without SetClock.
func TestEmittedAtClock(t *testing.T) {
	emitted := func(r kgo.Record) string {
		for _, h := range r.Headers {
			if h.Key == HeaderEmittedAt {
				return string(h.Value)
			}
		}
		return ""
	}
	fp := &fakeProducer{}
	tr := New(fp, "out", "dlq", "h").NewTracker(nil)
	before := time.Now().UnixMilli()
	tr.Features([]byte("k"), []byte("v"), 0)
	if got, _ := strconv.ParseInt(emitted(fp.got[0]), 10, 64); got < before || got > time.Now().UnixMilli() {
		t.Fatalf("without SetClock: emitted_at %q, want the wall clock", emitted(fp.got[0]))
	}
	if got := strconv.FormatInt(fp.got[0].Timestamp.UnixMilli(), 10); got != emitted(fp.got[0]) {
		t.Fatalf("without SetClock: timestamp %s, want the emitted_at instant %s", got, emitted(fp.got[0]))
	}
	for round, clock := range []int64{1234, 1234, 99_999} {
		tr.SetClock(clock)
		fp.got = fp.got[:0]
		tr.Features([]byte("a"), []byte("1"), 0)
		tr.Features([]byte("b"), []byte("2"), 0)
		for i, r := range fp.got {
			if got := emitted(r); got != strconv.FormatInt(clock, 10) {
				t.Fatalf("round %d record %d: emitted_at %q, want %d", round, i, got, clock)
			}
			if len(r.Headers) != 2 {
				t.Fatalf("round %d record %d: %d headers, want 2", round, i, len(r.Headers))
			}
			if got := r.Timestamp.UnixMilli(); got != clock {
				t.Fatalf("round %d record %d: timestamp %d, want the emitted_at instant %d", round, i, got, clock)
			}
		}
		fp.settle(nil) // records go back to the pool with their header slices
	}
}

// TestArenaRecycling acknowledges records out of order while more are produced,
// so that chunks are recycled and reused: every record still in flight must keep
// its bytes until its own promise, and the steady state must not allocate.
func TestArenaRecycling(t *testing.T) {
	fp := &fakeProducer{}
	s := New(fp, "out", "dlq", "h")
	tr := s.NewTracker(nil)
	value := func(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 500+i%300) }
	key := func(i int) []byte { return []byte(fmt.Sprintf("entity-%d", i)) }
	const n = 3000 // ~3 MB: a dozen chunks
	next := 0
	for round := 0; round < 4; round++ {
		for ; next < (round+1)*n; next++ {
			tr.Features(key(next), value(next), 1)
		}
		// Acknowledge every other pending record, oldest first: chunks are
		// released only once all their records are.
		fp.mu.Lock()
		pend, live := fp.pending, fp.live
		var keepP []func(error)
		var keepL []*kgo.Record
		for i := range pend {
			if i%2 == 0 {
				keepP, keepL = append(keepP, pend[i]), append(keepL, live[i])
			}
		}
		fp.pending, fp.live = nil, nil
		fp.mu.Unlock()
		for i := range pend {
			if i%2 == 1 {
				// Check the bytes before the promise recycles the record.
				r := live[i]
				if !bytes.HasPrefix(r.Key, []byte("entity-")) {
					t.Fatalf("round %d: key of an in-flight record was overwritten: %q", round, r.Key)
				}
				pend[i](nil)
			}
		}
		for i, r := range keepL {
			var k int
			if _, err := fmt.Sscanf(string(r.Key), "entity-%d", &k); err != nil {
				t.Fatalf("round %d: in-flight key %q: %v", round, r.Key, err)
			}
			if !bytes.Equal(r.Value, value(k)) {
				t.Fatalf("round %d: value of in-flight record %d (entity-%d) was overwritten", round, i, k)
			}
		}
		for _, p := range keepP {
			p(nil)
		}
	}
	if n := tr.PendingBytes(); n != 0 {
		t.Fatalf("pending bytes %d after every promise", n)
	}
}

// ackingProducer acknowledges every record at once, as the client's promise
// goroutine would, without keeping anything.
type ackingProducer struct{}

func (ackingProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	promise(r, nil)
}

// TestFeaturesDoesNotAllocate: in steady state a features record reuses a pooled
// record, its header slice and arena memory of acknowledged records.
func TestFeaturesDoesNotAllocate(t *testing.T) {
	limit := 0.01
	if raceEnabled {
		limit = 0.5 // the race detector makes sync.Pool drop a quarter of its items on purpose
	}
	tr := New(ackingProducer{}, "out", "dlq", "h").NewTracker(func(int64) {})
	tr.SetClock(1_700_000_000_000)
	k, v := []byte("card-1234"), bytes.Repeat([]byte{7}, 180)
	for range 5000 { // warm the pools
		tr.Features(k, v, 1)
	}
	if allocs := testing.AllocsPerRun(20000, func() { tr.Features(k, v, 1) }); allocs > limit {
		t.Errorf("%.3f allocations per features record, want at most %.2f", allocs, limit)
	}
}

// stampingProducer sets what a real client sets on a produced record, and
// remembers what it was handed.
type stampingProducer struct{ handed []kgo.Record }

func (s *stampingProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	c := *r
	c.Headers = slices.Clone(r.Headers) // the pooled record's own array is reused
	s.handed = append(s.handed, c)
	r.Timestamp, r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch = staleStamp, 3, 99, 7, 1
	promise(r, nil)
}

// staleStamp is what stampingProducer leaves in a record, as a client does.
var staleStamp = time.Date(2000, 1, 1, 0, 0, 0, 123, time.UTC)

// TestReusedRecordIsClean: a record reused from the pool carries nothing of its
// previous life (a stale Timestamp would be produced as the new record's).
func TestReusedRecordIsClean(t *testing.T) {
	sp := &stampingProducer{}
	tr := New(sp, "out", "dlq", "h").NewTracker(nil)
	for i := range 50 {
		if i%5 == 0 {
			tr.Dead(DeadLetter{Key: []byte("k"), Value: []byte{1}, Reason: codec.ReasonDecode, SourceTopic: "in"})
		} else {
			tr.Features([]byte("card"), []byte{byte(i)}, 1)
		}
	}
	for i, r := range sp.handed {
		if r.Timestamp.Equal(staleStamp) || r.Partition != 0 || r.Offset != 0 || r.ProducerID != 0 || r.ProducerEpoch != 0 {
			t.Fatalf("record %d handed over with state of an earlier one: %+v", i, r)
		}
		wantHeaders := 2
		if i%5 == 0 {
			wantHeaders = 5
			if !r.Timestamp.IsZero() {
				t.Fatalf("dead letter %d: timestamp %v without a clock, want zero (the client stamps it)", i, r.Timestamp)
			}
		} else if got := strconv.FormatInt(r.Timestamp.UnixMilli(), 10); got != string(r.Headers[0].Value) {
			t.Fatalf("record %d: timestamp %s, want its emitted_at %s", i, got, r.Headers[0].Value)
		}
		if len(r.Headers) != wantHeaders {
			t.Fatalf("record %d has %d headers, want %d", i, len(r.Headers), wantHeaders)
		}
	}
}

// BenchmarkFeatures is the sink's cost per features record with a client that
// acknowledges at once: copying into the arena, the pooled record and headers.
func BenchmarkFeatures(b *testing.B) {
	tr := New(ackingProducer{}, "out", "dlq", "h").NewTracker(func(int64) {})
	tr.SetClock(1_700_000_000_000)
	k, v := []byte("card-1234"), bytes.Repeat([]byte{7}, 180)
	b.ReportAllocs()
	for b.Loop() {
		tr.Features(k, v, 1)
	}
}

// TestLineageHeaders: with WithBuild (WithDefinition) every record, features
// and dead letters alike, names the build (the feature definition) that produced
// it; without, no record carries the header. A recycled record never keeps
// another kind's headers.
func TestLineageHeaders(t *testing.T) {
	headers := func(r kgo.Record) map[string]string {
		m := map[string]string{}
		for _, h := range r.Headers {
			m[h.Key] = string(h.Value)
		}
		return m
	}
	for _, build := range []string{"velocity-consumer/v1.2.3+0123456789ab go1.26.8", ""} {
		for _, def := range []string{"card-velocity-1@3f2a9c1d0b7e4a55", ""} {
			fp := &fakeProducer{}
			tr := New(fp, "out", "dlq", "h").WithBuild(build).WithDefinition(def).NewTracker(nil)
			for range 3 { // recycled records: features after dead letters and back
				tr.Features([]byte("e"), []byte("v"), 1)
				tr.Dead(DeadLetter{Key: []byte("k"), Value: []byte{1}, Reason: codec.ReasonLate, SourceTopic: "tx"})
				fp.settle(nil)
			}
			for i, r := range fp.got {
				h := headers(r)
				for key, want := range map[string]string{HeaderBuild: build, HeaderDefinition: def} {
					got, ok := h[key]
					if want != "" && (!ok || got != want) || want == "" && ok {
						t.Errorf("build %q def %q, record %d (%s): %s = %q (present %v)", build, def, i, r.Topic, key, got, ok)
					}
				}
				wantN := 2
				if r.Topic == "dlq" {
					wantN = 5
				}
				if build != "" {
					wantN++
				}
				if def != "" {
					wantN++
				}
				if len(r.Headers) != wantN {
					t.Errorf("build %q def %q, record %d (%s): %d headers %v, want %d", build, def, i, r.Topic, len(r.Headers), r.Headers, wantN)
				}
			}
		}
	}
}

// asyncProducer acknowledges each record on one of several goroutines, in an
// order that interleaves them, as a client with connections to several brokers
// does.
type asyncProducer struct{ acks []chan func() }

func newAsyncProducer(n int) *asyncProducer {
	p := &asyncProducer{}
	for range n {
		c := make(chan func(), 64)
		p.acks = append(p.acks, c)
		go func() {
			for f := range c {
				f()
			}
		}()
	}
	return p
}

func (p *asyncProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	p.acks[int(r.Key[0])%len(p.acks)] <- func() { promise(r, nil) }
}

func (p *asyncProducer) close() {
	for _, c := range p.acks {
		close(c)
	}
}

// TestEpochsUnderConcurrentAcks: with acknowledgements arriving on other
// goroutines while the producing one goes on producing and cutting, every
// epoch ends once its records are acknowledged, a Flush in between returns,
// and at the end nothing is counted as pending.
func TestEpochsUnderConcurrentAcks(t *testing.T) {
	for _, tc := range []struct {
		name              string
		ackers, records   int
		cutEvery, flushAt int
	}{
		{"one acker", 1, 20_000, 997, 10_000},
		{"four ackers", 4, 20_000, 251, 5_000},
		{"cut every record", 3, 5_000, 1, 2_500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ap := newAsyncProducer(tc.ackers)
			defer ap.close()
			tr := New(ap, "out", "dlq", "h").NewTracker(nil)
			tr.SetClock(1_700_000_000_000)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var epochs []*Epoch
			val := bytes.Repeat([]byte{1}, 100)
			for i := range tc.records {
				tr.Features([]byte{byte(i), byte(i >> 8)}, val, 1)
				if i%tc.cutEvery == tc.cutEvery-1 {
					epochs = append(epochs, tr.Cut())
				}
				if i == tc.flushAt {
					if err := tr.Flush(ctx); err != nil {
						t.Fatalf("Flush at record %d: %v", i, err)
					}
					if n := tr.PendingBytes(); n != 0 {
						t.Fatalf("after Flush, %d bytes pending", n)
					}
				}
			}
			epochs = append(epochs, tr.Cut())
			for i, e := range epochs {
				if err := e.Wait(ctx); err != nil {
					t.Fatalf("epoch %d of %d never ended: %v", i, len(epochs), err)
				}
			}
			if err := tr.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if n, f := tr.PendingBytes(), tr.inflight(); n != 0 || f != 0 {
				t.Fatalf("at the end %d bytes and %d records pending, want 0", n, f)
			}
		})
	}
}

// TestSlabNotReusedWhileInFlight: one record left unacknowledged keeps its
// slab out of reuse however many records follow, while slabs whose records
// are all acknowledged are reused.
func TestSlabNotReusedWhileInFlight(t *testing.T) {
	fp := &fakeProducer{}
	tr := New(fp, "out", "dlq", "h").NewTracker(nil)
	tr.SetClock(1_700_000_000_000)
	const held = 5
	for i := range 3 * slabLen {
		tr.Features([]byte(fmt.Sprintf("k%d", i)), []byte(fmt.Sprintf("v%d", i)), 1)
	}
	pend, live := fp.take(), fp.live
	heldRec := live[held]
	for i, ack := range pend {
		if i != held {
			ack(nil)
		}
	}
	seen := map[*kgo.Record]bool{}
	for round := range 20 {
		for i := range slabLen {
			tr.Features([]byte(fmt.Sprintf("r%d-%d", round, i)), []byte("x"), 1)
		}
		fp.mu.Lock()
		fresh := fp.live[len(fp.live)-slabLen:]
		fp.mu.Unlock()
		for _, r := range fresh {
			if r == heldRec {
				t.Fatalf("round %d: the in-flight record's pending was handed out again", round)
			}
			seen[r] = true
		}
		fp.settle(nil)
	}
	if string(heldRec.Key) != fmt.Sprintf("k%d", held) || string(heldRec.Value) != fmt.Sprintf("v%d", held) {
		t.Fatalf("in-flight record overwritten: key %q value %q", heldRec.Key, heldRec.Value)
	}
	// 20 × slabLen records went out, acknowledged a slab at a time: slabs were
	// reused, so far fewer distinct pendings than records.
	if len(seen) > 4*slabLen {
		t.Errorf("%d distinct pendings for %d records: acknowledged slabs are not reused", len(seen), 20*slabLen)
	}
	if left := fp.take(); len(left) != 0 {
		t.Fatalf("%d promises left besides the held one", len(left))
	}
	pend[held](nil)
	if err := tr.Cut().Wait(context.Background()); err != nil || tr.PendingBytes() != 0 {
		t.Fatalf("after the last promise: %v, %d bytes pending", err, tr.PendingBytes())
	}
}
