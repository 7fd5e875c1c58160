//go:build integration

package recovery

import (
	"bytes"
	"context"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

// TestQuietPartitionTailIsCommitted is the smallest reproduction of the
// exactly-once tail: a few thousand clean records, then nothing. The events the
// reorder buffer holds when the input stops are released by --idle-timeout,
// after the last batch; the checkpoint that follows must still publish (and, in
// exactly-once mode, commit) them, although no input offset moved. Then the
// instance is stopped, restarted with no new input, and stopped again: every
// input offset stays covered (exactly once under read_committed), and the
// restart publishes nothing, because the state after the idle release was
// saved.
func TestQuietPartitionTailIsCommitted(t *testing.T) {
	inBothModes(t, func(t *testing.T, name string, eos bool) {
		r := newRig(t, 3*time.Minute)
		addr, bin, ctx, adm, input := r.addr, r.bin, r.ctx, r.adm, r.input
		sc := r.group(name, eos, "kafka")
		// A real reorder wait and idle release, which the other
		// recovery tests turn off to stay deterministic.
		args := r.args(sc, "--allowed-lateness", "1s", "--idle-timeout", "1s")
		in := newInstance(t, bin, name, args)
		sc.instances = []*instance{in}
		t.Cleanup(func() { in.kill(syscall.SIGKILL) })

		var progress atomic.Int64
		recs := genStream(21, 2000)
		in.start()
		if err := produce(ctx, addr, input, recs, 0, &progress); err != nil {
			t.Fatalf("produce: %v", err)
		}
		ends := endOffsets(t, ctx, adm, input)
		if err := waitCommitted(ctx, adm, sc.group, input, ends); err != nil {
			t.Fatalf("%v; end of its log:\n%s", err, tailLog(in.logs, 15))
		}
		// The tail comes out an idle timeout after the input stopped, once
		// the broker confirms nothing is left to read, and (exactly-once)
		// with the checkpoint after that: wait for it rather than for a
		// fixed time, which a loaded machine outlasts.
		took := waitCovered(t, ctx, addr, sc, ends, "while running, input quiet")
		t.Logf("the quiet tail was published %s after the group committed the end of the input", took.Round(time.Millisecond))
		first := checkCovered(t, ctx, addr, sc, ends, "while running, input quiet")

		in.kill(syscall.SIGTERM)
		afterStop := checkCovered(t, ctx, addr, sc, ends, "after SIGTERM")

		from := logSize(in.logs)
		in.start()
		// Restored, then idle for an idle timeout and a checkpoint interval
		// (with slack): a restart that had lost the release would publish
		// the tail again by then.
		waitLogLines(t, ctx, in, from, `"partition assigned"`, recPartitions)
		time.Sleep(1*time.Second + 1*time.Second + 3*time.Second)
		in.kill(syscall.SIGTERM)
		afterRestart := checkCovered(t, ctx, addr, sc, ends, "after a restart with no new input")
		if afterStop != first || afterRestart != afterStop {
			t.Errorf("outputs: %d while running, %d after SIGTERM, %d after a restart with no new input: a restart with no new input must publish nothing (the state after the idle release was not saved?)",
				first, afterStop, afterRestart)
		}
	})
}

// checkCovered reads sc's outputs (read_committed in exactly-once mode) and
// fails t unless every input offset below ends has one (exactly one in
// exactly-once mode). It returns the number of outputs read.
func checkCovered(t *testing.T, ctx context.Context, addr string, sc *scenario, ends map[int32]int64, when string) int {
	t.Helper()
	got := readOutputs(t, ctx, addr, sc, sc.eos, ends)
	total, missing, repeated := 0, 0, 0
	var firstMissing []srcKey
	for p, end := range ends {
		for off := int64(0); off < end; off++ {
			switch n := len(got[srcKey{p, off}]); {
			case n == 0:
				missing++
				if len(firstMissing) < 5 {
					firstMissing = append(firstMissing, srcKey{p, off})
				}
			case n > 1:
				repeated++
			}
		}
	}
	for _, os := range got {
		total += len(os)
	}
	want := int64(0)
	for _, end := range ends {
		want += end
	}
	if missing > 0 || sc.eos && repeated > 0 {
		t.Errorf("%s: %d of %d input offsets have no output (first: %v), %d have more than one (read_committed: %v); end of the log:\n%s",
			when, missing, want, firstMissing, repeated, sc.eos, tailLog(sc.instances[0].logs, 10))
	}
	return total
}

// TestQuietTailSurvivesAWarmUp: under --exactly-once, a partition's input goes
// quiet, the idle timeout releases the reorder buffer's tail and the next
// checkpoint commits it; then the partition moves to an owner without that
// snapshot (per-instance file stores), which rebuilds the state by a warm-up
// read up to the committed offset. The warm-up cannot see the release, which
// the wall clock decided: unless it repeats it, the tail is pending again, and
// the new owner releases and commits it a second time. read_committed must
// still see exactly one output per input offset.
func TestQuietTailSurvivesAWarmUp(t *testing.T) {
	t.Parallel()
	r := newRig(t, 3*time.Minute)
	addr, bin, ctx, adm, input := r.addr, r.bin, r.ctx, r.adm, r.input
	sc := r.group("warm-up", true, "file")
	args := r.args(sc, "--allowed-lateness", "1s", "--idle-timeout", "1s")
	a := newInstance(t, bin, "a", args)
	b := newInstance(t, bin, "b", append(args, "--checkpoint-store", "file://"+t.TempDir()))
	sc.instances = []*instance{a}
	t.Cleanup(func() {
		a.kill(syscall.SIGKILL)
		b.kill(syscall.SIGKILL)
	})
	var progress atomic.Int64
	a.start()
	if err := produce(ctx, addr, input, genStream(23, 2000), 0, &progress); err != nil {
		t.Fatalf("produce: %v", err)
	}
	ends := endOffsets(t, ctx, adm, input)
	if err := waitCommitted(ctx, adm, sc.group, input, ends); err != nil {
		t.Fatalf("%v; end of its log:\n%s", err, tailLog(a.logs, 15))
	}
	// The tail released and committed (read_committed sees every offset's
	// output), which a fixed wait cannot promise on a loaded machine.
	took := waitCovered(t, ctx, addr, sc, ends, "while the first owner ran, input quiet")
	t.Logf("the quiet tail was committed %s after the group committed the end of the input", took.Round(time.Millisecond))
	a.kill(syscall.SIGTERM)
	checkCovered(t, ctx, addr, sc, ends, "after the first owner stopped")

	b.start()
	sc.instances = []*instance{b}
	// Warmed up, then idle for an idle timeout and a checkpoint interval
	// (with slack): had the warm-up not repeated the release, the new
	// owner would have released and committed the tail again by then.
	waitLogLines(t, ctx, b, 0, "rebuilt its state by a warm-up read", recPartitions)
	time.Sleep(1*time.Second + 1*time.Second + 3*time.Second)
	b.kill(syscall.SIGTERM)
	checkCovered(t, ctx, addr, sc, ends, "after a new owner without the snapshot warmed up and stopped")
	if log, _ := os.ReadFile(b.logs); bytes.Count(log, []byte("rebuilt its state by a warm-up read")) != recPartitions {
		t.Errorf("the new owner did not warm up every partition; end of its log:\n%s", tailLog(b.logs, 15))
	}
}

// waitCovered reads sc's outputs as they arrive (read_committed in
// exactly-once mode) until every input offset below ends has one, and returns
// how long that took. t fails if that takes a minute, far more than any
// release or checkpoint the tests wait for needs on a loaded machine.
func waitCovered(t *testing.T, ctx context.Context, addr string, sc *scenario, ends map[int32]int64, when string) time.Duration {
	t.Helper()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	opts := []kgo.Opt{kgo.ConsumeTopics(sc.out, sc.dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	if sc.eos {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl := kafkatest.Client(t, addr, opts...)
	want := 0
	for _, end := range ends {
		want += int(end)
	}
	covered := map[srcKey]bool{}
	for len(covered) < want {
		pctx, pcancel := context.WithTimeout(wctx, time.Second)
		fs := cl.PollFetches(pctx)
		pcancel()
		if wctx.Err() != nil {
			t.Fatalf("%s: %d of %d input offsets had an output after %s (read_committed: %v); end of the log:\n%s",
				when, len(covered), want, time.Since(start).Round(time.Millisecond), sc.eos, tailLog(sc.instances[0].logs, 10))
		}
		fs.EachRecord(func(r *kgo.Record) {
			k, _ := classify(t, r, r.Topic == sc.dlq)
			if k.offset >= 0 && k.offset < ends[k.part] {
				covered[k] = true
			}
		})
	}
	return time.Since(start)
}

// waitLogLines waits until in's log holds n lines containing s after its
// first from bytes (logSize before a start: that start's lines only), and
// fails t if that takes a minute.
func waitLogLines(t *testing.T, ctx context.Context, in *instance, from int64, s string, n int) {
	t.Helper()
	start := time.Now()
	for {
		b, _ := os.ReadFile(in.logs)
		got := 0
		if int64(len(b)) > from {
			got = bytes.Count(b[from:], []byte(s))
		}
		if got >= n {
			return
		}
		if ctx.Err() != nil || time.Since(start) > time.Minute {
			t.Fatalf("%d log lines with %s after %s, want %d; end of the log:\n%s",
				got, s, time.Since(start).Round(time.Millisecond), n, tailLog(in.logs, 15))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logSize is the size of a log file (0 if there is none yet).
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
