package service

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

func TestPollRound(t *testing.T) {
	for _, tc := range []struct {
		name              string
		batches, finished int
		wantDone          bool
	}{
		{"no batches", 0, 0, true},
		{"all finished", 3, 3, true},
		{"one left", 3, 2, false},
		{"none finished", 2, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPollRound()
			for range tc.batches {
				r.left.Add(1)
			}
			r.finish() // the poll loop's own count
			for range tc.finished {
				r.finish()
			}
			select {
			case <-r.done:
				if !tc.wantDone {
					t.Fatalf("done with %d of %d batches finished", tc.finished, tc.batches)
				}
			default:
				if tc.wantDone {
					t.Fatalf("not done with %d of %d batches finished", tc.finished, tc.batches)
				}
			}
		})
	}
	var nilRound *pollRound
	nilRound.finish() // held records carry no round
}

func TestAwaitRoundBounds(t *testing.T) {
	s := &Service{roundWait: 20 * time.Millisecond}
	never := newPollRound()
	never.left.Add(1) // a batch whose worker left without processing it

	start := time.Now()
	s.awaitRound(context.Background(), never)
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("returned after %v, before its bound, with a batch unfinished", d)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	s.roundWait = time.Hour
	s.awaitRound(ctx, never)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a cancelled context did not end the wait (%v)", d)
	}

	finished := newPollRound()
	finished.left.Add(1)
	go func() { time.Sleep(10 * time.Millisecond); finished.finish(); finished.finish() }()
	start = time.Now()
	s.awaitRound(context.Background(), finished)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("finishing the round did not end the wait (%v)", d)
	}
}

// TestPollWaitsForItsBatches checks natural batching: while a poll's batch is
// still being processed, the poll loop does not poll again, so the next fetch
// carries everything that arrived meanwhile. Without the wait the loop hands
// the batch off and polls at once, while the worker is still on it. The
// exception is a poll that came back full (maxPollRecords): more is already
// fetched (a backlog, or input produced before we started), and the loop takes
// it at once.
func TestPollWaitsForItsBatches(t *testing.T) {
	for _, tc := range []struct {
		name    string
		records int
		// early: the loop should poll while the first batch is in progress.
		early bool
	}{
		{"keeping up", 200, false},
		{"backlog", 3 * maxPollRecords, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			brokers := newCluster(t, 1)
			st := streamtest.Generate(inTopic, 3, tc.records, 1)
			produce(t, brokers, st.Records)
			cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
			// The worker stops at its first output until the test releases it.
			var inBatch, released atomic.Bool
			blocked, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			cfg.Observe = func(*pipeline.Output) {
				once.Do(func() {
					inBatch.Store(true)
					close(blocked)
					<-release
					inBatch.Store(false)
				})
			}
			svc, err := New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
			if err != nil {
				t.Fatal(err)
			}
			svc.roundWait = time.Minute
			var polls, early atomic.Int64
			svc.beforePoll = func() {
				polls.Add(1)
				if !released.Load() {
					// Give a batch just handed off the time to reach the
					// blocked output: is the loop polling while it is there?
					time.Sleep(100 * time.Millisecond)
					if inBatch.Load() {
						early.Add(1)
					}
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- svc.Run(ctx) }()

			select {
			case <-blocked:
			case <-time.After(30 * time.Second):
				t.Fatal("no output within 30 s")
			}
			time.Sleep(300 * time.Millisecond)
			before := polls.Load()
			released.Store(true)
			close(release)
			got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
			if n := early.Load(); tc.early && n == 0 {
				t.Error("with a full poll the loop waited for its batch instead of taking the records already fetched")
			} else if !tc.early && n > 0 {
				t.Errorf("the poll loop polled %d times while its batch was still being processed", n)
			}
			if !tc.early {
				// The wait ends with the batch: the loop polls again. (A
				// backlog's loop has polled everything there is already.)
				waitFor(t, "a poll after the batch", 10*time.Second, func() bool { return polls.Load() > before })
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			streamtest.Check(t, st, cfg.Specs, got, true)
		})
	}
}
