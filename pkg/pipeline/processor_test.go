package pipeline

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/internal/oracle"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// result is what one input offset yielded, in comparable form.
type result struct {
	dead   bool
	reason codec.Reason
	f      codec.Features
	value  []byte
}

func newTestProcessor(t testing.TB, specs string, latenessMs int64, late LatePolicy) *Processor {
	t.Helper()
	sp, err := window.ParseSpecs(specs)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{
		Topic: "tx", Partition: 0, Specs: sp, Late: late, Decoder: dec,
		Watermark: watermark.Config{AllowedLateness: latenessMs},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// collect returns an emit callback that records results by source offset and
// fails the test if an offset is emitted twice (the accounting invariant).
func collect(t testing.TB, into map[int64]result) func(*Output) {
	return func(o *Output) {
		t.Helper()
		if _, dup := into[o.SourceOffset]; dup {
			t.Fatalf("offset %d emitted twice", o.SourceOffset)
		}
		r := result{dead: o.Dead, reason: o.Reason, value: bytes.Clone(o.Value)}
		if !o.Dead {
			f, err := codec.DecodeFeatures(o.Value)
			if err != nil {
				t.Fatalf("offset %d: features do not decode: %v", o.SourceOffset, err)
			}
			if string(o.Key) != f.EntityID {
				t.Fatalf("offset %d: key %q, entity %q", o.SourceOffset, o.Key, f.EntityID)
			}
			r.f = f
		}
		into[o.SourceOffset] = r
	}
}

var exampleT = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// TestExamples works docs/contract.md's worked example through the processor row by row.
func TestExamples(t *testing.T) {
	type agg struct{ c, s, mn, mx int64 }
	type row struct {
		id, entity string
		amount, at int64
		dead       codec.Reason
		w10, w60   agg
		since      int64 // -1 = null
	}
	rows := []row{
		{"e1", "card-A", 1000, 0, "", agg{1, 1000, 1000, 1000}, agg{1, 1000, 1000, 1000}, -1},
		{"e2", "card-A", 2500, 400, "", agg{2, 3500, 1000, 2500}, agg{2, 3500, 1000, 2500}, 400},
		{"e3", "card-B", 700, 900, "", agg{1, 700, 700, 700}, agg{1, 700, 700, 700}, -1},
		{"e4", "card-A", 300, 1500, "", agg{3, 3800, 300, 2500}, agg{3, 3800, 300, 2500}, 1100},
		{"e5", "card-A", 5000, 3200, "", agg{5, 8900, 100, 5000}, agg{5, 8900, 100, 5000}, 1300},
		{"e6", "card-A", 100, 1900, "", agg{4, 3900, 100, 2500}, agg{4, 3900, 100, 2500}, 400},
		{"e7", "card-B", 900, 600, codec.ReasonLate, agg{}, agg{}, 0},
		{"e2", "card-A", 2500, 400, codec.ReasonDuplicate, agg{}, agg{}, 0},
		{"e9", "", 10, 3300, codec.Invalid("entity_id"), agg{}, agg{}, 0},
		{"e10", "card-A", 40, 3200, "", agg{6, 8940, 40, 5000}, agg{6, 8940, 40, 5000}, 0},
		{"e11", "card-A", 60, 11000, "", agg{3, 5100, 40, 5000}, agg{7, 9000, 40, 5000}, 7800},
		{"e12", "card-B", 80, 75000, "", agg{1, 80, 80, 80}, agg{1, 80, 80, 80}, 74100},
	}
	p := newTestProcessor(t, "10s:1s,1m:10s", 2000, LateDLQ)
	got := map[int64]result{}
	emit := collect(t, got)
	var order []int64 // emission order of features records
	track := func(o *Output) {
		emit(o)
		if !o.Dead {
			order = append(order, o.SourceOffset)
		}
	}
	for i, r := range rows {
		tx := codec.Transaction{EventID: r.id, EntityID: r.entity, AmountMinor: r.amount, Currency: "EUR", EventTime: exampleT + r.at}
		p.Process(Record{Topic: "tx", Offset: int64(i), Key: []byte(r.entity), Value: codec.EncodeTransaction(&tx)}, track)
	}
	p.Flush(track)
	for i, r := range rows {
		g, ok := got[int64(i)]
		if !ok {
			t.Fatalf("offset %d (%s): no output", i, r.id)
		}
		if r.dead != "" {
			if !g.dead || g.reason != r.dead {
				t.Errorf("offset %d (%s): got dead=%v reason=%q, want dead letter %q", i, r.id, g.dead, g.reason, r.dead)
			}
			continue
		}
		if g.dead {
			t.Fatalf("offset %d (%s): dead-lettered as %q", i, r.id, g.reason)
		}
		f := g.f
		for wi, want := range []agg{r.w10, r.w60} {
			w := f.Windows[wi]
			if have := (agg{w.Count, w.SumMinor, w.MinMinor, w.MaxMinor}); have != want {
				t.Errorf("offset %d (%s) window %s: got %v, want %v", i, r.id, w.Name, have, want)
			}
		}
		if r.since < 0 && f.HasPrevious || r.since >= 0 && (!f.HasPrevious || f.MsSincePrevious != r.since) {
			t.Errorf("offset %d (%s): ms_since_previous (%v,%d), want %d", i, r.id, f.HasPrevious, f.MsSincePrevious, r.since)
		}
		if f.EventID != r.id || f.EventTime != exampleT+r.at || f.SourceOffset != int64(i) || f.SourceTopic != "tx" || f.Late {
			t.Errorf("offset %d: lineage %+v", i, f)
		}
	}
	// e6 (offset 5) is released before e5 (offset 4): release order, not offset order.
	want := []int64{0, 1, 2, 3, 5, 4, 9, 10, 11}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("features emitted in offset order %v, want %v", order, want)
	}
}

type oracleEvent = oracle.Event

func runOracle(evs []oracleEvent, specs []window.Spec, lateness int64) map[int64]result {
	out := map[int64]result{}
	for off, r := range oracle.Compute(oracle.Config{Specs: specs, LatenessMs: lateness, Topic: "tx"}, evs) {
		out[off] = result{dead: r.Dead, reason: r.Reason, f: r.Features}
	}
	return out
}

// randomStream makes a stream with bursts, equal timestamps, gaps longer than
// the windows, out-of-order jitter, late events, duplicates and invalid records.
func randomStream(rng *rand.Rand, n int) []oracleEvent {
	entities := []string{"a", "b", "c", "d", "e"}
	now := exampleT
	var evs []oracleEvent
	for i := range n {
		switch r := rng.Float64(); {
		case r < 0.02:
			now += 2*3600_000 + rng.Int64N(3600_000) // a gap longer than every window
		case r < 0.3:
			// a burst: same or next millisecond
		default:
			now += rng.Int64N(4000)
		}
		e := oracleEvent{Offset: int64(i), Time: now, Amount: rng.Int64N(100_000), ID: fmt.Sprintf("id-%d", i), Entity: entities[rng.IntN(len(entities))]}
		switch r := rng.Float64(); {
		case r < 0.15:
			e.Time -= rng.Int64N(3000) // jitter, sometimes beyond the lateness
		case r < 0.18:
			e.Time -= rng.Int64N(120_000) // usually late
		case r < 0.22 && i > 0:
			prev := evs[rng.IntN(len(evs))]
			e.ID = prev.ID // a resend
		case r < 0.24:
			e.Invalid = codec.Invalid("entity_id")
		}
		evs = append(evs, e)
	}
	return evs
}

func TestProcessorMatchesOracle(t *testing.T) {
	const specs = "10s:1s,1m:10s,1h:1m"
	sp, _ := window.ParseSpecs(specs)
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			lateness := []int64{0, 500, 2000}[seed%3]
			evs := randomStream(rng, 400)
			want := runOracle(evs, sp, lateness)
			p := newTestProcessor(t, specs, lateness, LateDLQ)
			got := map[int64]result{}
			emit := collect(t, got)
			for _, e := range evs {
				entity := e.Entity
				if e.Invalid != "" {
					entity = ""
				}
				tx := codec.Transaction{EventID: e.ID, EntityID: entity, AmountMinor: e.Amount, EventTime: e.Time}
				p.Process(Record{Topic: "tx", Offset: e.Offset, Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}, emit)
			}
			p.Flush(emit)
			compareResults(t, got, want, len(evs))
		})
	}
}

func compareResults(t *testing.T, got, want map[int64]result, n int) {
	t.Helper()
	if len(got) != n || len(want) != n {
		t.Fatalf("accounting: %d outputs, oracle %d, for %d inputs", len(got), len(want), n)
	}
	for off := range int64(n) {
		g, w := got[off], want[off]
		if g.dead != w.dead || g.reason != w.reason {
			t.Fatalf("offset %d: got dead=%v %q, want dead=%v %q", off, g.dead, g.reason, w.dead, w.reason)
		}
		if w.dead {
			continue
		}
		if fmt.Sprint(g.f) != fmt.Sprint(w.f) {
			t.Fatalf("offset %d:\n got  %+v\n want %+v", off, g.f, w.f)
		}
	}
}

// TestSnapshotResume checks that a processor restored from a snapshot taken at
// any point produces the same outputs as one that ran uninterrupted.
func TestSnapshotResume(t *testing.T) {
	const specs = "10s:1s,1m:10s"
	rng := rand.New(rand.NewPCG(99, 1))
	evs := randomStream(rng, 300)
	records := make([]Record, len(evs))
	for i, e := range evs {
		tx := codec.Transaction{EventID: e.ID, EntityID: e.Entity, AmountMinor: e.Amount, EventTime: e.Time}
		if e.Invalid != "" {
			tx.EntityID = ""
		}
		records[i] = Record{Topic: "tx", Offset: e.Offset, Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)}
	}
	clean := map[int64]result{}
	p := newTestProcessor(t, specs, 1500, LateDLQ)
	for _, r := range records {
		p.Process(r, collect(t, clean))
	}
	p.Flush(collect(t, clean))

	for _, cut := range []int{0, 1, 57, 150, 299, 300} {
		got := map[int64]result{}
		a := newTestProcessor(t, specs, 1500, LateDLQ)
		for _, r := range records[:cut] {
			a.Process(r, collect(t, got))
		}
		snap := a.AppendSnapshot(nil)
		if again := a.AppendSnapshot(nil); !bytes.Equal(snap, again) {
			t.Fatalf("cut %d: snapshot not deterministic", cut)
		}
		// The same snapshot begun here and finished only after a went on to the
		// end of the stream: what the background checkpoint does.
		ps := a.BeginSnapshot([]byte("x"))
		for _, r := range records[cut:] {
			ps.Step(1)
			a.Process(r, func(*Output) {})
		}
		ps.Step(math.MaxInt)
		if deferred, err := ps.Finish(); err != nil || !bytes.Equal(deferred[1:], snap) || deferred[0] != 'x' {
			t.Fatalf("cut %d: snapshot finished later differs from AppendSnapshot at its beginning", cut)
		}
		a.EndSnapshot(ps)
		b, err := Restore(a.cfg, snap)
		if err != nil {
			t.Fatalf("cut %d: restore: %v", cut, err)
		}
		if b.Next() != int64(cut) {
			t.Fatalf("cut %d: restored next %d", cut, b.Next())
		}
		for _, r := range records[cut:] {
			b.Process(r, collect(t, got))
		}
		b.Flush(collect(t, got))
		if len(got) != len(clean) {
			t.Fatalf("cut %d: %d outputs, want %d", cut, len(got), len(clean))
		}
		for off, c := range clean {
			if g := got[off]; g.dead != c.dead || g.reason != c.reason || !bytes.Equal(g.value, c.value) {
				t.Fatalf("cut %d offset %d: output differs after restore", cut, off)
			}
		}
	}
}

func TestRestoreRejectsCorruptSnapshots(t *testing.T) {
	p := newTestProcessor(t, "10s:1s", 0, LateDLQ)
	tx := codec.Transaction{EventID: "x", EntityID: "a", AmountMinor: 5, EventTime: exampleT}
	p.Process(Record{Offset: 0, Value: codec.EncodeTransaction(&tx)}, func(*Output) {})
	snap := p.AppendSnapshot(nil)
	cases := map[string][]byte{
		"empty":     nil,
		"bad magic": append([]byte("XXXX"), snap[4:]...),
		"truncated": snap[:len(snap)-3],
		"trailing":  append(bytes.Clone(snap), 0),
	}
	for name, b := range cases {
		if _, err := Restore(p.cfg, b); err == nil {
			t.Errorf("%s: restore accepted a corrupt snapshot", name)
		}
	}
}

func FuzzRestore(f *testing.F) {
	p := newTestProcessor(f, "10s:1s", 0, LateDLQ)
	for i := range 5 {
		tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: "a", AmountMinor: 5, EventTime: exampleT + int64(i)*700}
		p.Process(Record{Offset: int64(i), Value: codec.EncodeTransaction(&tx)}, func(*Output) {})
	}
	f.Add(p.AppendSnapshot(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := Restore(p.cfg, b)
		if err != nil {
			return
		}
		// Whatever decoded must be usable and re-encode deterministically.
		tx := codec.Transaction{EventID: "new", EntityID: "z", AmountMinor: 1, EventTime: exampleT + 10_000}
		q.Process(Record{Offset: q.Next(), Value: codec.EncodeTransaction(&tx)}, func(*Output) {})
		q.Flush(func(*Output) {})
		_ = q.AppendSnapshot(nil)
	})
}

func TestLateApply(t *testing.T) {
	p := newTestProcessor(t, "10s:1s,1m:10s", 0, LateApply)
	got := map[int64]result{}
	emit := collect(t, got)
	send := func(off int64, id string, at, amount int64) {
		tx := codec.Transaction{EventID: id, EntityID: "a", AmountMinor: amount, EventTime: exampleT + at}
		p.Process(Record{Topic: "tx", Offset: off, Key: []byte("a"), Value: codec.EncodeTransaction(&tx)}, emit)
	}
	send(0, "e0", 5000, 100)  // bucket 5
	send(1, "e1", 3000, 7)    // late, bucket 3 still retained in both windows: counted
	send(2, "e1", 3000, 7)    // duplicate of a late-applied event
	send(3, "e3", 70000, 1)   // moves the entity's 10s window to buckets 61..70
	send(4, "e4", 20000, 999) // late and its 10s bucket has left the ring: dead letter
	p.Flush(emit)
	// e1's 10s window is buckets -6..3: e0 (bucket 5) is after it and not in it.
	// Its 1m window is bucket 0, which e0 shares: a bucket holds no order, so the
	// late event reads the bucket as it stands (documented for --late=apply).
	if r := got[1]; r.dead || !r.f.Late || r.f.Windows[0].Count != 1 || r.f.Windows[0].SumMinor != 7 ||
		r.f.Windows[1].Count != 2 || r.f.Windows[1].SumMinor != 107 || r.f.MsSincePrevious != -2000 {
		t.Errorf("late-applied event: %+v", r)
	}
	if r := got[2]; !r.dead || r.reason != codec.ReasonDuplicate {
		t.Errorf("resend of a late-applied event: %+v, want duplicate", r)
	}
	if r := got[4]; !r.dead || r.reason != codec.ReasonLate {
		t.Errorf("expired late event: %+v, want late dead letter", r)
	}
	if r := got[3]; r.f.Windows[1].Count != 1 || r.f.Windows[0].Count != 1 {
		t.Errorf("live windows touched by late data: %+v", r.f.Windows)
	}
}

// TestLateApplyAfterSweep: under --late=apply the idle-entity sweep must not
// drop what a counted late event reads. Entity X's only event is at T; another
// entity moves the watermark past X's windows and triggers a sweep, which used
// to drop X's buckets (keeping its header), so that a late event of X was
// counted on emptied buckets: count 1 where X's history gives 2. Sweeps now run
// the largest window behind the watermark, and a late event further behind than
// that is not counted (it could need what a sweep dropped).
func TestLateApplyAfterSweep(t *testing.T) {
	p := newTestProcessor(t, "10s:1s,1m:10s", 2000, LateApply)
	got := map[int64]result{}
	emit := collect(t, got)
	send := func(off int64, id, entity string, at, amount int64) {
		tx := codec.Transaction{EventID: id, EntityID: entity, AmountMinor: amount, EventTime: exampleT + at}
		p.Process(Record{Topic: "tx", Offset: off, Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}, emit)
	}
	send(0, "x1", "X", 0, 5)
	send(1, "y1", "Y", 65_000, 1) // watermark T+63 s: X is idle in both windows; a sweep is due
	send(2, "x2", "X", 5_000, 7)  // 58 s behind: within the largest window (1m), counted
	send(3, "y2", "Y", 70_000, 1) // watermark T+68 s
	send(4, "x3", "X", 2_000, 9)  // 66 s behind: more than the largest window, not counted
	p.Flush(emit)
	if st := p.Stats(); st.LateApplied != 1 {
		t.Errorf("late applied %d, want 1", st.LateApplied)
	}
	r := got[2]
	if r.dead || !r.f.Late || r.f.MsSincePrevious != 5000 || !r.f.HasPrevious {
		t.Fatalf("x2: %+v, want features late=true, 5000 ms since x1", r)
	}
	for _, w := range r.f.Windows {
		if w.Count != 2 || w.SumMinor != 12 || w.MinMinor != 5 || w.MaxMinor != 7 {
			t.Errorf("x2 window %s: %+v, want x1 and x2 (count 2, sum 12)", w.Name, w)
		}
	}
	if r := got[4]; !r.dead || r.reason != codec.ReasonLate {
		t.Errorf("x3: %+v, want a late dead letter", r)
	}
}

// BenchmarkProcess measures decode → validate → dedupe → reorder → window →
// encode for one partition: Zipf-free uniform access over 100 000 entities,
// events in order (lateness 0), the default windows.
func BenchmarkProcess(b *testing.B) {
	p := newTestProcessor(b, window.DefaultSpecs, 0, LateDLQ)
	const entities = 100_000
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([][]byte, b.N)
	for i := range vals {
		tx := codec.Transaction{EventID: fmt.Sprintf("evt-%09d", i), EntityID: fmt.Sprintf("card-%d", rng.IntN(entities)), AmountMinor: rng.Int64N(10000), Currency: "EUR", EventTime: exampleT + int64(i)}
		vals[i] = codec.EncodeTransaction(&tx)
	}
	emit := func(*Output) {}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p.Process(Record{Offset: int64(i), Value: vals[i]}, emit)
	}
}

// TestOutputsNeverWriteIntoInputBuffers: a dead letter's key is the source
// record's own slice, which for a fetched batch shares its backing array with
// the records after it. The next features record's key must not be built in
// that array.
func TestOutputsNeverWriteIntoInputBuffers(t *testing.T) {
	p := newTestProcessor(t, "10s:1s", 0, LateDLQ)
	fetch := []byte("k|NEXT-RECORD-BYTES")
	deadKey := fetch[:1:len(fetch)] // spare capacity runs into the next record
	p.Process(Record{Offset: 0, Key: deadKey, Value: []byte{0xff}}, func(*Output) {})
	tx := codec.Transaction{EventID: "e", EntityID: "a-long-entity-id", AmountMinor: 1, EventTime: exampleT}
	var key string
	p.Process(Record{Offset: 1, Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)}, func(o *Output) { key = string(o.Key) })
	if string(fetch) != "k|NEXT-RECORD-BYTES" {
		t.Fatalf("input buffer overwritten: %q", fetch)
	}
	if key != tx.EntityID {
		t.Fatalf("features key %q, want %q", key, tx.EntityID)
	}
}

// TestNullAndEmptyValues: a tombstone (null value) and an empty value are
// decode dead letters that say which they were, and keep the value as it was,
// null or empty, so the dead-letter topic tells them apart.
func TestNullAndEmptyValues(t *testing.T) {
	p := newTestProcessor(t, "10s:1s", 0, LateDLQ)
	var outs []Output
	emit := func(o *Output) {
		c := *o
		outs = append(outs, c)
	}
	p.Process(Record{Topic: "tx", Offset: 0, Key: []byte("k"), Value: nil}, emit)
	p.Process(Record{Topic: "tx", Offset: 1, Key: []byte("k"), Value: []byte{}}, emit)
	if len(outs) != 2 {
		t.Fatalf("%d outputs, want 2", len(outs))
	}
	for i, want := range []string{"null (a tombstone)", "empty"} {
		o := outs[i]
		if !o.Dead || o.Reason != codec.ReasonDecode || !strings.Contains(o.Err, want) || o.SourceOffset != int64(i) {
			t.Errorf("offset %d: %+v, want a decode dead letter saying the value is %s", i, o, want)
		}
	}
	if outs[0].Value != nil || outs[1].Value == nil {
		t.Errorf("values %v and %v, want null for the tombstone and empty for the empty value", outs[0].Value, outs[1].Value)
	}
}

// TestKeyMismatchCounted: a record whose key is not its entity_id (null
// included) is processed as usual and counted, so the service can warn that
// its producer may be splitting entities across partitions.
func TestKeyMismatchCounted(t *testing.T) {
	p := newTestProcessor(t, "10s:1s", 0, LateDLQ)
	got := map[int64]result{}
	emit := collect(t, got)
	for i, key := range [][]byte{[]byte("card-A"), []byte("card-B"), nil, []byte("card-A"), []byte("")} {
		tx := codec.Transaction{EventID: fmt.Sprint("e", i), EntityID: "card-A", AmountMinor: 1, EventTime: exampleT + int64(i)}
		p.Process(Record{Topic: "tx", Offset: int64(i), Key: key, Value: codec.EncodeTransaction(&tx)}, emit)
	}
	p.Process(Record{Topic: "tx", Offset: 5, Key: []byte("x"), Value: []byte{0xff}}, emit) // undecodable: not counted
	p.Flush(emit)
	if n := p.Stats().KeyMismatch; n != 3 {
		t.Errorf("%d key mismatches, want 3 (card-B, null, empty)", n)
	}
	for i := range int64(5) {
		if r := got[i]; r.dead || r.f.Windows[0].Count != i+1 {
			t.Errorf("offset %d: %+v, want features counting it as card-A's %d. event", i, r, i+1)
		}
	}
}

// TestMaxDedupeIDs: with watermark.Config.MaxDedupeIDs the processor forgets the
// oldest ids first, reports the set's size, and a duplicate of a forgotten id gets
// features, while one of a remembered id is still a duplicate dead letter.
func TestMaxDedupeIDs(t *testing.T) {
	sp, err := window.ParseSpecs("10s:1s")
	if err != nil {
		t.Fatal(err)
	}
	dec, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Topic: "tx", Specs: sp, Late: LateDLQ, Decoder: dec,
		Watermark: watermark.Config{AllowedLateness: 1000, MaxDedupeIDs: 2}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]result{}
	emit := collect(t, got)
	for i, id := range []string{"a", "b", "c", "c", "a"} {
		tx := codec.Transaction{EventID: id, EntityID: "card-A", AmountMinor: 1, EventTime: exampleT + int64(i)}
		p.Process(Record{Topic: "tx", Offset: int64(i), Key: []byte("card-A"), Value: codec.EncodeTransaction(&tx)}, emit)
	}
	p.Flush(emit)
	if r := got[3]; !r.dead || r.reason != codec.ReasonDuplicate {
		t.Errorf("offset 3 (c again, remembered): %+v, want a duplicate dead letter", r)
	}
	if r := got[4]; r.dead {
		t.Errorf("offset 4 (a again, forgotten by the cap of 2): %+v, want features", r)
	}
	if n, ev := p.DedupeIDs(), p.DedupeCapEvictions(); n != 2 || ev != 2 {
		t.Errorf("DedupeIDs %d, DedupeCapEvictions %d; want 2 and 2", n, ev)
	}
}

// plainDecoder hides a decoder's DecodeBorrowed: every id is copied at decode.
type plainDecoder struct{ codec.Decoder }

// TestBorrowedIDsChangeNothing: with a decoder that leaves the ids in the input
// record's bytes (codec.BorrowingDecoder), outputs and snapshots are byte for byte
// those of a decoder that copies them, even when every input record's bytes are
// overwritten as soon as Process returns: nothing the processor keeps (the reorder
// buffer, the window table, dedupe) points into them.
func TestBorrowedIDsChangeNothing(t *testing.T) {
	const specs = "10s:1s,1m:10s,1h:1m"
	sp, _ := window.ParseSpecs(specs)
	dec, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := dec.(codec.BorrowingDecoder); !ok {
		t.Fatal("the fast decoder does not borrow: nothing to test")
	}
	type emitted struct {
		dead        bool
		reason, err string
		key, value  []byte
	}
	for seed := range uint64(24) {
		lateness := []int64{0, 500, 2000}[seed%3]
		late := []LatePolicy{LateDLQ, LateApply}[seed/3%2]
		rng := rand.New(rand.NewPCG(seed, 11))
		evs := randomStream(rng, 600)
		var outs [2][]emitted
		var snaps [2][][]byte
		for run, d := range []codec.Decoder{plainDecoder{dec}, dec} {
			p, err := New(Config{Topic: "tx", Specs: sp, Late: late, Decoder: d, Watermark: watermark.Config{AllowedLateness: lateness}}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if (p.borrow != nil) != (run == 1) {
				t.Fatalf("run %d: borrowing %v", run, p.borrow != nil)
			}
			emit := func(o *Output) {
				outs[run] = append(outs[run], emitted{o.Dead, string(o.Reason), o.Err, bytes.Clone(o.Key), bytes.Clone(o.Value)})
			}
			for i, e := range evs {
				entity := "entity-" + e.Entity
				if e.Invalid != "" {
					entity = ""
				}
				tx := codec.Transaction{EventID: "event-" + e.ID, EntityID: entity, AmountMinor: e.Amount, EventTime: e.Time}
				r := Record{Topic: "tx", Offset: e.Offset, Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}
				p.Process(r, emit)
				for j := range r.Value {
					r.Value[j] = 0xee // as a fetch buffer reused or freed
				}
				if i%97 == 0 {
					snaps[run] = append(snaps[run], p.AppendSnapshot(nil))
				}
			}
			p.Flush(emit)
			snaps[run] = append(snaps[run], p.AppendSnapshot(nil))
		}
		if !reflect.DeepEqual(outs[0], outs[1]) {
			t.Fatalf("seed %d (lateness %d, %v): outputs differ with borrowed ids", seed, lateness, late)
		}
		if !reflect.DeepEqual(snaps[0], snaps[1]) {
			t.Fatalf("seed %d (lateness %d, %v): snapshots differ with borrowed ids", seed, lateness, late)
		}
	}
}
