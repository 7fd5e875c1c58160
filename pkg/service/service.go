// Package service is the live velocity consumer: a franz-go consumer group on the
// input topic with one goroutine per assigned partition, each running a
// pipeline.Processor, publishing through pkg/sink and checkpointing through
// pkg/checkpoint.
//
// The checkpoint protocol, per partition, every interval, on revoke and on
// shutdown:
//
//	flush the partition's outputs → save its snapshot durably → commit next
//
// so the committed offset never runs ahead of durable state and outputs: after a
// crash the partition resumes from its snapshot and re-emits (byte-identical)
// at most the outputs since that snapshot. On assignment the newest snapshot is
// loaded and fetching starts at its offset, which may be ahead of the group's
// committed offset if the process died between the save and the commit.
//
// With Config.ExactlyOnce the outputs and the offset commit of each interval
// go in one Kafka transaction per partition (eos.go), and recovery resumes
// from the snapshot that matches the committed transaction exactly. A
// partition with a committed offset but no usable snapshot is rebuilt by a
// warm-up read of its recent records (warmup.go).
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/internal/retry"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// IdleLease is how long a re-keyed group's first stage leases each declaration
// that its input is idle (docs/repartition.md, the idle rule): the allowed
// lateness, and at least a second. A lost owner stops renewing it, and once the
// other partitions' hop records show it has run out, the partition holds the
// group's frontier again. With event times that follow the clock, records that
// reach the partition after its owner is lost are then still in order: the
// frontier stops near where its owner last confirmed the input quiet, less the
// allowed lateness, plus the lease. The floor keeps the renewals (a quarter of the
// lease) from costing more than a few broker checks and, under exactly-once,
// commits a second per idle partition.
func IdleLease(allowedLateness time.Duration) time.Duration {
	return min(max(allowedLateness, time.Second).Truncate(time.Millisecond), repartition.MaxLease*time.Millisecond)
}

// RenewalHold is how long after the input topic was last found active a first
// stage goes on renewing its idle lease (worker.renewalsWanted): the idle
// timeout, two leases (IdleLease), and the longest an idle check may take.
func RenewalHold(idleTimeout, allowedLateness time.Duration) time.Duration {
	return idleTimeout + 2*IdleLease(allowedLateness) + lsoTimeout
}

func (s *Service) renewalHold() time.Duration {
	return RenewalHold(s.cfg.Watermark.IdleTimeout, time.Duration(s.cfg.Watermark.AllowedLateness)*time.Millisecond)
}

// Config is the live service's configuration. cmd/velocity-consumer fills it
// from flags and VELOCITY_* variables; tests fill it directly.
type Config struct {
	Brokers     []string
	Group       string
	InputTopic  string
	OutputTopic string
	DLQTopic    string

	Specs     []window.Spec
	Window    window.Options
	Watermark watermark.Config
	Late      pipeline.LatePolicy

	// WriterSchema is the Avro schema input records were written with; empty
	// means ours (schemas/transaction.avsc).
	WriterSchema string
	Limits       codec.Limits

	Store              checkpoint.Store
	CheckpointInterval time.Duration // default 5s

	// SessionTimeout is the consumer group session timeout: how long the
	// group waits for a member that stopped heartbeating (a crashed instance)
	// before its partitions move. 0 keeps franz-go's default (45s).
	SessionTimeout time.Duration

	// ExactlyOnce puts each partition's features, dead letters and offset
	// commit of one checkpoint interval in one Kafka transaction, so that
	// read_committed readers see exactly one output per input offset across
	// crashes. Outputs become visible at checkpoint intervals. See eos.go.
	ExactlyOnce bool

	// MaxPendingProduceBytes pauses a partition whose unacknowledged output
	// passes it; fetching resumes below half. Default 32 MiB.
	MaxPendingProduceBytes int64

	// Producers is how many producer clients publish the outputs (without
	// ExactlyOnce, which has one per partition); partition p uses client p mod
	// Producers, so each partition's outputs keep their order. franz-go sends
	// an idempotent client's produce requests to a broker one at a time, so
	// with one client every partition's outputs wait behind each request;
	// several let requests overlap, which raises peak throughput a little and
	// makes the tail latency near half of it worse, because the requests then
	// compete for the same broker and cores. Default 1.
	Producers int

	// FetchMinBytes and FetchMaxWait are the consumer's fetch.min.bytes and
	// fetch.max.wait: the broker holds each fetch until FetchMinBytes of input
	// are there or FetchMaxWait has passed. The default, 1 byte, answers every
	// fetch at once: the poll loop's natural batching (pollRound) already makes
	// fetches large near the peak, so holding them only adds latency at low
	// rates. A few KiB trade some of that latency for fewer fetches, and less
	// CPU, at moderate rates. Defaults DefaultFetchMinBytes and
	// DefaultFetchMaxWait.
	FetchMinBytes int32
	FetchMaxWait  time.Duration

	// Host goes into the velocity.host header of features records.
	Host string
	// Build goes into the velocity.build header of every output: the lineage
	// that tells which code produced a record. Empty leaves it out.
	Build string

	// Features is a feature definition's features (nil: the default contract).
	// With it Specs are its windows, Decoder is the definition's mapping (it
	// fills codec.Transaction.Ext) and every features record is the flat record
	// of feature.AvroSchema(Features). Definition names it in the
	// velocity.definition header of every output ("<label>@<hash>").
	Features   *feature.Spec
	Definition string

	// Hops are the definition's re-keyed groups, in the order the Decoder fills
	// codec.Transaction.Groups: each partition is their first stage and
	// publishes their hop records to Topic (docs/repartition.md), which Run
	// creates with the input topic's partition count.
	Hops []pipeline.HopGroup
	// Merge, if set, makes this service the second stage of the re-keyed group
	// it names: InputTopic is that group's repartition topic, Features its
	// features, and every partition merges what all the input partitions sent
	// it. Decoder and WriterSchema are not used.
	Merge *MergeGroup

	// Decoder, if set, decodes input values instead of the one built from
	// WriterSchema: the schema-registry decoder of pkg/registry. If it also
	// implements codec.Preparer, each partition prepares every record before
	// processing it and, while Prepare fails (registry down), holds that
	// record and everything after it, pauses fetching and retries with
	// backoff: nothing is dead-lettered for an outage (worker.go).
	Decoder codec.Decoder
	// FeaturesValuePrefix is written before every features value: the
	// Confluent wire-format prefix (magic byte, schema id) of our registered
	// output schema. Nil writes plain Avro.
	FeaturesValuePrefix []byte

	// ClientOpts are extra franz-go options for every client the service
	// makes: producer, consumer, transactional producers, warm-up readers
	// (TLS, SASL, logging).
	ClientOpts []kgo.Opt
	// Observe, if set, is called on each partition goroutine for every output
	// (the demo's live view). It must be quick and must not keep the Output.
	Observe func(*pipeline.Output)
}

// MergeGroup names the re-keyed group a second-stage service computes.
type MergeGroup struct {
	Name string
}

// ProfileStage is the value of the "stage" profiler label of the service's
// goroutines: "input" for an input topic's service (the first stage of re-keyed
// groups), "group:<name>" for a re-keyed group's second stage.
func (s *Service) ProfileStage() string {
	if s.cfg.Merge != nil {
		return "group:" + s.cfg.Merge.Name
	}
	return "input"
}

func (c *Config) defaults() error {
	if len(c.Brokers) == 0 {
		return errors.New("service: no brokers")
	}
	for name, v := range map[string]string{"group": c.Group, "input topic": c.InputTopic, "output topic": c.OutputTopic, "DLQ topic": c.DLQTopic} {
		if v == "" {
			return fmt.Errorf("service: %s is required", name)
		}
	}
	if c.Store == nil {
		return errors.New("service: a checkpoint store is required")
	}
	if (len(c.Hops) > 0 || c.Merge != nil) && c.Features == nil {
		return errors.New("service: re-keyed groups need a feature definition")
	}
	if c.Merge != nil && len(c.Hops) > 0 {
		return errors.New("service: a second stage feeds no further groups")
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = 5 * time.Second
	}
	if c.MaxPendingProduceBytes <= 0 {
		c.MaxPendingProduceBytes = 32 << 20
	}
	if c.Producers <= 0 {
		c.Producers = DefaultProducers
	}
	if c.FetchMinBytes <= 0 {
		c.FetchMinBytes = DefaultFetchMinBytes
	}
	if c.FetchMaxWait <= 0 {
		c.FetchMaxWait = DefaultFetchMaxWait
	}
	if c.FetchMaxWait < MinFetchMaxWait {
		return fmt.Errorf("service: fetch max wait %v is below %v, the least franz-go accepts", c.FetchMaxWait, MinFetchMaxWait)
	}
	return nil
}

// Defaults of Config.
const (
	DefaultProducers     = 1
	DefaultFetchMinBytes = 1
	DefaultFetchMaxWait  = 10 * time.Millisecond
	// MinFetchMaxWait is the shortest fetch wait franz-go accepts.
	MinFetchMaxWait = 10 * time.Millisecond
)

// Service runs the consumer group. Create it with New and call Run once.
type Service struct {
	cfg  Config
	log  *zap.Logger
	m    *metrics.Metrics
	dec  codec.Decoder
	cons *kgo.Client
	adm  *kadm.Client
	// lso answers the idle verdicts' questions, one request for them all.
	lso   *lsoLookup
	sinks []*sink.Sink // one per producer client; partition p uses sinks[p mod len]
	// roundTimer bounds the poll loop's wait for a poll's batches (poll loop only).
	roundTimer *time.Timer
	// setUp is closed once Run has set cons and adm and checked the topics,
	// or has given up (setUpErr). The group's callbacks wait for it: the
	// client starts joining inside kgo.NewClient, and an assignment could
	// otherwise arrive before s.cons is even set.
	setUp    chan struct{}
	setUpErr error
	// beforeSetUp, when set (tests), runs after the consumer client is
	// created and before Run records it: it widens the window setUp closes.
	beforeSetUp func()
	// beforePoll, when set (tests), runs before each poll of the poll loop.
	beforePoll func()
	// roundWait bounds the poll loop's wait for a poll's batches (awaitRound).
	roundWait time.Duration

	mu      sync.Mutex
	workers map[int32]*worker
	// txnLost holds exactly-once partitions whose worker left because its
	// transaction was fenced or aborted under it (worker.leaveTxnLost), with
	// the time it left: fetching is paused until the group revokes the
	// partition or, if the group still gives it to us, reacquireLost restarts it.
	txnLost map[int32]time.Time
	// fenced holds, under exactly-once, the transactional producers that
	// fenceOnAssign initialised for partitions just assigned, until acquire
	// takes them (or a revoke, a loss or the end of Run closes them).
	fenced map[int32]*kgo.Client
	// retakes are the takeovers in progress of partitions in txnLost that the
	// group still assigns to us (under mu; reacquireLost starts them,
	// stopPartitions cancels them).
	retakes map[int32]*retake
	// wakePoll ends the poll in progress (under mu).
	wakePoll context.CancelFunc
	// bg counts the goroutines Run starts besides its workers (the watchers,
	// idle checks, segment sweeps and deletions): Run waits for them before it
	// returns (bgWait), so that none is cut off by the process's exit or goes
	// on logging for a service that has stopped. Every one is started before
	// the workers are stopped, by a goroutine bg or Run already counts.
	bg sync.WaitGroup
	// inputTopicID is the input topic's id for exactly-once offset commits
	// (under mu; refreshInputTopicID).
	inputTopicID [16]byte
	// inputPartitions is the input topic's partition count (checkTopics): the
	// repartition topics' count and, for a second stage, its sources.
	inputPartitions int32
	// grownWarned is one past the highest partition added to the input topic
	// since the start that checkGrown warned about (0: none yet).
	grownWarned int32

	queryState // the query API's reads (query.go)
	// stall is the stall guard (stall.go): reads are refused after the process
	// was stalled for longer than the group is sure to wait for it.
	stall stallGuard

	// gauges are the instance-wide partition gauges this service sets: the
	// input's, or a second stage's own series (by group), so that the services
	// of one process do not overwrite each other's.
	gauges struct{ assigned, restoring, paused prometheus.Gauge }

	ready atomic.Bool
	// restoring counts takeovers in progress (assigned, retake).
	restoring atomic.Int32
	failMu    sync.Mutex
	failed    error
	cancel    context.CancelFunc
}

// New validates cfg. Clients are created by Run.
func New(cfg Config, log *zap.Logger, m *metrics.Metrics) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	dec := cfg.Decoder
	if dec == nil && cfg.Merge == nil { // a second stage reads hop records, not transactions
		var err error
		if dec, err = codec.NewDecoder(cfg.WriterSchema, cfg.Limits); err != nil {
			return nil, fmt.Errorf("service: writer schema: %w", err)
		}
	}
	s := &Service{cfg: cfg, log: log, m: m, dec: dec, workers: make(map[int32]*worker), txnLost: make(map[int32]time.Time), fenced: make(map[int32]*kgo.Client),
		retakes: make(map[int32]*retake), setUp: make(chan struct{}), roundWait: defaultRoundWait}
	s.gauges.assigned, s.gauges.restoring, s.gauges.paused = m.AssignedPartition, m.PartitionsRestoring, m.PausedPartitions
	if g := cfg.Merge; g != nil {
		s.log = log.With(zap.String("rekeyed_group", g.Name))
		s.gauges.assigned = m.GroupPartitions.WithLabelValues(g.Name)
		s.gauges.restoring = m.GroupRestoring.WithLabelValues(g.Name)
		s.gauges.paused = m.GroupPaused.WithLabelValues(g.Name)
	}
	return s, nil
}

// Ready reports whether the service serves its partitions: it reached the
// cluster, consumes as a group member, no takeover (fencing, restore, warm-up)
// is in progress, and it is healthy. An instance that owns no partition, or
// whose input is quiet, is ready. For an orchestrator: take an unready
// instance out of rotation (the query API answers 503 while a partition is
// restored); do not restart it for that.
func (s *Service) Ready() bool {
	return s.ready.Load() && s.restoring.Load() == 0 && s.Healthy() == nil
}

// healthStallAfter is how long a partition's goroutine may go without
// finishing a step before the service reads unhealthy: longer than the
// longest step that can still succeed (a checkpoint's flush, save and commit
// are bounded by 2 minutes; a held record's registry call by 10 s).
const healthStallAfter = 150 * time.Second

// Healthy reports nil unless the service has stopped on an error, or a
// partition's goroutine has made no progress for healthStallAfter (stuck in a
// flush, a checkpoint or a call that never returns). For an orchestrator: an
// unhealthy instance is to be restarted; its partitions resume elsewhere from
// their last checkpoint.
func (s *Service) Healthy() error {
	s.failMu.Lock()
	err := s.failed
	s.failMu.Unlock()
	if err != nil {
		return err
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, w := range s.workers {
		if age := now.Sub(time.Unix(0, w.progress.Load())); age > healthStallAfter {
			return fmt.Errorf("partition %d has made no progress for %s (stuck in a flush or a checkpoint?)", p, age.Round(time.Second))
		}
	}
	return nil
}

// watchProgress exports each partition's progress age every second, from
// outside the partition goroutines, so that a stuck one shows in the metric
// (velocity_partition_progress_age_seconds) as it does in Healthy.
func (s *Service) watchProgress(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		for _, w := range s.workers {
			s.m.ProgressAge.WithLabelValues(w.label).Set(now.Sub(time.Unix(0, w.progress.Load())).Seconds())
		}
		s.mu.Unlock()
	}
}

// fail records the first fatal error and stops the service.
func (s *Service) fail(err error) {
	s.failMu.Lock()
	if s.failed == nil {
		s.failed = err
		s.log.Error("stopping: fatal error", zap.Error(err))
	}
	s.failMu.Unlock()
	if s.cancel != nil {
		s.cancel()
	}
}

// Run consumes until ctx is cancelled (graceful shutdown: every partition is
// flushed, snapshotted and committed) or a fatal error occurs, which it returns.
func (s *Service) Run(ctx context.Context) error {
	// Every goroutine the service starts (its workers, its clients' producing,
	// fetching and connection goroutines) inherits this label, so a CPU profile of
	// a process that runs a first stage and second stages splits by stage
	// (go tool pprof -tagfocus stage=input). Labels cost nothing until sampled.
	defer pprof.SetGoroutineLabels(ctx) // the caller's labels back
	ctx = pprof.WithLabels(ctx, pprof.Labels("stage", s.ProfileStage()))
	pprof.SetGoroutineLabels(ctx)
	ctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	defer cancel()

	var err error
	popts := append(append([]kgo.Opt{kgo.SeedBrokers(s.cfg.Brokers...)}, sink.ProducerOpts()...), s.clientOpts()...)
	producers := s.cfg.Producers
	if s.cfg.ExactlyOnce {
		producers = 1 // partitions publish through their own transactional clients
	}
	for range producers {
		prod, err := kgo.NewClient(popts...)
		if err != nil {
			return fmt.Errorf("create producer: %w", err)
		}
		defer prod.Close()
		s.sinks = append(s.sinks, sink.New(prod, s.cfg.OutputTopic, s.cfg.DLQTopic, s.cfg.Host).WithFeaturesPrefix(s.cfg.FeaturesValuePrefix).WithBuild(s.cfg.Build).WithDefinition(s.cfg.Definition))
	}

	copts := append([]kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ConsumerGroup(s.cfg.Group),
		kgo.ConsumeTopics(s.cfg.InputTopic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers take offsets that no input record has: kept, the
		// workers read past them (worker.readTo), and the idle verdict knows a
		// partition has read all there is when only markers followed its last
		// record. Workers skip them.
		kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AdjustFetchOffsetsFn(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
		kgo.OnPartitionsAssigned(s.fenceOnAssign),
		kgo.FetchMaxBytes(32 << 20),
		kgo.FetchMinBytes(s.cfg.FetchMinBytes),
		kgo.FetchMaxWait(s.cfg.FetchMaxWait),
	}, s.clientOpts()...)
	if st := s.cfg.SessionTimeout; st > 0 {
		copts = append(copts, kgo.SessionTimeout(st), kgo.HeartbeatInterval(heartbeatInterval(st)))
	}
	// giveUp releases the group's callbacks before Close, which waits for them.
	giveUp := func(err error) error {
		s.setUpErr = err
		close(s.setUp)
		if s.cons != nil {
			s.cons.Close()
		}
		return err
	}
	cons, err := kgo.NewClient(copts...)
	if err != nil {
		return giveUp(fmt.Errorf("create consumer: %w", err))
	}
	if s.beforeSetUp != nil {
		s.beforeSetUp()
	}
	s.cons, s.adm = cons, kadm.NewClient(cons)
	s.lso = &lsoLookup{topic: s.cfg.InputTopic, run: s.bg.Go, every: s.tickEvery(), list: func(ctx context.Context) (kadm.ListedOffsets, error) {
		return s.adm.ListCommittedOffsets(ctx, s.cfg.InputTopic)
	}}
	if len(s.cfg.Hops) > 0 {
		s.lso.committed = func(ctx context.Context) (kadm.OffsetResponses, error) {
			return s.adm.FetchOffsetsForTopics(ctx, s.cfg.Group, s.cfg.InputTopic)
		}
	}
	// Verify the cluster answers before declaring readiness, so a wrong
	// --brokers fails within startPing with a clear message instead of
	// retrying forever; through what a broker restarting answers meanwhile
	// (franz-go's Ping tries each broker once).
	pingCtx, pingCancel := context.WithTimeout(ctx, startPing)
	err = retry.Do(pingCtx, 2*time.Second, retry.Transient, func() error { return s.cons.Ping(pingCtx) })
	pingCancel()
	if err != nil && ctx.Err() != nil {
		giveUp(err)
		return nil // stopped while waiting for the brokers: nothing to checkpoint
	}
	if err != nil {
		return giveUp(fmt.Errorf("reach brokers %v: %w (check --brokers and that the cluster is up)", s.cfg.Brokers, err))
	}
	if err := s.checkTopicsRetrying(ctx); err != nil {
		if ctx.Err() != nil {
			giveUp(err)
			return nil // stopped while waiting for the input topic: nothing to checkpoint
		}
		return giveUp(err)
	}
	// Before any worker can start (they wait for setUp): every read checks it.
	s.stall.arm(stallLimit(s.cfg.SessionTimeout))
	close(s.setUp)
	s.bg.Go(func() { s.watchStalls(ctx) })
	s.log.Info("consuming", zap.String("group", s.cfg.Group), zap.String("input", s.cfg.InputTopic),
		zap.String("output", s.cfg.OutputTopic), zap.String("dlq", s.cfg.DLQTopic), zap.Bool("exactly_once", s.cfg.ExactlyOnce))

	// Ready once the cluster answered and the group consumer is running: an
	// input topic with nothing new to read is a healthy, ready service.
	s.ready.Store(true)
	s.bg.Go(func() { s.watchProgress(ctx) })
	s.pollLoop(ctx)

	// Graceful shutdown: checkpoint every partition we own, then leave the group.
	s.ready.Store(false)
	if s.Healthy() == nil {
		s.stopAll(true)
	} else {
		s.stopAll(false)
	}
	s.cons.Close()
	s.closeFenced(nil)
	s.bgWait(bgShutdownWait)
	return s.Healthy()
}

// bgShutdownWait bounds how long Run waits for its background goroutines at the
// end: a segment deletion against a slow store may take up to its own minute,
// and only leaves garbage if cut off.
const bgShutdownWait = 10 * time.Second

// bgWait waits up to d for the goroutines bg counts.
func (s *Service) bgWait(d time.Duration) {
	done := make(chan struct{})
	go func() { s.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		s.log.Warn("stopping without waiting any longer for background work (a dedupe segment sweep or deletion); what it had not deleted stays as garbage",
			zap.Duration("waited", d))
	}
}

// clientOpts are the options of every client the service opens, after its
// own: the connection's (TLS, SASL: Config.ClientOpts), and AlwaysRetryEOF.
// franz-go takes a connection closed at its first request for a missing SASL
// or TLS setting and fails the request without retrying it; a broker
// restarting, or a proxy in front of one whose backend is down, does the
// same, and it failed every buffered output of the idempotent producer
// ("unable to initialize a producer ID"), which stops the service. The
// configuration is checked at start by Run's ping, which tries each broker
// once per attempt and reports the error with franz-go's hint; from then on
// such an EOF is retried like any other.
func (s *Service) clientOpts() []kgo.Opt {
	return append(slices.Clone(s.cfg.ClientOpts), kgo.AlwaysRetryEOF())
}

// startPing bounds Run's wait for the brokers to answer at start.
const startPing = 30 * time.Second

func (s *Service) pollLoop(ctx context.Context) {
	for ctx.Err() == nil {
		// A poll waits for records, which paused partitions never bring. So
		// a worker whose pause wish changes wakes the poll (wakePoll), and
		// while a partition that lost its transaction waits, polls end each
		// second so that reacquireLost runs (leaveTxnLost also wakes one).
		pctx, cancel := context.WithCancel(ctx)
		s.mu.Lock()
		if len(s.txnLost) > 0 {
			cancel()
			pctx, cancel = context.WithTimeout(ctx, time.Second)
		}
		s.wakePoll = cancel
		for _, w := range s.workers {
			if w.wantPause.Load() != w.fetchPaused {
				cancel() // changed since applyBackpressure read it: apply it now
				break
			}
		}
		s.mu.Unlock()
		if s.beforePoll != nil {
			s.beforePoll()
		}
		fetches := s.cons.PollRecords(pctx, maxPollRecords)
		cancel()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			s.cons.AllowRebalance()
			return
		}
		var fatal error
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			if f := s.configError(err); f != nil {
				fatal = cmp.Or(fatal, f)
				return
			}
			s.log.Warn("fetch error", zap.String("topic", topic), zap.Int32("partition", p), zap.Error(err))
		})
		if fatal != nil {
			s.fail(fatal)
			s.cons.AllowRebalance()
			return
		}
		round := newPollRound()
		fetched := time.Now()
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 {
				return
			}
			s.mu.Lock()
			w := s.workers[fp.Partition]
			s.mu.Unlock()
			if w == nil {
				// Not ours any more (lost); the new owner resumes from its checkpoint.
				return
			}
			round.left.Add(1)
			select {
			case w.in <- batch{records: fp.Records, hwm: fp.HighWatermark, round: round, fetched: fetched}:
			case <-w.done: // it left (transaction lost); reacquireLost rewinds the partition
				round.finish()
			case <-ctx.Done():
				round.finish()
			}
		})
		round.finish() // the poll loop's own count
		if fetches.NumRecords() < maxPollRecords {
			s.awaitRound(ctx, round)
		} // else more is fetched and waiting (a backlog): take it at once
		s.applyBackpressure()
		s.reacquireLost(ctx)
		s.cons.AllowRebalance()
	}
}

// maxPollRecords caps one poll. A poll that comes back full finds the
// client holding more already fetched: the loop is behind (a backlog, or
// input produced before we started) and polls again without waiting.
const maxPollRecords = 8192

// A pollRound counts the batches of one poll that their workers have not
// finished yet. Unless the poll came back full, the poll loop waits for them
// before it polls again: natural batching. franz-go sends a broker the next
// fetch when a poll takes the one it holds, so each fetch carries what arrived
// while the previous round was being processed: a few records at low rates,
// answered at once, and near the peak as many as a round's time brings, so
// fetches stay few and large without the broker holding them for bytes.
type pollRound struct {
	left atomic.Int32
	done chan struct{}
}

func newPollRound() *pollRound {
	r := &pollRound{done: make(chan struct{})}
	r.left.Store(1)
	return r
}

// finish counts one batch as processed (or one reference as dropped).
func (r *pollRound) finish() {
	if r != nil && r.left.Add(-1) == 0 {
		close(r.done)
	}
}

// defaultRoundWait bounds the wait for a poll's batches. A worker that leaves
// with batches in its channel (lost, failed) never finishes them, and one busy
// with a slow checkpoint should not hold the other partitions' next fetch for
// long: after it the loop polls anyway, as it did before natural
// batching, and the workers' channels absorb the overlap.
const defaultRoundWait = 50 * time.Millisecond

// awaitRound waits until r's batches are processed, s.roundWait has passed or
// ctx ends.
func (s *Service) awaitRound(ctx context.Context, r *pollRound) {
	select {
	case <-r.done:
		return
	default:
	}
	if s.roundTimer == nil {
		s.roundTimer = time.NewTimer(s.roundWait)
	} else {
		s.roundTimer.Reset(s.roundWait)
	}
	select {
	case <-r.done:
	case <-s.roundTimer.C:
	case <-ctx.Done():
	}
	s.roundTimer.Stop()
}

// applyBackpressure pauses partitions whose worker asks for it and resumes the
// others; franz-go keeps paused partitions' positions. A pause outlives a revoke
// in franz-go, so assigned resumes each partition it hands to a new worker.
func (s *Service) applyBackpressure() {
	var pause, resume []int32
	s.mu.Lock()
	n := len(s.txnLost) // paused until revoked or reacquired
	for p, w := range s.workers {
		want := w.wantPause.Load()
		if want && !w.fetchPaused {
			pause = append(pause, p)
		} else if !want && w.fetchPaused {
			resume = append(resume, p)
		}
		w.fetchPaused = want
		if want {
			n++
		}
	}
	s.mu.Unlock()
	if len(pause) > 0 {
		s.cons.PauseFetchPartitions(map[string][]int32{s.cfg.InputTopic: pause})
	}
	if len(resume) > 0 {
		s.cons.ResumeFetchPartitions(map[string][]int32{s.cfg.InputTopic: resume})
	}
	s.gauges.paused.Set(float64(n))
}

func (s *Service) key(p int32) checkpoint.Key {
	return checkpoint.Key{Group: s.cfg.Group, Topic: s.cfg.InputTopic, Partition: p}
}

func (s *Service) processorConfig(p int32) pipeline.Config {
	wm := s.cfg.Watermark
	if ss, ok := s.cfg.Store.(checkpoint.SegmentStore); ok {
		// Checkpoints write each dedupe id about log4(checkpoints per
		// horizon) times instead of in every snapshot (watermark/segments.go).
		wm.Segments = partitionSegments{store: ss, key: s.key(p)}
	}
	cfg := pipeline.Config{
		Topic: s.cfg.InputTopic, Partition: p,
		Specs: s.cfg.Specs, Window: s.cfg.Window, Watermark: wm,
		Late: s.cfg.Late, Decoder: s.dec, Features: s.cfg.Features,
	}
	if len(s.cfg.Hops) > 0 {
		cfg.Hops = &pipeline.HopConfig{Groups: s.cfg.Hops, Partitions: s.inputPartitions, IdleLease: IdleLease(time.Duration(s.cfg.Watermark.AllowedLateness) * time.Millisecond)}
	}
	if s.cfg.Merge != nil {
		cfg.Merge = &pipeline.MergeConfig{Group: s.cfg.Merge.Name, Sources: int(s.inputPartitions)}
		cfg.Late = pipeline.LateDLQ // the first stages decided lateness
	}
	return cfg
}

// partitionLabel is partition p's value of the metrics' partition label: the
// number, and for a second stage "<group>:<number>", so that a process running
// both stages keeps their series apart.
func (s *Service) partitionLabel(p int32) string {
	if s.cfg.Merge != nil {
		return s.cfg.Merge.Name + ":" + metrics.Partition(p)
	}
	return metrics.Partition(p)
}

// partitionSegments binds a segment store to one partition for pkg/watermark.
type partitionSegments struct {
	store checkpoint.SegmentStore
	key   checkpoint.Key
}

// segmentTimeout bounds one segment write or read (a segment can be tens of MB).
const segmentTimeout = 2 * time.Minute

func (ps partitionSegments) PutSegment(data []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), segmentTimeout)
	defer cancel()
	return ps.store.PutSegment(ctx, ps.key, data)
}

func (ps partitionSegments) GetSegment(ref []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), segmentTimeout)
	defer cancel()
	return ps.store.GetSegment(ctx, ps.key, ref)
}

// assigned runs after the group assigned us partitions and their committed
// offsets were fetched: restore each partition's state and start fetching at
// the snapshot's offset.
func (s *Service) assigned(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	if err := s.waitSetUp(ctx); err != nil {
		return nil, err
	}
	parts := offsets[s.cfg.InputTopic]
	if len(parts) > 0 {
		s.log.Info("taking over partitions", zap.Int("partitions", len(parts)))
	}
	highest := int32(-1)
	for p := range parts {
		highest = max(highest, p)
	}
	if err := s.checkGrown(highest); err != nil {
		s.fail(err)
		return nil, err
	}
	var acquired []int32
	s.restoring.Add(int32(len(parts)))
	s.gauges.restoring.Set(float64(s.restoring.Load()))
	defer func() {
		s.gauges.restoring.Set(float64(s.restoring.Add(-int32(len(parts)))))
	}()
	for p, o := range parts {
		next, err := s.acquireRetrying(ctx, p, o.EpochOffset().Offset)
		if err != nil && ctx.Err() != nil {
			// The group began another rebalance while we were acquiring
			// (franz-go cancels ctx when the session starts revoking), or
			// the client is closing. Not a failure: franz-go fetches these
			// partitions' offsets again in the next session and calls us
			// again for those still ours. Undo this call, so that the next
			// one starts clean: no worker here has processed anything yet.
			s.m.TakeoversInterrupted.Inc()
			s.log.Info("a rebalance interrupted taking over partitions; they are taken over in the next one",
				zap.Int32("partition", p), zap.Int32s("released", acquired), zap.Error(err))
			s.stopPartitions(acquired, false)
			return nil, err
		}
		if err != nil {
			s.fail(err)
			return nil, err
		}
		acquired = append(acquired, p)
		if next >= 0 {
			parts[p] = kgo.NewOffset().At(next).WithEpoch(-1)
		}
		// A partition paused when it was last revoked is still paused in
		// franz-go; its new worker starts unpaused.
		s.cons.ResumeFetchPartitions(map[string][]int32{s.cfg.InputTopic: {p}})
	}
	s.gauges.assigned.Set(float64(s.numWorkers()))
	return offsets, nil
}

// checkGrown looks at the highest partition the group assigned (-1: none)
// against the input topic's partition count at start: the group hands out a
// partition added since (once the consumer's metadata shows it), and nothing
// else would notice.
//
// A re-keyed group's first stage stops with an error: its repartition topics
// and second stages count the input partitions of the start (the hop records'
// source, the merger's frontier over every source, the snapshots), so a second
// stage would refuse every hop record of the new partition and never wait for
// its watermark; the start refuses that topology too (sink.EnsureTopics).
// Without re-keyed groups the partition is consumed like any other, and the
// service says once per count what it means for the features: producers that
// key by entity_id now send most entities to other partitions than before.
func (s *Service) checkGrown(p int32) error {
	if p < s.inputPartitions || s.cfg.Merge != nil {
		return nil // a second stage's input is a repartition topic, which only a first stage writes
	}
	if len(s.cfg.Hops) > 0 {
		return fmt.Errorf("the input topic %q has more partitions than the %d it had at start (partition %d assigned): its re-keyed groups' repartition topics and second stages count %d input partitions, and would refuse this one's hop records; keep the input at %d partitions, or run under a new --group (its re-keyed groups then start over)",
			s.cfg.InputTopic, s.inputPartitions, p, s.inputPartitions, s.inputPartitions)
	}
	s.mu.Lock()
	warn := p >= s.grownWarned
	s.grownWarned = max(s.grownWarned, p+1)
	added := s.grownWarned - s.inputPartitions
	s.mu.Unlock()
	s.m.InputPartitionsAdded.Set(float64(added))
	if warn {
		s.log.Error("the input topic has more partitions than at start: producers that key records by entity_id now send most entities to another partition than before, where their features start again from nothing (the old partition's state for them ages out with --entity-ttl); every record still gets its output",
			zap.String("topic", s.cfg.InputTopic), zap.Int32("partitions_at_start", s.inputPartitions), zap.Int32("partition", p))
	}
	return nil
}

// takeoverRetry bounds how long a takeover is retried through errors that
// may pass: as long as the service waits for a produce or a checkpoint.
const takeoverRetry = 2 * time.Minute

// acquireRetrying is acquire, retried while it fails for a reason that may
// pass (mayPass: a broker restarting, a leader election, a coordinator
// loading), for up to takeoverRetry. A takeover right after a broker restart
// used to stop the service on LEADER_NOT_AVAILABLE from the snapshot store.
// A corrupt snapshot, or anything else, fails at once, as before.
func (s *Service) acquireRetrying(ctx context.Context, p int32, committed int64) (int64, error) {
	deadline := time.Now().Add(takeoverRetry)
	backoff := 200 * time.Millisecond
	for {
		next, err := s.acquire(ctx, p, committed)
		if err == nil || ctx.Err() != nil || !mayPass(err) || time.Now().Add(backoff).After(deadline) {
			return next, err
		}
		s.log.Warn("taking over a partition failed for a reason that may pass; retrying",
			zap.Int32("partition", p), zap.Duration("in", backoff), zap.Error(err))
		select {
		case <-ctx.Done():
			return next, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// acquire takes partition p over: in exactly-once mode it first fences the
// previous owner's transactions and reads the final committed offset; in both
// modes it claims the partition in the snapshot store (which fences the
// previous owner's snapshot writes), then restores the state and starts the
// worker. It returns the offset to fetch from, or -1 to keep the group's
// committed (or reset) offset.
func (s *Service) acquire(ctx context.Context, p int32, committed int64) (int64, error) {
	var txn *kgo.Client
	meta := ""
	if s.cfg.ExactlyOnce {
		// Fence the previous owner first: only then is no transaction
		// holding an offset for p pending, and the committed offset final
		// (the one handed to us was read before the fence).
		var err error
		s.mu.Lock()
		txn = s.fenced[p]
		delete(s.fenced, p)
		s.mu.Unlock()
		if txn == nil {
			s.log.Debug("exactly-once: fencing the previous owner", zap.Int32("partition", p))
			txn, err = s.newTxnProducer(ctx, p)
		}
		if err == nil {
			s.log.Debug("exactly-once: fenced; reading the committed offset", zap.Int32("partition", p))
			if committed, meta, err = s.committedOffset(ctx, p); err == nil {
				err = s.refreshInputTopicID(ctx)
			}
			if err != nil {
				txn.Close()
			}
		}
		if err != nil {
			if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
				err = fmt.Errorf("%w: --exactly-once needs Write and Describe on the transactional ids prefixed %q for this principal", err, fmt.Sprintf("velocity-%s-%s-", s.cfg.Group, s.cfg.InputTopic))
			}
			return 0, err
		}
	} else if committed < 0 {
		// Reacquired after a fence: franz-go handed us no offset.
		var err error
		if committed, _, err = s.committedOffset(ctx, p); err != nil {
			return 0, err
		}
	} else if committed >= 0 {
		// The default mode: franz-go fetched the committed offset but keeps
		// no metadata, which says where the last owner released its reorder
		// buffer on the idle timeout (worker.commit); a warm-up repeats that
		// release. Taken only if it is the note of the same offset.
		meta = s.defaultCommitMeta(ctx, p, committed)
	}
	closeTxn := func() {
		if txn != nil {
			txn.Close()
		}
	}
	// The group generation breaks a tie between two claims made from the
	// same stored epoch (a claimant frozen between its read and its write).
	_, gen := s.cons.GroupMetadata()
	s.log.Debug("claiming the partition in the snapshot store", zap.Int32("partition", p), zap.Int64("committed", committed))
	epoch, err := s.cfg.Store.Claim(ctx, s.key(p), uint32(max(gen, 0)))
	if err != nil {
		closeTxn()
		return 0, fmt.Errorf("partition %d: claim it in the snapshot store: %w", p, err)
	}
	s.log.Debug("claimed; restoring", zap.Int32("partition", p), zap.Uint64("epoch", epoch))
	note, hasNote, err := checkpoint.ParseCommitMetadata(meta)
	if err != nil {
		s.log.Warn("the committed offset's metadata is not ours; matching the snapshot by offset alone, and a warm-up repeats no idle release",
			zap.Int32("partition", p), zap.Error(err))
	}
	proc, next, err := s.restore(ctx, p, committed, note, hasNote, epoch)
	if err != nil {
		// Without a trustworthy state we must not consume this partition:
		// stop loudly so an operator can look, rather than double count.
		closeTxn()
		return 0, err
	}
	if err := s.checkRetention(ctx, p, proc.Next()); err != nil {
		closeTxn()
		return 0, err
	}
	s.mu.Lock()
	delete(s.txnLost, p)
	s.mu.Unlock()
	w := s.startWorker(p, proc, txn, epoch, committed, note)
	s.log.Info("partition assigned", zap.Int32("partition", p), zap.Int64("committed", committed), zap.Int64("resume_at", w.proc.Next()))
	return next, nil
}

// checkRetention makes an offset reset that skips records loud. When the
// offset the partition resumes at has been deleted by retention, franz-go
// resets fetching to the log start: the records in between were never seen by
// the state, and the features undercount. That is not a failure we can undo,
// but it must not be silent: an error line names the range and a counter
// counts the offsets.
func (s *Service) checkRetention(ctx context.Context, p int32, resume int64) error {
	if resume <= 0 {
		return nil
	}
	start, err := s.startOffset(ctx, p)
	if err != nil {
		return fmt.Errorf("partition %d: read the log start offset: %w", p, err)
	}
	if start > resume {
		s.m.OffsetsSkipped.WithLabelValues(s.partitionLabel(p)).Add(float64(start - resume))
		s.log.Error("input records were deleted by retention before they were processed: the features never count them",
			zap.Int32("partition", p), zap.Int64("first_skipped", resume), zap.Int64("last_skipped", start-1),
			zap.Int64("skipped", start-resume), zap.Int64("log_start", start))
	}
	return nil
}

// txnLostGrace is how long an exactly-once partition whose transaction was
// fenced or aborted stays paused before reacquireLost asks whether the group
// still gives it to us. A member the group replaced learns so at its next
// heartbeat (at most 3 s) and loses the partition first.
const txnLostGrace = 5 * time.Second

// reacquireLost restarts exactly-once partitions that lost their transaction
// but that the group, per its coordinator, still assigns to this member: the
// transaction was aborted under us (it timed out, or an operator or a stale
// instance initialised our transactional id), not handed to a new owner. The
// restart fences whoever holds the transactional id, restores the partition
// from its last committed checkpoint and rewinds fetching there; nothing the
// lost transaction held was ever visible to read_committed readers.
//
// It runs on the poll goroutine between a poll and AllowRebalance, but the
// takeovers do not (retake): a restore can take seconds, a warm-up minutes,
// and on the poll goroutine they held up every other partition's fetches and
// the group's rebalances meanwhile. reacquireLost starts a retake for each
// partition past its grace and, once one is done, rewinds fetching to where
// it resumes: SetOffsets stays here, where no revoke can run and franz-go
// drops buffered fetches when offsets are set. A revoke or loss of the
// partition meanwhile cancels its retake and waits for it (stopPartitions).
func (s *Service) reacquireLost(ctx context.Context) {
	var done []*retake
	s.mu.Lock()
	for p, rt := range s.retakes {
		select {
		case <-rt.done:
			delete(s.retakes, p)
			done = append(done, rt)
		default:
		}
	}
	for p, at := range s.txnLost {
		if _, ok := s.retakes[p]; !ok && time.Since(at) >= txnLostGrace {
			rctx, cancel := context.WithCancel(ctx)
			rt := &retake{p: p, cancel: cancel, done: make(chan struct{})}
			s.retakes[p] = rt
			go s.retake(rctx, rt)
		}
	}
	s.mu.Unlock()
	for _, rt := range done {
		rt.cancel()
		switch {
		case rt.err != nil:
			if ctx.Err() == nil {
				s.fail(fmt.Errorf("partition %d: reacquire after a lost transaction: %w", rt.p, rt.err))
			}
		case rt.taken:
			s.cons.SetOffsets(map[string]map[int32]kgo.EpochOffset{s.cfg.InputTopic: {rt.p: {Epoch: -1, Offset: rt.next}}})
			s.cons.ResumeFetchPartitions(map[string][]int32{s.cfg.InputTopic: {rt.p}})
		}
		// Neither: ctx ended.
	}
	if len(done) > 0 {
		s.gauges.assigned.Set(float64(s.numWorkers()))
	}
}

// retake is one partition's takeover in place (reacquireLost), run by
// Service.retake on a goroutine of its own. Its results are read once done is
// closed.
type retake struct {
	p      int32
	cancel context.CancelFunc
	done   chan struct{}
	// taken: the partition's worker runs, and fetching is to resume at next.
	taken bool
	next  int64
	// err: the takeover failed for good (the service stops); nil when it was
	// cancelled.
	err error
}

// retake takes partition rt.p over again for reacquireLost. It asks the
// group's coordinator first whether the partition is still ours, and if not
// asks again after the backoff, until the revoke or lost callback that a move
// brings cancels it; a takeover that fails for a reason that may pass (mayPass: a
// transaction is most often lost to a broker restarting, and the broker is
// often not back 5 s later) is tried again, asking the coordinator again
// first, for up to takeoverRetry since its first failure, as acquireRetrying
// does on assignment. It wakes the poll loop when it is done.
func (s *Service) retake(ctx context.Context, rt *retake) {
	defer func() {
		close(rt.done)
		s.mu.Lock()
		if s.wakePoll != nil {
			s.wakePoll()
		}
		s.mu.Unlock()
	}()
	p := rt.p
	var failingSince time.Time
	backoff := time.Second
	for {
		owned, err := s.ownedByUs(ctx)
		switch {
		case err != nil:
			s.log.Warn("cannot ask the group coordinator who owns a partition whose transaction was lost; retrying",
				zap.Int32("partition", p), zap.Error(err))
		case !owned[p]:
			// Moved or moving to another member (or the group is
			// rebalancing): its revoke or lost callback cancels this; until
			// then ask again.
			s.log.Debug("the group does not assign us a partition whose transaction was lost (now); asking again",
				zap.Int32("partition", p))
		default:
			s.log.Warn("exactly-once: the group still assigns us a partition whose transaction was lost; restoring it from its last commit",
				zap.Int32("partition", p))
			s.restoring.Add(1)
			var next int64
			next, err = s.acquire(ctx, p, -1)
			s.restoring.Add(-1)
			if err == nil {
				if next < 0 {
					// Nothing committed yet: fetch from the log start, which
					// must be read now that the worker runs (acquire started
					// it), so retry only the read.
					next, err = s.startOffsetRetrying(ctx, p)
				}
				rt.taken, rt.next, rt.err = err == nil, next, err
				return
			}
			if ctx.Err() != nil {
				return // revoked, lost or shutting down: the partition simply stays unprocessed here
			}
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if !mayPass(err) || time.Since(failingSince) >= takeoverRetry {
				rt.err = err
				return
			}
			s.log.Warn("reacquiring a partition whose transaction was lost failed for a reason that may pass; retrying",
				zap.Int32("partition", p), zap.Duration("failing_for", time.Since(failingSince).Round(time.Millisecond)), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// startOffsetRetrying is startOffset, retried while it fails for a reason that
// may pass, for up to takeoverRetry.
func (s *Service) startOffsetRetrying(ctx context.Context, p int32) (int64, error) {
	deadline := time.Now().Add(takeoverRetry)
	for {
		off, err := s.startOffset(ctx, p)
		if err == nil || ctx.Err() != nil || !mayPass(err) || time.Now().After(deadline) {
			return off, err
		}
		select {
		case <-ctx.Done():
			return off, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// ownedByUs is the input partitions the group coordinator assigns to this
// member in the group's current, stable generation (empty while it rebalances).
func (s *Service) ownedByUs(ctx context.Context) (map[int32]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	groups, err := s.adm.DescribeGroups(ctx, s.cfg.Group)
	if err != nil {
		return nil, err
	}
	g, ok := groups[s.cfg.Group]
	if !ok {
		return nil, fmt.Errorf("group %s not described", s.cfg.Group)
	}
	if g.Err != nil {
		return nil, g.Err
	}
	owned := make(map[int32]bool)
	if g.State != "Stable" {
		return owned, nil
	}
	me, _ := s.cons.GroupMetadata()
	for _, m := range g.Members {
		if m.MemberID != me {
			continue
		}
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range c.Topics {
				if t.Topic == s.cfg.InputTopic {
					for _, p := range t.Partitions {
						owned[p] = true
					}
				}
			}
		}
	}
	return owned, nil
}

// startOffset is p's log start offset: where a partition with nothing
// committed resumes (the consumer's reset policy is the start).
func (s *Service) startOffset(ctx context.Context, p int32) (int64, error) {
	offs, err := s.adm.ListStartOffsets(ctx, s.cfg.InputTopic)
	if err != nil {
		return 0, err
	}
	o, ok := offs.Lookup(s.cfg.InputTopic, p)
	if !ok {
		return 0, fmt.Errorf("no start offset for partition %d", p)
	}
	if o.Err != nil {
		return 0, o.Err
	}
	return o.Offset, nil
}

// defaultCommitMeta returns the metadata of partition p's committed offset if
// the group's offset is still committed (the default mode), or "" when it is
// another or cannot be read: the state is then restored as without a note,
// the warm-up repeating no idle release, which costs at most repeated outputs
// around the last one (the default mode is at-least-once).
func (s *Service) defaultCommitMeta(ctx context.Context, p int32, committed int64) string {
	got, meta, err := s.committedOffset(ctx, p)
	if err != nil {
		s.log.Warn("could not read the committed offset's metadata; a warm-up repeats no idle release",
			zap.Int32("partition", p), zap.Int64("committed", committed), zap.Error(err))
		return ""
	}
	if got != committed {
		return ""
	}
	return meta
}

// restore loads the partition's snapshot. next is the offset to fetch from, or
// -1 to keep the group's committed (or reset) offset. committed is the group's
// committed offset, note what the commit recorded with it (hasNote false
// without one); epoch is this owner's claim.
//
// A snapshot is never resumed silently when it is behind what the group has
// committed: another owner moved the partition on after it was saved (a
// partition that went A → B → A with per-instance file stores), and resuming
// would re-emit everything since, or, where retention deleted those records,
// count none of them. Such a snapshot is dropped for a rebuild from the
// committed offset, with a warning and velocity_snapshots_stale_total.
func (s *Service) restore(ctx context.Context, p int32, committed int64, note checkpoint.CommitNote, hasNote bool, epoch uint64) (*pipeline.Processor, int64, error) {
	cfg := s.processorConfig(p)
	loaded, err := s.cfg.Store.Load(ctx, s.key(p))
	switch {
	case errors.Is(err, checkpoint.ErrNotFound):
		return s.rebuild(ctx, p, committed, note.IdleFlushAt)
	case err != nil:
		return nil, 0, fmt.Errorf("partition %d: %w", p, err)
	}
	if loaded.FellBack {
		s.m.SnapshotFallbacks.Inc()
		s.log.Warn("newest snapshot corrupt, restored the previous one", zap.Int32("partition", p), zap.Error(loaded.CorruptErr))
	}
	snap := loaded.Snapshot
	if s.cfg.ExactlyOnce && committed < 0 && checkpoint.CommittedBefore(loaded) {
		// The group once committed an offset for p and has lost it (its
		// offsets expired after offsets.retention.minutes empty, or were
		// deleted). Rebuilding from the start of the log would publish again
		// every output still retained, so the newest snapshot is resumed, as
		// in the default mode (docs/exactly-once.md, "No committed offset").
		s.log.Warn("exactly-once: the group has no committed offset for the partition but the snapshot store has a snapshot (the group's offsets expired or were deleted); resuming from the newest snapshot",
			zap.Int32("partition", p), zap.Int64("snapshot_next", snap.Next), zap.String("snapshot", checkpoint.CommitMetadata(checkpoint.CommitNote{Snapshot: snap.ID(), IdleFlushAt: -1, IdleFlushAhead: -1})))
	} else if s.cfg.ExactlyOnce {
		var stepBack, ok bool
		snap, stepBack, ok = checkpoint.ForCommitted(loaded, committed, note.Snapshot, hasNote)
		if !ok {
			if loaded.Next < committed {
				s.m.SnapshotsStale.Inc()
			}
			s.log.Warn("exactly-once: no snapshot matches the committed offset; rebuilding from the committed offset",
				zap.Int32("partition", p), zap.Int64("committed", committed), zap.String("committed_snapshot", checkpoint.CommitMetadata(note)),
				zap.Int64("snapshot_next", loaded.Next), zap.Uint64("snapshot_seq", loaded.Seq))
			return s.rebuild(ctx, p, committed, note.IdleFlushAt)
		}
		if stepBack {
			s.m.SnapshotStepBacks.Inc()
			s.log.Warn("exactly-once: newest snapshot is ahead of the committed transaction (saved, and its transaction never committed: a crash between save and commit); resuming from the previous one",
				zap.Int32("partition", p), zap.Int64("committed", committed), zap.Int64("discarded_next", loaded.Next))
			// Invariant: the store's previous snapshot always matches a
			// committed transaction. Save the one we resume from again, with
			// its ID (the one the commit names) under our epoch, so the
			// discarded (uncommitted) snapshot drops out of the store's two
			// slots before our next checkpoint could make it "previous".
			snap.Writer = epoch
			if err := s.cfg.Store.Save(ctx, s.key(p), snap); err != nil {
				return nil, 0, fmt.Errorf("partition %d: re-save the committed snapshot: %w", p, err)
			}
		}
	} else if committed >= 0 && snap.Next < committed {
		s.m.SnapshotsStale.Inc()
		s.log.Warn("the snapshot is behind the group's committed offset (another owner moved the partition on since it was saved): not resuming from it; rebuilding from the committed offset",
			zap.Int32("partition", p), zap.Int64("snapshot_next", snap.Next), zap.Int64("committed", committed))
		return s.rebuild(ctx, p, committed, note.IdleFlushAt)
	}
	proc, err := pipeline.Restore(cfg, snap.State)
	if errors.Is(err, watermark.ErrSegment) {
		// The snapshot is sound but a dedupe segment it lists is missing or
		// damaged. The default mode falls back to the previous snapshot, as
		// after a corrupt newest frame (the records since are read again),
		// unless that one is behind the committed offset. Exactly-once has
		// only the snapshot of the committed transaction; it, and the default
		// mode without a usable previous one, rebuild from the committed
		// offset, as when there is no snapshot.
		s.m.SnapshotFallbacks.Inc()
		if prev := loaded.Previous; !s.cfg.ExactlyOnce && prev != nil && !loaded.FellBack && prev.Next >= committed {
			prevProc, prevErr := pipeline.Restore(cfg, prev.State)
			if prevErr == nil {
				s.log.Warn("a dedupe segment of the newest snapshot is unusable; restored the previous snapshot",
					zap.Int32("partition", p), zap.Int64("discarded_next", snap.Next), zap.Error(err))
				return prevProc, prev.Next, nil
			}
			err = fmt.Errorf("%w; previous snapshot: %v", err, prevErr)
		}
		s.log.Warn("a dedupe segment of the snapshot is unusable and no other snapshot restores; rebuilding from the committed offset",
			zap.Int32("partition", p), zap.Int64("committed", committed), zap.Bool("exactly_once", s.cfg.ExactlyOnce), zap.Error(err))
		return s.rebuild(ctx, p, committed, note.IdleFlushAt)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("partition %d: restore snapshot: %w", p, err)
	}
	return proc, snap.Next, nil
}

// rebuild starts a partition without a usable snapshot: empty state when
// nothing was committed, else a warm-up read up to the committed offset that
// repeats the last idle flush at idleFlushAt (-1: none known).
func (s *Service) rebuild(ctx context.Context, p int32, committed, idleFlushAt int64) (*pipeline.Processor, int64, error) {
	if committed > 0 {
		proc, err := s.warmUp(ctx, p, committed, idleFlushAt)
		if err != nil {
			return nil, 0, err
		}
		return proc, committed, nil
	}
	proc, err := pipeline.New(s.processorConfig(p), max(committed, 0))
	if err != nil {
		return nil, 0, err
	}
	return proc, committed, nil
}

// configError turns a fetch error that no retry can cure into the fatal error
// that says which setting to change; nil for any other error (franz-go
// retries those). Without it the service would stay up and ready, joining and
// failing forever, consuming nothing.
func (s *Service) configError(err error) error {
	switch {
	case errors.Is(err, kerr.InvalidSessionTimeout):
		return fmt.Errorf("--session-timeout (VELOCITY_SESSION_TIMEOUT) %s is outside what the brokers allow (group.min.session.timeout.ms to group.max.session.timeout.ms, 6s to 30m by default): %w", s.cfg.SessionTimeout, err)
	case errors.Is(err, kerr.InvalidGroupID):
		return fmt.Errorf("--group (VELOCITY_GROUP) %q is not a valid group id: %w", s.cfg.Group, err)
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		return fmt.Errorf("not authorized for --group (VELOCITY_GROUP) %q: grant this principal Read on the group (%w)", s.cfg.Group, err)
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return fmt.Errorf("not authorized to read --input-topic (VELOCITY_INPUT_TOPIC) %q: grant this principal Read and Describe on it (%w)", s.cfg.InputTopic, err)
	}
	return nil
}

// inputTopicPoll is how often a service whose input topic does not exist yet
// looks for it again.
var inputTopicPoll = 2 * time.Second

// checkTopics waits for the input topic, then makes sure the output and
// dead-letter topics exist before the first produce: a missing one is created
// with the input topic's partition count (see sink.EnsureTopics), so a first
// start works out of the box. While the input topic does not exist the service
// is not ready and creates nothing (it could only guess the partition count).
func (s *Service) checkTopics(ctx context.Context) error {
	partitions, err := s.waitForInput(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s.mu.Lock()
	s.inputPartitions = partitions
	s.mu.Unlock()
	topics := []sink.OutputTopic{{Flag: "--output-topic", Name: s.cfg.OutputTopic}, {Flag: "--dlq-topic", Name: s.cfg.DLQTopic}}
	for _, g := range s.cfg.Hops {
		topics = append(topics, sink.OutputTopic{Flag: "the repartition topic of group " + g.Name, Name: g.Topic, Exact: true, Configs: sink.RepartitionConfigs()})
	}
	if s.cfg.Merge != nil {
		topics[0].Flag = "the output topic of group " + s.cfg.Merge.Name + " (--group-topic)"
	}
	created, err := sink.EnsureTopics(ctx, s.adm, partitions, topics...)
	for _, t := range created {
		s.log.Info("created missing topic", zap.String("topic", t), zap.Int32("partitions", partitions))
	}
	return err
}

// checkTopicsRetrying is checkTopics, retried for up to takeoverRetry while it
// fails for a reason that may pass (retry.Transient): a broker restarting just
// after the ping answered used to stop the service at start, on the first
// refused metadata or create request. Waiting for the input topic to exist is
// not bounded by it; a refusal (authorization, a repartition topic with another
// partition count) fails at once.
func (s *Service) checkTopicsRetrying(ctx context.Context) error {
	deadline := time.Now().Add(takeoverRetry)
	backoff := 200 * time.Millisecond
	for {
		err := s.checkTopics(ctx)
		if err == nil || ctx.Err() != nil || !retry.Transient(err) || time.Now().Add(backoff).After(deadline) {
			return err
		}
		s.log.Warn("checking the topics failed for a reason that may pass; retrying", zap.Duration("in", backoff), zap.Error(err))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// waitForInput returns the input topic's partition count once it exists.
func (s *Service) waitForInput(ctx context.Context) (int32, error) {
	for waiting := false; ; waiting = true {
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		md, err := s.adm.Metadata(mctx, s.cfg.InputTopic)
		cancel()
		if err != nil {
			// kadm turns a topic's authorization failure into the
			// request's error.
			if f := s.configError(err); f != nil {
				return 0, f
			}
			return 0, fmt.Errorf("read topic metadata: %w", err)
		}
		td, ok := md.Topics[s.cfg.InputTopic]
		switch {
		case ok && td.Err == nil && len(td.Partitions) > 0:
			if waiting {
				s.log.Info("input topic exists now", zap.String("topic", s.cfg.InputTopic), zap.Int("partitions", len(td.Partitions)))
			}
			return int32(len(td.Partitions)), nil
		case ok && td.Err != nil && !kerr.IsRetriable(td.Err): // e.g. not authorized; unknown is retriable
			if f := s.configError(td.Err); f != nil {
				return 0, f
			}
			return 0, fmt.Errorf("--input-topic (VELOCITY_INPUT_TOPIC) %q: %w", s.cfg.InputTopic, td.Err)
		}
		if !waiting {
			s.log.Warn("input topic does not exist yet; waiting for it (not ready until then; the output and dead-letter topics are created once it exists, with its partition count)",
				zap.String("topic", s.cfg.InputTopic))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(inputTopicPoll):
		}
	}
}

// Assigned is the number of input partitions this instance currently owns.
func (s *Service) Assigned() int { return s.numWorkers() }

func (s *Service) numWorkers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.workers)
}

func (s *Service) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	s.closeFenced(revoked[s.cfg.InputTopic])
	if s.waitSetUp(ctx) == nil {
		s.stopPartitions(revoked[s.cfg.InputTopic], true)
	}
}

func (s *Service) lost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.closeFenced(lost[s.cfg.InputTopic])
	if s.waitSetUp(ctx) == nil {
		s.stopPartitions(lost[s.cfg.InputTopic], false)
	}
}

// fenceOnAssign, under exactly-once, fences the previous owners of the
// partitions just assigned: it initialises each one's transactional producer,
// which aborts the transaction a previous owner left open, and keeps it for
// acquire. It must run here, before franz-go fetches the group's committed
// offsets for them. That fetch asks for stable offsets, and the broker refuses
// them (UNSTABLE_OFFSET_COMMIT, retried) while an offset commit of an open
// transaction is pending. A previous owner that died between its
// TxnOffsetCommit and its EndTxn left exactly that. acquire, which fenced only
// after the fetch, then waited for that transaction to time out (a minute or
// more), with the partition, and the others in its assignment, neither
// consumed nor committed meanwhile. A fence that fails here is retried by
// acquire, which fences whenever it finds no producer kept.
func (s *Service) fenceOnAssign(ctx context.Context, _ *kgo.Client, assigned map[string][]int32) {
	if !s.cfg.ExactlyOnce || s.waitSetUp(ctx) != nil {
		return
	}
	for _, p := range assigned[s.cfg.InputTopic] {
		s.log.Debug("exactly-once: fencing the previous owner before the offset fetch", zap.Int32("partition", p))
		txn, err := s.newTxnProducer(ctx, p)
		if err != nil {
			s.log.Info("exactly-once: fencing a partition just assigned failed; its takeover fences it again", zap.Int32("partition", p), zap.Error(err))
			continue
		}
		s.mu.Lock()
		old := s.fenced[p]
		s.fenced[p] = txn
		s.mu.Unlock()
		if old != nil {
			old.Close()
		}
	}
}

// closeFenced closes the producers fenceOnAssign kept for parts (nil: all)
// that no takeover took.
func (s *Service) closeFenced(parts []int32) {
	s.mu.Lock()
	var drop []*kgo.Client
	for p, cl := range s.fenced {
		if parts == nil || slices.Contains(parts, p) {
			drop = append(drop, cl)
			delete(s.fenced, p)
		}
	}
	s.mu.Unlock()
	for _, cl := range drop {
		cl.Close()
	}
}

// waitSetUp holds a group callback until Run has finished setting up (see
// Service.setUp), and fails it if Run gave up.
func (s *Service) waitSetUp(ctx context.Context) error {
	select {
	case <-s.setUp:
		return s.setUpErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Service) stopPartitions(parts []int32, commit bool) {
	// A takeover in place of a partition being released ends first: it may
	// start the partition's worker, which is then stopped below.
	var rts []*retake
	s.mu.Lock()
	for _, p := range parts {
		if rt := s.retakes[p]; rt != nil {
			rts = append(rts, rt)
			delete(s.retakes, p)
		}
	}
	s.mu.Unlock()
	for _, rt := range rts {
		rt.cancel()
		<-rt.done
		if rt.taken { // its fetching, paused when the transaction was lost, was never resumed
			s.cons.ResumeFetchPartitions(map[string][]int32{s.cfg.InputTopic: {rt.p}})
		}
	}
	var ws []*worker
	s.mu.Lock()
	for _, p := range parts {
		if _, ok := s.txnLost[p]; ok {
			// Its worker already left; the partition is gone, so is the pause.
			delete(s.txnLost, p)
			s.cons.ResumeFetchPartitions(map[string][]int32{s.cfg.InputTopic: {p}})
		}
		if w := s.workers[p]; w != nil {
			ws = append(ws, w)
			delete(s.workers, p)
		}
	}
	s.mu.Unlock()
	for _, w := range ws {
		w.stop(commit)
	}
	for _, w := range ws {
		<-w.done
		s.m.ForgetPartition(w.label)
		s.log.Info("partition released", zap.Int32("partition", w.part), zap.Bool("checkpointed", commit), zap.Int64("next", w.proc.Next()))
	}
	s.gauges.assigned.Set(float64(s.numWorkers()))
}

func (s *Service) stopAll(commit bool) {
	s.mu.Lock()
	parts := make([]int32, 0, len(s.workers)+len(s.retakes))
	for p := range s.workers {
		parts = append(parts, p)
	}
	for p := range s.retakes {
		if s.workers[p] == nil {
			parts = append(parts, p)
		}
	}
	s.mu.Unlock()
	s.stopPartitions(parts, commit)
}
