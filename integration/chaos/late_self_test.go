//go:build integration

package chaos

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// TestReplayOrder needs no broker: replay's release offsets, lateness and
// watermarks for a partition's accepted events, as the contract's reorder
// buffer makes them (lateness 1 s).
func TestReplayOrder(t *testing.T) {
	const t0 = int64(1_795_000_000_000)
	const none = int64(math.MaxInt64)
	for _, c := range []struct {
		name string
		ts   []int64 // event times, at offsets 0, 1, …
		late []bool
		wm   []int64
		rel  []int64
	}{
		{"in order", []int64{t0, t0 + 500, t0 + 1500, t0 + 4000},
			[]bool{false, false, false, false},
			[]int64{math.MinInt64, t0 - 1000, t0 - 500, t0 + 500},
			[]int64{2, 2, 3, none}},
		{"an equal time is released by offset, at once when at the watermark", []int64{t0 + 1000, t0, t0 + 1000, t0 + 2000},
			[]bool{false, false, false, false},
			[]int64{math.MinInt64, t0, t0, t0},
			[]int64{3, 1, 3, none}},
		{"a late one is counted at its own offset and moves nothing", []int64{t0, t0 + 500, t0 + 3000, t0 + 100, t0 + 2500, t0 + 5000},
			[]bool{false, false, false, true, false, false},
			[]int64{math.MinInt64, t0 - 1000, t0 - 500, t0 + 2000, t0 + 2000, t0 + 2000},
			[]int64{2, 2, 5, 3, 5, none}},
	} {
		evs := make([]orderEvent, len(c.ts))
		for i, tm := range c.ts {
			evs[i] = orderEvent{int64(i), tm}
		}
		late, wm, rel := replayOrder(evs)
		if !slices.Equal(late, c.late) || !slices.Equal(wm, c.wm) || !slices.Equal(rel, c.rel) {
			t.Errorf("%s:\nlate %v, want %v\nwm %v, want %v\nrel %v, want %v", c.name, late, c.late, wm, c.wm, rel, c.rel)
		}
	}
}

// TestLateRuleChecksFire needs no broker: checkLate passes a replay that
// follows the late rule under each policy and reports each way of breaking it.
func TestLateRuleChecksFire(t *testing.T) {
	const t0 = int64(1_795_000_000_000)
	// card-a on partition 0 (lateness 1 s, windows 10s:1s and 1m:10s): t0,
	// t0+20 s, t0+22 s (the watermark is t0+21 s, and t0+20 s is counted),
	// then t0+15 s (late, its bucket retained: counted under apply), t0+9 s
	// (late, its bucket has left the 10 s window of t0+20 s: dead), t0+21.5 s
	// (not late).
	times := []int64{t0, t0 + 20_000, t0 + 22_000, t0 + 15_000, t0 + 9_000, t0 + 21_500}
	gen, txs := map[srcKey]string{}, map[string]genTx{}
	for off, tm := range times {
		id := fmt.Sprintf("ev-%d", off)
		gen[srcKey{0, int64(off)}] = "valid " + id
		txs[id] = genTx{eventID: id, entity: "card-a", currency: "EUR", amount: 10, time: tm}
	}
	feat := func(off int, late bool) output {
		native := map[string]any{
			"event_id": fmt.Sprintf("ev-%d", off), "entity_id": "card-a", "event_time": times[off],
			"windows":           []any{},
			"ms_since_previous": nil, "late": late,
			"source_topic": "in", "source_partition": int32(0), "source_offset": int64(off),
		}
		b, err := featuresCodec.BinaryFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		return output{key: []byte("card-a"), value: b, srcTopic: "in"}
	}
	dead := output{dead: true, key: []byte("card-a"), reason: "late", srcTopic: "in"}
	specs, err := window.ParseSpecs("10s:1s,1m:10s")
	if err != nil {
		t.Fatal(err)
	}
	ends := map[int32]int64{0: int64(len(times)), 1: 0, 2: 0, 3: 0}
	replayOf := func(outs ...output) map[srcKey][]output {
		r := map[srcKey][]output{}
		for off, o := range outs {
			r[srcKey{0, int64(off)}] = []output{o}
		}
		return r
	}
	apply := []output{feat(0, false), feat(1, false), feat(2, false), feat(3, true), dead, feat(5, false)}
	dlq := []output{feat(0, false), feat(1, false), feat(2, false), dead, dead, feat(5, false)}
	with := func(outs []output, off int, o output) []output {
		outs = slices.Clone(outs)
		outs[off] = o
		return outs
	}
	for _, c := range []struct {
		name, policy string
		outs         []output
		want         string // "": passes
		counted      int
	}{
		{"apply, by the rule", "apply", apply, "", 1},
		{"dlq, by the rule", "dlq", dlq, "", 0},
		{"apply: a late one counted without late=true", "apply", with(apply, 3, feat(3, false)), "input 0/3 (\"valid ev-3\"): features record with late=false, but its event time", 0},
		{"apply: a retained one dead-lettered", "apply", with(apply, 3, dead), "want it counted: its bucket is retained", 0},
		{"apply: one whose bucket left a window counted", "apply", with(apply, 4, feat(4, true)), "want a late dead letter: its bucket has left window 10s", 0},
		{"dlq: a late one counted", "dlq", with(dlq, 3, feat(3, true)), "want a late dead letter: --late=dlq", 0},
		{"one that is not late dead-lettered late", "apply", with(apply, 5, dead), "input 0/5 (\"valid ev-5\"): dead-lettered late, but its event time", 0},
		{"one that is not late with late=true", "dlq", with(dlq, 5, feat(5, true)), "features record with late=true, but its event time", 0},
	} {
		replay := replayOf(c.outs...)
		m, err := newAPIModel(ends, replay, gen, txs, specs, nil, c.policy)
		if err != nil {
			t.Fatal(err)
		}
		fails, st := m.checkLate(replay, gen, txs, nil)
		got := strings.Join(fails, "\n")
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: report %q, want %q", c.name, got, c.want)
		}
		if c.want == "" && st.counted != c.counted {
			t.Errorf("%s: %+v, want %d counted", c.name, st, c.counted)
		}
	}
}

// TestIdleExcusesUnderLateApply needs no broker: a late event counted at once
// after an idle release let the events pending at its arrival go first is
// excused with them (any field), and the event after them in replay's release
// order in ms_since_previous; an event counted before the late one in both runs
// is not excused, and a late event is never what makes another out of order.
func TestIdleExcusesUnderLateApply(t *testing.T) {
	const t0 = int64(1_795_000_000_000)
	// card-a on partition 0, lateness 1 s: t0 (0), t0+5 s (1), t0+4.5 s (2,
	// pending until 4), the late A t0+2 s (3: counted at once in replay, before
	// 2 and 1), t0+7 s (4: releases 2 and 1), t0+9 s (5), then the late t0+1 s
	// (6), counted at once in every run. Replay's release order: 0, 3, 2, 1, 4,
	// 6, 5. Live: an idle release after offset 2 released 2 and 1 before 3.
	times := []int64{t0, t0 + 5000, t0 + 4500, t0 + 2000, t0 + 7000, t0 + 9000, t0 + 1000}
	replayAt := map[int64]int64{0: 0, 3: 1, 2: 2, 1: 3, 4: 4, 6: 5, 5: 6}
	liveAt := map[int64]int64{0: 0, 2: 1, 1: 2, 3: 3, 4: 4, 6: 5, 5: 6}
	gen, txs := map[srcKey]string{}, map[string]genTx{}
	feat := func(off, count int64, prev int64, late bool, at int64) output {
		native := map[string]any{
			"event_id": fmt.Sprintf("ev-%d", off), "entity_id": "card-a", "event_time": times[off],
			"windows": []any{map[string]any{"window": "1m", "window_ms": int64(60_000), "bucket_ms": int64(1000),
				"count": count, "sum_minor": count * 10, "min_minor": int64(10), "max_minor": int64(10)}},
			"ms_since_previous": map[string]any{"long": prev}, "late": late,
			"source_topic": "in", "source_partition": int32(0), "source_offset": off,
		}
		b, err := featuresCodec.BinaryFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		return output{key: []byte("card-a"), value: b, srcTopic: "in", at: fmt.Sprintf("out/0@%d", at), outOffset: at}
	}
	pidAt := func(o output, pid, at int64) output {
		o.pid, o.outOffset, o.at = pid, at, fmt.Sprintf("out/0@%d", at)
		return o
	}
	replay := map[srcKey][]output{}
	for off := range int64(len(times)) {
		id := fmt.Sprintf("ev-%d", off)
		gen[srcKey{0, off}] = "valid " + id
		txs[id] = genTx{eventID: id, entity: "card-a", time: times[off], amount: 10}
		replay[srcKey{0, off}] = []output{feat(off, off+1, 1, off == 3 || off == 6, replayAt[off])}
	}
	ends := map[int32]int64{0: int64(len(times)), 1: 0, 2: 0, 3: 0}
	live := func(idle bool, change map[int64]output) map[srcKey][]output {
		m := map[srcKey][]output{}
		for k, v := range replay {
			o := v[0]
			if idle {
				o.outOffset, o.at = liveAt[k.offset], fmt.Sprintf("out/0@%d", liveAt[k.offset])
			}
			m[k] = []output{o}
		}
		for off, o := range change {
			m[srcKey{0, off}] = []output{o}
		}
		return m
	}
	for _, c := range []struct {
		name   string
		idle   bool
		change map[int64]output
		more   map[int64][]output // outputs of later runs (another producer id)
		ooo    []int64
		want   string // "": passes
	}{
		{"no idle release: nothing out of order", false, nil, nil, nil, ""},
		{"no idle release: the late one differs", false, map[int64]output{3: feat(3, 9, 1, true, 1)}, nil, nil, "partition 0: 1 offsets: 3"},
		{"the late one and the two released before it differ", true, map[int64]output{
			3: feat(3, 9, -2500, true, 3), 2: feat(2, 2, 4500, false, 1), 1: feat(1, 3, 500, false, 2)}, nil, []int64{3}, ""},
		{"the next in release order differs in ms_since_previous", true, map[int64]output{
			3: feat(3, 9, -2500, true, 3), 4: feat(4, 5, 9000, false, 4)}, nil, []int64{3}, ""},
		{"the next in release order differs in its count", true, map[int64]output{
			3: feat(3, 9, -2500, true, 3), 4: feat(4, 9, 9000, false, 4)}, nil, []int64{3}, "partition 0: 1 offsets: 4"},
		{"the one after the next differs", true, map[int64]output{
			3: feat(3, 9, -2500, true, 3), 6: feat(6, 7, -1000, true, 5)}, nil, []int64{3}, "partition 0: 1 offsets: 6"},
		{"one counted before the late one in both runs differs", true, map[int64]output{
			3: feat(3, 9, -2500, true, 3), 0: feat(0, 9, 1, false, 0)}, nil, []int64{3}, "partition 0: 1 offsets: 0"},
		{"the late one dead-lettered where replay counted it: its entity's next minute and a bucket", true, map[int64]output{
			3: {dead: true, key: []byte("card-a"), value: []byte("x"), reason: "late", errText: "e", srcTopic: "in", at: "dlq/0@1"},
			6: feat(6, 9, 1, true, 5), 4: feat(4, 9, 1, false, 4), 5: feat(5, 9, 1, false, 6)}, nil, []int64{3}, ""},
		{"a crash's repeat in another run, in replay's order: nothing out of order", false, nil, map[int64][]output{
			3: {pidAt(replay[srcKey{0, 3}][0], 2, 101)}, 2: {pidAt(replay[srcKey{0, 2}][0], 2, 102)}, 1: {pidAt(replay[srcKey{0, 1}][0], 2, 103)}},
			nil, ""},
		{"a run that restored 2 and 1 counted by an idle release writes the late one after them", false, map[int64]output{
			0: pidAt(replay[srcKey{0, 0}][0], 1, 0), 2: pidAt(feat(2, 2, 4500, false, 0), 1, 1), 1: pidAt(feat(1, 3, 500, false, 0), 1, 2),
			3: pidAt(feat(3, 9, -2500, true, 0), 2, 101)}, nil, []int64{3}, ""},
	} {
		outs := live(c.idle, c.change)
		for k, os := range c.more {
			outs[srcKey{0, k}] = append(outs[srcKey{0, k}], os...)
		}
		ex, ooo := idleExcuses(ends, replay, []map[srcKey][]output{outs}, gen, txs, 61_000)
		var gotOOO []int64
		for k := range ooo {
			gotOOO = append(gotOOO, k.offset)
		}
		slices.Sort(gotOOO)
		if !slices.Equal(gotOOO, c.ooo) {
			t.Errorf("%s: out of order %v, want %v", c.name, gotOOO, c.ooo)
		}
		// Repeats are the default mode's.
		got := strings.Join(check(checkpoint{label: "cp", eos: c.more == nil, outs: outs}, verdictInput{inputTopic: "in", ends: ends, replay: replay, gen: gen, excused: ex}), "\n")
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: report %q, want %q", c.name, got, c.want)
		}
	}
}
