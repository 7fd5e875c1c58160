package service

// Stalls: the process stopped for long enough that the group may have moved its
// partitions meanwhile (docs/api.md, "Answering").
//
// A partition's worker answers reads only while it is registered (query.go,
// invariant 3), and it leaves the registry when the group revokes the
// partition, or the client learns that it lost it, or the partition's store or
// transaction fences it. A process stopped past the group's session timeout
// (SIGSTOP, a VM paused, a machine suspended, a scheduler or GC stall) learns
// none of that until after it wakes up: its first heartbeat is answered
// UNKNOWN_MEMBER_ID, or its first save or commit is fenced. Until then its
// workers are still registered and would answer from a state that the group's
// new owner has moved past and committed past: an answer from a previous owner's
// state, which the randomized fault checker's querier catches
// (docs/fault-checker.md). The stall guard closes that window.
//
// Invariant 5 (no answer after a stall the group may have noticed): a read is
// answered only if, when its turn of reads begins, (a) no more than stallLimit
// has passed since the guard's last beat, and (b) no stall longer than
// stallLimit has been seen since the group coordinator last confirmed this
// member. The guard beats every stallBeat on a goroutine of its own. After a gap
// of more than stallLimit between two beats it marks the service suspect, and
// only then records the beat; a read loads the beat first and the mark second,
// so it cannot miss both (the loads and stores are sequentially consistent).
// The mark is cleared once a Heartbeat that the guard sent after the gap, with
// the member id and generation the client then holds, is answered with no error
// or REBALANCE_IN_PROGRESS: the coordinator still counts this member in that
// generation, so nothing it owns has been given to another member (the
// cooperative protocol takes a partition away only through the member's own
// revoke, which stops its worker first). Any other answer (UNKNOWN_MEMBER_ID,
// ILLEGAL_GENERATION) keeps the mark; the client hears the same on its own
// heartbeat, drops the partitions (lost) and joins again, and a heartbeat of the
// new membership clears the mark for the workers of the new assignment. A
// confirmation sent before a later stall does not clear the mark of that stall.
// A read refused so gets ErrNotOwned: the API forwards it to the owner the
// group names, or answers 503 with Retry-After.
//
// Why stallLimit is the session timeout less one and a half heartbeat
// intervals: while the member heartbeats, its last heartbeat before a stall was
// at most one heartbeat interval before the stall began, and the coordinator
// expires a member a session timeout after the last heartbeat it received. So a
// stall of at most stallLimit, answered within it, cannot outlast the session:
// the member is still in the group, with half an interval left for its first
// heartbeat after the stall to arrive. A longer one may have let the group
// move its partitions. The guard reads both clocks: the monotonic one (what a
// SIGSTOP or a scheduler stall shows) and the wall clock, which also counts a
// suspend of the machine that Linux's monotonic clock leaves out; a step of the
// wall clock forward can only make the guard suspect until its next heartbeat
// is answered.
//
// Invariant 6 (no answer out of touch with the group): a read is also answered
// only if, when its turn of reads begins, no more than stallLimit has passed
// since the guard sent the newest heartbeat that the coordinator answered as
// confirming the membership (as above). A process that runs on but cannot
// reach the coordinator (a network partition from the brokers but not from
// the API's callers) is expired a session timeout after the coordinator last
// heard from it, and its heartbeats fail rather than stop, so the beats alone
// would not see it. The guard sends such a heartbeat every keepAliveEvery (a
// quarter of the limit, at most a heartbeat interval: one request more per
// interval than the client's own) and keeps the send time of the last one
// confirmed. A coordinator unreachable for longer than the limit (a broker
// restart that moves it) refuses reads meanwhile too: they are forwarded or
// answered 503, which is the honest answer while the membership is unknown.

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// franz-go's defaults, which Run keeps when Config.SessionTimeout is 0.
const (
	defaultSessionTimeout    = 45 * time.Second
	defaultHeartbeatInterval = 3 * time.Second
)

// heartbeatInterval is the group heartbeat interval Run configures for a session
// timeout st (0: franz-go's default).
func heartbeatInterval(st time.Duration) time.Duration {
	if st <= 0 {
		return defaultHeartbeatInterval
	}
	return min(3*time.Second, st/3)
}

// stallLimit is the longest stall after which the member is certainly still in
// the group (see the invariant above): the session timeout less one and a half
// heartbeat intervals.
func stallLimit(st time.Duration) time.Duration {
	hb := heartbeatInterval(st)
	if st <= 0 {
		st = defaultSessionTimeout
	}
	return st - hb - hb/2
}

// stallBeat is how often the guard beats for a limit: often enough that its own
// tick is a small part of the limit.
func stallBeat(limit time.Duration) time.Duration {
	return max(min(100*time.Millisecond, limit/20), time.Millisecond)
}

// confirmEvery is how often the guard asks the coordinator again while a
// confirmation fails (the client rejoining, the coordinator moving).
const confirmEvery = 250 * time.Millisecond

// keepAliveEvery is how often the guard confirms the membership while nothing
// is suspect (invariant 6): often enough that a confirmation at most this old
// leaves most of the limit, never more often than confirmEvery.
func keepAliveEvery(st time.Duration) time.Duration {
	return max(min(heartbeatInterval(st), stallLimit(st)/4), confirmEvery)
}

// stallGuard is the state behind invariants 5 and 6. The zero value is disarmed:
// every read passes (a service that has not joined a group has no workers).
type stallGuard struct {
	limit    atomic.Int64 // stallLimit in ns; 0: disarmed
	base     time.Time    // the monotonic origin of beatMono, set before limit
	beatMono atomic.Int64 // the last beat, ns since base (monotonic)
	beatWall atomic.Int64 // the last beat, wall clock Unix ns
	suspect  atomic.Bool
	stalls   atomic.Uint64 // stalls seen; a confirmation counts only for the stalls before it was sent
	// contact is when the newest confirmed heartbeat was sent, ns since base
	// (monotonic; invariant 6). arm sets it to base: the join that precedes any
	// worker is the first contact.
	contact atomic.Int64
	// scripted turns the keep-alive confirmations (keepAliveEvery) off: a test
	// that answers every confirmation itself asks for those after stalls only.
	scripted bool
	// now is time.Now; tests move it on to make a stall without one.
	now func() time.Time
	// confirm asks the coordinator whether this member is still in the group
	// (Service.confirmMembership; tests replace it).
	confirm func(context.Context) error
}

func (g *stallGuard) clock() time.Time {
	if g.now != nil {
		return g.now()
	}
	return time.Now()
}

// arm starts checking stalls of more than limit, from now. Called before any
// worker starts (Run), so that every read sees base set.
func (g *stallGuard) arm(limit time.Duration) {
	g.base = g.clock()
	g.beat(g.base)
	g.contact.Store(0)
	g.limit.Store(int64(limit))
}

// confirmed records a confirmation of a heartbeat sent at sent (invariant 6).
// Answers may come back out of order: the newest send time wins.
func (g *stallGuard) confirmed(sent time.Time) {
	at := int64(sent.Sub(g.base))
	for {
		old := g.contact.Load()
		if at <= old || g.contact.CompareAndSwap(old, at) {
			return
		}
	}
}

// outOfTouch is how long it has been at now since the newest confirmed
// heartbeat was sent (monotonic).
func (g *stallGuard) outOfTouch(now time.Time) time.Duration {
	return now.Sub(g.base) - time.Duration(g.contact.Load())
}

func (g *stallGuard) beat(now time.Time) {
	g.beatMono.Store(int64(now.Sub(g.base)))
	g.beatWall.Store(now.UnixNano())
}

// gap is how long it has been since the last beat at now, by the longer of the
// monotonic and the wall clock.
func (g *stallGuard) gap(now time.Time) time.Duration {
	mono := now.Sub(g.base) - time.Duration(g.beatMono.Load())
	wall := time.Duration(now.UnixNano() - g.beatWall.Load())
	return max(mono, wall)
}

// ok reports whether a turn of reads beginning now may be served (invariants 5
// and 6). It costs a clock read and four atomic loads, and allocates nothing.
func (g *stallGuard) ok() bool {
	limit := time.Duration(g.limit.Load())
	if limit <= 0 {
		return true
	}
	// The beat first, then the mark: the guard sets the mark before it records
	// the beat that ends a long gap.
	now := g.clock()
	if g.gap(now) > limit || g.outOfTouch(now) > limit {
		return false
	}
	return !g.suspect.Load()
}

// watchStalls runs the stall guard until ctx ends: it beats, marks the service
// suspect after a gap longer than the limit, and asks the coordinator to
// confirm the membership until it does.
func (s *Service) watchStalls(ctx context.Context) {
	g := &s.stall
	limit := time.Duration(g.limit.Load())
	if limit <= 0 {
		return
	}
	tick := time.NewTicker(stallBeat(limit))
	defer tick.Stop()
	type answer struct {
		stalls uint64    // the stalls seen when it was sent
		sent   time.Time // when it was sent
		err    error
	}
	var (
		answers      = make(chan answer, 1)
		asking       bool
		lastAsk      time.Time
		suspectSince time.Time     // when the mark was set
		stalled      time.Duration // the stalls' total since then
		warned       bool          // out of touch (invariant 6) and said so
		keepAlive    = keepAliveEvery(s.cfg.SessionTimeout)
	)
	if g.scripted {
		keepAlive = 0
	}
	confirm := g.confirm
	if confirm == nil {
		confirm = s.confirmMembership
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case a := <-answers:
			asking = false
			if a.err == nil {
				g.confirmed(a.sent)
			}
			switch {
			case a.err != nil && (g.suspect.Load() || g.outOfTouch(g.clock()) > limit):
				s.log.Debug("stall guard: the group coordinator did not confirm the membership yet; reads stay refused", zap.Error(a.err))
			case a.err != nil:
				s.log.Debug("stall guard: the group coordinator did not confirm a heartbeat of the membership", zap.Error(a.err))
			case a.stalls == g.stalls.Load() && g.suspect.Load():
				g.suspect.Store(false)
				s.log.Info("stall guard: the group coordinator confirmed the membership; reads are served again",
					zap.Duration("stalled", stalled), zap.Duration("refused_after_it", g.clock().Sub(suspectSince)))
			}
		}
		now := g.clock()
		if gap := g.gap(now); gap > limit {
			// Mark before the beat (invariant 5).
			if !g.suspect.Load() {
				suspectSince, stalled = now, 0
			}
			g.suspect.Store(true)
			g.stalls.Add(1)
			stalled += gap
			s.m.Stalls.Inc()
			s.log.Warn("the process was stalled for longer than the group can be sure to keep its partitions (--session-timeout less 1.5 heartbeat intervals); the query API refuses reads until the group coordinator confirms the membership",
				zap.Duration("stalled", gap), zap.Duration("limit", limit))
		}
		g.beat(now)
		far := g.outOfTouch(now)
		switch {
		case far > limit && !warned && g.contact.Load() != 0 && !g.suspect.Load():
			// Not before the first confirmation (the group still being joined,
			// no worker to refuse) nor after a stall, which has its own warning.
			warned = true
			s.log.Warn("the group coordinator has confirmed no heartbeat for longer than the group can be sure to keep its partitions (--session-timeout less 1.5 heartbeat intervals); the query API refuses reads until it does",
				zap.Duration("since", far), zap.Duration("limit", limit))
		case far <= limit && warned:
			warned = false
			s.log.Info("stall guard: the group coordinator confirmed the membership again; reads are served again")
		}
		every := confirmEvery
		if !g.suspect.Load() && far <= limit {
			every = keepAlive
		}
		if every > 0 && !asking && now.Sub(lastAsk) >= every {
			asking, lastAsk = true, now
			n := g.stalls.Load()
			s.bg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				err := confirm(cctx)
				answers <- answer{n, now, err}
			})
		}
	}
}

// errNoMember: the client holds no group membership now (joining, or rejoining
// after it lost one).
var errNoMember = errors.New("service: not a member of the group now")

// confirmMembership sends the group coordinator a Heartbeat with the member id
// and generation the client holds now: nil when the coordinator answers that the
// member is in that generation (no error, or REBALANCE_IN_PROGRESS: still a
// member, the group rebalancing), the coordinator's error otherwise. An extra
// heartbeat is harmless to the group: it is what the client sends every
// heartbeat interval.
func (s *Service) confirmMembership(ctx context.Context) error {
	member, gen := s.cons.GroupMetadata()
	if member == "" || gen < 0 {
		return errNoMember
	}
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group, req.Generation, req.MemberID = s.cfg.Group, gen, member
	resp, err := req.RequestWith(ctx, s.cons)
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil && !errors.Is(err, kerr.RebalanceInProgress) {
		return err
	}
	return nil
}
