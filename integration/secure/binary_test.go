//go:build integration

package secure

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/kafkaconn"
	"github.com/velocity-consumer/velocity-consumer/pkg/registry"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// syncBuffer is a bytes.Buffer the child's output and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testBinary runs the command as a user would on a managed cluster: the flags and
// environment of the README's example, passwords from a file and the environment.
// Outputs arrive in the wire format, the metrics endpoint answers on loopback without
// entity data, and neither password appears in the logs.
func testBinary(t *testing.T, b *kafkatest.SecureBroker) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "velocity-consumer")
	ctx := kafkatest.Context(t, 4*time.Minute)
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../../cmd/velocity-consumer").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	const regUser, regPass = "velocity", "registry-Pa55-word"
	reg := startRegistry(t, srfake.WithAuth("Basic "+base64.StdEncoding.EncodeToString([]byte(regUser+":"+regPass))))
	cl, err := registry.NewClient(registry.Config{URLs: []string{reg.URL()}, Username: regUser, Password: kafkaconn.NewSecret(regPass)})
	if err != nil {
		t.Fatal(err)
	}
	in, out, dlq := kafkatest.CreateTopic(t, b.Addr, 1, nil), kafkatest.CreateTopic(t, b.Addr, 1, nil), kafkatest.CreateTopic(t, b.Addr, 1, nil)
	v1 := createSchema(t, cl, in+"-value", schemas.Transaction)
	pwFile := filepath.Join(dir, "sasl-password")
	if err := os.WriteFile(pwFile, []byte(b.ScramPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	l.Close()

	cmd := exec.Command(bin, "run",
		"--brokers", b.SASLAddr, "--tls-ca-file", b.CAFile,
		"--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", b.ScramUser, "--sasl-password-file", pwFile,
		"--schema-registry", reg.URL(), "--schema-registry-username", regUser,
		"--schema-subject-strategy", "record",
		"--input-topic", in, "--output-topic", out, "--dlq-topic", dlq, "--group", kafkatest.Group(t),
		"--checkpoint-store", "memory", "--idle-timeout", "200ms", "--metrics-addr", metricsAddr)
	cmd.Env = append(os.Environ(), "VELOCITY_SCHEMA_REGISTRY_PASSWORD="+regPass)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("velocity-consumer run exited: %v\n%s", err, logs.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("velocity-consumer run did not stop on SIGTERM\n%s", logs.String())
		}
	}
	t.Cleanup(stop)

	opts := options(t, kafkaconn.Config{TLS: kafkaconn.TLS{CAFile: b.CAFile},
		SASL: kafkaconn.SASL{Mechanism: "SCRAM-SHA-512", Username: b.ScramUser, Password: kafkaconn.NewSecret(b.ScramPassword)}})
	var recs []*kgo.Record
	for i, entity := range []string{"card-secret-entity-1", "card-secret-entity-2", "card-secret-entity-1"} {
		recs = append(recs, &kgo.Record{Topic: in, Key: []byte(entity), Value: wire(t, v1.ID, v1.Schema.Schema, map[string]any{
			"event_id": "bin-" + string(rune('a'+i)), "entity_id": entity, "amount_minor": int64(500), "currency": "GBP",
			"event_time": time.Now().Add(time.Duration(i) * time.Millisecond).UTC()})})
	}
	if err := kafkatest.Produce(ctx, kafkatest.Client(t, b.SASLAddr, opts...), recs...); err != nil {
		t.Fatal(err)
	}
	r := newReader(t, b.SASLAddr, opts, out, dlq)
	end := time.Now().Add(90 * time.Second)
	for len(r.features()) < 3 {
		if time.Now().After(end) {
			t.Fatalf("%d features from the binary after 90s\n%s", len(r.features()), logs.String())
		}
		r.poll(t, time.Second)
	}
	// --schema-subject-strategy record: our schema under its full name.
	ss, err := cl.SchemaByVersion(ctx, "io.velocity.v1.VelocityFeatures", -1)
	if err != nil {
		t.Fatalf("output schema under the record subject: %v", err)
	}
	for _, v := range r.features() {
		if !bytes.HasPrefix(v, registry.AppendHeader(nil, ss.ID)) {
			t.Fatalf("features value %x does not start with the prefix of schema id %d", v[:min(5, len(v))], ss.ID)
		}
	}

	body := get(t, ctx, "http://"+metricsAddr+"/metrics")
	if !strings.Contains(body, "velocity_") {
		t.Fatalf("/metrics on %s has no velocity_ metric", metricsAddr)
	}
	stop()
	all := logs.String() + body
	for _, secret := range []string{b.ScramPassword, regPass} {
		if strings.Contains(all, secret) {
			t.Fatalf("a password appears in the logs or /metrics")
		}
	}
	if strings.Contains(body, "card-secret-entity") {
		t.Fatal("/metrics carries an entity id")
	}
	for _, want := range []string{`SASL_SSL (SCRAM-SHA-512 as \"` + b.ScramUser, `"output_subject":"io.velocity.v1.VelocityFeatures"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}
}

func get(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}
