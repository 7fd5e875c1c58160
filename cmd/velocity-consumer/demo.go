package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

const demoUsage = `velocity-consumer demo: the whole pipeline on an in-process Kafka broker.

Starts franz-go's kfake broker in this process, a synthetic generator (Zipf-skewed
entities with a few heavy hitters, out-of-order jitter, and some late, duplicate
and malformed records), and the live service as in 'run'. Prints a live view
every second and, at the end, checks the accounting invariant by reading the
output and dead-letter topics back: every input offset yields exactly one
features record or one dead letter. Then it prints a few features records,
decoded. Ends after --duration or on Ctrl-C; with --keep-running the broker
stays up afterwards, with its topics, for kcat or any Kafka client, until
Ctrl-C.

The latency it reports includes the reorder wait: an event is held until the
watermark (the partition's newest event time minus --allowed-lateness) passes
it, so an in-order event waits about --allowed-lateness before its features
go out. '--allowed-lateness 0' shows the pipeline without that wait (and
turns every out-of-order event into a late one).`

type demoFlags struct {
	duration    time.Duration
	rate        int
	entities    int
	partitions  int
	seed        uint64
	logLevel    string
	keepRunning bool
	pipe        pipelineFlags
	api         apiFlags
}

func (d *demoFlags) register(e *envFlags) {
	e.Duration(&d.duration, "duration", 20*time.Second, "how long the generator runs")
	e.Int(&d.rate, "rate", 5000, "transactions per second to generate")
	e.Int(&d.entities, "entities", 50_000, "distinct entities (Zipf-distributed)")
	e.Int(&d.partitions, "partitions", 4, "input topic partitions")
	e.fs.Uint64Var(&d.seed, "seed", 1, "generator seed")
	e.env["seed"] = envName("seed")
	e.String(&d.logLevel, "log-level", "warn", "service log level (the live view is printed regardless)")
	e.Bool(&d.keepRunning, "keep-running", false, "after the summary, keep the in-process broker and its topics up until Ctrl-C, and print its address and kcat commands to look around")
	d.pipe.register(e)
	d.api.register(e, "127.0.0.1:0")
}

func cmdDemo(ctx context.Context, args []string) error {
	var d demoFlags
	e := newEnvFlags("demo", demoUsage)
	d.register(e)
	if err := e.Parse(args); err != nil {
		return err
	}
	return runDemo(ctx, &d, os.Stdout)
}

// runDemo runs the demo, printing to out. ctx ends the generator early
// (Ctrl-C) and, with --keep-running, the wait after the summary.
func runDemo(ctx context.Context, d *demoFlags, out io.Writer) error {
	if d.duration <= 0 || d.rate <= 0 || d.entities <= 0 || d.partitions <= 0 {
		return errors.New("--duration, --rate, --entities and --partitions must be positive")
	}
	if d.pipe.features != "" {
		return errors.New("demo generates our own Transaction records and checks the default contract's features: --features is for run and replay (see docs/features.md)")
	}
	st, err := d.pipe.settings()
	if err != nil {
		return err
	}
	log, err := newLogger(d.logLevel, "console")
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck

	const input, output, dlq = "transactions", "velocity-features", "velocity-dlq"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(d.partitions), input, output, dlq))
	if err != nil {
		return fmt.Errorf("start in-process broker: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	fmt.Fprintf(out, "in-process Kafka broker at %s; topics %s (%d partitions), %s, %s\n", brokers[0], input, d.partitions, output, dlq)
	fmt.Fprintf(out, "windows %s, allowed lateness %s, late policy %s; generating %d tx/s over %d entities for %s\n",
		d.pipe.windows, d.pipe.allowedLateness, st.late, d.rate, d.entities, d.duration)
	fmt.Fprintf(out, "latency is arrival at the consumer to the broker's ack of the features record; it includes the reorder wait\n"+
		"of up to --allowed-lateness (%s): an event is released once the watermark passes it\n\n", d.pipe.allowedLateness)

	apiS, err := d.api.setup()
	if err != nil {
		return err
	}
	var apiLn net.Listener
	if apiS.on {
		if apiLn, err = apiS.listen(d.api.addr); err != nil {
			return err
		}
		defer apiLn.Close()
	}
	view := newLiveView(st.specs)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	svcCfg := service.Config{
		Brokers: brokers, Group: "velocity-demo",
		InputTopic: input, OutputTopic: output, DLQTopic: dlq,
		Specs: st.specs, Window: st.window, Watermark: st.watermark, Late: st.late,
		WriterSchema: st.writerSchema, Limits: st.limits,
		Store:              checkpoint.NewMemoryStore(),
		CheckpointInterval: 2 * time.Second,
		Host:               "demo",
		Observe:            view.observe,
		ClientOpts:         apiS.clientOpt(),
	}
	svc, err := service.New(svcCfg, log, m)
	if err != nil {
		return err
	}
	if apiS.on {
		stop, err := serveAPI(ctx, apiLn, apiS, []*service.Service{svc}, "", reg, log)
		if err != nil {
			return err
		}
		defer stop()
		auth := ""
		if apiS.token != "" {
			auth = ` -H "Authorization: Bearer $(cat ` + d.api.tokenFile + `)"`
		}
		insecure := ""
		if apiS.tls != nil {
			insecure = " -k"
		}
		fmt.Fprintf(out, "query API at %s; try, while the demo runs:\n  curl -s%s%s %s/v1/entities/card-0/velocity\n\n", apiS.advertise, insecure, auth, apiS.advertise)
	}
	svcCtx, svcCancel := context.WithCancel(context.Background())
	defer svcCancel()
	svcDone := make(chan error, 1)
	go func() { svcDone <- svc.Run(svcCtx) }()

	gen, err := newGenerator(brokers, input, *d)
	if err != nil {
		return err
	}
	genCtx, genCancel := context.WithTimeout(ctx, d.duration)
	genDone := make(chan struct{})
	go func() { gen.run(genCtx); close(genDone) }()

	start := time.Now()
	tick := time.NewTicker(time.Second)
	var interrupted bool
loop:
	for {
		select {
		case <-tick.C:
			view.print(out, time.Since(start), gen.produced.Load(), reg)
		case <-genDone:
			break loop
		case err := <-svcDone:
			genCancel()
			<-genDone
			tick.Stop()
			return fmt.Errorf("service stopped: %w", err)
		}
	}
	interrupted = ctx.Err() != nil
	genCancel()
	tick.Stop()
	gen.close()
	produced := gen.produced.Load()

	// Let the service drain: the idle timeout releases what the reorder buffer
	// still holds once the generator stops.
	fmt.Fprintf(out, "\ngenerator stopped after %d records; draining...\n", produced)
	drainFor := 30 * time.Second
	if interrupted {
		drainFor = 10 * time.Second
	}
	for drainBy := time.Now().Add(drainFor); view.accounted() < produced && time.Now().Before(drainBy); {
		time.Sleep(100 * time.Millisecond)
	}
	svcCancel()
	select {
	case err := <-svcDone:
		if err != nil {
			return fmt.Errorf("service: %w", err)
		}
	case <-time.After(60 * time.Second):
		return errors.New("service did not shut down within 60s")
	}
	sumErr := summarize(out, brokers, input, output, dlq, produced, view, time.Since(start), reg, d.pipe.allowedLateness)
	if !d.keepRunning {
		return sumErr
	}
	if interrupted {
		fmt.Fprintln(out, "\n--keep-running: interrupted, so the broker stops now")
		return sumErr
	}
	a := brokers[0]
	fmt.Fprintf(out, "\n--keep-running: the in-process broker stays up at %s with its topics until Ctrl-C. To look around:\n", a)
	fmt.Fprintf(out, "  kcat -b %s -L\n", a)
	fmt.Fprintf(out, "  kcat -b %s -C -t %s -e -c 5 -f 'p%%p@%%o key %%k: %%S bytes of Avro VelocityFeatures\\n'\n", a, output)
	fmt.Fprintf(out, "  kcat -b %s -C -t %s -e -f 'p%%p@%%o %%h\\n'   (dead letters: reason, error and source in headers)\n", a, dlq)
	<-ctx.Done()
	fmt.Fprintln(out, "stopping the broker")
	return sumErr
}

// generator produces synthetic transactions with the faults the pipeline must
// handle: out-of-order jitter, late events, duplicates and malformed records.
type generator struct {
	cl       *kgo.Client
	topic    string
	d        demoFlags
	rng      *rand.Rand
	zipf     *rand.Zipf
	produced atomic.Int64
	recent   [][2][]byte // recent (key, value) pairs to resend as duplicates
	perr     atomic.Pointer[error]
}

func newGenerator(brokers []string, topic string, d demoFlags) (*generator, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(d.seed, d.seed^0x9e3779b97f4a7c15))
	return &generator{
		cl: cl, topic: topic, d: d, rng: rng,
		zipf: rand.NewZipf(rng, 1.2, 4, uint64(d.entities-1)),
	}, nil
}

func (g *generator) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = g.cl.Flush(ctx)
	g.cl.Close()
}

func (g *generator) run(ctx context.Context) {
	const step = 10 * time.Millisecond
	perStep := float64(g.d.rate) * step.Seconds()
	tick := time.NewTicker(step)
	defer tick.Stop()
	var carry float64
	var seq int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		carry += perStep
		n := int(carry)
		carry -= float64(n)
		now := time.Now().UnixMilli()
		for range n {
			seq++
			key, value := g.next(now, seq)
			g.produced.Add(1)
			g.cl.Produce(context.Background(), &kgo.Record{Key: key, Value: value}, func(_ *kgo.Record, err error) {
				if err != nil {
					g.perr.Store(&err)
				}
			})
		}
	}
}

func (g *generator) next(now, seq int64) (key, value []byte) {
	r := g.rng.Float64()
	switch {
	case r < 0.005 && len(g.recent) > 0: // a resend of a recent transaction
		kv := g.recent[g.rng.IntN(len(g.recent))]
		return kv[0], kv[1]
	case r < 0.007: // bytes that are not a Transaction
		b := make([]byte, 3+g.rng.IntN(20))
		for i := range b {
			b[i] = byte(g.rng.Uint32())
		}
		return []byte("garbage"), b
	}
	entity := "card-" + strconv.FormatUint(g.zipf.Uint64(), 10)
	tx := codec.Transaction{
		EventID:     fmt.Sprintf("tx-%d-%d", g.d.seed, seq),
		EntityID:    entity,
		AmountMinor: 100 + int64(g.rng.ExpFloat64()*4000),
		Currency:    "EUR",
		EventTime:   now - int64(math.Abs(g.rng.NormFloat64())*150),
	}
	switch j := g.rng.Float64(); {
	case j < 0.01: // late: well behind the watermark
		tx.EventTime -= 10_000 + g.rng.Int64N(50_000)
	case j < 0.08: // out of order, but within the allowed lateness
		tx.EventTime -= g.rng.Int64N(max(g.d.pipe.allowedLateness.Milliseconds(), 1))
	}
	if r < 0.009 { // invalid: an empty entity id or a negative amount
		if g.rng.IntN(2) == 0 {
			tx.EntityID = ""
		} else {
			tx.AmountMinor = -tx.AmountMinor
		}
	}
	key, value = []byte(tx.EntityID), codec.EncodeTransaction(&tx)
	if len(g.recent) < 256 {
		g.recent = append(g.recent, [2][]byte{key, value})
	} else {
		g.recent[g.rng.IntN(len(g.recent))] = [2][]byte{key, value}
	}
	return key, value
}

// liveView aggregates what the service emits, for the once-a-second print.
type liveView struct {
	mu        sync.Mutex
	features  int64
	dead      map[codec.Reason]int64
	velocity  map[string]int64 // entity -> 5-minute count at its latest event
	velWindow int
	velName   string
	lastTotal int64
	lastAt    time.Duration
}

func newLiveView(specs []window.Spec) *liveView {
	v := &liveView{dead: map[codec.Reason]int64{}, velocity: map[string]int64{}}
	v.velWindow, v.velName = 0, specs[0].Name
	for i, s := range specs {
		if s.Name == "5m" {
			v.velWindow, v.velName = i, s.Name
		}
	}
	return v
}

func (v *liveView) observe(o *pipeline.Output) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if o.Dead {
		v.dead[o.Reason]++
		return
	}
	v.features++
	if _, ok := v.velocity[o.EntityID]; ok {
		v.velocity[o.EntityID] = o.Windows[v.velWindow].Count
	} else {
		// A new key is kept: its own copy, since o.EntityID is valid only during
		// the call (it may point into the input record's bytes).
		v.velocity[strings.Clone(o.EntityID)] = o.Windows[v.velWindow].Count
	}
}

func (v *liveView) accounted() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := v.features
	for _, c := range v.dead {
		n += c
	}
	return n
}

func (v *liveView) print(w io.Writer, elapsed time.Duration, produced int64, reg *prometheus.Registry) {
	v.mu.Lock()
	total := v.features
	var dead []string
	reasons := make([]string, 0, len(v.dead))
	for r := range v.dead {
		reasons = append(reasons, string(r))
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		c := v.dead[codec.Reason(r)]
		total += c
		dead = append(dead, fmt.Sprintf("%s=%d", r, c))
	}
	type ev struct {
		id string
		n  int64
	}
	top := make([]ev, 0, len(v.velocity))
	for id, n := range v.velocity {
		top = append(top, ev{id, n})
	}
	rate := float64(total-v.lastTotal) / (elapsed - v.lastAt).Seconds()
	v.lastTotal, v.lastAt = total, elapsed
	velName := v.velName
	v.mu.Unlock()
	sort.Slice(top, func(i, j int) bool { return top[i].n > top[j].n || top[i].n == top[j].n && top[i].id < top[j].id })
	if len(top) > 3 {
		top = top[:3]
	}
	var tops []string
	for _, t := range top {
		tops = append(tops, fmt.Sprintf("%s:%d", t.id, t.n))
	}
	p50, p99 := histQuantile(reg, "velocity_event_to_feature_latency_seconds", 0.5), histQuantile(reg, "velocity_event_to_feature_latency_seconds", 0.99)
	fmt.Fprintf(w, "%5.0fs  in %7d  out %7.0f/s  latency p50 %5.1fms p99 %5.1fms (incl. reorder wait)  top %s-count %s  dlq %s\n",
		elapsed.Seconds(), produced, rate, p50*1e3, p99*1e3, velName, strings.Join(tops, " "), strings.Join(dead, " "))
}

// histQuantile estimates a quantile from a registered histogram's buckets by
// linear interpolation, as Prometheus' histogram_quantile does.
func histQuantile(reg *prometheus.Registry, name string, q float64) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return math.NaN()
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) == 0 {
			continue
		}
		return bucketQuantile(mf.GetMetric()[0].GetHistogram(), q)
	}
	return math.NaN()
}

func bucketQuantile(h *dto.Histogram, q float64) float64 {
	total := float64(h.GetSampleCount())
	if total == 0 {
		return 0
	}
	rank := q * total
	var prevCount, prevBound float64
	for _, b := range h.GetBucket() {
		c := float64(b.GetCumulativeCount())
		if c >= rank {
			if c == prevCount {
				return b.GetUpperBound()
			}
			return prevBound + (b.GetUpperBound()-prevBound)*(rank-prevCount)/(c-prevCount)
		}
		prevCount, prevBound = c, b.GetUpperBound()
	}
	return prevBound
}

// summarize reads the output and dead-letter topics back and checks that every
// input offset is accounted for exactly once.
func summarize(w io.Writer, brokers []string, input, output, dlq string, produced int64, v *liveView, elapsed time.Duration, reg *prometheus.Registry, lateness time.Duration) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(output, dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	type src struct {
		p   int32
		off int64
	}
	seen := make(map[src]int, produced)
	var features, dead, dups int64
	deadBy := map[string]int64{}
	latest := map[string]sample{} // entity -> its last features record read
	idle := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for int64(len(seen)) < produced && time.Since(idle) < 5*time.Second && ctx.Err() == nil {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		pcancel()
		fs.EachRecord(func(r *kgo.Record) {
			idle = time.Now()
			var s src
			if r.Topic == output {
				f, err := codec.DecodeFeatures(r.Value)
				if err != nil {
					return
				}
				features++
				s = src{f.SourcePartition, f.SourceOffset}
				latest[f.EntityID] = sample{f: f, p: r.Partition, off: r.Offset}
			} else {
				dead++
				for _, h := range r.Headers {
					switch h.Key {
					case codec.HeaderSourcePartition:
						p, _ := strconv.Atoi(string(h.Value))
						s.p = int32(p)
					case codec.HeaderSourceOffset:
						s.off, _ = strconv.ParseInt(string(h.Value), 10, 64)
					case codec.HeaderReason:
						deadBy[string(h.Value)]++
					}
				}
			}
			seen[s]++
			if seen[s] > 1 {
				dups++
			}
		})
	}
	fmt.Fprintf(w, "\nsummary after %s\n", elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "  input records       %d\n", produced)
	fmt.Fprintf(w, "  features records   %d (topic %s)\n", features, output)
	fmt.Fprintf(w, "  dead letters        %d (topic %s)", dead, dlq)
	reasons := make([]string, 0, len(deadBy))
	for r := range deadBy {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Fprintf(w, " %s=%d", r, deadBy[r])
	}
	fmt.Fprintln(w)
	p50, p99 := histQuantile(reg, "velocity_event_to_feature_latency_seconds", 0.5), histQuantile(reg, "velocity_event_to_feature_latency_seconds", 0.99)
	fmt.Fprintf(w, "  latency             p50 %.1f ms, p99 %.1f ms (arrival at the consumer to broker ack)\n", p50*1e3, p99*1e3)
	fmt.Fprintf(w, "                      including the reorder wait of up to --allowed-lateness (%s); --allowed-lateness 0 leaves it out\n", lateness)
	printSamples(w, brokers[0], output, latest, 3)
	if int64(len(seen)) == produced && dups == 0 {
		fmt.Fprintf(w, "  accounting          OK: each of the %d input offsets has exactly one output\n", produced)
		return nil
	}
	fmt.Fprintf(w, "  accounting          MISMATCH: %d of %d input offsets accounted for, %d repeated\n", len(seen), produced, dups)
	return fmt.Errorf("accounting invariant broken: %d of %d input offsets accounted for, %d repeated", len(seen), produced, dups)
}

// sample is a features record read back, with where it was read.
type sample struct {
	f   codec.Features
	p   int32
	off int64
}

// printSamples prints the latest features record of the n entities with the
// most events in their first window, decoded, and where each one is.
func printSamples(w io.Writer, broker, topic string, latest map[string]sample, n int) {
	all := make([]sample, 0, len(latest))
	for _, s := range latest {
		if len(s.f.Windows) > 0 {
			all = append(all, s)
		}
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i].f.Windows[0].Count, all[j].f.Windows[0].Count
		return a > b || a == b && all[i].f.EntityID < all[j].f.EntityID
	})
	if len(all) > n {
		all = all[:n]
	}
	if len(all) == 0 {
		return
	}
	fmt.Fprintf(w, "\nfeatures records, decoded (the latest of the %d busiest entities; topic %s on %s, plain Avro VelocityFeatures):\n", len(all), topic, broker)
	for _, s := range all {
		f := &s.f
		prev := "null (first event)"
		if f.HasPrevious {
			prev = strconv.FormatInt(f.MsSincePrevious, 10) + " ms"
		}
		fmt.Fprintf(w, "  %s partition %d offset %d, key %q: event %s at %s, late=%v, ms_since_previous %s, from %s/%d@%d\n",
			topic, s.p, s.off, f.EntityID, f.EventID, time.UnixMilli(f.EventTime).UTC().Format("15:04:05.000"), f.Late, prev,
			f.SourceTopic, f.SourcePartition, f.SourceOffset)
		for _, win := range f.Windows {
			fmt.Fprintf(w, "      %-4s count %4d  sum_minor %9d  min %6d  max %6d\n", win.Name, win.Count, win.SumMinor, win.MinMinor, win.MaxMinor)
		}
	}
	fmt.Fprintln(w)
}
