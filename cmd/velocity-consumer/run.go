package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/internal/profiling"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/kafkaconn"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/registry"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

const runUsage = `velocity-consumer run: the live service.

Consumes Avro transactions from --input-topic as a consumer group, publishes one
VelocityFeatures record per transaction to --output-topic (key = entity id), and
routes every bad, late or duplicate record to --dlq-topic. Offsets are committed
only after the partition's outputs are acknowledged and its state snapshot is
durable. SIGINT/SIGTERM checkpoint every partition and leave the group.

Serves Prometheus metrics on --metrics-addr at /metrics, and /healthz, /readyz
(and Go's profiler at /debug/pprof/ with --pprof).
They carry counts, sizes and latencies by partition or reason, never entity data.

With --api-addr, serves the query API on a listener of its own: an entity's
velocity from the live state, on request, from any instance (docs/api.md).

With --features and re-keyed groups in the definition (docs/features.md), the
same process also computes each group keyed by another field: the input
partitions send its records through __velocity-repartition-<group>-<name>,
read by a second stage (consumer group <group>.<name>) that publishes to
--group-topic (docs/repartition.md).`

type runFlags struct {
	brokers, group, input, output, dlq string
	store                              string
	interval                           time.Duration
	metricsAddr                        string
	pprof                              bool
	cpuProfile, memProfile             string
	logLevel, logFormat                string
	maxPendingBytes                    int64
	producers                          int
	fetchMinBytes                      int
	fetchMaxWait                       time.Duration
	exactlyOnce                        bool
	sessionTimeout                     time.Duration
	features                           *featureSet // --features, read by serviceConfig
	pipe                               pipelineFlags
	conn                               connFlags
	api                                apiFlags
}

func (r *runFlags) register(e *envFlags) {
	e.String(&r.brokers, "brokers", "localhost:9092", "comma-separated Kafka bootstrap brokers")
	e.String(&r.group, "group", "velocity-consumer", "consumer group id (one group per deployment; snapshots are keyed by it)")
	e.String(&r.input, "input-topic", "transactions", "topic of Avro Transaction records")
	e.String(&r.output, "output-topic", "velocity-features", "topic for Avro VelocityFeatures records")
	e.String(&r.dlq, "dlq-topic", "velocity-dlq", "topic for dead letters (original bytes plus velocity.* headers)")
	e.String(&r.store, "checkpoint-store", "file://./velocity-state", "where partition snapshots live: file://DIR (one machine), kafka or kafka://TOPIC (a compacted topic, default __velocity-snapshots-<group>; partitions can move between instances) or memory (state lost on restart)")
	e.Duration(&r.interval, "checkpoint-interval", 5*time.Second, "how often each partition flushes, snapshots and commits")
	e.String(&r.metricsAddr, "metrics-addr", ":9090", "listen address for /metrics, /healthz and /readyz, e.g. 127.0.0.1:9090 for loopback only (empty disables; they carry no entity data)")
	e.Bool(&r.pprof, "pprof", false, "also serve Go's profiler at /debug/pprof/ on --metrics-addr (CPU, heap and goroutine profiles, which show code, not data; serve it only where operators alone can reach it)")
	e.String(&r.cpuProfile, "cpu-profile", "", "write a CPU profile of the whole run to this file (for benchmarks: go tool pprof FILE)")
	e.String(&r.memProfile, "mem-profile", "", "write an allocation profile (heap profile with every allocation since the start) to this file at exit (for benchmarks)")
	e.String(&r.logLevel, "log-level", "info", "debug, info, warn or error")
	e.String(&r.logFormat, "log-format", "json", "json or console")
	e.Int64(&r.maxPendingBytes, "max-pending-bytes", 32<<20, "per partition: pause fetching while this many produced bytes await acknowledgement")
	e.Int(&r.producers, "producers", service.DefaultProducers, "producer clients publishing outputs (partition p uses client p mod N; ignored with --exactly-once, which has one per partition):\nan idempotent client sends one produce request per broker at a time; on a 2-core test machine 4 raised peak throughput by about 5% and worsened p99 near half of it")
	e.Int(&r.fetchMinBytes, "fetch-min-bytes", service.DefaultFetchMinBytes, "the broker holds each fetch until this many input bytes are there or --fetch-max-wait has passed:\n1 answers at once, the lowest latency (fetches still grow near the peak: the next fetch goes out once the last one's records are processed); a few KiB trade up to the wait in latency for fewer fetches and less CPU at moderate rates")
	e.Duration(&r.fetchMaxWait, "fetch-max-wait", service.DefaultFetchMaxWait, "longest the broker holds a fetch for --fetch-min-bytes (at least 10ms)")
	e.Bool(&r.exactlyOnce, "exactly-once", false, "publish each partition's features, dead letters and offset commit of one --checkpoint-interval in one Kafka transaction:\nread_committed readers see exactly one output per input offset across crashes, at checkpoint-interval latency")
	e.Duration(&r.sessionTimeout, "session-timeout", 45*time.Second, "consumer group session timeout: how long a crashed instance keeps its partitions before they move (the broker allows 6s..30m by default)")
	r.pipe.register(e)
	r.conn.register(e)
	r.api.register(e, "")
}

// serviceConfig validates the flags and builds the service configuration.
func (r *runFlags) serviceConfig() (service.Config, error) {
	var c service.Config
	st, err := r.pipe.settings()
	if err != nil {
		return c, err
	}
	if c.Brokers = splitList(r.brokers); len(c.Brokers) == 0 {
		return c, errors.New("--brokers (VELOCITY_BROKERS) is empty: give host:port of at least one broker")
	}
	for flag, v := range map[string]string{"group": r.group, "input-topic": r.input, "output-topic": r.output, "dlq-topic": r.dlq} {
		if v == "" {
			return c, fmt.Errorf("--%s (%s) must not be empty", flag, envName(flag))
		}
	}
	if r.input == r.output || r.input == r.dlq {
		return c, errors.New("--input-topic must differ from --output-topic and --dlq-topic, or the service would consume its own output")
	}
	if r.interval <= 0 {
		return c, errors.New("--checkpoint-interval (VELOCITY_CHECKPOINT_INTERVAL) must be positive")
	}
	if r.sessionTimeout <= 0 {
		return c, errors.New("--session-timeout (VELOCITY_SESSION_TIMEOUT) must be positive")
	}
	if r.maxPendingBytes <= 0 {
		return c, errors.New("--max-pending-bytes (VELOCITY_MAX_PENDING_BYTES) must be positive")
	}
	if r.producers < 1 || r.producers > 64 {
		return c, fmt.Errorf("--producers (VELOCITY_PRODUCERS) must be 1..64, got %d", r.producers)
	}
	if r.fetchMinBytes < 1 || r.fetchMinBytes > 64<<20 {
		return c, fmt.Errorf("--fetch-min-bytes (VELOCITY_FETCH_MIN_BYTES) must be 1..%d, got %d", 64<<20, r.fetchMinBytes)
	}
	if r.fetchMaxWait < service.MinFetchMaxWait || r.fetchMaxWait > time.Minute {
		return c, fmt.Errorf("--fetch-max-wait (VELOCITY_FETCH_MAX_WAIT) must be %v..1m, got %v", service.MinFetchMaxWait, r.fetchMaxWait)
	}
	kc, err := r.conn.kafka()
	if err != nil {
		return c, err
	}
	if c.ClientOpts, err = r.conn.options(kc); err != nil {
		return c, err
	}
	if r.conn.registryURL != "" && r.pipe.writerSchema != "" {
		return c, errors.New("--writer-schema and --schema-registry exclude each other: with a registry, each record names its writer schema")
	}
	if c.Store, err = openStore(r.store, c.Brokers, r.group, c.ClientOpts...); err != nil {
		return c, err
	}
	host, _ := os.Hostname()
	c.Group, c.InputTopic, c.OutputTopic, c.DLQTopic = r.group, r.input, r.output, r.dlq
	c.Specs, c.Window, c.Watermark, c.Late = st.specs, st.window, st.watermark, st.late
	c.WriterSchema, c.Limits = st.writerSchema, st.limits
	r.features = st.features
	if st.features != nil {
		c.Features, c.Definition = st.features.spec, st.features.version
		// With a registry each record names its schema (useRegistry compiles them).
		if r.conn.registryURL == "" {
			if c.Decoder, err = st.decoder(st.writerSchema); err != nil {
				return c, fmt.Errorf("--features: %w", err)
			}
		}
	}
	c.CheckpointInterval = r.interval
	c.MaxPendingProduceBytes = r.maxPendingBytes
	c.Producers = r.producers
	c.FetchMinBytes, c.FetchMaxWait = int32(r.fetchMinBytes), r.fetchMaxWait
	c.ExactlyOnce = r.exactlyOnce
	c.SessionTimeout = r.sessionTimeout
	c.Host = host
	c.Build = readBuildInfo().header()
	if st.features != nil && len(st.features.groups) > 0 {
		if r.pipe.idleTimeout <= 0 {
			return c, errors.New("--idle-timeout 0 cannot be used with re-keyed groups (groups: in --features): an input partition that never receives a record would hold back every group's features forever (docs/repartition.md, the idle rule)")
		}
		c.Hops = st.features.hops(r.group)
		for _, g := range st.features.groups {
			if _, err := groupTopic(r.pipe.groupTopic, r.output, g.name); err != nil {
				return c, err
			}
		}
	}
	return c, nil
}

// groupConfigs are the second stages of the definition's re-keyed groups: one
// service each, consuming the group's repartition topic as a consumer group of
// its own ("<group>.<name>"), publishing to the group's topic (--group-topic),
// with the first stage's checkpoint store, connection and exactly-once setting.
// prefixes are the groups' registered output schema prefixes (nil without a
// registry).
func (r *runFlags) groupConfigs(base service.Config, prefixes [][]byte) ([]service.Config, error) {
	var cs []service.Config
	for i, g := range r.features.groups {
		topic, err := groupTopic(r.pipe.groupTopic, r.output, g.name)
		if err != nil {
			return nil, err
		}
		if topic == r.input || topic == r.dlq || topic == r.output {
			return nil, fmt.Errorf("--group-topic %q gives group %s the topic %s, which is the input, output or dead-letter topic", r.pipe.groupTopic, g.name, topic)
		}
		c := base
		c.Group = base.Group + "." + g.name
		c.InputTopic = repartitionTopic(base.Group, g.name)
		c.OutputTopic = topic
		c.Features, c.Specs = g.spec, g.spec.Windows
		c.Hops, c.Merge = nil, &service.MergeGroup{Name: g.name}
		c.Decoder, c.WriterSchema = nil, ""
		c.FeaturesValuePrefix = nil
		if prefixes != nil {
			c.FeaturesValuePrefix = prefixes[i]
		}
		c.Observe = nil
		cs = append(cs, c)
	}
	return cs, nil
}

func cmdRun(ctx context.Context, args []string) error {
	var r runFlags
	e := newEnvFlags("run", runUsage)
	r.register(e)
	if err := e.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(r.logLevel, r.logFormat)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing useful to do on a failed log flush at exit
	stopProfiles, err := profiling.Start(r.cpuProfile, r.memProfile)
	if err != nil {
		return err
	}
	defer func() {
		if err := stopProfiles(); err != nil {
			log.Error("profile not written", zap.Error(err))
		}
	}()
	if _, _, err := r.conn.clientOpts(log); err != nil {
		return err
	}
	apiS, err := r.api.setup()
	if err != nil {
		return err
	}
	cfg, err := r.serviceConfig()
	if err != nil {
		return err
	}
	defer cfg.Store.Close()
	var apiLn net.Listener
	if apiS.on {
		if apiLn, err = apiS.listen(r.api.addr); err != nil {
			return err
		}
		defer apiLn.Close()
	}
	cfg.ClientOpts = append(cfg.ClientOpts, apiS.clientOpt()...)
	// A SIGTERM while the start waits for the registry is a stop like any
	// other: nothing has been read, so there is nothing to checkpoint, and the
	// exit is a clean one.
	registryErr := func(err error) error {
		if ctx.Err() != nil {
			log.Info("stopped while waiting for the schema registry", zap.Error(err))
			return nil
		}
		return err
	}
	if err := r.useRegistry(ctx, &cfg, log); err != nil {
		return registryErr(err)
	}

	var groupCfgs []service.Config
	if len(cfg.Hops) > 0 {
		prefixes, err := r.groupPrefixes(ctx, log)
		if err != nil {
			return registryErr(err)
		}
		if groupCfgs, err = r.groupConfigs(cfg, prefixes); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	registerBuildInfo(reg)
	svc, err := service.New(cfg, log, m)
	if err != nil {
		return err
	}
	all := services{svc}
	for _, gc := range groupCfgs {
		gs, err := service.New(gc, log, m)
		if err != nil {
			return err
		}
		all = append(all, gs)
	}
	if r.metricsAddr != "" {
		stop, err := serveHTTP(r.metricsAddr, reg, all, log, r.pprof)
		if err != nil {
			return err
		}
		defer stop()
	}
	if apiS.on {
		stop, err := serveAPI(ctx, apiLn, apiS, all, r.features.inPlaceGroup(), reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return kafkaconn.Explain(all.run(ctx))
}

// services are the services of one process: the input's and, with re-keyed
// groups, each group's second stage. The process is ready and healthy when all
// of them are; one that stops with an error stops the others.
type services []*service.Service

func (ss services) Ready() bool {
	for _, s := range ss {
		if !s.Ready() {
			return false
		}
	}
	return true
}

func (ss services) Healthy() error {
	for _, s := range ss {
		if err := s.Healthy(); err != nil {
			return err
		}
	}
	return nil
}

// run runs every service until ctx ends or one of them stops, then stops the
// others (each checkpoints its partitions on the way out) and returns the first
// error.
func (ss services) run(ctx context.Context) error {
	if len(ss) == 1 {
		return ss[0].Run(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(ss))
	for _, s := range ss {
		go func() {
			err := s.Run(ctx)
			cancel()
			errs <- err
		}()
	}
	var first error
	for range ss {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// groupPrefixes registers each re-keyed group's output schema under its topic's
// subject when a schema registry is configured, and returns the wire-format
// prefixes (nil without a registry).
func (r *runFlags) groupPrefixes(ctx context.Context, log *zap.Logger) ([][]byte, error) {
	kc, err := r.conn.kafka()
	if err != nil {
		return nil, err
	}
	cl, err := r.conn.registryClient(kc)
	if err != nil || cl == nil {
		return nil, err
	}
	var prefixes [][]byte
	for _, g := range r.features.groups {
		topic, err := groupTopic(r.pipe.groupTopic, r.output, g.name)
		if err != nil {
			return nil, err
		}
		subject, err := r.conn.outputSubject(topic, g.schema)
		if err != nil {
			return nil, err
		}
		_, prefix, err := setupRegistry(ctx, cl, subject, g.schema, nil, codec.DefaultLimits(), log)
		if err != nil {
			return nil, fmt.Errorf("group %s: %w", g.name, err)
		}
		prefixes = append(prefixes, prefix)
	}
	return prefixes, nil
}

// useRegistry points cfg at the schema registry when --schema-registry is set:
// input in the Confluent wire format, features under our registered schema.
func (r *runFlags) useRegistry(ctx context.Context, cfg *service.Config, log *zap.Logger) error {
	kc, err := r.conn.kafka()
	if err != nil {
		return err
	}
	cl, err := r.conn.registryClient(kc)
	if err != nil || cl == nil {
		return err
	}
	out := schemas.VelocityFeatures
	var compile registry.Compile
	if fs := r.features; fs != nil {
		out, compile = fs.schema, fs.compile
	}
	subject, err := r.conn.outputSubject(r.output, out)
	if err != nil {
		return err
	}
	dec, prefix, err := setupRegistry(ctx, cl, subject, out, compile, cfg.Limits, log)
	if err != nil {
		return err
	}
	cfg.Decoder, cfg.FeaturesValuePrefix = dec, prefix
	return nil
}

// serveHTTP serves /metrics, /healthz and /readyz (and with profiling,
// /debug/pprof/) until stop is called.
func serveHTTP(addr string, reg *prometheus.Registry, svc interface {
	Ready() bool
	Healthy() error
}, log *zap.Logger, profiling bool) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr (VELOCITY_METRICS_ADDR) %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := svc.Healthy(); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !svc.Ready() {
			http.Error(w, "not ready: not consuming yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", zap.Error(err))
		}
	}()
	log.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
