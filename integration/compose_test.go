//go:build integration

package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// Docker cannot run where CI runs, so these tests check the container files against the
// binary instead: every variable and port that docker-compose.yml gives the consumer must
// be one that `velocity-consumer run --help` documents, and the other services must agree
// with those values (topics created, broker listener, Prometheus target).

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string    `yaml:"image"`
	Build       yaml.Node `yaml:"build"`
	Environment yaml.Node `yaml:"environment"` // a map or a list of NAME=VALUE
	Ports       []string  `yaml:"ports"`
	Entrypoint  yaml.Node `yaml:"entrypoint"`
	Command     yaml.Node `yaml:"command"`
}

// env returns the service's environment whichever form it is written in.
func (s composeService) env(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	switch s.Environment.Kind {
	case 0:
	case yaml.MappingNode:
		if err := s.Environment.Decode(&out); err != nil {
			t.Fatalf("environment: %v", err)
		}
	case yaml.SequenceNode:
		var list []string
		if err := s.Environment.Decode(&list); err != nil {
			t.Fatalf("environment: %v", err)
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			out[k] = v
		}
	default:
		t.Fatalf("environment is neither a map nor a list")
	}
	return out
}

// words returns a string or list field (entrypoint, command) as one string.
func words(t *testing.T, n yaml.Node) string {
	t.Helper()
	switch n.Kind {
	case 0:
		return ""
	case yaml.ScalarNode:
		return n.Value
	case yaml.SequenceNode:
		var list []string
		if err := n.Decode(&list); err != nil {
			t.Fatalf("decode %v: %v", n.Tag, err)
		}
		return strings.Join(list, " ")
	}
	t.Fatalf("unexpected YAML node kind %v", n.Kind)
	return ""
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// runHelp builds cmd/velocity-consumer and returns the output of `run --help`.
func runHelp(t *testing.T, root string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "velocity-consumer")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/velocity-consumer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/velocity-consumer: %v\n%s", err, out)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The help goes to stdout with exit status 0 (TestHelpGoesToStdout holds that);
	// both streams are read so that the text decides here, not where it went.
	out, err := exec.CommandContext(ctx, bin, "run", "--help").CombinedOutput()
	if err != nil {
		t.Logf("velocity-consumer run --help: %v", err)
	}
	return string(out)
}

var (
	envNameRE = regexp.MustCompile(`\bVELOCITY_[A-Z0-9_]*[A-Z0-9]\b`)
	portRE    = regexp.MustCompile(`^(?:[0-9.]+:)?(?:(\d+):)?(\d+)(?:/tcp)?$`)
)

// helpDefault returns the default that the help text gives the flag, or "".
func helpDefault(help, flag string) string {
	re := regexp.MustCompile(`(?m)^\s*--` + regexp.QuoteMeta(flag) + `\b.*\n(?:\s{4,}.*\n)*?.*\(default "([^"]*)"\)`)
	if m := re.FindStringSubmatch(help); m != nil {
		return m[1]
	}
	return ""
}

func TestComposeMatchesBinary(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}

	help := runHelp(t, root)
	accepted := map[string]bool{}
	for _, name := range envNameRE.FindAllString(help, -1) {
		accepted[name] = true
	}
	if len(accepted) == 0 {
		t.Fatalf("velocity-consumer run --help names no VELOCITY_* environment variables; it must list the ones it reads:\n%s", help)
	}

	// The consumer is the service built from this repository.
	var name string
	for n, s := range cf.Services {
		if s.Build.Kind != 0 {
			if name != "" {
				t.Fatalf("two services are built from the repository: %s and %s", name, n)
			}
			name = n
		}
	}
	if name == "" {
		t.Fatal("no service in docker-compose.yml has build: (the consumer)")
	}
	consumer := cf.Services[name]
	env := consumer.env(t)
	if len(env) == 0 {
		t.Fatalf("service %s sets no environment: it is wired by VELOCITY_* variables", name)
	}
	for k := range env {
		if !accepted[k] {
			t.Errorf("service %s sets %s, which `velocity-consumer run --help` does not list", name, k)
		}
	}
	setting := func(env map[string]string, varName, flag string) string {
		if v, ok := env[varName]; ok {
			return v
		}
		v := helpDefault(help, flag)
		if v == "" {
			t.Fatalf("%s is not set in docker-compose.yml and --help gives --%s no default", varName, flag)
		}
		return v
	}

	// Ports: the consumer publishes its metrics port and nothing else.
	metricsAddr := setting(env, "VELOCITY_METRICS_ADDR", "metrics-addr")
	_, metricsPort, err := net.SplitHostPort(metricsAddr)
	if err != nil || metricsPort == "" {
		t.Fatalf("VELOCITY_METRICS_ADDR %q: want host:port or :port", metricsAddr)
	}
	if len(consumer.Ports) == 0 {
		t.Errorf("service %s publishes no port; its metrics are on %s", name, metricsPort)
	}
	for _, p := range consumer.Ports {
		m := portRE.FindStringSubmatch(p)
		if m == nil {
			t.Errorf("service %s: cannot read port mapping %q", name, p)
			continue
		}
		if m[2] != metricsPort {
			t.Errorf("service %s publishes container port %s, but the binary listens on %s (VELOCITY_METRICS_ADDR %q)", name, m[2], metricsPort, metricsAddr)
		}
	}

	// Prometheus scrapes the consumer by service name and metrics port.
	prom, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var pc struct {
		ScrapeConfigs []struct {
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(prom, &pc); err != nil {
		t.Fatalf("deploy/prometheus.yml: %v", err)
	}
	want := net.JoinHostPort(name, metricsPort)
	var targets []string
	for _, sc := range pc.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	if !slices.Contains(targets, want) {
		t.Errorf("deploy/prometheus.yml scrapes %v, not the consumer at %s", targets, want)
	}
	if p, ok := cf.Services["prometheus"]; !ok || !strings.HasPrefix(p.Image, "prom/prometheus:") {
		t.Errorf("docker-compose.yml has no prometheus service running prom/prometheus")
	}

	// The broker: VELOCITY_BROKERS names a Kafka 4 service on one of its listeners.
	brokers := setting(env, "VELOCITY_BROKERS", "brokers")
	for _, b := range strings.Split(brokers, ",") {
		host, port, err := net.SplitHostPort(strings.TrimSpace(b))
		if err != nil {
			t.Errorf("VELOCITY_BROKERS entry %q: %v", b, err)
			continue
		}
		k, ok := cf.Services[host]
		if !ok {
			t.Errorf("VELOCITY_BROKERS names %s, which is not a service in docker-compose.yml", host)
			continue
		}
		if !strings.HasPrefix(k.Image, "apache/kafka:4.") {
			t.Errorf("service %s runs %q, want apache/kafka:4.x", host, k.Image)
		}
		kenv := k.env(t)
		if !strings.Contains(kenv["KAFKA_ADVERTISED_LISTENERS"], "//"+host+":"+port) {
			t.Errorf("VELOCITY_BROKERS %s: service %s does not advertise %s:%s (KAFKA_ADVERTISED_LISTENERS %q)",
				brokers, host, host, port, kenv["KAFKA_ADVERTISED_LISTENERS"])
		}
		if !strings.Contains(kenv["KAFKA_LISTENERS"], ":"+port) {
			t.Errorf("service %s does not listen on %s (KAFKA_LISTENERS %q)", host, port, kenv["KAFKA_LISTENERS"])
		}
		if !strings.Contains(kenv["KAFKA_PROCESS_ROLES"], "controller") {
			t.Errorf("service %s is not a KRaft combined broker+controller (KAFKA_PROCESS_ROLES %q)", host, kenv["KAFKA_PROCESS_ROLES"])
		}
	}

	// Topics: a one-shot service creates the consumer's topics before it starts.
	var creates string
	for n, s := range cf.Services {
		if cmd := words(t, s.Entrypoint) + " " + words(t, s.Command); strings.Contains(cmd, "kafka-topics.sh") {
			creates += cmd
			dep := consumerDependsOn(t, raw, name, n)
			if dep != "service_completed_successfully" {
				t.Errorf("service %s must wait for %s with condition service_completed_successfully, has %q", name, n, dep)
			}
		}
	}
	if creates == "" {
		t.Fatal("no service in docker-compose.yml creates topics with kafka-topics.sh")
	}
	for _, v := range []struct{ env, flag string }{
		{"VELOCITY_INPUT_TOPIC", "input-topic"},
		{"VELOCITY_OUTPUT_TOPIC", "output-topic"},
		{"VELOCITY_DLQ_TOPIC", "dlq-topic"},
	} {
		topic := setting(env, v.env, v.flag)
		if !regexp.MustCompile(`(?:^|[\s"'])` + regexp.QuoteMeta(topic) + `(?:$|[\s"'])`).MatchString(creates) {
			t.Errorf("topic %s (%s) is not created by the topic-creation service", topic, v.env)
		}
	}
}

// consumerDependsOn returns the condition under which service waits for dep, or "".
func consumerDependsOn(t *testing.T, raw []byte, service, dep string) string {
	t.Helper()
	var f struct {
		Services map[string]struct {
			DependsOn yaml.Node `yaml:"depends_on"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	n := f.Services[service].DependsOn
	if n.Kind != yaml.MappingNode {
		return ""
	}
	var m map[string]struct {
		Condition string `yaml:"condition"`
	}
	if err := n.Decode(&m); err != nil {
		t.Fatalf("depends_on of %s: %v", service, err)
	}
	return m[dep].Condition
}

// TestDockerfile checks what the image promises: a static build on golang:1.26 and a
// final stage that runs as a non-root user.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]string // instructions per stage
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(strings.ToUpper(line), "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], line)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stage(s), want a multi-stage build", len(stages))
	}
	if !strings.HasPrefix(stages[0][0], "FROM golang:1.26") {
		t.Errorf("build stage %q, want FROM golang:1.26", stages[0][0])
	}
	if !strings.Contains(string(raw), "CGO_ENABLED=0") {
		t.Error("Dockerfile does not build with CGO_ENABLED=0 (a static binary)")
	}
	final := stages[len(stages)-1]
	if base := final[0]; !strings.Contains(base, "distroless/static") && !strings.Contains(base, "scratch") {
		t.Errorf("final stage %q, want distroless static or scratch", base)
	}
	var user string
	for _, ins := range final {
		if f := strings.Fields(ins); strings.EqualFold(f[0], "USER") && len(f) > 1 {
			user = f[1]
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "root" || u == "0" {
		t.Errorf("final stage runs as %q, want a non-root USER", user)
	}
}
