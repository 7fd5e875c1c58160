//go:build integration

package chaos

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/linkedin/goavro/v2"
)

// checkpoint is what the topics held at one moment of a run, and what they
// must hold then.
type checkpoint struct {
	label string // when it was taken, for messages
	eos   bool
	outs  map[srcKey][]output
}

// verdictInput is everything the checks read: the input's end offsets (every
// offset below them is a record: the input topic is never compacted and keeps
// its records), the outputs of the live group at each checkpoint, the outputs
// of `velocity-consumer replay` of the same input, and the generator's note
// on each input record.
type verdictInput struct {
	inputTopic string
	ends       map[int32]int64
	replay     map[srcKey][]output
	gen        map[srcKey]string
	// only, for a re-keyed group, is the input records that have an output in
	// the group (those the replay has one for): a record refused at its input
	// partition, or without the group's key, has none. nil: every input offset.
	only map[srcKey]bool
	// codec decodes the features values compared, to name the field that
	// differs (nil: ours, schemas/velocity_features.avsc).
	codec *goavro.Codec
	// excused is how far the outputs of an input offset may differ from
	// replay's and from each other because the idle rule released its
	// partition early in the live run (idle_test.go); absent: not at all.
	excused map[srcKey]excuse
	// txs are the generator's transactions by id (for a failure's history;
	// nil: none given).
	txs map[string]genTx
}

// offsetSet collects input offsets per partition for a message.
type offsetSet map[int32][]int64

func (s offsetSet) add(k srcKey) { s[k.part] = append(s[k.part], k.offset) }

func (s offsetSet) count() int {
	n := 0
	for _, o := range s {
		n += len(o)
	}
	return n
}

// describe names every partition, its offsets as ranges (the first few) and
// what the first of them were in the input.
func (s offsetSet) describe(gen map[srcKey]string) string {
	var b strings.Builder
	parts := slices.Sorted(func(yield func(int32) bool) {
		for p := range s {
			if !yield(p) {
				return
			}
		}
	})
	for _, p := range parts {
		offs := s[p]
		slices.Sort(offs)
		var ranges []string
		for i := 0; i < len(offs); {
			j := i
			for j+1 < len(offs) && offs[j+1] == offs[j]+1 {
				j++
			}
			if offs[i] == offs[j] {
				ranges = append(ranges, fmt.Sprint(offs[i]))
			} else {
				ranges = append(ranges, fmt.Sprintf("%d-%d", offs[i], offs[j]))
			}
			i = j + 1
		}
		more := ""
		if len(ranges) > 8 {
			more = fmt.Sprintf(" and %d more ranges", len(ranges)-8)
			ranges = ranges[:8]
		}
		fmt.Fprintf(&b, "\n    partition %d: %d offsets: %s%s", p, len(offs), strings.Join(ranges, ", "), more)
		var kinds []string
		for _, o := range offs[:min(3, len(offs))] {
			kinds = append(kinds, fmt.Sprintf("%d is %q", o, gen[srcKey{p, o}]))
		}
		fmt.Fprintf(&b, " (input: %s)", strings.Join(kinds, "; "))
	}
	return b.String()
}

// check returns one paragraph per broken invariant at cp; none when it holds.
func check(cp checkpoint, in verdictInput) []string {
	var fails []string
	missing, repeated, unequalDup, stray := offsetSet{}, offsetSet{}, offsetSet{}, offsetSet{}
	var repeatedMax int
	var dupExample, strayExample string

	for p, end := range in.ends {
		for off := int64(0); off < end; off++ {
			k := srcKey{p, off}
			if in.only != nil && !in.only[k] {
				continue // no output in this group; one would be a stray, below
			}
			got := cp.outs[k]

			// Both modes: every input offset has an output, a features record or a
			// dead letter (the accounting invariant; in the default mode at least
			// one, since a crash re-emits what followed the last checkpoint).
			if len(got) == 0 {
				missing.add(k)
				continue
			}

			// --exactly-once: a read_committed reader sees exactly one output per
			// input offset, across crashes, freezes, rebalances and broker
			// restarts.
			if cp.eos && len(got) > 1 {
				repeated.add(k)
				repeatedMax = max(repeatedMax, len(got))
			}

			// Default mode: the outputs a crash repeats are byte-identical to the
			// first (key, value, and a dead letter's reason and error), so that a
			// consumer that keys on the source position may drop them.
			if !cp.eos {
				for _, o := range got[1:] {
					if !o.same(got[0]) && !excused(in.excused[k], o, got[0], in.codec) {
						unequalDup.add(k)
						if dupExample == "" {
							dupExample = fmt.Sprintf("input %d/%d: %s and %s differ: %s", p, off, got[0].at, o.at, diff(o, got[0], in.codec))
						}
						break
					}
				}
			}
		}
	}

	// Both modes: an output names an input record that exists, of the input
	// topic: no output for an offset beyond the input's end or another topic.
	for k, os := range cp.outs {
		if end, ok := in.ends[k.part]; !ok || k.offset < 0 || k.offset >= end || in.only != nil && !in.only[k] {
			stray.add(k)
			if strayExample == "" {
				strayExample = fmt.Sprintf("%s names input %d/%d", os[0].at, k.part, k.offset)
				if in.only != nil && !in.only[k] {
					strayExample += ", which the replay gives no output in this group"
				}
			}
			continue
		}
		for _, o := range os {
			if o.srcTopic != in.inputTopic {
				stray.add(k)
				if strayExample == "" {
					strayExample = fmt.Sprintf("%s names source topic %q, not %q", o.at, o.srcTopic, in.inputTopic)
				}
				break
			}
		}
	}

	if n := missing.count(); n > 0 {
		fails = append(fails, fmt.Sprintf("%s: %d input offsets have no output (features or dead letter):%s", cp.label, n, missing.describe(in.gen)))
	}
	if n := repeated.count(); n > 0 {
		fails = append(fails, fmt.Sprintf("%s: %d input offsets have more than one committed output (up to %d), want exactly one:%s", cp.label, n, repeatedMax, repeated.describe(in.gen)))
	}
	if n := unequalDup.count(); n > 0 {
		fails = append(fails, fmt.Sprintf("%s: %d input offsets have outputs that differ from each other; first: %s:%s", cp.label, n, dupExample, unequalDup.describe(in.gen)))
	}
	if n := stray.count(); n > 0 {
		fails = append(fails, fmt.Sprintf("%s: %d outputs name no input record of %s; first: %s:%s", cp.label, n, in.inputTopic, strayExample, stray.describe(in.gen)))
	}

	// Both modes: every output equals, byte for byte (key, value, and a dead
	// letter's reason and error), what `velocity-consumer replay` of the same
	// input publishes for that offset: values are a function of the input and
	// the configuration only, whatever crashed, froze or moved meanwhile.
	if in.replay != nil {
		differ := offsetSet{}
		var example string
		var exKey srcKey
		for k, os := range cp.outs {
			want := in.replay[k]
			if len(want) != 1 {
				continue // reported once, by checkReplay
			}
			for _, o := range os {
				if !o.same(want[0]) && !excused(in.excused[k], o, want[0], in.codec) {
					differ.add(k)
					if example == "" || k.part < exKey.part || k.part == exKey.part && k.offset < exKey.offset {
						exKey = k
						example = fmt.Sprintf("input %d/%d: live %s, replay %s: %s", k.part, k.offset, o.at, want[0].at, diff(o, want[0], in.codec))
					}
					break
				}
			}
		}
		if n := differ.count(); n > 0 {
			fails = append(fails, fmt.Sprintf("%s: %d input offsets have outputs that differ from replay's; e.g. %s:%s%s", cp.label, n, example, differ.describe(in.gen), history(exKey, in, cp.outs)))
		}
	}
	return fails
}

// history is, for the reader of a failure at input k, its entity's accepted
// events on k's partition in the minute of event time up to k's (the default
// contract's shortest window), at most the last 20, each with its outputs:
// where and when they were produced, late, and the first window's count.
func history(k srcKey, in verdictInput, outs map[srcKey][]output) string {
	if in.txs == nil {
		return ""
	}
	tx, ok := in.txs[genID(in.gen[k])]
	if !ok {
		return ""
	}
	var keys []srcKey
	for off := range k.offset + 1 {
		o := srcKey{k.part, off}
		rs := in.replay[o]
		if len(rs) != 1 || rs[0].dead {
			continue
		}
		if e, ok := in.txs[genID(in.gen[o])]; ok && e.entity == tx.entity && e.time >= tx.time-60_000 && e.time <= tx.time {
			keys = append(keys, o)
		}
	}
	keys = keys[max(0, len(keys)-20):]
	// And the first 5 after k in the input but not after it in event time:
	// events within the lateness, which replay counts before k if they arrive
	// while k is pending, and under --late=apply late events, which it counts
	// at once. What a crash after an idle release and before its commit
	// shows: the next owner counts them before k too, the first did not.
	var later []srcKey
	for off := k.offset + 1; off < in.ends[k.part] && len(later) < 5; off++ {
		o := srcKey{k.part, off}
		if rs := in.replay[o]; len(rs) != 1 || rs[0].dead {
			continue
		}
		if e, ok := in.txs[genID(in.gen[o])]; ok && e.entity == tx.entity && e.time <= tx.time && e.time >= tx.time-60_000 {
			later = append(later, o)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n    entity %q at input %d/%d (event time %d): its accepted events in the minute before, and their outputs:", tx.entity, k.part, k.offset, tx.time)
	for i, o := range append(keys, later...) {
		if i == len(keys) {
			fmt.Fprintf(&b, "\n      and after it in the input, before it in event time:")
		}
		e := in.txs[genID(in.gen[o])]
		fmt.Fprintf(&b, "\n      %d/%d %q, event time %+d ms: replay %s", o.part, o.offset, in.gen[o], e.time-tx.time, outputSummary(in.replay[o][0], in.codec))
		for _, x := range outs[o] {
			fmt.Fprintf(&b, "\n        %s", outputSummary(x, in.codec))
		}
	}
	return b.String()
}

// outputSummary is where an output was produced and, for one of our features
// records, its late flag and first window's count.
func outputSummary(o output, c *goavro.Codec) string {
	if o.dead || c != nil {
		return o.at
	}
	native, _, err := featuresCodec.NativeFromBinary(o.value)
	if err != nil {
		return o.at
	}
	m := native.(map[string]any)
	count := any("?")
	if ws, _ := m["windows"].([]any); len(ws) > 0 {
		if w0, ok := ws[0].(map[string]any); ok {
			count = w0["count"]
		}
	}
	return fmt.Sprintf("%s late=%v count[0]=%v", o.at, m["late"], count)
}

// checkReplay: the replay itself must account for every input offset exactly
// once, or it is no reference.
func checkReplay(in verdictInput) []string {
	missing, repeated := offsetSet{}, offsetSet{}
	for p, end := range in.ends {
		for off := int64(0); off < end; off++ {
			switch n := len(in.replay[srcKey{p, off}]); {
			case n == 0 && in.only != nil:
				// A re-keyed group: only some records have an output there.
			case n == 0:
				missing.add(srcKey{p, off})
			case n > 1:
				repeated.add(srcKey{p, off})
			}
		}
	}
	var fails []string
	if missing.count() > 0 {
		fails = append(fails, fmt.Sprintf("replay: %d input offsets have no output:%s", missing.count(), missing.describe(in.gen)))
	}
	if repeated.count() > 0 {
		fails = append(fails, fmt.Sprintf("replay: %d input offsets have more than one output:%s", repeated.count(), repeated.describe(in.gen)))
	}
	return fails
}

// diff names the first differing field of two outputs, and their first
// differing bytes.
func diff(got, want output, c *goavro.Codec) string {
	switch {
	case got.dead != want.dead:
		kind := map[bool]string{false: "a features record", true: "a dead letter"}
		return fmt.Sprintf("%s (%s), want %s (%s)", kind[got.dead], got.reason, kind[want.dead], want.reason)
	case got.keyNull != want.keyNull || !bytes.Equal(got.key, want.key):
		return fmt.Sprintf("key %q, want %q", got.key, want.key)
	case got.reason != want.reason:
		return fmt.Sprintf("velocity.reason %q, want %q", got.reason, want.reason)
	case got.errText != want.errText:
		return fmt.Sprintf("velocity.error %q, want %q", got.errText, want.errText)
	case got.valueNull != want.valueNull:
		return fmt.Sprintf("value null=%v, want null=%v", got.valueNull, want.valueNull)
	}
	field := ""
	if !got.dead && c != nil {
		field = flatFieldDiff(c, got.value, want.value)
	} else if !got.dead {
		field = fieldDiff(got.value, want.value)
	}
	i := 0
	for i < len(got.value) && i < len(want.value) && got.value[i] == want.value[i] {
		i++
	}
	return fmt.Sprintf("%svalue bytes first differ at %d of %d/%d: %s, want %s", field, i, len(got.value), len(want.value),
		hex.EncodeToString(got.value[i:min(len(got.value), i+16)]), hex.EncodeToString(want.value[i:min(len(want.value), i+16)]))
}

// flatFieldDiff decodes two values of a definition's flat record and names every
// field that differs, in name order.
func flatFieldDiff(c *goavro.Codec, got, want []byte) string {
	g, _, err1 := c.NativeFromBinary(got)
	w, _, err2 := c.NativeFromBinary(want)
	if err1 != nil || err2 != nil {
		return ""
	}
	gm, wm := g.(map[string]any), w.(map[string]any)
	var out []string
	for _, f := range slices.Sorted(maps.Keys(wm)) {
		if fmt.Sprint(gm[f]) != fmt.Sprint(wm[f]) {
			out = append(out, fmt.Sprintf("%s = %v, want %v", f, gm[f], wm[f]))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "fields " + strings.Join(out, ", ") + "; "
}

// fieldDiff decodes two features values and names the first field, in schema
// order, that differs.
func fieldDiff(got, want []byte) string {
	g, _, err1 := featuresCodec.NativeFromBinary(got)
	w, _, err2 := featuresCodec.NativeFromBinary(want)
	if err1 != nil || err2 != nil {
		return ""
	}
	gm, wm := g.(map[string]any), w.(map[string]any)
	for _, f := range []string{"event_id", "entity_id", "event_time", "windows", "ms_since_previous", "late", "source_topic", "source_partition", "source_offset"} {
		if f == "windows" {
			gw, _ := gm[f].([]any)
			ww, _ := wm[f].([]any)
			for i := range min(len(gw), len(ww)) {
				ga, _ := gw[i].(map[string]any)
				wa, _ := ww[i].(map[string]any)
				for _, af := range []string{"window", "window_ms", "bucket_ms", "count", "sum_minor", "min_minor", "max_minor"} {
					if fmt.Sprint(ga[af]) != fmt.Sprint(wa[af]) {
						return fmt.Sprintf("field windows[%d] (%v).%s = %v, want %v; ", i, wa["window"], af, ga[af], wa[af])
					}
				}
			}
			if len(gw) != len(ww) {
				return fmt.Sprintf("%d windows, want %d; ", len(gw), len(ww))
			}
			continue
		}
		if fmt.Sprint(gm[f]) != fmt.Sprint(wm[f]) {
			return fmt.Sprintf("field %s = %v, want %v; ", f, gm[f], wm[f])
		}
	}
	return ""
}
