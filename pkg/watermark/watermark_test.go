package watermark

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustNew(t testing.TB, cfg Config) *Stage {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return s
}

func ids(evs []Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.EventID
	}
	return out
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"negative lateness", Config{AllowedLateness: -1}, "allowed lateness"},
		{"negative horizon", Config{DedupeHorizon: -1}, "dedupe horizon"},
		{"horizon shorter than lateness", Config{AllowedLateness: 5000, DedupeHorizon: 4999}, "shorter than the allowed lateness"},
		{"negative idle", Config{IdleTimeout: -time.Second}, "idle timeout"},
		{"negative merge cap", Config{MaxMergeBytes: -1}, "max merge bytes"},
		{"low events above high", Config{HighEvents: 10, LowEvents: 11}, "event marks"},
		{"negative high events", Config{HighEvents: -1}, "event marks"},
		{"low bytes above high", Config{HighBytes: 10, LowBytes: 11}, "byte marks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New(%+v) error = %v, want one mentioning %q", tt.cfg, err, tt.want)
			}
		})
	}
	// A horizon shorter than the lateness is fine when dedupe is off.
	if _, err := New(Config{AllowedLateness: 5000, DedupeHorizon: 1, DisableDedupe: true}); err != nil {
		t.Fatalf("dedupe off with short horizon: %v", err)
	}
}

// TestExamples replays the worked example of docs/contract.md (lateness 2 s). The invalid
// row (offset 8) never reaches this stage: validation rejects it first.
func TestExamples(t *testing.T) {
	s := mustNew(t, Config{AllowedLateness: 2000})
	rows := []struct {
		offset  int64
		id      string
		entity  string
		amount  int64
		t       int64
		want    Verdict
		release []string // what Ready returns right after this row
	}{
		{0, "e1", "card-A", 1000, 0, Accepted, nil},
		{1, "e2", "card-A", 2500, 400, Accepted, nil},
		{2, "e3", "card-B", 700, 900, Accepted, nil},
		{3, "e4", "card-A", 300, 1500, Accepted, nil},
		{4, "e5", "card-A", 5000, 3200, Accepted, []string{"e1", "e2", "e3"}},
		{5, "e6", "card-A", 100, 1900, Accepted, nil},
		{6, "e7", "card-B", 900, 600, Late, nil},
		{7, "e2", "card-A", 2500, 400, Duplicate, nil},
		{9, "e10", "card-A", 40, 3200, Accepted, nil},
		{10, "e11", "card-A", 60, 11000, Accepted, []string{"e4", "e6", "e5", "e10"}},
		{11, "e12", "card-B", 80, 75000, Accepted, []string{"e11"}},
	}
	var got []Event
	for _, r := range rows {
		ev := Event{Offset: r.offset, EventTime: r.t, EventID: r.id, EntityID: r.entity, Amount: r.amount, Size: 100, Aux: r.offset * 7}
		if v := s.Offer(ev); v != r.want {
			t.Fatalf("offset %d (%s): verdict %v, want %v", r.offset, r.id, v, r.want)
		}
		got = s.Ready(got[:0])
		if !slices.Equal(ids(got), r.release) {
			t.Fatalf("after offset %d: released %v, want %v", r.offset, ids(got), r.release)
		}
		for _, ev := range got {
			if ev.Aux != ev.Offset*7 || ev.Size != 100 || ev.EntityID == "" {
				t.Fatalf("released event lost fields: %+v", ev)
			}
		}
	}
	if wm, ok := s.Watermark(); !ok || wm != 73000 {
		t.Fatalf("Watermark() = %d, %v; want 73000, true", wm, ok)
	}
	if got := ids(s.FlushAll(nil)); !slices.Equal(got, []string{"e12"}) {
		t.Fatalf("FlushAll = %v, want [e12]", got)
	}
	if s.Pending() != 0 || s.PendingBytes() != 0 {
		t.Fatalf("after flush: pending %d / %d bytes, want 0 / 0", s.Pending(), s.PendingBytes())
	}
}

func TestOfferBoundaries(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		evs  []Event
		want []Verdict
	}{
		{
			name: "event exactly at the watermark is not late",
			cfg:  Config{AllowedLateness: 100},
			evs:  []Event{{Offset: 0, EventTime: 1000, EventID: "a"}, {Offset: 1, EventTime: 900, EventID: "b"}, {Offset: 2, EventTime: 899, EventID: "c"}},
			want: []Verdict{Accepted, Accepted, Late},
		},
		{
			name: "duplicate is checked before late",
			cfg:  Config{AllowedLateness: 0},
			evs:  []Event{{Offset: 0, EventTime: 10, EventID: "a"}, {Offset: 1, EventTime: 20, EventID: "b"}, {Offset: 2, EventTime: 10, EventID: "a"}},
			want: []Verdict{Accepted, Accepted, Duplicate},
		},
		{
			name: "duplicate of a pending event",
			cfg:  Config{AllowedLateness: 1000},
			evs:  []Event{{Offset: 0, EventTime: 10, EventID: "a"}, {Offset: 1, EventTime: 10, EventID: "a"}},
			want: []Verdict{Accepted, Duplicate},
		},
		{
			name: "same id with another time is still a duplicate",
			cfg:  Config{AllowedLateness: 1000},
			evs:  []Event{{Offset: 0, EventTime: 10, EventID: "a"}, {Offset: 1, EventTime: 500, EventID: "a"}},
			want: []Verdict{Accepted, Duplicate},
		},
		{
			name: "late event does not move the watermark",
			cfg:  Config{AllowedLateness: 10},
			evs:  []Event{{Offset: 0, EventTime: 100, EventID: "a"}, {Offset: 1, EventTime: 50, EventID: "b"}, {Offset: 2, EventTime: 90, EventID: "c"}},
			want: []Verdict{Accepted, Late, Accepted},
		},
		{
			name: "duplicate does not move the watermark",
			cfg:  Config{AllowedLateness: 10},
			evs:  []Event{{Offset: 0, EventTime: 100, EventID: "a"}, {Offset: 1, EventTime: 5000, EventID: "a"}, {Offset: 2, EventTime: 95, EventID: "c"}},
			want: []Verdict{Accepted, Duplicate, Accepted},
		},
		{
			name: "id remembered until max seen minus horizon passes its time",
			cfg:  Config{AllowedLateness: 0, DedupeHorizon: 1000},
			evs: []Event{
				{Offset: 0, EventTime: 0, EventID: "a"},
				{Offset: 1, EventTime: 1000, EventID: "b"}, // floor 0: a still live
				{Offset: 2, EventTime: 1000, EventID: "a"}, // duplicate
				{Offset: 3, EventTime: 1001, EventID: "c"}, // floor 1: a expires
				{Offset: 4, EventTime: 1001, EventID: "a"}, // accepted again
				{Offset: 5, EventTime: 1001, EventID: "a"}, // and now a duplicate of that
			},
			want: []Verdict{Accepted, Accepted, Duplicate, Accepted, Accepted, Duplicate},
		},
		{
			name: "dedupe off accepts resends",
			cfg:  Config{AllowedLateness: 1000, DisableDedupe: true},
			evs:  []Event{{Offset: 0, EventTime: 10, EventID: "a"}, {Offset: 1, EventTime: 10, EventID: "a"}},
			want: []Verdict{Accepted, Accepted},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustNew(t, tt.cfg)
			for i, ev := range tt.evs {
				if v := s.Offer(ev); v != tt.want[i] {
					t.Fatalf("event %d (%+v): %v, want %v", i, ev, v, tt.want[i])
				}
			}
		})
	}
}

func TestReleaseOrderTiesBreakByOffset(t *testing.T) {
	s := mustNew(t, Config{AllowedLateness: 1000})
	for _, ev := range []Event{
		{Offset: 5, EventTime: 100, EventID: "a"},
		{Offset: 3, EventTime: 100, EventID: "b"},
		{Offset: 9, EventTime: 50, EventID: "c"},
		{Offset: 4, EventTime: 100, EventID: "d"},
	} {
		s.Offer(ev)
	}
	if got := s.Ready(nil); len(got) != 0 {
		t.Fatalf("Ready before the watermark passes: %v", ids(got))
	}
	s.Offer(Event{Offset: 10, EventTime: 1100, EventID: "e"})
	if got, want := ids(s.Ready(nil)), []string{"c", "b", "d", "a"}; !slices.Equal(got, want) {
		t.Fatalf("Ready = %v, want %v", got, want)
	}
}

// The in-order run and the heap must interleave as one sorted stream.
func TestRunMergesWithHeap(t *testing.T) {
	s := mustNew(t, Config{AllowedLateness: 5})
	s.Offer(Event{Offset: 0, EventTime: 10, EventID: "a"}) // run
	s.Offer(Event{Offset: 1, EventTime: 10, EventID: "b"}) // run (same time, later offset)
	s.Offer(Event{Offset: 0, EventTime: 10, EventID: "c"}) // same key as a, arrived later: heap
	s.Offer(Event{Offset: 2, EventTime: 12, EventID: "d"}) // run again
	s.Offer(Event{Offset: 1, EventTime: 10, EventID: "e"}) // same key as b, arrived later: heap
	if s.run.n != 3 || len(s.heap) != 2 {
		t.Fatalf("run %d / heap %d, want 3 / 2", s.run.n, len(s.heap))
	}
	if got := s.Ready(nil); len(got) != 0 {
		t.Fatalf("Ready below the watermark released %v", ids(got))
	}
	if got, want := ids(s.FlushAll(nil)), []string{"a", "c", "b", "e", "d"}; !slices.Equal(got, want) {
		t.Fatalf("FlushAll = %v, want %v", got, want)
	}
	if s.Pending() != 0 {
		t.Fatalf("pending %d after FlushAll", s.Pending())
	}
}

func TestRemember(t *testing.T) {
	s := mustNew(t, Config{AllowedLateness: 10, DedupeHorizon: 1000})
	s.Offer(Event{Offset: 0, EventTime: 5000, EventID: "a"})
	if v := s.Offer(Event{Offset: 1, EventTime: 4500, EventID: "late"}); v != Late {
		t.Fatalf("late event: %v", v)
	}
	s.Remember("late", 4500) // applied anyway under --late=apply
	if v := s.Offer(Event{Offset: 2, EventTime: 4500, EventID: "late"}); v != Duplicate {
		t.Fatalf("resend of a remembered late event: %v, want duplicate", v)
	}
	if m, _ := s.MaxSeen(); m != 5000 {
		t.Fatalf("Remember moved max seen to %d", m)
	}
	s.Remember("ancient", 3000) // outside the horizon already: ignored
	if v := s.Offer(Event{Offset: 3, EventTime: 4995, EventID: "ancient"}); v != Accepted {
		t.Fatalf("id remembered outside the horizon: %v, want accepted", v)
	}
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

func TestIdleReleasesEverythingAfterTimeout(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	s := mustNew(t, Config{AllowedLateness: 60000, IdleTimeout: 5 * time.Second, Now: clk.Now})
	s.Offer(Event{Offset: 0, EventTime: 2000, EventID: "a"})
	clk.t = clk.t.Add(3 * time.Second)
	s.Offer(Event{Offset: 1, EventTime: 1000, EventID: "b"})
	s.Offer(Event{Offset: 2, EventTime: 9, EventID: "dup"})
	clk.t = clk.t.Add(4 * time.Second) // 4 s since the last Offer
	if got := s.Idle(nil); len(got) != 0 {
		t.Fatalf("Idle before the timeout released %v", ids(got))
	}
	s.Offer(Event{Offset: 3, EventTime: 9, EventID: "dup"}) // a rejected offer is still activity
	clk.t = clk.t.Add(4 * time.Second)
	if got := s.Idle(nil); len(got) != 0 {
		t.Fatalf("Idle 4 s after a duplicate released %v", ids(got))
	}
	clk.t = clk.t.Add(time.Second)
	if got, want := ids(s.Idle(nil)), []string{"dup", "b", "a"}; !slices.Equal(got, want) {
		t.Fatalf("Idle after the timeout = %v, want %v", got, want)
	}
	if s.Pending() != 0 {
		t.Fatalf("pending %d after idle release", s.Pending())
	}
	// Idle release does not move the watermark: a later in-lateness event is accepted.
	if v := s.Offer(Event{Offset: 4, EventTime: 1500, EventID: "c"}); v != Accepted {
		t.Fatalf("event after idle release: %v", v)
	}
}

// TestIdleSetClock: once a caller sets the clock, Offer and Idle read it and never
// Config.Now, so one clock read serves a whole batch.
func TestIdleSetClock(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	reads := 0
	s := mustNew(t, Config{AllowedLateness: 60000, IdleTimeout: 100 * time.Millisecond,
		Now: func() time.Time { reads++; return t0 }})
	reads = 0 // New reads it once
	steps := []struct {
		at      time.Duration // the clock set before the step
		offer   string        // an event id to offer, or "" to call Idle
		release int           // events Idle must release
	}{
		{0, "a", 0},
		{99 * time.Millisecond, "", 0},
		{50 * time.Millisecond, "b", 0}, // the clock may be set back: activity at +50 ms
		{120 * time.Millisecond, "", 0}, // 70 ms since the last offer
		{149 * time.Millisecond, "", 0},
		{150 * time.Millisecond, "", 2},
	}
	for i, st := range steps {
		s.SetClock(t0.Add(st.at))
		if st.offer != "" {
			if v := s.Offer(Event{Offset: int64(i), EventTime: 1000, EventID: st.offer}); v != Accepted {
				t.Fatalf("step %d: offer %s: %v", i, st.offer, v)
			}
			continue
		}
		if got := s.Idle(nil); len(got) != st.release {
			t.Fatalf("step %d: Idle at +%v released %v, want %d events", i, st.at, ids(got), st.release)
		}
	}
	if reads != 0 {
		t.Fatalf("Config.Now read %d times with the clock set", reads)
	}
}

func TestIdleDisabled(t *testing.T) {
	called := false
	s := mustNew(t, Config{AllowedLateness: 1000, Now: func() time.Time { called = true; return time.Time{} }})
	s.Offer(Event{Offset: 0, EventTime: 1, EventID: "a"})
	if got := s.Idle(nil); len(got) != 0 || called {
		t.Fatalf("Idle with IdleTimeout 0 released %v, clock read %v", ids(got), called)
	}
}

func TestPressureHysteresis(t *testing.T) {
	s := mustNew(t, Config{AllowedLateness: 1 << 20, HighEvents: 4, LowEvents: 2, HighBytes: 1000, LowBytes: 500})
	steps := []struct {
		name  string
		do    func()
		want  bool
		count int
	}{
		{"4 events is at, not above, the high mark", func() {
			for i := range 4 {
				s.Offer(Event{Offset: int64(i), EventTime: int64(i), EventID: string(rune('a' + i)), Size: 10})
			}
		}, false, 4},
		{"5th event passes it", func() { s.Offer(Event{Offset: 4, EventTime: 4, EventID: "e", Size: 10}) }, true, 5},
		{"down to 2 is not below the low mark", func() { s.releaseN(3) }, true, 2},
		{"down to 1 is", func() { s.releaseN(1) }, false, 1},
		{"bytes above their high mark alone", func() { s.Offer(Event{Offset: 5, EventTime: 5, EventID: "f", Size: 1001}) }, true, 2},
		{"bytes below the low mark but events not", func() {
			s.Offer(Event{Offset: 6, EventTime: 6, EventID: "g", Size: 1})
			s.Offer(Event{Offset: 7, EventTime: 7, EventID: "h", Size: 1})
			s.releaseN(2) // e and f leave: 2 events, 2 bytes
		}, true, 2},
		{"both below", func() { s.releaseN(1) }, false, 1},
	}
	for _, st := range steps {
		st.do()
		if s.Pressure() != st.want || s.Pending() != st.count {
			t.Fatalf("%s: Pressure() = %v with %d pending (%d bytes), want %v with %d",
				st.name, s.Pressure(), s.Pending(), s.PendingBytes(), st.want, st.count)
		}
	}
}

// releaseN releases the n oldest pending events, for tests that need partial drains.
func (s *Stage) releaseN(n int) {
	for range n {
		var ev Event
		if s.run.n > 0 && (len(s.heap) == 0 || !s.heap[0].before(s.run.front())) {
			ev = s.run.pop()
		} else {
			ev = s.pop()
		}
		s.pendingBytes -= eventBytes(&ev)
	}
	s.updatePressure()
}

func TestReadyAppendsToDst(t *testing.T) {
	s := mustNew(t, Config{})
	s.Offer(Event{Offset: 0, EventTime: 1, EventID: "a"})
	dst := []Event{{EventID: "keep"}}
	if got := ids(s.Ready(dst)); !slices.Equal(got, []string{"keep", "a"}) {
		t.Fatalf("Ready(dst) = %v", got)
	}
}

func TestRestoreDetectsFlippedBitsAndTruncation(t *testing.T) {
	s := mustNew(t, Config{AllowedLateness: 100})
	s.Offer(Event{Offset: 0, EventTime: 1000, EventID: "a", EntityID: "x"})
	s.Offer(Event{Offset: 1, EventTime: 950, EventID: "b", EntityID: "y"})
	snap := s.AppendSnapshot(nil)
	for i := range snap {
		for _, bit := range []byte{0x01, 0x80} {
			bad := slices.Clone(snap)
			bad[i] ^= bit
			if _, err := Restore(Config{AllowedLateness: 100}, bad); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("flipping bit %#x of byte %d: err = %v, want ErrCorrupt", bit, i, err)
			}
		}
	}
	for n := range len(snap) {
		if _, err := Restore(Config{AllowedLateness: 100}, snap[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: err = %v, want ErrCorrupt", n, err)
		}
	}
	if _, err := Restore(Config{AllowedLateness: -1}, snap); err == nil || errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad config: err = %v, want a config error", err)
	}
}

// TestQuiet: the idle rule as a first stage reports it to its second stages, with or
// without pending events, and only with an idle timeout.
func TestQuiet(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		at    time.Duration
		offer bool
		quiet bool
	}{
		{0, false, false}, // just made: New counts as activity
		{999 * time.Millisecond, false, false},
		{time.Second, false, true},             // nothing ever offered, nothing pending: quiet all the same
		{1500 * time.Millisecond, true, false}, // an offer ends it
		{2499 * time.Millisecond, false, false},
		{2500 * time.Millisecond, false, true}, // pending events do not change it
	}
	s := mustNew(t, Config{AllowedLateness: 60000, IdleTimeout: time.Second, Now: func() time.Time { return t0 }})
	for i, st := range steps {
		s.SetClock(t0.Add(st.at))
		if st.offer {
			s.Offer(Event{Offset: int64(i), EventTime: 1000, EventID: "e"})
		}
		if got := s.Quiet(); got != st.quiet {
			t.Fatalf("step %d at +%v: Quiet = %v, want %v", i, st.at, got, st.quiet)
		}
	}
	if s.Pending() != 1 {
		t.Fatalf("pending %d, want the one offered event", s.Pending())
	}
	off := mustNew(t, Config{AllowedLateness: 1000, Now: func() time.Time { return t0 }})
	off.SetClock(t0.Add(time.Hour))
	if off.Quiet() {
		t.Fatal("Quiet with IdleTimeout 0")
	}
}
