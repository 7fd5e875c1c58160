package window

import (
	"math"
	"math/rand/v2"
	"testing"
)

// allEmptyRef is the sweep's rule as the contract states it, window by window: an
// entity whose newest event is at newest has nothing in any window ending at wm's
// bucket when floorDiv(newest, b) ≤ floorDiv(wm, b) − N for every window.
func allEmptyRef(t *Table, newest, wm int64) bool {
	for i, b := range t.bms {
		if floorDiv(newest, b) > floorDiv(wm, b)-t.nbs[i] {
			return false
		}
	}
	return true
}

// TestEmptyBeforeMatchesRule: the one compare EvictIdle makes per entity decides as the
// per-window rule does, for every newest a counted event can have (±maxTime), on
// bucket edges, around zero and at the extremes of the watermark.
func TestEmptyBeforeMatchesRule(t *testing.T) {
	specs := []string{DefaultSpecs, "1m:1s", "3s:1ms", "7s:7ms,1d:1h", "100000ms:1ms", "36500d:365d", "90s:30s,5m:1m,1h:1m"}
	rng := rand.New(rand.NewPCG(25, 1))
	for _, sp := range specs {
		tbl := mustTable(t, sp, Options{})
		wms := []int64{math.MinInt64, math.MinInt64 + 1, -maxTime - 1, -maxTime, -maxTime + 1, -1, 0, 1, maxTime, maxTime + 1, math.MaxInt64}
		for range 2000 {
			wms = append(wms, rng.Int64N(maxTime)-rng.Int64N(maxTime), rng.Int64N(1<<40)-1<<39)
		}
		for _, wm := range wms {
			lo := tbl.emptyBefore(wm)
			newests := []int64{-maxTime, maxTime, 0}
			if lo > -maxTime && lo <= maxTime {
				newests = append(newests, lo-1, lo) // the edge itself
			}
			for i, b := range tbl.bms {
				// Around the start of each window's oldest bucket.
				if wm >= -maxTime && wm <= maxTime {
					s := (floorDiv(wm, b) - tbl.nbs[i] + 1) * b
					newests = append(newests, s-1, s, s+1)
				}
			}
			for range 20 {
				newests = append(newests, rng.Int64N(maxTime+1)-rng.Int64N(maxTime+1))
				if wm > -maxTime && wm < maxTime {
					newests = append(newests, max(-maxTime, min(maxTime, wm-rng.Int64N(1<<37))))
				}
			}
			for _, n := range newests {
				if n < -maxTime || n > maxTime {
					continue
				}
				want := false // below every counted time nothing is empty (the rule's floorDiv(wm, b)−N would wrap)
				if wm >= -maxTime {
					want = allEmptyRef(tbl, n, wm)
				}
				if got := n < lo; got != want {
					t.Fatalf("%s: newest %d, watermark %d: emptyBefore %d says empty=%v, the rule %v", sp, n, wm, lo, got, want)
				}
			}
		}
	}
}
