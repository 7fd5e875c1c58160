package repartition

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// run feeds recs to a fresh Merger, calling Ready after a random number of records
// (so the caller's cadence varies), snapshotting and restoring at the given record
// indices, and returns every released event (Ext copied) and every verdict.
func run(t *testing.T, r *rand.Rand, sources int, recs []Record, restoreAt map[int]bool) ([]Event, []Verdict) {
	t.Helper()
	cfg := Config{Sources: sources, ExtWords: simExtWords}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out []Event
	var buf []Event
	verdicts := make([]Verdict, 0, len(recs))
	drain := func() {
		buf = m.Ready(buf[:0])
		for _, e := range buf {
			e.Ext = slices.Clone(e.Ext)
			out = append(out, e)
		}
	}
	for i := range recs {
		if restoreAt[i] {
			snap := m.AppendSnapshot(nil)
			m2, err := Restore(cfg, snap)
			if err != nil {
				t.Fatalf("restore at record %d: %v", i, err)
			}
			if again := m2.AppendSnapshot(nil); !bytes.Equal(again, snap) {
				t.Fatalf("restored merger at record %d writes another image", i)
			}
			m = m2
		}
		v, err := m.Offer(&recs[i])
		if err != nil {
			t.Fatalf("record %d %+v: %v", i, recs[i], err)
		}
		verdicts = append(verdicts, v)
		if r.IntN(4) == 0 {
			drain()
		}
	}
	drain()
	return out, verdicts
}

func diffEvents(t *testing.T, what string, got, want []Event) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	for i := range min(len(got), len(want)) {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("%s: event %d is %s, want %s (%d and %d events)", what, i, evString(got[i]), evString(want[i]), len(got), len(want))
		}
	}
	t.Fatalf("%s: %d events, want %d", what, len(got), len(want))
}

// TestReleaseIndependentOfInterleaving is the determinism rule: the same per-source
// logs (restarts from older checkpoints, zombie owners, producer retries, markers,
// the sources' own idle releases without an idle declaration) merged in many random
// interleavings release the same sequence every time, equal to the reference sort of
// the unique events, and the bounded Merger decides every record as the unbounded
// reference does.
func TestReleaseIndependentOfInterleaving(t *testing.T) {
	seeds, interleavings := 16, 24
	if testing.Short() {
		seeds, interleavings = 4, 8
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(seed), 27))
			opt := simOptions{sources: 2 + r.IntN(5), offsets: 150 + r.IntN(250), crashes: r.IntN(3), flushes: seed%2 == 1, duplicates: r.IntN(15)}
			logs := simulate(r, opt)
			want := reference(logs)
			if len(want) < 50 {
				t.Fatalf("only %d unique events: the simulation is too thin to test anything", len(want))
			}
			events := 0
			for _, l := range logs {
				for _, rec := range l {
					if rec.Kind == KindEvent {
						events++
					}
				}
			}
			if events == len(want) && opt.crashes+opt.duplicates > 0 {
				t.Fatalf("no record was re-sent although the options ask for it")
			}
			for k := range interleavings {
				recs := interleave(r, logs)
				restoreAt := map[int]bool{}
				if k%3 == 1 {
					for range 3 {
						restoreAt[r.IntN(len(recs))] = true
					}
				}
				got, verdicts := run(t, r, opt.sources, recs, restoreAt)
				diffEvents(t, fmt.Sprintf("interleaving %d", k), got, want)

				ref := newRefMerger(opt.sources)
				var refOut []Event
				for i := range recs {
					if v := ref.offer(&recs[i]); v != verdicts[i] {
						t.Fatalf("interleaving %d, record %d %+v: verdict %v, the unbounded reference says %v", k, i, recs[i], verdicts[i], v)
					}
					refOut = append(refOut, ref.ready()...)
				}
				diffEvents(t, "unbounded reference", refOut, want)
			}
		})
	}
}

// TestIdleRuleAccounting: with sources declaring themselves idle (and zombies doing so
// after a new owner took over), the interleaving may change which events are late,
// but for every interleaving: the Merger decides every record as the unbounded
// reference does; the release is strictly in (event_time, source, offset) order;
// every unique event is released or reported LateAfterIdle exactly once; and the
// same interleaving gives the same verdicts and releases whatever the Ready cadence
// and wherever a snapshot is restored.
func TestIdleRuleAccounting(t *testing.T) {
	seeds, interleavings := 16, 16
	if testing.Short() {
		seeds, interleavings = 4, 6
	}
	lateTotal, expiredTotal := 0, 0
	for seed := range seeds {
		r := rand.New(rand.NewPCG(uint64(seed), 2727))
		// Odd seeds lease their idle declarations, and stamp the records.
		opt := simOptions{sources: 2 + r.IntN(5), offsets: 150 + r.IntN(250), crashes: r.IntN(3), flushes: true, idle: true, leases: seed%2 == 1, duplicates: r.IntN(10)}
		logs := simulate(r, opt)
		unique := reference(logs)
		for k := range interleavings {
			recs := interleave(r, logs)
			if opt.leases {
				recs = stamp(r, recs)
			}
			got, verdicts := run(t, r, opt.sources, recs, nil)

			ref := newRefMerger(opt.sources)
			for i := range recs {
				if v := ref.offer(&recs[i]); v != verdicts[i] {
					t.Fatalf("seed %d interleaving %d, record %d %+v: verdict %v, the unbounded reference says %v", seed, k, i, recs[i], verdicts[i], v)
				}
			}
			expiredTotal += ref.expired
			if !opt.leases && ref.expired > 0 {
				t.Fatalf("seed %d: %d leases ran out with no lease", seed, ref.expired)
			}

			for i := 1; i < len(got); i++ {
				a, b := got[i-1], got[i]
				if !(a.EventTime < b.EventTime || a.EventTime == b.EventTime && (a.Source < b.Source || a.Source == b.Source && a.Offset < b.Offset)) {
					t.Fatalf("seed %d interleaving %d: released %s before %s", seed, k, evString(a), evString(b))
				}
			}
			fate := map[[2]int64]int{}
			for _, e := range got {
				fate[[2]int64{int64(e.Source), e.Offset}]++
			}
			for i, v := range verdicts {
				if v == LateAfterIdle {
					fate[[2]int64{int64(recs[i].Source), recs[i].Offset}]++
					lateTotal++
				}
			}
			for _, e := range unique {
				if n := fate[[2]int64{int64(e.Source), e.Offset}]; n != 1 {
					t.Fatalf("seed %d interleaving %d: %s released or dead-lettered %d times, want once", seed, k, evString(e), n)
				}
			}
			if len(fate) != len(unique) {
				t.Fatalf("seed %d interleaving %d: %d fates for %d unique events", seed, k, len(fate), len(unique))
			}

			restoreAt := map[int]bool{r.IntN(len(recs)): true, r.IntN(len(recs)): true}
			again, verdicts2 := run(t, r, opt.sources, recs, restoreAt)
			if !slices.Equal(verdicts, verdicts2) {
				t.Fatalf("seed %d interleaving %d: another Ready cadence and restores changed the verdicts", seed, k)
			}
			diffEvents(t, "same interleaving, restored", again, got)
		}
	}
	if lateTotal == 0 || expiredTotal == 0 {
		t.Fatalf("%d events late after idle, %d leases run out: the test does not reach the rules", lateTotal, expiredTotal)
	}
	t.Logf("%d late-after-idle verdicts, %d leases run out", lateTotal, expiredTotal)
}
