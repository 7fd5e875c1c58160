package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/internal/oracle"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// TestReadMatchesOracle: once the stream is processed, a read of every entity through
// its partition's worker equals the as-of aggregates recomputed from the stream.
func TestReadMatchesOracle(t *testing.T) {
	const partitions = 3
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 4, 2000, partitions)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	svc, _ := startService(t, cfg)
	readOutputs(t, brokers, len(st.Records), time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for p, evs := range st.ByPart {
		counted := oracle.Counted(oracle.Config{Specs: cfg.Specs, Topic: inTopic, Partition: p}, evs)
		entities := map[string]bool{}
		for _, e := range evs {
			entities[e.Entity] = true
		}
		req := NewReadRequest(0, len(cfg.Specs))
		for ent := range entities {
			req.Items = append(req.Items, ReadItem{Entity: ent, UseDefault: true, Aggs: make([]window.Agg, len(cfg.Specs))})
		}
		// The partition may still be settling its last batch's outputs: the
		// outputs were read, so its state has counted them.
		if err := svc.Read(ctx, p, req); err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
		for _, it := range req.Items {
			if it.Err != nil {
				t.Fatalf("partition %d: %v", p, it.Err)
			}
			want := oracle.WindowsAt(cfg.Specs, counted, it.Entity, it.Info.AsOf)
			for i, w := range want {
				if a := it.Aggs[i]; a.Count != w.Count || a.Sum != w.SumMinor || a.Min != w.MinMinor || a.Max != w.MaxMinor {
					t.Fatalf("partition %d window %s at %d: got %+v, oracle %+v", p, w.Name, it.Info.AsOf, a, w)
				}
			}
			if want := counted[len(counted)-1].Time; it.Info.AsOf != want {
				t.Fatalf("partition %d: as_of %d, want the newest counted event time %d", p, it.Info.AsOf, want)
			}
			if it.Info.LastOffset != evs[len(evs)-1].Offset || !it.Info.Known {
				t.Fatalf("partition %d: info %+v", p, it.Info)
			}
		}
	}
	if err := svc.Read(ctx, partitions, NewReadRequest(1, len(cfg.Specs))); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("a partition that does not exist: %v", err)
	}
	// A preview of an event after the stream: it counts the entity's newest window too.
	p := int32(-1)
	var last int64
	for part, evs := range st.ByPart {
		for _, e := range evs {
			last = max(last, e.Time)
			if e.Entity == "card-1" {
				p = part
			}
		}
	}
	pv := &pipeline.Preview{}
	req := NewReadRequest(1, len(cfg.Specs))
	req.Items[0] = ReadItem{Entity: "card-1", Preview: pv, Tx: codec.Transaction{EventID: "preview-1", AmountMinor: 5, EventTime: last + 1}, HasEventID: true}
	if err := svc.Read(ctx, p, req); err != nil || pv.Outcome != "" || pv.Features.Windows[1].Count < 2 {
		t.Fatalf("preview: %v %+v", err, pv)
	}
}

// BenchmarkRead: one lookup of one entity through Service.Read, the path the API takes:
// handed to the partition's worker over its queue, served in its loop, answered. The
// worker is otherwise idle, so this is the hand-over's cost (two goroutine wake-ups)
// plus the lookup.
func BenchmarkRead(b *testing.B) {
	brokers := newClusterB(b, 1)
	st := streamtest.Generate(inTopic, 5, 2000, 1)
	produceB(b, brokers, st)
	cfg := testConfigB(b, brokers)
	svc, stop := startServiceB(b, cfg)
	defer stop()
	ctx := context.Background()
	req := NewReadRequest(1, len(cfg.Specs))
	req.Items[0].Entity, req.Items[0].UseDefault = "card-7", true
	for end := time.Now().Add(30 * time.Second); ; {
		if err := svc.Read(ctx, 0, req); err == nil && req.Items[0].Info.LastOffset == int64(len(st.Records)-1) {
			break
		}
		if time.Now().After(end) {
			b.Fatal("the stream was not processed in 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := svc.Read(ctx, 0, req); err != nil || req.Items[0].Err != nil {
			b.Fatal(err, req.Items[0].Err)
		}
	}
}

// The benchmark's own helpers: service_test.go's take a *testing.T.

func newClusterB(b *testing.B, partitions int32) []string {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, inTopic, outTopic, dlqTopic))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c.ListenAddrs()
}

func produceB(b *testing.B, brokers []string, st streamtest.Stream) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), st.Records...).FirstErr(); err != nil {
		b.Fatal(err)
	}
}

func testConfigB(b *testing.B, brokers []string) Config {
	specs, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		b.Fatal(err)
	}
	return Config{
		Brokers: brokers, Group: "g", InputTopic: inTopic, OutputTopic: outTopic, DLQTopic: dlqTopic,
		Specs: specs, Limits: codec.DefaultLimits(), Store: checkpoint.NewMemoryStore(),
		CheckpointInterval: time.Minute, Host: "bench",
	}
}

func startServiceB(b *testing.B, cfg Config) (*Service, func()) {
	svc, err := New(cfg, zap.NewNop(), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	return svc, func() { cancel(); <-done }
}

// TestReadTimeout: a request whose worker does not serve it in time gives up with
// context.DeadlineExceeded after its Timeout, and a request reused with a timeout
// (its timer reset each time) is answered every time, never by a stale expiry, and
// still times out once it is not served.
func TestReadTimeout(t *testing.T) {
	stuck := &worker{queries: make(chan *ReadRequest, 1), done: make(chan struct{})}
	s := &Service{workers: map[int32]*worker{0: stuck}}
	req := NewReadRequest(1, 1)
	req.Timeout = 20 * time.Millisecond
	start := time.Now()
	if err := s.Read(context.Background(), 0, req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unserved read: %v", err)
	}
	if el := time.Since(start); el < req.Timeout || el > 2*time.Second {
		t.Fatalf("gave up after %v, timeout %v", el, req.Timeout)
	}

	// A worker that answers after 20 ms, reusing one request with a 200 ms timeout: a
	// timer not reset, or still holding an old expiry, would fail some of them, since
	// the 30 reads take three times the timeout. (At 5 and 50 ms a loaded machine's
	// scheduling delay alone failed a read now and then.)
	served := &worker{queries: make(chan *ReadRequest, 1), done: make(chan struct{})}
	s = &Service{workers: map[int32]*worker{0: served}}
	go func() {
		for r := range served.queries {
			time.Sleep(20 * time.Millisecond)
			r.Specs = []window.Spec{}
			r.done <- struct{}{}
		}
	}()
	defer close(served.queries)
	req = NewReadRequest(1, 1)
	req.Timeout = 200 * time.Millisecond
	for i := range 30 {
		req.Specs = nil
		if err := s.Read(context.Background(), 0, req); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}

	// The same request, now unserved: its timer, stopped after the last answer,
	// must run again, or the read would wait forever.
	stuck2 := &worker{queries: make(chan *ReadRequest, 1), done: make(chan struct{})}
	s = &Service{workers: map[int32]*worker{0: stuck2}}
	req.Specs = nil
	errc := make(chan error, 1)
	go func() { errc <- s.Read(context.Background(), 0, req) }()
	select {
	case err := <-errc:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("unserved reused read: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an unserved reused read never timed out: its timer was not reset")
	}
}

// TestConcurrentReadsInTurns: many readers at once, each one item, are served in
// turns (several requests per wake-up) and every answer is the single read's.
func TestConcurrentReadsInTurns(t *testing.T) {
	brokers := newCluster(t, 1)
	st := streamtest.Generate(inTopic, 6, 3000, 1)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	svc, _ := startService(t, cfg)
	readOutputs(t, brokers, len(st.Records), time.Minute)
	ctx := context.Background()
	entities := map[string]bool{}
	for _, e := range st.ByPart[0] {
		entities[e.Entity] = true
	}
	want := map[string][]window.Agg{}
	for ent := range entities {
		req := NewReadRequest(1, len(cfg.Specs))
		req.Items[0].Entity, req.Items[0].UseDefault = ent, true
		if err := svc.Read(ctx, 0, req); err != nil || req.Items[0].Err != nil {
			t.Fatal(err, req.Items[0].Err)
		}
		want[ent] = req.Items[0].Aggs
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := NewReadRequest(1, len(cfg.Specs))
			req.Timeout = 10 * time.Second
			for ent := range entities { // each goroutine every entity, in its own order
				req.Items[0] = ReadItem{Entity: ent, UseDefault: true, Aggs: req.Items[0].Aggs}
				req.Specs = nil
				for {
					err := svc.Read(ctx, 0, req)
					if errors.Is(err, ErrBusy) {
						time.Sleep(time.Millisecond)
						continue
					}
					if err != nil || req.Items[0].Err != nil {
						errs <- fmt.Errorf("%s: %v %v", ent, err, req.Items[0].Err)
						return
					}
					break
				}
				if !slices.Equal(req.Items[0].Aggs, want[ent]) {
					errs <- fmt.Errorf("%s: %+v, single read %+v", ent, req.Items[0].Aggs, want[ent])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestServeReadsAllocatesNothing: a turn of queued lookups (with its lookahead) is
// served without allocating: the turn and its cursors stay on the worker's stack.
func TestServeReadsAllocatesNothing(t *testing.T) {
	specs, _ := window.ParseSpecs(window.DefaultSpecs)
	dec, _ := codec.NewDecoder("", codec.DefaultLimits())
	proc, err := pipeline.New(pipeline.Config{Topic: "tx", Specs: specs, Decoder: dec}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: fmt.Sprintf("card-%d", i%50), AmountMinor: int64(i), EventTime: 1_800_000_000_000 + int64(i)*1000}
		proc.Process(pipeline.Record{Topic: "tx", Offset: int64(i), Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)}, func(*pipeline.Output) {})
	}
	s := &Service{cfg: Config{Specs: specs}}
	w := &worker{s: s, proc: proc, queries: make(chan *ReadRequest, queryQueue)}
	s.workers = map[int32]*worker{0: w}
	reqs := make([]*ReadRequest, 20)
	for i := range reqs {
		reqs[i] = NewReadRequest(3, len(specs))
		for j := range reqs[i].Items {
			reqs[i].Items[j].Entity, reqs[i].Items[j].UseDefault = fmt.Sprintf("card-%d", (i*3+j)%60), true
		}
	}
	allocs := testing.AllocsPerRun(50, func() {
		for _, r := range reqs[1:] {
			w.queries <- r
		}
		w.serveReads(reqs[0])
		for _, r := range reqs {
			<-r.done
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per turn", allocs)
	}
	for _, r := range reqs {
		if r.Specs == nil || r.Items[0].Err != nil {
			t.Fatalf("not served: %+v", r.Items[0])
		}
	}
	if reqs[0].Items[0].Aggs[3].Count == 0 {
		t.Fatal("card-0 read as empty")
	}
}

// TestSubmitThenWait: requests to several workers are all handed over before any is
// waited for. The two workers here answer only once both hold a request, so reading
// them one after the other (Read, Read) would never finish, and Submit, Submit,
// Wait, Wait must; a request not handed over (busy queue, no worker) is refused at
// Submit and Wait says so.
func TestSubmitThenWait(t *testing.T) {
	a := &worker{queries: make(chan *ReadRequest, 1), done: make(chan struct{})}
	b := &worker{queries: make(chan *ReadRequest, 1), done: make(chan struct{})}
	s1 := &Service{workers: map[int32]*worker{0: a}}
	s2 := &Service{workers: map[int32]*worker{3: b}}
	got := make(chan *ReadRequest, 2)
	for _, w := range []*worker{a, b} {
		go func() {
			r := <-w.queries
			got <- r
		}()
	}
	go func() { // the barrier: answer both once both are held
		r1, r2 := <-got, <-got
		for _, r := range []*ReadRequest{r1, r2} {
			r.Items[0].Info.LastOffset = 7
			r.Specs = []window.Spec{}
			r.done <- struct{}{}
		}
	}()
	r1, r2 := NewReadRequest(1, 1), NewReadRequest(1, 1)
	r1.Timeout, r2.Timeout = 10*time.Second, 10*time.Second
	if err := s1.Submit(0, r1); err != nil {
		t.Fatal(err)
	}
	if err := s2.Submit(3, r2); err != nil {
		t.Fatal(err)
	}
	for i, r := range []*ReadRequest{r1, r2} {
		if err := (&Service{}).Wait(context.Background(), r); err != nil || r.Items[0].Info.LastOffset != 7 {
			t.Fatalf("request %d: %v %+v", i, err, r.Items[0].Info)
		}
	}
	// Waited for once: a second Wait has nothing handed over.
	if err := s1.Wait(context.Background(), r1); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("a second Wait: %v", err)
	}

	full := &worker{queries: make(chan *ReadRequest), done: make(chan struct{})} // nobody receives
	s3 := &Service{workers: map[int32]*worker{0: full}}
	r3 := NewReadRequest(1, 1)
	r3.Timeout = time.Millisecond
	if err := s3.Submit(0, r3); !errors.Is(err, ErrBusy) {
		t.Fatalf("a full queue: %v", err)
	}
	if err := s3.Wait(context.Background(), r3); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("Wait after a refused Submit: %v", err)
	}
	if err := s3.Submit(1, r3); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("no worker: %v", err)
	}
	// The refused Submit stopped its timer: a later Read on a worker that answers
	// at once is not cut short by a stale expiry.
	time.Sleep(5 * time.Millisecond)
	ok := &worker{queries: make(chan *ReadRequest, 1), done: make(chan struct{})}
	go func() {
		r := <-ok.queries
		r.Specs = []window.Spec{}
		r.done <- struct{}{}
	}()
	r3.Timeout = 10 * time.Second
	if err := (&Service{workers: map[int32]*worker{0: ok}}).Read(context.Background(), 0, r3); err != nil {
		t.Fatalf("a read after a refused Submit: %v", err)
	}
}
