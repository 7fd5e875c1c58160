package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(strings.ReplaceAll(f, "_", ""))
		if err != nil || n <= 1 {
			return nil, fmt.Errorf("%q is not an entity count > 1", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func cmdCompare(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	brokers := fs.String("brokers", "127.0.0.1:9092", "comma-separated loopback Kafka brokers")
	rounds := fs.Int("rounds", 3, "rounds; every processor runs once per round, so ratios come from the same round")
	events := fs.Int("events", 1_000_000, "events per throughput run (produced before the processor starts)")
	entities := fs.String("entities", "100000,1000000", "Zipf entity counts, one throughput workload each")
	procs := fs.String("processors", "floor,ours,kstreams,kstreams:eos", "throughput runs: ours[:eos][:late=DUR], kstreams[:eos] or floor (a passthrough: the transport ceiling), comma-separated")
	latProcs := fs.String("latency-processors", "ours,kstreams,kstreams:eos", "latency runs, same syntax (empty: none)")
	latRate := fs.Int("latency-rate", 20_000, "events/s produced during latency runs")
	latDur := fs.Duration("latency-duration", 30*time.Second, "length of the steady produce phase of a latency run")
	latSkip := fs.Duration("latency-skip", 5*time.Second, "leave out events of the first part of the steady phase (JIT, first fetch sessions)")
	latEntities := fs.Int("latency-entities", 100_000, "Zipf entity count of latency runs")
	vc := fs.String("vc", "/tmp/vc", "velocity-consumer binary (go build -o /tmp/vc ./cmd/velocity-consumer)")
	jar := fs.String("jar", "bench/kstreams/target/velocity-kstreams.jar", "Kafka Streams peer (cd bench/kstreams && mvn -q package)")
	java := fs.String("java", "java", "java executable (17+)")
	javaOpts := fs.String("java-opts", "-Xmx1g -XX:+UseG1GC", "JVM options for the peer, space-separated")
	idle := fs.Duration("idle-timeout", 200*time.Millisecond, "our --idle-timeout: releases the last reorder-buffered events at the end of the input")
	ckpt := fs.String("checkpoint", "file", "our checkpoint store: file (fresh directory per run) or memory")
	vcAlt := fs.String("vc-alt", "", "other velocity-consumer builds, NAME=PATH comma-separated, run by processors ours:bin=NAME in the same rounds as --vc (before/after ratios)")
	vcExtra := fs.String("vc-args", "", "extra flags for our run, space-separated")
	out := fs.String("out", "", "results file, one JSON line per run (default WORKDIR/results.jsonl)")
	workDir := fs.String("workdir", "", "scratch directory for logs and state (default a new directory under $TMPDIR)")
	timeout := fs.Duration("run-timeout", 10*time.Minute, "give up on a run that has not answered every input after this long")
	stall := fs.Duration("stall-timeout", 90*time.Second, "fail a run whose outputs have not grown for this long (includes the JVM's startup)")
	keep := fs.Bool("keep", false, "keep topics and state after each run")
	profile := fs.Bool("profile", false, "ours and floor write CPU and allocation profiles (cpu.pprof, mem.pprof) into each run's directory under --workdir")
	workload := fs.String("workload", "transactions", "throughput input: transactions (our Transaction schema, the single-key contract) or payments (payment_event.avsc with a device and an IP; every ours and kstreams processor then needs groups=N)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	bl := splitList(*brokers)
	if err := checkLoopback(bl); err != nil {
		return err
	}
	tp, err := ParseProcSpecs(*procs)
	if err != nil {
		return err
	}
	lp, err := ParseProcSpecs(*latProcs)
	if err != nil {
		return err
	}
	ents, err := parseInts(*entities)
	if err != nil {
		return fmt.Errorf("--entities: %w", err)
	}
	if *rounds < 1 || *rounds > 20 || *events < 1 || *events > 50_000_000 || *latRate < 1 || *latRate > 2_000_000 {
		return fmt.Errorf("--rounds 1..20, --events 1..50M and --latency-rate 1..2M, got %d, %d, %d", *rounds, *events, *latRate)
	}
	for _, p := range lp {
		if p.Kind == "floor" {
			return fmt.Errorf("--latency-processors: floor has no latency mode (its outputs carry no event time)")
		}
		if p.Groups > 0 {
			return fmt.Errorf("--latency-processors: %s: groups=N has no latency mode yet (throughput only)", p.Name)
		}
	}
	format, err := workloadFormat(*workload, tp)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the floor processor runs this binary: %w", err)
	}
	alt, err := parseVCAlt(*vcAlt)
	if err != nil {
		return err
	}
	env := procEnv{VC: *vc, VCAlt: alt}
	for _, p := range append(tp, lp...) {
		if _, ok := alt[p.Bin]; p.Bin != "" && !ok {
			return fmt.Errorf("processor %s: --vc-alt names no build %q", p.Name, p.Bin)
		}
		path := env.vcFor(p)
		switch p.Kind {
		case "kstreams":
			path = *jar
		case "floor":
			path = self
		}
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("processor %s needs %s: %w", p.Name, path, err)
		}
	}
	if *workDir == "" {
		d, err := os.MkdirTemp("", "velocity-bench-")
		if err != nil {
			return err
		}
		*workDir = d
	}
	if err := os.MkdirAll(*workDir, 0o755); err != nil {
		return err
	}
	if *out == "" {
		*out = filepath.Join(*workDir, "results.jsonl")
	}
	adm, cl, err := newAdmin(bl)
	if err != nil {
		return err
	}
	defer cl.Close()
	r := &runner{
		brokers: bl, adm: adm, workDir: *workDir, runTimeout: *timeout, stallTimeout: *stall, keep: *keep,
		tag: strconv.FormatInt(time.Now().Unix()%1_000_000, 36),
		env: procEnv{
			Brokers: strings.Join(bl, ","), VC: *vc, VCAlt: alt, Jar: *jar, Java: *java,
			JavaOpts: strings.Fields(*javaOpts), IdleTimeout: *idle, Checkpoint: *ckpt,
			VCExtra: strings.Fields(*vcExtra), Self: self, Profile: *profile,
		},
	}
	f, err := os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(os.Stderr, "velocity-bench: results to %s, logs under %s\n", *out, *workDir)
	var all []Result
	record := func(res Result) {
		all = append(all, res)
		b, err := json.Marshal(res)
		if err != nil {
			fmt.Fprintf(os.Stderr, "velocity-bench: result not recorded: %v\n", err)
		} else {
			_, _ = f.Write(append(b, '\n'))
		}
		fmt.Fprintln(os.Stderr, describe(res))
	}
	for round := 1; round <= *rounds; round++ {
		for _, n := range ents {
			if len(tp) == 0 {
				break
			}
			w := DefaultWorkload(n, *events)
			w.Format = format
			input, _, _, _, _, err := r.names("input")
			if err != nil {
				return err
			}
			if err := createTopics(ctx, adm, partitions, nil, input); err != nil {
				return err
			}
			took, err := produceAll(ctx, bl, input, w)
			if err != nil {
				return fmt.Errorf("produce %d events to %s: %w", w.Events, input, err)
			}
			fmt.Fprintf(os.Stderr, "round %d: produced %d events over %d entities to %s in %s (%.0f/s)\n",
				round, w.Events, n, input, took.Round(time.Millisecond), float64(w.Events)/took.Seconds())
			for _, p := range tp {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				var res Result
				if p.Groups > 0 {
					res = r.runGroupsThroughput(ctx, p, input, w.Events, n)
				} else {
					res = r.runThroughput(ctx, p, input, w.Events, n)
				}
				res.Round, res.ProduceSec = round, took.Seconds()
				record(res)
			}
			if !*keep {
				_ = deleteTopics(ctx, adm, input)
			}
		}
		for _, p := range lp {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			w := DefaultWorkload(*latEntities, 1)
			w.Seed += uint64(round) // fresh ids per round; the shape stays the same
			res := r.runLatency(ctx, p, w, *latRate, *latDur, *latSkip, 1000)
			res.Round = round
			record(res)
		}
	}
	fmt.Println(Report(all))
	return nil
}

// workloadFormat is the Workload.Format of --workload, checked against the throughput
// processors: payment records are read only by a groups=N run (and the floor, which
// passes any bytes through), Transaction records only by the single-key contract.
func workloadFormat(workload string, procs []ProcSpec) (string, error) {
	var format string
	switch workload {
	case "transactions":
	case FormatPayments:
		format = FormatPayments
	default:
		return "", fmt.Errorf("--workload %q: want transactions or payments", workload)
	}
	for _, p := range procs {
		switch {
		case p.Kind == "floor":
		case format == FormatPayments && p.Groups == 0:
			return "", fmt.Errorf("processor %s: --workload payments needs groups=N (1..%d) on every ours and kstreams processor", p.Name, MaxBenchGroups)
		case format == "" && p.Groups > 0:
			return "", fmt.Errorf("processor %s: groups=N reads the payments workload; add --workload payments", p.Name)
		}
	}
	return format, nil
}

// parseVCAlt parses --vc-alt: NAME=PATH pairs, comma-separated.
func parseVCAlt(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range splitList(s) {
		name, path, ok := strings.Cut(f, "=")
		if !ok || name == "" || path == "" || strings.ContainsAny(name, ":,") {
			return nil, fmt.Errorf("--vc-alt %q: want NAME=PATH", f)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--vc-alt names %q twice", name)
		}
		out[name] = path
	}
	return out, nil
}

func describe(r Result) string {
	s := fmt.Sprintf("round %d %-10s %-22s entities=%-7d events=%-8d out=%d dlq=%d unique=%d",
		r.Round, r.Mode, r.Processor, r.Entities, r.Events, r.Features, r.DeadLetters, r.Unique)
	if r.Mode == "throughput" {
		s += fmt.Sprintf(" %.0f ev/s wall=%.1fs startup=%.1fs", r.EventsPerSec, r.WallSec, r.StartupSec)
	} else {
		s += fmt.Sprintf(" rate=%d p50=%.0fms p99=%.0fms p999=%.0fms max=%.0fms worst=%v", r.Rate, r.P50Ms, r.P99Ms, r.P999Ms, r.MaxMs, r.WorstSeconds)
		if r.P99ToEmitMs > 0 || r.P99FromEmitMs > 0 {
			s += fmt.Sprintf(" p99 to input append=%.0fms, to emitted_at=%.0fms, emitted_at to output append=%.0fms", r.P99ToInputMs, r.P99ToEmitMs, r.P99FromEmitMs)
		}
	}
	if len(r.DeadLetterReasons) > 0 {
		s += fmt.Sprintf(" dead letters %v", r.DeadLetterReasons)
	}
	s += fmt.Sprintf(" rss=%.0fMiB cpu=%.1fs (%.2f s/M)", r.PeakRSSMiB, r.CPUSec, r.CPUSecPerMEvt)
	if st := r.Steady.String(); st != "" {
		s += " " + st
	}
	if r.Err != "" {
		s += " ERROR: " + r.Err + " (log " + r.ProcessLogPath + ")"
	}
	return s
}

func cmdSummarize(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("summarize", flag.ContinueOnError)
	in := fs.String("in", "", "results file(s) of compare, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var all []Result
	for fi, path := range splitList(*in) {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for line := 1; sc.Scan(); line++ {
			if len(sc.Bytes()) == 0 {
				continue // an early version wrote an empty line for a result it could not encode
			}
			var r Result
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				f.Close()
				return fmt.Errorf("%s:%d: %w", path, line, err)
			}
			// Rounds of different files are different rounds: ratios pair runs of
			// one round of one invocation only.
			r.Round += 1000 * fi
			all = append(all, r)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return err
		}
	}
	fmt.Println(Report(all))
	return nil
}

func cmdProduce(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	brokers := fs.String("brokers", "127.0.0.1:9092", "comma-separated loopback Kafka brokers")
	topic := fs.String("topic", "", "topic to create (4 partitions) and fill; required")
	events := fs.Int("events", 1_000_000, "events")
	entities := fs.Int("entities", 100_000, "Zipf entity count")
	workload := fs.String("workload", "transactions", "transactions (our Transaction schema) or payments (payment_event.avsc)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	format, err := workloadFormat(*workload, nil)
	if err != nil {
		return err
	}
	if *topic == "" {
		return fmt.Errorf("--topic is required")
	}
	bl := splitList(*brokers)
	if err := checkLoopback(bl); err != nil {
		return err
	}
	adm, cl, err := newAdmin(bl)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := createTopics(ctx, adm, partitions, nil, *topic); err != nil {
		return err
	}
	w := DefaultWorkload(*entities, *events)
	w.Format = format
	took, err := produceAll(ctx, bl, *topic, w)
	if err != nil {
		return err
	}
	fmt.Printf("produced %d events to %s in %s\n", *events, *topic, took)
	return nil
}

func cmdSeq(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("seq", flag.ContinueOnError)
	out := fs.String("out", "", "file to write; required")
	events := fs.Int("events", 1_000_000, "events")
	entities := fs.Int("entities", 100_000, "Zipf entity count")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("--out is required")
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := WriteSeq(bw, DefaultWorkload(*entities, *events)); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
