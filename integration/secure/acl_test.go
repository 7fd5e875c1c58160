//go:build integration

package secure

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/kafkaconn"
)

// An aclEntry is one line of docs/acls.md: an operation on a resource, granted to
// the service's principal. Read and Write imply Describe on their resource (Kafka's
// rule), so Describe never appears.
type aclEntry struct {
	name    string // as the docs name it, e.g. "Read on topic <input>"
	kind    string // topic, group or txn-prefix
	res     string
	op      kadm.ACLOperation
	missing []string // substrings of the error the command must stop with without it
}

func (a aclEntry) builder(principal string) *kadm.ACLBuilder {
	b := kadm.NewACLs().Allow(principal).AllowHosts().Operations(a.op)
	switch a.kind {
	case "topic":
		b = b.Topics(a.res).ResourcePatternType(kadm.ACLPatternLiteral)
	case "group":
		b = b.Groups(a.res).ResourcePatternType(kadm.ACLPatternLiteral)
	case "txn-prefix":
		b = b.TransactionalIDs(a.res).ResourcePatternType(kadm.ACLPatternPrefixed)
	default:
		panic("aclEntry kind " + a.kind)
	}
	return b
}

// aclPending lists the cases, by subtest name, where the product falls short of the
// rule today: the error does not name what to grant, the command retries an
// authorization error before it stops, or it does not stop at all. Each entry goes
// when its fix lands (the case then fails, saying so), and the case is then held to
// its aclEntry.missing and to aclFailBound like the others.
var aclPending = map[string]struct {
	why   string
	now   []string // what the error (or with works, the log) says today
	works bool     // the command does not stop at all today
}{}

// pendingBound bounds a pending case and a run's wait for its outputs: as long as
// the service retries a takeover (2 minutes), with some slack.
const pendingBound = 2*time.Minute + 30*time.Second

// aclFailBound is how long a command without one of its ACLs may take to stop.
// Authorization errors are final; a command that retries them is a bug: it would
// sit unready (or worse, ready) doing nothing.
const aclFailBound = 60 * time.Second

// TestACL runs the built binary on a broker with KRaft's StandardAuthorizer, as a
// principal holding exactly the ACLs that docs/acls.md lists for each command, then
// without each of them in turn: the command must work with the list, and stop with
// an error naming what to grant (and exit non-zero) within aclFailBound without any
// single entry. Every case gets a SCRAM user and topics of its own, so all cases run
// in parallel on the one broker (about 20 processes of the light binary).
func TestACL(t *testing.T) {
	b := kafkatest.StartSecureBroker(t, kafkatest.WithAuthorizer())
	bin := buildBinary(t)
	adm := kadm.NewClient(kafkatest.Client(t, b.Addr))

	// Without any ACL, the authorizer refuses even metadata: the test's premise.
	t.Run("authorizer on", func(t *testing.T) {
		user := "acl-none"
		pw := b.AddScramUser(t, user)
		topic := kafkatest.CreateTopic(t, b.Addr, 1, nil)
		cl := kafkatest.Client(t, b.SASLAddr, scramOpts(t, b, user, pw)...)
		md, err := kadm.NewClient(cl).Metadata(kafkatest.Context(t, 20*time.Second), topic)
		if err == nil {
			err = md.Topics[topic].Err
		}
		if !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Fatalf("a principal without ACLs described topic %s (%v): the authorizer is not on", topic, err)
		}
	})

	type mode struct {
		name string
		// acls is what docs/acls.md lists for this mode, given the case's names.
		acls func(n names) []aclEntry
		// removals: which entries to take away one at a time (nil: all of acls).
		removals []string
		// prepare runs as the super user before the command (create topics).
		prepare func(t *testing.T, n *names)
		run     func(t *testing.T, n names, conn []string) (out string, err error)
	}
	modes := []mode{
		{name: "run, file store", acls: runACLs, run: func(t *testing.T, n names, conn []string) (string, error) {
			return runLive(t, b, bin, n, conn, "--checkpoint-store", "file://"+t.TempDir())
		}},
		// The kafka store runs twice: the second start loads the snapshots the
		// first one saved, which is where Read on the snapshot topic is needed.
		{name: "run, kafka store creating its topic", acls: func(n names) []aclEntry {
			return append(runACLs(n), kafkaStoreACLs(n, true)...)
		}, removals: []string{"Read on topic <snapshots>", "Write on topic <snapshots>", "Create on topic <snapshots>"},
			run: func(t *testing.T, n names, conn []string) (string, error) {
				return runLiveTwice(t, b, bin, n, conn, "--checkpoint-store", "kafka")
			}},
		// On a snapshot topic that exists, Create is not needed.
		{name: "run, kafka store on an existing topic", acls: func(n names) []aclEntry {
			return append(runACLs(n), kafkaStoreACLs(n, false)...)
		}, removals: []string{}, prepare: func(t *testing.T, n *names) {
			createNamed(t, b.Addr, n.snapshots, 9, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")})
		}, run: func(t *testing.T, n names, conn []string) (string, error) {
			return runLiveTwice(t, b, bin, n, conn, "--checkpoint-store", "kafka")
		}},
		// Output and dead-letter topics that do not exist yet: run creates them,
		// which takes Create on each (and only then).
		{name: "run, creating its output topics", acls: func(n names) []aclEntry {
			return append(runACLs(n), createACLs(n)...)
		}, removals: []string{"Create on topic <output>", "Create on topic <dlq>"}, prepare: func(t *testing.T, n *names) {
			n.output, n.dlq = kafkatest.Topic(t)+"-out", kafkatest.Topic(t)+"-dlq"
			deleteAfter(t, b.Addr, n.output, n.dlq)
		}, run: func(t *testing.T, n names, conn []string) (string, error) {
			return runLive(t, b, bin, n, conn, "--checkpoint-store", "file://"+t.TempDir())
		}},
		{name: "run --exactly-once", acls: func(n names) []aclEntry {
			return append(runACLs(n), eosACLs(n)...)
		}, removals: []string{"Write on transactional ids prefixed <txn-prefix>"},
			run: func(t *testing.T, n names, conn []string) (string, error) {
				return runLive(t, b, bin, n, conn, "--checkpoint-store", "file://"+t.TempDir(), "--exactly-once")
			}},
		{name: "replay to topics", acls: replayACLs, run: func(t *testing.T, n names, conn []string) (string, error) {
			return runReplay(t, b, bin, n, conn)
		}},
	}

	var users sync.Mutex
	userN := 0
	newUser := func(t *testing.T) (string, string) {
		users.Lock()
		userN++
		u := fmt.Sprintf("acl-user-%d", userN)
		users.Unlock()
		return u, b.AddScramUser(t, u)
	}
	setUp := func(t *testing.T, m mode) (names, []string) {
		n := newNames(t, b.Addr)
		if m.prepare != nil {
			m.prepare(t, &n)
		}
		produceInput(t, b.Addr, n.input)
		user, pw := newUser(t)
		n.principal = "User:" + user
		return n, connFlags(t, b, user, pw)
	}
	grant := func(t *testing.T, n names, acls []aclEntry) {
		ctx := kafkatest.Context(t, 30*time.Second)
		for _, a := range acls {
			res, err := adm.CreateACLs(ctx, a.builder(n.principal))
			if err == nil {
				for _, r := range res {
					err = errors.Join(err, r.Err)
				}
			}
			if err != nil {
				t.Fatalf("grant %s: %v", a.name, err)
			}
		}
		// ACLs reach the broker's authorizer through the metadata log: wait until
		// it shows them all to the super user's describe (same node, so in effect).
		waitACLs(t, adm, n.principal, len(acls))
	}

	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel() // every case has its own user and topics
			t.Run("with the documented ACLs", func(t *testing.T) {
				t.Parallel()
				n, conn := setUp(t, m)
				grant(t, n, m.acls(n))
				start := time.Now()
				out, err := m.run(t, n, conn)
				if err != nil {
					t.Fatalf("%s with exactly the documented ACLs: %v\n%s", m.name, err, out)
				}
				t.Logf("%s: worked in %v", m.name, time.Since(start).Round(time.Millisecond))
			})
			all := m.acls(newNamesFor("x"))
			for i, a := range all {
				if m.removals != nil && !contains(m.removals, a.name) {
					continue
				}
				t.Run("without "+a.name, func(t *testing.T) {
					t.Parallel()
					n, conn := setUp(t, m)
					acls := m.acls(n)
					grant(t, n, append(acls[:i:i], acls[i+1:]...))
					pend, pending := aclPending[strings.TrimPrefix(t.Name(), "TestACL/")]
					start := time.Now()
					out, err := m.run(t, n, conn)
					took := time.Since(start)
					if pending && pend.works {
						// Works today where it should stop: hold it to how it
						// degrades now, so that a fix shows up as this failing.
						t.Logf("PENDING FIX: %s", pend.why)
						if err != nil {
							t.Fatalf("without %s: %v (the pending entry says it still works; update aclPending and docs/acls.md)\n%s", a.name, err, out)
						}
						for _, w := range pend.now {
							if !strings.Contains(out, w) {
								t.Errorf("without %s the command worked but its log does not say %q", a.name, w)
							}
						}
						return
					}
					if err == nil {
						t.Fatalf("worked without %s: the documented list has an entry it does not need\n%s", a.name, out)
					}
					var ee *exec.ExitError
					if !errors.As(err, &ee) {
						t.Fatalf("without %s: %v\n%s", a.name, err, out)
					}
					last := lastError(out)
					want, bound := acls[i].missing, aclFailBound
					if pending {
						// A shortfall the product has today (see aclPending): hold
						// it to what it does now, so that it cannot get worse.
						want, bound = pend.now, pendingBound
						t.Logf("PENDING FIX: %s", pend.why)
					}
					for _, w := range want {
						if !strings.Contains(last, w) {
							t.Errorf("without %s the command stopped with\n\t%s\nwhich does not say %q", a.name, last, w)
						}
					}
					if took > bound {
						t.Errorf("without %s the command took %v to stop; want at most %v", a.name, took, bound)
					}
					t.Logf("without %s: exit %d after %v: %s", a.name, ee.ExitCode(), took.Round(time.Millisecond), last)
				})
			}
		})
	}
}

// names are one case's resources.
type names struct {
	principal                string
	input, output, dlq       string
	group, snapshots, prefix string
}

func newNamesFor(s string) names {
	return names{input: s + "-in", output: s + "-out", dlq: s + "-dlq", group: s + "-g",
		snapshots: checkpoint.DefaultKafkaTopic(s + "-g"), prefix: "velocity-" + s + "-g-" + s + "-in-"}
}

// newNames creates the case's topics (two input partitions, so that a run has two
// workers) as the super user.
func newNames(t *testing.T, addr string) names {
	n := names{input: kafkatest.CreateTopic(t, addr, 2, nil), output: kafkatest.CreateTopic(t, addr, 2, nil),
		dlq: kafkatest.CreateTopic(t, addr, 2, nil), group: kafkatest.Group(t)}
	n.snapshots = checkpoint.DefaultKafkaTopic(n.group)
	n.prefix = "velocity-" + n.group + "-" + n.input + "-"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(kafkatest.Client(t, addr)).DeleteTopics(ctx, n.snapshots)
	})
	return n
}

// The documented lists (docs/acls.md). Keep them in the same order as the page.
func runACLs(n names) []aclEntry {
	return []aclEntry{
		{name: "Read on topic <input>", kind: "topic", res: n.input, op: kadm.OpRead,
			missing: []string{"--input-topic", n.input, "TOPIC_AUTHORIZATION_FAILED", "Read"}},
		{name: "Read on group <group>", kind: "group", res: n.group, op: kadm.OpRead,
			missing: []string{"--group", n.group, "GROUP_AUTHORIZATION_FAILED", "Read"}},
		{name: "Write on topic <output>", kind: "topic", res: n.output, op: kadm.OpWrite,
			missing: []string{"--output-topic", n.output, "TOPIC_AUTHORIZATION_FAILED", "Write"}},
		{name: "Write on topic <dlq>", kind: "topic", res: n.dlq, op: kadm.OpWrite,
			missing: []string{"--dlq-topic", n.dlq, "TOPIC_AUTHORIZATION_FAILED", "Write"}},
	}
}

func createACLs(n names) []aclEntry {
	return []aclEntry{
		{name: "Create on topic <output>", kind: "topic", res: n.output, op: kadm.OpCreate,
			missing: []string{"--output-topic", n.output, "does not exist", "Create"}},
		{name: "Create on topic <dlq>", kind: "topic", res: n.dlq, op: kadm.OpCreate,
			missing: []string{"--dlq-topic", n.dlq, "does not exist", "Create"}},
	}
}

func kafkaStoreACLs(n names, create bool) []aclEntry {
	acls := []aclEntry{
		{name: "Read on topic <snapshots>", kind: "topic", res: n.snapshots, op: kadm.OpRead,
			missing: []string{n.snapshots, "TOPIC_AUTHORIZATION_FAILED"}},
		{name: "Write on topic <snapshots>", kind: "topic", res: n.snapshots, op: kadm.OpWrite,
			missing: []string{n.snapshots, "TOPIC_AUTHORIZATION_FAILED"}},
	}
	if create {
		acls = append(acls, aclEntry{name: "Create on topic <snapshots>", kind: "topic", res: n.snapshots, op: kadm.OpCreate,
			missing: []string{"--checkpoint-store", n.snapshots, "TOPIC_AUTHORIZATION_FAILED", "Create"}})
	}
	return acls
}

func eosACLs(n names) []aclEntry {
	return []aclEntry{
		{name: "Write on transactional ids prefixed <txn-prefix>", kind: "txn-prefix", res: n.prefix, op: kadm.OpWrite,
			missing: []string{"--exactly-once", n.prefix, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "Write"}},
	}
}

func replayACLs(n names) []aclEntry {
	return []aclEntry{
		{name: "Read on topic <input>", kind: "topic", res: n.input, op: kadm.OpRead,
			missing: []string{n.input, "TOPIC_AUTHORIZATION_FAILED"}},
		{name: "Write on topic <output>", kind: "topic", res: n.output, op: kadm.OpWrite,
			missing: []string{n.output, "TOPIC_AUTHORIZATION_FAILED", "Write"}},
		{name: "Write on topic <dlq>", kind: "topic", res: n.dlq, op: kadm.OpWrite,
			missing: []string{n.dlq, "TOPIC_AUTHORIZATION_FAILED", "Write"}},
	}
}

// inputRecords is how many records produceInput writes: 6 transactions, of which
// 2 per partition-key are good, and one undecodable record (a dead letter).
const inputGood, inputDead = 6, 1

func produceInput(t *testing.T, addr, topic string) {
	now := time.Now().UnixMilli()
	var recs []*kgo.Record
	for i := range inputGood {
		tx := codec.Transaction{EventID: fmt.Sprintf("acl-%d", i), EntityID: fmt.Sprintf("card-%d", i%3), AmountMinor: 100, Currency: "EUR", EventTime: now + int64(i)}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)})
	}
	recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("card-0"), Value: []byte{0xff, 0xff}})
	if err := kafkatest.Produce(kafkatest.Context(t, 30*time.Second), kafkatest.Client(t, addr), recs...); err != nil {
		t.Fatal(err)
	}
}

// countOutputs reads the output and dead-letter topics (read_committed) as the
// super user until want records are there or d passes.
func countOutputs(ctx context.Context, t *testing.T, addr string, n names, want int, d time.Duration) int {
	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(n.output, n.dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	got := 0
	end := time.Now().Add(d)
	for got < want && time.Now().Before(end) && ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		got += cl.PollFetches(pctx).NumRecords()
		cancel()
	}
	return got
}

func connFlags(t *testing.T, b *kafkatest.SecureBroker, user, pw string) []string {
	f := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(f, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--brokers", b.SASLAddr, "--tls-ca-file", b.CAFile, "--sasl-mechanism", "SCRAM-SHA-512",
		"--sasl-username", user, "--sasl-password-file", f}
}

// runLive starts `velocity-consumer run`; with its ACLs it must publish every
// output and stop cleanly on SIGTERM (which checkpoints: snapshot and commit), and
// an error return is the command's own exit.
func runLive(t *testing.T, b *kafkatest.SecureBroker, bin string, n names, conn []string, extra ...string) (string, error) {
	return runLiveFor(t, b, bin, n, inputGood+inputDead, conn, extra...)
}

// runLiveTwice is runLive, then more input and a second run that restores the
// state the first one checkpointed.
func runLiveTwice(t *testing.T, b *kafkatest.SecureBroker, bin string, n names, conn []string, extra ...string) (string, error) {
	out, err := runLiveFor(t, b, bin, n, inputGood+inputDead, conn, extra...)
	if err != nil {
		return out, err
	}
	produceInput(t, b.Addr, n.input)
	out2, err := runLiveFor(t, b, bin, n, 2*(inputGood+inputDead), conn, extra...)
	return out + out2, err
}

func runLiveFor(t *testing.T, b *kafkatest.SecureBroker, bin string, n names, want int, conn []string, extra ...string) (string, error) {
	args := append([]string{"run"}, conn...)
	args = append(args, "--input-topic", n.input, "--output-topic", n.output, "--dlq-topic", n.dlq, "--group", n.group,
		"--idle-timeout", "200ms", "--checkpoint-interval", "1s", "--session-timeout", "6s", "--metrics-addr", "", "--log-level", "warn")
	args = append(args, extra...)
	cmd := exec.Command(bin, args...)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	counted := make(chan int, 1)
	go func() { counted <- countOutputs(ctx, t, b.Addr, n, want, pendingBound+10*time.Second) }()
	select {
	case err := <-done:
		return logs.String(), orExit(err)
	case got := <-counted:
		if got < want {
			_ = cmd.Process.Kill()
			return logs.String(), fmt.Errorf("%d of %d outputs after %v, and still running: a silent retry loop?", got, want, pendingBound+10*time.Second)
		}
	}
	// Let one checkpoint (snapshot, commit) pass, then stop: the shutdown checkpoint
	// must work too.
	time.Sleep(1500 * time.Millisecond)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		return logs.String(), err
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return logs.String(), errors.New("did not stop within 30s of SIGTERM")
	}
}

// runReplay replays the input topic to the output and dead-letter topics.
func runReplay(t *testing.T, b *kafkatest.SecureBroker, bin string, n names, conn []string) (string, error) {
	args := append([]string{"replay"}, conn...)
	args = append(args, "--input-topic", n.input, "--output", "topic:"+n.output, "--dlq", "topic:"+n.dlq, "--quiet", "--log-level", "warn")
	ctx, cancel := context.WithTimeout(context.Background(), aclFailBound)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("replay did not finish within %v: a silent retry loop?", aclFailBound)
	}
	if err != nil {
		return string(out), err
	}
	if got := countOutputs(kafkatest.Context(t, 40*time.Second), t, b.Addr, n, inputGood+inputDead, 30*time.Second); got != inputGood+inputDead {
		return string(out), fmt.Errorf("replay exited 0 but wrote %d of %d outputs", got, inputGood+inputDead)
	}
	return string(out), nil
}

// orExit is err for a command that exited by itself before doing its work: always a
// failure, nil included (a run that exits 0 unasked published nothing).
func orExit(err error) error {
	if err == nil {
		return errors.New("exited 0 before publishing its outputs")
	}
	return err
}

// lastError is the command's final error line ("velocity-consumer run: ..."), or the
// whole output if it has none.
func lastError(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "velocity-consumer ") {
			return lines[i]
		}
	}
	return out
}

func waitACLs(t *testing.T, adm *kadm.Client, principal string, want int) {
	ctx := kafkatest.Context(t, 30*time.Second)
	for {
		res, err := adm.DescribeACLs(ctx, kadm.NewACLs().Allow(principal).AnyResource().ResourcePatternType(kadm.ACLPatternAny).
			Operations(kadm.OpAny).AllowHosts())
		n := 0
		if err == nil {
			for _, r := range res {
				n += len(r.Described)
			}
		}
		if n >= want {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d ACLs of %s visible after 30s: %v", n, want, principal, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deleteAfter deletes topics a command under test creates, when t ends.
func deleteAfter(t *testing.T, addr string, topics ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(kafkatest.Client(t, addr)).DeleteTopics(ctx, topics...)
	})
}

func createNamed(t *testing.T, addr, topic string, partitions int32, configs map[string]*string) {
	resp, err := kadm.NewClient(kafkatest.Client(t, addr)).CreateTopic(kafkatest.Context(t, 30*time.Second), partitions, -1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create %s: %v", topic, err)
	}
}

func scramOpts(t *testing.T, b *kafkatest.SecureBroker, user, pw string) []kgo.Opt {
	return options(t, kafkaconn.Config{TLS: kafkaconn.TLS{CAFile: b.CAFile},
		SASL: kafkaconn.SASL{Mechanism: "SCRAM-SHA-512", Username: user, Password: kafkaconn.NewSecret(pw)}})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// buildBinary builds velocity-consumer into t's temporary directory.
func buildBinary(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "velocity-consumer")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../../cmd/velocity-consumer").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
