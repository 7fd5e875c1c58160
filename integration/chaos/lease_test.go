//go:build integration

package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

// Which events a re-keyed group may count out of order, and which it may not
// (docs/repartition.md, the idle rule and its lease).
//
// A second stage counts an event out of order (late=true) or dead-letters it
// late_after_idle only when the event arrives below its frontier F. F is the
// minimum watermark of the sources (input partitions) not declared idle; it
// never falls; with every source idle it moves just past the newest pending
// event. While the event's source P counts in that minimum, F is at most P's
// watermark there, and P sends nothing new below a watermark it has sent (its
// promise: an event below it is a re-send, dropped as a duplicate). So F can
// pass an event of P only while P's idle declaration holds, and then only as
// far as the largest watermark another source has sent, or, with every source
// idle, just past the newest event received. The declaration holds until P
// sends anything else, or until the repartition partition's clock (the
// largest record timestamp read there: the brokers' append time) passes one
// lease past P's last idle marker; the lease is the allowed lateness, at least
// a second. Everything this needs is in the repartition partition's log, which
// the run reads back afterwards (read_committed under --exactly-once, as the
// second stage read it): every event a group counted out of order must have
// arrived below that bound, computed with the contract's lease whatever the
// markers say. One at or above it was passed by a declaration the lease should
// have ended: a lost owner's (killed, frozen, cut off) that did not run out,
// the regression of finding 12 (docs/fault-checker.md), or a frontier that
// moved past a source that counted.
//
// Why not a rule on the input alone, such as "only in-lateness input may be
// out of order" (what every run after the fix showed)? The lease is wall-clock
// time, and the contract's bound on the damage (nothing of the lost owner's
// input behind the frontier but what is within the lateness) follows from it
// only for event times that follow the clock. The generator's do not
// (input_test.go): within a burst a partition's clock advances about 10 ms a
// record, 0.75-3.75 s of event time a second at 300-1 500 records a second
// over four partitions; every burst begins 2 s past every partition's newest
// (align), and so does the rest of a burst a broker outage held up past the
// idle timeout; quiet periods stop it. The idle freeze begins 100 ms to 1.35 s
// before the next burst, so within one lease of the frozen owner's last
// renewal the other partitions can legitimately carry F up to 3.75 - 1 = 2.75
// s of event time past the first events it has not read, valid ones too.
// Under --exactly-once the first source to commit after a quiet spell moves F
// while the others, alive and renewing, are still declared idle
// (repartition.md), and a realigned burst puts its events 2 s past theirs.
// A kind rule would fail the product for what its contract allows:
// kafka-groups 2655125257 counted 4 and 6 valid events out of order under
// --exactly-once, each below the bound, the first events after a scale-up's
// handover during a broker outage (docs/fault-checker.md). Nor does the kind
// excuse an event: a lost owner's in-lateness backlog passed without a lease
// is as wrong as its valid events.
//
// The bound is sound for every fault: a kill, a freeze (a plain one or an idle
// freeze), a network cut or a slow owner all stop the renewals, which need the
// broker's word that the input is read to its end; under --exactly-once the
// hop records reach the second stage when their transaction commits, in log
// order, with their append times; a re-send arrives after the first copy,
// which is the one the second stage judged. It is loose where that costs
// nothing: it takes the largest watermark of the other sources rather than
// the smallest of those that count, the newest event received rather than the
// newest pending, and honours an idle marker of an old owner epoch (which the
// second stage ignores). What it cannot see: a renewal whose broker check came
// before a freeze or a cut and whose record was appended after it looks like a
// fresh one, as it does to the second stage. Only the kafka-groups variant has
// re-keyed groups; the input partitions' own idle rule is idleExcuses'.

// idleLeaseMs is an idle declaration's lease by the contract: the allowed
// lateness, at least a second.
var idleLeaseMs = max(allowedLateness, time.Second).Milliseconds()

// leaseBound is what the lease rule knows of an event's first arrival in its
// repartition partition.
type leaseBound struct {
	rp       int32
	at       int64 // its offset there
	t        int64 // its event time
	bound    int64 // the frontier's highest possible value then (math.MinInt64: its source was never idle)
	lastIdle int64 // the append time of its source's last idle marker before it (0: none)
	arrived  int64 // its own append time
}

// leaseBounds reads the repartition partitions' records (recs, by partition,
// with their timestamps) and returns, for every event's first arrival, the
// highest frontier the idle rule can have reached by then with leased
// declarations (above). An error names a record that is no hop record.
func leaseBounds(recs map[int32][]hopRecord, leaseMs int64) (map[srcKey]leaseBound, error) {
	out := map[srcKey]leaseBound{}
	var dec repartition.Decoder
	for rp := range int32(partitions) {
		rs := slices.SortedFunc(slices.Values(recs[rp]), func(a, b hopRecord) int { return cmp.Compare(a.off, b.off) })
		var wm, bound, leaseEnd, lastIdle [partitions]int64
		var idle [partitions]bool
		for p := range partitions {
			wm[p], bound[p] = math.MinInt64, math.MinInt64
		}
		clock, newest := int64(math.MinInt64), int64(math.MinInt64)
		for _, hr := range rs {
			var rec repartition.Record
			if err := dec.Decode(hr.value, &rec); err != nil {
				return nil, fmt.Errorf("repartition partition %d@%d is not a hop record: %w", rp, hr.off, err)
			}
			s := rec.Source
			if s < 0 || s >= partitions {
				return nil, fmt.Errorf("repartition partition %d@%d names source partition %d of %d", rp, hr.off, s, partitions)
			}
			// The record's timestamp advances the clock first, and ends every
			// declaration whose lease it passes.
			if hr.ts > clock {
				clock = hr.ts
				for p := range partitions {
					if idle[p] && leaseEnd[p] < clock {
						idle[p] = false
					}
				}
			}
			event := rec.Kind == repartition.KindEvent
			if event {
				if k := (srcKey{s, rec.Offset}); !seenBound(out, k) {
					out[k] = leaseBound{rp: rp, at: hr.off, t: rec.EventTime, bound: bound[s], lastIdle: lastIdle[s], arrived: hr.ts}
				}
				newest = max(newest, rec.EventTime)
			}
			switch {
			case !event && rec.Idle:
				idle[s], leaseEnd[s], lastIdle[s] = true, clock+leaseMs, hr.ts
			default:
				idle[s] = false
			}
			wm[s] = max(wm[s], rec.Watermark)
			all := !slices.Contains(idle[:], false)
			for p := range partitions {
				if !idle[p] {
					continue
				}
				for q := range partitions {
					if q != p {
						bound[p] = max(bound[p], wm[q])
					}
				}
				if all && newest != math.MinInt64 {
					bound[p] = max(bound[p], newest+1)
				}
			}
		}
	}
	return out, nil
}

func seenBound(m map[srcKey]leaseBound, k srcKey) bool { _, ok := m[k]; return ok }

// checkGroupLeases holds a re-keyed group's out-of-order events (ooo: counted
// with late=true or dead-lettered late_after_idle, by input record) to the
// lease rule above, over its repartition topic's records (recs). It returns
// the failure, if any, and how many of them arrived below the bound. gen gives
// each input record's kind.
func checkGroupLeases(group, mode, topic string, recs map[int32][]hopRecord, ooo map[srcKey]bool, gen map[srcKey]string) (fails []string, within int) {
	bounds, err := leaseBounds(recs, idleLeaseMs)
	if err != nil {
		return []string{fmt.Sprintf("group %s (%s): the idle lease rule cannot read %s: %v", group, mode, topic, err)}, 0
	}
	bad := map[srcKey]bool{}
	kinds := map[string]int{}
	noHop := 0
	for k := range ooo {
		b, ok := bounds[k]
		if ok && b.t < b.bound {
			within++
			continue
		}
		bad[k] = true
		kind, _, _ := strings.Cut(gen[k], " ")
		kinds[kind]++
		if !ok {
			noHop++
		}
	}
	if len(bad) == 0 {
		return nil, within
	}
	var b strings.Builder
	fmt.Fprintf(&b, "group %s (%s): %d events counted out of order (late=true, or dead-lettered late_after_idle) that no leased idle declaration can have let the order pass "+
		"(docs/repartition.md: a declaration holds one lease, %d ms of the repartition partition's clock, past its source's last idle marker; docs/fault-checker.md, finding 12): "+
		"each arrived at or above the largest watermark the other input partitions had sent while its own partition's declaration held; by input kind %v;",
		group, mode, len(bad), idleLeaseMs, kinds)
	if noHop > 0 {
		fmt.Fprintf(&b, " %d of them have no hop record in %s;", noHop, topic)
	}
	keys := slices.SortedFunc(maps.Keys(bad), func(x, y srcKey) int {
		return cmp.Or(cmp.Compare(x.part, y.part), cmp.Compare(x.offset, y.offset))
	})
	for _, k := range keys {
		fb, ok := bounds[k]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, " the first, input %d/%d (%s, event time %d), arrived at %s/%d@%d at %s",
			k.part, k.offset, gen[k], fb.t, topic, fb.rp, fb.at, time.UnixMilli(fb.arrived).UTC().Format("15:04:05.000"))
		if fb.bound == math.MinInt64 {
			b.WriteString(", its partition having declared nothing idle there before it;")
		} else {
			fmt.Fprintf(&b, ", %d ms at or above that bound (its partition's last idle marker there %s before it);",
				fb.t-fb.bound, time.Duration(fb.arrived-fb.lastIdle)*time.Millisecond)
		}
		break
	}
	fmt.Fprintf(&b, " offsets:%s", describeOffsets(bad))
	return []string{b.String()}, within
}
