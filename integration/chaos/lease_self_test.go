//go:build integration

package chaos

import (
	"fmt"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

// TestGroupIdleLeaseRuleFires needs no broker: a re-keyed group's event counted
// out of order passes the lease rule (lease_test.go) only when it arrived
// below the largest watermark the other input partitions sent while its own
// partition's idle declaration held, one lease (1 s) of the repartition
// partition's clock past its last idle marker, or just past the newest event
// while every partition was idle; a lost owner's backlog that the frontier
// passed after the lease ran out fails it, whatever its input kind, with the
// group, the mode, the count, the kinds and the offsets.
func TestGroupIdleLeaseRuleFires(t *testing.T) {
	const t0 = int64(1_795_000_000_000)
	const ts0 = int64(1_800_000_000_000) // the brokers' clock
	type rec struct {
		ts    int64 // ms after ts0
		src   int32
		idle  bool  // a marker: idle
		off   int64 // an event: its input offset (-1: a marker)
		t, wm int64 // event time (events), watermark; ms after t0
	}
	marker := func(ts int64, src int32, wm int64, idle bool) rec {
		return rec{ts: ts, src: src, idle: idle, off: -1, wm: wm}
	}
	event := func(ts int64, src int32, off, tm, wm int64) rec {
		return rec{ts: ts, src: src, off: off, t: tm, wm: wm}
	}
	build := func(rs []rec) map[int32][]hopRecord {
		var out []hopRecord
		for i, r := range rs {
			hr := repartition.Record{Kind: repartition.KindMarker, Watermark: t0 + r.wm, Idle: r.idle, Event: repartition.Event{Source: r.src}}
			if r.off >= 0 {
				hr = repartition.Record{Kind: repartition.KindEvent, Watermark: t0 + r.wm, Event: repartition.Event{
					Source: r.src, Offset: r.off, EventTime: t0 + r.t, Topic: "in", Key: "EUR", EventID: fmt.Sprintf("ev-%d-%d", r.src, r.off), Amount: 1}}
			}
			v, err := repartition.AppendRecord(nil, &hr)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, hopRecord{off: int64(i), value: v, ts: ts0 + r.ts})
		}
		return map[int32][]hopRecord{2: out}
	}
	// Every partition quiet and declared idle by 0 ms (watermarks at 0: the
	// last burst's); partition 0's owner is then lost. A burst begins on the
	// others at 200 ms: their watermarks reach 3 000 ms of event time by 900
	// ms (inside partition 0's lease, which ends at 1 000 ms) and 20 000 ms by
	// 1 500 ms (past it). Partition 0's backlog reaches the second stage at
	// 5 000 ms.
	quiet := []rec{event(-3000, 0, 10, -1000, -2000), event(-3000, 1, 10, -900, -2000), event(-3000, 2, 10, -950, -2000), event(-3000, 3, 10, -980, -2000),
		marker(0, 0, 0, true), marker(0, 1, 0, true), marker(0, 2, 0, true), marker(0, 3, 0, true)}
	burst := []rec{marker(200, 1, 0, false), marker(200, 2, 0, false), marker(200, 3, 0, false),
		event(900, 1, 11, 4000, 3000), event(900, 2, 11, 4000, 3000), event(900, 3, 11, 4000, 3000),
		event(1500, 1, 12, 21000, 20000), event(1500, 2, 12, 21000, 20000), event(1500, 3, 12, 21000, 20000)}
	backlog := []rec{
		event(5000, 0, 11, 1000, 0),      // valid input, the burst's first: passed within the lease
		event(5000, 0, 12, 500, 0),       // in-lateness, passed within the lease
		event(5000, 0, 13, 3500, 0),      // valid, above what the lease let the others carry
		event(5000, 0, 14, 15000, 0),     // valid, likewise
		event(5000, 0, 15, 3200, 0),      // in-lateness (behind 0/13), likewise
		event(5000, 0, 16, 2999, 0),      // valid, just below the bound
		event(5000, 0, 17, 30000, 29000), // in order: not out of order at all
	}
	gen := map[srcKey]string{}
	for off := int64(10); off <= 18; off++ {
		gen[srcKey{0, off}] = fmt.Sprintf("valid ev-0-%d", off)
	}
	gen[srcKey{0, 18}] = "in-lateness ev-0-18"
	gen[srcKey{0, 12}], gen[srcKey{0, 15}] = "in-lateness ev-0-12", "in-lateness ev-0-15"
	ooo := func(offs ...int64) map[srcKey]bool {
		m := map[srcKey]bool{}
		for _, o := range offs {
			m[srcKey{0, o}] = true
		}
		return m
	}
	join := func(parts ...[]rec) []rec {
		var out []rec
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, c := range []struct {
		name   string
		log    []rec
		ooo    map[srcKey]bool
		want   []string // substrings of the one failure; nil: passes
		within int
	}{
		{"within the lease, valid and in-lateness input", join(quiet, burst, backlog), ooo(11, 12, 16), nil, 3},
		{"past the lease: a lost owner's backlog, whatever its kind", join(quiet, burst, backlog), ooo(11, 12, 13, 14, 15, 16),
			[]string{"group cur (eos): 3 events counted out of order", "map[in-lateness:1 valid:2]", "offsets: partition 0: 13-15 (3);",
				"the first, input 0/13 (valid ev-0-13, event time " + fmt.Sprint(t0+3500) + "), arrived at rt/2@", "500 ms at or above that bound", "5s before it"}, 3},
		{"a renewal extends the lease", join(quiet, burst[:3], []rec{marker(800, 0, 0, true)}, burst[3:], backlog), ooo(11, 12, 13, 14, 15, 16), nil, 6},
		{"a renewal after the lease ran out declares the partition idle again", join(quiet, burst[:6], []rec{marker(1200, 0, 0, true)}, burst[6:], backlog), ooo(13),
			nil, 1},
		{"anything else from the partition ends its declaration", join(quiet, []rec{marker(100, 0, 0, false)}, burst, backlog), ooo(11),
			[]string{"1 events", "offsets: partition 0: 11;"}, 0},
		{"never declared idle", join(burst, backlog), ooo(11), []string{"its partition having declared nothing idle there before it"}, 0},
		{"every partition idle: just past the newest event", join(quiet, []rec{event(100, 0, 18, -950, -2000)}), ooo(18), nil, 1},
		{"an out-of-order event with no hop record", join(quiet, burst), ooo(11), []string{"1 of them have no hop record in rt"}, 0},
		{"the idle rule's own effect after the fix: nothing passed", join(quiet, burst, backlog), ooo(), nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			fails, within := checkGroupLeases("cur", "eos", "rt", build(c.log), c.ooo, gen)
			if within != c.within {
				t.Errorf("%d below the bound, want %d", within, c.within)
			}
			switch {
			case c.want == nil && len(fails) > 0:
				t.Errorf("want no failure, got %q", fails)
			case c.want != nil && len(fails) != 1:
				t.Errorf("want one failure, got %q", fails)
			case c.want != nil:
				for _, w := range c.want {
					if !strings.Contains(fails[0], w) {
						t.Errorf("failure lacks %q:\n%s", w, fails[0])
					}
				}
			}
		})
	}
}
