//go:build integration

package chaos

import (
	"strings"
	"testing"
)

// TestChaosChecksFire needs no broker: each invariant of check reports the
// outputs that break it, naming the partition and offsets, and says nothing
// about outputs that keep it.
func TestChaosChecksFire(t *testing.T) {
	feat := func(eventID string, count int64, src int64) output {
		native := map[string]any{
			"event_id": eventID, "entity_id": "card-1", "event_time": int64(1_795_000_000_000),
			"windows": []any{map[string]any{"window": "1m", "window_ms": int64(60_000), "bucket_ms": int64(1000),
				"count": count, "sum_minor": count * 10, "min_minor": int64(10), "max_minor": int64(10)}},
			"ms_since_previous": nil, "late": false,
			"source_topic": "in", "source_partition": int32(0), "source_offset": src,
		}
		b, err := featuresCodec.BinaryFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		return output{key: []byte("card-1"), value: b, srcTopic: "in", at: "out/0@x"}
	}
	dead := func(reason string) output {
		return output{dead: true, key: []byte("card-1"), value: []byte("not avro"), reason: reason, errText: "e", srcTopic: "in", at: "dlq/0@y"}
	}
	in := verdictInput{inputTopic: "in", ends: map[int32]int64{0: 3}, gen: map[srcKey]string{}}
	in.replay = map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2)}}
	good := map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2)}}
	if got := check(checkpoint{label: "cp", eos: true, outs: good}, in); len(got) != 0 {
		t.Fatalf("a clean checkpoint fails: %v", got)
	}
	if got := checkReplay(in); len(got) != 0 {
		t.Fatalf("a clean replay fails: %v", got)
	}

	cases := []struct {
		name string
		eos  bool
		outs map[srcKey][]output
		want []string
	}{
		{"missing", false, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}},
			[]string{"1 input offsets have no output", "partition 0: 1 offsets: 2"}},
		{"two committed", true, map[srcKey][]output{{0, 0}: {feat("a", 1, 0), feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2)}},
			[]string{"1 input offsets have more than one committed output", "partition 0: 1 offsets: 0"}},
		{"repeats differ", false, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2), feat("c", 3, 2)}},
			[]string{"outputs that differ from each other", "windows[0] (1m).count = 3, want 2", "differ from replay's"}},
		{"unlike replay", true, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("duplicate")}, {0, 2}: {feat("c", 2, 2)}},
			[]string{"differ from replay's", `velocity.reason "duplicate", want "late"`, "partition 0: 1 offsets: 1"}},
		{"beyond the input", false, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2)}, {0, 7}: {dead("late")}},
			[]string{"outputs name no input record", "names input 0/7"}},
		{"another topic", false, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2), func() output { o := feat("c", 2, 2); o.srcTopic = "other"; return o }()}},
			[]string{"outputs name no input record", `names source topic "other"`}},
	}
	for _, c := range cases {
		got := strings.Join(check(checkpoint{label: "cp", eos: c.eos, outs: c.outs}, in), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}
	in.replay = map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 2}: {feat("c", 2, 2), feat("c", 2, 2)}}
	if got := strings.Join(checkReplay(in), "\n"); !strings.Contains(got, "replay: 1 input offsets have no output") || !strings.Contains(got, "replay: 1 input offsets have more than one output") {
		t.Errorf("a broken replay is not reported:\n%s", got)
	}
}
