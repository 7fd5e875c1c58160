//go:build integration

package chaos

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/srtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// The service's timing flags in every run. The checks' waits derive from them.
const (
	checkpointInterval = time.Second
	idleTimeout        = 2 * time.Second
	sessionTimeout     = 6 * time.Second // the least the broker accepts by default
	slots              = 3               // instances 0..2; 1 and 2 run only between a scale-up and a scale-down
	gracefulStop       = 60 * time.Second
)

// Environment of the checker (docs/fault-checker.md).
//
//	VELOCITY_CHAOS_SEED       seeds, comma-separated: run these schedules (default: one random seed per store)
//	VELOCITY_CHAOS_RUNS       random seeds per store when VELOCITY_CHAOS_SEED is unset (default 1)
//	VELOCITY_CHAOS_DURATION   least planned length of each fault schedule, before the final checks (default 0: one round, 25-40s planned)
//	VELOCITY_CHAOS_SLACK      extra wait, on top of --checkpoint-interval + --idle-timeout, for outputs after the input goes quiet (default 15s)
//	VELOCITY_CHAOS_LOGS       keep every run's logs under this directory (default: a temporary directory kept only when the run fails)
//	VELOCITY_CHAOS_REPORT     append one line per run and mode (date, store, mode, seed, outcome) to this file
//	VELOCITY_CHAOS_LOG_LEVEL  the instances' --log-level (default info; debug names every takeover step)
type chaosEnv struct {
	seeds    []uint64
	duration time.Duration
	slack    time.Duration
	logs     string
	report   string
	logLevel string // the instances' --log-level (VELOCITY_CHAOS_LOG_LEVEL; default info)
}

func readEnv(t *testing.T) chaosEnv {
	e := chaosEnv{slack: 15 * time.Second, logs: os.Getenv("VELOCITY_CHAOS_LOGS"), report: os.Getenv("VELOCITY_CHAOS_REPORT"), logLevel: "info"}
	if v := os.Getenv("VELOCITY_CHAOS_LOG_LEVEL"); v != "" {
		e.logLevel = v
	}
	dur := func(name string, d *time.Duration) {
		if v := os.Getenv(name); v != "" {
			x, err := time.ParseDuration(v)
			if err != nil || x < 0 {
				t.Fatalf("%s=%q: want a duration such as 10m", name, v)
			}
			*d = x
		}
	}
	dur("VELOCITY_CHAOS_DURATION", &e.duration)
	dur("VELOCITY_CHAOS_SLACK", &e.slack)
	if v := os.Getenv("VELOCITY_CHAOS_SEED"); v != "" {
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				t.Fatalf("VELOCITY_CHAOS_SEED=%q: want seeds, comma-separated unsigned integers", v)
			}
			e.seeds = append(e.seeds, n)
		}
	}
	return e
}

func randomSeeds(t *testing.T) []uint64 {
	runs := 1
	if v := os.Getenv("VELOCITY_CHAOS_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("VELOCITY_CHAOS_RUNS=%q: want a positive integer", v)
		}
		runs = n
	}
	var seeds []uint64
	for range runs {
		var b [8]byte
		_, _ = crand.Read(b[:])
		seeds = append(seeds, binary.LittleEndian.Uint64(b[:])%1_000_000_000) // short enough to type
	}
	return seeds
}

// TestChaos runs the randomized fault checker: for each checkpoint store
// (kafka, and a file:// directory per instance), one seeded schedule (more
// with VELOCITY_CHAOS_SEED or VELOCITY_CHAOS_RUNS), on one private broker
// that the schedules restart. Each run has two consumer groups on the same
// input, one in the default mode and one with --exactly-once, and every fault
// of the schedule hits both at once (instance N of each group is killed,
// frozen, started and stopped together), so one schedule covers both cells
// of its store. See the package doc and docs/fault-checker.md.
func TestChaos(t *testing.T) {
	env := readEnv(t)
	// The single broker is shared by the variants that use one; a cluster is
	// its variant's own. Each has a network path per instance slot that a
	// schedule can cut (faultNetCut).
	single := kafkatest.StartPrivateCluster(t, 1, kafkatest.WithLinks(slots))
	bin := buildBinary(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			c := single
			if v.nodes > 1 {
				c = kafkatest.StartPrivateCluster(t, v.nodes, kafkatest.WithLinks(slots))
			}
			seeds := env.seeds
			if seeds == nil {
				seeds = randomSeeds(t)
			}
			for _, seed := range seeds {
				t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
					runChaos(t, c, bin, v, seed, env)
				})
			}
		})
	}
}

// buildBinary builds the service once per test binary.
var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			buildErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		dir, err := os.MkdirTemp("", "velocity-chaos-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "velocity-consumer")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/velocity-consumer")
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, b)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(buildPath)) })
	return buildPath
}

// childEnv is the environment of the processes: the test's, less every
// VELOCITY_* variable (each would set a flag of the service).
func childEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VELOCITY_") {
			out = append(out, kv)
		}
	}
	return out
}

// The semantic flags, the same for run and replay.
var semantics = []string{
	"--allowed-lateness", allowedLateness.String(),
	"--max-record-bytes", strconv.Itoa(maxRecordBytes),
	"--compression", "none",
}

// variant is one cell of the checker's matrix beside the mode: the checkpoint
// store, and whether the groups run a feature definition (whose filter bits,
// distinct hashes, filtered tables and distinct sets are state the default
// contract does not have).
type variant struct {
	name     string
	store    string
	features string // a definition file, or ""
	// nodes > 1: the variant runs on a cluster of its own of that many nodes
	// (kafkatest.StartPrivateCluster) instead of the shared single broker.
	nodes int
}

var variants = []variant{
	{name: "kafka", store: "kafka"},
	{name: "file", store: "file"},
	// The file store: a partition that moves meets stale snapshots, so
	// restores of the definition's state are crossed most often there.
	{name: "file-features", store: "file", features: "testdata/tx_features.yaml"},
	// The two-stage topology of re-keyed groups: every input partition's first
	// stage hops to every repartition partition, and each group's second stage
	// has state, offsets and transactions of its own; kills land between a hop
	// and the commit of the input offset that made it, and between a second
	// stage's outputs and its own commit. The kafka store moves partitions of
	// both stages freely.
	{name: "kafka-groups", store: "kafka", features: "testdata/tx_groups.yaml"},
	// A three-node cluster (replication factor 3, min.insync.replicas 2):
	// broker faults kill one node, or two (no quorum, nothing can be
	// produced), or freeze one past its session with the controller, so
	// partition leadership, the coordinators and the snapshot topic's
	// leaders move under the instances instead of coming back where they were.
	{name: "kafka-cluster", store: "kafka", nodes: 3},
}

// nodeSession is the brokers' session with the controller
// (broker.session.timeout.ms, Kafka's default): a node silent for longer is
// fenced, and its partitions get other leaders.
const nodeSession = 9 * time.Second

// rekeyed is one re-keyed group of a variant's definition as the checker reads
// it: its name and output schema.
type rekeyed struct {
	name string
	out  outputSchema
}

// rekeyedGroups are v's re-keyed groups (none without a definition or groups).
func (v variant) rekeyedGroups(t *testing.T) []rekeyed {
	if v.features == "" {
		return nil
	}
	def, err := definition.LoadFile(v.features)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := definition.EngineSpecs(def)
	if err != nil {
		t.Fatal(err)
	}
	var out []rekeyed
	for _, g := range specs[1:] {
		c, err := goavro.NewCodec(feature.AvroSchema(g.Spec))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rekeyed{name: g.Name, out: outputSchema{codec: c, name: "group " + g.Name + "'s schema generated from " + v.features, definition: def.Version + "@" + def.Hash()}})
	}
	return out
}

// groupTopics is one consumer group's (or the replay's) topics of the re-keyed
// groups: "<prefix><group>", which --group-topic names.
type groupTopics struct {
	prefix string
	rk     []*rekeyedTopic
}

// rekeyedTopic is a re-keyed group's output topic and readers, and its
// checkpoints.
type rekeyedTopic struct {
	rekeyed
	topic     string
	live, raw *collector
	cps       []checkpoint
}

// createGroupTopics creates the topics of v's re-keyed groups under a fresh
// prefix, with the input's partition count and the run's retention.
func createGroupTopics(t *testing.T, ctx context.Context, addr string, groups []rekeyed, configs map[string]string) groupTopics {
	gt := groupTopics{prefix: kafkatest.Name(t, "grp") + "-"}
	adm := kafkatest.Admin(t, addr)
	for _, g := range groups {
		name := gt.prefix + g.name
		cfg := map[string]*string{}
		for k, v := range configs {
			cfg[k] = &v
		}
		if _, err := adm.CreateTopic(ctx, partitions, -1, cfg, name); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		gt.rk = append(gt.rk, &rekeyedTopic{rekeyed: g, topic: name})
	}
	return gt
}

// flags are the --group-topic flag that sends each group to its topic.
func (gt groupTopics) flags() []string {
	if len(gt.rk) == 0 {
		return nil
	}
	return []string{"--group-topic", gt.prefix + "{group}"}
}

// semantics are the flags of v's groups and its replay.
func (v variant) semantics() []string {
	if v.features == "" {
		return semantics
	}
	return append(slices.Clone(semantics), "--features", v.features)
}

// semantics are the flags of the run's processes and its replay: v's, and
// the schedule's late policy.
func (r *run) semantics() []string {
	s := append(slices.Clone(r.v.semantics()), "--late", r.sched.Late)
	if r.reg != nil {
		s = append(s, "--schema-registry", r.reg.URL())
	}
	return s
}

// startRegistry serves a registry run's schema registry and registers the
// input's two writer schemas under input's subject (TopicNameStrategy): the
// Transaction schema and a later version with one more field, an optional
// string (wireFormat). It returns the registry and the input's framing.
func startRegistry(t *testing.T, ctx context.Context, input string, seed uint64) (*srtest.Server, *wireFormat) {
	reg := srtest.Start(t)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	var v2 map[string]any
	if err := json.Unmarshal([]byte(schemas.Transaction), &v2); err != nil {
		t.Fatal(err)
	}
	v2["fields"] = append(v2["fields"].([]any), map[string]any{"name": "channel", "type": []any{"null", "string"}, "default": nil})
	v2text, err := json.Marshal(v2)
	if err != nil {
		t.Fatal(err)
	}
	w := &wireFormat{rng: rand.New(rand.NewPCG(seed, 0x77697265))}
	for i, text := range []string{schemas.Transaction, string(v2text)} {
		ss, err := cl.CreateSchema(ctx, input+"-value", sr.Schema{Schema: text, Type: sr.TypeAvro})
		if err != nil {
			t.Fatalf("register the input's schema v%d: %v", i+1, err)
		}
		if i == 0 {
			w.v1 = ss.ID
		} else {
			w.v2 = ss.ID
		}
	}
	w.unknown = max(w.v1, w.v2) + 1000
	return reg, w
}

// checkSchemaIDs holds a registry run's features values to the contract: each
// names, by its prefix, a schema the registry holds that is the features
// schema (out's).
func (r *run) checkSchemaIDs(out outputSchema, outs ...map[srcKey][]output) []string {
	ids := map[int]bool{}
	for _, m := range outs {
		for _, os := range m {
			for _, o := range os {
				if !o.dead {
					ids[o.schemaID] = true
				}
			}
		}
	}
	cl, err := sr.NewClient(sr.URLs(r.reg.URL()))
	if err != nil {
		return []string{err.Error()}
	}
	var fails []string
	for id := range ids {
		ss, err := cl.SchemaByID(r.ctx, id)
		if err != nil {
			fails = append(fails, fmt.Sprintf("features values framed with schema id %d, which the registry does not give: %v", id, err))
			continue
		}
		c, err := goavro.NewCodec(ss.Schema)
		if err != nil || c.CanonicalSchema() != out.codec.CanonicalSchema() {
			fails = append(fails, fmt.Sprintf("features values framed with schema id %d, whose schema is not %s: %.200s", id, out.name, ss.Schema))
		}
	}
	return fails
}

// output is how v's features records are read.
func (v variant) output(t *testing.T) outputSchema {
	if v.features == "" {
		return defaultOutput
	}
	def, err := definition.LoadFile(v.features)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := definition.EngineSpec(def)
	if err != nil {
		t.Fatal(err)
	}
	c, err := goavro.NewCodec(feature.AvroSchema(spec))
	if err != nil {
		t.Fatal(err)
	}
	return outputSchema{codec: c, name: "the schema generated from " + v.features, definition: def.Version + "@" + def.Hash()}
}

// group is one consumer group of a run: one mode, its own output topics,
// instances and readers.
type group struct {
	mode     string // "default" or "eos"
	eos      bool
	name     string
	out, dlq string
	inst     [slots]*instance
	live     *collector // read_committed under --exactly-once
	raw      *collector // read_uncommitted; the same as live in the default mode
	cps      []checkpoint
	groups   groupTopics // the definition's re-keyed groups' outputs
	// The query API: each slot's base URL (its --api-addr, which it also
	// advertises to the group), the querier that asks them, the group's
	// committed offsets over the run, and what the querier got.
	api     [slots]string
	q       *querier
	commits *commitTimeline
	// groupCommits are, by re-keyed group, its second stages' committed
	// offsets of the repartition topic over the run.
	groupCommits map[string]*commitTimeline
	reqs         []*apiRequest
	skipped      int
	// quietFails: the finale found the first stages still renewing their
	// idle leases late in a quiet spell past the renewal hold (finale).
	quietFails []string
}

// run is one schedule over one input, consumed by a default-mode group and
// an exactly-once group with the same checkpoint store kind.
type run struct {
	t *testing.T
	// addr is the bootstrap list; nodes the broker, or the cluster's nodes;
	// links[i] the network path of instance slot i (its --brokers).
	addr   string
	nodes  []*kafkatest.PrivateBroker
	links  []*kafkatest.Link
	store  string
	v      variant
	out    outputSchema
	sched  schedule
	env    chaosEnv
	ctx    context.Context
	dir    string
	tl     *timeline
	groups []*group
	prod   *producer
	input  string
	notes  []string // what the processes did that the topic checks do not judge
	faults map[faultKind]int
	// lastFault is when the last fault ended: the final checks begin a
	// session timeout after it, once its rebalance is over.
	lastFault time.Time
	// stopPoll stops the committed-offset poller (startQueries).
	stopPoll func()
	// reg is a registry run's schema registry (nil: plain Avro).
	reg *srtest.Server
	// idleFrozen is closed when the last phase's idle freeze is over (nil:
	// it had none).
	idleFrozen chan struct{}
	// hopRecs holds the repartition topics read back after the run, by topic.
	hopRecs map[string]repartitionRead
}

func runChaos(t *testing.T, c *kafkatest.PrivateCluster, bin string, v variant, seed uint64, env chaosEnv) {
	nodes := c.Nodes
	store := v.store
	rks := v.rekeyedGroups(t)
	sched := makeSchedule(seed, env.duration, planTimes{session: sessionTimeout, idle: idleTimeout, pauses: len(rks) == 0, idleKills: len(rks) == 0, idleFreezes: true,
		nodes: len(nodes), nodeSession: nodeSession, lateApply: len(rks) == 0, registry: true})
	for i := range rks {
		rks[i].out.wire = sched.Registry
	}
	repro := fmt.Sprintf("VELOCITY_REQUIRE_KAFKA=1 VELOCITY_CHAOS_SEED=%d VELOCITY_CHAOS_DURATION=%s go test -tags integration -count=1 -v -run 'TestChaos/^%s$/' ./integration/chaos/",
		seed, env.duration, v.name)
	fmt.Fprintf(os.Stderr, "chaos: store %s, seed %d (reproduce: %s)\n", store, seed, repro)
	t.Logf("chaos: store %s, seed %d; reproduce with:\n  %s\n%s", store, seed, repro, sched)

	dir, keep := logDir(t, env, v.name, seed)
	r := &run{t: t, addr: c.Addr, nodes: nodes, links: c.Links, store: store, v: v, out: v.output(t), sched: sched, env: env, dir: dir, faults: map[faultKind]int{}}
	r.ctx = kafkatest.Context(t, sched.length()+10*time.Minute)
	tl, err := newTimeline(dir, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	r.tl = tl
	if err := os.WriteFile(filepath.Join(dir, "schedule.txt"), []byte(sched.String()+"\nreproduce: "+repro+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	addr := r.addr
	keepAll := map[string]string{"retention.ms": "-1"}
	portRng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), seed))
	ports := map[int]bool{}
	r.input = kafkatest.CreateTopic(t, addr, partitions, keepAll)
	var wire *wireFormat
	if sched.Registry {
		r.reg, wire = startRegistry(t, r.ctx, r.input, sched.InputSeed)
		r.out.wire = true
	}
	for _, eos := range []bool{false, true} {
		g := &group{mode: "default", eos: eos, name: kafkatest.Group(t),
			out: kafkatest.CreateTopic(t, addr, partitions, keepAll), dlq: kafkatest.CreateTopic(t, addr, partitions, keepAll),
			groups: createGroupTopics(t, r.ctx, addr, rks, keepAll)}
		if eos {
			g.mode = "eos"
		}
		snapTopic := kafkatest.Name(t, "snap")
		g.commits = &commitTimeline{}
		g.groupCommits = map[string]*commitTimeline{}
		for i := range g.inst {
			port, err := freePort(portRng, ports)
			if err != nil {
				t.Fatal(err)
			}
			g.api[i] = "http://127.0.0.1:" + strconv.Itoa(port)
			st := "kafka://" + snapTopic
			if store == "file" {
				sd := filepath.Join(dir, fmt.Sprintf("%s-state-%d", g.mode, i))
				if err := os.MkdirAll(sd, 0o755); err != nil {
					t.Fatal(err)
				}
				st = "file://" + sd
			}
			args := append([]string{
				"--brokers", r.links[i].Addr, "--group", g.name, "--input-topic", r.input,
				"--output-topic", g.out, "--dlq-topic", g.dlq, "--checkpoint-store", st,
				"--checkpoint-interval", checkpointInterval.String(), "--idle-timeout", idleTimeout.String(),
				"--session-timeout", sessionTimeout.String(), "--metrics-addr", "", "--log-level", r.env.logLevel,
				// The advertised URL defaults to http://127.0.0.1:<port>: where the
				// querier and the other instances reach this slot.
				"--api-addr", "127.0.0.1:" + strconv.Itoa(port),
			}, r.semantics()...)
			args = append(args, g.groups.flags()...)
			if eos {
				args = append(args, "--exactly-once")
			}
			g.inst[i] = &instance{name: fmt.Sprintf("%s-%d", g.mode, i), bin: bin, args: args,
				logs: filepath.Join(dir, fmt.Sprintf("%s-%d.log", g.mode, i)), tl: tl}
		}
		if g.live, err = newCollector(r.ctx, addr, g.out, g.dlq, eos, r.out, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.live.close)
		g.raw = g.live
		if eos {
			if g.raw, err = newCollector(r.ctx, addr, g.out, g.dlq, false, r.out, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.raw.close)
		}
		for _, rk := range g.groups.rk {
			if rk.live, err = newCollector(r.ctx, addr, rk.topic, g.dlq, eos, rk.out, rk.name); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rk.live.close)
			rk.raw = rk.live
			if eos {
				if rk.raw, err = newCollector(r.ctx, addr, rk.topic, g.dlq, false, rk.out, rk.name); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(rk.raw.close)
			}
		}
		r.groups = append(r.groups, g)
	}
	t.Cleanup(func() {
		var all []*instance
		for _, g := range r.groups {
			all = append(all, g.inst[:]...)
		}
		for _, in := range all {
			_, _ = in.stop(syscall.SIGKILL, 10*time.Second)
		}
		tl.close()
		if t.Failed() || keep {
			t.Logf("chaos: logs of this run (instances, timeline, schedule) kept in %s", dir)
		} else {
			os.RemoveAll(dir)
		}
	})
	// No delivery timeout: franz-go measures it from the record's timestamp,
	// which is the event time, days ago. producer.burst bounds the wait.
	pcl := kafkatest.Client(t, addr, kgo.DefaultProduceTopic(r.input), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond), kgo.RecordDeliveryTimeout(0), kgo.RetryTimeout(5*time.Minute))
	r.prod = &producer{cl: pcl, gen: newGenerator(sched.InputSeed)}
	r.prod.gen.wire = wire

	// The schedule, with the query API asked throughout, and the groups'
	// committed offsets polled throughout, until the last checkpoint.
	tl.logf("store %s, seed %d: start default-0 and eos-0; %d phases planned over %s", store, seed, len(sched.Phases), sched.length())
	for _, g := range r.groups {
		r.must(g.inst[0].start())
	}
	r.startQueries(seed)
	for i, p := range sched.Phases {
		r.phase(i, p)
	}
	r.waitIdleFreeze(r.idleFrozen) // the last phase has none: addIdleFreezes
	tl.logf("schedule done: %d records produced; faults: %v", r.prod.total, r.faults)
	r.finale()
	r.stopQueries()

	// The checks.
	adm := kafkatest.Admin(t, addr)
	ends := r.inputEnds(adm)
	replayOut := kafkatest.CreateTopic(t, addr, partitions, keepAll)
	replayDLQ := kafkatest.CreateTopic(t, addr, partitions, keepAll)
	replayGroups := createGroupTopics(t, r.ctx, addr, rks, keepAll)
	tl.logf("replay of %s into %s and %s", r.input, replayOut, replayDLQ)
	replay, replayByGroup := r.replay(bin, addr, replayOut, replayDLQ, replayGroups)
	gen, err := readInput(r.ctx, addr, r.input, ends)
	if err != nil {
		t.Fatalf("read the input back: %v", err)
	}
	vin := verdictInput{inputTopic: r.input, ends: ends, replay: replay, gen: gen, txs: r.prod.gen.txs}
	if r.v.features != "" {
		vin.codec = r.out.codec
	}
	replayFails := checkReplay(vin)
	if len(replayFails) > 0 {
		vin.replay = nil // no reference: check the rest only
	}
	// The query API's answers, judged by the input and replay's verdicts.
	var model *apiModel
	var modelErr error
	var lateFails []string
	if vin.replay != nil {
		model, modelErr = r.apiModel(ends, replay, gen)
		if model != nil {
			var ls lateStats
			lateFails, ls = model.checkLate(replay, gen, r.prod.gen.txs, vin.codec)
			tl.logf("late rule, replay under --late=%s: %d late events counted (late=true), %d dead-lettered late; %d verdicts unlike the input's", r.sched.Late, ls.counted, ls.dead, len(lateFails))
		}
	}
	// How long a late event counted in one run and not in another stays in
	// its entity's windows (idleExcuses).
	var horizon int64
	if specs, err := r.velocitySpecs(); err == nil {
		for _, sp := range specs {
			horizon = max(horizon, sp.WindowMs+sp.BucketMs)
		}
	} else {
		t.Fatal(err)
	}
	r.summary(ends)
	for _, g := range r.groups {
		fails := append(append(append([]string(nil), replayFails...), lateFails...), g.quietFails...)
		gvin := vin
		reordered := map[int32]map[string]bool{}
		if vin.replay != nil {
			var outs []map[srcKey][]output
			for _, cp := range g.cps {
				outs = append(outs, cp.outs)
			}
			var ooo map[srcKey]bool
			gvin.excused, ooo = idleExcuses(ends, replay, outs, gen, r.prod.gen.txs, horizon)
			for k := range ooo {
				if reordered[k.part] == nil {
					reordered[k.part] = map[string]bool{}
				}
				reordered[k.part][r.prod.gen.txs[genID(gen[k])].entity] = true
			}
			tl.logf("idle rule, %s: %d events counted out of order after an idle release (by the order of the features records, or dead-lettered late); %d offsets held to replay's within its bounds only (idle_test.go):%s",
				g.mode, len(ooo), len(gvin.excused), describeExcuses(gvin.excused))
		}
		for _, cp := range g.cps {
			fails = append(fails, check(cp, gvin)...)
		}
		if r.reg != nil {
			outs := []map[srcKey][]output{replay}
			for _, cp := range g.cps {
				outs = append(outs, cp.outs)
			}
			fails = append(fails, r.checkSchemaIDs(r.out, outs...)...)
		}
		st := &apiStats{skipped: g.skipped}
		switch {
		case modelErr != nil:
			fails = append(fails, fmt.Sprintf("query API: no answer judged: %v", modelErr))
		case model != nil:
			je := &judgeEnv{floors: map[string]*commitTimeline{"": g.commits}, rel: tl.at, reordered: reordered,
				dropped: lateOnlyLive(vin.replay, g.cps)}
			for name, c := range g.groupCommits {
				je.floors[name] = c
			}
			if len(g.groups.rk) > 0 {
				var err error
				if je.groups, err = r.groupModels(g, vin.gen); err != nil {
					fails = append(fails, fmt.Sprintf("query API: re-keyed groups' answers not judged: %v", err))
				}
			}
			fails = append(fails, model.checkAnswers(g.reqs, je, st)...)
			// Refusing is always allowed, so an API that refused every read would
			// pass every other check: most of a run has a live, settled owner,
			// and 200s were 29 % or more of the answers in every run so far.
			if answered := st.ok + st.unavailable + st.other; answered >= 100 && st.ok*20 < answered {
				fails = append(fails, fmt.Sprintf("query API: only %d of %d answers were 200s: the instances refused nearly every read", st.ok, answered))
			}
		}
		tl.logf("query API, %s: %s", g.mode, st)
		for i, rk := range g.groups.rk {
			gin := vin
			gin.replay, gin.codec, gin.excused = replayByGroup[i], rk.out.codec, nil
			gin.only = map[srcKey]bool{}
			for k := range gin.replay {
				gin.only[k] = true
				if rs := vin.replay[k]; vin.replay != nil && (len(rs) != 1 || rs[0].dead) {
					fails = append(fails, fmt.Sprintf("replay: group %s has an output for input %d/%d, which the input partition dead-lettered", rk.name, k.part, k.offset))
				}
			}
			fails = append(fails, prefixAll("group "+rk.name+": ", checkReplay(gin))...)
			if len(replayFails) > 0 {
				gin.replay = nil
			}
			// The one documented exception to replay equality (docs/repartition.md,
			// the idle rule): an event that reached the second stage after the
			// idle rule let the group's order pass it is counted out of order
			// (late=true) or dead-lettered late_after_idle. Around each counted
			// one, its key's outputs are held to the bounds of groupIdleExcuses
			// and every other row to replay's; a late_after_idle dead letter
			// leaves its key's windows short for longer, and a run with one holds
			// the group to the accounting and exactly-once invariants only. Every
			// one of them, counted or dead-lettered, must be one the idle rule
			// can have let through with leased declarations (lease_test.go):
			// a lost owner's declaration that never ran out passes the bounds
			// above, and only this rule catches it.
			if gin.replay != nil {
				var outs []map[srcKey][]output
				for _, cp := range rk.cps {
					outs = append(outs, cp.outs)
				}
				ex, ooo, dead := groupIdleExcuses(gin.replay, outs, gen, r.prod.gen.txs, rk.out.codec)
				kinds := map[string]int{}
				for k := range ooo {
					kind, _, _ := strings.Cut(gen[k], " ") // "<kind> <event id>"
					kinds[kind]++
				}
				leaseNote := ""
				if len(ooo) > 0 {
					topic := repartitionTopic(g.name, rk.name)
					if recs, _, err := r.repartitionRecords(topic, g.eos); err != nil {
						fails = append(fails, fmt.Sprintf("group %s (%s): the idle lease rule not judged: read %s: %v", rk.name, g.mode, topic, err))
					} else {
						lf, within := checkGroupLeases(rk.name, g.mode, topic, recs, ooo, gen)
						fails = append(fails, lf...)
						leaseNote = fmt.Sprintf("; %d of them below the frontier a leased idle declaration allows (lease_test.go)", within)
					}
				}
				switch {
				case dead > 0:
					r.note("group %s (%s): %d events dead-lettered late_after_idle; its rows are not held to replay's in this run", rk.name, g.mode, dead)
					tl.logf("idle rule, group %s (%s): %d events counted out of order or dead-lettered late_after_idle (%d), by input kind %v%s;%s", rk.name, g.mode, len(ooo), dead, kinds, leaseNote, describeOffsets(ooo))
					gin.replay = nil
				default:
					gin.excused = ex
					tl.logf("idle rule, group %s (%s): %d events counted out of order (late=true), by input kind %v%s; %d offsets held to replay's within its bounds only%s", rk.name, g.mode, len(ooo), kinds, leaseNote, len(ex), describeOffsets(ooo))
				}
			}
			for _, cp := range rk.cps {
				fails = append(fails, prefixAll("group "+rk.name+": ", check(cp, gin))...)
			}
			if r.reg != nil {
				outs := []map[srcKey][]output{replayByGroup[i]}
				for _, cp := range rk.cps {
					outs = append(outs, cp.outs)
				}
				fails = append(fails, prefixAll("group "+rk.name+": ", r.checkSchemaIDs(rk.out, outs...))...)
			}
			for _, col := range []*collector{rk.live, rk.raw} {
				if bad, _ := col.problems(); len(bad) > 0 {
					fails = append(fails, fmt.Sprintf("group %s: %d output records are not readable as the contract says; first: %s", rk.name, len(bad), bad[0]))
				}
			}
		}
		for _, col := range []*collector{g.live, g.raw} {
			bad, fetch := col.problems()
			if len(bad) > 0 {
				fails = append(fails, fmt.Sprintf("%d output records are not readable as the contract says; first: %s", len(bad), bad[0]))
			}
			if len(fetch) > 0 {
				r.note("the checker's reader of %s saw fetch errors (expected around a broker restart): %s", g.out, strings.Join(fetch, "; "))
			}
		}
		outcome := "pass"
		if len(fails) > 0 {
			outcome = fmt.Sprintf("FAIL (%d checks)", len(fails))
			var b strings.Builder
			fmt.Fprintf(&b, "chaos: mode %s, store %s, seed %d: %d invariants broken over %d input offsets of %s.\n", g.mode, store, seed, len(fails), total(ends), r.input)
			fmt.Fprintf(&b, "input end offsets: %s\n", describeEnds(ends))
			fmt.Fprintf(&b, "reproduce: %s\n", repro)
			fmt.Fprintf(&b, "logs: %s (%s-N.log per process slot of this mode's group %s, timeline.log, schedule.txt, replay.log)\n", dir, g.mode, g.name)
			fmt.Fprintf(&b, "query API: slots %s; %s\n", strings.Join(g.api[:], ", "), st)
			for _, f := range fails {
				fmt.Fprintf(&b, "\n- %s\n", f)
			}
			if len(r.notes) > 0 {
				fmt.Fprintf(&b, "\nnotes:\n  %s\n", strings.Join(r.notes, "\n  "))
			}
			t.Error(b.String())
		}
		if env.report != "" {
			line := fmt.Sprintf("%s\t%s-%s\tseed=%d\tlate=%s\tregistry=%v\tduration=%s\trecords=%d\tfaults=%v\tself-exits=%d\tapi=%d/%d/%d/%d\t%s\tlogs=%s\n",
				time.Now().UTC().Format(time.RFC3339), g.mode, v.name, seed, sched.Late, sched.Registry, time.Since(tl.begin).Round(time.Second), total(ends), r.faults, r.selfExits(g),
				st.ok, st.unavailable, st.other, st.transport, outcome, dir)
			if f, err := os.OpenFile(env.report, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
				f.WriteString(line)
				f.Close()
			}
		}
	}
	if !t.Failed() && len(r.notes) > 0 {
		t.Logf("chaos: notes:\n  %s", strings.Join(r.notes, "\n  "))
	}
}

func prefixAll(prefix string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = prefix + s
	}
	return out
}

// logDir returns the run's log directory and whether to keep it after a pass.
func logDir(t *testing.T, env chaosEnv, store string, seed uint64) (string, bool) {
	name := fmt.Sprintf("%s-seed-%d-%s", store, seed, time.Now().UTC().Format("20060102T150405"))
	if env.logs != "" {
		d := filepath.Join(env.logs, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d, true
	}
	d, err := os.MkdirTemp("", "velocity-chaos-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	return d, false
}

func (r *run) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

// each runs f on instance slot of every group at once and waits.
func (r *run) each(slot int, f func(*instance)) {
	var wg sync.WaitGroup
	for _, g := range r.groups {
		wg.Add(1)
		go func() { defer wg.Done(); f(g.inst[slot]) }()
	}
	wg.Wait()
}

// phase runs one phase: its input (a burst or a quiet period) in the
// background and its fault, if any, at its moment.
func (r *run) phase(i int, p phase) {
	r.tl.logf("phase %d: %s", i, p)
	begin := time.Now()
	done := make(chan error, 1)
	var paused chan time.Time
	if p.IdleKill {
		paused = make(chan time.Time, 1)
	}
	go func() {
		if p.Records > 0 {
			done <- r.prod.burst(r.ctx, p.Records, p.Length, p.PauseAt, p.Pause, paused)
			return
		}
		select {
		case <-time.After(p.Length):
		case <-r.ctx.Done():
		}
		done <- nil
	}()
	// The idle kill goes on beside the phase's fault, on another instance.
	idleKilled := make(chan error, 1)
	if p.IdleKill {
		go func() { idleKilled <- r.idleKill(p, paused) }()
	} else {
		idleKilled <- nil
	}
	// So does the idle freeze of a quiet phase, into the next phase, which
	// waits for it at its end (waitIdleFreeze).
	prev := r.idleFrozen
	if p.IdleFreeze {
		done := make(chan struct{})
		r.idleFrozen = done
		go func() { defer close(done); r.idleFreeze(p, begin) }()
	} else {
		r.idleFrozen = nil
	}
	if p.Fault != faultNone {
		time.Sleep(time.Until(begin.Add(p.At)))
		r.fault(p)
		r.faults[p.Fault]++
		r.lastFault = time.Now()
	}
	if err := <-done; err != nil {
		r.t.Fatalf("phase %d: produce the input: %v", i, err)
	}
	if err := <-idleKilled; err != nil {
		r.t.Fatalf("phase %d: idle kill: %v", i, err)
	}
	if p.IdleKill {
		r.faults[faultIdleKill]++
		r.lastFault = time.Now()
	}
	r.waitIdleFreeze(prev)
	r.supervise()
}

// waitIdleFreeze waits for an idle freeze (nil: none) to end, and counts it.
func (r *run) waitIdleFreeze(done chan struct{}) {
	if done == nil {
		return
	}
	<-done
	r.faults[faultIdleFreeze]++
	r.lastFault = time.Now()
}

// idleFreeze does a quiet phase's IdleFreeze: at the phase's start (begin, when
// the input went quiet) + --idle-timeout + IdleFreezeAfter, SIGSTOP instance
// IdleFreezeSlot of both groups, and SIGCONT it IdleFreezeDur later, within the
// session timeout: it keeps its partitions, and the next phase's input begins
// while it sleeps. An instance not running then, or frozen, is left alone.
func (r *run) idleFreeze(p phase, begin time.Time) {
	time.Sleep(time.Until(begin.Add(idleTimeout + p.IdleFreezeAfter)))
	frozen := r.awake(p.IdleFreezeSlot, "idle freeze")
	r.tl.logf("idle freeze: SIGSTOP %s at %s, %s after the input went quiet, SIGCONT %s later",
		names(frozen), time.Now().UTC().Format("15:04:05.000Z"), time.Since(begin).Round(time.Millisecond), p.IdleFreezeDur)
	for _, in := range frozen {
		in.signal(syscall.SIGSTOP)
	}
	time.Sleep(p.IdleFreezeDur)
	for _, in := range frozen {
		r.tl.logf("SIGCONT %s", in.name)
		in.signal(syscall.SIGCONT)
	}
}

// awake returns instance slot of every group that is running and not frozen;
// the timeline says, for what, which ones it leaves alone.
func (r *run) awake(slot int, what string) []*instance {
	var out []*instance
	for _, g := range r.groups {
		in := g.inst[slot]
		switch run, frozen := in.state(); {
		case !run:
			r.tl.logf("%s: %s is not running; left alone", what, in.name)
		case frozen:
			r.tl.logf("%s: %s is frozen; left alone", what, in.name)
		default:
			out = append(out, in)
		}
	}
	return out
}

// idleKill does p's IdleKill: once the burst's input has paused (paused) for
// --idle-timeout and IdleKillAfter more, when the partitions have released
// their reorder buffers by the idle rule but the next checkpoint has not yet
// committed the release, SIGKILL instance IdleKillSlot of both groups and
// start it again IdleKillDur later. An instance not running then (it exited by
// itself) or frozen is left alone. It runs on a goroutine of its own, beside
// the phase's fault, so it reports an error rather than failing the test.
func (r *run) idleKill(p phase, paused <-chan time.Time) error {
	at, ok := <-paused
	if !ok {
		r.tl.logf("idle kill: the burst ended without its pause; nothing killed")
		return nil
	}
	r.tl.logf("idle kill: the input paused at %s; SIGKILL instance %d %s past the idle timeout", at.UTC().Format("15:04:05.000Z"), p.IdleKillSlot, p.IdleKillAfter)
	time.Sleep(time.Until(at.Add(idleTimeout + p.IdleKillAfter)))
	killed := r.awake(p.IdleKillSlot, "idle kill")
	// The instances' logs have wall-clock times: the moment, to the
	// millisecond, to set beside their idle releases and checkpoints.
	r.tl.logf("idle kill: SIGKILL %s at %s, %s after the pause began (meant to fall after the idle release, before its checkpoint), start again %s later",
		names(killed), time.Now().UTC().Format("15:04:05.000Z"), time.Since(at).Round(time.Millisecond), p.IdleKillDur)
	r.stopAll(syscall.SIGKILL, killed...)
	time.Sleep(p.IdleKillDur)
	for _, in := range killed {
		r.tl.logf("start %s", in.name)
		if err := in.start(); err != nil {
			return err
		}
	}
	return nil
}

// fault does p's fault to both groups at once (and to the broker).
func (r *run) fault(p phase) {
	tl := r.tl
	start := func(in *instance) {
		tl.logf("start %s", in.name)
		r.must(in.start())
	}
	switch p.Fault {
	case faultKill:
		var killed []*instance
		for _, g := range r.groups {
			if in := g.inst[p.Slot]; in.running() {
				killed = append(killed, in)
			} else {
				tl.logf("%s is not running (it exited by itself); starting it", in.name)
				start(in)
			}
		}
		tl.logf("SIGKILL %s", names(killed))
		r.stopAll(syscall.SIGKILL, killed...)
		time.Sleep(p.Dur)
		for _, in := range killed {
			start(in)
		}
	case faultFreeze:
		r.each(p.Slot, func(in *instance) { tl.logf("SIGSTOP %s", in.name); in.signal(syscall.SIGSTOP) })
		time.Sleep(p.Dur)
		r.each(p.Slot, func(in *instance) { tl.logf("SIGCONT %s", in.name); in.signal(syscall.SIGCONT) })
	case faultNetCut:
		if p.Nodes == 0 {
			tl.logf("cut instance %d off from the brokers (its query API stays reachable)", p.Slot)
			r.links[p.Slot].Cut()
		} else {
			tl.logf("cut instance %d off from broker node %s only (its query API stays reachable)", p.Slot, nodeNames(p.Nodes))
			r.links[p.Slot].CutNodes(p.Nodes.list()...)
		}
		time.Sleep(p.Dur)
		tl.logf("heal instance %d's network path to the brokers", p.Slot)
		r.links[p.Slot].Heal()
	case faultRegistry:
		tl.logf("schema registry down")
		r.reg.Down()
		time.Sleep(500 * time.Millisecond)
		var killed []*instance
		for _, g := range r.groups {
			if in := g.inst[p.Slot]; in.running() {
				killed = append(killed, in)
			}
		}
		// Started again at once, with no schema cached: its records wait for
		// the registry, and if it cannot register its output schema in the
		// 30 s the start gives it, it exits (and is started again, noted).
		tl.logf("SIGKILL %s, start again with the registry down", names(killed))
		r.stopAll(syscall.SIGKILL, killed...)
		for _, in := range killed {
			start(in)
		}
		time.Sleep(p.Dur - 500*time.Millisecond)
		r.reg.Up(r.t)
		tl.logf("schema registry up")
	case faultScaleUp:
		tl.logf("scale up: start instances 1 and 2")
		for _, g := range r.groups {
			start(g.inst[1])
			start(g.inst[2])
		}
	case faultScaleDown:
		tl.logf("scale down: SIGTERM instances 1 and 2")
		var ins []*instance
		for _, g := range r.groups {
			ins = append(ins, g.inst[1], g.inst[2])
		}
		r.stopAll(syscall.SIGTERM, ins...)
	case faultBroker:
		down := r.nodes
		if len(r.nodes) > 1 {
			down = nil
			for _, i := range p.Nodes.list() {
				down = append(down, r.nodes[i])
			}
			tl.logf("SIGKILL broker node(s) %s", nodeNames(p.Nodes))
		} else {
			tl.logf("SIGKILL the broker")
		}
		for _, n := range down {
			n.Kill(r.t)
		}
		time.Sleep(p.Dur)
		tl.logf("restart the broker")
		// One at a time: of three nodes, the first back restores the
		// controllers' quorum with the one left running.
		for _, n := range down {
			n.Restart(r.t)
		}
		tl.logf("broker answers again")
	case faultRolling:
		first := p.Nodes.list()[0]
		c := &kafkatest.PrivateCluster{Addr: r.addr, Nodes: r.nodes}
		for k := range r.nodes {
			i := (first + k) % len(r.nodes)
			tl.logf("rolling restart: stop broker node %d", i+1)
			r.nodes[i].Stop(r.t)
			r.nodes[i].Restart(r.t)
			// As an operator would: the next node only once no partition is
			// under-replicated, or after a minute at most.
			if err := c.WaitInSync(r.ctx, time.Minute); err != nil {
				tl.logf("rolling restart: node %d back, but %v; going on", i+1, err)
			} else {
				tl.logf("rolling restart: node %d back and every replica in sync", i+1)
			}
		}
	case faultNodeFreeze:
		n := r.nodes[p.Nodes.list()[0]]
		tl.logf("SIGSTOP broker node %s", nodeNames(p.Nodes))
		n.Freeze(r.t)
		time.Sleep(p.Dur)
		tl.logf("SIGCONT broker node %s", nodeNames(p.Nodes))
		n.Thaw(r.t)
	case faultGraceful:
		var up []*instance
		for _, g := range r.groups {
			for _, in := range g.inst {
				if in.running() {
					up = append(up, in)
				}
			}
		}
		tl.logf("graceful restart: SIGTERM %d instances", len(up))
		r.stopAll(syscall.SIGTERM, up...)
		time.Sleep(p.Dur)
		for _, in := range up {
			start(in)
		}
	}
}

func names(ins []*instance) string {
	var n []string
	for _, in := range ins {
		n = append(n, in.name)
	}
	return strings.Join(n, ", ")
}

// stopAll stops the instances at once and waits for all of them.
func (r *run) stopAll(sig syscall.Signal, ins ...*instance) {
	var wg sync.WaitGroup
	for _, in := range ins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := in.stop(sig, gracefulStop)
			if err != nil {
				r.tl.logf("%v", err)
				r.note("%v; end of its log:\n%s", err, in.tail(15))
			} else if sig == syscall.SIGTERM {
				r.tl.logf("%s stopped after SIGTERM in %s", in.name, d.Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
}

var noteMu sync.Mutex

func (r *run) note(format string, args ...any) {
	noteMu.Lock()
	defer noteMu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// supervise starts again an instance of the current topology that exited by
// itself, as an orchestrator would; the exit is noted.
func (r *run) supervise() {
	for _, g := range r.groups {
		want := 1
		if g.inst[1].running() || g.inst[2].running() {
			want = 3
		}
		for _, in := range g.inst[:want] {
			if !in.running() {
				r.tl.logf("%s exited by itself; starting it again", in.name)
				in.mu.Lock()
				exits := append([]string(nil), in.selfExit...)
				in.mu.Unlock()
				r.note("%s exited by itself (%v); end of its log:\n%s", in.name, exits, in.tail(15))
				r.must(in.start())
			}
		}
	}
}

func (r *run) selfExits(g *group) int {
	n := 0
	for _, in := range g.inst {
		in.mu.Lock()
		n += len(in.selfExit)
		in.mu.Unlock()
	}
	return n
}

// quietRenewals waits, with no input, past the hold after which the first
// stages of re-keyed groups stop renewing their idle leases (the hold counts
// from the input's last activity, which ends once every input offset is
// committed: a checkpoint interval after settling), and holds them to it: in
// the quiet spell's last seconds nothing may reach a repartition topic, since
// only renewals (and under exactly-once their commits) would. The repartition
// topics carry the brokers' append times, so ListOffsetsAfterMilli gives the
// first record appended after a moment.
func (r *run) quietRenewals(adm *kadm.Client) {
	const tail = 3 * time.Second
	wait := service.RenewalHold(idleTimeout, allowedLateness) + checkpointInterval + 4*time.Second + tail
	r.tl.logf("quiet for %s more: the first stages' lease renewals stop; none may reach a repartition topic in its last %s", wait, tail)
	select {
	case <-time.After(wait - tail):
	case <-r.ctx.Done():
		return
	}
	from := time.Now()
	select {
	case <-time.After(tail):
	case <-r.ctx.Done():
		return
	}
	for _, g := range r.groups {
		for _, rk := range g.groups.rk {
			topic := repartitionTopic(g.name, rk.name)
			ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
			after, err := adm.ListOffsetsAfterMilli(ctx, from.UnixMilli(), topic)
			var ends kadm.ListedOffsets
			if err == nil {
				ends, err = adm.ListEndOffsets(ctx, topic)
			}
			cancel()
			if err == nil {
				err = cmp.Or(after.Error(), ends.Error())
			}
			if err != nil {
				r.note("group %s (%s): could not list %s's offsets after the quiet spell: %v", rk.name, g.mode, topic, err)
				continue
			}
			n := int64(0)
			ends.Each(func(e kadm.ListedOffset) {
				if a, ok := after.Lookup(topic, e.Partition); ok {
					n += e.Offset - a.Offset
				}
			})
			r.tl.logf("group %s (%s): %d records reached %s in the quiet spell's last %s", rk.name, g.mode, n, topic, tail)
			if n > 0 {
				g.quietFails = append(g.quietFails, fmt.Sprintf("group %s: %d records reached %s in the last %s of a quiet spell %s past the input's last record: the first stages went on renewing their idle leases past the hold (docs/repartition.md, \"Renewals wait for input\")", rk.name, n, topic, tail, wait))
			}
		}
	}
}

// finale brings the run to its checks: a settling time with no fault, a last
// burst of input, then the checkpoints at which each group's topics are read:
//
//  1. once the input has been quiet for --checkpoint-interval + --idle-timeout
//     (+ slack): the exactly-once promise is that outputs are visible within
//     a checkpoint interval, and the tail a partition's reorder buffer holds
//     when the input stops is released by the idle timeout;
//  2. after a SIGTERM of every instance;
//  3. after one instance is started again with no new input and SIGTERMed.
func (r *run) finale() {
	t, tl := r.t, r.tl
	adm := kafkatest.Admin(t, r.addr)

	// Settle: the last fault's rebalance is over (the session timeout of a
	// killed or frozen process has passed), and the processes have read all
	// the input so far (some output, committed or not, for every offset), or
	// two minutes have passed.
	r.supervise()
	settle := r.lastFault.Add(sessionTimeout + 2*time.Second)
	sctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
	ends := r.inputEnds(adm)
	begin := time.Now()
	for _, g := range r.groups {
		for {
			snap, err := g.raw.catchUp(sctx)
			if err == nil && covered(snap, ends) == total(ends) && time.Now().After(settle) {
				break
			}
			if sctx.Err() != nil {
				tl.logf("settle: group %s had not read all %d input offsets after %s (%d covered); going on", g.mode, total(ends), time.Since(begin).Round(time.Second), covered(snap, ends))
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	cancel()
	tl.logf("settled in %s", time.Since(begin).Round(100*time.Millisecond))
	// The first stages of re-keyed groups renew their idle leases only while
	// the input is active (docs/repartition.md, "Renewals wait for input"): the
	// quiet spell outlasts that hold, so that the last burst arrives on first
	// stages that have stopped renewing, and checkpoint 1 holds their renewals
	// to starting again in time for the groups' rows.
	if len(r.groups) > 0 && len(r.groups[0].groups.rk) > 0 {
		r.quietRenewals(adm)
	}

	const lastBurst = 1500
	tl.logf("last burst: %d records over 1.5s", lastBurst)
	r.must(r.prod.burst(r.ctx, lastBurst, 1500*time.Millisecond, 0, 0, nil))
	quiet := time.Now()
	ends = r.inputEnds(adm)
	tl.logf("input quiet: %d records in all", total(ends))

	// Checkpoint 1: poll until every input offset has an output, at most
	// --checkpoint-interval + --idle-timeout + slack after the input stopped.
	deadline := quiet.Add(checkpointInterval + idleTimeout + r.env.slack)
	label := fmt.Sprintf("checkpoint 1 (input quiet for --checkpoint-interval %s + --idle-timeout %s + slack %s)", checkpointInterval, idleTimeout, r.env.slack)
	for _, g := range r.groups {
		var snap map[srcKey][]output
		for {
			cctx, cancel := context.WithDeadline(r.ctx, deadline.Add(10*time.Second))
			s, err := g.live.catchUp(cctx)
			cancel()
			if err == nil {
				snap = s
			} else {
				tl.logf("reading the outputs of %s: %v", g.mode, err)
			}
			if snap != nil && covered(snap, ends) == total(ends) {
				tl.logf("checkpoint 1, %s: all %d input offsets have an output %s after the input went quiet", g.mode, total(ends), time.Since(quiet).Round(100*time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				tl.logf("checkpoint 1, %s: %d of %d input offsets have an output %s after the input went quiet", g.mode, covered(snap, ends), total(ends), time.Since(quiet).Round(100*time.Millisecond))
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		g.cps = append(g.cps, checkpoint{label: label, eos: g.eos, outs: snap})
		// A re-keyed group's outputs follow the input's: its second stages
		// release once every input partition's idle marker is in, and publish
		// (or commit) at their own next checkpoint. The checker cannot count
		// what to expect before the replay, so it waits for the count to stop
		// growing, within --idle-timeout + two --checkpoint-intervals + slack
		// of the input going quiet.
		gdeadline := quiet.Add(2*checkpointInterval + idleTimeout + r.env.slack)
		for _, rk := range g.groups.rk {
			var gsnap map[srcKey][]output
			stable, last := time.Time{}, -1
			for {
				cctx, cancel := context.WithDeadline(r.ctx, gdeadline.Add(10*time.Second))
				s, err := rk.live.catchUp(cctx)
				cancel()
				if err == nil {
					gsnap = s
				}
				if n := len(gsnap); n != last {
					last, stable = n, time.Now()
				}
				if time.Since(stable) >= 3*time.Second && time.Since(quiet) >= idleTimeout+checkpointInterval || time.Now().After(gdeadline) {
					tl.logf("checkpoint 1, %s group %s: %d input records have an output %s after the input went quiet", g.mode, rk.name, len(gsnap), time.Since(quiet).Round(100*time.Millisecond))
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			rk.cps = append(rk.cps, checkpoint{label: label + " (plus another --checkpoint-interval for the second stage)", eos: g.eos, outs: gsnap})
		}
	}

	// Checkpoint 2: every instance stopped gracefully.
	var up []*instance
	for _, g := range r.groups {
		for _, in := range g.inst {
			if in.running() {
				up = append(up, in)
			}
		}
	}
	tl.logf("SIGTERM every instance (%d)", len(up))
	r.stopAll(syscall.SIGTERM, up...)
	for _, g := range r.groups {
		g.cps = append(g.cps, checkpoint{label: "checkpoint 2 (after a SIGTERM of every instance)", eos: g.eos, outs: r.read(g)})
		for _, rk := range g.groups.rk {
			rk.cps = append(rk.cps, checkpoint{label: "checkpoint 2 (after a SIGTERM of every instance)", eos: g.eos, outs: r.readCollector(rk.live, g.mode+" group "+rk.name)})
		}
	}

	// Checkpoint 3: a restart with no new input, then SIGTERM again.
	tl.logf("start instance 0 of each group with no new input")
	for _, g := range r.groups {
		r.must(g.inst[0].start())
	}
	time.Sleep(checkpointInterval + idleTimeout + 4*time.Second) // joining the group and restoring take about a second or two
	tl.logf("SIGTERM instance 0 of each group")
	r.stopAll(syscall.SIGTERM, r.groups[0].inst[0], r.groups[1].inst[0])
	for _, g := range r.groups {
		g.cps = append(g.cps, checkpoint{label: "checkpoint 3 (after a restart with no new input and another SIGTERM)", eos: g.eos, outs: r.read(g)})
		for _, rk := range g.groups.rk {
			rk.cps = append(rk.cps, checkpoint{label: "checkpoint 3 (after a restart with no new input and another SIGTERM)", eos: g.eos, outs: r.readCollector(rk.live, g.mode+" group "+rk.name)})
		}
	}
}

// read waits for a group's reader to reach the topics' ends.
func (r *run) read(g *group) map[srcKey][]output { return r.readCollector(g.live, g.mode) }

func (r *run) readCollector(c *collector, what string) map[srcKey][]output {
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	snap, err := c.catchUp(ctx)
	if err != nil {
		r.t.Fatalf("read the outputs of %s: %v", what, err)
	}
	return snap
}

func (r *run) inputEnds(adm *kadm.Client) map[int32]int64 {
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	for {
		l, err := adm.ListEndOffsets(ctx, r.input)
		if err == nil {
			err = l.Error()
		}
		if err == nil {
			out := map[int32]int64{}
			l.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
			if len(out) == partitions {
				return out
			}
		}
		if ctx.Err() != nil {
			r.t.Fatalf("list the end offsets of %s: %v", r.input, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func describeEnds(ends map[int32]int64) string {
	var parts []string
	for p := range int32(partitions) {
		parts = append(parts, fmt.Sprintf("partition %d: %d", p, ends[p]))
	}
	return strings.Join(parts, ", ")
}

func total(ends map[int32]int64) int {
	n := 0
	for _, e := range ends {
		n += int(e)
	}
	return n
}

func covered(outs map[srcKey][]output, ends map[int32]int64) int {
	n := 0
	for k := range outs {
		if e, ok := ends[k.part]; ok && k.offset >= 0 && k.offset < e {
			n++
		}
	}
	return n
}

// replay runs `velocity-consumer replay` of the whole input into two topics
// and reads them back.
func (r *run) replay(bin, addr, out, dlq string, groups groupTopics) (map[srcKey][]output, []map[srcKey][]output) {
	t := r.t
	ctx, cancel := context.WithTimeout(r.ctx, 3*time.Minute)
	defer cancel()
	logPath := filepath.Join(r.dir, "replay.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args := append([]string{"replay", "--brokers", addr, "--input-topic", r.input, "--from", "start", "--to", "end",
		"--output", "topic:" + out, "--dlq", "topic:" + dlq, "--quiet", "--log-format", "json"}, r.semantics()...)
	args = append(args, groups.flags()...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = f, f
	if err := spawn(cmd); err != nil {
		t.Fatalf("start replay: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("velocity-consumer %s: %v; log %s", strings.Join(args, " "), err, logPath)
	}
	read := func(features string, out outputSchema, group string) map[srcKey][]output {
		col, err := newCollector(ctx, addr, features, dlq, false, out, group)
		if err != nil {
			t.Fatal(err)
		}
		defer col.close()
		snap, err := col.catchUp(ctx)
		if err != nil {
			t.Fatalf("read the replay's outputs: %v", err)
		}
		if bad, _ := col.problems(); len(bad) > 0 {
			t.Fatalf("replay's outputs are not readable as the contract says: %s", bad[0])
		}
		return snap
	}
	snap := read(out, r.out, "")
	var byGroup []map[srcKey][]output
	for _, rk := range groups.rk {
		byGroup = append(byGroup, read(rk.topic, rk.out, rk.name))
	}
	return snap, byGroup
}

// summary logs what the run did and saw, pass or fail.
func (r *run) summary(ends map[int32]int64) {
	r.tl.logf("input records by kind: %v", r.prod.gen.kinds)
	for _, g := range r.groups {
		last := g.cps[len(g.cps)-1].outs
		repeats := 0
		for _, os := range last {
			repeats += len(os) - 1
		}
		extra := ""
		if g.eos {
			if raw, err := g.raw.catchUp(r.ctx); err == nil {
				n := 0
				for _, os := range raw {
					n += len(os)
				}
				extra = fmt.Sprintf("; a read_uncommitted reader sees %d records (aborted transactions included)", n)
			}
		}
		starts := 0
		for _, in := range g.inst {
			starts += in.starts
		}
		r.tl.logf("summary, %s: %d input offsets, %d outputs repeated%s; %d process starts, %d exits nobody asked for; faults %v",
			g.mode, total(ends), repeats, extra, starts, r.selfExits(g), r.faults)
	}
}
