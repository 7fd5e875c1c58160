package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Result is one measured run, one JSON line in the results file.
type Result struct {
	Round     int    `json:"round"`
	Mode      string `json:"mode"` // "throughput" | "latency"
	Processor string `json:"processor"`
	Entities  int    `json:"entities"`
	Events    int    `json:"events"` // inputs the run had to answer
	Rate      int    `json:"rate,omitempty"`
	// Groups is the number of key dimensions of a groups run (groups.go), 0 for the
	// single-key contract. GroupRows and GroupKeys are, per group in benchGroups
	// order, the feature rows read back and the distinct keys they name.
	Groups    int   `json:"groups,omitempty"`
	GroupRows []int `json:"group_rows,omitempty"`
	GroupKeys []int `json:"group_keys,omitempty"`
	// DeadLetterReasons counts a groups run's dead letters by "<group>:<reason>"
	// ("input:<reason>" for those of the input partition, which answer for every group).
	DeadLetterReasons map[string]int `json:"dead_letter_reasons,omitempty"`

	Features    int `json:"features"`
	DeadLetters int `json:"dead_letters"`
	Unique      int `json:"unique_inputs_answered"`
	Dups        int `json:"duplicate_outputs"`
	BadValues   int `json:"bad_values"`

	// Throughput: outputs / (last − first output append time).
	EventsPerSec float64 `json:"events_per_sec"`
	// Wall: process start → last output append; startup: process start → first output.
	WallSec    float64 `json:"wall_sec"`
	StartupSec float64 `json:"startup_sec"`

	LatencySamples int `json:"latency_samples,omitempty"`
	// WorstSeconds: the seconds of the measured phase with the largest latency, as
	// "+Ns:max ms", worst first.
	WorstSeconds []string `json:"worst_seconds,omitempty"`
	// PerSecondMaxMs is the largest latency of the events produced in each second
	// of the measured phase, from MeasuredFromUnixMs on: to line stalls up with
	// the processor's log.
	PerSecondMaxMs     []int64 `json:"per_second_max_ms,omitempty"`
	MeasuredFromUnixMs int64   `json:"measured_from_unix_ms,omitempty"`
	// PerSecondSplitMs: per second, the largest of each part of the latency (to
	// the input's append, on to emitted_at, on to the output's append; −1 unknown).
	PerSecondSplitMs [][3]int64 `json:"per_second_split_ms,omitempty"`
	// AddedP50Ms and AddedP99Ms are, for ours in a latency run, the quantiles of
	// its own velocity_added_latency_seconds over the measured phase (per batch,
	// poll to producer hand-off), from AddedBatches observations.
	AddedP50Ms   float64 `json:"added_p50_ms,omitempty"`
	AddedP99Ms   float64 `json:"added_p99_ms,omitempty"`
	AddedBatches int     `json:"added_batches,omitempty"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	P999Ms       float64 `json:"p999_ms"`
	MaxMs        float64 `json:"max_ms"`
	// The p99 split at the processor's velocity.emitted_at header (ours only; Kafka
	// Streams sets none): ToEmit = event_time → the processor produced the record
	// (load generator, broker, fetch, queueing and processing); FromEmit = that →
	// the broker appended it (produce batching and the broker). Each is its own
	// p99, so they need not add up to P99Ms.
	P99ToEmitMs   float64 `json:"p99_to_emit_ms,omitempty"`
	P99FromEmitMs float64 `json:"p99_from_emit_ms,omitempty"`
	// P99ToInputMs: event_time → the broker appended the input record (the load
	// generator's batching and the broker), the first part of ToEmit.
	P99ToInputMs float64 `json:"p99_to_input_ms,omitempty"`
	// Steady: the CPU of the machine and of each process during the steady produce
	// phase of a latency run (including its first, unmeasured seconds).
	Steady SteadyCPU `json:"steady_cpu,omitzero"`

	// At the moment every output was in the topic (before shutdown).
	PeakRSSMiB    float64 `json:"peak_rss_mib"`
	CPUSec        float64 `json:"cpu_sec"`
	CPUSecPerMEvt float64 `json:"cpu_sec_per_m_events"`
	// Rusage after exit, including shutdown (the final checkpoint, Streams' close).
	ExitCPUSec     float64 `json:"exit_cpu_sec"`
	ExitMaxRSSMiB  float64 `json:"exit_maxrss_mib"`
	ProduceSec     float64 `json:"produce_sec,omitempty"`
	Err            string  `json:"error,omitempty"`
	ProcessLogPath string  `json:"log,omitempty"`
}

// runner holds what every run of one invocation shares.
type runner struct {
	brokers    []string
	adm        *kadm.Client
	env        procEnv
	workDir    string
	runTimeout time.Duration
	// stallTimeout fails a run whose outputs have not grown for this long.
	stallTimeout time.Duration
	keep         bool
	seq          int // makes topic, group and directory names unique within the invocation
	tag          string
}

func (r *runner) names(kind string) (input, output, dlq, group, dir string, err error) {
	r.seq++
	base := fmt.Sprintf("vb-%s-%d-%s", r.tag, r.seq, kind)
	dir = filepath.Join(r.workDir, base)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", "", "", "", err
	}
	return base + "-in", base + "-out", base + "-dlq", base + "-app", dir, nil
}

// outputConfigs: the broker stamps each output record with its append time, which is
// what throughput and latency are measured from (no clock of the processor involved).
var outputConfigs = map[string]string{"message.timestamp.type": "LogAppendTime"}

const partitions = 4

// runThroughput runs p over an input topic that already holds want records and
// measures it until every input has an output.
func (r *runner) runThroughput(ctx context.Context, p ProcSpec, input string, want, entities int) Result {
	res := Result{Mode: "throughput", Processor: p.Name, Entities: entities, Events: want}
	_, output, dlq, group, dir, err := r.names(safeName(p.Name))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	if err := createTopics(ctx, r.adm, partitions, outputConfigs, output, dlq); err != nil {
		res.Err = err.Error()
		return res
	}
	defer r.cleanup(group, dir, output, dlq)
	r.measure(ctx, &res, p, input, output, dlq, group, dir, want, math.MinInt64, nil, nil)
	return res
}

// runLatency starts p on fresh topics, warms it up with warm events, then produces at a
// steady rate for d and measures event→output latency of the events produced after
// skip (the first seconds include the JIT of the JVM peer and the first fetch sessions).
func (r *runner) runLatency(ctx context.Context, p ProcSpec, w Workload, rate int, d, skip time.Duration, warm int) Result {
	res := Result{Mode: "latency", Processor: p.Name, Entities: w.Entities, Rate: rate}
	input, output, dlq, group, dir, err := r.names(safeName(p.Name) + "-lat")
	if err != nil {
		res.Err = err.Error()
		return res
	}
	// The input stamps append times too, so that each sample splits at the input's
	// append (load generator and broker before it, the processor after). Event
	// times are in the values; neither processor reads the input's timestamps.
	if err := createTopics(ctx, r.adm, partitions, outputConfigs, input, output, dlq); err != nil {
		res.Err = err.Error()
		return res
	}
	defer r.cleanup(group, dir, input, output, dlq)
	w.Events = warm + int(float64(rate)*d.Seconds()) + rate // headroom for timer slack
	g, err := NewGenerator(w)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	disorder := map[string]int64{}
	metrics := ""
	if p.Kind == "ours" {
		if metrics, err = freeLoopbackAddr(); err != nil {
			res.Err = err.Error()
			return res
		}
		r.env.MetricsAddr = metrics
		defer func() { r.env.MetricsAddr = "" }()
	}
	feed := func(ctx context.Context, c *child) (int, int64, error) {
		cl, err := newProducer(r.brokers, input)
		if err != nil {
			return 0, 0, err
		}
		defer cl.Close()
		// Warm-up at a gentle rate until every warm-up event has its output, so the
		// measured phase starts with partitions assigned and the pipeline running.
		if _, err := producePaced(ctx, cl, g, warm, time.Second, disorder); err != nil {
			return 0, 0, fmt.Errorf("warm-up: %w", err)
		}
		sentWarm := g.Index() + 1
		if err := r.waitOutputs(ctx, c, output, dlq, sentWarm, r.runTimeout); err != nil {
			return 0, 0, fmt.Errorf("warm-up: %w", err)
		}
		minEventTime := time.Now().Add(skip).UnixMilli()
		var h0 histogram
		if metrics != "" {
			h0, _ = scrapeHistogram(ctx, metrics, addedLatencyMetric) // none yet: counted from zero
		}
		before := markCPU(c.cmd.Process.Pid, localBrokers())
		n, err := producePaced(ctx, cl, g, rate, d, disorder)
		res.Steady = steadyCPU(before, markCPU(c.cmd.Process.Pid, before.brokerPIDs))
		if metrics != "" {
			if h1, herr := scrapeHistogram(ctx, metrics, addedLatencyMetric); herr == nil {
				if dh, herr := h1.since(h0); herr == nil && dh.count() > 0 {
					res.AddedP50Ms, res.AddedP99Ms = 1e3*dh.quantile(0.5), 1e3*dh.quantile(0.99)
					res.AddedBatches = int(dh.count())
				}
			}
		}
		return sentWarm + n, minEventTime, err
	}
	r.measure(ctx, &res, p, input, output, dlq, group, dir, 0, math.MinInt64, disorder, feed)
	return res
}

// measure starts the processor, feeds it (when feed is set; it returns the number of
// inputs), waits for want outputs, samples the child, stops it and reads the outputs.
func (r *runner) measure(ctx context.Context, res *Result, p ProcSpec, input, output, dlq, group, dir string, want int, minEventTime int64, disorder map[string]int64, feed func(context.Context, *child) (int, int64, error)) {
	cmd, err := r.env.command(p, input, output, dlq, group, dir)
	if err != nil {
		res.Err = err.Error()
		return
	}
	res.ProcessLogPath = filepath.Join(dir, "processor.log")
	start := time.Now()
	c, err := startChild(cmd)
	if err != nil {
		res.Err = fmt.Sprintf("start %s: %v", p.Name, err)
		return
	}
	stopped := false
	var exit procSample
	stop := func() {
		if !stopped {
			stopped = true
			exit = c.stop(60 * time.Second)
		}
	}
	defer stop()
	if feed != nil {
		n, minT, err := feed(ctx, c)
		if err != nil {
			res.Err = err.Error()
			return
		}
		want, minEventTime = n, minT
		res.Events = n
	}
	if err := r.waitOutputs(ctx, c, output, dlq, want, r.runTimeout); err != nil {
		res.Err = err.Error()
		return
	}
	if s, err := sampleProc(c.cmd.Process.Pid); err == nil {
		res.CPUSec = s.CPU.Seconds()
		res.PeakRSSMiB = float64(s.PeakRSSB) / (1 << 20)
		res.CPUSecPerMEvt = res.CPUSec / float64(want) * 1e6
	}
	if minEventTime == math.MinInt64 {
		minEventTime = math.MaxInt64 // produced-ahead runs: event times are synthetic, no latency
	}
	// Under exactly-once the end offsets count transaction markers, so they reach want
	// before the last records are committed; stopping the processor then would abort
	// its open transaction. Read the committed outputs back first and stop it after.
	// Without transactions every counted offset is a record: stop first, so that the
	// read-back does not compete with the processor for the two cores.
	if !p.EOS {
		stop()
	}
	latInput := "" // latency runs' inputs carry append times: split the latency there
	if feed != nil {
		latInput = input
	}
	sr, err := scanOutputs(ctx, r.brokers, latInput, output, dlq, want, minEventTime, disorder, p.Kind == "floor", 3*time.Minute)
	stop()
	res.ExitCPUSec = exit.CPU.Seconds()
	res.ExitMaxRSSMiB = float64(exit.PeakRSSB) / (1 << 20)
	res.Features, res.DeadLetters = sr.Features, sr.DeadLetters
	res.Unique, res.Dups, res.BadValues = sr.Unique, sr.Dups, sr.BadValues
	if err != nil {
		res.Err = err.Error()
		return
	}
	if span := sr.LastAppend.Sub(sr.FirstAppend).Seconds(); span > 0 {
		res.EventsPerSec = float64(sr.Features+sr.DeadLetters) / span
	}
	res.WallSec = sr.LastAppend.Sub(start).Seconds()
	res.StartupSec = sr.FirstAppend.Sub(start).Seconds()
	res.LatencySamples = len(sr.Latencies)
	res.WorstSeconds = worstSeconds(sr.PerSecondMax, 5)
	if len(sr.PerSecondMax) > 0 {
		res.PerSecondMaxMs, res.MeasuredFromUnixMs = sr.PerSecondMax, minEventTime
		res.PerSecondSplitMs = sr.PerSecondSplit
	}
	if len(sr.Latencies) > 0 {
		res.P50Ms = Percentile(sr.Latencies, 0.5)
		res.P99Ms = Percentile(sr.Latencies, 0.99)
		res.P999Ms = Percentile(sr.Latencies, 0.999)
		res.MaxMs = float64(sr.Latencies[len(sr.Latencies)-1])
	}
	if len(sr.ToEmit) > 0 {
		res.P99ToEmitMs = Percentile(sr.ToEmit, 0.99)
		res.P99FromEmitMs = Percentile(sr.FromEmit, 0.99)
	}
	if len(sr.ToInput) > 0 {
		res.P99ToInputMs = Percentile(sr.ToInput, 0.99)
	}
	// No samples leaves the latency fields at zero (JSON has no NaN); LatencySamples
	// tells a zero latency from none.
}

// waitOutputs polls the end offsets of output and dlq every 20 ms until they hold want
// records, the child exits, or timeout passes. Under exactly-once, transaction markers
// take offsets too, so the count can run ahead of the records by the number of commits;
// scanOutputs then reads until every record is there.
func (r *runner) waitOutputs(ctx context.Context, c *child, output, dlq string, want int, timeout time.Duration) error {
	return r.waitCount(ctx, c, func() (int64, error) { return endOffsetSum(ctx, r.adm, output, dlq) }, int64(want), timeout)
}

// waitCount is waitOutputs for any count of the outputs (a groups run counts each
// group's topic and its dead letters once per group).
func (r *runner) waitCount(ctx context.Context, c *child, count func() (int64, error), want int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last, lastMove := int64(-1), time.Now()
	for time.Now().Before(deadline) {
		n, err := count()
		if err == nil && n >= want {
			return nil
		}
		// A run whose outputs stop growing is broken (the shared broker was restarted
		// under it, or the processor wedged): fail it instead of waiting out timeout.
		if err == nil && n != last {
			last, lastMove = n, time.Now()
		} else if time.Since(lastMove) > r.stallTimeout {
			return fmt.Errorf("outputs stuck at %d of %d for %s (err %v)", last, want, r.stallTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.exited:
			return fmt.Errorf("processor exited before answering every input (%v); see its log", c.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	n, _ := count()
	return fmt.Errorf("only %d of %d outputs after %s", n, want, timeout)
}

func (r *runner) cleanup(group, dir string, topics ...string) {
	if r.keep {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Kafka Streams names its changelog and repartition topics <application id>-…;
	// ours its repartition topics __velocity-repartition-<group>-<g>.
	topics = append(topics, internalTopicsOf(ctx, r.adm, group+"-")...)
	topics = append(topics, internalTopicsOf(ctx, r.adm, ourRepartitionPrefix(group))...)
	if err := deleteTopics(ctx, r.adm, topics...); err != nil {
		fmt.Fprintf(os.Stderr, "velocity-bench: delete topics %v: %v\n", topics, err)
	}
	_, _ = r.adm.DeleteGroups(ctx, group)
	// The processor's log stays for reading; its state (snapshots, RocksDB) goes.
	_ = os.RemoveAll(filepath.Join(dir, "state"))
	_ = os.RemoveAll(filepath.Join(dir, "kstreams-state"))
}

func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}

// worstSeconds lists the n seconds with the largest maximum latency, worst first.
func worstSeconds(perSec []int64, n int) []string {
	idx := make([]int, len(perSec))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(perSec[b], perSec[a]) })
	var out []string
	for _, i := range idx[:min(n, len(idx))] {
		out = append(out, fmt.Sprintf("+%ds:%dms", i, perSec[i]))
	}
	return out
}
