//go:build integration

package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/linkedin/goavro/v2"
)

// Late events, as replay decides them (docs/contract.md, "Watermark and
// lateness"): the watermark of a partition is the newest event time it has
// accepted, less the allowed lateness, and an arriving event with an event time
// below it is late. Under --late=dlq a late event is dead-lettered late. Under
// --late=apply it is counted at once (never held in the reorder buffer) and
// emitted with late=true, unless it is more than the largest window behind the
// watermark or its bucket has left a window of its entity's (the windows as its
// entity's newest counted event has moved them), when it is dead-lettered late.
// An event that is not late waits in the reorder buffer until the watermark
// reaches its event time, and leaves it in (event time, offset) order.
//
// The checker computes all of that from the input alone and holds replay's
// verdicts to it; replay is then the reference the live outputs are compared
// with (check.go), so a late verdict that depends on more than the input is
// found twice.

// orderEvent is one accepted input record of a partition: its offset and event
// time.
type orderEvent struct{ off, t int64 }

// replayOrder takes a partition's accepted events in offset order and returns,
// for each, whether it is late, the watermark when it arrived (MinInt64 before
// any accepted event) and the input offset at which replay counts it: a late
// event's own; any other's, the offset of the first event at or after it that
// brings the watermark to its event time (MaxInt64: the end of the replay,
// which releases everything). Replay counts events in (release offset, event
// time, offset) order (releaseOrder): a late event is alone at its offset,
// because it does not move the watermark.
func replayOrder(evs []orderEvent) (late []bool, wm, rel []int64) {
	lateness := allowedLateness.Milliseconds()
	late, wm, rel = make([]bool, len(evs)), make([]int64, len(evs)), make([]int64, len(evs))
	maxSeen, has := int64(0), false
	var pending []int // not yet released, in (event time, offset) order
	for i, e := range evs {
		wm[i] = math.MinInt64
		if has {
			wm[i] = maxSeen - lateness
		}
		rel[i] = math.MaxInt64
		if has && e.t < wm[i] {
			late[i], rel[i] = true, e.off
			continue
		}
		maxSeen, has = max(maxSeen, e.t), true
		at, _ := slices.BinarySearchFunc(pending, i, func(j, i int) int {
			return cmp.Or(cmp.Compare(evs[j].t, evs[i].t), cmp.Compare(evs[j].off, evs[i].off))
		})
		pending = slices.Insert(pending, at, i)
		n := 0
		for n < len(pending) && evs[pending[n]].t <= maxSeen-lateness {
			rel[pending[n]] = e.off
			n++
		}
		pending = pending[n:]
	}
	return late, wm, rel
}

// releaseOrder orders events by when replay counts them: release offset, then
// event time, then offset.
func releaseOrder(relX, tX, offX, relY, tY, offY int64) int {
	return cmp.Or(cmp.Compare(relX, relY), cmp.Compare(tX, tY), cmp.Compare(offX, offY))
}

// lateStats counts replay's late verdicts, for the timeline.
type lateStats struct {
	counted, dead int
}

// checkLate holds replay's verdict on every input record that is late, or that
// replay dead-lettered as late, to the rule above under the run's policy, and
// every features record's late flag to whether its event was late. c decodes
// the features values (nil: ours).
func (m *apiModel) checkLate(replay map[srcKey][]output, gen map[srcKey]string, txs map[string]genTx, c *goavro.Codec) ([]string, lateStats) {
	if c == nil {
		c = featuresCodec
	}
	var largest int64
	for _, sp := range m.specs {
		largest = max(largest, sp.WindowMs)
	}
	var st lateStats
	var fails []string
	fail := func(k srcKey, format string, args ...any) {
		if len(fails) < 20 {
			fails = append(fails, fmt.Sprintf("late rule (--late=%s): input %d/%d (%q): ", m.late, k.part, k.offset, gen[k])+fmt.Sprintf(format, args...))
		} else if len(fails) == 20 {
			fails = append(fails, "late rule: more broken, not listed")
		}
	}
	for p := range int32(partitions) {
		pm := &m.parts[p]
		for off := int64(0); off < m.ends[p]; off++ {
			k := srcKey{p, off}
			rs := replay[k]
			if len(rs) != 1 || rs[0].dead && rs[0].reason != "late" {
				continue // other verdicts: replay's accounting, and the live comparison
			}
			tx, ok := txs[genID(gen[k])]
			if !ok {
				continue
			}
			i := sort.Search(len(pm.acc), func(i int) bool { return pm.acc[i].off >= off })
			wm, has := int64(math.MinInt64), i > 0
			if has {
				wm = pm.acc[i-1].prefMax - allowedLateness.Milliseconds()
			}
			isLate := has && tx.time < wm
			if !rs[0].dead {
				native, _, err := c.NativeFromBinary(rs[0].value)
				if err != nil {
					fail(k, "features record unreadable: %v", err)
					continue
				}
				flag, _ := native.(map[string]any)["late"].(bool)
				if flag != isLate {
					fail(k, "features record with late=%v, but its event time %d is %s the watermark %d", flag, tx.time, map[bool]string{false: "at or after", true: "behind"}[isLate], wm)
				}
			}
			if !isLate {
				if rs[0].dead {
					fail(k, "dead-lettered late, but its event time %d is at or after the watermark %d", tx.time, wm)
				}
				continue
			}
			// Late: what the policy makes of it.
			want, why := "dead", ""
			switch {
			case m.late != "apply":
				why = "--late=dlq"
			case wm-tx.time > largest:
				why = fmt.Sprintf("%d ms behind the watermark, more than the largest window (%d ms)", wm-tx.time, largest)
			default:
				// The entity's newest counted event when it arrived: replay has
				// counted what it released at earlier offsets.
				var newest int64
				hasNewest := false
				for _, j := range pm.byEntity[tx.entity] {
					if e := pm.acc[j]; e.off < off && e.rel < off && (!hasNewest || e.tx.time > newest) {
						newest, hasNewest = e.tx.time, true
					}
				}
				want = "features"
				for _, sp := range m.specs {
					n := sp.WindowMs / sp.BucketMs
					if hasNewest && floorDiv(tx.time, sp.BucketMs) <= floorDiv(newest, sp.BucketMs)-n {
						want, why = "dead", fmt.Sprintf("its bucket has left window %s of its entity, whose newest counted event is at %d", sp.Name, newest)
						break
					}
				}
				if want == "features" {
					why = fmt.Sprintf("its bucket is retained in every window of its entity (newest counted event at %d)", newest)
				}
			}
			switch got := map[bool]string{false: "features", true: "dead"}[rs[0].dead]; {
			case got != want && want == "dead":
				fail(k, "counted with late=true at event time %d, %d ms behind the watermark %d; want a late dead letter: %s", tx.time, wm-tx.time, wm, why)
			case got != want:
				fail(k, "dead-lettered late at event time %d, %d ms behind the watermark %d; want it counted: %s", tx.time, wm-tx.time, wm, why)
			case got == "dead":
				st.dead++
			default:
				st.counted++
			}
		}
	}
	return fails, st
}
