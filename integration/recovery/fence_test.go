//go:build integration

package recovery

import (
	"bytes"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestExactlyOnceSurvivesAFencedTransaction: while an exactly-once instance
// runs, another producer initialises the transactional ids of two of its
// partitions, which is what a stale instance does, and what the coordinator's
// abort of a timed-out transaction looks like to the producer. The instance
// must not stop: it drops those partitions' uncommitted work, finds that the
// group still assigns the partitions to it, restores them from their last
// commit and goes on. read_committed then sees exactly one output per input
// offset, equal to a clean run's.
func TestExactlyOnceSurvivesAFencedTransaction(t *testing.T) {
	t.Parallel()
	rc := newRestoreCase(t, 40_000, "1m:1s,5m:5s", true)
	var progress atomic.Int64
	rc.b.start()
	rc.cleanIn.start()
	if err := produce(rc.ctx, rc.addr, rc.input, rc.first, 0, &progress); err != nil {
		t.Fatalf("produce first half: %v", err)
	}
	if err := waitCommitted(rc.whileRunning(rc.b), rc.adm, rc.resumed.group, rc.input, endOffsets(t, rc.ctx, rc.adm, rc.input)); err != nil {
		t.Fatalf("first half: %v; end of its log:\n%s", err, tailLog(rc.b.logs, 15))
	}

	fenced := []int32{0, 2}
	for _, p := range fenced {
		id := fmt.Sprintf("velocity-%s-%s-%d", rc.resumed.group, rc.input, p)
		cl, err := kgo.NewClient(kgo.SeedBrokers(rc.addr), kgo.TransactionalID(id))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := cl.ProducerID(rc.ctx); err != nil {
			t.Fatalf("initialise %s: %v", id, err)
		}
		cl.Close()
	}

	if err := produce(rc.ctx, rc.addr, rc.input, rc.second, 0, &progress); err != nil {
		t.Fatalf("produce second half: %v", err)
	}
	ends := endOffsets(t, rc.ctx, rc.adm, rc.input)
	for _, sc := range []*scenario{rc.resumed, rc.clean} {
		in := sc.instances[len(sc.instances)-1]
		if err := waitCommitted(rc.whileRunning(in), rc.adm, sc.group, rc.input, ends); err != nil {
			t.Fatalf("%s: %v; end of its log:\n%s", sc.name, err, tailLog(in.logs, 20))
		}
	}
	if !rc.b.running() {
		t.Fatalf("the fenced instance stopped; end of its log:\n%s", tailLog(rc.b.logs, 20))
	}
	lost := rc.metric("velocity_txn_partitions_lost_total")
	rc.b.kill(syscall.SIGTERM)
	rc.cleanIn.kill(syscall.SIGTERM)

	want := readOutputs(t, rc.ctx, rc.addr, rc.clean, false, ends)
	got := readOutputs(t, rc.ctx, rc.addr, rc.resumed, true, ends)
	checkOutputs(t, ends, got, want, true)
	checkFinalState(t, got, want)

	if lost != float64(len(fenced)) {
		t.Errorf("velocity_txn_partitions_lost_total = %v, want %d", lost, len(fenced))
	}
	log, _ := os.ReadFile(rc.b.logs)
	if n := bytes.Count(log, []byte("transaction fenced or aborted")); n != len(fenced) {
		t.Errorf("%d log lines about a lost transaction, want %d (log %s)", n, len(fenced), rc.b.logs)
	}
	if bytes.Contains(log, []byte("stopping: fatal error")) {
		t.Errorf("the instance logged a fatal error:\n%s", tailLog(rc.b.logs, 20))
	}
	// Restored in place, unless the group itself took the partitions away
	// meanwhile (a missed heartbeat on a loaded machine) and gave them back.
	inPlace := bytes.Count(log, []byte("still assigns us a partition whose transaction was lost"))
	t.Logf("fenced partitions %v: %v lost transactions, %d restored in place, %d offsets checked", fenced, lost, inPlace, len(got))
}

// TestInstanceFrozenPastItsSession freezes (SIGSTOP) one of two instances for
// twice --session-timeout while the stream runs, then thaws it. Meanwhile the
// group gives its partitions to the other instance. On waking, the thawed one
// may still emit, save snapshots and try to commit for partitions that are no
// longer its own before it hears of the rebalance; in exactly-once mode the
// new owner has fenced its transactions, so it finds them fenced or hears that
// it lost its partitions, whichever comes first. Both instances must keep
// running. Default mode: every input offset has at least one output, each
// byte-identical to a clean run's. Exactly-once: read_committed has exactly one.
func TestInstanceFrozenPastItsSession(t *testing.T) {
	inBothModes(t, func(t *testing.T, _ string, eos bool) {
		rc := newRestoreCase(t, 40_000, "1m:1s,5m:5s", eos)
		ends := rc.runFrozen()
		want := readOutputs(t, rc.ctx, rc.addr, rc.clean, false, ends)
		got := readOutputs(t, rc.ctx, rc.addr, rc.resumed, eos, ends)
		checkOutputs(t, ends, got, want, eos)
		checkFinalState(t, got, want)
	})
}

// runFrozen runs instances a and b of the resumed group and the clean one
// over the whole stream, produced over 20 s; a quarter of the way in, b is
// frozen (SIGSTOP) for twice --session-timeout and then thawed. It checks
// that both instances kept running without a fatal error, stops every
// instance and returns the input's end offsets.
func (rc *restoreCase) runFrozen() map[int32]int64 {
	t := rc.t
	rc.a.start()
	rc.b.start()
	rc.cleanIn.start()
	all := append(append([]*kgo.Record(nil), rc.first...), rc.second...)
	var progress atomic.Int64
	produced := make(chan error, 1)
	go func() { produced <- produce(rc.ctx, rc.addr, rc.input, all, 20*time.Second, &progress) }()
	waitProgress(rc.ctx, &progress, len(all)/4)
	rc.b.signal(syscall.SIGSTOP)
	time.Sleep(12 * time.Second) // --session-timeout is 6s
	rc.b.signal(syscall.SIGCONT)
	if err := <-produced; err != nil {
		t.Fatalf("produce: %v", err)
	}
	ends := endOffsets(t, rc.ctx, rc.adm, rc.input)
	for _, sc := range []*scenario{rc.resumed, rc.clean} {
		if err := waitCommitted(rc.ctx, rc.adm, sc.group, rc.input, ends); err != nil {
			t.Fatalf("%s: %v; end of the thawed instance's log:\n%s", sc.name, err, tailLog(rc.b.logs, 20))
		}
	}
	for _, in := range []*instance{rc.a, rc.b} {
		if !in.running() {
			t.Fatalf("%s stopped; end of its log:\n%s", in.logs, tailLog(in.logs, 20))
		}
	}
	t.Logf("thawed instance: %v transactions found fenced", rc.metric("velocity_txn_partitions_lost_total"))
	for _, in := range []*instance{rc.a, rc.b, rc.cleanIn} {
		in.kill(syscall.SIGTERM)
	}
	for _, in := range []*instance{rc.a, rc.b} {
		log, _ := os.ReadFile(in.logs)
		if bytes.Contains(log, []byte("stopping: fatal error")) {
			t.Errorf("%s logged a fatal error:\n%s", in.logs, tailLog(in.logs, 20))
		}
	}
	return ends
}

// signal sends sig to the running process without waiting (SIGSTOP, SIGCONT).
func (in *instance) signal(sig syscall.Signal) {
	in.mu.Lock()
	cmd := in.cmd
	in.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(sig)
	}
}
