// Package kafkatest gives integration tests a real Apache Kafka broker, and names and
// topics of their own on it so that tests can run in parallel.
//
// Broker resolves an address once per test binary, in this order:
//
//  1. KAFKA_BROKERS, if set (comma-separated host:port list). It must answer.
//  2. A testcontainers-go container running apache/kafka (KRaft, one node), when a
//     Docker engine answers within a few seconds. KAFKA_IMAGE overrides the image.
//  3. scripts/kafka-local.sh start (a broker from Maven jars on 127.0.0.1:KAFKA_PORT,
//     default 9092), when java and mvn are on PATH.
//
// When none of these is available the test is skipped with one line saying why, unless
// VELOCITY_REQUIRE_KAFKA=1, where it fails. A broker that was found but does not answer
// always fails the test.
//
// Integration tests carry the build tag "integration", so `go test ./...` does not build
// them; run them with `go test -tags integration ./integration/...` or `make test`.
// An integration test binary should stop what it started:
//
//	func TestMain(m *testing.M) { kafkatest.Main(m) }
//
// This package is for tests only; it is not a Kafka client for the service.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Timeouts for finding and starting a broker. Starting the script's broker the first time
// includes fetching Kafka's jars with Maven; starting a container may include pulling it.
const (
	pingTimeout      = 30 * time.Second
	scriptTimeout    = 5 * time.Minute
	containerTimeout = 5 * time.Minute
	dockerProbe      = 3 * time.Second
	closeTimeout     = 15 * time.Second
)

// DefaultImage is the container image used when a Docker engine is available.
const DefaultImage = "apache/kafka:4.2.0"

var (
	once     sync.Once
	resolved struct {
		addr   string
		source string // where addr came from, for the log
		err    error  // set when no broker could be had
		skip   bool   // err means "none available", not "broken"
		stop   func() // stops what this binary started; nil if nothing
	}
)

// errUnavailable marks "no way to get a broker on this host" (skip) as opposed to a
// broker that was found or started but failed (fail).
var errUnavailable = errors.New("no Kafka broker available")

// Broker returns the bootstrap address of a real Kafka broker ("host:port", or a
// comma-separated list when it comes from KAFKA_BROKERS). It skips or fails the test
// when there is none; see the package doc for the order in which it looks.
func Broker(t testing.TB) string {
	t.Helper()
	once.Do(resolve)
	if resolved.err != nil {
		if resolved.skip && os.Getenv("VELOCITY_REQUIRE_KAFKA") != "1" {
			t.Skipf("kafkatest: skipping, %v (set KAFKA_BROKERS, or VELOCITY_REQUIRE_KAFKA=1 to fail instead)", resolved.err)
		}
		t.Fatalf("kafkatest: %v", resolved.err)
	}
	t.Logf("kafkatest: real Kafka broker at %s (%s)", resolved.addr, resolved.source)
	return resolved.addr
}

// Seeds splits an address from Broker into seed brokers for kgo.SeedBrokers.
func Seeds(addr string) []string {
	var out []string
	for _, s := range strings.Split(addr, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Main runs an integration test binary's tests, then stops the broker or container that
// Broker started for it (a broker that was already running is left alone), and exits.
func Main(m *testing.M) {
	code := m.Run()
	if resolved.stop != nil {
		resolved.stop()
	}
	os.Exit(code)
}

func resolve() {
	r := &resolved
	if v := strings.TrimSpace(os.Getenv("KAFKA_BROKERS")); v != "" {
		r.addr, r.source = v, "from KAFKA_BROKERS"
		if err := ping(v, pingTimeout); err != nil {
			r.err = fmt.Errorf("KAFKA_BROKERS=%s does not answer: %w", v, err)
		}
		announce()
		return
	}

	var why []string
	if ok, reason := dockerAnswers(); ok {
		addr, stop, err := startContainer()
		if err == nil {
			r.addr, r.source, r.stop = addr, "testcontainers "+image(), stop
			announce()
			return
		}
		// Docker answered but the container did not come up (no image, no network):
		// say so and fall back to the local script.
		why = append(why, fmt.Sprintf("container: %v", err))
		fmt.Fprintf(os.Stderr, "kafkatest: Kafka container failed, trying scripts/kafka-local.sh: %v\n", err)
	} else {
		why = append(why, reason)
	}

	addr, stop, err := startScript()
	switch {
	case err == nil:
		r.addr, r.source, r.stop = addr, "scripts/kafka-local.sh", stop
	case errors.Is(err, errUnavailable):
		why = append(why, strings.TrimPrefix(err.Error(), errUnavailable.Error()+": "))
		r.err, r.skip = fmt.Errorf("%w: KAFKA_BROKERS unset; %s", errUnavailable, strings.Join(why, "; ")), true
	default:
		r.err = err
	}
	announce()
}

// announce prints, once per test binary, which broker the tests run against, so a CI log
// shows it even without -v.
func announce() {
	if resolved.err != nil {
		return
	}
	fmt.Fprintf(os.Stderr, "kafkatest: integration tests run against the real Kafka broker at %s (%s)\n",
		resolved.addr, resolved.source)
}

// ping checks that addr answers a metadata request within timeout, retrying while a
// broker that has just opened its port finishes starting.
func ping(addr string, timeout time.Duration) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(Seeds(addr)...), kgo.DialTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	for {
		m, err := adm.BrokerMetadata(ctx)
		if err == nil && len(m.Brokers) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New("metadata lists no brokers")
			}
			return fmt.Errorf("no answer within %v: %w", timeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// startScript runs scripts/kafka-local.sh start. It returns errUnavailable when java or
// mvn is missing or the script cannot be found, and a plain error when the start failed.
func startScript() (addr string, stop func(), err error) {
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", nil, fmt.Errorf("%w: no %s on PATH for scripts/kafka-local.sh", errUnavailable, tool)
		}
	}
	script, err := findScript()
	if err != nil {
		return "", nil, fmt.Errorf("%w: %v", errUnavailable, err)
	}
	// Already running (another test binary, or a developer's `make kafka-start`): use it
	// and leave it running.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, script, "status").Output(); err == nil {
		addr = lastLine(out)
		return addr, nil, ping(addr, pingTimeout)
	}

	ctx, cancel = context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, "start")
	cmd.Stderr = os.Stderr // progress ("fetching jars", "ready") and, on failure, the broker log
	out, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("scripts/kafka-local.sh start failed: %w", err)
	}
	addr = lastLine(out)
	stop = func() {
		if os.Getenv("KAFKA_LOCAL_KEEP") == "1" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, script, "stop")
		c.Stderr = os.Stderr
		_ = c.Run()
	}
	if err := ping(addr, pingTimeout); err != nil {
		stop()
		return "", nil, fmt.Errorf("broker from scripts/kafka-local.sh at %s: %w", addr, err)
	}
	return addr, stop, nil
}

// findScript looks for scripts/kafka-local.sh in the working directory (go test runs in
// the package directory) and its parents.
func findScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "scripts", "kafka-local.sh")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("scripts/kafka-local.sh not found above the working directory")
		}
		dir = parent
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

var (
	nameSeq   atomic.Uint64
	nameRun   = randomHex(4) // distinguishes test binaries sharing one broker
	nameClean = regexp.MustCompile(`[^a-zA-Z0-9-]+`)
)

// Name returns a name unique to this test, test binary and call, for a topic, a group
// or a transactional id: prefix-<test name>-<run>-<n>, legal as a Kafka topic name.
func Name(t testing.TB, prefix string) string {
	t.Helper()
	base := strings.Trim(nameClean.ReplaceAllString(t.Name(), "-"), "-")
	if len(base) > 120 {
		base = base[:120]
	}
	return fmt.Sprintf("%s-%s-%s-%d", prefix, base, nameRun, nameSeq.Add(1))
}

// Topic returns a unique topic name for t (it does not create the topic; see CreateTopic).
func Topic(t testing.TB) string { t.Helper(); return Name(t, "t") }

// Group returns a unique consumer group id for t.
func Group(t testing.TB) string { t.Helper(); return Name(t, "g") }

// TransactionalID returns a unique transactional id for t.
func TransactionalID(t testing.TB) string { t.Helper(); return Name(t, "tx") }

// Context returns a context that ends after d, or when the test ends, or shortly before
// the test binary's -timeout, whichever comes first. Every broker call in a test should
// use one, so that a broker that goes away fails the test instead of hanging it.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	deadline := time.Now().Add(d)
	if td, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := td.Deadline(); ok && end.Add(-5*time.Second).Before(deadline) {
			deadline = end.Add(-5 * time.Second)
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// Client returns a franz-go client seeded with addr, closed when the test ends. Its
// defaults bound every wait (dialing, retries, record delivery) so that a dead broker
// surfaces as an error; opts come after the defaults and override them.
func Client(t testing.TB, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	all := append([]kgo.Opt{
		kgo.SeedBrokers(Seeds(addr)...),
		kgo.DialTimeout(5 * time.Second),
		kgo.RetryTimeout(30 * time.Second),
		kgo.RecordDeliveryTimeout(30 * time.Second),
		kgo.TransactionTimeout(30 * time.Second),
	}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		t.Fatalf("kafkatest: new client for %s: %v", addr, err)
	}
	t.Cleanup(func() {
		// Close leaves the group and waits for the broker; a broker that stopped
		// answering must not hang the test's cleanup.
		done := make(chan struct{})
		go func() { cl.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(closeTimeout):
			t.Logf("kafkatest: client for %s did not close within %v (broker not answering); left behind", addr, closeTimeout)
		}
	})
	return cl
}

// Produce produces rs and waits until every record is acknowledged or ctx ends, and
// returns the first error. Use it instead of kgo.Client.ProduceSync in tests: an
// idempotent producer cannot fail a record whose request was sent but not answered, so
// against a frozen or dead broker ProduceSync waits for it forever, whatever its context.
// When ctx ends first, the records may still be written later.
func Produce(ctx context.Context, cl *kgo.Client, rs ...*kgo.Record) error {
	var (
		mu      sync.Mutex
		first   error
		pending = len(rs)
		done    = make(chan struct{})
	)
	for _, r := range rs {
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = fmt.Errorf("produce to %s: %w", r.Topic, err)
			}
			if pending--; pending == 0 {
				close(done)
			}
		})
	}
	if len(rs) == 0 {
		return nil
	}
	select {
	case <-done:
		mu.Lock()
		defer mu.Unlock()
		return first
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("produce: %d of %d records unacknowledged: %w", pending, len(rs), context.Cause(ctx))
	}
}

// Admin returns an admin client for addr, closed when the test ends.
func Admin(t testing.TB, addr string) *kadm.Client {
	t.Helper()
	return kadm.NewClient(Client(t, addr))
}

// CreateTopic creates a topic with a unique name, the given number of partitions, the
// broker's default replication factor and the given topic configs (nil for none), and
// returns its name. It waits until every partition has a leader, and deletes the topic
// when the test ends.
//
// Unless configs set retention.ms, the topic keeps every record (retention.ms=-1), on
// any broker: test streams carry fixed event times as their timestamps, weeks old by
// now, which time-based retention would delete at its next check, mid-test.
func CreateTopic(t testing.TB, addr string, partitions int32, configs map[string]string) string {
	t.Helper()
	adm := Admin(t, addr)
	name := Topic(t)
	cfg := map[string]*string{"retention.ms": kadm.StringPtr("-1")}
	for k, v := range configs {
		cfg[k] = kadm.StringPtr(v)
	}
	ctx := Context(t, 30*time.Second)
	if _, err := adm.CreateTopic(ctx, partitions, -1, cfg, name); err != nil {
		t.Fatalf("kafkatest: create topic %s (%d partitions) on %s: %v", name, partitions, addr, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopic(ctx, name); err != nil {
			t.Logf("kafkatest: delete topic %s: %v", name, err)
		}
	})
	var last error
	for {
		md, err := adm.Metadata(ctx, name)
		if err == nil {
			td, ok := md.Topics[name]
			switch {
			case !ok:
				err = errors.New("topic not in metadata")
			case td.Err != nil:
				err = td.Err
			case len(td.Partitions) != int(partitions) || !allLed(td):
				err = errors.New("not every partition has a leader")
			default:
				return name
			}
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("kafkatest: topic %s on %s not ready after creation: %v (last: %v)", name, addr, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func allLed(td kadm.TopicDetail) bool {
	for _, p := range td.Partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
