//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/deploy"
	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// TestPrometheusEvaluatesRules runs the built binary on the real broker, has a real
// Prometheus server (Debian's prometheus package) scrape it every second with
// deploy/alerts.yml loaded, and asks the server for every rule's expression and every
// dashboard query: each must be accepted and return series. An alert's expression is
// asked in its bool form (`x > 0.5` as `x > bool 0.5`, deploy.BoolForm), which returns
// the compared quantity whether or not the alert fires. The input makes every
// labelled series exist: decode, duplicate and late dead letters, a key mismatch, and
// entity-cap evictions (--max-entities 1). Only expressions over a metric that
// deploy.PendingMetrics or deploy.EventMetrics lists may return nothing, and only
// while it is absent.
func TestPrometheusEvaluatesRules(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("VELOCITY_REQUIRE_KAFKA") == "1" {
			t.Fatal("prometheus (the server, Debian package prometheus) not found on PATH; .ci/run installs it")
		}
		t.Skip("skipping: prometheus (the server, Debian package prometheus) not found on PATH")
	}
	addr := kafkatest.Broker(t)
	in, out, dlq := kafkatest.CreateTopic(t, addr, 1, nil), kafkatest.CreateTopic(t, addr, 1, nil), kafkatest.CreateTopic(t, addr, 1, nil)
	bin := replayBinary(t)
	ports := kafkatest.FreePorts(t, 2)
	metricsAddr, promAddr := "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1])

	cmd := exec.Command(bin, "run", "--brokers", addr, "--input-topic", in, "--output-topic", out, "--dlq-topic", dlq,
		"--group", kafkatest.Group(t), "--checkpoint-store", "memory", "--checkpoint-interval", "1s",
		"--idle-timeout", "200ms", "--max-entities", "1", "--metrics-addr", metricsAddr, "--log-level", "warn")
	var logs strings.Builder
	// A memory limit, as the Kubernetes manifests set, for the rules that compare
	// with go_gc_gomemlimit_bytes.
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=1GiB")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopProcess(t, cmd, "velocity-consumer run", &logs)

	// Input: three entities (the cap evicts), a key that is not the entity id, an
	// undecodable value, a duplicate event id, and an event an hour behind the rest.
	now := time.Now().UnixMilli()
	var recs []*kgo.Record
	tx := func(id, entity, key string, at int64) *kgo.Record {
		v := codec.Transaction{EventID: id, EntityID: entity, AmountMinor: 250, Currency: "EUR", EventTime: at}
		return &kgo.Record{Topic: in, Key: []byte(key), Value: codec.EncodeTransaction(&v)}
	}
	for i := range 9 {
		e := fmt.Sprintf("card-%d", i%3)
		recs = append(recs, tx(fmt.Sprintf("p-%d", i), e, e, now+int64(i)))
	}
	recs = append(recs,
		tx("p-mismatch", "card-0", "not-the-entity", now+20),
		tx("p-3", "card-0", "card-0", now+21),           // duplicate event id
		tx("p-late", "card-1", "card-1", now-3_600_000), // an hour behind the watermark
		&kgo.Record{Topic: in, Key: []byte("card-2"), Value: []byte{0xff}},
	)
	if err := kafkatest.Produce(kafkatest.Context(t, 30*time.Second), kafkatest.Client(t, addr), recs...); err != nil {
		t.Fatal(err)
	}

	// Prometheus, scraping every second, with the rules.
	rules, err := filepath.Abs("../deploy/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: velocity-consumer
    static_configs:
      - targets: ["%s"]
`, rules, metricsAddr), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := exec.Command(promBin, "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	var promLogs strings.Builder
	prom.Stdout, prom.Stderr = &promLogs, &promLogs
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	stopProcess(t, prom, "prometheus", &promLogs)

	q := func(expr string) ([]json.RawMessage, error) { return promQuery(promAddr, expr) }
	// Every input record has its output, and Prometheus has several scrapes of it
	// (rate and deriv need two samples in their range).
	waitFor(t, 90*time.Second, "the outputs of every input record, scraped 5 times", func() (bool, string) {
		r, err := q(fmt.Sprintf(`sum(velocity_features_total) + sum(velocity_dead_letters_total) >= %d`, len(recs)))
		if err != nil || len(r) == 0 {
			return false, fmt.Sprintf("%v %s\nconsumer:\n%s\nprometheus:\n%s", err, r, logs.String(), promLogs.String())
		}
		r, err = q(`count_over_time(velocity_records_in_total[5m]) >= 5`)
		return err == nil && len(r) > 0, fmt.Sprint(err)
	})

	pending := map[string]bool{}
	for _, p := range deploy.PendingMetrics {
		r, err := q("group(" + p + ")")
		if err != nil {
			t.Fatal(err)
		}
		pending[p] = len(r) == 0
		if len(r) > 0 {
			t.Errorf("%s has series now: remove it from deploy.PendingMetrics", p)
		}
	}
	for _, e := range deploy.EventMetrics {
		if r, err := q("group(" + e + ")"); err == nil {
			pending[e] = len(r) == 0
		}
	}
	usesAbsent := func(expr string) string {
		for _, n := range deploy.MetricNames(expr) {
			if pending[n] {
				return n
			}
		}
		return ""
	}
	check := func(what, expr string) {
		r, err := q(expr)
		if err != nil {
			t.Errorf("%s: Prometheus refuses %s: %v", what, expr, err)
			return
		}
		if len(r) > 0 {
			return
		}
		if p := usesAbsent(expr); p != "" {
			t.Logf("%s: no series: %s is pending, or counts events this run does not cause (deploy.PendingMetrics, EventMetrics)", what, p)
			return
		}
		t.Errorf("%s returns no series on a running instance:\n\t%s", what, expr)
	}

	rs, err := deploy.Rules()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		expr := r.Expr
		if r.Alert != "" {
			var ok bool
			if expr, ok = deploy.BoolForm(r.Expr); !ok {
				t.Errorf("alert %s compares with no number", r.Alert)
				continue
			}
		}
		check("rule "+r.Name(), expr)
	}
	qs, err := deploy.DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	grafana := strings.NewReplacer(`$job`, `.+`, `$__rate_interval`, `1m`, `$__range`, `5m`)
	for _, d := range qs {
		expr := d.Expr
		if strings.HasPrefix(expr, "label_values(") { // a variable: Grafana's function, not PromQL
			m := strings.TrimSuffix(strings.TrimPrefix(expr, "label_values("), ")")
			expr, _, _ = strings.Cut(m, ",")
		}
		check("dashboard "+d.Panel, grafana.Replace(expr))
	}

	// The server loaded every rule and evaluates each without error.
	body, err := promGet(promAddr, "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	var rr struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &rr); err != nil {
		t.Fatal(err)
	}
	loaded := 0
	for _, g := range rr.Data.Groups {
		for _, r := range g.Rules {
			loaded++
			if r.Health == "err" {
				t.Errorf("Prometheus evaluates rule %s with an error: %s", r.Name, r.LastError)
			}
		}
	}
	if loaded != len(rs) {
		t.Errorf("Prometheus loaded %d rules, alerts.yml has %d", loaded, len(rs))
	}
	t.Logf("%d rules and %d dashboard queries evaluated on a real Prometheus scraping a running instance", len(rs), len(qs))
}

// stopProcess ends cmd with SIGTERM when the test ends (SIGKILL after 30 s), and
// shows its output if the test failed.
func stopProcess(t *testing.T, cmd *exec.Cmd, name string, logs *strings.Builder) {
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s did not stop within 30s of SIGTERM", name)
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, logs.String())
		}
	})
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		good, why := ok()
		if good {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no %s after %v: %s", what, d, why)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func promGet(addr, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, b)
	}
	return b, err
}

// promQuery runs an instant query and returns its result vector.
func promQuery(addr, expr string) ([]json.RawMessage, error) {
	b, err := promGet(addr, "/api/v1/query?query="+url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s", r.Error)
	}
	return r.Data.Result, nil
}
