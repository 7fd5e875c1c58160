//go:build integration

package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/linkedin/goavro/v2"
)

// The idle rule (docs/contract.md, "What releases the rest") is the one place
// where wall-clock time enters the results: a live partition that delivers
// nothing for --idle-timeout, and holds nothing more at the broker, releases
// everything pending, and an event that then
// arrives older than an event already counted for its entity, but not late, is
// counted out of order (its aggregates read at bucket granularity; late stays
// false, which says --late=apply only) or dead-lettered late if its bucket has
// left a window. Replay never releases early. The generator sends such events
// (kind "in-lateness": behind the newest accepted event by less than the
// lateness) and pauses bursts past the idle timeout, so a run can differ from
// replay there, and so can a crash's repeat from the first output.
//
// Which events were counted out of order. A features topic partition holds a
// partition's features records in the order the service released them. For an
// accepted event A of entity E, let B be an event of E accepted before A (a
// lower input offset) but after it in (event time, offset) order. Without an
// idle release B's features record never comes before A's: B is released only
// when the watermark passes it, and a watermark past B is past A, which would
// then have been late, in replay too (the watermark is a function of the
// input). So when some features record of such a B precedes some features
// record of A in the output partition, A was (or may have been, when the two
// records are of different runs across a crash) counted out of order, and so
// when A's output is a late dead letter where replay counted it.
//
// How far that may change the outputs, for such an A at (tA, oA): the events of
// E that idle released before A are ones replay releases after it, all with an
// event time at most tA + lateness (they were pending, so no newer than the
// newest accepted event then, and A, not late, is within the lateness of that).
// Their outputs, and A's, may differ in any field. The next event of E after
// them counts the same windows (a window's state is its buckets, whatever order
// filled them) but its ms_since_previous is measured from the previous event in
// apply order, which differs. Every other output must equal replay's, byte for
// byte. If A was dead-lettered, E's windows lack A for as long as they hold its
// bucket and the outputs after it differ beyond these; the windows of the
// checker's runs are wider than the lateness by far, so that does not arise,
// and would be reported.

// excuse is how far an input offset's outputs may differ from replay's, and
// from each other, under the idle rule.
type excuse int

const (
	excusePrevious excuse = iota + 1 // ms_since_previous only
	excuseWhole                      // any field, but not the key, and a features record stays one
)

// idleExcuses finds the events that the outputs in outs show counted out of
// order (the A above) and returns the excuse of each offset they touch, and
// those events. replay says which offsets are accepted; the generator's notes
// (gen) and transactions (txs) give each one's entity and event time. horizon
// is the largest window plus its bucket: how long a late event counted in one
// run and dead-lettered in another stays in its entity's windows.
//
// Under --late=apply, replay counts a late event at once (late_test.go), so
// its events' release order is no longer their (event time, offset) order, and
// the rule above changes in three places:
//   - A late event is never a B: it is counted at its own offset in every run.
//     An earlier event is a B of a late A only if it was still pending when A
//     arrived in replay (its event time above the watermark then): one counted
//     before A anyway is not out of order. (The scan back stops at the first
//     event that is not late and more than the lateness before A, as before:
//     every accepted event that is not late is at most the lateness after each
//     one before it.)
//   - The late events of E that replay counts among A and its B's read other
//     windows there than in the live run (a late event reads whole buckets up to
//     its own, and which are retained moves with the entity's newest event):
//     every event of E that replay counts between the first and the last of
//     them may differ in any field; the next one after, in ms_since_previous.
//   - A late A that one run counted and another dead-lettered (its bucket had
//     left a window there: the idle release had moved its entity's newest event
//     on) is missing from E's windows in one of them until its bucket leaves
//     every window: E's events up to horizon after it may differ in any field.
func idleExcuses(ends map[int32]int64, replay map[srcKey][]output, outs []map[srcKey][]output, gen map[srcKey]string, txs map[string]genTx, horizon int64) (map[srcKey]excuse, map[srcKey]bool) {
	accepted := func(k srcKey) bool { rs := replay[k]; return len(rs) == 1 && !rs[0].dead }
	// Per offset: the lowest and highest output offset of its features
	// records, overall and per producer, and whether some output of it is a
	// late dead letter.
	type span struct {
		lo, hi   int64
		features bool
		lateDLQ  bool
		byPid    map[int64][2]int64
	}
	spans := map[srcKey]*span{}
	for _, m := range outs {
		for k, os := range m {
			if !accepted(k) {
				continue
			}
			sp := spans[k]
			if sp == nil {
				sp = &span{lo: math.MaxInt64, hi: math.MinInt64, byPid: map[int64][2]int64{}}
				spans[k] = sp
			}
			for _, o := range os {
				switch {
				case o.dead:
					sp.lateDLQ = sp.lateDLQ || o.reason == "late"
				default:
					sp.features = true
					sp.lo, sp.hi = min(sp.lo, o.outOffset), max(sp.hi, o.outOffset)
					r, ok := sp.byPid[o.pid]
					if !ok {
						r = [2]int64{math.MaxInt64, math.MinInt64}
					}
					sp.byPid[o.pid] = [2]int64{min(r[0], o.outOffset), max(r[1], o.outOffset)}
				}
			}
		}
	}
	// precedes says whether the outputs show B's features record before A's
	// in one run. A run is a producer id's sequence (a process from its start,
	// or from a new id its producer took, to its end): in the default mode a
	// crash's or a move's repeats come after the first run's records, so a
	// repeat of A after the first run's B says nothing. A run that wrote A and
	// no B had B counted already, in its restored state or before it took a
	// new producer id: B's first record, before that A, is the order it counted
	// them in. (A run that stops after A and before B's release looks the
	// same; that only excuses more.)
	precedes := func(sb, sa *span) bool {
		for pid, ra := range sa.byPid {
			if rb, ok := sb.byPid[pid]; ok && rb[0] < ra[1] || !ok && sb.lo < ra[1] {
				return true
			}
		}
		return false
	}
	type ev struct {
		off, t, wm, rel int64
		late            bool
	}
	lateness := allowedLateness.Milliseconds()
	outOfOrder := map[srcKey]bool{}
	ex := map[srcKey]excuse{}
	for p := range int32(partitions) {
		var all []orderEvent
		for off := int64(0); off < ends[p]; off++ {
			if k := (srcKey{p, off}); accepted(k) {
				all = append(all, orderEvent{off, txs[genID(gen[k])].time})
			}
		}
		late, wm, rel := replayOrder(all)
		byEntity := map[string][]ev{} // in offset order
		for i, e := range all {
			ent := txs[genID(gen[srcKey{p, e.off}])].entity
			byEntity[ent] = append(byEntity[ent], ev{e.off, e.t, wm[i], rel[i], late[i]})
		}
		type found struct {
			a      ev
			entity string
			dead   bool // dead-lettered late in a run, where replay counted it
		}
		var fs []found
		for ent, evs := range byEntity {
			for j, a := range evs {
				sa := spans[srcKey{p, a.off}]
				if sa == nil {
					continue // no output: reported by check
				}
				ooo := sa.lateDLQ
				// The B of A: earlier offsets, later event times (and, for a
				// late A, pending when it arrived). Every event of E that is
				// not late and before the first such one scanned back to below
				// tA − lateness is at most the lateness after that one: before
				// A in event time.
				for i := j - 1; !ooo && i >= 0; i-- {
					b := evs[i]
					if b.late {
						continue
					}
					if b.t < a.t-lateness {
						break
					}
					if sb := spans[srcKey{p, b.off}]; b.t > a.t && (!a.late || b.t > a.wm) && sb != nil && sb.features && sa.features && precedes(sb, sa) {
						ooo = true
					}
				}
				if ooo {
					outOfOrder[srcKey{p, a.off}] = true
					fs = append(fs, found{a, ent, sa.lateDLQ})
				}
			}
		}
		order := func(x, y ev) int { return releaseOrder(x.rel, x.t, x.off, y.rel, y.t, y.off) }
		sorted := map[string][]ev{}
		for e, evs := range byEntity {
			sorted[e] = slices.SortedFunc(slices.Values(evs), order)
		}
		for _, f := range fs {
			a, evs := f.a, sorted[f.entity]
			member := func(e ev) bool {
				switch {
				case e.off == a.off:
					return true
				case !a.late:
					return (e.t > a.t || e.t == a.t && e.off > a.off) && e.t <= a.t+lateness
				case !e.late && e.off < a.off && e.rel > a.off:
					return true // pending when the late A arrived: a B
				default:
					return f.dead && order(e, a) > 0 && e.t <= a.t+horizon
				}
			}
			first, last := -1, -1
			for i, e := range evs {
				if member(e) {
					if first < 0 {
						first = i
					}
					last = i
				}
			}
			for i := first; i <= last; i++ {
				ex[srcKey{p, evs[i].off}] = excuseWhole
			}
			if last+1 < len(evs) {
				if nk := (srcKey{p, evs[last+1].off}); ex[nk] < excusePrevious {
					ex[nk] = excusePrevious
				}
			}
		}
	}
	return ex, outOfOrder
}

// excused says whether got may stand where want is expected under excuse e.
func excused(e excuse, got, want output, c *goavro.Codec) bool {
	switch e {
	case excuseWhole:
		// A dead letter keeps the input record's key; a features record is
		// keyed by the entity, which a record may not be keyed by.
		if got.dead != want.dead {
			return got.dead && got.reason == "late" || want.dead && want.reason == "late"
		}
		return got.dead || string(got.key) == string(want.key)
	case excusePrevious:
		if got.dead || want.dead || string(got.key) != string(want.key) {
			return false
		}
		if c == nil {
			c = featuresCodec
		}
		g, _, err1 := c.NativeFromBinary(got.value)
		w, _, err2 := c.NativeFromBinary(want.value)
		if err1 != nil || err2 != nil {
			return false
		}
		gm, wm := g.(map[string]any), w.(map[string]any)
		for f := range wm {
			if f != "ms_since_previous" && fmt.Sprint(gm[f]) != fmt.Sprint(wm[f]) {
				return false
			}
		}
		return len(gm) == len(wm)
	}
	return false
}

// describeExcuses counts the excused offsets per partition and kind, for a note.
func describeExcuses(ex map[srcKey]excuse) string {
	var whole, prev [partitions]int
	for k, e := range ex {
		if e == excuseWhole {
			whole[k.part]++
		} else {
			prev[k.part]++
		}
	}
	s := ""
	for p := range partitions {
		if whole[p]+prev[p] > 0 {
			s += fmt.Sprintf(" partition %d: %d whole, %d ms_since_previous;", p, whole[p], prev[p])
		}
	}
	return s
}

// describeOffsets lists the input offsets of keys per partition, as ranges
// with their counts ("partition 0: 645-650 (6), 1148"), for the timeline: to
// set beside the faults and the instances' logs.
func describeOffsets(keys map[srcKey]bool) string {
	byPart := map[int32][]int64{}
	for k := range keys {
		byPart[k.part] = append(byPart[k.part], k.offset)
	}
	s := ""
	for p := range int32(partitions) {
		offs := byPart[p]
		if len(offs) == 0 {
			continue
		}
		slices.Sort(offs)
		s += fmt.Sprintf(" partition %d:", p)
		for i := 0; i < len(offs); {
			j := i
			for j+1 < len(offs) && offs[j+1] == offs[j]+1 {
				j++
			}
			if j > i {
				s += fmt.Sprintf(" %d-%d (%d)", offs[i], offs[j], j-i+1)
			} else {
				s += fmt.Sprintf(" %d", offs[i])
			}
			i = j + 1
		}
		s += ";"
	}
	return s
}

// groupIdleExcuses is idleExcuses for a re-keyed group's outputs
// (docs/repartition.md, the idle rule). A second stage whose order the idle
// rule let pass an event counts it at once, out of order, and says so
// (late=true), so the out-of-order events (A) are the outputs' own word. Its
// windows are buckets, whatever the order, so only these outputs of A's key can
// differ from replay's: A's; those of the key's events after A in (event time,
// source partition, source offset) order that were released before it, as the
// group's output partition shows (a record of theirs precedes one of A's); and
// the ms_since_previous of the key's event released right after A. No time bound
// limits the second set: the frontier the idle rule let pass can be any distance
// ahead. An A dead-lettered late_after_idle is never counted, so its key's windows
// lack it for as long as they would hold its bucket; such events are only counted
// (deadAtIdle), and the caller holds the group to replay's only without them.
// replay is the group's replay outputs (keyed by the group's key); c decodes its
// features values.
func groupIdleExcuses(replay map[srcKey][]output, outs []map[srcKey][]output, gen map[srcKey]string, txs map[string]genTx, c *goavro.Codec) (ex map[srcKey]excuse, outOfOrder map[srcKey]bool, deadAtIdle int) {
	type ev struct {
		k srcKey
		t int64
	}
	order := func(x, y ev) int {
		return cmp.Or(cmp.Compare(x.t, y.t), cmp.Compare(x.k.part, y.k.part), cmp.Compare(x.k.offset, y.k.offset))
	}
	byKey := map[string][]ev{}
	keyOf := map[srcKey]string{}
	for k, rs := range replay {
		if len(rs) != 1 || rs[0].dead {
			continue
		}
		key := string(rs[0].key)
		keyOf[k] = key
		byKey[key] = append(byKey[key], ev{k, txs[genID(gen[k])].time})
	}
	for _, evs := range byKey {
		slices.SortFunc(evs, order)
	}
	// Every features record's output offset, by input record.
	copies := map[srcKey][]int64{}
	outOfOrder = map[srcKey]bool{}
	for _, m := range outs {
		for k, os := range m {
			if _, ok := keyOf[k]; !ok {
				continue
			}
			for _, o := range os {
				switch {
				case o.dead && o.reason == "late_after_idle":
					if !outOfOrder[k] {
						deadAtIdle++
					}
					outOfOrder[k] = true
				case o.dead:
				default:
					copies[k] = append(copies[k], o.outOffset)
					if nat, _, err := c.NativeFromBinary(o.value); err == nil {
						if late, _ := nat.(map[string]any)["late"].(bool); late {
							outOfOrder[k] = true
						}
					}
				}
			}
		}
	}
	span := func(k srcKey) (lo, hi int64, ok bool) {
		cs := copies[k]
		if len(cs) == 0 {
			return 0, 0, false
		}
		return slices.Min(cs), slices.Max(cs), true
	}
	ex = map[srcKey]excuse{}
	for a := range outOfOrder {
		key := keyOf[a]
		evs := byKey[key]
		ae := ev{a, txs[genID(gen[a])].time}
		ex[a] = excuseWhole
		_, aHi, aOut := span(a)
		i, _ := slices.BinarySearchFunc(evs, ae, order)
		for _, x := range evs[i:] {
			if x.k == a {
				continue
			}
			if xLo, _, ok := span(x.k); ok && aOut && xLo < aHi {
				ex[x.k] = excuseWhole
			}
		}
		// The key's event released right after each copy of A: its previous
		// event in apply order is A.
		for _, ac := range copies[a] {
			var next srcKey
			nextOff := int64(math.MaxInt64)
			for _, x := range evs {
				for _, xc := range copies[x.k] {
					if x.k != a && xc > ac && xc < nextOff {
						next, nextOff = x.k, xc
					}
				}
			}
			if nextOff != math.MaxInt64 && ex[next] < excusePrevious {
				ex[next] = excusePrevious
			}
		}
	}
	return ex, outOfOrder, deadAtIdle
}
