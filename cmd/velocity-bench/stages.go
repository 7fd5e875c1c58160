package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/google/pprof/profile"
)

// `velocity-bench stages` accounts a run's CPU (or allocation) profile by stage of the
// service's hot path: every sample goes to one stage, found from its stack, so that the
// stages add up to the profile's total and two profiles (ours and the floor, written by
// `compare --profile`) can be set side by side per stage.

// stage rules: a sample's stack is walked from the leaf to the root, and the first frame
// that a specific rule matches names its stage (so an allocation, a copy or a GC assist
// counts where it happens: runtime.mallocgc matches nothing and falls to its caller,
// runtime.gcAssistAlloc matches GC before it). Only a stack that no specific rule
// matches is walked again for the fallback rules.
type stageRule struct {
	stage string
	subs  []string // any of these substrings of the function name
}

var specificStages = []stageRule{
	{"GC", []string{"runtime.gcBgMarkWorker", "runtime.gcAssistAlloc", "runtime.bgsweep", "runtime.bgscavenge",
		"runtime.gcStart", "runtime.gcMarkDone", "runtime.gcMarkTermination", "runtime.sweepone", "runtime.(*sweepLocked)"}},
	{"metrics", []string{"prometheus"}},
	{"checkpoint", []string{"/pkg/checkpoint.", "PendingSnapshot", "Snapshot", "service.(*worker).persist",
		"service.(*worker).advanceSweep", "service.(*worker).settle", "service.(*worker).cut", "service.(*Service).acquire"}},
	{"encode", []string{"/pkg/codec.AppendFeatures", "/pkg/codec.append", "/pkg/codec.(*FeaturesEncoder)", "/pkg/codec.put"}},
	{"decode", []string{"/pkg/codec."}},
	{"dedupe", []string{"watermark.(*idShard)", "watermark.(*idSet)", "watermark.(*Stage).PrefetchID", "watermark.(*Stage).dedupe"}},
	{"reorder", []string{"/pkg/watermark."}},
	{"window update", []string{"/pkg/window."}},
	{"feature state (pkg/feature: filters, distinct sets)", []string{"/pkg/feature."}},
	{"definition decode (pkg/definition)", []string{"/pkg/definition."}},
	{"hop records and second-stage merge (pkg/repartition)", []string{"/pkg/repartition."}},
	{"produce: compression", []string{"pierrec/lz4", "kgo.(*compressor)", "klauspost/compress",
		"/pkg/sink.(*lz4Frames)", "/pkg/sink.appendLZ4", "/pkg/sink.compressLZ4", "/pkg/sink.lz4"}},
	{"produce: our sink", []string{"/pkg/sink."}},
	{"produce: client buffering", []string{"kgo.(*Client).Produce", "kgo.(*Client).produce", "kgo.(*recBuf)", "kgo.(*Client).partitionsForTopicProduce", "kgo.(*Client).doPartition"}},
	{"produce: request encoding", []string{"kgo.(*produceRequest)", "kgo.seqRecBatch", "kgo.promisedRec", "kgo.(*sink)"}},
	{"produce: promises", []string{"kgo.(*producer).finishPromises", "kgo.(*Client).finishRecordPromise", "kgo.(*producer)"}},
	{"fetch", []string{"kgo.(*source)", "kgo.ProcessFetchPartition", "kgo.(*ProcessFetchPartitionOpts)", "kgo.(*decompressor)",
		"kgo.readRawRecords", "kgo.(*cursor", "kgo.(*Client).PollRecords", "kgo.(*Client).PollFetches", "kgo.Fetches", "kgo.(*FetchesRecordIter)"}},
	{"floor loop", []string{"main.cmdFloorProc"}},
	{"profiler", []string{"runtime/pprof.", "runtime.(*profBuf)"}},
}

var fallbackStages = []stageRule{
	{"kafka client: network, group, other", []string{"franz-go"}},
	{"pipeline glue (Process, hints, emit)", []string{"/pkg/pipeline."}},
	{"worker and poll loop", []string{"/pkg/service."}},
	{"runtime: scheduler, syscalls, other", []string{"runtime.", "syscall.", "internal/"}},
}

// stageOf returns the stage of one sample's stack. Specific rules: the leaf-most frame
// that any of them matches. Fallback rules: the first rule that any frame matches, so
// that a system call made by the Kafka client counts as the client's.
func stageOf(locs []*profile.Location) string {
	match := func(name string, r stageRule) bool {
		for _, s := range r.subs {
			if strings.Contains(name, s) {
				return true
			}
		}
		return false
	}
	frames := func(yield func(string) bool) {
		for _, l := range locs {
			for _, ln := range l.Line { // Line[0] is the innermost of the inlined calls
				if ln.Function != nil && !yield(ln.Function.Name) {
					return
				}
			}
		}
	}
	for name := range frames {
		for _, r := range specificStages {
			if match(name, r) {
				return r.stage
			}
		}
	}
	for _, r := range fallbackStages {
		for name := range frames {
			if match(name, r) {
				return r.stage
			}
		}
	}
	return "other"
}

// labelFilter selects a profile's samples by one profiler label: key=value keeps the
// samples whose label key has that value, key= those without the label. The service
// labels every goroutine of a service stage=input or stage=group:<name>
// (service.ProfileStage), so a profile of `run` with re-keyed groups splits by stage.
// The zero value keeps every sample.
type labelFilter struct {
	key, value string
}

func parseLabelFilter(s string) (labelFilter, error) {
	if s == "" {
		return labelFilter{}, nil
	}
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return labelFilter{}, fmt.Errorf("--label %q: want KEY=VALUE (or KEY= for samples without KEY)", s)
	}
	return labelFilter{k, v}, nil
}

func (f labelFilter) keep(s *profile.Sample) bool {
	if f.key == "" {
		return true
	}
	vs := s.Label[f.key]
	if f.value == "" {
		return len(vs) == 0
	}
	return slices.Contains(vs, f.value)
}

// stageTotals sums the profile's values of sample type typ per stage, over the
// samples f keeps.
func stageTotals(p *profile.Profile, typ string, f labelFilter) (map[string]int64, int64, string, error) {
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == typ {
			idx = i
		}
	}
	if idx < 0 {
		var have []string
		for _, st := range p.SampleType {
			have = append(have, st.Type)
		}
		return nil, 0, "", fmt.Errorf("no sample type %q (have %v)", typ, have)
	}
	out := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		if !f.keep(s) {
			continue
		}
		v := s.Value[idx]
		out[stageOf(s.Location)] += v
		total += v
	}
	return out, total, p.SampleType[idx].Unit, nil
}

func allStages() []string {
	var s []string
	for _, rs := range [][]stageRule{specificStages, fallbackStages} {
		for _, r := range rs {
			s = append(s, r.stage)
		}
	}
	return append(s, "other")
}

func cmdStages(_ context.Context, args []string) error { return stagesMain(os.Stdout, args) }

func stagesMain(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("stages", flag.ContinueOnError)
	typ := fs.String("type", "cpu", "sample type: cpu (CPU profile), alloc_space or alloc_objects (allocation profile)")
	events := fs.Int("events", 1_000_000, "events the run processed: the table also gives each stage per event")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: velocity-bench stages [flags] COLUMN...\n\nA COLUMN is a profile file, or several comma-separated: per stage, the median over them.")
		fs.PrintDefaults()
	}
	namesFlag := fs.String("names", "", "column names, comma-separated (default the arguments)")
	labelFlag := fs.String("label", "", "count only the samples with this profiler label, KEY=VALUE (KEY= : those without it); ours labels each service's goroutines stage=input or stage=group:NAME")
	if err := fs.Parse(args); err != nil {
		return err
	}
	filter, err := parseLabelFilter(*labelFlag)
	if err != nil {
		return err
	}
	cols := fs.Args() // one column each: a profile, or several comma-separated (their median)
	if len(cols) == 0 {
		return fmt.Errorf("stages: name at least one profile file")
	}
	names := splitList(*namesFlag)
	if len(names) != 0 && len(names) != len(cols) {
		return fmt.Errorf("--names has %d names for %d columns", len(names), len(cols))
	}
	if len(names) == 0 {
		names = cols
	}
	var totals []map[string]int64
	var sums []int64
	unit := ""
	for _, col := range cols {
		var ts []map[string]int64
		var ss []int64
		for _, f := range splitList(col) {
			fh, err := os.Open(f)
			if err != nil {
				return err
			}
			p, err := profile.Parse(fh)
			fh.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			t, sum, u, err := stageTotals(p, *typ, filter)
			if err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			ts, ss, unit = append(ts, t), append(ss, sum), u
		}
		med := map[string]int64{}
		for _, st := range allStages() {
			var vs []int64
			for _, t := range ts {
				vs = append(vs, t[st])
			}
			med[st] = medianInt(vs)
		}
		totals, sums = append(totals, med), append(sums, medianInt(ss))
	}
	scale, perEvt, label := 1.0, "", unit
	switch unit {
	case "nanoseconds":
		scale, label, perEvt = 1e-9, "s", "µs/event"
	case "bytes":
		scale, label, perEvt = 1.0/(1<<20), "MiB", "B/event"
	default:
		perEvt = "per event"
	}
	fmt.Fprintf(w, "| stage |")
	for _, c := range names {
		fmt.Fprintf(w, " %s %s | %s %s | %% |", c, label, c, perEvt)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "| --- |"+strings.Repeat(" ---: | ---: | ---: |", len(cols))+"\n")
	row := func(name string, vals []int64) {
		fmt.Fprintf(w, "| %s |", name)
		for i, v := range vals {
			pe := float64(v) / float64(*events)
			if unit == "nanoseconds" {
				pe /= 1e3
			}
			fmt.Fprintf(w, " %.2f | %.2f | %.1f |", float64(v)*scale, pe, 100*float64(v)/float64(max(sums[i], 1)))
		}
		fmt.Fprintln(w)
	}
	for _, st := range allStages() {
		vals := make([]int64, len(totals))
		any := false
		for i, t := range totals {
			vals[i] = t[st]
			any = any || vals[i] != 0
		}
		if any {
			row(st, vals)
		}
	}
	row("**total**", sums)
	return nil
}

// medianInt is the median of vs (the mean of the middle two for an even count);
// stage medians need not add up to the median total.
func medianInt(vs []int64) int64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
