package oracle

import (
	"sort"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Counted returns the events of evs (one partition, offset order, as for Compute)
// that are counted: neither invalid, duplicate nor late, in release order.
func Counted(cfg Config, evs []Event) []Event {
	res := Compute(cfg, evs)
	var out []Event
	for _, e := range evs {
		if r := res[e.Offset]; !r.Dead {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.Time < b.Time || a.Time == b.Time && a.Offset < b.Offset
	})
	return out
}

// WindowsAt is the query API's answer by its definition: for each window, the
// counted events of entity in buckets floor(asOf/b)−N+1 … floor(asOf/b) (whole
// buckets). Empty windows are all zeros.
func WindowsAt(specs []window.Spec, counted []Event, entity string, asOf int64) []codec.WindowAgg {
	out := make([]codec.WindowAgg, len(specs))
	for i, s := range specs {
		k := FloorDiv(asOf, s.BucketMs)
		w := codec.WindowAgg{Name: s.Name, WindowMs: s.WindowMs, BucketMs: s.BucketMs}
		for _, o := range counted {
			if o.Entity != entity {
				continue
			}
			if ko := FloorDiv(o.Time, s.BucketMs); ko < k-int64(s.Buckets)+1 || ko > k {
				continue
			}
			if w.Count == 0 || o.Amount < w.MinMinor {
				w.MinMinor = o.Amount
			}
			if w.Count == 0 || o.Amount > w.MaxMinor {
				w.MaxMinor = o.Amount
			}
			w.Count++
			w.SumMinor += o.Amount
		}
		out[i] = w
	}
	return out
}
