//go:build integration

package recovery

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
)

// restoreCase is a small two-phase run: the first half of a stream is consumed
// and checkpointed, the store is tampered with, the second half is produced
// and a fresh process continues. Its outputs must equal a clean run's.
type restoreCase struct {
	t              *testing.T
	addr, bin      string
	ctx            context.Context
	adm            *kadm.Client
	input          string
	first, second  []*kgo.Record
	windows        string
	clean, resumed *scenario
	cleanIn, a, b  *instance
	storeDir       string
	partitions     int32
	beforeStop     func() // runs while the second process still serves
}

func newRestoreCase(t *testing.T, n int, windows string, eos bool) *restoreCase {
	addr := kafkatest.Broker(t)
	rc := &restoreCase{t: t, addr: addr, bin: buildBinary(t), ctx: kafkatest.Context(t, 4*time.Minute), windows: windows, partitions: recPartitions}
	rc.adm = kafkatest.Admin(t, addr)
	keep := map[string]string{"retention.ms": "-1"}
	rc.input = kafkatest.CreateTopic(t, addr, recPartitions, keep)
	recs := genStream(11, n)
	rc.first, rc.second = recs[:n/2], recs[n/2:]
	mk := func(name string, eos bool, dir string) *scenario {
		return &scenario{name: name, eos: eos, group: kafkatest.Group(t), store: "file://" + dir,
			out: kafkatest.CreateTopic(t, addr, recPartitions, keep), dlq: kafkatest.CreateTopic(t, addr, 1, keep)}
	}
	rc.storeDir = t.TempDir()
	rc.clean = mk("clean", false, t.TempDir())
	rc.resumed = mk("resumed", eos, rc.storeDir)
	args := func(sc *scenario) []string { return append(sc.args(addr, rc.input), "--windows", windows) }
	rc.cleanIn = newInstance(t, rc.bin, "clean", args(rc.clean))
	rc.a = newInstance(t, rc.bin, "first", args(rc.resumed))
	// The second process serves metrics on a free port (the log names it).
	rc.b = newInstance(t, rc.bin, "second", append(args(rc.resumed), "--metrics-addr", "127.0.0.1:0"))
	rc.clean.instances = []*instance{rc.cleanIn}
	rc.resumed.instances = []*instance{rc.a, rc.b}
	t.Cleanup(func() {
		for _, in := range []*instance{rc.cleanIn, rc.a, rc.b} {
			in.kill(syscall.SIGKILL)
		}
	})
	return rc
}

// run: first half → instance a to the end, SIGTERM → tamper → second half →
// instance b to the end; a clean instance over everything. Returns the end
// offsets of the input.
func (rc *restoreCase) run(tamper func()) map[int32]int64 {
	t := rc.t
	var progress atomic.Int64
	// The first half goes in two steps, each checkpointed, so that the store
	// holds a newest and a previous snapshot when it is tampered with.
	rc.a.start()
	for i, part := range [][]*kgo.Record{rc.first[:len(rc.first)/2], rc.first[len(rc.first)/2:]} {
		if err := produce(rc.ctx, rc.addr, rc.input, part, 0, &progress); err != nil {
			t.Fatalf("produce first half, step %d: %v", i+1, err)
		}
		if err := waitCommitted(rc.whileRunning(rc.a), rc.adm, rc.resumed.group, rc.input, endOffsets(t, rc.ctx, rc.adm, rc.input)); err != nil {
			t.Fatalf("first half, step %d: %v; end of its log:\n%s", i+1, err, tailLog(rc.a.logs, 15))
		}
	}
	rc.a.kill(syscall.SIGTERM)
	tamper()
	if err := produce(rc.ctx, rc.addr, rc.input, rc.second, 0, &progress); err != nil {
		t.Fatalf("produce second half: %v", err)
	}
	ends := endOffsets(t, rc.ctx, rc.adm, rc.input)
	rc.b.start()
	rc.cleanIn.start()
	for _, sc := range []*scenario{rc.resumed, rc.clean} {
		if err := waitCommitted(rc.whileRunning(sc.instances[len(sc.instances)-1]), rc.adm, sc.group, rc.input, ends); err != nil {
			t.Fatalf("%s: %v; end of its log:\n%s", sc.name, err, tailLog(sc.instances[len(sc.instances)-1].logs, 15))
		}
	}
	if rc.beforeStop != nil {
		rc.beforeStop()
	}
	rc.b.kill(syscall.SIGTERM)
	rc.cleanIn.kill(syscall.SIGTERM)
	return ends
}

// whileRunning returns a context that ends when in's process exits (or the
// test's context ends), so a process that dies fails the wait at once.
func (rc *restoreCase) whileRunning(in *instance) context.Context {
	ctx, cancel := context.WithCancel(rc.ctx)
	rc.t.Cleanup(cancel)
	in.mu.Lock()
	exited := in.exited
	in.mu.Unlock()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx
}

// metric returns the value of an unlabelled metric from the second process.
func (rc *restoreCase) metric(name string) float64 {
	t := rc.t
	log, _ := os.ReadFile(rc.b.logs)
	m := regexp.MustCompile(`"msg":"serving metrics","addr":"([^"]+)"`).FindSubmatch(log)
	if m == nil {
		t.Fatalf("no metrics address in %s", rc.b.logs)
	}
	resp, err := http.Get("http://" + string(m[1]) + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	v := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
	if v == nil {
		t.Fatalf("metric %s not exported", name)
	}
	f, _ := strconv.ParseFloat(string(v[1]), 64)
	return f
}

// TestWarmUpWithoutSnapshot: the snapshots are deleted between the two halves,
// so the second process has committed offsets and no snapshot. It must warm up
// from the partition's recent records (a partial tail: the stream spans about
// 13 minutes of event time, the warm-up span is 1m window + 5m slack) and
// then emit exactly what the clean run emitted. That the outputs are equal
// relies on what the warm-up can restore: every duplicate in this stream
// resends an event from the last ~80 s, and no entity is quiet for longer
// than the tail, so neither the partial dedupe set nor the lost
// ms_since_previous history shows.
func TestWarmUpWithoutSnapshot(t *testing.T) {
	t.Parallel()
	rc := newRestoreCase(t, 100_000, "10s:1s,1m:5s", false)
	ends := rc.run(func() {
		if err := os.RemoveAll(rc.storeDir); err != nil {
			t.Fatal(err)
		}
	})
	want := readOutputs(t, rc.ctx, rc.addr, rc.clean, false, ends)
	got := readOutputs(t, rc.ctx, rc.addr, rc.resumed, false, ends)
	checkOutputs(t, ends, got, want, false)
	checkFinalState(t, got, want)

	log, _ := os.ReadFile(rc.b.logs)
	warm := regexp.MustCompile(`"msg":"no snapshot for a partition with a committed offset[^"]*".*?"from":(\d+),"committed":(\d+)`).FindAllSubmatch(log, -1)
	if len(warm) != int(rc.partitions) {
		t.Fatalf("%d warm-up log lines, want one per partition (%d); log %s", len(warm), rc.partitions, rc.b.logs)
	}
	for _, m := range warm {
		from, _ := strconv.ParseInt(string(m[1]), 10, 64)
		committed, _ := strconv.ParseInt(string(m[2]), 10, 64)
		if from <= 0 || from >= committed {
			t.Errorf("warm-up read %d..%d: want a partial tail (0 < from < committed)", from, committed)
		}
		t.Logf("warm-up read offsets %d..%d (%d records)", from, committed, committed-from)
	}
}

// TestExactlyOnceStepsBackFromAnUncommittedSnapshot simulates a crash between
// saving a snapshot and committing its transaction: after the first half, each
// partition gets a newer snapshot whose Next is ahead of the committed offset.
// The second process must discard it for the previous one (which matches the
// commit), or it would skip offsets; read_committed then sees exactly one
// output per input offset.
func TestExactlyOnceStepsBackFromAnUncommittedSnapshot(t *testing.T) {
	t.Parallel()
	rc := newRestoreCase(t, 40_000, "1m:1s,5m:5s", true)
	var stepBacks float64
	rc.beforeStop = func() { stepBacks = rc.metric("velocity_snapshot_stepbacks_total") }
	ends := rc.run(func() {
		st, err := checkpoint.NewFileStore(rc.storeDir)
		if err != nil {
			t.Fatal(err)
		}
		for p := range rc.partitions {
			key := checkpoint.Key{Group: rc.resumed.group, Topic: rc.input, Partition: p}
			l, err := st.Load(rc.ctx, key)
			if err != nil {
				t.Fatalf("load %s: %v", key, err)
			}
			// As the owner itself would have: its epoch, its next seq.
			if err := st.Save(rc.ctx, key, checkpoint.Snapshot{Next: l.Next + 50, State: l.State, Epoch: l.Epoch, Seq: l.Seq + 1}); err != nil {
				t.Fatal(err)
			}
		}
	})
	want := readOutputs(t, rc.ctx, rc.addr, rc.clean, false, ends)
	got := readOutputs(t, rc.ctx, rc.addr, rc.resumed, true, ends)
	checkOutputs(t, ends, got, want, true)
	checkFinalState(t, got, want)
	log, _ := os.ReadFile(rc.b.logs)
	if n := bytes.Count(log, []byte("ahead of the committed transaction")); n != int(rc.partitions) {
		t.Fatalf("%d step-back log lines, want %d (log %s)", n, rc.partitions, rc.b.logs)
	}
	if stepBacks != float64(rc.partitions) {
		t.Errorf("velocity_snapshot_stepbacks_total = %v, want %d", stepBacks, rc.partitions)
	}
}

// TestTornSnapshotFallsBack tears the newest snapshot of every partition (its
// tail never reached the disk) between the two halves. The second process
// must restore the previous snapshot of each, say so in its log and in
// velocity_snapshot_fallbacks_total, and re-emit from there: at least once,
// byte-identical to the clean run.
func TestTornSnapshotFallsBack(t *testing.T) {
	t.Parallel()
	rc := newRestoreCase(t, 40_000, "1m:1s,5m:5s", false)
	var fallbacks float64
	rc.beforeStop = func() { fallbacks = rc.metric("velocity_snapshot_fallbacks_total") }
	ends := rc.run(func() {
		snaps, _ := filepath.Glob(filepath.Join(rc.storeDir, "*", "*", "*.snap"))
		if len(snaps) != int(rc.partitions) {
			t.Fatalf("%d snapshot files in %s, want %d", len(snaps), rc.storeDir, rc.partitions)
		}
		for _, f := range snaps {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			clear(b[len(b)/2:])
			if err := os.WriteFile(f, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})
	want := readOutputs(t, rc.ctx, rc.addr, rc.clean, false, ends)
	got := readOutputs(t, rc.ctx, rc.addr, rc.resumed, false, ends)
	checkOutputs(t, ends, got, want, false)
	checkFinalState(t, got, want)
	log, _ := os.ReadFile(rc.b.logs)
	if n := bytes.Count(log, []byte("newest snapshot corrupt, restored the previous one")); n != int(rc.partitions) {
		t.Errorf("%d fallback log lines, want %d (log %s)", n, rc.partitions, rc.b.logs)
	}
	if fallbacks != float64(rc.partitions) {
		t.Errorf("velocity_snapshot_fallbacks_total = %v, want %d", fallbacks, rc.partitions)
	}
}

// tailLog returns the last n lines of a process log, for failure messages
// (the log itself goes away with the test's temp dir).
func tailLog(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
