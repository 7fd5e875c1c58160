//go:build integration

package recovery

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

// TestServiceRidesOutBrokerFaults: the live service keeps running through
// what a Kafka cluster does to its clients in production, here on a broker
// of the test's own:
//
//   - a crash and restart (SIGKILL, then the broker started again on its
//     data, after its log recovery): every connection drops, the group
//     coordinator and the transaction coordinator reload their state;
//   - a stall (SIGSTOP for longer than --session-timeout, then SIGCONT):
//     requests hang instead of failing.
//
// Both land while the input is produced. A default-mode instance (file
// store) and two exactly-once instances (kafka store, on the same broker)
// must ride them out without a fatal error and catch up; afterwards every
// input offset has at least one output (exactly one read_committed), each
// byte-identical to the outputs of a clean instance that consumed the same
// input after the faults.
func TestServiceRidesOutBrokerFaults(t *testing.T) {
	b := kafkatest.StartPrivateBroker(t)
	addr := b.Addr
	ctx := kafkatest.Context(t, 6*time.Minute)
	keep := map[string]string{"retention.ms": "-1"}
	input := kafkatest.CreateTopic(t, addr, recPartitions, keep)
	const n = 60_000
	recs := genStream(23, n)

	clean, alo, eos := faultScenarios(t, addr, input, nil)
	rideOutCrashAndStall(t, ctx, b, input, recs, clean, alo, eos)
}

// TestServiceRidesOutBrokerFaultsOverSASL: the same faults, with every instance
// a client of a managed cluster's kind: SASL_SSL, SCRAM-SHA-512, a CA of the
// test's own. Each reconnection there is a TLS handshake and a SASL exchange,
// and a connection the restarting broker drops during them must read as the
// outage it is, not as credentials refused.
func TestServiceRidesOutBrokerFaultsOverSASL(t *testing.T) {
	b := kafkatest.StartSecureBroker(t)
	ctx := kafkatest.Context(t, 6*time.Minute)
	input := kafkatest.CreateTopic(t, b.Addr, recPartitions, map[string]string{"retention.ms": "-1"})
	pw := filepath.Join(t.TempDir(), "sasl-password")
	if err := os.WriteFile(pw, []byte(b.ScramPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	clean, alo, eos := faultScenarios(t, b.Addr, input, &via{addr: b.SASLAddr, flags: []string{
		"--tls-ca-file", b.CAFile, "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", b.ScramUser, "--sasl-password-file", pw}})
	rideOutCrashAndStall(t, ctx, b.PrivateBroker, input, genStream(29, 30_000), clean, alo, eos)
	for _, in := range append(append([]*instance(nil), alo.instances...), eos.instances...) {
		if log, _ := os.ReadFile(in.logs); !bytes.Contains(log, []byte("SASL_SSL (SCRAM-SHA-512")) {
			t.Errorf("%s: the log does not say the instance connected over SASL_SSL:\n%s", in.logs, tailLog(in.logs, 10))
		}
	}
}

// rideOutCrashAndStall starts the faulted groups, produces recs into input
// over 40 s (through b's PLAINTEXT listener), kills the broker a quarter of
// the way and restarts it 2 s later, freezes it past --session-timeout two
// thirds of the way, and holds the groups to the clean one (checkRodeOut).
func rideOutCrashAndStall(t *testing.T, ctx context.Context, b *kafkatest.PrivateBroker, input string, recs []*kgo.Record, clean, alo, eos *scenario) {
	t.Helper()
	addr, n := b.Addr, len(recs)
	for _, in := range append(append([]*instance(nil), alo.instances...), eos.instances...) {
		in.start()
	}

	var progress atomic.Int64
	produced := make(chan error, 1)
	go func() { produced <- produce(ctx, addr, input, recs, 40*time.Second, &progress) }()

	waitProgress(ctx, &progress, n/4)
	t0 := time.Now()
	b.Kill(t)
	time.Sleep(2 * time.Second)
	b.Restart(t)
	t.Logf("broker killed at %d of %d records produced and restarted in %s", n/4, n, time.Since(t0).Round(time.Millisecond))

	waitProgress(ctx, &progress, 2*n/3)
	b.Freeze(t)
	time.Sleep(10 * time.Second) // --session-timeout is 6s
	b.Thaw(t)
	t.Logf("broker frozen for 10s at %d of %d records produced", 2*n/3, n)

	if err := <-produced; err != nil {
		t.Fatalf("produce the input: %v", err)
	}
	checkRodeOut(t, ctx, addr, input, clean, alo, eos)
}

// via is how the instances reach the brokers when not as the test does: another
// listener, and the flags of its security.
type via struct {
	addr  string
	flags []string
}

// faultScenarios are a broker-fault test's three groups on input, none started: clean
// (default mode, file store; checkRodeOut starts it after the faults), alo (default
// mode, file store) and eos (two exactly-once instances, kafka store on the same
// cluster). Topics are created through addr; the instances connect through v, if
// given, else addr too. Every instance is killed when t ends.
func faultScenarios(t *testing.T, addr, input string, v *via) (clean, alo, eos *scenario) {
	t.Helper()
	bin := buildBinary(t)
	keep := map[string]string{"retention.ms": "-1"}
	mk := func(name string, eos bool, store string, count int) *scenario {
		sc := &scenario{name: name, eos: eos, group: kafkatest.Group(t), store: store,
			out: kafkatest.CreateTopic(t, addr, recPartitions, keep), dlq: kafkatest.CreateTopic(t, addr, 1, keep)}
		args := sc.args(addr, input)
		if v != nil {
			args = append(sc.args(v.addr, input), v.flags...)
		}
		for i := range count {
			sc.instances = append(sc.instances, newInstance(t, bin, fmt.Sprintf("%s-%d", sc.name, i), args))
		}
		return sc
	}
	clean = mk("clean", false, "file://"+t.TempDir(), 1)
	alo = mk("at-least-once", false, "file://"+t.TempDir(), 1)
	eos = mk("exactly-once", true, "kafka://"+kafkatest.Name(t, "snap"), 2)
	t.Cleanup(func() {
		for _, sc := range []*scenario{clean, alo, eos} {
			for _, in := range sc.instances {
				in.kill(syscall.SIGKILL)
			}
		}
	})
	return clean, alo, eos
}

// checkRodeOut ends a broker-fault test once the input is produced: it starts the clean
// instance, waits until every group committed the end of the input, stops them all, and
// holds the faulted groups (alo, eos) to the clean one: no instance stopped or logged a
// fatal error, every input offset has an output (exactly one read_committed under eos),
// each byte-identical to the clean one's.
func checkRodeOut(t *testing.T, ctx context.Context, addr, input string, clean, alo, eos *scenario) {
	t.Helper()
	adm := kafkatest.Admin(t, addr)
	faulted := append(append([]*instance(nil), alo.instances...), eos.instances...)
	all := []*scenario{clean, alo, eos}
	ends := endOffsets(t, ctx, adm, input)
	clean.instances[0].start()
	for _, sc := range all {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		err := waitCommitted(wctx, adm, sc.group, input, ends)
		cancel()
		if err != nil {
			t.Fatalf("%s: group %s did not commit the end of the input: %v; end of its first instance's log:\n%s",
				sc.name, sc.group, err, tailLog(sc.instances[0].logs, 25))
		}
	}
	for _, in := range faulted {
		if !in.running() {
			t.Errorf("%s stopped during the faults; end of its log:\n%s", in.logs, tailLog(in.logs, 25))
		}
	}
	for _, sc := range all {
		for _, in := range sc.instances {
			in.kill(syscall.SIGTERM)
		}
	}
	for _, in := range faulted {
		log, _ := os.ReadFile(in.logs)
		if bytes.Contains(log, []byte("stopping: fatal error")) {
			t.Errorf("%s logged a fatal error:\n%s", in.logs, tailLog(in.logs, 25))
		}
	}

	want := readOutputs(t, ctx, addr, clean, false, ends)
	checkOutputs(t, ends, want, want, true)
	for _, sc := range []*scenario{alo, eos} {
		t.Run(sc.name, func(t *testing.T) {
			got := readOutputs(t, ctx, addr, sc, sc.eos, ends)
			checkOutputs(t, ends, got, want, sc.eos)
			checkFinalState(t, got, want)
		})
	}
}
