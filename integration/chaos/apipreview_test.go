//go:build integration

package chaos

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// How a preview's 200 is judged (docs/api.md, velocity:preview): what the
// partition's processor would do with the transaction if it were the next
// record, against the state at (last_offset, pending) of state.at, unchanged.
// In the contract's order of checks: more than --max-ahead (24 h) ahead of the
// newest accepted event time is invalid:event_time; an event id accepted on the
// partition up to last_offset (all of them are within the dedupe horizon: the
// input spans far less; under --late=apply that includes late events counted)
// is a duplicate; behind the watermark is late under --late=dlq, and under
// --late=apply too when more than the largest window behind it. Otherwise a
// features record: it waits if its event time is after the watermark it would
// make, and its windows count, after the entity's counted events, its pending
// events at or before its event time (released before it, in (event time,
// offset) order: a new record's offset is after theirs; a late one is counted
// at once, and every pending event is after it) and itself, by the window rule:
// an event at or after the entity's newest reads buckets k−N+1 … k of its own
// bucket k; an older one the retained buckets up to its own, max(k−N+1,
// K−N+1) … k (K: the newest's bucket), or is late if its bucket left a window.
// Its late flag says whether it was behind the watermark. ms_since_previous is
// from the entity's last event in release order: the last of those pending ones,
// or the last counted (late_test.go, releaseOrder) when no idle release
// reordered the entity (judgeEnv.reordered; otherwise that field is not judged).
// It would land at last_offset + 1.

type previewAnswer struct {
	EntityID   *string         `json:"entity_id"`
	Partition  *int32          `json:"partition"`
	Outcome    *string         `json:"outcome"`
	Waits      *bool           `json:"waits"`
	Features   json.RawMessage `json:"features"`
	AsOf       *int64          `json:"as_of"`
	LastOffset *int64          `json:"last_offset"`
	Pending    *int            `json:"pending"`
}

type previewFeatures struct {
	EventID         *string        `json:"event_id"`
	EntityID        string         `json:"entity_id"`
	EventTime       int64          `json:"event_time"`
	Windows         []windowAnswer `json:"windows"`
	MsSincePrevious *int64         `json:"ms_since_previous"`
	Late            bool           `json:"late"`
	SourcePartition int32          `json:"source_partition"`
	SourceOffset    int64          `json:"source_offset"`
}

const maxAheadMs = 24 * 3600 * 1000

func (m *apiModel) judgePreview(req *apiRequest, env *judgeEnv, st *apiStats) []answerVerdict {
	st.previews++
	var a previewAnswer
	if err := json.Unmarshal(req.body, &a); err != nil {
		return []answerVerdict{{"preview: unreadable 200", err.Error()}}
	}
	if a.EntityID == nil || a.Partition == nil || a.Outcome == nil || a.Waits == nil || a.AsOf == nil || a.LastOffset == nil || a.Pending == nil {
		return []answerVerdict{{"preview: unreadable 200", "a field of entity_id, partition, outcome, waits, as_of, last_offset, pending is missing"}}
	}
	p, last := *a.Partition, *a.LastOffset
	s, out, ok := placed(m.view(), env, "", req, *a.EntityID, p, last, *a.Pending, st)
	out = prefixVerdicts("preview: ", out)
	if !ok {
		return out
	}
	pm := &m.parts[p]
	pv := req.preview
	var diffs []string
	if *a.AsOf != s.asOf {
		diffs = append(diffs, fmt.Sprintf("as_of = %d, want %d", *a.AsOf, s.asOf))
	}
	// The outcome, in the order of checks.
	maxSeen, hasMax := int64(0), s.accepted > 0
	if hasMax {
		maxSeen = pm.acc[s.accepted-1].prefMax
	}
	lateness := allowedLateness.Milliseconds()
	var largest int64
	for _, sp := range m.specs {
		largest = max(largest, sp.WindowMs)
	}
	want, late := "features", false
	switch {
	case hasMax && pv.eventTime > maxSeen+maxAheadMs:
		want = "invalid:event_time"
	case pv.eventID != nil && slices.ContainsFunc(pm.acc[:s.accepted], func(e accEvent) bool { return e.tx.eventID == *pv.eventID }):
		want = "duplicate"
	case hasMax && pv.eventTime < s.wm:
		late = true
		if m.late != "apply" || s.wm-pv.eventTime > largest {
			want = "late"
		}
	}
	// The entity's events applied before it: counted, in release order, then
	// its pending ones at or before its time, in (event time, offset) order.
	type ev struct{ rel, t, off, amount int64 }
	var counted, before []ev
	for _, i := range s.counted {
		e := pm.acc[i]
		counted = append(counted, ev{e.rel, e.tx.time, e.off, e.tx.amount})
	}
	for _, i := range s.pending {
		if e := pm.acc[i]; e.tx.entity == req.entity && e.tx.time <= pv.eventTime {
			before = append(before, ev{0, e.tx.time, e.off, e.tx.amount})
		}
	}
	slices.SortFunc(counted, func(x, y ev) int { return releaseOrder(x.rel, x.t, x.off, y.rel, y.t, y.off) })
	slices.SortFunc(before, func(x, y ev) int { return cmp.Or(cmp.Compare(x.t, y.t), cmp.Compare(x.off, y.off)) })
	applied := append(slices.Clone(counted), before...)
	newest, hasNewest := int64(0), len(applied) > 0
	for _, e := range applied {
		newest = max(newest, e.t)
	}
	var wantWindows []windowAnswer
	if want == "features" {
		t := pv.eventTime
		for _, sp := range m.specs {
			n := sp.WindowMs / sp.BucketMs
			k := floorDiv(t, sp.BucketMs)
			lo := k - n + 1
			if hasNewest && t < newest {
				kn := floorDiv(newest, sp.BucketMs)
				if k <= kn-n {
					want = "late" // its bucket has left this window of the entity's newest event
					break
				}
				lo = max(lo, kn-n+1)
			}
			agg := windowAgg{count: 1, sum: pv.amount, min: pv.amount, max: pv.amount}
			for _, e := range applied {
				if kb := floorDiv(e.t, sp.BucketMs); kb >= lo && kb <= k {
					agg.count++
					agg.sum += e.amount
					agg.min, agg.max = min(agg.min, e.amount), max(agg.max, e.amount)
				}
			}
			wantWindows = append(wantWindows, windowAnswer{sp.Name, sp.WindowMs, sp.BucketMs, agg.count, agg.sum, agg.min, agg.max})
		}
	}
	if *a.Outcome != want {
		return append(out, answerVerdict{"preview: wrong outcome", fmt.Sprintf("outcome %q, want %q (event time %d, watermark %d, newest accepted %d, event id %s)%s",
			*a.Outcome, want, pv.eventTime, s.wm, maxSeen, strOr(pv.eventID), m.view().describe(s, p, last))})
	}
	if want != "features" {
		if a.Features != nil && string(a.Features) != "null" {
			diffs = append(diffs, "features given with a dead-letter outcome")
		}
	} else {
		var f previewFeatures
		if err := json.Unmarshal(a.Features, &f); err != nil {
			return append(out, answerVerdict{"preview: unreadable 200", fmt.Sprintf("features: %v", err)})
		}
		newMax := pv.eventTime
		if hasMax {
			newMax = max(maxSeen, newMax)
		}
		if w := pv.eventTime > newMax-lateness; *a.Waits != w {
			diffs = append(diffs, fmt.Sprintf("waits = %v, want %v", *a.Waits, w))
		}
		if f.EntityID != req.entity || f.EventTime != pv.eventTime || pv.eventID != nil && (f.EventID == nil || *f.EventID != *pv.eventID) {
			diffs = append(diffs, fmt.Sprintf("entity_id %q, event_time %d, event_id %s: want the transaction's", f.EntityID, f.EventTime, strOr(f.EventID)))
		}
		if f.Late != late || f.SourcePartition != p || f.SourceOffset != last+1 {
			diffs = append(diffs, fmt.Sprintf("late %v, source %d/%d, want %v, %d/%d", f.Late, f.SourcePartition, f.SourceOffset, late, p, last+1))
		}
		if !slices.Equal(f.Windows, wantWindows) {
			diffs = append(diffs, fmt.Sprintf("windows %+v, want %+v", f.Windows, wantWindows))
		}
		if !env.reordered[p][req.entity] {
			var wantPrev *int64
			switch {
			case len(before) > 0:
				g := pv.eventTime - before[len(before)-1].t
				wantPrev = &g
			case len(counted) > 0:
				g := pv.eventTime - counted[len(counted)-1].t
				wantPrev = &g
			}
			if (f.MsSincePrevious == nil) != (wantPrev == nil) || wantPrev != nil && *f.MsSincePrevious != *wantPrev {
				diffs = append(diffs, fmt.Sprintf("ms_since_previous = %s, want %s", int64Or(f.MsSincePrevious), int64Or(wantPrev)))
			}
		}
	}
	if len(diffs) > 0 {
		out = append(out, answerVerdict{"preview: answer unlike the input's", strings.Join(diffs, "; ") + m.view().describe(s, p, last)})
	}
	return out
}

func int64Or(v *int64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}

func prefixVerdicts(prefix string, vs []answerVerdict) []answerVerdict {
	for i := range vs {
		vs[i].kind = prefix + vs[i].kind
	}
	return vs
}
