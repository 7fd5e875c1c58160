package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/kafkaconn"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// envFlags wraps a FlagSet so that every flag also reads VELOCITY_<NAME>
// (upper case, dashes as underscores). A flag given on the command line wins
// over the environment, which wins over the default.
type envFlags struct {
	fs  *flag.FlagSet
	env map[string]string // flag name -> env var
}

func newEnvFlags(name, usage string) *envFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// --help is asked for: it goes to stdout (so that 'run --help | less'
	// shows it) and the command exits 0. Mistakes are returned as errors.
	fs.SetOutput(os.Stdout)
	e := &envFlags{fs: fs, env: map[string]string{}}
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "%s\n\nFlags (each also read from the environment variable shown):\n", usage)
		fs.VisitAll(func(f *flag.Flag) {
			typ, help := flag.UnquoteUsage(f)
			fmt.Fprintf(out, "  --%s %s\n", f.Name, typ)
			fmt.Fprintf(out, "        %s", strings.ReplaceAll(help, "\n", "\n        "))
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
				fmt.Fprintf(out, " (default %q)", f.DefValue)
			}
			fmt.Fprintf(out, "\n        env %s\n", e.env[f.Name])
		})
	}
	return e
}

// badFlagValue matches the flag package's message for a value that does not parse.
var badFlagValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([^:]+): (.*)$`)

// explain rewords a command-line error of the flag package as the other
// configuration errors read: the flag, its variable, and where to look.
func (e *envFlags) explain(err error) error {
	msg := err.Error()
	if m := badFlagValue.FindStringSubmatch(msg); m != nil {
		if env, ok := e.env[m[2]]; ok {
			return fmt.Errorf("--%s (%s) %q: %s (see --help)", m[2], env, m[1], wantOf(e.fs.Lookup(m[2]), m[3]))
		}
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return fmt.Errorf("unknown flag --%s (see --help for the flags)", strings.TrimPrefix(name, "-"))
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Errorf("--%s needs a value (see --help)", strings.TrimPrefix(name, "-"))
	}
	return fmt.Errorf("%w (see --help)", err)
}

// wantOf says what a flag's value must look like, in place of the flag
// package's bare "parse error".
func wantOf(f *flag.Flag, reason string) string {
	g, ok := f.Value.(flag.Getter)
	if !ok || reason != "parse error" {
		return reason
	}
	switch g.Get().(type) {
	case time.Duration:
		return "want a duration such as 500ms, 2s, 5m or 24h"
	case bool:
		return "want true or false"
	case int, int64:
		return "want a whole number"
	}
	return reason
}

func envName(flagName string) string {
	return "VELOCITY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (e *envFlags) String(p *string, name, def, usage string) {
	e.fs.StringVar(p, name, def, usage)
	e.env[name] = envName(name)
}

func (e *envFlags) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	e.fs.DurationVar(p, name, def, usage)
	e.env[name] = envName(name)
}

func (e *envFlags) Int(p *int, name string, def int, usage string) {
	e.fs.IntVar(p, name, def, usage)
	e.env[name] = envName(name)
}

func (e *envFlags) Int64(p *int64, name string, def int64, usage string) {
	e.fs.Int64Var(p, name, def, usage)
	e.env[name] = envName(name)
}

func (e *envFlags) Bool(p *bool, name string, def bool, usage string) {
	e.fs.BoolVar(p, name, def, usage)
	e.env[name] = envName(name)
}

// Parse reads args, then fills every flag not given on the command line from
// its environment variable. Errors name both the flag and the variable.
func (e *envFlags) Parse(args []string) error {
	// The flag package prints a mistake and the whole usage; only --help asks
	// for the usage, and a mistake gets one line that names the variable too.
	out := e.fs.Output()
	e.fs.SetOutput(io.Discard)
	err := e.fs.Parse(args)
	e.fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		e.fs.Usage()
		return err
	case err != nil:
		return e.explain(err)
	}
	if e.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with --; see --help)", e.fs.Arg(0))
	}
	given := map[string]bool{}
	e.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	names := make([]string, 0, len(e.env))
	for n := range e.env {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if given[n] {
			continue
		}
		if v, ok := os.LookupEnv(e.env[n]); ok {
			if err := e.fs.Set(n, v); err != nil {
				return fmt.Errorf("environment %s=%q (flag --%s): %s", e.env[n], v, n, wantOf(e.fs.Lookup(n), err.Error()))
			}
		}
	}
	return nil
}

// pipelineFlags are the semantics flags shared by run and replay, so both
// modes are configured identically and produce identical features.
type pipelineFlags struct {
	windows         string
	allowedLateness time.Duration
	late            string
	idleTimeout     time.Duration
	dedupeHorizon   time.Duration
	maxDedupeIDs    int
	maxEntities     int
	entityTTL       time.Duration
	maxRecordBytes  int
	writerSchema    string
	maxAhead        time.Duration
	minEventTime    string
	features        string
	groupTopic      string
}

func (p *pipelineFlags) register(e *envFlags) {
	e.String(&p.windows, "windows", window.DefaultSpecs, "comma-separated windows W:b (window length : bucket width); W must be a multiple of b")
	e.Duration(&p.allowedLateness, "allowed-lateness", time.Second, "how far behind the partition's newest event time an event may be before it is late")
	e.String(&p.late, "late", "dlq", "what to do with late events: dlq (dead-letter, uncounted) or apply (count it if its bucket is still retained and it is at most the largest window behind the watermark, emit with late=true)")
	e.Duration(&p.idleTimeout, "idle-timeout", 2*time.Second, "live mode: release every pending event of a partition that delivered nothing for this long, once the broker confirms it holds nothing more for it (0 disables; replay never uses it)")
	e.Duration(&p.dedupeHorizon, "dedupe-horizon", 24*time.Hour, "remember accepted event_ids for this much event time to dead-letter duplicates")
	e.Int(&p.maxDedupeIDs, "max-dedupe-ids", 0, "per partition: most event_ids remembered for --dedupe-horizon (about 40-50 bytes each; the set grows with rate × horizon); beyond it the oldest accepted are forgotten first and a duplicate of one is accepted (0 = unlimited)")
	e.Int(&p.maxEntities, "max-entities", 5_000_000, "per partition: most entities kept; beyond it the least recently active is evicted, with a warning and a metric (0 = unlimited)")
	e.Duration(&p.entityTTL, "entity-ttl", 7*24*time.Hour, "how far back ms_since_previous reaches (null beyond it); an entity whose windows are empty is kept this long after its last event")
	e.Int(&p.maxRecordBytes, "max-record-bytes", 1<<20, "input values larger than this are dead-lettered as too_large")
	e.String(&p.writerSchema, "writer-schema", "", "path to the Avro schema the input was written with, if it is not schemas/transaction.avsc (fields may be added or reordered)")
	e.Duration(&p.maxAhead, "max-ahead", 24*time.Hour, "dead-letter events more than this far ahead of the partition's newest event time as invalid:event_time")
	e.String(&p.minEventTime, "min-event-time", "2000-01-01T00:00:00Z", "dead-letter events before this RFC 3339 time as invalid:event_time")
	e.String(&p.features, "features", "", "path to a feature definition (YAML or JSON, docs/features.md): the input's own schema mapped by field paths, its windows and features; the output is its generated flat record (without it: schemas/velocity_features.avsc over --windows)")
	e.String(&p.groupTopic, "group-topic", groupTopicTemplate, "with re-keyed groups in --features: the output topic of each, {output} = the output topic's name, {group} = the group's (docs/repartition.md)")
}

func checkEntityTTL(ttl time.Duration, specs []window.Spec) error {
	var largest int64
	for _, sp := range specs {
		largest = max(largest, sp.WindowMs)
	}
	if ttl.Milliseconds() < largest {
		return fmt.Errorf("--entity-ttl (VELOCITY_ENTITY_TTL) %s is shorter than the largest window (%d ms): entities would be dropped while their windows still count", ttl, largest)
	}
	return nil
}

// settings is the validated form of pipelineFlags.
type settings struct {
	specs        []window.Spec
	window       window.Options
	watermark    watermark.Config
	late         pipeline.LatePolicy
	writerSchema string
	limits       codec.Limits
	// features is --features (nil without it): then specs are its windows.
	features *featureSet
}

func (p *pipelineFlags) settings() (settings, error) {
	var s settings
	var err error
	if s.specs, err = window.ParseSpecs(p.windows); err != nil {
		return s, fmt.Errorf("--windows (VELOCITY_WINDOWS): %w", err)
	}
	if p.allowedLateness < 0 {
		return s, errors.New("--allowed-lateness (VELOCITY_ALLOWED_LATENESS) must be zero or positive")
	}
	if s.late, err = pipeline.ParseLatePolicy(p.late); err != nil {
		return s, fmt.Errorf("--late (VELOCITY_LATE): %w", err)
	}
	if p.idleTimeout < 0 {
		return s, errors.New("--idle-timeout (VELOCITY_IDLE_TIMEOUT) must be zero (off) or positive")
	}
	if p.dedupeHorizon <= 0 {
		return s, errors.New("--dedupe-horizon (VELOCITY_DEDUPE_HORIZON) must be positive")
	}
	if p.maxEntities < 0 {
		return s, errors.New("--max-entities (VELOCITY_MAX_ENTITIES) must be zero (unlimited) or positive")
	}
	if p.maxDedupeIDs < 0 {
		return s, errors.New("--max-dedupe-ids (VELOCITY_MAX_DEDUPE_IDS) must be zero (unlimited) or positive")
	}
	if err := checkEntityTTL(p.entityTTL, s.specs); err != nil {
		return s, err
	}
	if p.maxRecordBytes <= 0 {
		return s, errors.New("--max-record-bytes (VELOCITY_MAX_RECORD_BYTES) must be positive")
	}
	if p.maxAhead <= 0 {
		return s, errors.New("--max-ahead (VELOCITY_MAX_AHEAD) must be positive")
	}
	minT, err := time.Parse(time.RFC3339, p.minEventTime)
	if err != nil {
		return s, fmt.Errorf("--min-event-time (VELOCITY_MIN_EVENT_TIME): %w", err)
	}
	if p.writerSchema != "" {
		b, err := os.ReadFile(p.writerSchema)
		if err != nil {
			return s, fmt.Errorf("--writer-schema (VELOCITY_WRITER_SCHEMA): %w", err)
		}
		s.writerSchema = string(b)
		// Under --features the definition's mapping reads it (checked there).
		if p.features == "" {
			if _, err := codec.NewDecoder(s.writerSchema, codec.DefaultLimits()); err != nil {
				return s, fmt.Errorf("--writer-schema %s: %w", p.writerSchema, err)
			}
		}
	}
	s.window = window.Options{MaxEntities: p.maxEntities, HistoryTTLMs: p.entityTTL.Milliseconds()}
	s.watermark = watermark.Config{
		AllowedLateness: p.allowedLateness.Milliseconds(),
		DedupeHorizon:   p.dedupeHorizon.Milliseconds(),
		MaxDedupeIDs:    p.maxDedupeIDs,
		IdleTimeout:     p.idleTimeout,
	}
	s.limits = codec.Limits{MaxRecordBytes: p.maxRecordBytes, MinEventTime: minT.UnixMilli(), MaxAheadMs: p.maxAhead.Milliseconds()}
	if p.features != "" {
		if p.windows != window.DefaultSpecs {
			return s, errFeaturesWindows
		}
		if s.features, s.writerSchema, err = loadFeatures(p.features, s.writerSchema, s.limits); err != nil {
			return s, err
		}
		s.specs = s.features.spec.Windows
		if err := checkEntityTTL(p.entityTTL, s.specs); err != nil {
			return s, err
		}
		for _, g := range s.features.groups {
			if err := checkEntityTTL(p.entityTTL, g.spec.Windows); err != nil {
				return s, fmt.Errorf("group %s: %w", g.name, err)
			}
		}
		if len(s.features.groups) > 0 && s.late == pipeline.LateApply {
			return s, errors.New("--late=apply cannot be used with re-keyed groups (groups: in --features): a late event counted at its input partition would reach the groups' second stages below what they have released; use --late=dlq")
		}
	}
	return s, nil
}

// decoder is the input decoder for records written with writerSchema ("" is
// ours): the definition's mapping under --features, else our codec.
func (s *settings) decoder(writerSchema string) (codec.Decoder, error) {
	if s.features != nil {
		return s.features.decoder(writerSchema)
	}
	return codec.NewDecoder(writerSchema, s.limits)
}

// openStore turns --checkpoint-store into a Store. The kafka store needs the
// brokers and the group: its default topic is derived from the group, so two
// deployments never share snapshots.
// opts are the connection options (TLS, SASL) of --brokers.
func openStore(spec string, brokers []string, group string, opts ...kgo.Opt) (checkpoint.Store, error) {
	switch {
	case spec == "memory":
		return checkpoint.NewMemoryStore(), nil
	case strings.HasPrefix(spec, "file://"):
		dir := strings.TrimPrefix(spec, "file://")
		if dir == "" {
			return nil, errors.New("--checkpoint-store (VELOCITY_CHECKPOINT_STORE): file:// needs a directory, e.g. file:///var/lib/velocity")
		}
		abs, err := filepath.Abs(dir)
		if err == nil {
			var st *checkpoint.FileStore
			if st, err = checkpoint.NewFileStore(abs); err == nil {
				return st, nil
			}
		}
		return nil, fmt.Errorf("--checkpoint-store (VELOCITY_CHECKPOINT_STORE) %s: %w (the directory must be creatable and writable)", spec, err)
	case spec == "kafka" || strings.HasPrefix(spec, "kafka://"):
		topic := strings.TrimPrefix(strings.TrimPrefix(spec, "kafka"), "://")
		if topic == "" {
			topic = checkpoint.DefaultKafkaTopic(group)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st, err := checkpoint.NewKafkaStore(ctx, checkpoint.KafkaConfig{Brokers: brokers, Topic: topic, ClientOpts: opts})
		if err != nil {
			return nil, fmt.Errorf("--checkpoint-store (VELOCITY_CHECKPOINT_STORE) %s: %w", spec, kafkaconn.Explain(err))
		}
		return st, nil
	}
	return nil, fmt.Errorf("--checkpoint-store (VELOCITY_CHECKPOINT_STORE) %q: want file://DIR, kafka, kafka://TOPIC or memory", spec)
}

func newLogger(level, format string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level (VELOCITY_LOG_LEVEL): %w", err)
	}
	var cfg zap.Config
	switch format {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.DisableStacktrace = true
	default:
		return nil, fmt.Errorf("--log-format (VELOCITY_LOG_FORMAT) %q: want json or console", format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
