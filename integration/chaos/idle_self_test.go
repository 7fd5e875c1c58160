//go:build integration

package chaos

import (
	"fmt"
	"strings"
	"testing"
)

// TestIdleExcusesAreBounded needs no broker: an event whose features record
// comes after one of an event of its entity that it precedes in (event time,
// offset) order (the idle rule released that one early), or that is a late
// dead letter where replay counted it, excuses, on its partition and for its
// entity only, its own output and those of the events within the lateness
// after it (any field but the key), and the next event's ms_since_previous
// (that field only); every other difference from replay is still reported,
// and so is any difference without such an order in the output.
func TestIdleExcusesAreBounded(t *testing.T) {
	const t0 = int64(1_795_000_000_000)
	// rank is each offset's place in the release order without an idle
	// release: (event time, offset).
	rank := map[int64]int64{0: 0, 3: 1, 7: 2, 1: 3, 2: 4, 4: 5, 5: 6, 6: 7}
	feat := func(off int64, entity string, tm, count int64, msPrev any, late bool) output {
		native := map[string]any{
			"event_id": fmt.Sprintf("ev-%d", off), "entity_id": entity, "event_time": tm,
			"windows": []any{map[string]any{"window": "1m", "window_ms": int64(60_000), "bucket_ms": int64(1000),
				"count": count, "sum_minor": count * 10, "min_minor": int64(10), "max_minor": int64(10)}},
			"ms_since_previous": msPrev, "late": late,
			"source_topic": "in", "source_partition": int32(0), "source_offset": off,
		}
		b, err := featuresCodec.BinaryFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		return output{key: []byte(entity), value: b, srcTopic: "in", at: fmt.Sprintf("out/0@%d", rank[off]), outOffset: rank[off]}
	}
	// at moves an output to another place in the output partition.
	at := func(o output, outOff int64) output {
		o.outOffset, o.at = outOff, fmt.Sprintf("out/0@%d", outOff)
		return o
	}
	prev := func(ms int64) any { return map[string]any{"long": ms} }
	// Partition 0, in offset order: card-a at t0, t0+900, t0+1200 (offset 2),
	// then in-lateness t0+500 (offset 3, the one idle made late), then t0+1400,
	// t0+3000, t0+5000; card-b at t0+600 (offset 7) beside them.
	evs := []struct {
		entity string
		t      int64
	}{{"card-a", t0}, {"card-a", t0 + 900}, {"card-a", t0 + 1200}, {"card-a", t0 + 500}, {"card-a", t0 + 1400}, {"card-a", t0 + 3000}, {"card-a", t0 + 5000}, {"card-b", t0 + 600}}
	gen, txs := map[srcKey]string{}, map[string]genTx{}
	replay := map[srcKey][]output{}
	for off, e := range evs {
		k := srcKey{0, int64(off)}
		id := fmt.Sprintf("ev-%d", off)
		gen[k] = "valid " + id
		txs[id] = genTx{eventID: id, entity: e.entity, time: e.t, amount: 10}
		replay[k] = []output{feat(int64(off), e.entity, e.t, int64(off+1), prev(1), false)}
	}
	ends := map[int32]int64{0: int64(len(evs)), 1: 0, 2: 0, 3: 0}
	live := func(change map[int64]output) map[srcKey][]output {
		m := map[srcKey][]output{}
		for k, v := range replay {
			m[k] = v
		}
		for off, o := range change {
			m[srcKey{0, off}] = []output{o}
		}
		return m
	}
	// The idle release: offsets 1 and 2 (t0+900, t0+1200) released before
	// offset 3 (t0+500) arrived, 3 counted out of order after them.
	idle := func(more map[int64]output) map[int64]output {
		m := map[int64]output{
			1: at(feat(1, "card-a", t0+900, 7, prev(5), false), 1), 2: at(feat(2, "card-a", t0+1200, 8, prev(5), false), 2),
			3: at(feat(3, "card-a", t0+500, 9, prev(-700), false), 3), 7: at(replay[srcKey{0, 7}][0], 4),
		}
		for k, v := range more {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name   string
		change map[int64]output
		want   []string // empty: passes
	}{
		{"no idle release, equal", nil, nil},
		{"the out-of-order one and those within the lateness after it differ", idle(map[int64]output{4: feat(4, "card-a", t0+1400, 9, prev(5), false)}), nil},
		{"the next one's ms_since_previous differs", idle(map[int64]output{5: feat(5, "card-a", t0+3000, 6, prev(77), false)}), nil},
		{"the next one's count differs", idle(map[int64]output{5: feat(5, "card-a", t0+3000, 7, prev(77), false)}),
			[]string{"differ from replay's", "partition 0: 1 offsets: 5"}},
		{"the one after the next differs", idle(map[int64]output{6: feat(6, "card-a", t0+5000, 1, prev(1), false)}),
			[]string{"partition 0: 1 offsets: 6"}},
		{"an event before the out-of-order one differs", idle(map[int64]output{0: feat(0, "card-a", t0, 2, prev(1), false)}),
			[]string{"partition 0: 1 offsets: 0"}},
		{"another entity differs", idle(map[int64]output{7: at(feat(7, "card-b", t0+600, 3, prev(1), false), 4)}),
			[]string{"partition 0: 1 offsets: 7"}},
		{"in release order nothing is excused", map[int64]output{3: feat(3, "card-a", t0+500, 9, prev(-700), false), 4: feat(4, "card-a", t0+1400, 9, prev(5), false)},
			[]string{"partition 0: 2 offsets: 3-4"}},
		{"the out-of-order one as a late dead letter", map[int64]output{
			3: {dead: true, key: []byte("card-a"), value: []byte("x"), reason: "late", errText: "e", srcTopic: "in", at: "dlq/0@1"},
			4: feat(4, "card-a", t0+1400, 9, prev(5), false)}, nil},
		{"a dead letter of another reason is not excused", idle(map[int64]output{
			4: {dead: true, key: []byte("card-a"), value: []byte("x"), reason: "duplicate", errText: "e", srcTopic: "in", at: "dlq/0@1"}}),
			[]string{"partition 0: 1 offsets: 4"}},
	}
	for _, c := range cases {
		outs := live(c.change)
		ex, _ := idleExcuses(ends, replay, []map[srcKey][]output{outs}, gen, txs, 300_000)
		in := verdictInput{inputTopic: "in", ends: ends, replay: replay, gen: gen, excused: ex}
		got := strings.Join(check(checkpoint{label: "cp", eos: true, outs: outs}, in), "\n")
		if len(c.want) == 0 && got != "" {
			t.Errorf("%s: fails:\n%s", c.name, got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}
	// A crash's repeat in the default mode may differ the same way, and no
	// further: the first run released in order, the repeat (from offset 1 on,
	// at output offsets 101...) after an idle release of 1 and 2.
	outs := live(nil)
	outs[srcKey{0, 1}] = []output{replay[srcKey{0, 1}][0], at(feat(1, "card-a", t0+900, 7, prev(5), false), 101)}
	outs[srcKey{0, 2}] = []output{replay[srcKey{0, 2}][0], at(feat(2, "card-a", t0+1200, 8, prev(5), false), 102)}
	outs[srcKey{0, 3}] = []output{replay[srcKey{0, 3}][0], at(feat(3, "card-a", t0+500, 9, prev(-700), false), 103)}
	outs[srcKey{0, 6}] = []output{replay[srcKey{0, 6}][0], at(feat(6, "card-a", t0+5000, 1, prev(1), false), 107)}
	ex, ooo := idleExcuses(ends, replay, []map[srcKey][]output{outs}, gen, txs, 300_000)
	if len(ooo) != 1 || !ooo[srcKey{0, 3}] {
		t.Errorf("out of order: %v, want offset 3 only", ooo)
	}
	got := strings.Join(check(checkpoint{label: "cp", outs: outs}, verdictInput{inputTopic: "in", ends: ends, replay: replay, gen: gen, excused: ex}), "\n")
	if !strings.Contains(got, "outputs that differ from each other") || !strings.Contains(got, "partition 0: 1 offsets: 6") || strings.Contains(got, "offsets: 3") {
		t.Errorf("repeats: want only offset 6 reported:\n%s", got)
	}
}

// TestGroupIdleExcusesAreBounded needs no broker: a re-keyed group's event
// counted out of order (late=true) excuses its own row, the rows of its key's
// events after it in (event time, source partition, source offset) order that
// the output partition shows released before it (any distance ahead), and the
// ms_since_previous of the key's row right after it; nothing of another key,
// nothing released after it, nothing before it.
func TestGroupIdleExcusesAreBounded(t *testing.T) {
	const t0 = int64(1_795_000_000_000)
	type ev struct {
		k      srcKey
		key    string
		t      int64
		outOff int64 // where the live run released it
	}
	// Key EUR: 0/0 (t0), 1/0 (t0+5000, released early), 0/1 (t0+2000, the late
	// one, counted after 1/0), 1/1 (t0+9000, right after it), 0/2 (t0+20000);
	// key USD: 1/2 (t0+3000) beside them.
	evs := []ev{{srcKey{0, 0}, "EUR", t0, 0}, {srcKey{1, 0}, "EUR", t0 + 5000, 1}, {srcKey{0, 1}, "EUR", t0 + 2000, 2},
		{srcKey{1, 1}, "EUR", t0 + 9000, 3}, {srcKey{0, 2}, "EUR", t0 + 20000, 4}, {srcKey{1, 2}, "USD", t0 + 3000, 5}}
	gen, txs := map[srcKey]string{}, map[string]genTx{}
	row := func(e ev, count int64, prev int64, late bool, outOff int64) output {
		native := map[string]any{
			"event_id": "x", "entity_id": e.key, "event_time": e.t,
			"windows": []any{map[string]any{"window": "1m", "window_ms": int64(60_000), "bucket_ms": int64(1000),
				"count": count, "sum_minor": count, "min_minor": int64(1), "max_minor": int64(1)}},
			"ms_since_previous": map[string]any{"long": prev}, "late": late,
			"source_topic": "in", "source_partition": e.k.part, "source_offset": e.k.offset,
		}
		b, err := featuresCodec.BinaryFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		return output{key: []byte(e.key), value: b, srcTopic: "in", at: fmt.Sprintf("g/0@%d", outOff), outOffset: outOff}
	}
	replay := map[srcKey][]output{}
	for i, e := range evs {
		id := fmt.Sprintf("ev-%d", i)
		gen[e.k] = "valid " + id
		txs[id] = genTx{eventID: id, time: e.t}
		replay[e.k] = []output{row(e, int64(i+1), 1, false, int64(i))}
	}
	ends := map[int32]int64{0: 3, 1: 3}
	live := func(change map[int]output) map[srcKey][]output {
		m := map[srcKey][]output{}
		for i, e := range evs {
			o := replay[e.k][0]
			o.outOffset = e.outOff
			if c, ok := change[i]; ok {
				o = c
			}
			m[e.k] = []output{o}
		}
		return m
	}
	late := row(evs[2], 9, -3000, true, 2)
	for _, c := range []struct {
		name   string
		change map[int]output
		want   string // "": passes
	}{
		{"the late one, the one released before it and the next's ms_since_previous", map[int]output{
			2: late, 1: row(evs[1], 7, 5000, false, 1), 3: row(evs[3], 4, 77, false, 3)}, ""},
		{"the next one's count", map[int]output{2: late, 3: row(evs[3], 9, 77, false, 3)}, "offsets: 1"},
		{"the one after the next", map[int]output{2: late, 4: row(evs[4], 9, 1, false, 4)}, "offsets: 2"},
		{"the one before it", map[int]output{2: late, 0: row(evs[0], 9, 1, false, 0)}, "partition 0: 1 offsets: 0"},
		{"another key", map[int]output{2: late, 5: row(evs[5], 9, 1, false, 5)}, "partition 1: 1 offsets: 2"},
		{"no late one", map[int]output{1: row(evs[1], 7, 5000, false, 1)}, "partition 1: 1 offsets: 0"},
	} {
		outs := live(c.change)
		ex, _, dead := groupIdleExcuses(replay, []map[srcKey][]output{outs}, gen, txs, featuresCodec)
		if dead != 0 {
			t.Fatalf("%s: %d dead at idle", c.name, dead)
		}
		in := verdictInput{inputTopic: "in", ends: ends, replay: replay, gen: gen, excused: ex, only: map[srcKey]bool{}}
		for k := range replay {
			in.only[k] = true
		}
		got := strings.Join(check(checkpoint{label: "cp", eos: true, outs: outs}, in), "\n")
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: report %q, want %q", c.name, got, c.want)
		}
	}
	_, _, dead := groupIdleExcuses(replay, []map[srcKey][]output{live(map[int]output{2: {dead: true, reason: "late_after_idle", key: []byte("EUR")}})}, gen, txs, featuresCodec)
	if dead != 1 {
		t.Errorf("a late_after_idle dead letter: counted %d, want 1", dead)
	}
}
