package service

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
)

// TestStallLimit: the limit is the session timeout less one and a half
// heartbeat intervals, with the heartbeat interval Run configures.
func TestStallLimit(t *testing.T) {
	for _, c := range []struct{ session, hb, limit time.Duration }{
		{0, 3 * time.Second, 40500 * time.Millisecond}, // franz-go's defaults: 45 s, 3 s
		{45 * time.Second, 3 * time.Second, 40500 * time.Millisecond},
		{6 * time.Second, 2 * time.Second, 3 * time.Second}, // the least the brokers accept
		{30 * time.Second, 3 * time.Second, 25500 * time.Millisecond},
	} {
		if hb := heartbeatInterval(c.session); hb != c.hb {
			t.Errorf("session %s: heartbeat interval %s, want %s", c.session, hb, c.hb)
		}
		if l := stallLimit(c.session); l != c.limit {
			t.Errorf("session %s: stall limit %s, want %s", c.session, l, c.limit)
		}
	}
}

// TestStallGuardOK: a read passes a disarmed guard, an armed one with a recent
// beat, and neither a gap past the limit (the guard has not beaten since: the
// process was stopped) nor the mark a noticed stall leaves.
func TestStallGuardOK(t *testing.T) {
	const limit = 3 * time.Second
	for _, c := range []struct {
		name    string
		armed   bool
		after   time.Duration // since the last beat
		suspect bool
		touch   time.Duration // since the newest confirmed heartbeat was sent, before the beat
		want    bool
	}{
		{"disarmed, long after", false, time.Hour, false, 0, true},
		{"just beaten", true, 0, false, 0, true},
		{"just within the limit", true, limit - 100*time.Millisecond, false, 0, true},
		{"past the limit", true, limit + time.Millisecond, false, 0, false},
		{"marked", true, 0, true, 0, false},
		{"marked and past the limit", true, time.Minute, true, 0, false},
		{"beaten, confirmed within the limit", true, 0, false, limit - 100*time.Millisecond, true},
		{"beaten, but confirmed no heartbeat for longer than the limit", true, 0, false, limit + 100*time.Millisecond, false},
		{"disarmed, never confirmed", false, 0, false, time.Hour, true},
	} {
		var shift atomic.Int64
		g := &stallGuard{now: func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }}
		if c.armed {
			g.arm(limit)
		}
		// The last confirmed heartbeat was sent c.touch before the beat: the
		// guard's clock moves on by that much, beating all along.
		shift.Store(int64(c.touch))
		// A read c.after after the beat sees at least that gap (the real clock,
		// microseconds here, only adds to it).
		g.beat(g.clock())
		g.suspect.Store(c.suspect)
		shift.Add(int64(c.after))
		if got := g.ok(); got != c.want {
			t.Errorf("%s: ok() = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestReadsRefusedAfterAStall: a process stalled past what the group is sure to
// wait for (invariant 5, stall.go) answers no read of its partitions until the
// group coordinator confirms its membership: a read right after the stall,
// before the guard has noticed it, is refused; reads stay refused while the
// coordinator does not confirm, and while only a confirmation sent before a
// second stall comes back; they are served again once one sent after the last
// stall does. Before the guard, the read right after the stall was answered
// from the partition's state.
func TestReadsRefusedAfterAStall(t *testing.T) {
	brokers := newCluster(t, 1)
	st := streamtest.Generate(inTopic, 4, 200, 1)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	m := metrics.New(prometheus.NewRegistry())
	svc, err := New(cfg, zaptest.NewLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	// The stall is made by moving the guard's clock on, which is what a stopped
	// process sees when it wakes up: no beat for that long.
	var shift atomic.Int64
	svc.stall.now = func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	svc.stall.scripted = true
	// The test answers each confirmation the guard asks for: asked tells it one
	// is out (its stall count taken), confirms is the coordinator's answer.
	asked, confirms := make(chan struct{}), make(chan error)
	svc.stall.confirm = func(ctx context.Context) error {
		select {
		case asked <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case err := <-confirms:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ctx := runUntilCleanup(t, svc)
	readOutputs(t, brokers, len(st.Records), time.Minute)

	read := func() error { return readDefault(ctx, svc, len(cfg.Specs), st.ByPart[0][0].Entity) }
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s", what)
			}
		}
	}
	if err := read(); err != nil {
		t.Fatalf("a read before any stall: %v", err)
	}
	stall := func() {
		shift.Add(int64(stallLimit(cfg.SessionTimeout) + time.Second))
	}

	stall()
	if err := read(); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("a read right after a stall: %v, want ErrNotOwned", err)
	}
	<-asked
	confirms <- kerr.UnknownMemberID // the coordinator does not confirm
	if err := read(); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("a read after a refused confirmation: %v, want ErrNotOwned", err)
	}
	// The guard asks again; a second stall comes before the answer, which then
	// confirms only the membership before that stall.
	<-asked
	stall()
	eventually("the guard notices the second stall", func() bool { return svc.stall.stalls.Load() == 2 })
	confirms <- nil
	if err := read(); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("a read confirmed only up to an earlier stall: %v, want ErrNotOwned", err)
	}
	<-asked // asked after the second stall
	confirms <- nil
	eventually("reads are served again", func() bool { return read() == nil })
	if n := testutil.ToFloat64(m.Stalls); n != 2 {
		t.Errorf("velocity_stalls_total = %v, want 2", n)
	}
}

// TestConfirmMembership: a member of the group, between rebalances, is
// confirmed by its coordinator; a client that holds no membership is not.
func TestConfirmMembership(t *testing.T) {
	brokers := newCluster(t, 2)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	svc, _ := startService(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for svc.Assigned() < 2 {
		if ctx.Err() != nil {
			t.Fatal("the service was not assigned both partitions within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var err error
	for range 100 { // a rebalance may still be settling: REBALANCE_IN_PROGRESS counts, a join in progress does not
		if err = svc.confirmMembership(ctx); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("a member of the group: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	loner := &Service{cfg: cfg, cons: cl}
	if err := loner.confirmMembership(ctx); !errors.Is(err, errNoMember) {
		t.Fatalf("a client in no group: %v, want errNoMember", err)
	}
}

// TestReadsRefusedOutOfTouchWithTheCoordinator: a process that runs on but can
// no longer reach the group coordinator (a network partition from the brokers,
// not from the API's callers) is expired by the group a session timeout after
// its last heartbeat arrived, and its partitions go to another member, while
// its own heartbeats fail rather than stop (invariant 6, stall.go). Its reads
// are refused once no heartbeat has been confirmed for the stall limit, with
// no stall counted, and served again once one is. Before invariant 6 every
// read was served from the partition's state throughout.
func TestReadsRefusedOutOfTouchWithTheCoordinator(t *testing.T) {
	brokers := newCluster(t, 1)
	st := streamtest.Generate(inTopic, 4, 200, 1)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.SessionTimeout = 6 * time.Second // the limit 3 s, a keep-alive every 750 ms
	m := metrics.New(prometheus.NewRegistry())
	svc, err := New(cfg, zaptest.NewLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	var cutOff atomic.Bool
	svc.stall.confirm = func(ctx context.Context) error {
		if cutOff.Load() {
			<-ctx.Done() // no answer comes through the partition
			return ctx.Err()
		}
		return svc.confirmMembership(ctx)
	}
	ctx := runUntilCleanup(t, svc)
	readOutputs(t, brokers, len(st.Records), time.Minute)
	read := func() error { return readDefault(ctx, svc, len(cfg.Specs), st.ByPart[0][0].Entity) }
	waitFor(t, "a read served while in touch", 10*time.Second, func() bool { return read() == nil })
	waitFor(t, "a keep-alive heartbeat confirmed", 10*time.Second, func() bool { return svc.stall.contact.Load() != 0 })

	cutOff.Store(true)
	cut := time.Now()
	waitFor(t, "reads refused once out of touch", 10*time.Second, func() bool { return errors.Is(read(), ErrNotOwned) })
	if took, limit := time.Since(cut), stallLimit(cfg.SessionTimeout); took > limit+2*time.Second {
		t.Errorf("reads refused %s after the cut, want within the limit %s (and a keep-alive)", took, limit)
	}
	cutOff.Store(false)
	waitFor(t, "reads served again once a heartbeat is confirmed", 10*time.Second, func() bool { return read() == nil })
	if n := testutil.ToFloat64(m.Stalls); n != 0 {
		t.Errorf("velocity_stalls_total = %v, want 0: the process never stopped", n)
	}
}

// runUntilCleanup runs svc until the test ends, failing the test if Run
// returns an error then; the context it returns ends with the test.
func runUntilCleanup(t *testing.T, svc *Service) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	})
	return ctx
}

// readDefault reads entity's default windows from partition 0 (nil: answered).
func readDefault(ctx context.Context, svc *Service, windows int, entity string) error {
	req := NewReadRequest(1, windows)
	req.Items[0].Entity, req.Items[0].UseDefault = entity, true
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return svc.Read(rctx, 0, req)
}
