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
// (gen) and transactions (txs) give each one's entity and event time.
func idleExcuses(ends map[int32]int64, replay map[srcKey][]output, outs []map[srcKey][]output, gen map[srcKey]string, txs map[string]genTx) (map[srcKey]excuse, map[srcKey]bool) {
	accepted := func(k srcKey) bool { rs := replay[k]; return len(rs) == 1 && !rs[0].dead }
	// Per offset: the lowest and highest output offset of its features
	// records, and whether some output of it is a late dead letter.
	type span struct {
		lo, hi   int64
		features bool
		lateDLQ  bool
	}
	spans := map[srcKey]*span{}
	for _, m := range outs {
		for k, os := range m {
			if !accepted(k) {
				continue
			}
			sp := spans[k]
			if sp == nil {
				sp = &span{lo: math.MaxInt64, hi: math.MinInt64}
				spans[k] = sp
			}
			for _, o := range os {
				switch {
				case o.dead:
					sp.lateDLQ = sp.lateDLQ || o.reason == "late"
				default:
					sp.features = true
					sp.lo, sp.hi = min(sp.lo, o.outOffset), max(sp.hi, o.outOffset)
				}
			}
		}
	}
	type ev struct {
		off, t int64
	}
	lateness := allowedLateness.Milliseconds()
	outOfOrder := map[srcKey]bool{}
	ex := map[srcKey]excuse{}
	for p := range int32(partitions) {
		byEntity := map[string][]ev{} // in offset order
		for off := int64(0); off < ends[p]; off++ {
			if k := (srcKey{p, off}); accepted(k) {
				tx := txs[genID(gen[k])]
				byEntity[tx.entity] = append(byEntity[tx.entity], ev{off, tx.time})
			}
		}
		var found []ev
		for _, evs := range byEntity {
			for j, a := range evs {
				sa := spans[srcKey{p, a.off}]
				if sa == nil {
					continue // no output: reported by check
				}
				ooo := sa.lateDLQ
				// The B of A: earlier offsets, later event times. Every event of
				// E before the first one scanned back to below tA − lateness is
				// at most the lateness after that one: before A in event time.
				for i := j - 1; !ooo && i >= 0 && evs[i].t >= a.t-lateness; i-- {
					if sb := spans[srcKey{p, evs[i].off}]; evs[i].t > a.t && sb != nil && sb.features && sa.features && sb.lo < sa.hi {
						ooo = true
					}
				}
				if ooo {
					outOfOrder[srcKey{p, a.off}] = true
					found = append(found, a)
				}
			}
		}
		order := func(x, y ev) int { return cmp.Or(cmp.Compare(x.t, y.t), cmp.Compare(x.off, y.off)) }
		sorted := map[string][]ev{}
		for e, evs := range byEntity {
			sorted[e] = slices.SortedFunc(slices.Values(evs), order)
		}
		for _, a := range found {
			evs := sorted[txs[genID(gen[srcKey{p, a.off}])].entity]
			i, _ := slices.BinarySearchFunc(evs, a, order)
			for ; i < len(evs) && evs[i].t <= a.t+lateness; i++ {
				ex[srcKey{p, evs[i].off}] = excuseWhole
			}
			if i < len(evs) {
				if nk := (srcKey{p, evs[i].off}); ex[nk] < excusePrevious {
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
