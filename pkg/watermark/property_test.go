package watermark

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// oracle is the definition of docs/contract.md, written to be obviously right
// rather than fast: every acceptance is kept forever in a list and every question is
// answered by scanning it.
type oracle struct {
	lateness, horizon int64
	dedupe            bool
	hasMax            bool
	maxSeen           int64
	accepted          []struct {
		id string
		t  int64
	}
	pending []Event // arrival order
}

func (o *oracle) isDuplicate(id string) bool {
	if !o.dedupe {
		return false
	}
	for _, a := range o.accepted {
		if a.id == id && (!o.hasMax || a.t >= o.maxSeen-o.horizon) {
			return true
		}
	}
	return false
}

func (o *oracle) offer(ev Event) Verdict {
	if o.isDuplicate(ev.EventID) {
		return Duplicate
	}
	if o.hasMax && ev.EventTime < o.maxSeen-o.lateness {
		return Late
	}
	o.remember(ev.EventID, ev.EventTime)
	if !o.hasMax || ev.EventTime > o.maxSeen {
		o.maxSeen, o.hasMax = ev.EventTime, true
	}
	o.pending = append(o.pending, ev)
	return Accepted
}

func (o *oracle) remember(id string, t int64) {
	o.accepted = append(o.accepted, struct {
		id string
		t  int64
	}{id, t})
}

// release removes and returns, sorted by (EventTime, Offset) and then arrival, the
// pending events with EventTime <= limit (all of them if all is set).
func (o *oracle) release(limit int64, all bool) []Event {
	var out, keep []Event
	for _, ev := range o.pending {
		if all || ev.EventTime <= limit {
			out = append(out, ev)
		} else {
			keep = append(keep, ev)
		}
	}
	o.pending = keep
	slices.SortStableFunc(out, func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.EventTime, b.EventTime), cmp.Compare(a.Offset, b.Offset))
	})
	return out
}

func (o *oracle) ready() []Event {
	if !o.hasMax {
		return nil
	}
	return o.release(o.maxSeen-o.lateness, false)
}

type opKind uint8

const (
	opOffer opKind = iota
	opReady
	opRemember
	opFlush
)

type op struct {
	kind opKind
	ev   Event
}

// genOps builds a random partition: event times drift upward with jitter up to twice
// the lateness (so some events are late and many arrive out of order), resends of
// earlier ids (duplicates, or fresh acceptances once expired), repeated timestamps,
// and Ready / Remember / FlushAll calls at random points.
func genOps(r *rand.Rand, n int, lateness int64) []op {
	var ops []op
	var sent []Event
	base := int64(r.IntN(1000)) - 500
	for i := range n {
		base += int64(r.IntN(40))
		var ev Event
		switch x := r.IntN(100); {
		case x < 12 && len(sent) > 0: // resend an earlier event as is
			ev = sent[r.IntN(len(sent))]
		case x < 15 && len(sent) > 0: // reuse an id with a new time
			ev = sent[r.IntN(len(sent))]
			ev.EventTime = base - int64(r.Int64N(2*lateness+1))
		default:
			ev = Event{
				EventTime: base - int64(r.Int64N(2*lateness+1)),
				EventID:   fmt.Sprintf("id-%d", i),
				EntityID:  fmt.Sprintf("ent-%d", r.IntN(5)),
				Amount:    r.Int64N(1e6),
				Size:      int32(r.IntN(300)),
				Aux:       r.Int64(),
			}
		}
		ev.Offset = int64(len(sent))
		if r.IntN(50) == 0 && len(sent) > 0 { // a repeated offset, which Kafka never sends
			ev.Offset = sent[len(sent)-1].Offset
		}
		sent = append(sent, ev)
		ops = append(ops, op{kind: opOffer, ev: ev})
		switch x := r.IntN(100); {
		case x < 50:
			ops = append(ops, op{kind: opReady})
		case x < 53:
			ops = append(ops, op{kind: opRemember, ev: Event{EventID: fmt.Sprintf("rem-%d", r.IntN(n/4+1)), EventTime: base - r.Int64N(3*lateness+100)}})
		case x < 54:
			ops = append(ops, op{kind: opFlush})
		}
	}
	return append(ops, op{kind: opReady}, op{kind: opFlush})
}

type stepResult struct {
	verdict  Verdict
	released []Event
}

func runStage(t *testing.T, s *Stage, ops []op) []stepResult {
	t.Helper()
	out := make([]stepResult, len(ops))
	var buf []Event
	for i, o := range ops {
		switch o.kind {
		case opOffer:
			out[i].verdict = s.Offer(o.ev)
		case opReady:
			buf = s.Ready(buf[:0])
			out[i].released = slices.Clone(buf)
		case opRemember:
			s.Remember(o.ev.EventID, o.ev.EventTime)
		case opFlush:
			buf = s.FlushAll(buf[:0])
			out[i].released = slices.Clone(buf)
		}
	}
	return out
}

func runOracle(o *oracle, ops []op) []stepResult {
	out := make([]stepResult, len(ops))
	for i, op := range ops {
		switch op.kind {
		case opOffer:
			out[i].verdict = o.offer(op.ev)
		case opReady:
			out[i].released = o.ready()
		case opRemember:
			if o.dedupe {
				o.remember(op.ev.EventID, op.ev.EventTime)
			}
		case opFlush:
			out[i].released = o.release(0, true)
		}
	}
	return out
}

var propertyConfigs = []Config{
	{AllowedLateness: 0},
	{AllowedLateness: 0, DedupeHorizon: 50},
	{AllowedLateness: 100},
	{AllowedLateness: 100, DedupeHorizon: 100},
	{AllowedLateness: 100, DedupeHorizon: 300},
	{AllowedLateness: 2000},
	{AllowedLateness: 300, DisableDedupe: true},
}

func oracleFor(cfg Config) *oracle {
	h := cfg.DedupeHorizon
	if h == 0 {
		h = max(DefaultDedupeHorizon, cfg.AllowedLateness)
	}
	return &oracle{lateness: cfg.AllowedLateness, horizon: h, dedupe: !cfg.DisableDedupe}
}

// TestMatchesOracle checks every verdict and every release against the oracle, and
// the invariants the issue names: nothing lost or released twice, each release sorted,
// event time never going backwards across releases, and the late set exactly the one
// the definition gives.
func TestMatchesOracle(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 20
	}
	for ci, cfg := range propertyConfigs {
		var tally [3]int
		for seed := range seeds {
			r := rand.New(rand.NewPCG(uint64(seed), uint64(ci)))
			ops := genOps(r, 50+r.IntN(400), max(cfg.AllowedLateness, 10))
			s := mustNew(t, cfg)
			got := runStage(t, s, ops)
			want := runOracle(oracleFor(cfg), ops)

			accepted := map[string]int{} // offset+id -> times accepted minus times released
			lastT := int64(-1 << 62)
			for i := range ops {
				if got[i].verdict != want[i].verdict {
					t.Fatalf("cfg %+v seed %d op %d (%+v): verdict %v, oracle %v", cfg, seed, i, ops[i].ev, got[i].verdict, want[i].verdict)
				}
				if !sameEvents(got[i].released, want[i].released) {
					t.Fatalf("cfg %+v seed %d op %d: released %v, oracle %v", cfg, seed, i, got[i].released, want[i].released)
				}
				key := func(ev Event) string { return fmt.Sprint(ev.Offset, "/", ev.EventID, "/", ev.EventTime) }
				if ops[i].kind == opOffer {
					tally[got[i].verdict]++
					if got[i].verdict == Accepted {
						accepted[key(ops[i].ev)]++
					}
				}
				for j, ev := range got[i].released {
					accepted[key(ev)]--
					if j > 0 {
						p := got[i].released[j-1]
						if ev.EventTime < p.EventTime || ev.EventTime == p.EventTime && ev.Offset < p.Offset {
							t.Fatalf("seed %d op %d: release not sorted at %d", seed, i, j)
						}
					}
					if ops[i].kind == opReady && ev.EventTime < lastT {
						t.Fatalf("seed %d op %d: event time went back from %d to %d", seed, i, lastT, ev.EventTime)
					}
					lastT = max(lastT, ev.EventTime)
				}
				if ops[i].kind == opFlush {
					// A flush releases events above the watermark, which does not
					// move; later arrivals may be older than them. Start over.
					lastT = -1 << 62
				}
			}
			for k, n := range accepted {
				if n != 0 {
					t.Fatalf("cfg %+v seed %d: event %s accepted minus released = %d", cfg, seed, k, n)
				}
			}
			if s.Pending() != 0 || s.PendingBytes() != 0 {
				t.Fatalf("seed %d: %d pending, %d bytes after the final flush", seed, s.Pending(), s.PendingBytes())
			}
		}
		// The generator must exercise every verdict, or the comparison proves little.
		if tally[Accepted] == 0 || tally[Late] == 0 || (tally[Duplicate] == 0) != cfg.DisableDedupe {
			t.Fatalf("cfg %+v: verdicts accepted/duplicate/late = %v", cfg, tally)
		}
	}
}

// TestSnapshotAnyPointSameFuture snapshots at every op of random runs, restores, and
// requires the restored stage to make exactly the decisions and releases of the
// uninterrupted one, and to snapshot to the same bytes before and after.
func TestSnapshotAnyPointSameFuture(t *testing.T) {
	seeds := 25
	if testing.Short() {
		seeds = 5
	}
	for ci, cfg := range propertyConfigs {
		for seed := range seeds {
			r := rand.New(rand.NewPCG(uint64(seed)+1000, uint64(ci)))
			ops := genOps(r, 30+r.IntN(120), max(cfg.AllowedLateness, 10))
			full := runStage(t, mustNew(t, cfg), ops)
			for cut := 0; cut <= len(ops); cut++ {
				a := mustNew(t, cfg)
				runStage(t, a, ops[:cut])
				snap := a.AppendSnapshot(nil)
				b, err := Restore(cfg, snap)
				if err != nil {
					t.Fatalf("cfg %+v seed %d cut %d: Restore: %v", cfg, seed, cut, err)
				}
				if again := b.AppendSnapshot(nil); !bytes.Equal(again, snap) {
					t.Fatalf("cfg %+v seed %d cut %d: restored stage snapshots differently", cfg, seed, cut)
				}
				rest := runStage(t, b, ops[cut:])
				for i := range rest {
					w := full[cut+i]
					if rest[i].verdict != w.verdict || !sameEvents(rest[i].released, w.released) {
						t.Fatalf("cfg %+v seed %d cut %d op %d: restored gave %v %v, uninterrupted %v %v",
							cfg, seed, cut, cut+i, rest[i].verdict, ids(rest[i].released), w.verdict, ids(w.released))
					}
				}
				runStage(t, a, ops[cut:])
				if sa, sb := a.AppendSnapshot(nil), b.AppendSnapshot(nil); !bytes.Equal(sa, sb) {
					t.Fatalf("cfg %+v seed %d cut %d: final snapshots differ", cfg, seed, cut)
				}
			}
		}
	}
}

func TestSnapshotIsDeterministicAndAppends(t *testing.T) {
	cfg := Config{AllowedLateness: 100}
	r := rand.New(rand.NewPCG(7, 7))
	ops := genOps(r, 300, 100)
	ops = ops[:len(ops)-2] // keep events pending
	a, b := mustNew(t, cfg), mustNew(t, cfg)
	runStage(t, a, ops)
	runStage(t, b, ops)
	sa := a.AppendSnapshot([]byte("prefix"))
	sb := b.AppendSnapshot(nil)
	if !bytes.Equal(sa[len("prefix"):], sb) || string(sa[:6]) != "prefix" {
		t.Fatal("two stages with one history snapshot differently, or the prefix was overwritten")
	}
	if a.Pending() == 0 {
		t.Fatal("test needs pending events")
	}
	if again := a.AppendSnapshot(nil); !bytes.Equal(again, sb) {
		t.Fatal("snapshotting changed the state")
	}
}

// A snapshot taken with dedupe on restores under dedupe off (and back) without error:
// the flag is configuration, not state.
func TestRestoreUnderChangedConfig(t *testing.T) {
	s := mustNew(t, Config{AllowedLateness: 100, DedupeHorizon: 1000})
	s.Offer(Event{Offset: 0, EventTime: 5000, EventID: "a"})
	s.Offer(Event{Offset: 1, EventTime: 4950, EventID: "b"})
	snap := s.AppendSnapshot(nil)
	off, err := Restore(Config{AllowedLateness: 100, DisableDedupe: true}, snap)
	if err != nil {
		t.Fatalf("restore with dedupe off: %v", err)
	}
	if v := off.Offer(Event{Offset: 2, EventTime: 5000, EventID: "a"}); v != Accepted {
		t.Fatalf("dedupe off after restore: %v", v)
	}
	on, err := Restore(Config{AllowedLateness: 100, DedupeHorizon: 1000}, snap)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if v := on.Offer(Event{Offset: 2, EventTime: 5000, EventID: "a"}); v != Duplicate {
		t.Fatalf("resend after restore: %v, want duplicate", v)
	}
	if got := ids(on.FlushAll(nil)); !slices.Equal(got, []string{"b", "a"}) {
		t.Fatalf("restored pending = %v", got)
	}
}

// sameEvents compares released events field by field (Ext by its words: a nil and an
// empty Ext are the same).
func sameEvents(a, b []Event) bool {
	return slices.EqualFunc(a, b, func(x, y Event) bool {
		return x.Offset == y.Offset && x.EventTime == y.EventTime && x.EventID == y.EventID &&
			x.EntityID == y.EntityID && x.Amount == y.Amount && x.Size == y.Size && x.Aux == y.Aux &&
			slices.Equal(x.Ext, y.Ext)
	})
}
