package repartition

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func hop(p int32, off, t, wm int64) Record {
	return Record{Kind: KindEvent, Watermark: wm, Event: Event{Source: p, Offset: off, EventTime: t, Topic: "in", Key: "k", EventID: fmt.Sprint("e", p, "-", off)}}
}

func mark(p int32, wm int64) Record {
	return Record{Kind: KindMarker, Watermark: wm, Event: Event{Source: p}}
}

func idleMark(p int32, wm int64, epoch uint64) Record {
	return Record{Kind: KindMarker, Watermark: wm, Idle: true, Epoch: epoch, Event: Event{Source: p}}
}

func epochHop(r Record, epoch uint64) Record { r.Epoch = epoch; return r }

// at gives r the record timestamp ts (Record.LogTime).
func at(r Record, ts int64) Record { r.LogTime = ts; return r }

// leased is an idle marker with a lease of d ms.
func leased(p int32, wm int64, epoch uint64, d int64) Record {
	r := idleMark(p, wm, epoch)
	r.Lease = d
	return r
}

// step is one record and what the Merger must do with it: the verdict, then what the
// following Ready releases, as "source/offset" strings.
type step struct {
	r       Record
	verdict Verdict
	release []string
}

func released(evs []Event) []string {
	out := []string{}
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%d/%d", e.Source, e.Offset))
	}
	return out
}

func TestMergerRules(t *testing.T) {
	cases := []struct {
		name    string
		sources int
		steps   []step
	}{
		{"released only below every source's watermark", 2, []step{
			{hop(0, 0, 100, 100), Accepted, nil}, // source 1 has promised nothing yet
			{hop(0, 1, 110, 110), Accepted, nil},
			{mark(1, 105), Marked, []string{"0/0"}}, // F = min(110, 105)
			{hop(1, 0, 105, 105), Accepted, nil},    // exactly at the frontier: accepted, held
			{mark(1, 200), Marked, []string{"1/0"}}, // F = 110: 105 released, 110 held
			{mark(0, 300), Marked, []string{"0/1"}}, // F = 200
			{hop(1, 1, 200, 200), Accepted, nil},    // at F again
			{mark(1, 201), Marked, []string{"1/1"}}, // F = 201
			{mark(0, 100), Marked, nil},             // a lower watermark changes nothing
			{mark(1, math.MaxInt64), Marked, nil},   // F = min(300, max) = 300: nothing pending
		}},
		{"ties in event time release in source then offset order", 3, []step{
			{hop(2, 5, 100, 100), Accepted, nil},
			{hop(1, 9, 100, 100), Accepted, nil},
			{hop(1, 3, 100, 100), Accepted, nil}, // out of offset order within the source
			{hop(0, 7, 100, 100), Accepted, nil},
			{mark(0, 101), Marked, nil},
			{mark(1, 101), Marked, nil},
			{mark(2, 101), Marked, []string{"0/7", "1/3", "1/9", "2/5"}},
		}},
		{"re-sends are duplicates, below the watermark, pending, or at it", 2, []step{
			{hop(0, 0, 100, 100), Accepted, nil},
			{hop(0, 1, 100, 100), Accepted, nil},
			{hop(0, 0, 100, 100), Duplicate, nil}, // at the watermark: found in the pending queue
			{hop(0, 2, 120, 120), Accepted, nil},
			{hop(0, 1, 100, 90), Duplicate, nil}, // below the watermark (a restart's lower one)
			{mark(1, 500), Marked, []string{"0/0", "0/1"}},
			{hop(0, 0, 100, 100), Duplicate, nil}, // released: below the watermark
			{hop(0, 2, 120, 120), Duplicate, nil}, // at the watermark and pending
			{mark(0, 121), Marked, []string{"0/2"}},
			{hop(0, 2, 120, 120), Duplicate, nil},
		}},
		{"an event above its source's watermark (the source's idle release) is placed in order", 2, []step{
			{hop(0, 4, 300, 100), Accepted, nil},
			{hop(0, 5, 310, 100), Accepted, nil},
			{hop(0, 6, 150, 150), Accepted, nil}, // arrives later, released first
			{hop(0, 5, 310, 150), Duplicate, nil},
			{mark(1, 1000), Marked, nil}, // F = min(150, 1000): 150 itself is held
			{mark(0, 400), Marked, []string{"0/6", "0/4", "0/5"}},
		}},
		{"an idle source stops holding the frontier back", 2, []step{
			{hop(0, 0, 100, 100), Accepted, nil},
			{hop(1, 0, 90, 90), Accepted, nil},             // F = 90: held
			{hop(1, 1, 95, 95), Accepted, []string{"1/0"}}, // F = 95
			{hop(0, 1, 200, 200), Accepted, nil},
			{hop(1, 2, 150, 95), Accepted, nil},                         // above source 1's watermark
			{idleMark(1, 95, 0), Marked, []string{"1/1", "0/0", "1/2"}}, // F = 200
			{hop(1, 2, 150, 95), Duplicate, nil},                        // released at or above its watermark: remembered
			{hop(1, 3, 120, 120), LateAfterIdle, nil},                   // new and below F: dead letter
			{hop(1, 3, 120, 120), Duplicate, nil},                       // its re-send is not a second one
			{hop(1, 4, 199, 199), LateAfterIdle, nil},
			{hop(1, 5, 200, 200), Accepted, nil}, // source 1 is back: F waits for it
			{mark(0, 500), Marked, nil},
			{mark(1, 201), Marked, []string{"0/1", "1/5"}},
		}},
		{"a stale idle marker from an old owner is not honoured", 2, []step{
			{epochHop(hop(1, 0, 100, 100), 3), Accepted, nil},
			{hop(0, 0, 300, 300), Accepted, []string{}},
			{idleMark(1, 100, 2), StaleIdle, nil},          // epoch 2 < 3: source 1 still holds F at 100
			{idleMark(1, 100, 3), Marked, []string{"1/0"}}, // F = 300
			{mark(0, 301), Marked, []string{"0/0"}},
		}},
		{"with every source idle everything pending is released", 2, []step{
			{hop(0, 0, 100, 50), Accepted, nil},
			{hop(1, 0, 100, 60), Accepted, nil},
			{hop(1, 1, 130, 60), Accepted, nil},
			{idleMark(0, 50, 0), Marked, nil},                           // F = 60
			{idleMark(1, 60, 0), Marked, []string{"0/0", "1/0", "1/1"}}, // F = 131
			{hop(0, 1, 130, 80), LateAfterIdle, nil},
			{hop(0, 2, 131, 131), Accepted, nil}, // at F: in order, held
			{mark(1, 140), Marked, nil},          // F = min(131, 140)
			{mark(0, 132), Marked, []string{"0/2"}},
		}},
		{"a source never heard from holds everything", 3, []step{
			{hop(0, 0, 100, 100), Accepted, nil},
			{mark(1, 1000), Marked, nil},
			{mark(0, 1000), Marked, nil},
			{idleMark(2, NoWatermark, 0), Marked, []string{"0/0"}},
		}},
		{"a lease that runs out puts its source back in the order", 2, []step{
			{at(hop(0, 0, 100, 100), 1000), Accepted, nil},
			{at(leased(1, 100, 1, 500), 1100), Marked, nil}, // held to the clock's 1600; F = 100
			{at(hop(0, 1, 200, 200), 1200), Accepted, []string{"0/0"}},
			{at(hop(0, 2, 300, 300), 1600), Accepted, []string{"0/1"}}, // 1600: the lease still holds
			{at(hop(0, 3, 400, 400), 1601), Accepted, nil},             // it has run out: source 1 holds F at 300
			{at(hop(1, 1, 350, 350), 1700), Accepted, []string{"0/2"}}, // in order, not late
			{at(mark(1, 500), 1800), Marked, []string{"1/1"}},
		}},
		{"a renewal extends the lease, an old owner's does not", 2, []step{
			{at(epochHop(hop(1, 0, 100, 100), 2), 1000), Accepted, nil},
			{at(leased(1, 100, 2, 500), 1000), Marked, nil}, // to 1500; source 0 not heard yet
			{at(hop(0, 0, 200, 200), 1400), Accepted, []string{"1/0"}},
			{at(leased(1, 100, 1, 500), 1450), StaleIdle, nil}, // epoch 1: the lease stays 1500
			{at(leased(1, 100, 2, 500), 1500), Marked, nil},    // renewed to 2000
			{at(hop(0, 1, 300, 300), 1900), Accepted, []string{"0/0"}},
			{at(hop(0, 2, 400, 400), 2001), Accepted, nil}, // run out: F stays at 300
			{at(leased(1, 100, 2, 500), 2100), Marked, []string{"0/1"}},
		}},
		{"no timestamp, no clock: a lease read before any holds until the source sends anything", 2, []step{
			{leased(0, 100, 0, 10), Marked, nil},
			{at(hop(1, 0, 100, 100), 5000), Accepted, nil},
			{at(mark(1, 200), 1_000_000), Marked, []string{"1/0"}},
			{at(hop(1, 1, 300, 300), 2_000_000), Accepted, nil},
			{at(mark(1, 400), 3_000_000), Marked, []string{"1/1"}},
		}},
		{"everything idle, then a lost owner holds the burst back", 2, []step{
			{at(hop(0, 0, 100, 100), 1000), Accepted, nil},
			{at(hop(1, 0, 100, 100), 1000), Accepted, nil},
			{at(leased(0, 100, 1, 1000), 3000), Marked, nil},
			{at(leased(1, 100, 1, 1000), 3000), Marked, []string{"0/0", "1/0"}}, // F = 101
			{at(leased(0, 100, 1, 1000), 3500), Marked, nil},                    // source 1's owner is lost
			{at(leased(0, 100, 1, 1000), 4000), Marked, nil},                    // 4000: source 1's lease holds
			{at(mark(0, 100), 4100), Marked, nil},                               // source 0 wakes; source 1's lease has run out
			{at(hop(0, 1, 4000, 4000), 4100), Accepted, nil},                    // F stays 101
			{at(epochHop(mark(1, 100), 2), 9000), Marked, nil},                  // the new owner
			{at(epochHop(hop(1, 1, 4050, 100), 2), 9000), Accepted, nil},        // read late, yet in order
			{at(epochHop(mark(1, 5000), 2), 9100), Marked, nil},                 // F = 4000
			{at(mark(0, 5000), 9100), Marked, []string{"0/1", "1/1"}},
		}},
		{"counted keys above the watermark go once the watermark passes them", 2, []step{
			{hop(0, 0, 100, 10), Accepted, nil},
			{hop(0, 1, 110, 10), Accepted, nil},
			{idleMark(0, 10, 0), Marked, nil},
			{mark(1, 200), Marked, []string{"0/0", "0/1"}},
			{hop(0, 1, 110, 10), Duplicate, nil},
			{mark(0, 105), Marked, nil},          // prunes (100, 0); (110, 1) stays
			{hop(0, 0, 100, 10), Duplicate, nil}, // by the watermark now
			{hop(0, 1, 110, 10), Duplicate, nil}, // by the counted key
			{hop(0, 2, 105, 105), LateAfterIdle, nil},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := New(Config{Sources: c.sources})
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range c.steps {
				v, err := m.Offer(&s.r)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if v != s.verdict {
					t.Fatalf("step %d %+v: verdict %v, want %v", i, s.r, v, s.verdict)
				}
				got := released(m.Ready(nil))
				if want := s.release; !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
					t.Fatalf("step %d: released %v, want %v (frontier %d)", i, got, want, m.Frontier())
				}
			}
		})
	}
}

func TestMergerRefuses(t *testing.T) {
	m, err := New(Config{Sources: 2, ExtWords: 1})
	if err != nil {
		t.Fatal(err)
	}
	good := hop(0, 0, 100, 100)
	good.Ext = []uint64{1}
	if v, err := m.Offer(&good); err != nil || v != Accepted {
		t.Fatalf("good record: %v, %v", v, err)
	}
	before := m.AppendSnapshot(nil)
	for _, c := range []struct {
		name string
		f    func(*Record)
		want error
	}{
		{"source past the count", func(r *Record) { r.Source = 2 }, ErrUnknownSource},
		{"negative source", func(r *Record) { r.Source = -1 }, ErrUnknownSource},
		{"words missing", func(r *Record) { r.Ext = nil }, ErrExtLen},
		{"watermark above the event", func(r *Record) { r.Watermark = r.EventTime + 1 }, ErrWatermark},
		{"reserved event time", func(r *Record) { r.EventTime = math.MaxInt64 }, ErrEventTime},
		{"empty key", func(r *Record) { r.Key = "" }, ErrKey},
		{"unknown kind", func(r *Record) { r.Kind = 0 }, ErrKind},
	} {
		r := hop(1, 5, 200, 200)
		r.Ext = []uint64{2}
		c.f(&r)
		if _, err := m.Offer(&r); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
	}
	if after := m.AppendSnapshot(nil); string(after) != string(before) {
		t.Fatal("a refused record changed the state")
	}
	for _, cfg := range []Config{{Sources: 0}, {Sources: MaxSources + 1}, {Sources: 1, ExtWords: -1}, {Sources: 1, ExtWords: MaxExtWords + 1}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// TestReadyExtAndStrings: released events carry every field; their Ext words are the
// ones offered, even after the queue moved (compaction, middle inserts).
func TestReadyExtAndStrings(t *testing.T) {
	const n = 3
	m, _ := New(Config{Sources: 2, ExtWords: n})
	var want []Event
	for i := range 2000 {
		// Source 0 in order, source 1 in reverse blocks of 10 (middle inserts).
		p := int32(i % 2)
		off := int64(i / 2)
		tm := 1000 + off
		if p == 1 {
			tm = 1000 + (off/10)*10 + (9 - off%10)
		}
		r := hop(p, off, tm, NoWatermark)
		r.Key = strings.Repeat("k", 1+i%7)
		r.Amount = int64(i)
		r.Ext = []uint64{uint64(i), uint64(i) << 8, ^uint64(i)}
		if _, err := m.Offer(&r); err != nil {
			t.Fatal(err)
		}
		e := r.Event
		e.Ext = slices.Clone(r.Ext)
		want = append(want, e)
	}
	slices.SortFunc(want, func(a, b Event) int {
		if a.EventTime != b.EventTime {
			return int(a.EventTime - b.EventTime)
		}
		if a.Source != b.Source {
			return int(a.Source - b.Source)
		}
		return int(a.Offset - b.Offset)
	})
	var got []Event
	for i := range 50 {
		for p := range int32(2) {
			r := mark(p, 1000+int64(i)*25)
			m.Offer(&r)
		}
		for _, e := range m.Ready(nil) {
			e.Ext = slices.Clone(e.Ext)
			got = append(got, e)
		}
	}
	for p := range int32(2) {
		r := mark(p, math.MaxInt64)
		m.Offer(&r)
	}
	for _, e := range m.Ready(nil) {
		e.Ext = slices.Clone(e.Ext)
		got = append(got, e)
	}
	diffEvents(t, "released", got, want)
	if m.Pending() != 0 {
		t.Fatalf("%d still pending", m.Pending())
	}
	s := m.Stats()
	if s.Accepted != 2000 || s.Released != 2000 || s.Markers != 102 {
		t.Fatalf("stats %+v", s)
	}
}

// TestSteadyStateAllocations: once its buffers have grown, Offer and Ready allocate
// nothing.
func TestSteadyStateAllocations(t *testing.T) {
	const sources = 6
	m, _ := New(Config{Sources: sources, ExtWords: 2})
	recs := make([]Record, 6000)
	for i := range recs {
		p := int32(i % sources)
		tm := int64(i/sources) + int64(p%3)
		recs[i] = hop(p, int64(i), tm, tm)
		recs[i].Ext = []uint64{1, 2}
	}
	buf := make([]Event, 0, 64)
	i := 0
	one := func() {
		r := recs[i%len(recs)]
		base := int64(i/len(recs)) * 10000
		r.EventTime += base
		r.Watermark += base
		r.Offset += int64(i/len(recs)) * int64(len(recs))
		if _, err := m.Offer(&r); err != nil {
			t.Fatal(err)
		}
		buf = m.Ready(buf[:0])
		i++
	}
	for range 3 * len(recs) {
		one()
	}
	if a := testing.AllocsPerRun(5000, one); a != 0 {
		t.Fatalf("%v allocations per Offer+Ready", a)
	}
}

// TestWorkedExample plays the tables of docs/repartition.md row by row, then the
// first table's records in another interleaving, which must release the same sequence.
func TestWorkedExample(t *testing.T) {
	x, y, z := hop(1, 0, 1010, 1010), hop(1, 1, 1030, 1030), hop(1, 2, 1200, 1200)
	a, b, c := hop(0, 0, 1000, 1000), hop(0, 1, 1040, 1040), hop(0, 2, 1100, 1100)
	d, e := hop(0, 3, 1300, 1300), hop(0, 4, 1450, 1450)
	rows := []struct {
		r        Record
		verdict  Verdict
		w0, w1   int64
		idle0    bool
		F        int64
		released []string
	}{
		{x, Accepted, NoWatermark, 1010, false, NoWatermark, nil},
		{a, Accepted, 1000, 1010, false, 1000, nil},
		{b, Accepted, 1040, 1010, false, 1010, []string{"0/0"}},
		{y, Accepted, 1040, 1030, false, 1030, []string{"1/0"}},
		{y, Duplicate, 1040, 1030, false, 1030, nil},
		{mark(0, 1100), Marked, 1100, 1030, false, 1030, nil},
		{mark(1, 1150), Marked, 1100, 1150, false, 1100, []string{"1/1", "0/1"}},
		{c, Accepted, 1100, 1150, false, 1100, nil},
		{z, Accepted, 1100, 1200, false, 1100, nil},
		{mark(0, 1250), Marked, 1250, 1200, false, 1200, []string{"0/2"}},
		{idleMark(0, 1250, 0), Marked, 1250, 1200, true, 1200, nil},
		{mark(1, 1400), Marked, 1250, 1400, true, 1400, []string{"1/2"}},
		{d, LateAfterIdle, 1300, 1400, false, 1400, nil},
		{e, Accepted, 1450, 1400, false, 1400, nil},
	}
	m, _ := New(Config{Sources: 2})
	var first []string
	for i, row := range rows {
		v, err := m.Offer(&row.r)
		if err != nil {
			t.Fatal(err)
		}
		got := released(m.Ready(nil))
		w0, idle0 := m.Watermark(0)
		w1, _ := m.Watermark(1)
		if v != row.verdict || w0 != row.w0 || w1 != row.w1 || idle0 != row.idle0 || m.Frontier() != row.F || len(got)+len(row.released) > 0 && !slices.Equal(got, row.released) {
			t.Fatalf("row %d: %v w0=%d (idle %v) w1=%d F=%d released %v; the table says %v %d (%v) %d %d %v",
				i+1, v, w0, idle0, w1, m.Frontier(), got, row.verdict, row.w0, row.idle0, row.w1, row.F, row.released)
		}
		if i < 10 {
			first = append(first, got...)
		}
	}
	m, _ = New(Config{Sources: 2})
	var other []string
	for _, r := range []Record{x, y, y, mark(1, 1150), z, a, b, mark(0, 1100), c, mark(0, 1250)} {
		m.Offer(&r)
		other = append(other, released(m.Ready(nil))...)
	}
	if want := []string{"0/0", "1/0", "1/1", "0/1", "0/2"}; !slices.Equal(first, want) || !slices.Equal(other, want) {
		t.Fatalf("released %v and %v, want %v", first, other, want)
	}
}

// TestLateArrivalsWithinASource: events a source hops behind its newest (late within
// the allowed lateness) wait in the source's second queue; whatever the arrival order,
// duplicates are found in either queue, the release is the (t, source, offset) order,
// and the snapshot is the one of a Merger that received the same events in order.
func TestLateArrivalsWithinASource(t *testing.T) {
	type ev struct{ off, t int64 }
	cases := []struct {
		name   string
		source []ev // source 0's arrival order; every event carries watermark 100
		dups   []ev // re-sent afterwards: all duplicates
	}{
		{"in order", []ev{{0, 100}, {1, 110}, {2, 120}}, []ev{{1, 110}}},
		{"one late", []ev{{0, 100}, {1, 130}, {2, 110}, {3, 140}}, []ev{{2, 110}, {1, 130}}},
		{"late before the head", []ev{{0, 120}, {1, 130}, {2, 100}, {3, 105}}, []ev{{3, 105}, {0, 120}}},
		{"late at the same time, lower offset", []ev{{5, 120}, {3, 120}, {4, 120}, {6, 121}}, []ev{{3, 120}, {4, 120}, {5, 120}}},
		{"late, then later than the tail", []ev{{0, 150}, {1, 101}, {2, 160}, {3, 102}, {4, 155}}, []ev{{1, 101}, {4, 155}, {2, 160}}},
		{"reverse", []ev{{0, 190}, {1, 180}, {2, 170}, {3, 160}, {4, 150}}, []ev{{4, 150}, {0, 190}, {2, 170}}},
	}
	rec := func(p int32, e ev) Record {
		r := hop(p, e.off, e.t, 100)
		r.Ext = []uint64{uint64(e.off), uint64(e.t)}
		return r
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{Sources: 2, ExtWords: 2}
			got, _ := New(cfg)
			want, _ := New(cfg) // the same events in (t, off) order
			sorted := slices.Clone(c.source)
			slices.SortFunc(sorted, func(a, b ev) int { return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.off, b.off)) })
			for i := range c.source {
				for m, e := range map[*Merger]ev{got: c.source[i], want: sorted[i]} {
					r := rec(0, e)
					if v, err := m.Offer(&r); err != nil || v != Accepted {
						t.Fatalf("offer %+v: %v %v", e, v, err)
					}
				}
			}
			for _, e := range c.dups {
				r := rec(0, e)
				if v, err := got.Offer(&r); err != nil || v != Duplicate {
					t.Fatalf("re-sent %+v: %v %v, want duplicate", e, v, err)
				}
			}
			if g, w := got.AppendSnapshot(nil), want.AppendSnapshot(nil); !bytes.Equal(g, w) {
				t.Fatalf("snapshot differs from the in-order Merger's:\n%x\n%x", g, w)
			}
			if got.Pending() != len(c.source) {
				t.Fatalf("pending %d, want %d", got.Pending(), len(c.source))
			}
			// Source 1 brings the frontier past everything: the release is sorted.
			for _, m := range []*Merger{got, want} {
				r := mark(1, 1000)
				m.Offer(&r)
				r = mark(0, 1000)
				m.Offer(&r)
			}
			rel := got.Ready(nil)
			if len(rel) != len(sorted) {
				t.Fatalf("released %d events, want %d", len(rel), len(sorted))
			}
			for i, e := range rel {
				if w := sorted[i]; e.Offset != w.off || e.EventTime != w.t || !slices.Equal(e.Ext, []uint64{uint64(w.off), uint64(w.t)}) {
					t.Fatalf("release %d: (off %d, t %d, ext %v), want (%d, %d)", i, e.Offset, e.EventTime, e.Ext, w.off, w.t)
				}
			}
			if got.Pending() != 0 {
				t.Fatalf("%d pending after the release", got.Pending())
			}
			want.Ready(nil)
			if g, w := got.AppendSnapshot(nil), want.AppendSnapshot(nil); !bytes.Equal(g, w) {
				t.Fatal("snapshot after the release differs from the in-order Merger's")
			}
		})
	}
}
