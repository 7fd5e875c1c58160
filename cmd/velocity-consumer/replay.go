package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/registry"
	"github.com/velocity-consumer/velocity-consumer/pkg/replay"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

const replayUsage = `velocity-consumer replay: backtest a topic range or a file through the live pipeline.

Each input partition runs through its own processor, configured by the same
flags as 'run', fed in offset order and flushed at the end of the range (the
live idle release never fires: --idle-timeout is ignored). The features values
are byte for byte those 'run' publishes for the same records.

Inputs (one of):
  --input-topic T [--from X] [--to Y] [--partitions 0,2] [--warm-up-from W]
        X, Y: an offset (from inclusive, to exclusive), an RFC 3339 time (the
        first offset whose record timestamp is at or after it), start or end
        (end = the last stable offset when the replay starts). Windows start
        empty at X unless --warm-up-from reads history before it silently.
  --input-file x.avro    an Avro object container file of Transactions
  --input-file x.jsonl   JSON lines with the Transaction field names, event_time
                         in Unix ms; partition 0, offset = 0-based record
                         position, source_topic = the file's base name

Outputs:
  --output topic:NAME | x.jsonl | x.parquet     features records
  --dlq    topic:NAME | x.jsonl                 dead letters (without it they
                                                are counted and reported only)
With re-keyed groups in --features, group g goes to topic:<--group-topic> or
NAME.g.jsonl / NAME.g.parquet, computed in memory as 'run' computes it.
Partitions are replayed in ascending order, each one's outputs in emit order.
Files are written as NAME.partial and renamed when complete; an interrupted
replay removes the .partial and exits non-zero.`

type replayFlags struct {
	brokers, inputTopic, inputFile   string
	from, to, warmUpFrom, partitions string
	output, dlq                      string
	quiet                            bool
	progressEvery                    time.Duration
	logLevel, logFormat              string
	pipe                             pipelineFlags
	conn                             connFlags

	clientOpts []kgo.Opt // from conn, for every Kafka client of the replay
}

func (r *replayFlags) register(e *envFlags) {
	e.String(&r.brokers, "brokers", "localhost:9092", "comma-separated Kafka bootstrap brokers (topic input or output)")
	e.String(&r.inputTopic, "input-topic", "", "topic of Avro Transaction records to replay")
	e.String(&r.inputFile, "input-file", "", "replay a file instead of a topic: NAME.avro (Avro container) or NAME.jsonl (JSON lines)")
	e.String(&r.from, "from", "start", "first record of the topic range: offset, RFC 3339 time, or start")
	e.String(&r.to, "to", "end", "end of the topic range (exclusive): offset, RFC 3339 time, or end")
	e.String(&r.warmUpFrom, "warm-up-from", "", "topic input: read from here (offset, RFC 3339 time or start) to --from without writing, so the range's windows hold the history before it; start reproduces the live values exactly (empty: the range starts with empty windows)")
	e.String(&r.partitions, "partitions", "", "comma-separated partitions of the topic to replay (empty: all)")
	e.String(&r.output, "output", "", "where features go: topic:NAME, NAME.jsonl or NAME.parquet")
	e.String(&r.dlq, "dlq", "", "where dead letters go: topic:NAME or NAME.jsonl (empty: count them only)")
	e.Bool(&r.quiet, "quiet", false, "no progress bar and no progress log lines")
	e.Duration(&r.progressEvery, "progress-interval", 10*time.Second, "how often to log progress when stderr is not a terminal")
	e.String(&r.logLevel, "log-level", "info", "debug, info, warn or error")
	e.String(&r.logFormat, "log-format", "console", "json or console")
	r.pipe.register(e)
	r.conn.register(e)
}

func cmdReplay(ctx context.Context, args []string) error {
	var r replayFlags
	e := newEnvFlags("replay", replayUsage)
	r.register(e)
	if err := e.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(r.logLevel, r.logFormat)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing useful to do on a failed log flush at exit
	return runReplay(ctx, &r, log)
}

func runReplay(ctx context.Context, r *replayFlags, log *zap.Logger) error {
	st, err := r.pipe.settings()
	if err != nil {
		return err
	}
	if r.output == "" {
		return errors.New("--output (VELOCITY_OUTPUT) is required: topic:NAME, NAME.jsonl or NAME.parquet")
	}
	if r.inputFile != "" && r.inputTopic != "" {
		return errors.New("give --input-topic or --input-file, not both")
	}
	if err := r.checkRange(); err != nil {
		return err
	}
	if r.inputFile != "" && (r.from != "start" || r.to != "end" || r.partitions != "" || r.warmUpFrom != "") {
		return errors.New("--from, --to, --partitions and --warm-up-from select a topic range; a file (--input-file) is always replayed whole")
	}
	if r.inputFile == "" {
		for _, spec := range []string{r.output, r.dlq} {
			if spec == "topic:"+r.inputTopic {
				return fmt.Errorf("%s is the input topic: a replay must not write into the range it reads", spec)
			}
		}
	}
	if r.pipe.idleTimeout > 0 {
		log.Debug("--idle-timeout is live-only; replay flushes at the end of the range instead")
	}

	if r.needsKafka() {
		if r.clientOpts, _, err = r.conn.clientOpts(log); err != nil {
			return err
		}
	} else if err := r.conn.validate(); err != nil {
		// A file-to-file replay connects to no broker, so it says nothing
		// about a connection; a mistake in the connection flags is still one.
		return err
	}
	kc, _ := r.conn.kafka()
	reg, err := r.conn.registryClient(kc)
	if err != nil {
		return err
	}
	if reg != nil && r.inputFile == "" && r.pipe.writerSchema != "" {
		return errors.New("--writer-schema and --schema-registry exclude each other: with a registry, each record names its writer schema")
	}

	src, writerSchema, err := openSource(ctx, r, st.writerSchema, log)
	if err != nil {
		return err
	}
	defer src.Close()
	var dec codec.Decoder
	if reg != nil && r.inputFile == "" {
		// Topic input with a registry is in the wire format; a file names
		// its own schema. replay.Run prepares each record first and waits out
		// a registry outage for up to Config.MaxPrepareWait (2 min) per record.
		if st.features != nil {
			dec = registry.NewDecoderWith(ctx, reg, st.limits, st.features.compile)
		} else {
			dec = registry.NewDecoder(ctx, reg, st.limits)
		}
	} else if dec, err = st.decoder(writerSchema); err != nil {
		return fmt.Errorf("writer schema: %w", err)
	}

	outs := &outputs{log: log}
	defer outs.close()
	features, err := outs.open(ctx, r, r.output, st, false)
	if err != nil {
		return err
	}
	if topic, ok := strings.CutPrefix(r.output, "topic:"); ok && reg != nil {
		// Features on a topic go out as 'run' writes them: in the wire format.
		out := schemas.VelocityFeatures
		if st.features != nil {
			out = st.features.schema
		}
		subject, err := r.conn.outputSubject(topic, out)
		if err != nil {
			return err
		}
		_, prefix, err := setupRegistry(ctx, reg, subject, out, nil, st.limits, log)
		if err != nil {
			return err
		}
		outs.kafka.SetFeaturesPrefix(prefix)
	}
	groups, err := outs.openGroups(ctx, r, st, reg, log)
	if err != nil {
		return err
	}
	var dead replay.Sink
	if r.dlq != "" {
		if dead, err = outs.open(ctx, r, r.dlq, st, true); err != nil {
			return err
		}
	}

	prog := replay.NewProgress(src)
	stopProgress := startProgress(ctx, prog, r.quiet, r.progressEvery, log)
	start := time.Now()
	res, err := replay.Run(ctx, src, replay.Config{
		Pipeline: pipeline.Config{Specs: st.specs, Window: st.window, Watermark: st.watermark, Late: st.late, Decoder: dec, Features: st.features.engineSpec()},
		Features: features,
		Dead:     dead,
		Groups:   groups,
		Progress: prog,
		OnPrepareRetry: func(p int32, offset int64, attempt int, err error) {
			if attempt == 1 || attempt%10 == 0 {
				log.Warn("schema registry not answering: the replay waits for it (up to 2 min per record)",
					zap.Int32("partition", p), zap.Int64("offset", offset), zap.Int("attempt", attempt), zap.Error(err))
			}
		},
	})
	stopProgress()
	if err == nil {
		err = outs.commit(ctx)
	}
	if err != nil {
		outs.abort()
		if ctx.Err() != nil {
			what := "no output file was completed (.partial files removed)"
			if outs.kafka != nil {
				// A topic cannot take records back: say so rather than let
				// the user believe the topic is clean.
				what = "the output topic holds a partial replay; any output file was removed"
			}
			return fmt.Errorf("interrupted after %d records; %s: %w", res.Records, what, ctx.Err())
		}
		return err
	}
	elapsed := time.Since(start)
	fields := []zap.Field{
		zap.String("source", src.Topic()), zap.Any("partitions", res.Partitions),
		zap.Int64("records", res.Records), zap.Int64("warm_up_records", res.WarmUp), zap.Int64("features", res.Features), zap.Int64("dead_letters", res.Dead),
		zap.Duration("elapsed", elapsed), zap.Float64("records_per_second", float64(res.Records)/max(elapsed.Seconds(), 1e-9)),
		zap.String("output", r.output),
	}
	for _, reason := range res.Reasons() {
		fields = append(fields, zap.Int64("dead_"+string(reason), res.ByReason[reason]))
	}
	for _, g := range res.Groups {
		fields = append(fields, zap.Dict("group_"+g.Name, zap.Int64("features", g.Features), zap.Int64("dead_letters", g.Dead), zap.Uint64("without_key", g.KeyMissing),
			zap.Int("peak_pending_events", g.PeakPending), zap.Int64("hop_bytes_spooled", g.Spooled)))
	}
	log.Info("replay complete", fields...)
	if res.KeyMismatch > 0 {
		log.Warn("input records keyed by something other than their entity_id: an entity's events may be spread over partitions and its features computed from part of them",
			zap.Uint64("records", res.KeyMismatch))
	}
	if res.CapEvicted > 0 {
		// As the live service warns: the features of an entity seen again
		// after its eviction lack its earlier history.
		log.Warn("--max-entities reached: evicted least recently active entities; raise it (0 = unlimited) for features with their full history",
			zap.Uint64("evicted", res.CapEvicted), zap.Int("max_entities", r.pipe.maxEntities))
	}
	if dead == nil && res.Dead > 0 {
		log.Warn("dead letters were counted but not written: give --dlq to keep them", zap.Int64("dead_letters", res.Dead))
	}
	return nil
}

// needsKafka says whether the replay talks to brokers: a topic input or a
// topic output. A file replayed to files does not.
func (r *replayFlags) needsKafka() bool {
	return r.inputFile == "" || strings.HasPrefix(r.output, "topic:") || strings.HasPrefix(r.dlq, "topic:")
}

// checkRange refuses bounds that are out of order where that is known
// without the broker: a --from after --to (an empty range, surely a mistake)
// or a --warm-up-from after --from.
func (r *replayFlags) checkRange() error {
	from, err1 := replay.ParseBound(r.from)
	to, err2 := replay.ParseBound(r.to)
	if err1 != nil || err2 != nil {
		return nil // reported with the flag's name when the source opens
	}
	if !replay.NotAfter(from, to) {
		return fmt.Errorf("--from %s is after --to %s: the range would be empty", r.from, r.to)
	}
	if r.warmUpFrom != "" {
		if w, err := replay.ParseBound(r.warmUpFrom); err == nil && !replay.NotAfter(w, from) {
			return fmt.Errorf("--warm-up-from %s is after --from %s: the warm-up reads the records before the range", r.warmUpFrom, r.from)
		}
	}
	return nil
}

// openSource opens the input and returns the writer schema its values use.
func openSource(ctx context.Context, r *replayFlags, writerSchema string, log *zap.Logger) (replay.Source, string, error) {
	switch {
	case r.inputFile != "" && strings.HasSuffix(r.inputFile, ".jsonl"):
		src, err := replay.OpenJSONL(r.inputFile)
		// Values built from JSON lines are in our own schema.
		return src, "", err
	case r.inputFile != "" && strings.HasSuffix(r.inputFile, ".avro"):
		src, err := replay.OpenOCF(r.inputFile)
		if err != nil {
			return nil, "", err
		}
		if writerSchema != "" {
			log.Warn("--writer-schema ignored: an Avro container file carries its own writer schema")
		}
		return src, src.WriterSchema(), nil
	case r.inputFile != "":
		return nil, "", fmt.Errorf("--input-file %s: want a .avro (Avro container) or .jsonl (JSON lines) file", r.inputFile)
	case r.inputTopic == "":
		return nil, "", errors.New("give --input-topic (with --from/--to) or --input-file")
	}
	parts, err := parsePartitions(r.partitions)
	if err != nil {
		return nil, "", err
	}
	brokers := splitList(r.brokers)
	if len(brokers) == 0 {
		return nil, "", errors.New("--brokers (VELOCITY_BROKERS) is empty: give host:port of at least one broker")
	}
	from, err := replay.ParseBound(r.from)
	if err != nil {
		return nil, "", fmt.Errorf("--from (VELOCITY_FROM): %w", err)
	}
	to, err := replay.ParseBound(r.to)
	if err != nil {
		return nil, "", fmt.Errorf("--to (VELOCITY_TO): %w", err)
	}
	cfg := replay.TopicConfig{Brokers: brokers, Topic: r.inputTopic, Partitions: parts, From: from, To: to, ClientOpts: r.clientOpts}
	if r.warmUpFrom != "" {
		w, err := replay.ParseBound(r.warmUpFrom)
		if err != nil {
			return nil, "", fmt.Errorf("--warm-up-from (VELOCITY_WARM_UP_FROM): %w", err)
		}
		cfg.WarmUpFrom = &w
	}
	src, err := replay.OpenTopic(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	for _, p := range src.Partitions() {
		rg := src.Range(p)
		log.Info("partition range", zap.Int32("partition", p), zap.Int64("warm_up_from", rg.WarmUp), zap.Int64("from", rg.From), zap.Int64("to", rg.To))
		if rg.Truncated {
			log.Warn("the range starts before the partition's log start: retention deleted those records, and the replay begins at the log start",
				zap.Int32("partition", p), zap.Int64("log_start", min(rg.WarmUp, rg.From)))
		}
	}
	return src, writerSchema, nil
}

func parsePartitions(s string) ([]int32, error) {
	var out []int32
	for _, f := range splitList(s) {
		p, err := strconv.ParseInt(f, 10, 32)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("--partitions (VELOCITY_PARTITIONS) %q: want comma-separated partition numbers such as 0,2", s)
		}
		out = append(out, int32(p))
	}
	return out, nil
}

// outputs opens the sinks and commits or aborts them together.
type outputs struct {
	log   *zap.Logger
	sinks []replay.Sink
	kafka *replay.KafkaSink // shared by topic:… features and dead letters
	done  bool
}

func (o *outputs) open(ctx context.Context, r *replayFlags, spec string, st settings, dead bool) (replay.Sink, error) {
	flagName := "--output"
	if dead {
		flagName = "--dlq"
	}
	var (
		s   replay.Sink
		err error
	)
	switch {
	case strings.HasPrefix(spec, "topic:"):
		topic := strings.TrimPrefix(spec, "topic:")
		if topic == "" {
			return nil, fmt.Errorf("%s %q: topic: needs a name", flagName, spec)
		}
		if o.kafka == nil {
			host, _ := os.Hostname()
			if o.kafka, err = replay.NewKafkaSink(ctx, splitList(r.brokers), host, r.clientOpts...); err != nil {
				return nil, err
			}
			o.kafka.SetBuild(readBuildInfo().header())
			if st.features != nil {
				o.kafka.SetDefinition(st.features.version)
			}
			o.sinks = append(o.sinks, o.kafka)
		}
		if err := o.kafka.EnsureTopic(ctx, flagName, topic, r.inputTopic); err != nil {
			return nil, err
		}
		if dead {
			o.kafka.SetDLQTopic(topic)
		} else {
			o.kafka.SetFeaturesTopic(topic)
		}
		return o.kafka, nil
	case strings.HasSuffix(spec, ".jsonl") && dead:
		s, err = replay.NewDeadJSONLSink(spec)
	case strings.HasSuffix(spec, ".jsonl") && st.features != nil:
		s, err = replay.NewFlatJSONLSink(spec, st.features.schema)
	case strings.HasSuffix(spec, ".jsonl"):
		s, err = replay.NewJSONLSink(spec)
	case strings.HasSuffix(spec, ".parquet") && !dead && st.features != nil:
		s, err = replay.NewFlatParquetSink(spec, st.features.schema, st.features.version)
	case strings.HasSuffix(spec, ".parquet") && !dead:
		s, err = replay.NewParquetSink(spec, st.specs)
	case dead:
		return nil, fmt.Errorf("--dlq %q: want topic:NAME or NAME.jsonl", spec)
	default:
		return nil, fmt.Errorf("--output %q: want topic:NAME, NAME.jsonl or NAME.parquet", spec)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	o.sinks = append(o.sinks, s)
	return s, nil
}

// openGroups opens the outputs of the definition's re-keyed groups beside
// --output: on a topic, the group's topic from --group-topic (registered with
// the group's schema under a registry, as 'run' does); in a file NAME.EXT, the
// file NAME.<group>.EXT.
func (o *outputs) openGroups(ctx context.Context, r *replayFlags, st settings, reg *sr.Client, log *zap.Logger) ([]replay.Group, error) {
	if st.features == nil || len(st.features.groups) == 0 {
		return nil, nil
	}
	var gs []replay.Group
	for _, g := range st.features.groups {
		var (
			s   replay.Sink
			err error
		)
		if topic, ok := strings.CutPrefix(r.output, "topic:"); ok {
			name, err := groupTopic(r.pipe.groupTopic, topic, g.name)
			if err != nil {
				return nil, err
			}
			if name == r.inputTopic {
				return nil, fmt.Errorf("--group-topic gives group %s the input topic %s: a replay must not write into the range it reads", g.name, name)
			}
			if err := o.kafka.EnsureTopic(ctx, "--group-topic", name, r.inputTopic); err != nil {
				return nil, err
			}
			ks := o.kafka.Sibling(name)
			if reg != nil {
				subject, err := r.conn.outputSubject(name, g.schema)
				if err != nil {
					return nil, err
				}
				_, prefix, err := setupRegistry(ctx, reg, subject, g.schema, nil, st.limits, log)
				if err != nil {
					return nil, fmt.Errorf("group %s: %w", g.name, err)
				}
				ks.SetFeaturesPrefix(prefix)
			}
			s = ks
		} else {
			ext := filepath.Ext(r.output)
			path := strings.TrimSuffix(r.output, ext) + "." + g.name + ext
			switch ext {
			case ".jsonl":
				s, err = replay.NewFlatJSONLSink(path, g.schema)
			case ".parquet":
				s, err = replay.NewFlatParquetSink(path, g.schema, st.features.version)
			default:
				err = fmt.Errorf("want NAME.jsonl or NAME.parquet")
			}
			if err != nil {
				return nil, fmt.Errorf("--output %s, group %s: %w", r.output, g.name, err)
			}
		}
		o.sinks = append(o.sinks, s)
		gs = append(gs, replay.Group{Name: g.name, Spec: g.spec, Features: s})
	}
	return gs, nil
}

func (o *outputs) commit(ctx context.Context) error {
	var errs []error
	for _, s := range o.sinks {
		errs = append(errs, s.Commit(ctx))
	}
	o.done = true
	return errors.Join(errs...)
}

func (o *outputs) abort() {
	for _, s := range o.sinks {
		if err := s.Abort(); err != nil {
			o.log.Warn("cleaning up an unfinished output", zap.Error(err))
		}
	}
	o.done = true
}

// close aborts whatever was opened but neither committed nor aborted (an
// early return).
func (o *outputs) close() {
	if !o.done {
		o.abort()
	}
	if o.kafka != nil {
		o.kafka.Close()
	}
}
