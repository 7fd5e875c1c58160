//go:build integration

package recovery

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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
	for _, eos := range []bool{false, true} {
		name := "at-least-once"
		if eos {
			name = "exactly-once"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := kafkatest.Broker(t)
			bin := buildBinary(t)
			ctx := kafkatest.Context(t, 3*time.Minute)
			adm := kafkatest.Admin(t, addr)
			keep := map[string]string{"retention.ms": "-1"}
			input := kafkatest.CreateTopic(t, addr, recPartitions, keep)
			snaps := kafkatest.Name(t, "snap")
			t.Cleanup(func() {
				c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, _ = adm.DeleteTopic(c, snaps)
			})
			sc := &scenario{name: name, eos: eos, group: kafkatest.Group(t), store: "kafka://" + snaps,
				out: kafkatest.CreateTopic(t, addr, recPartitions, keep), dlq: kafkatest.CreateTopic(t, addr, 1, keep)}
			// Later flags win: a real reorder wait and idle release, which
			// the other recovery tests turn off to stay deterministic.
			args := append(sc.args(addr, input), "--allowed-lateness", "1s", "--idle-timeout", "1s")
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
