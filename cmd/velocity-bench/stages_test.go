package main

import (
	"testing"

	"github.com/google/pprof/profile"
)

// stack builds sample locations from function names, leaf first; a name list
// in one element is one location with inlined calls (innermost first).
func stack(frames ...[]string) []*profile.Location {
	var locs []*profile.Location
	for _, f := range frames {
		l := &profile.Location{}
		for _, name := range f {
			l.Line = append(l.Line, profile.Line{Function: &profile.Function{Name: name}})
		}
		locs = append(locs, l)
	}
	return locs
}

func fr(names ...string) []string { return names }

func TestStageOf(t *testing.T) {
	const vc = "github.com/velocity-consumer/velocity-consumer"
	for _, tc := range []struct {
		name  string
		locs  []*profile.Location
		stage string
	}{
		{"an allocation counts where it is made", stack(fr("runtime.mallocgc"), fr("runtime.slicebytetostring"),
			fr(vc+"/pkg/codec.decodeTransaction"), fr(vc+"/pkg/pipeline.(*Processor).Process")), "decode"},
		{"a GC assist is GC, not its caller", stack(fr("runtime.scanobject"), fr("runtime.gcAssistAlloc"), fr("runtime.mallocgc"),
			fr(vc+"/pkg/codec.decodeTransaction")), "GC"},
		{"encode before decode: both are in pkg/codec", stack(fr(vc+"/pkg/codec.appendLong", vc+"/pkg/codec.AppendFeatures"),
			fr(vc+"/pkg/pipeline.(*Processor).emitReleased")), "encode"},
		{"the encoder's inlined writers are encode", stack(fr(vc+"/pkg/codec.putLong", vc+"/pkg/codec.(*FeaturesEncoder).Append"),
			fr(vc+"/pkg/pipeline.(*Processor).apply")), "encode"},
		{"dedupe inside the watermark stage", stack(fr(vc+"/pkg/watermark.(*idShard).grow"), fr(vc+"/pkg/watermark.(*Stage).Offer")), "dedupe"},
		{"the rest of the watermark stage is the reorder buffer", stack(fr(vc+"/pkg/watermark.(*Stage).enqueue"), fr(vc+"/pkg/watermark.(*Stage).Offer")), "reorder"},
		{"a snapshot of the window table is the checkpoint's", stack(fr(vc+"/pkg/window.(*PendingSnapshot).take"), fr(vc+"/pkg/service.(*worker).advanceSweep")), "checkpoint"},
		{"the window update", stack(fr(vc+"/pkg/window.(*Table).applyRings"), fr(vc+"/pkg/window.(*Table).Apply")), "window update"},
		{"a distinct set is the feature state's, not the window table's", stack(fr(vc+"/pkg/feature.(*distinctSet).add"),
			fr(vc+"/pkg/feature.(*State).Apply"), fr(vc+"/pkg/window.(*Table).Apply")), "feature state (pkg/feature: filters, distinct sets)"},
		{"a window table under the feature state is the window update", stack(fr(vc+"/pkg/window.(*Table).applyRings"),
			fr(vc+"/pkg/feature.(*State).Apply")), "window update"},
		{"a hop record's decode", stack(fr("runtime.mallocgc"), fr(vc+"/pkg/repartition.DecodeHop"),
			fr(vc+"/pkg/service.(*worker).process")), "hop records and second-stage merge (pkg/repartition)"},
		{"the mapped decoder", stack(fr(vc+"/pkg/definition.(*Decoder).Decode"), fr(vc+"/pkg/pipeline.(*Processor).Process")),
			"definition decode (pkg/definition)"},
		{"compression inside the client's request encoding", stack(fr("github.com/pierrec/lz4/v4/internal/lz4block.(*Compressor).CompressBlock"),
			fr("github.com/twmb/franz-go/pkg/kgo.seqRecBatch.appendTo")), "produce: compression"},
		{"our own LZ4 compressor is compression, not our sink", stack(fr(vc+"/pkg/sink.compressLZ4Block"), fr(vc+"/pkg/sink.appendLZ4Frame"),
			fr(vc+"/pkg/sink.(*lz4Frames).Compress"), fr(vc+"/pkg/sink.(*batchCompressor).Compress"),
			fr("github.com/twmb/franz-go/pkg/kgo.seqRecBatch.appendTo")), "produce: compression"},
		{"a literal run's copy in our LZ4 compressor", stack(fr("runtime.memmove"), fr(vc+"/pkg/sink.appendLZ4Sequence"),
			fr(vc+"/pkg/sink.compressLZ4Block")), "produce: compression"},
		{"the client's buffering called from our sink", stack(fr("github.com/twmb/franz-go/pkg/kgo.(*recBuf).bufferRecord"),
			fr(vc+"/pkg/sink.(*Tracker).produce")), "produce: client buffering"},
		{"our promise called by the client", stack(fr(vc+"/pkg/sink.promise"), fr("github.com/twmb/franz-go/pkg/kgo.(*producer).finishPromises")), "produce: our sink"},
		{"a histogram observed in a promise is metrics", stack(fr("github.com/prometheus/client_golang/prometheus.(*histogram).Observe"),
			fr(vc+"/pkg/sink.promise")), "metrics"},
		{"a system call of the client is the client's", stack(fr("internal/runtime/syscall/linux.Syscall6"), fr("syscall.Syscall"),
			fr("github.com/twmb/franz-go/pkg/kgo.(*brokerCxn).writeConn")), "kafka client: network, group, other"},
		{"the floor's own record allocation", stack(fr("runtime.mallocgc"), fr("main.cmdFloorProc.func3"),
			fr("github.com/twmb/franz-go/pkg/kgo.Fetches.EachRecord")), "floor loop"},
		{"the scheduler", stack(fr("runtime.futex"), fr("runtime.findRunnable"), fr("runtime.schedule")), "runtime: scheduler, syscalls, other"},
		{"nothing known", stack(fr("main.other")), "other"},
	} {
		if got := stageOf(tc.locs); got != tc.stage {
			t.Errorf("%s: stage %q, want %q", tc.name, got, tc.stage)
		}
	}
}

func TestMedianInt(t *testing.T) {
	for _, tc := range []struct {
		in   []int64
		want int64
	}{{nil, 0}, {[]int64{5}, 5}, {[]int64{3, 1, 2}, 2}, {[]int64{4, 1, 3, 2}, 2}, {[]int64{10, 20}, 15}} {
		if got := medianInt(tc.in); got != tc.want {
			t.Errorf("medianInt(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestStageTotalsLabel: --label keeps the samples of one stage of a process that runs
// several (the service's "stage" profiler label), or those without the label.
func TestStageTotalsLabel(t *testing.T) {
	const vc = "github.com/velocity-consumer/velocity-consumer"
	sample := func(v int64, labels map[string][]string, frames ...[]string) *profile.Sample {
		return &profile.Sample{Value: []int64{v}, Label: labels, Location: stack(frames...)}
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			sample(10, map[string][]string{"stage": {"input"}}, fr(vc+"/pkg/watermark.(*idShard).grow")),
			sample(20, map[string][]string{"stage": {"group:device"}}, fr(vc+"/pkg/repartition.(*Merger).Offer")),
			sample(40, map[string][]string{"stage": {"group:ip"}}, fr(vc+"/pkg/repartition.(*Merger).Offer")),
			sample(80, nil, fr("runtime.gcBgMarkWorker")),
		},
	}
	for _, tc := range []struct {
		flag  string
		total int64
		stage string // the one stage with samples
	}{
		{"", 150, ""},
		{"stage=input", 10, "dedupe"},
		{"stage=group:device", 20, "hop records and second-stage merge (pkg/repartition)"},
		{"stage=group:ip", 40, "hop records and second-stage merge (pkg/repartition)"},
		{"stage=", 80, "GC"},
		{"stage=group:card", 0, ""},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			f, err := parseLabelFilter(tc.flag)
			if err != nil {
				t.Fatal(err)
			}
			got, total, _, err := stageTotals(p, "cpu", f)
			if err != nil {
				t.Fatal(err)
			}
			if total != tc.total {
				t.Fatalf("total %d, want %d", total, tc.total)
			}
			if tc.stage != "" && (got[tc.stage] != tc.total || len(got) != 1) {
				t.Fatalf("stages %v, want all %d in %q", got, tc.total, tc.stage)
			}
		})
	}
	for _, bad := range []string{"stage", "=input"} {
		if _, err := parseLabelFilter(bad); err == nil {
			t.Fatalf("parseLabelFilter(%q) accepted", bad)
		}
	}
}
