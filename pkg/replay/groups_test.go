package replay

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// memSource is a multi-partition topic in memory: every partition listed, empty
// ones included, as TopicSource lists a topic's partitions.
type memSource struct {
	parts  [][]pipeline.Record
	warmUp []int // per partition, how many leading records only warm up
}

func (s *memSource) Topic() string         { return "payments" }
func (s *memSource) PartitionCount() int32 { return int32(len(s.parts)) }
func (s *memSource) Size() (int64, string) { return 0, "offsets" }
func (s *memSource) Close() error          { return nil }
func (s *memSource) Partitions() []int32 {
	var ps []int32
	for p := range s.parts {
		ps = append(ps, int32(p))
	}
	return ps
}

func (s *memSource) Read(ctx context.Context, p int32, prog *Progress, fn func(*Record) error) error {
	for i, r := range s.parts[p] {
		rec := Record{Record: r, WarmUp: s.warmUp != nil && i < s.warmUp[p]}
		if err := fn(&rec); err != nil {
			return err
		}
	}
	return nil
}

// logSink keeps every Write as a line of every field a sink reads, in order.
type logSink struct {
	b       bytes.Buffer
	discard bool // count nothing, keep nothing: for benchmarks
}

func (s *logSink) Write(o *pipeline.Output) error {
	if s.discard {
		return nil
	}
	fmt.Fprintf(&s.b, "%t %t %q %q %q %q %q %d %d %q\n", o.Dead, o.Key == nil, o.Key, o.Value, o.Reason, o.Err,
		o.SourceTopic, o.SourcePartition, o.SourceOffset, o.Group)
	return nil
}
func (s *logSink) Commit(context.Context) error { return nil }
func (s *logSink) Abort() error                 { return nil }

const groupsLateness = 5 * time.Second

// groupsRun replays src with the payment definition's groups, with the plain
// schedule (direct) or replay's, and returns every sink's bytes and the result.
func groupsRun(t testing.TB, src Source, direct bool, tmp string) (map[string]string, Result) {
	return groupsRunTo(t, src, direct, tmp, false)
}

func groupsRunTo(t testing.TB, src Source, direct bool, tmp string, discard bool) (map[string]string, Result) {
	t.Helper()
	def, err := definition.LoadFile("../../internal/streamtest/" + streamtest.PaymentGroupsFile)
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile("../../internal/streamtest/" + streamtest.PaymentSchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := definition.Compiler(def, codec.Limits{})(string(schema))
	if err != nil {
		t.Fatal(err)
	}
	specs, err := definition.EngineSpecs(def)
	if err != nil {
		t.Fatal(err)
	}
	sinks := map[string]*logSink{"features": {discard: discard}, "dead": {discard: discard}}
	cfg := Config{
		Pipeline: pipeline.Config{Specs: specs[0].Spec.Windows, Decoder: dec, Features: specs[0].Spec,
			Watermark: watermark.Config{AllowedLateness: groupsLateness.Milliseconds()}},
		Features: sinks["features"], Dead: sinks["dead"], TempDir: tmp,
	}
	for _, g := range specs[1:] {
		sinks[g.Name] = &logSink{discard: discard}
		cfg.Groups = append(cfg.Groups, Group{Name: g.Name, Spec: g.Spec, Features: sinks[g.Name]})
	}
	res := Result{ByReason: map[codec.Reason]int64{}}
	prog := new(Progress)
	st, err := newStages(src, &cfg, prog, &res)
	if err != nil {
		t.Fatal(err)
	}
	st.direct = direct
	err = run(context.Background(), src, cfg, prog, &res, st)
	if cerr := st.close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for name, s := range sinks {
		out[name] = s.b.String()
	}
	return out, res
}

// paymentSource encodes s as a memSource.
func paymentSource(t testing.TB, s streamtest.Payments) *memSource {
	t.Helper()
	schema, err := os.ReadFile("../../internal/streamtest/" + streamtest.PaymentSchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	src := &memSource{parts: make([][]pipeline.Record, len(s.Parts))}
	for p, recs := range s.Parts {
		vals, err := streamtest.EncodeCards(string(schema), recs)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			src.parts[p] = append(src.parts[p], pipeline.Record{Offset: int64(i), Key: []byte(s.Keys[p][i]), Value: v})
		}
	}
	return src
}

// shift moves every event time of partition p's records by d.
func shift(s streamtest.Payments, p int, d time.Duration) {
	for i, r := range s.Parts[p] {
		c := make(map[string]any, len(r))
		for k, v := range r {
			c[k] = v
		}
		c["ts"] = r["ts"].(time.Time).Add(d)
		s.Parts[p][i] = c // a copy: resends share the map with their original
	}
}

// densestWindow is the most records of s whose event times lie within one span of
// width w, over all partitions: the events a second stage may hold while it waits
// for the slowest source to promise a time about w past them.
func densestWindow(s streamtest.Payments, w time.Duration) int {
	var ts []int64
	for _, recs := range s.Parts {
		for _, r := range recs {
			ts = append(ts, r["ts"].(time.Time).UnixMicro())
		}
	}
	slices.Sort(ts)
	best, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] > w.Microseconds() {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// TestRekeyedGroupsReplayMemory replays multi-partition streams with re-keyed
// groups and holds replay's schedule to the plain one (every partition in turn, each
// hop record fed at once): the same bytes in every sink in the same order, and the
// second stages' peak pending events bounded by the stream's density over about
// twice the lateness (plus one event per source and stage), where the plain schedule
// holds the earlier partitions' events until the last one runs.
func TestRekeyedGroupsReplayMemory(t *testing.T) {
	const partitions = 4
	base := func(lag time.Duration) streamtest.Payments {
		return streamtest.PaymentStream(streamtest.PaymentStreamConfig{Seed: 11, N: 12000, Partitions: partitions,
			Lateness: groupsLateness, PartitionLag: lag})
	}
	cases := []struct {
		name   string
		stream func() streamtest.Payments
		warmUp []int
	}{
		{"aligned", func() streamtest.Payments { return base(time.Millisecond) }, nil},
		{"skewed by the generator's lag", func() streamtest.Payments { return base(0) }, nil},
		{"last partition two hours behind", func() streamtest.Payments {
			s := base(time.Millisecond)
			shift(s, partitions-1, -2*time.Hour)
			return s
		}, nil},
		{"first partition two hours behind", func() streamtest.Payments {
			s := base(time.Millisecond)
			shift(s, 0, -2*time.Hour)
			return s
		}, nil},
		{"one empty partition", func() streamtest.Payments {
			s := base(time.Millisecond)
			s.Parts[1], s.Keys[1] = nil, nil
			return s
		}, nil},
		{"last partition empty", func() streamtest.Payments {
			s := base(time.Millisecond)
			s.Parts[partitions-1], s.Keys[partitions-1] = nil, nil
			return s
		}, nil},
		{"one partition with a single event a month ahead", func() streamtest.Payments {
			s := base(time.Millisecond)
			s.Parts[2], s.Keys[2] = s.Parts[2][:1], s.Keys[2][:1]
			shift(s, 2, 30*24*time.Hour)
			return s
		}, nil},
		{"the last partition's single event a month ahead", func() streamtest.Payments {
			s := base(time.Millisecond)
			s.Parts[partitions-1], s.Keys[partitions-1] = s.Parts[partitions-1][:1], s.Keys[partitions-1][:1]
			shift(s, partitions-1, 30*24*time.Hour)
			return s
		}, nil},
		{"warm-up records", func() streamtest.Payments { return base(time.Second) }, []int{500, 0, 1200, 40}},
	}
	// Spill to the file after a few records, so that the file path is the one tested.
	defer func(b, m int) { spoolBudget, spoolMinTail = b, m }(spoolBudget, spoolMinTail)
	spoolBudget, spoolMinTail = 1<<10, 1<<10
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := c.stream()
			src := paymentSource(t, s)
			src.warmUp = c.warmUp
			tmp := t.TempDir()
			want, wantRes := groupsRun(t, src, true, tmp)
			got, gotRes := groupsRun(t, src, false, tmp)
			for name, w := range want {
				if got[name] != w {
					t.Errorf("sink %s: %d bytes, want the plain schedule's %d (first difference at byte %d)",
						name, len(got[name]), len(w), firstDiff(got[name], w))
				}
			}
			if gotRes.Features != wantRes.Features || gotRes.Dead != wantRes.Dead {
				t.Errorf("features, dead = %d, %d; want %d, %d", gotRes.Features, gotRes.Dead, wantRes.Features, wantRes.Dead)
			}
			if left, err := os.ReadDir(tmp); err != nil || len(left) != 0 {
				t.Errorf("temporary directory holds %v (%v) after the replay", left, err)
			}
			bound := partitions*densestWindow(s, 2*groupsLateness) + partitions*partitions + markEvery
			for g, gr := range gotRes.Groups {
				plain := wantRes.Groups[g]
				t.Logf("group %s: %d features, %d dead; peak pending %d (plain schedule %d), bound %d; %d bytes spooled",
					gr.Name, gr.Features, gr.Dead, gr.PeakPending, plain.PeakPending, bound, gr.Spooled)
				if gr.Features+gr.Dead == 0 {
					t.Errorf("group %s: no output", gr.Name)
				}
				if gr.PeakPending > bound {
					t.Errorf("group %s: second stages held %d events at once; want at most %d", gr.Name, gr.PeakPending, bound)
				}
				// The plain schedule breaks the bound: the measurement can fail.
				if plain.PeakPending <= bound {
					t.Errorf("group %s: the plain schedule held only %d events (bound %d): the case does not test the bound", gr.Name, plain.PeakPending, bound)
				}
			}
		})
	}
}

func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// BenchmarkGroupsSchedule is a whole replay of 4 partitions (12 000 payment records,
// two re-keyed groups, logging sinks) with the plain schedule and with replay's
// (spooled hop records, fed as the last partition needs them): what bounding the
// second stages' memory costs per input record.
func BenchmarkGroupsSchedule(b *testing.B) {
	src := paymentSource(b, streamtest.PaymentStream(streamtest.PaymentStreamConfig{Seed: 11, N: 12000, Partitions: 4, Lateness: groupsLateness}))
	records := 0
	for _, p := range src.parts {
		records += len(p)
	}
	for _, direct := range []bool{true, false} {
		name := "spooled"
		if direct {
			name = "plain"
		}
		b.Run(name, func(b *testing.B) {
			tmp := b.TempDir()
			cpu0 := cpuclock.Nanos()
			for b.Loop() {
				groupsRunTo(b, src, direct, tmp, true)
			}
			b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N*records), "cpu-ns/record")
		})
	}
}
