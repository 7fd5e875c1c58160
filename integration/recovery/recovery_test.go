//go:build integration

package recovery

// Crash, recovery and rebalance tests of the live service on a real broker.
//
// One live input stream (4 partitions, ≥ 200 000 events, produced at a steady
// rate so that the kills land while it runs) is consumed at the same time by:
//
//   - clean:          one instance, never interrupted: the reference;
//   - sigkill:        three instances, file store, default (at-least-once)
//     mode, SIGKILLed at random moments and restarted;
//   - exactly-once:   two instances, kafka store, --exactly-once, SIGKILLed
//     at random moments and restarted, outputs read read_committed;
//   - rebalance:      kafka store, scaled 1 → 3 → 1 instances by starting and
//     gracefully stopping processes;
//   - rebalance-eos:  the same with --exactly-once, read read_committed.
//
// Every run uses --allowed-lateness 0 and --idle-timeout 0, so that no
// wall-clock release (idle timeout) can make two runs differ: an event is
// released exactly when the partition's newest event time reaches it, a
// function of the input alone. The stream's event times rise per partition,
// so nothing waits in the reorder buffer at the end.
//
// Afterwards each run is compared with the clean one, input offset by input
// offset: default mode has at least one output per offset, every one
// byte-identical to the clean run's; exactly-once has exactly one. The final
// state (each entity's last features record, by source offset) must be equal.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

const recPartitions = 4

// The minimums. VELOCITY_RECOVERY_QUICK=1 shrinks them for iterating
// on the test itself; it is never set in CI.
var (
	recEvents     = 200_000
	recProduceFor = 75 * time.Second // the stream's duration: kills land inside it
	recMinKills   = int64(20)
)

func init() {
	if os.Getenv("VELOCITY_RECOVERY_QUICK") == "1" {
		recEvents, recProduceFor, recMinKills = 20_000, 15*time.Second, 4
	}
}

// inBothModes runs f as parallel subtests named for the mode, default
// (at-least-once) first, then exactly-once: every recovery property is held in
// both.
func inBothModes(t *testing.T, f func(t *testing.T, name string, eos bool)) {
	for _, eos := range []bool{false, true} {
		name := "at-least-once"
		if eos {
			name = "exactly-once"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, name, eos)
		})
	}
}

// buildBinary builds the service once for this test into t.TempDir().
func buildBinary(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(t.TempDir(), "velocity-consumer")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/velocity-consumer")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return bin
}

// genStream is a deterministic input: per-partition rising event times, with
// duplicates (resends of an earlier event), late events and undecodable
// records mixed in, keyed by entity, each entity pinned to one partition.
func genStream(seed uint64, n int) []*kgo.Record {
	rng := rand.New(rand.NewPCG(seed, 7))
	base := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC).UnixMilli()
	t := base
	recs := make([]*kgo.Record, 0, n)
	var sent []*kgo.Record
	for i := range n {
		t += 1 + rng.Int64N(15)
		entity := fmt.Sprintf("card-%05d", rng.IntN(5000))
		h := fnv.New32a()
		h.Write([]byte(entity))
		part := int32(h.Sum32() % recPartitions)
		r := &kgo.Record{Key: []byte(entity), Partition: part, Timestamp: time.UnixMilli(t)}
		switch x := rng.Float64(); {
		case x < 0.01 && len(sent) > 0:
			old := sent[rng.IntN(len(sent))]
			r = &kgo.Record{Key: old.Key, Value: old.Value, Partition: old.Partition, Timestamp: time.UnixMilli(t)}
		case x < 0.015:
			r.Value = []byte("not avro at all")
		default:
			et := t
			if x < 0.025 {
				et -= 1000 + rng.Int64N(5000) // behind the watermark: late
			}
			tx := codec.Transaction{EventID: fmt.Sprintf("ev-%07d", i), EntityID: entity, AmountMinor: rng.Int64N(100_000), Currency: "EUR", EventTime: et}
			r.Value = codec.EncodeTransaction(&tx)
			sent = append(sent, r)
			if len(sent) > 10_000 {
				sent = sent[1:]
			}
		}
		recs = append(recs, r)
	}
	return recs
}

// instance is one velocity-consumer process.
type instance struct {
	t    *testing.T
	bin  string
	args []string
	logs string

	mu        sync.Mutex
	cmd       *exec.Cmd
	exited    chan struct{}
	started   time.Time
	recovered []time.Duration // start → first "partition assigned", per start
	starts    int
}

func newInstance(t *testing.T, bin, name string, args []string) *instance {
	return &instance{t: t, bin: bin, args: args, logs: filepath.Join(logDir(t), name+".log")}
}

// logDir is where the instances' logs go: t.TempDir, which is removed after
// the test, unless VELOCITY_TEST_LOGS names a directory to keep them in (for
// chasing a rare failure: run the test in a loop with it set). Each run of a
// test gets a directory of its own there (its name, then a unique suffix),
// shared by its instances: logs are appended to, and the tests read them
// back (the metrics address, counts of log lines), so a run of the loop must
// not see an earlier run's.
func logDir(t *testing.T) string {
	root := os.Getenv("VELOCITY_TEST_LOGS")
	if root == "" {
		return t.TempDir()
	}
	if dir, ok := logDirs.Load(t); ok {
		return dir.(string)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, strings.ReplaceAll(t.Name(), "/", "_")+".")
	if err != nil {
		t.Fatal(err)
	}
	logDirs.Store(t, dir)
	t.Cleanup(func() { logDirs.Delete(t) })
	return dir
}

// logDirs is each running test's directory under VELOCITY_TEST_LOGS.
var logDirs sync.Map // *testing.T → string

func (in *instance) start() {
	in.t.Helper()
	in.mu.Lock()
	defer in.mu.Unlock()
	cmd := exec.Command(in.bin, append([]string{"run"}, in.args...)...)
	f, err := os.OpenFile(in.logs, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		in.t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		in.t.Fatal(err)
	}
	cmd.Stdout = f
	if err := cmd.Start(); err != nil {
		in.t.Fatalf("start %s: %v", in.bin, err)
	}
	in.cmd, in.started, in.exited = cmd, time.Now(), make(chan struct{})
	in.starts++
	started, exited := in.started, in.exited
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		seen := false
		for sc.Scan() {
			line := sc.Bytes()
			if !seen && bytes.Contains(line, []byte(`"partition assigned"`)) {
				seen = true
				in.mu.Lock()
				in.recovered = append(in.recovered, time.Since(started))
				in.mu.Unlock()
			}
			f.Write(append(line, '\n'))
		}
		_ = cmd.Wait()
		f.Close()
		close(exited)
	}()
}

// kill sends sig and waits for the process to exit.
func (in *instance) kill(sig syscall.Signal) {
	in.mu.Lock()
	cmd, exited := in.cmd, in.exited
	in.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	start := time.Now()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		// A graceful shutdown checkpoints every partition and leaves the
		// group; it must not take this long.
		in.t.Errorf("%s: still running 30s after %v; SIGKILLed; end of its log:\n%s", filepath.Base(in.logs), sig, tailLog(in.logs, 25))
		_ = cmd.Process.Kill()
		<-exited
	}
	if d := time.Since(start); sig == syscall.SIGTERM && d > 5*time.Second {
		in.t.Logf("%s: graceful shutdown took %s", filepath.Base(in.logs), d.Round(time.Millisecond))
	}
	in.mu.Lock()
	in.cmd = nil
	in.mu.Unlock()
}

func (in *instance) running() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cmd == nil {
		return false
	}
	select {
	case <-in.exited:
		return false
	default:
		return true
	}
}

// scenario is one consumer group over the shared input.
type scenario struct {
	name, group, out, dlq, store string
	eos                          bool
	instances                    []*instance
	kills                        atomic.Int64
}

func (sc *scenario) args(addr, input string) []string {
	a := []string{
		"--brokers", addr, "--group", sc.group, "--input-topic", input,
		"--output-topic", sc.out, "--dlq-topic", sc.dlq,
		"--checkpoint-store", sc.store, "--checkpoint-interval", "1s",
		"--allowed-lateness", "0s", "--idle-timeout", "0s",
		"--session-timeout", "6s", "--metrics-addr", "", "--log-level", "info",
	}
	if sc.eos {
		a = append(a, "--exactly-once")
	}
	return a
}

func TestRecoveryUnderCrashesAndRebalance(t *testing.T) {
	addr := kafkatest.Broker(t)
	bin := buildBinary(t)
	ctx := kafkatest.Context(t, 9*time.Minute)
	adm := kafkatest.Admin(t, addr)
	keep := map[string]string{"retention.ms": "-1"}
	input := kafkatest.CreateTopic(t, addr, recPartitions, keep)
	recs := genStream(7, recEvents)

	newScenario := func(name string, eos bool, store string) *scenario {
		sc := &scenario{
			name: name, eos: eos, group: kafkatest.Group(t),
			out: kafkatest.CreateTopic(t, addr, recPartitions, keep),
			dlq: kafkatest.CreateTopic(t, addr, 1, keep),
		}
		switch store {
		case "file":
			sc.store = "file://" + t.TempDir()
		case "kafka":
			topic := kafkatest.Name(t, "snap")
			sc.store = "kafka://" + topic
			t.Cleanup(func() {
				c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, _ = adm.DeleteTopic(c, topic)
			})
		}
		return sc
	}
	clean := newScenario("clean", false, "file")
	crash := newScenario("sigkill", false, "file")
	eos := newScenario("exactly-once", true, "kafka")
	rebal := newScenario("rebalance", false, "kafka")
	rebalEOS := newScenario("rebalance-eos", true, "kafka")
	all := []*scenario{clean, crash, eos, rebal, rebalEOS}
	for _, sc := range all {
		n := map[*scenario]int{clean: 1, crash: 3, eos: 2, rebal: 3, rebalEOS: 3}[sc]
		for i := range n {
			sc.instances = append(sc.instances, newInstance(t, bin, fmt.Sprintf("%s-%d", sc.name, i), sc.args(addr, input)))
		}
	}
	t.Cleanup(func() {
		for _, sc := range all {
			for _, in := range sc.instances {
				in.kill(syscall.SIGKILL)
			}
		}
	})

	// Everyone but the rebalance scenario's later instances starts now.
	for _, sc := range []*scenario{clean, crash, eos} {
		for _, in := range sc.instances {
			in.start()
		}
	}
	rebal.instances[0].start()
	rebalEOS.instances[0].start()

	produced := make(chan error, 1)
	progress := atomic.Int64{}
	go func() { produced <- produce(ctx, addr, input, recs, recProduceFor, &progress) }()

	var wg sync.WaitGroup
	stopKilling := make(chan struct{})
	for i, sc := range []*scenario{crash, eos} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			killLoop(sc, rand.New(rand.NewPCG(uint64(i), 99)), stopKilling)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Scale 1 → 3 at a third of the stream, back to 1 at two thirds.
		waitProgress(ctx, &progress, recEvents/3)
		for _, sc := range []*scenario{rebal, rebalEOS} {
			sc.instances[1].start()
			sc.instances[2].start()
		}
		waitProgress(ctx, &progress, 2*recEvents/3)
		for _, sc := range []*scenario{rebal, rebalEOS} {
			sc.instances[1].kill(syscall.SIGTERM)
			sc.instances[2].kill(syscall.SIGTERM)
		}
	}()

	if err := <-produced; err != nil {
		t.Fatalf("produce the input: %v", err)
	}
	t.Logf("produced %d records to %s over %s", len(recs), input, recProduceFor)
	// Keep killing until each crash scenario has had its quota.
	deadline := time.Now().Add(60 * time.Second)
	for (crash.kills.Load() < recMinKills || eos.kills.Load() < recMinKills) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	close(stopKilling)
	wg.Wait()
	t.Logf("kills done: sigkill %d, exactly-once %d", crash.kills.Load(), eos.kills.Load())
	for _, sc := range []*scenario{crash, eos} {
		for _, in := range sc.instances {
			if !in.running() {
				in.start()
			}
		}
	}

	ends := endOffsets(t, ctx, adm, input)
	for _, sc := range all {
		start := time.Now()
		if err := waitCommitted(ctx, adm, sc.group, input, ends); err != nil {
			t.Fatalf("%s: group %s did not commit the end of the input: %v (logs in %s)", sc.name, sc.group, err, sc.instances[0].logs)
		}
		t.Logf("%s: caught up %s after the stream ended", sc.name, time.Since(start).Round(time.Millisecond))
	}
	for _, sc := range all {
		for _, in := range sc.instances {
			in.kill(syscall.SIGTERM)
		}
	}

	want := readOutputs(t, ctx, addr, clean, false, ends)
	t.Run("clean run has exactly one output per input offset", func(t *testing.T) {
		checkOutputs(t, ends, want, want, true)
	})
	for _, sc := range []*scenario{crash, eos, rebal, rebalEOS} {
		t.Run(sc.name, func(t *testing.T) {
			if (sc == crash || sc == eos) && sc.kills.Load() < recMinKills {
				t.Errorf("only %d SIGKILLs, want at least %d", sc.kills.Load(), recMinKills)
			}
			got := readOutputs(t, ctx, addr, sc, sc.eos, ends)
			checkOutputs(t, ends, got, want, sc.eos)
			checkFinalState(t, got, want)
			if sc.eos {
				// Evidence that transactions did the work: a read_uncommitted
				// reader also sees the outputs of aborted transactions.
				raw := readOutputs(t, ctx, addr, sc, false, ends)
				repeats := 0
				for _, os := range raw {
					repeats += len(os) - 1
				}
				t.Logf("%s: a read_uncommitted reader sees %d extra records from aborted transactions", sc.name, repeats)
			}
			logLines := map[string]int{}
			var fatal []string // the lines themselves: t.TempDir is gone once CI reports
			var warnings []string
			for _, in := range sc.instances {
				b, _ := os.ReadFile(in.logs)
				for line := range bytes.Lines(b) {
					if !bytes.Contains(line, []byte(`"level":"info"`)) {
						warnings = append(warnings, filepath.Base(in.logs)+": "+string(bytes.TrimSpace(line)))
					}
				}
				for _, m := range []string{"ahead of the committed transaction", "warm-up", "newest snapshot corrupt", "no snapshot matches", "stopping: fatal error"} {
					logLines[m] += bytes.Count(b, []byte(m))
				}
				for line := range bytes.Lines(b) {
					if bytes.Contains(line, []byte("stopping: fatal error")) {
						fatal = append(fatal, string(bytes.TrimSpace(line)))
					}
				}
			}
			t.Logf("%s: log lines: %v", sc.name, logLines)
			if n := logLines["stopping: fatal error"]; n > 0 {
				t.Errorf("%d instances stopped on a fatal error (logs in %s):\n%s", n, filepath.Dir(sc.instances[0].logs), strings.Join(fatal, "\n"))
			}
			if t.Failed() {
				// The processes' own account, for a failure seen only in CI's output.
				if len(warnings) > 40 {
					warnings = append(warnings[:20], append([]string{"…"}, warnings[len(warnings)-20:]...)...)
				}
				if len(warnings) == 0 {
					warnings = []string{"(none)"}
				}
				t.Logf("%s: the instances' warnings and errors:\n%s", sc.name, strings.Join(warnings, "\n"))
			}
			var rec []time.Duration
			starts := 0
			for _, in := range sc.instances {
				in.mu.Lock()
				rec = append(rec, in.recovered...)
				starts += in.starts
				in.mu.Unlock()
			}
			slices.Sort(rec)
			if len(rec) > 0 {
				t.Logf("%s: %d SIGKILLs, %d process starts; start → first partition restored: median %s, p90 %s, max %s",
					sc.name, sc.kills.Load(), starts, rec[len(rec)/2].Round(time.Millisecond),
					rec[len(rec)*9/10].Round(time.Millisecond), rec[len(rec)-1].Round(time.Millisecond))
			}
		})
	}
}

// produce writes recs to topic (their partitions preset) spread evenly over d.
func produce(ctx context.Context, addr, topic string, recs []*kgo.Record, d time.Duration, progress *atomic.Int64) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Seeds(addr)...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	const batch = 500
	begin := time.Now()
	for i := 0; i < len(recs); i += batch {
		at := begin.Add(time.Duration(int64(d) * int64(i) / int64(len(recs))))
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		}
		if err := cl.ProduceSync(ctx, recs[i:min(i+batch, len(recs))]...).FirstErr(); err != nil {
			return err
		}
		progress.Store(int64(min(i+batch, len(recs))))
	}
	return nil
}

func waitProgress(ctx context.Context, p *atomic.Int64, n int) {
	for p.Load() < int64(n) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
}

// killLoop SIGKILLs a random instance of sc every 1–3.5 s and restarts it
// after up to half a second, until stop is closed.
func killLoop(sc *scenario, rng *rand.Rand, stop chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(1000+rng.IntN(2500)) * time.Millisecond):
		}
		in := sc.instances[rng.IntN(len(sc.instances))]
		if !in.running() {
			in.start()
			continue
		}
		in.kill(syscall.SIGKILL)
		sc.kills.Add(1)
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
		in.start()
	}
}

func endOffsets(t *testing.T, ctx context.Context, adm *kadm.Client, topic string) map[int32]int64 {
	t.Helper()
	l, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("list end offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	l.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

func waitCommitted(ctx context.Context, adm *kadm.Client, group, topic string, ends map[int32]int64) error {
	var last string
	for ctx.Err() == nil {
		resp, err := adm.FetchOffsetsForTopics(ctx, group, topic)
		if err == nil {
			done := true
			var parts []string
			for p, end := range ends {
				o, ok := resp.Lookup(topic, p)
				parts = append(parts, fmt.Sprintf("%d:%d/%d", p, o.At, end))
				if !ok || o.At < end {
					done = false
				}
			}
			if done {
				return nil
			}
			slices.Sort(parts)
			last = strings.Join(parts, " ")
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("%w; committed/end: %s", ctx.Err(), last)
}

// output is one features record or dead letter, reduced to the bytes that
// must be identical between runs (headers with wall-clock facts excluded).
type output struct {
	id     string // "F"/"D" | key | value (| reason | error for dead letters)
	entity string
}

type srcKey struct {
	part   int32
	offset int64
}

// readOutputs reads sc's features and dead-letter topics to their end. ends
// are the input's end offsets: the outputs should name every input offset
// below them.
//
// A read_committed reader cannot see the transaction markers that may end a
// partition, so it stops on silence instead of at the end offset. It takes a
// short silence for the end only once every input offset has an output; short
// of that it waits for a long one, so that a broker that stalls for a few
// seconds under CI's load is not taken for missing outputs (a real gap then
// costs readSilenceIncomplete, and checkOutputs reports it).
func readOutputs(t *testing.T, ctx context.Context, addr string, sc *scenario, committed bool, ends map[int32]int64) map[srcKey][]output {
	t.Helper()
	opts := []kgo.Opt{kgo.ConsumeTopics(sc.out, sc.dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	} else {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	}
	cl := kafkatest.Client(t, addr, opts...)
	type tp struct {
		topic string
		part  int32
	}
	remaining := map[tp]int64{}
	for _, topic := range []string{sc.out, sc.dlq} {
		listed, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatalf("list end offsets of %s: %v", topic, err)
		}
		listed.Each(func(o kadm.ListedOffset) {
			if o.Offset > 0 {
				remaining[tp{topic, o.Partition}] = o.Offset
			}
		})
	}
	want := 0
	for _, end := range ends {
		want += int(end)
	}
	out := map[srcKey][]output{}
	covered := 0
	lastRecord := time.Now()
	for len(remaining) > 0 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			t.Fatalf("read %s and %s: %v", sc.out, sc.dlq, ctx.Err())
		}
		if fs.NumRecords() == 0 {
			silent := time.Since(lastRecord)
			if covered >= want && silent >= readSilence || silent >= readSilenceIncomplete {
				break // the rest are transaction markers or aborted records
			}
			continue
		}
		lastRecord = time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 >= remaining[tp{r.Topic, r.Partition}] {
				delete(remaining, tp{r.Topic, r.Partition})
			}
			k, o := classify(t, r, r.Topic == sc.dlq)
			if len(out[k]) == 0 && k.offset >= 0 && k.offset < ends[k.part] {
				covered++
			}
			out[k] = append(out[k], o)
		})
	}
	return out
}

const (
	readSilence           = 3 * time.Second
	readSilenceIncomplete = 30 * time.Second
)

func classify(t *testing.T, r *kgo.Record, dead bool) (srcKey, output) {
	if !dead {
		f, err := codec.DecodeFeatures(r.Value)
		if err != nil {
			t.Fatalf("features record at %s/%d@%d does not decode: %v", r.Topic, r.Partition, r.Offset, err)
		}
		return srcKey{f.SourcePartition, f.SourceOffset}, output{id: "F|" + string(r.Key) + "|" + string(r.Value), entity: f.EntityID}
	}
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	p, err1 := strconv.ParseInt(h[codec.HeaderSourcePartition], 10, 32)
	o, err2 := strconv.ParseInt(h[codec.HeaderSourceOffset], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("dead letter at %s/%d@%d lacks source headers: %v", r.Topic, r.Partition, r.Offset, h)
	}
	return srcKey{int32(p), o}, output{id: "D|" + string(r.Key) + "|" + string(r.Value) + "|" + h[codec.HeaderReason] + "|" + h[codec.HeaderError]}
}

// checkOutputs: every input offset has an output (exactly one when exact),
// every output equals the clean run's for its offset, and no output names an
// offset outside the input.
func checkOutputs(t *testing.T, ends map[int32]int64, got, want map[srcKey][]output, exact bool) {
	t.Helper()
	missing, dup, diff, extra := 0, 0, 0, 0
	var examples []string
	note := func(format string, args ...any) {
		if len(examples) < 8 {
			examples = append(examples, fmt.Sprintf(format, args...))
		}
	}
	total := 0
	for p, end := range ends {
		for off := int64(0); off < end; off++ {
			total++
			k := srcKey{p, off}
			g, w := got[k], want[k]
			switch {
			case len(g) == 0:
				missing++
				note("offset %d/%d: no output", p, off)
				continue
			case len(g) > 1:
				dup++
				if exact {
					note("offset %d/%d: %d outputs", p, off, len(g))
				}
			}
			if len(w) != 1 {
				t.Fatalf("clean run has %d outputs for offset %d/%d", len(w), p, off)
			}
			for _, o := range g {
				if o.id != w[0].id {
					diff++
					note("offset %d/%d: output differs from the clean run:\n  got  %q\n  want %q", p, off, trim(o.id), trim(w[0].id))
				}
			}
		}
	}
	for k := range got {
		if k.offset >= ends[k.part] {
			extra++
			note("output for offset %d/%d beyond the input", k.part, k.offset)
		}
	}
	t.Logf("%d input offsets: %d missing, %d with repeats, %d outputs differing, %d beyond the input", total, missing, dup, diff, extra)
	if missing > 0 || diff > 0 || extra > 0 || (exact && dup > 0) {
		t.Errorf("outputs do not match the clean run:\n%s", strings.Join(examples, "\n"))
	}
}

func trim(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// checkFinalState compares each entity's last features record (highest
// source offset): its windows are the entity's final aggregates.
func checkFinalState(t *testing.T, got, want map[srcKey][]output) {
	t.Helper()
	last := func(m map[srcKey][]output) map[string]string {
		best := map[string]srcKey{}
		rec := map[string]string{}
		for k, os := range m {
			for _, o := range os {
				if o.entity == "" {
					continue
				}
				if b, ok := best[o.entity]; !ok || k.offset > b.offset {
					best[o.entity], rec[o.entity] = k, o.id
				}
			}
		}
		return rec
	}
	g, w := last(got), last(want)
	bad := 0
	for e, rec := range w {
		if g[e] != rec {
			bad++
			if bad <= 3 {
				t.Errorf("entity %s: final features differ from the clean run", e)
			}
		}
	}
	if len(g) != len(w) {
		t.Errorf("%d entities have features, clean run %d", len(g), len(w))
	}
	t.Logf("final state: %d entities compared, %d differ", len(w), bad)
}
