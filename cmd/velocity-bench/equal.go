package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// cmdEqual checks that ours and the Kafka Streams peer compute the same features: on one seeded
// workload, every output compared field by field per input (partition, offset), every
// difference explained by a model of each side's semantics (equalcmp.go).
func cmdEqual(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("equal", flag.ContinueOnError)
	brokers := fs.String("brokers", "127.0.0.1:9092", "comma-separated loopback Kafka brokers")
	events := fs.Int("events", 200_000, "events of the workload (produced before either processor starts)")
	entities := fs.Int("entities", 100_000, "Zipf entity count")
	vc := fs.String("vc", "/tmp/vb-bin/vc-eq", "velocity-consumer binary")
	jar := fs.String("jar", "bench/kstreams/target/velocity-kstreams.jar", "Kafka Streams peer (cd bench/kstreams && mvn -q package)")
	java := fs.String("java", "java", "java executable (17+)")
	javaOpts := fs.String("java-opts", "-Xmx1g -XX:+UseG1GC", "JVM options for the peer, space-separated")
	// Streams applies every event on arrival and counts out-of-order ones into their
	// own bucket; the closest our contract comes is no lateness (every event released
	// on arrival, nothing buffered) with late events applied instead of dead-lettered.
	vcExtra := fs.String("vc-args", "--late apply", "extra flags for our run (lateness is always 0), space-separated")
	ckpt := fs.String("checkpoint", "memory", "our checkpoint store: file (fresh directory) or memory")
	examples := fs.Int("examples", 5, "differing records to show")
	workDir := fs.String("workdir", "", "scratch directory for logs and the report (default a new directory under $TMPDIR)")
	timeout := fs.Duration("run-timeout", 10*time.Minute, "give up on a processor that has not answered every input after this long")
	stall := fs.Duration("stall-timeout", 90*time.Second, "fail a run whose outputs have not grown for this long (includes the JVM's startup)")
	keep := fs.Bool("keep", false, "keep topics and state")
	if err := fs.Parse(args); err != nil {
		return err
	}
	bl := splitList(*brokers)
	if err := checkLoopback(bl); err != nil {
		return err
	}
	if *events < 1 || *events > 2_000_000 || *entities < 2 {
		return fmt.Errorf("--events 1..2M and --entities > 1, got %d, %d", *events, *entities)
	}
	for _, p := range []string{*vc, *jar} {
		if _, err := os.Stat(p); err != nil {
			return err
		}
	}
	specs, err := window.ParseSpecs(window.DefaultSpecs)
	if err != nil {
		return err
	}
	if *workDir == "" {
		if *workDir, err = os.MkdirTemp("", "velocity-bench-equal-"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(*workDir, 0o755); err != nil {
		return err
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
			Brokers: strings.Join(bl, ","), VC: *vc, Jar: *jar, Java: *java,
			JavaOpts: strings.Fields(*javaOpts), IdleTimeout: 200 * time.Millisecond, Checkpoint: *ckpt,
			VCExtra: strings.Fields(*vcExtra),
		},
	}
	fmt.Fprintf(os.Stderr, "velocity-bench equal: logs and report under %s\n", *workDir)

	w := DefaultWorkload(*entities, *events)
	input, _, _, _, _, err := r.names("equal-input")
	if err != nil {
		return err
	}
	if err := createTopics(ctx, adm, partitions, nil, input); err != nil {
		return err
	}
	if !*keep {
		defer func() { _ = deleteTopics(context.Background(), adm, input) }()
	}
	took, err := produceAll(ctx, bl, input, w)
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	fmt.Fprintf(os.Stderr, "produced %d events over %d entities to %s in %s\n", w.Events, w.Entities, input, took.Round(time.Millisecond))
	inputs, err := readInputs(ctx, bl, input, w.Events, 2*time.Minute)
	if err != nil {
		return err
	}

	var outs [2]map[srcKey]outRec
	for i, spec := range []ProcSpec{{Kind: "ours", Name: "ours:late-apply"}, {Kind: "kstreams", Name: "kstreams"}} {
		res, err := r.collect(ctx, spec, input, w.Events)
		if err != nil {
			return fmt.Errorf("%s: %w", spec.Name, err)
		}
		fmt.Fprintf(os.Stderr, "%s: %d outputs read (%d duplicate, %d of them with a different value, %d undecodable)\n",
			spec.Name, len(res.recs), res.dups, res.dupsDiffer, res.bad)
		outs[i] = res.recs
	}
	rep := compareOutputs(specs, input, inputs, outs[0], outs[1], *examples)
	fmt.Print(rep.text())
	b, _ := json.MarshalIndent(rep, "", "  ")
	path := filepath.Join(*workDir, "equal.json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "report written to %s\n", path)
	return nil
}

// collected is one processor's outputs, keyed by the input they answer.
type collected struct {
	recs             map[srcKey]outRec
	dups, dupsDiffer int
	bad              int
}

// collect runs p over input until every input has an output, stops it, and reads its
// output and dead-letter topics completely.
func (r *runner) collect(ctx context.Context, p ProcSpec, input string, want int) (collected, error) {
	_, output, dlq, group, dir, err := r.names(safeName(p.Name))
	if err != nil {
		return collected{}, err
	}
	if err := createTopics(ctx, r.adm, partitions, outputConfigs, output, dlq); err != nil {
		return collected{}, err
	}
	defer r.cleanup(group, dir, output, dlq)
	cmd, err := r.env.command(p, input, output, dlq, group, dir)
	if err != nil {
		return collected{}, err
	}
	start := time.Now()
	c, err := startChild(cmd)
	if err != nil {
		return collected{}, err
	}
	werr := r.waitOutputs(ctx, c, output, dlq, want, r.runTimeout)
	c.stop(60 * time.Second)
	if werr != nil {
		return collected{}, fmt.Errorf("%w (log %s)", werr, filepath.Join(dir, "processor.log"))
	}
	fmt.Fprintf(os.Stderr, "%s answered %d inputs in %s\n", p.Name, want, time.Since(start).Round(time.Millisecond))
	return readOutputs(ctx, r.brokers, output, dlq, want, 3*time.Minute)
}

// readInputs reads the whole input topic back and decodes it: the ground truth of
// what each (partition, offset) holds.
func readInputs(ctx context.Context, brokers []string, topic string, want int, timeout time.Duration) ([]inEvent, error) {
	dec, err := codec.NewDecoder("", codec.DefaultLimits())
	if err != nil {
		return nil, err
	}
	out := make([]inEvent, 0, want)
	var tx codec.Transaction
	var derr error
	if err := readFromStart(ctx, brokers, false, []string{topic}, want, timeout, func(rec *kgo.Record) {
		if rej := dec.Decode(rec.Value, 0, false, &tx); rej != nil && derr == nil {
			derr = fmt.Errorf("input p%d@%d does not decode: %v", rec.Partition, rec.Offset, rej)
		}
		out = append(out, inEvent{Key: srcKey{rec.Partition, rec.Offset}, ID: tx.EventID, Entity: tx.EntityID, T: tx.EventTime, Amount: tx.AmountMinor})
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	return out, nil
}

// readOutputs reads a run's features and dead letters (read_committed) until it has
// want of them. A second output for one input is counted, and compared with the first.
func readOutputs(ctx context.Context, brokers []string, output, dlq string, want int, timeout time.Duration) (collected, error) {
	res := collected{recs: make(map[srcKey]outRec, want)}
	err := readFromStart(ctx, brokers, true, []string{output, dlq}, want, timeout, func(rec *kgo.Record) {
		var k srcKey
		var o outRec
		if rec.Topic == dlq {
			k.P, k.O = dlqSource(rec)
			o.Dead = true
			for _, h := range rec.Headers {
				if h.Key == codec.HeaderReason {
					o.Reason = string(h.Value)
				}
			}
		} else {
			f, err := codec.DecodeFeatures(rec.Value)
			if err != nil {
				res.bad++
				return
			}
			k, o.F = srcKey{f.SourcePartition, f.SourceOffset}, f
		}
		if first, dup := res.recs[k]; dup {
			res.dups++
			if len(diffFields(first, o)) > 0 {
				res.dupsDiffer++
			}
			return
		}
		res.recs[k] = o
	})
	return res, err
}
