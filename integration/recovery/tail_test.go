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
		// A checkpoint interval and an idle timeout after the input
		// stopped, with slack for a loaded machine.
		time.Sleep(1*time.Second + 1*time.Second + 3*time.Second)
		first := checkCovered(t, ctx, addr, sc, ends, "while running, input quiet")

		in.kill(syscall.SIGTERM)
		afterStop := checkCovered(t, ctx, addr, sc, ends, "after SIGTERM")

		in.start()
		time.Sleep(6 * time.Second) // restored, idle, checkpointed: nothing to publish
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
	sc.instances = []*instance{b}
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
	time.Sleep(1*time.Second + 1*time.Second + 3*time.Second) // the tail released and committed
	a.kill(syscall.SIGTERM)
	sc.instances = []*instance{a}
	checkCovered(t, ctx, addr, sc, ends, "after the first owner stopped")

	b.start()
	time.Sleep(8 * time.Second) // warmed up, idle, checkpointed
	b.kill(syscall.SIGTERM)
	sc.instances = []*instance{b}
	checkCovered(t, ctx, addr, sc, ends, "after a new owner without the snapshot warmed up and stopped")
	if log, _ := os.ReadFile(b.logs); bytes.Count(log, []byte("rebuilt its state by a warm-up read")) != recPartitions {
		t.Errorf("the new owner did not warm up every partition; end of its log:\n%s", tailLog(b.logs, 15))
	}
}
