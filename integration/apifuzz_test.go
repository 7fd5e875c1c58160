//go:build integration

package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// schemathesis finds the schemathesis CLI. Missing, it skips the test, or fails it
// where a run must not skip: VELOCITY_REQUIRE_KAFKA=1 (CI, make test-integration) or
// VELOCITY_REQUIRE_SCHEMATHESIS=1. .ci/run installs the version it pins.
func schemathesis(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"schemathesis", "st"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	// pip may have put it in Python's scripts directory without that being on PATH.
	if out, err := exec.Command("python3", "-c", "import sysconfig; print(sysconfig.get_path('scripts'))").Output(); err == nil {
		if p := filepath.Join(strings.TrimSpace(string(out)), "schemathesis"); fileExists(p) {
			return p
		}
	}
	msg := "the API fuzz run needs schemathesis on PATH (pip install schemathesis)"
	if os.Getenv("VELOCITY_REQUIRE_KAFKA") == "1" || os.Getenv("VELOCITY_REQUIRE_SCHEMATHESIS") == "1" {
		t.Fatal(msg)
	}
	t.Skip("skipping: " + msg)
	return ""
}

// TestQueryAPIFuzz runs schemathesis against the OpenAPI document (api/openapi.yaml)
// and the built binary's query API, serving a real topic on the real broker with a
// bearer token: every generated request, valid or not, must get a documented status
// with a body of the documented schema and content type, never a 5xx; invalid input
// must be refused, a missing token must be refused, wrong methods get 405.
//
// The server runs no feature definition, so the features path is not its own (404,
// like any unknown path) and is left out here; TestQueryAPIFuzzFeatures fuzzes it.
func TestQueryAPIFuzz(t *testing.T) {
	t.Parallel()
	fuzzQueryAPI(t, []string{"--windows", "1m:1s,5m:5s,1h:1m"}, transactionRecords, nil,
		"--exclude-path", "/v1/entities/{entity_id}/features", "--exclude-path", "/v1/groups/{group}/entities/{entity_id}/features",
		"--exclude-path", "/v1/groups", "--exclude-path", "/v1/transaction/features")
}

// fuzzDefinition is a feature definition over our Transaction schema for the fuzz
// run: a filter and a distinct count that samples, so the answers hold nulls, and
// exact both true and false.
const fuzzDefinition = `
version: fuzz
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [1m:1s, 5m:5s, 1h:1m]
features:
  - {name: n, agg: count, windows: [1m, 1h]}
  - {name: big_min, agg: min, windows: [1m, 5m], where: [{field: amount_minor, ge: 10000}]}
  - {name: ids, agg: distinct_count, field: event_id, windows: [5m, 1h], max_exact: 8}
`

// TestQueryAPIFuzzFeatures is TestQueryAPIFuzz on a service running a feature
// definition (--features): every endpoint, the features one included.
func TestQueryAPIFuzzFeatures(t *testing.T) {
	t.Parallel()
	def := filepath.Join(t.TempDir(), "fuzz.yaml")
	if err := os.WriteFile(def, []byte(fuzzDefinition), 0o600); err != nil {
		t.Fatal(err)
	}
	fuzzQueryAPI(t, []string{"--features", def}, transactionRecords, nil)
}

// TestQueryAPIFuzzGroups is TestQueryAPIFuzz under a definition with re-keyed
// groups (payment_groups.yaml: card in place, device and ip re-keyed): the group
// endpoint, the transaction call and the groups' list included, every group's
// partitions served by its own service and consumer group.
func TestQueryAPIFuzzGroups(t *testing.T) {
	t.Parallel()
	schema, err := os.ReadFile(paymentSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	recs := func(t *testing.T, in string) []*kgo.Record {
		r, err := streamtest.PaymentRecords(in, string(schema), streamtest.PaymentStream(streamtest.PaymentStreamConfig{Seed: 5, N: 1500, Partitions: 3, Cards: 50}))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Ready once every group answers for keys of every partition.
	var ready []string
	for i := range 30 {
		ready = append(ready, fmt.Sprintf("/v1/groups/device/entities/dev-%d/features", i), fmt.Sprintf("/v1/groups/ip/entities/ip-%d/features", i))
	}
	fuzzQueryAPI(t, []string{"--features", paymentGroupsPath, "--allowed-lateness", "5s", "--idle-timeout", "2s"}, recs, ready)
}

// transactionRecords are 2000 records of our Transaction schema, 50 cards.
func transactionRecords(_ *testing.T, in string) []*kgo.Record {
	var recs []*kgo.Record
	now := time.Now().Add(-10 * time.Minute).UnixMilli()
	for i := range 2000 {
		tx := codec.Transaction{EventID: fmt.Sprint("fuzz-", i), EntityID: fmt.Sprint("card-", i%50), AmountMinor: int64(i * 7), EventTime: now + int64(i)*100}
		recs = append(recs, &kgo.Record{Topic: in, Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)})
	}
	return recs
}

// fuzzQueryAPI runs the built binary with semantics over a topic of records and
// schemathesis against it, once every path of ready (and the velocity of 50 ids)
// answers 200, with extra schemathesis arguments.
func fuzzQueryAPI(t *testing.T, semantics []string, records func(t *testing.T, in string) []*kgo.Record, ready []string, extra ...string) {
	st := schemathesis(t)
	addr := kafkatest.Broker(t)
	in, out, dlq := liveTopics(t, addr, 3)
	recs := records(t, in)
	if err := kafkatest.Produce(kafkatest.Context(t, 60*time.Second), kafkatest.Client(t, addr, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(0)), recs...); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("fuzz-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := replayBinary(t)
	port := kafkatest.FreePorts(t, 1)[0]
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := append([]string{"run",
		"--brokers", addr, "--group", kafkatest.Group(t), "--input-topic", in, "--output-topic", out, "--dlq-topic", dlq,
		"--checkpoint-store", "memory", "--metrics-addr", "",
		"--api-addr", "127.0.0.1:" + strconv.Itoa(port), "--api-token-file", token, "--log-level", "warn"}, semantics...)
	cmd := exec.CommandContext(ctx, bin, args...)
	logf, err := os.Create(filepath.Join(dir, "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("service log:\n%s", b)
		}
	}()
	// Ready once every partition answers: the fuzz run must meet no 503 of a start.
	client := &http.Client{Timeout: 5 * time.Second}
	for i := range 50 {
		ready = append(ready, fmt.Sprintf("/v1/entities/card-%d/velocity", i))
	}
	waitUntil(t, "the API answers for every partition", 90*time.Second, func() bool {
		for _, path := range ready {
			req, _ := http.NewRequest("GET", base+path, nil)
			req.Header.Set("Authorization", "Bearer fuzz-token")
			resp, err := client.Do(req)
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
		}
		return true
	})

	spec, err := filepath.Abs("../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fuzz := exec.Command(st, append([]string{"run", spec, "--url", base,
		// Every check but positive_data_acceptance: a window name the document allows
		// (any string) is refused unless it is configured, as it must be.
		"--checks", "all", "--exclude-checks", "positive_data_acceptance",
		"--header", "Authorization: Bearer fuzz-token",
		// One worker: with two, hypothesis parses lambdas' sources on two threads
		// at once, which CPython 3.11 can fail in ast.parse ("AST constructor
		// recursion depth mismatch", a runtime error of the fuzzer, not of the
		// API); the three fuzz tests still run side by side as processes.
		"--max-time", "45", "--workers", "1", "--seed", "23"}, extra...)...)
	fuzz.Env = append(os.Environ(), "NO_COLOR=1")
	fuzz.Dir = t.TempDir() // its cache (.schemathesis/) stays out of the repository
	outb, err := fuzz.CombinedOutput()
	report := string(outb)
	if i := strings.Index(report, "SUMMARY"); i >= 0 {
		t.Logf("schemathesis:\n%s", report[i:])
	}
	if err != nil {
		t.Fatalf("schemathesis found failures (%v):\n%s", err, report)
	}
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
