package window

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// readOracle answers ReadAt from every counted event, by the rule written out: window
// i at asOf counts the events in buckets floor(asOf/b)−N+1 … floor(asOf/b).
func readOracle(specs []Spec, events []rawEvent, asOf int64) []Agg {
	out := make([]Agg, len(specs))
	for i, sp := range specs {
		ka := bucketOf(asOf, sp.BucketMs)
		for _, ev := range events {
			if k := bucketOf(ev.t, sp.BucketMs); k > ka-int64(sp.Buckets) && k <= ka {
				out[i] = out[i].plus(ev.a)
			}
		}
	}
	return out
}

func TestReadAtMatchesOracle(t *testing.T) {
	for _, ss := range []string{DefaultSpecs, "10s:1s,1m:10s,5m:1m", "7s:7ms,90s:45s,3s:3s"} {
		specs, err := ParseSpecs(ss)
		if err != nil {
			t.Fatal(err)
		}
		minW, maxW := int64(math.MaxInt64), int64(0)
		for _, sp := range specs {
			minW, maxW = min(minW, sp.WindowMs), max(maxW, sp.WindowMs)
		}
		for seed := range 12 {
			t.Run(fmt.Sprintf("%s/seed%d", ss, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(seed), 7))
				stream := genStream(r, 1500, minW, maxW, 2+r.IntN(6))
				suffixMin := make([]int64, len(stream)+1)
				suffixMin[len(stream)] = 1 << 62
				for i := len(stream) - 1; i >= 0; i-- {
					suffixMin[i] = min(suffixMin[i+1], stream[i].t)
				}
				tbl := mustTable(t, ss, Options{})
				counted := map[string][]rawEvent{}
				newest := map[string]int64{}
				out := make([]Agg, len(specs))
				swept := int64(math.MinInt64) // reads before a sweep's watermark may miss what it dropped
				var reads, notRetained int
				for i, ev := range stream {
					if _, _, err := tbl.Apply(ev.id, ev.t, ev.a, out); err == nil {
						counted[ev.id] = append(counted[ev.id], rawEvent{ev.t, ev.a})
						if n, ok := newest[ev.id]; !ok || ev.t > n {
							newest[ev.id] = ev.t
						}
					}
					if r.IntN(150) == 0 {
						swept = suffixMin[i+1]
						tbl.EvictIdle(swept)
					}
					for range 2 {
						id := fmt.Sprintf("e%d", r.IntN(8))
						n, ok := newest[id]
						if !ok {
							n = ev.t
						}
						asOf := n + r.Int64N(2*maxW) - maxW/4
						if asOf < swept {
							continue
						}
						var before []byte
						if r.IntN(10) == 0 {
							before = tbl.AppendSnapshot(nil)
						}
						gotNewest, known, err := tbl.ReadAt(id, asOf, out)
						reads++
						if known != ok {
							// Evicted by a sweep: all its windows were empty at asOf.
							if ok && !known && !slices.Equal(readOracle(specs, counted[id], asOf), make([]Agg, len(specs))) {
								t.Fatalf("event %d: %s evicted but non-empty at %d", i, id, asOf)
							}
							continue
						}
						wantNR := false
						for _, sp := range specs {
							if ok && bucketOf(asOf, sp.BucketMs) < bucketOf(n, sp.BucketMs) {
								wantNR = true
							}
						}
						if wantNR != errors.Is(err, ErrNotRetained) || (!wantNR && err != nil) {
							t.Fatalf("event %d: ReadAt(%s, %d) err %v, want not-retained %v (newest %d)", i, id, asOf, err, wantNR, n)
						}
						if wantNR {
							notRetained++
						} else if want := readOracle(specs, counted[id], asOf); !slices.Equal(out[:len(specs)], want) {
							t.Fatalf("event %d: ReadAt(%s, %d) = %v, oracle %v", i, id, asOf, out, want)
						}
						if ok && gotNewest != n {
							t.Fatalf("event %d: newest %d, want %d", i, gotNewest, n)
						}
						if before != nil {
							if after := tbl.AppendSnapshot(nil); !bytes.Equal(before, after) {
								t.Fatalf("event %d: a read changed the snapshot", i)
							}
						}
					}
				}
				if reads == 0 || notRetained == 0 {
					t.Logf("reads %d, not retained %d", reads, notRetained)
				}
			})
		}
	}
}

// TestPeekMatchesApply: a Peek, with or without events counted first, returns what
// the Apply calls it stands for return, and changes nothing.
func TestPeekMatchesApply(t *testing.T) {
	for _, ss := range []string{DefaultSpecs, "10s:1s,1m:10s,5m:1m", "7s:7ms,90s:45s,3s:3s"} {
		specs, err := ParseSpecs(ss)
		if err != nil {
			t.Fatal(err)
		}
		minW, maxW := int64(math.MaxInt64), int64(0)
		for _, sp := range specs {
			minW, maxW = min(minW, sp.WindowMs), max(maxW, sp.WindowMs)
		}
		for seed := range 12 {
			t.Run(fmt.Sprintf("%s/seed%d", ss, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(seed), 11))
				opts := Options{HistoryTTLMs: []int64{0, maxW}[seed%2]}
				stream := genStream(r, 1200, minW, maxW, 2+r.IntN(5))
				tbl := mustTable(t, ss, opts)
				out, peek := make([]Agg, len(specs)), make([]Agg, len(specs))
				for i, ev := range stream {
					if r.IntN(8) == 0 {
						// Events ahead of it in the reorder buffer: same entity, in
						// time order, none after it.
						var before []PeekEvent
						at := ev.t - r.Int64N(maxW/2+1)
						for range r.IntN(4) {
							at += r.Int64N(minW/2 + 1)
							before = append(before, PeekEvent{min(at, ev.t), int64(r.IntN(1000))})
						}
						snap := tbl.AppendSnapshot(nil)
						gap, prev, err := tbl.Peek(ev.id, ev.t, ev.a, before, peek)
						if !bytes.Equal(snap, tbl.AppendSnapshot(nil)) {
							t.Fatalf("event %d: Peek changed the table", i)
						}
						clone, rerr := RestoreTable(specs, opts, snap)
						if rerr != nil {
							t.Fatal(rerr)
						}
						for _, p := range before {
							_, _, _ = clone.Apply(ev.id, p.Time, p.Amount, out)
						}
						wgap, wprev, werr := clone.Apply(ev.id, ev.t, ev.a, out)
						if (err == nil) != (werr == nil) || !errors.Is(err, ErrExpired) && err != nil {
							t.Fatalf("event %d before %v: Peek err %v, Apply err %v", i, before, err, werr)
						}
						if err == nil && (!slices.Equal(peek, out) || gap != wgap || prev != wprev) {
							t.Fatalf("event %d before %v:\n peek  %v gap %d prev %v\n apply %v gap %d prev %v", i, before, peek, gap, prev, out, wgap, wprev)
						}
					}
					gap, prev, err := tbl.Peek(ev.id, ev.t, ev.a, nil, peek)
					wgap, wprev, werr := tbl.Apply(ev.id, ev.t, ev.a, out)
					if (err == nil) != (werr == nil) {
						t.Fatalf("event %d: Peek err %v, Apply err %v", i, err, werr)
					}
					if err == nil && (!slices.Equal(peek, out) || gap != wgap || prev != wprev) {
						t.Fatalf("event %d %+v:\n peek  %v gap %d prev %v\n apply %v gap %d prev %v", i, ev, peek, gap, prev, out, wgap, wprev)
					}
				}
			})
		}
	}
}

func TestReadAtAllocatesNothing(t *testing.T) {
	tbl := mustTable(t, DefaultSpecs, Options{})
	out := make([]Agg, 4)
	now := int64(1_800_000_000_000)
	for i := range 5000 { // "ring" switches to rings; "raw" stays raw
		now += 997
		if _, _, err := tbl.Apply("ring", now, int64(i), out); err != nil {
			t.Fatal(err)
		}
		if i%500 == 0 {
			if _, _, err := tbl.Apply("raw", now, int64(i), out); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, id := range []string{"ring", "raw", "unknown"} {
		allocs := testing.AllocsPerRun(1000, func() {
			if _, _, err := tbl.ReadAt(id, now+1500, out); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("ReadAt(%s): %v allocations per call", id, allocs)
		}
	}
}

// BenchmarkReadAt: one lookup of the four default windows, at the newest event's time
// (the API's default as_of), of an entity in rings with 24 h of history, of one with a
// few raw events, and of a random one of 1 M entities (index and record cache misses).
func BenchmarkReadAt(b *testing.B) {
	now := int64(1_800_000_000_000)
	out := make([]Agg, 4)
	b.Run("rings", func(b *testing.B) {
		tbl := mustTable(b, DefaultSpecs, Options{})
		t := now
		for i := range 86_400 {
			t += 1000
			if _, _, err := tbl.Apply("card-hot", t, int64(i%977), out); err != nil {
				b.Fatal(err)
			}
		}
		benchRead(b, tbl, []string{"card-hot"}, t)
	})
	b.Run("raw", func(b *testing.B) {
		tbl := mustTable(b, DefaultSpecs, Options{})
		t := now
		for i := range 20 {
			t += 60_000
			if _, _, err := tbl.Apply("card-quiet", t, int64(i*13), out); err != nil {
				b.Fatal(err)
			}
		}
		benchRead(b, tbl, []string{"card-quiet"}, t)
	})
	b.Run("1M-entities", func(b *testing.B) {
		tbl := mustTable(b, DefaultSpecs, Options{})
		ids := make([]string, 1<<20)
		t := now
		for i := range ids {
			ids[i] = fmt.Sprintf("card-%016d", i*7919)
		}
		r := rand.New(rand.NewPCG(1, 2))
		for range 3 * len(ids) {
			t += 1
			if _, _, err := tbl.Apply(ids[r.IntN(len(ids))], t, r.Int64N(10_000), out); err != nil {
				b.Fatal(err)
			}
		}
		r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		benchRead(b, tbl, ids, t)
	})
}

func benchRead(b *testing.B, tbl *Table, ids []string, asOf int64) {
	out := make([]Agg, 4)
	var sink int64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, _, err := tbl.ReadAt(ids[i&(len(ids)-1)], asOf, out); err != nil {
			b.Fatal(err)
		}
		sink += out[0].Count + out[1].Sum + out[2].Min + out[3].Max
	}
	if sink == 0 {
		b.Fatal("nothing read")
	}
}
