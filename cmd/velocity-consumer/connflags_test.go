package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
)

const testSecret = "Zq9-very-secret-pw"

// --help of both commands documents the secret's sources and never shows a
// secret set in the environment (there is no password flag to default to it).
func TestHelpNeverShowsSecrets(t *testing.T) {
	t.Setenv(envSASLPassword, testSecret)
	t.Setenv(envRegistryPassword, testSecret)
	for _, cmd := range []struct {
		name     string
		register func(*envFlags)
		usage    string
	}{
		{"run", func(e *envFlags) { var r runFlags; r.register(e) }, runUsage},
		{"replay", func(e *envFlags) { var r replayFlags; r.register(e) }, replayUsage},
	} {
		t.Run(cmd.name, func(t *testing.T) {
			e := newEnvFlags(cmd.name, cmd.usage)
			cmd.register(e)
			var out bytes.Buffer
			e.fs.SetOutput(&out)
			if err := e.Parse([]string{"--help"}); err == nil {
				t.Fatal("--help parsed without flag.ErrHelp")
			}
			help := out.String()
			if strings.Contains(help, testSecret) {
				t.Fatalf("--help shows the secret:\n%s", help)
			}
			for _, want := range []string{"--tls-ca-file", "--sasl-mechanism", "--sasl-password-file", envSASLPassword,
				"--schema-registry", envRegistryPassword, "--schema-subject-strategy"} {
				if !strings.Contains(help, want) {
					t.Errorf("--help does not mention %s", want)
				}
			}
			if e.fs.Lookup("sasl-password") != nil || e.fs.Lookup("schema-registry-password") != nil {
				t.Error("a password flag exists: it would show in ps")
			}
		})
	}
}

// The startup line says how we connect, and carries no password however it
// was given.
func TestStartupLogHasNoSecret(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string // the security field
	}{
		{"password from file", nil, []string{"--tls", "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "svc", "--sasl-password-file", pwFile},
			`SASL_SSL (SCRAM-SHA-512 as "svc")`},
		{"password from environment", map[string]string{envSASLPassword: testSecret, "VELOCITY_SASL_MECHANISM": "PLAIN", "VELOCITY_SASL_USERNAME": "svc"}, nil,
			`SASL_PLAINTEXT (PLAIN as "svc")`},
		{"no security", nil, nil, "PLAINTEXT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseRun(t, tt.env, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zapcore.DebugLevel)
			if _, _, err := r.conn.clientOpts(zap.New(core)); err != nil {
				t.Fatal(err)
			}
			entries := logs.All()
			if len(entries) == 0 || entries[0].ContextMap()["security"] != tt.want {
				t.Fatalf("startup log %v, want security=%q", entries, tt.want)
			}
			for _, e := range entries {
				if line := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(line, testSecret) {
					t.Fatalf("log line carries the secret: %s", line)
				}
			}
		})
	}
}

func TestConnFlagErrorsNameTheFlag(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(testSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"mechanism without a password", nil, []string{"--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "u"}, envSASLPassword},
		{"unknown mechanism", map[string]string{envSASLPassword: testSecret}, []string{"--sasl-mechanism", "OAUTHBEARER", "--sasl-username", "u"}, "--sasl-mechanism"},
		{"password file and environment", map[string]string{envSASLPassword: testSecret}, []string{"--sasl-mechanism", "PLAIN", "--sasl-username", "u", "--sasl-password-file", pwFile}, "--sasl-password-file and " + envSASLPassword},
		{"missing password file", nil, []string{"--sasl-mechanism", "PLAIN", "--sasl-username", "u", "--sasl-password-file", pwFile + ".nope"}, "--sasl-password-file"},
		{"client cert without key", nil, []string{"--tls-cert-file", "c.pem"}, "--tls-key-file"},
		{"writer schema with a registry", nil, []string{"--schema-registry", "http://127.0.0.1:1", "--writer-schema", "../../schemas/transaction.avsc"}, "--schema-registry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseRun(t, tt.env, append(tt.args, "--checkpoint-store", "memory")...)
			if err != nil {
				t.Fatal(err)
			}
			_, err = r.serviceConfig()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), testSecret) {
				t.Fatalf("error carries the secret: %v", err)
			}
		})
	}
}

// --metrics-addr binds where it is told, e.g. loopback only, and serves the
// three endpoints there.
func TestMetricsAddrLoopback(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	r, err := parseRun(t, nil, "--checkpoint-store", "memory")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := r.serviceConfig()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(cfg, zap.NewNop(), m)
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Store.Close()
	stop, err := serveHTTP(addr, reg, svc, zap.NewNop(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for path, want := range map[string]int{"/metrics": 200, "/healthz": 200, "/readyz": 503, "/debug/pprof/": 404} {
		if got := httpStatus(t, addr, path); got != want {
			t.Errorf("GET %s: %d, want %d", path, got, want)
		}
	}
	if _, err := serveHTTP(addr, reg, svc, zap.NewNop(), false); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("second bind of %s: %v, want an error naming --metrics-addr", addr, err)
	}
}

// TestPprofServed: with --pprof the profiler's index and a heap profile answer
// on the metrics address.
func TestPprofServed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r, err := parseRun(t, nil, "--checkpoint-store", "memory", "--pprof")
	if err != nil {
		t.Fatal(err)
	}
	if !r.pprof {
		t.Fatal("--pprof not parsed")
	}
	cfg, err := r.serviceConfig()
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Store.Close()
	reg := prometheus.NewRegistry()
	svc, err := service.New(cfg, zap.NewNop(), metrics.New(reg))
	if err != nil {
		t.Fatal(err)
	}
	stop, err := serveHTTP(addr, reg, svc, zap.NewNop(), r.pprof)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/metrics"} {
		if got := httpStatus(t, addr, path); got != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, got)
		}
	}
}

// httpStatus GETs path from addr and returns the status code.
func httpStatus(t *testing.T, addr, path string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return resp.StatusCode
}

// A start waits for a schema registry that refuses connections (a registry
// restarting), and a stop while it waits (SIGTERM: the context ends) is a clean
// exit: nothing was read, there is nothing to checkpoint.
func TestRunStoppedWhileWaitingForTheRegistry(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(700*time.Millisecond, cancel)
	begin := time.Now()
	err = cmdRun(ctx, []string{"--brokers", "127.0.0.1:1", "--input-topic", "in", "--output-topic", "out", "--dlq-topic", "dlq",
		"--group", "g", "--checkpoint-store", "memory", "--schema-registry", refused, "--metrics-addr", "", "--log-level", "error"})
	if err != nil {
		t.Fatalf("run stopped while waiting for the registry: %v, want a clean stop", err)
	}
	if waited := time.Since(begin); waited < 600*time.Millisecond {
		t.Fatalf("run returned after %s, before it was stopped: it did not wait for the registry", waited)
	}
}
