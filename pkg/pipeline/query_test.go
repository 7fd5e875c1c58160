package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/internal/oracle"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// TestLookupMatchesOracle: after every record, lookups of every entity at the
// default as-of time equal the as-of aggregates recomputed from the records
// counted so far, and change nothing.
func TestLookupMatchesOracle(t *testing.T) {
	const specs = "10s:1s,1m:10s,1h:1m"
	sp, _ := window.ParseSpecs(specs)
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 9))
			lateness := []int64{0, 500, 2000}[seed%3]
			evs := randomStream(rng, 300)
			p := newTestProcessor(t, specs, lateness, LateDLQ)
			got := map[int64]result{}
			emit := collect(t, got)
			out := make([]window.Agg, len(sp))
			for i, e := range evs {
				entity := e.Entity
				if e.Invalid != "" {
					entity = ""
				}
				tx := codec.Transaction{EventID: e.ID, EntityID: entity, AmountMinor: e.Amount, EventTime: e.Time}
				p.Process(Record{Topic: "tx", Offset: e.Offset, Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}, emit)
				// Counted so far: what has been emitted as features.
				var counted []oracle.Event
				for _, c := range evs[:i+1] {
					if r, ok := got[c.Offset]; ok && !r.dead {
						counted = append(counted, c)
					}
				}
				before := p.AppendSnapshot(nil)
				for _, ent := range []string{"a", "b", "c", "d", "e", "never"} {
					info, err := p.Lookup(ent, 0, true, out)
					if err != nil {
						t.Fatalf("record %d: lookup %s: %v", i, ent, err)
					}
					want := oracle.WindowsAt(sp, counted, ent, info.AsOf)
					for w := range sp {
						g := want[w]
						if a := out[w]; a.Count != g.Count || a.Sum != g.SumMinor || a.Min != g.MinMinor || a.Max != g.MaxMinor {
							t.Fatalf("record %d: %s at %d window %s: got %+v, oracle %+v", i, ent, info.AsOf, g.Name, a, g)
						}
					}
					if info.LastOffset != e.Offset || info.Pending != p.Pending() {
						t.Fatalf("record %d: info %+v", i, info)
					}
					if ent == "never" && info.Known {
						t.Fatalf("unknown entity known")
					}
				}
				if !bytes.Equal(before, p.AppendSnapshot(nil)) {
					t.Fatalf("record %d: lookups changed the state", i)
				}
			}
		})
	}
}

func TestLookupAsOfRange(t *testing.T) {
	p := newTestProcessor(t, "1m:1s,1h:1m", 0, LateDLQ)
	out := make([]window.Agg, 2)
	if _, err := p.Lookup("a", 1_700_000_000_000, false, out); err != nil {
		t.Fatalf("an empty partition answers any time: %v", err)
	}
	emit := func(*Output) {}
	t0 := int64(1_700_000_000_000)
	for i, dt := range []int64{0, 1000, 30_000, 61_000, 62_500} {
		ent := "a"
		if dt == 62_500 {
			ent = "b"
		}
		tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: ent, AmountMinor: 10, EventTime: t0 + dt}
		p.Process(Record{Offset: int64(i), Key: []byte(ent), Value: codec.EncodeTransaction(&tx)}, emit)
	}
	def, from, to := p.AsOf()
	if def != t0+62_500 || to != def+3600_000 || from != t0+61_000 { // swept at 61 s
		t.Fatalf("AsOf = %d, %d, %d", def, from, to)
	}
	var re *AsOfRangeError
	if _, err := p.Lookup("a", to+1, false, out); !errors.As(err, &re) {
		t.Fatalf("after the range: %v", err)
	}
	if _, err := p.Lookup("a", from-1, false, out); !errors.As(err, &re) {
		t.Fatalf("before the range: %v", err)
	}
	if _, err := p.Lookup("b", def-1000, false, out); !errors.Is(err, window.ErrNotRetained) {
		t.Fatalf("before the entity's newest bucket: %v", err)
	}
	if _, err := p.Lookup("a", def-1000, false, out); err != nil || out[0].Count != 2 || out[1].Count != 4 {
		t.Fatalf("a at 61.5 s: %v %+v", err, out)
	}
	if _, err := p.Lookup("a", t0+61_000+59_000, false, out); err != nil || out[0].Count != 1 || out[1].Count != 4 {
		t.Fatalf("later: %v %+v", err, out)
	}
}

// TestPreviewIsWhatProcessDoes: before each record, the preview of its transaction
// says what Process then does with it (the dead-letter reason, or the features record
// when it is released at once), and changes nothing.
func TestPreviewIsWhatProcessDoes(t *testing.T) {
	const specs = "10s:1s,1m:10s,1h:1m"
	dec, _ := codec.NewDecoder("", codec.DefaultLimits())
	for seed := range uint64(30) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 5))
			lateness := []int64{0, 500, 2000}[seed%3]
			policy := []LatePolicy{LateDLQ, LateApply}[seed%2]
			evs := randomStream(rng, 400)
			p := newTestProcessor(t, specs, lateness, policy)
			var pv Preview
			checked := 0
			for _, e := range evs {
				entity := e.Entity
				if e.Invalid != "" {
					entity = ""
				}
				tx := codec.Transaction{EventID: e.ID, EntityID: entity, AmountMinor: e.Amount, EventTime: e.Time}
				before := p.AppendSnapshot(nil)
				p.Preview(&tx, true, dec, &pv)
				if !bytes.Equal(before, p.AppendSnapshot(nil)) {
					t.Fatalf("offset %d: preview changed the state", e.Offset)
				}
				var mine *Output
				var mineF codec.Features
				p.Process(Record{Topic: "tx", Offset: e.Offset, Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}, func(o *Output) {
					if o.SourceOffset == e.Offset {
						c := *o
						mine = &c
						if !o.Dead {
							mineF, _ = codec.DecodeFeatures(o.Value)
						}
					}
				})
				switch {
				case pv.Outcome != "":
					if mine == nil || !mine.Dead || mine.Reason != pv.Outcome {
						t.Fatalf("offset %d: preview %q (%s), process gave %+v", e.Offset, pv.Outcome, pv.Detail, mine)
					}
				case pv.Waits:
					if mine != nil {
						t.Fatalf("offset %d: preview waits, process emitted %+v", e.Offset, mine)
					}
					// Released now, after what waits ahead of it: a copy of the
					// state before it, given the record, then flushed.
					clone, err := Restore(p.cfg, before)
					if err != nil {
						t.Fatal(err)
					}
					var f codec.Features
					flushed := func(o *Output) {
						if o.SourceOffset == e.Offset && !o.Dead {
							f, _ = codec.DecodeFeatures(o.Value)
						}
					}
					clone.Process(Record{Topic: "tx", Offset: e.Offset, Key: []byte(entity), Value: codec.EncodeTransaction(&tx)}, flushed)
					clone.Flush(flushed)
					if fmt.Sprint(f) != fmt.Sprint(pv.Features) {
						t.Fatalf("offset %d (waits):\n flushed %+v\n preview %+v", e.Offset, f, pv.Features)
					}
					checked++
				default:
					if mine == nil || mine.Dead {
						t.Fatalf("offset %d: preview features, process gave %+v", e.Offset, mine)
					}
					if fmt.Sprint(mineF) != fmt.Sprint(pv.Features) {
						t.Fatalf("offset %d:\n process %+v\n preview %+v", e.Offset, mineF, pv.Features)
					}
					checked++
				}
			}
			if checked == 0 {
				t.Fatal("no preview compared with its features")
			}
		})
	}
}

// BenchmarkLookup: Processor.Lookup of one entity, the four default windows, at the
// default as-of time, over 10 000 entities with a day of history between them.
func BenchmarkLookup(b *testing.B) {
	p := newTestProcessor(b, window.DefaultSpecs, 1000, LateDLQ)
	emit := func(*Output) {}
	t0 := int64(1_700_000_000_000)
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("card-%08d", i)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 200_000 {
		id := ids[rng.IntN(len(ids))]
		tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: id, AmountMinor: rng.Int64N(10_000), EventTime: t0 + int64(i)*400}
		p.Process(Record{Offset: int64(i), Key: []byte(id), Value: codec.EncodeTransaction(&tx)}, emit)
	}
	out := make([]window.Agg, 4)
	var sink int64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := p.Lookup(ids[i%len(ids)], 0, true, out); err != nil {
			b.Fatal(err)
		}
		sink += out[3].Count
	}
	if sink == 0 {
		b.Fatal("nothing read")
	}
}

// TestLookupSameAfterRestore: a processor restored from a snapshot answers every
// lookup as the one that took it, default as-of time included (newest is not in the
// snapshot; Restore rebuilds it from the table).
func TestLookupSameAfterRestore(t *testing.T) {
	const specs = "10s:1s,1m:10s,1h:1m"
	sp, _ := window.ParseSpecs(specs)
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 13))
		p := newTestProcessor(t, specs, []int64{0, 1000}[seed%2], LateDLQ)
		evs := randomStream(rng, 500)
		for i, e := range evs {
			tx := codec.Transaction{EventID: e.ID, EntityID: e.Entity, AmountMinor: e.Amount, EventTime: e.Time}
			p.Process(Record{Topic: "tx", Offset: e.Offset, Key: []byte(e.Entity), Value: codec.EncodeTransaction(&tx)}, func(*Output) {})
			if i%50 != 49 {
				continue
			}
			q, err := Restore(p.cfg, p.AppendSnapshot(nil))
			if err != nil {
				t.Fatal(err)
			}
			d1, f1, t1 := p.AsOf()
			d2, f2, t2 := q.AsOf()
			if d1 != d2 || f1 != f2 || t1 != t2 {
				t.Fatalf("seed %d record %d: AsOf %d %d %d, restored %d %d %d", seed, i, d1, f1, t1, d2, f2, t2)
			}
			a, b := make([]window.Agg, len(sp)), make([]window.Agg, len(sp))
			for _, ent := range []string{"a", "b", "c", "d", "e"} {
				i1, e1 := p.Lookup(ent, 0, true, a)
				i2, e2 := q.Lookup(ent, 0, true, b)
				if fmt.Sprint(i1, e1, a) != fmt.Sprint(i2, e2, b) {
					t.Fatalf("seed %d record %d %s: %v %v %v, restored %v %v %v", seed, i, ent, i1, e1, a, i2, e2, b)
				}
			}
		}
	}
}

// BenchmarkLookupMany: lookups of random entities one after another, as a turn of
// queued reads or a batch is served, without and with HintLookup kept
// 2·HintDistance / HintDistance items ahead (pkg/service's serveReads): per lookup,
// the dependent cache misses of the index entry, the record and its events, or those
// misses overlapped.
func BenchmarkLookupMany(b *testing.B) {
	for _, n := range []int{10_000, 1 << 20} {
		p := newTestProcessor(b, window.DefaultSpecs, 0, LateDLQ)
		emit := func(*Output) {}
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("card-%010d", i*7919)
		}
		rng := rand.New(rand.NewPCG(5, 5))
		for i := range 3 * n {
			id := ids[rng.IntN(n)]
			tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: id, AmountMinor: rng.Int64N(10_000), EventTime: t0Bench + int64(i)}
			p.Process(Record{Offset: int64(i), Key: []byte(id), Value: codec.EncodeTransaction(&tx)}, emit)
		}
		rng.Shuffle(n, func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		out := make([]window.Agg, 4)
		for _, hinted := range []bool{false, true} {
			b.Run(fmt.Sprintf("entities=%d/hinted=%v", n, hinted), func(b *testing.B) {
				var sink int64
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if hinted {
						p.HintLookup(ids[(i+2*HintDistance)%n], true)
						p.HintLookup(ids[(i+HintDistance)%n], false)
					}
					if _, err := p.Lookup(ids[i%n], 0, true, out); err != nil {
						b.Fatal(err)
					}
					sink += out[3].Count
				}
				if sink == 0 {
					b.Fatal("nothing read")
				}
			})
		}
	}
}

const t0Bench = int64(1_700_000_000_000)
