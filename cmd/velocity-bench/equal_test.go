package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

func testSpecs(t *testing.T) []window.Spec {
	t.Helper()
	// 4 buckets of 1 s and 2 buckets of 10 s: small enough to expire by hand.
	specs, err := window.ParseSpecs("4s:1s,20s:10s")
	if err != nil {
		t.Fatal(err)
	}
	return specs
}

func feat(late bool, prev int64, hasPrev bool, aggs ...int64) outRec {
	f := codec.Features{EventID: "e", EntityID: "a", EventTime: 1, MsSincePrevious: prev, HasPrevious: hasPrev,
		Late: late, SourceTopic: "in", SourcePartition: 0, SourceOffset: 7}
	names := []string{"4s", "20s"}
	for i := 0; i+3 < len(aggs); i += 4 {
		f.Windows = append(f.Windows, codec.WindowAgg{Name: names[i/4], WindowMs: 1, BucketMs: 1,
			Count: aggs[i], SumMinor: aggs[i+1], MinMinor: aggs[i+2], MaxMinor: aggs[i+3]})
	}
	return outRec{F: f}
}

func TestDiffFields(t *testing.T) {
	base := feat(false, 5, true, 1, 10, 10, 10, 2, 30, 10, 20)
	cases := []struct {
		name string
		a, b outRec
		want []string
	}{
		{"identical", base, feat(false, 5, true, 1, 10, 10, 10, 2, 30, 10, 20), nil},
		{"late", base, feat(true, 5, true, 1, 10, 10, 10, 2, 30, 10, 20), []string{"late"}},
		{"count and sum of one window", base, feat(false, 5, true, 1, 10, 10, 10, 3, 31, 10, 20),
			[]string{"windows[20s].count", "windows[20s].sum"}},
		{"min and max", base, feat(false, 5, true, 1, 10, 9, 11, 2, 30, 10, 20),
			[]string{"windows[4s].min", "windows[4s].max"}},
		{"gap value", base, feat(false, -3, true, 1, 10, 10, 10, 2, 30, 10, 20), []string{"ms_since_previous"}},
		{"gap null vs 0", feat(false, 0, false, 1, 1, 1, 1), feat(false, 0, true, 1, 1, 1, 1), []string{"ms_since_previous"}},
		{"null gaps with stale values are equal", feat(false, 4, false, 1, 1, 1, 1), feat(false, 9, false, 1, 1, 1, 1), nil},
		{"window count", base, feat(false, 5, true, 1, 10, 10, 10), []string{"windows.shape"}},
		{"dead vs features", outRec{Dead: true, Reason: "late"}, base, []string{"dead"}},
		{"dead reasons", outRec{Dead: true, Reason: "late"}, outRec{Dead: true, Reason: "duplicate"}, []string{"dead"}},
		{"same dead letters", outRec{Dead: true, Reason: "late"}, outRec{Dead: true, Reason: "late"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := diffFields(c.a, c.b); !slices.Equal(got, c.want) {
				t.Errorf("diffFields = %v, want %v", got, c.want)
			}
		})
	}
}

// ev builds one input of partition 0 at offset o.
func ev(o int64, entity string, tm, amount int64) inEvent {
	return inEvent{Key: srcKey{0, o}, ID: "id" + string(rune('a'+o)), Entity: entity, T: tm, Amount: amount}
}

func TestModelPartition(t *testing.T) {
	specs := testSpecs(t)
	type want struct {
		dead          bool
		late          bool
		gap           int64
		hasPrev       bool
		c4, s4, c20   int64
		behindEntity  bool
		behindPart    bool
		expired       bool
		literalDiffer bool
	}
	cases := []struct {
		name string
		fl   flavor
		evs  []inEvent
		last want // the model's answer for the last event
	}{
		{"first event of an entity", flavorOurs, []inEvent{ev(0, "a", 1000, 5)},
			want{c4: 1, s4: 5, c20: 1}},
		{"in order: 4s window drops buckets older than k-3", flavorOurs,
			[]inEvent{ev(0, "a", 1000, 5), ev(1, "a", 4999, 7), ev(2, "a", 5000, 11)},
			want{gap: 1, hasPrev: true, c4: 2, s4: 18, c20: 3}},
		{"behind the partition, not its entity: ours late", flavorOurs,
			[]inEvent{ev(0, "a", 1000, 5), ev(1, "b", 3000, 7), ev(2, "a", 2000, 11)},
			want{late: true, gap: 1000, hasPrev: true, c4: 2, s4: 16, c20: 2, behindPart: true}},
		{"the same for Streams: not late", flavorPeer,
			[]inEvent{ev(0, "a", 1000, 5), ev(1, "b", 3000, 7), ev(2, "a", 2000, 11)},
			want{gap: 1000, hasPrev: true, c4: 2, s4: 16, c20: 2, behindPart: true}},
		{"behind its entity: reads whole buckets up to its own, negative gap", flavorPeer,
			// 1500 and 1900 are in its bucket 1 (1900 comes later in event time: read
			// anyway), 3100 is in bucket 3, above it: not read. 20s: all in bucket 0.
			[]inEvent{ev(0, "a", 1500, 5), ev(1, "a", 1900, 7), ev(2, "a", 3100, 11), ev(3, "a", 1200, 13)},
			want{late: true, gap: -1900, hasPrev: true, c4: 3, s4: 25, c20: 4, behindEntity: true, behindPart: true, literalDiffer: true}},
		{"a bucket that left a window: ours dead-letters", flavorOurs,
			[]inEvent{ev(0, "a", 1000, 5), ev(1, "a", 6000, 7), ev(2, "a", 2000, 11)},
			want{dead: true, behindEntity: true, behindPart: true, expired: true}},
		{"…Streams counts it where retained, 0/0/0/0 elsewhere", flavorPeer,
			[]inEvent{ev(0, "a", 1000, 5), ev(1, "a", 6000, 7), ev(2, "a", 2000, 11)},
			// 20s literally: only 1000 comes before it in event time, 6000 does not.
			want{late: true, gap: -4000, hasPrev: true, c4: 0, s4: 0, c20: 3, behindEntity: true, behindPart: true, expired: true, literalDiffer: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := modelPartition(c.fl, specs, "in", c.evs)[c.evs[len(c.evs)-1].Key]
			g := want{dead: got.Dead, late: got.F.Late, gap: got.F.MsSincePrevious, hasPrev: got.F.HasPrevious,
				behindEntity: got.BehindEntity, behindPart: got.BehindPartition, expired: got.Expired, literalDiffer: got.LiteralDiffers}
			if !got.Dead {
				if len(got.F.Windows) != 2 {
					t.Fatalf("%d windows, want 2", len(got.F.Windows))
				}
				g.c4, g.s4, g.c20 = got.F.Windows[0].Count, got.F.Windows[0].SumMinor, got.F.Windows[1].Count
			}
			if g != c.last {
				t.Errorf("model = %+v\n want  %+v", g, c.last)
			}
		})
	}
}

func TestCompareOutputsClassifies(t *testing.T) {
	specs := testSpecs(t)
	// b at 3000 makes a's 2000 behind the partition only; a's 1200 is behind a itself.
	inputs := []inEvent{ev(0, "a", 1000, 5), ev(1, "b", 3000, 7), ev(2, "a", 2000, 11), ev(3, "a", 1200, 13), ev(4, "b", 3500, 1)}
	fromModel := func(fl flavor) map[srcKey]outRec {
		m := map[srcKey]outRec{}
		for k, v := range model(fl, specs, "in", inputs) {
			m[k] = v.outRec
		}
		return m
	}
	cases := []struct {
		name          string
		mutate        func(ours, peer map[srcKey]outRec)
		identical     int
		differing     int
		byCause       map[string]int
		byField       map[string]int
		wantUnexplain bool
	}{
		{"both faithful: only the late flag of offset 2 differs", func(_, _ map[srcKey]outRec) {},
			4, 1, map[string]int{causeLateFlag: 1}, map[string]int{"late": 1}, false},
		{"ours miscounts a window", func(ours, _ map[srcKey]outRec) {
			r := ours[srcKey{0, 4}]
			r.F.Windows = slices.Clone(r.F.Windows)
			r.F.Windows[1].Count++
			ours[srcKey{0, 4}] = r
		}, 3, 2, map[string]int{causeLateFlag: 1, causeOursOff: 1}, map[string]int{"late": 1, "windows[20s].count": 1}, true},
		{"Streams gets a gap wrong", func(_, peer map[srcKey]outRec) {
			r := peer[srcKey{0, 3}]
			r.F.MsSincePrevious++
			peer[srcKey{0, 3}] = r
		}, 3, 2, map[string]int{causeLateFlag: 1, causePeerOff: 1}, map[string]int{"late": 1, "ms_since_previous": 1}, true},
		{"an input ours never answered", func(ours, _ map[srcKey]outRec) { delete(ours, srcKey{0, 0}) },
			3, 2, map[string]int{causeLateFlag: 1, causeMissing: 1}, map[string]int{"late": 1, "missing": 1}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ours, peer := fromModel(flavorOurs), fromModel(flavorPeer)
			c.mutate(ours, peer)
			rep := compareOutputs(specs, "in", inputs, ours, peer, 10)
			if rep.Identical != c.identical || rep.Differing != c.differing {
				t.Errorf("identical %d differing %d, want %d %d\n%s", rep.Identical, rep.Differing, c.identical, c.differing, rep.text())
			}
			if !mapsEqual(rep.ByCause, c.byCause) {
				t.Errorf("by cause %v, want %v", rep.ByCause, c.byCause)
			}
			if !mapsEqual(rep.ByField, c.byField) {
				t.Errorf("by field %v, want %v", rep.ByField, c.byField)
			}
			if got := len(rep.UnexplainedSample) > 0; got != c.wantUnexplain {
				t.Errorf("unexplained examples %v, want some: %v", rep.UnexplainedSample, c.wantUnexplain)
			}
			if rep.BehindPartition != 2 || rep.BehindEntity != 1 {
				t.Errorf("behind partition %d entity %d, want 2 and 1", rep.BehindPartition, rep.BehindEntity)
			}
			if c.differing > 0 && (len(rep.Examples) == 0 || !strings.Contains(rep.Examples[0], "p0@")) {
				t.Errorf("examples %v do not name the input", rep.Examples)
			}
		})
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
