//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

// TestReadmeFiveMinutePath walks the README's "Five minutes on a real broker"
// on a real broker, as the built binary, kcat and Python run it (with this
// test's own topic and group names): produce examples/transactions.jsonl, run
// the service with the example's windows, watch the two topics with the kcat
// commands the README prints, decode the features with
// examples/read_features.py, and stop the service with Ctrl-C.
func TestReadmeFiveMinutePath(t *testing.T) {
	t.Parallel()
	kcat := kcatPath(t)
	if err := exec.Command("python3", "-c", "import fastavro").Run(); err != nil {
		if v := os.Getenv("VELOCITY_REQUIRE_PYTHON"); v == "" || v == "0" {
			t.Skipf("python3 with fastavro not available (%v): python3 -m pip install fastavro", err)
		}
		t.Fatalf("python3 with fastavro is required (VELOCITY_REQUIRE_PYTHON=1): %v", err)
	}
	addr := kafkatest.Broker(t)
	bin := replayBinary(t)
	in, out, dlq, group := kafkatest.Topic(t), kafkatest.Name(t, "out"), kafkatest.Name(t, "dlq"), kafkatest.Group(t)

	produce, err := exec.Command(bin, "produce", "--brokers", addr, "--topic", in, "--input-file", "../examples/transactions.jsonl").CombinedOutput()
	if err != nil || !strings.Contains(string(produce), "produced 13 records") {
		t.Fatalf("produce: %v\n%s", err, produce)
	}

	run := exec.Command(bin, "run", "--brokers", addr, "--input-topic", in, "--output-topic", out, "--dlq-topic", dlq,
		"--group", group, "--windows", "10s:1s,1m:10s", "--allowed-lateness", "2s",
		"--checkpoint-store", "memory", "--metrics-addr", "", "--log-format", "console")
	var runLog bytes.Buffer
	run.Stdout, run.Stderr = &runLog, &runLog
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			run.Process.Kill()
			run.Wait()
		}
	})

	// The README's first kcat command, until all 9 features records are there.
	lines := func(args ...string) []string {
		t.Helper()
		cmd := exec.Command(kcat, append([]string{"-b", addr, "-C", "-o", "beginning", "-e", "-q"}, args...)...)
		b, err := cmd.Output()
		if err != nil {
			return nil // the topic may not exist yet
		}
		return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	}
	var features []string
	for deadline := time.Now().Add(90 * time.Second); len(features) < 9 && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		features = lines("-t", out, "-f", `p%p@%o key %k: %S bytes\n`)
		if len(features) == 1 && features[0] == "" {
			features = nil
		}
	}
	if len(features) != 9 || !regexp.MustCompile(`^p0@0 key card-A: \d+ bytes$`).MatchString(features[0]) {
		t.Fatalf("kcat read %d features records %q, want 9 starting p0@0 key card-A\nrun's log:\n%s", len(features), features, runLog.String())
	}

	var reasons []string
	for _, h := range lines("-t", dlq, "-f", `%h\n\n`) {
		if m := regexp.MustCompile(`^velocity\.reason=([^,]+),`).FindStringSubmatch(h); m != nil {
			reasons = append(reasons, m[1])
		}
	}
	if strings.Join(reasons, " ") != "late duplicate invalid:entity_id decode" {
		t.Errorf("dead-letter reasons %v, want late, duplicate, invalid:entity_id, decode", reasons)
	}

	// kcat -f '%R%s' | python3 examples/read_features.py
	kc := exec.Command(kcat, "-b", addr, "-C", "-t", out, "-o", "beginning", "-e", "-q", "-f", "%R%s")
	py := exec.Command("python3", "../examples/read_features.py")
	pipe, err := kc.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	py.Stdin = pipe
	var pyOut, pyErr bytes.Buffer
	py.Stdout, py.Stderr = &pyOut, &pyErr
	if err := kc.Start(); err != nil {
		t.Fatal(err)
	}
	if err := py.Run(); err != nil {
		t.Fatalf("read_features.py: %v\n%s", err, pyErr.String())
	}
	kc.Wait()
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(pyOut.String()), "\n") {
		var f struct {
			EventID string `json:"event_id"`
			Windows []struct {
				Window   string `json:"window"`
				Count    int64  `json:"count"`
				SumMinor int64  `json:"sum_minor"`
			} `json:"windows"`
		}
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatalf("read_features.py printed %q: %v", l, err)
		}
		ids = append(ids, f.EventID)
		if f.EventID == "e5" && (f.Windows[0].Window != "10s" || f.Windows[0].Count != 5 || f.Windows[0].SumMinor != 8900) {
			t.Errorf("e5 decoded as %+v, want 10s count 5 sum 8900", f.Windows)
		}
	}
	if got := strings.Join(ids, " "); got != "e1 e2 e3 e4 e6 e5 e10 e11 e12" {
		t.Errorf("decoded features in the order %s, want the release order e1 e2 e3 e4 e6 e5 e10 e11 e12", got)
	}
	if !strings.Contains(pyErr.String(), "9 features records") {
		t.Errorf("read_features.py said %q, want it to count 9 records", pyErr.String())
	}

	// Ctrl-C: a clean stop.
	if err := run.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	select {
	case err := <-done:
		stopped = true
		if err != nil {
			t.Errorf("run after Ctrl-C: %v\n%s", err, runLog.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("run did not stop within 60s of SIGINT\n%s", runLog.String())
	}
}
