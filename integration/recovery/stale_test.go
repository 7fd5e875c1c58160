//go:build integration

package recovery

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

// TestStaleSnapshotIsNotResumed: a partition moves A → B → A between two
// instances with per-instance file stores. When it comes back, A's store holds
// the snapshot A saved before B moved the partition on; the group's committed
// offset is B's, ahead of it. Resuming from that snapshot re-emits everything B
// already published (and, had retention deleted those records, would silently
// count none of them). A must rebuild from the committed offset instead, say so,
// and count it; its outputs still equal a clean run's.
func TestStaleSnapshotIsNotResumed(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	bin := buildBinary(t)
	ctx := kafkatest.Context(t, 4*time.Minute)
	adm := kafkatest.Admin(t, addr)
	keep := map[string]string{"retention.ms": "-1"}
	input := kafkatest.CreateTopic(t, addr, recPartitions, keep)
	mk := func(name string) *scenario {
		return &scenario{name: name, group: kafkatest.Group(t), store: "file://" + t.TempDir(),
			out: kafkatest.CreateTopic(t, addr, recPartitions, keep), dlq: kafkatest.CreateTopic(t, addr, 1, keep)}
	}
	clean, moved := mk("clean"), mk("moved")
	const windows = "1m:1s,5m:5s"
	a := newInstance(t, bin, "a", append(moved.args(addr, input), "--windows", windows, "--metrics-addr", "127.0.0.1:0"))
	bStore := "file://" + t.TempDir() // B's own directory: it never sees A's snapshots
	b := newInstance(t, bin, "b", append(moved.args(addr, input), "--windows", windows, "--checkpoint-store", bStore))
	c := newInstance(t, bin, "clean", append(clean.args(addr, input), "--windows", windows))
	moved.instances, clean.instances = []*instance{a, b}, []*instance{c}
	t.Cleanup(func() {
		for _, in := range []*instance{a, b, c} {
			in.kill(syscall.SIGKILL)
		}
	})

	recs := genStream(31, 24_000)
	parts := [][]*kgo.Record{recs[:8000], recs[8000:16000], recs[16000:]}
	var progress atomic.Int64
	step := func(in *instance, part []*kgo.Record, what string) map[int32]int64 {
		in.start()
		if err := produce(ctx, addr, input, part, 0, &progress); err != nil {
			t.Fatalf("%s: produce: %v", what, err)
		}
		ends := endOffsets(t, ctx, adm, input)
		if err := waitCommitted(ctx, adm, moved.group, input, ends); err != nil {
			t.Fatalf("%s: %v; end of its log:\n%s", what, err, tailLog(in.logs, 15))
		}
		return ends
	}
	step(a, parts[0], "A, first third")
	a.kill(syscall.SIGTERM)
	afterB := step(b, parts[1], "B, second third")
	b.kill(syscall.SIGTERM)
	ends := step(a, parts[2], "A again, last third")
	stale := metricSum(t, a, "velocity_snapshots_stale_total")
	a.kill(syscall.SIGTERM)

	c.start()
	if err := waitCommitted(ctx, adm, clean.group, input, ends); err != nil {
		t.Fatalf("clean: %v", err)
	}
	c.kill(syscall.SIGTERM)

	want := readOutputs(t, ctx, addr, clean, false, ends)
	got := readOutputs(t, ctx, addr, moved, false, ends)
	checkOutputs(t, ends, got, want, false)
	checkFinalState(t, got, want)
	// What B published must not be published again by A.
	again := 0
	for p, end := range afterB {
		for off := int64(0); off < end; off++ {
			if len(got[srcKey{p, off}]) > 1 {
				again++
			}
		}
	}
	if again > 0 {
		t.Errorf("%d input offsets before B's last commit were published again when the partition came back to A: it resumed from its stale snapshot", again)
	}
	if stale != recPartitions {
		t.Errorf("velocity_snapshots_stale_total = %v, want %d (every partition came back to a stale snapshot)", stale, recPartitions)
	}
	if log, _ := os.ReadFile(a.logs); !bytes.Contains(log, []byte("behind the group's committed offset")) {
		t.Errorf("A did not warn of its stale snapshots; end of its log:\n%s", tailLog(a.logs, 15))
	}
}

// TestRetentionGapIsLoud: records are deleted (as retention would) after the
// instance's last checkpoint and before it processes them. On restart its
// resume offset is below the log start; franz-go resets to the start, and the
// state never sees the deleted records. That must not be silent: an error line
// names the range and velocity_input_offsets_skipped_total counts it.
func TestRetentionGapIsLoud(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	bin := buildBinary(t)
	ctx := kafkatest.Context(t, 3*time.Minute)
	adm := kafkatest.Admin(t, addr)
	keep := map[string]string{"retention.ms": "-1"}
	input := kafkatest.CreateTopic(t, addr, recPartitions, keep)
	sc := &scenario{name: "gap", group: kafkatest.Group(t), store: "file://" + t.TempDir(),
		out: kafkatest.CreateTopic(t, addr, recPartitions, keep), dlq: kafkatest.CreateTopic(t, addr, 1, keep)}
	in := newInstance(t, bin, "gap", append(sc.args(addr, input), "--metrics-addr", "127.0.0.1:0"))
	sc.instances = []*instance{in}
	t.Cleanup(func() { in.kill(syscall.SIGKILL) })

	recs := genStream(41, 8000)
	var progress atomic.Int64
	in.start()
	if err := produce(ctx, addr, input, recs[:4000], 0, &progress); err != nil {
		t.Fatal(err)
	}
	first := endOffsets(t, ctx, adm, input)
	if err := waitCommitted(ctx, adm, sc.group, input, first); err != nil {
		t.Fatalf("%v; end of its log:\n%s", err, tailLog(in.logs, 15))
	}
	in.kill(syscall.SIGTERM)
	if err := produce(ctx, addr, input, recs[4000:], 0, &progress); err != nil {
		t.Fatal(err)
	}
	ends := endOffsets(t, ctx, adm, input)
	var del kadm.Offsets
	deleted := int64(0)
	for p, end := range ends {
		cut := first[p] + (end-first[p])/2
		del.Add(kadm.Offset{Topic: input, Partition: p, At: cut})
		deleted += cut - first[p]
	}
	resp, err := adm.DeleteRecords(ctx, del)
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	if err := resp.Error(); err != nil {
		t.Fatalf("delete records: %v", err)
	}
	in.start()
	if err := waitCommitted(ctx, adm, sc.group, input, ends); err != nil {
		t.Fatalf("%v; end of its log:\n%s", err, tailLog(in.logs, 15))
	}
	skipped := metricSum(t, in, "velocity_input_offsets_skipped_total")
	in.kill(syscall.SIGTERM)
	if skipped != float64(deleted) {
		t.Errorf("velocity_input_offsets_skipped_total = %v, want %d (the offsets deleted before they were processed)", skipped, deleted)
	}
	log, _ := os.ReadFile(in.logs)
	if n := bytes.Count(log, []byte("deleted by retention before they were processed")); n != recPartitions {
		t.Errorf("%d error lines about deleted records, want %d (one per partition); end of the log:\n%s", n, recPartitions, tailLog(in.logs, 15))
	}
}

// metricSum scrapes the running instance (started with --metrics-addr
// 127.0.0.1:0; the log names the address) and sums every series of name
// (-1, and t fails, when it is not exported at all).
func metricSum(t *testing.T, in *instance, name string) float64 {
	t.Helper()
	log, _ := os.ReadFile(in.logs)
	ms := regexp.MustCompile(`"msg":"serving metrics","addr":"([^"]+)"`).FindAllSubmatch(log, -1)
	if ms == nil {
		t.Fatalf("no metrics address in %s", in.logs)
	}
	// The last start's address.
	resp, err := http.Get("http://" + string(ms[len(ms)-1][1]) + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum, found := 0.0, false
	for _, m := range regexp.MustCompile(`(?m)^`+name+`(?:\{[^}]*\})? (\S+)$`).FindAllSubmatch(body, -1) {
		f, _ := strconv.ParseFloat(string(m[1]), 64)
		sum, found = sum+f, true
	}
	if !found && !bytes.Contains(body, []byte("# TYPE "+name+" ")) {
		t.Errorf("metric %s not exported", name)
		return -1
	}
	return sum
}
