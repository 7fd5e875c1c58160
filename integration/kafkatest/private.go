package kafkatest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PrivateBroker is a broker that one test owns: started by scripts/kafka-local.sh on free
// ports with its state in the test's temporary directory, so the test may freeze or kill
// it without disturbing other tests.
type PrivateBroker struct {
	Addr  string // bootstrap address, 127.0.0.1:port
	pid   int
	state string
	run   func(ctx context.Context, arg string) ([]byte, error) // scripts/kafka-local.sh arg
}

// StartPrivateBroker starts a broker for t alone and stops it when t ends. It needs java
// and mvn (or the jar cache) like scripts/kafka-local.sh; without them it skips t, or fails
// it under VELOCITY_REQUIRE_KAFKA=1.
func StartPrivateBroker(t testing.TB) *PrivateBroker {
	t.Helper()
	return startPrivateBroker(t, 0, nil)
}

// startPrivateBroker starts a private broker with extra free ports for more listeners.
// extraEnv, if set, returns more environment for scripts/kafka-local.sh given the ports
// (client, controller, then the extra ones) and the broker's state directory.
func startPrivateBroker(t testing.TB, extraPorts int, extraEnv func(ports []int, state string) []string) *PrivateBroker {
	t.Helper()
	script := privateScript(t)
	ports := FreePorts(t, 2+extraPorts)
	b := newPrivateBroker(t, script, ports[0], ports[1], func(state string) []string {
		if extraEnv == nil {
			return nil
		}
		return extraEnv(ports, state)
	})
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	b.launch(t, ctx, "start")
	return b
}

// privateScript checks for the tools a private broker needs (skipping t without them,
// or failing it under VELOCITY_REQUIRE_KAFKA=1) and returns scripts/kafka-local.sh.
func privateScript(t testing.TB) string {
	t.Helper()
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("VELOCITY_REQUIRE_KAFKA") == "1" {
				t.Fatalf("kafkatest: a private broker needs %s on PATH", tool)
			}
			t.Skipf("kafkatest: skipping, a private broker needs %s on PATH", tool)
		}
	}
	script, err := findScript()
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return script
}

// newPrivateBroker prepares a broker on the given client and controller ports, with its
// state in a temporary directory of t, and stops it when t ends; it does not start it.
// extraEnv, if set, returns more environment for scripts/kafka-local.sh given that
// directory.
func newPrivateBroker(t testing.TB, script string, port, cport int, extraEnv func(state string) []string) *PrivateBroker {
	t.Helper()
	b := &PrivateBroker{state: t.TempDir()}
	environ := os.Environ()
	if extraEnv != nil {
		environ = append(environ, extraEnv(b.state)...)
	}
	env := append(environ,
		"KAFKA_PORT="+strconv.Itoa(port),
		"KAFKA_CONTROLLER_PORT="+strconv.Itoa(cport),
		"KAFKA_LOCAL_STATE="+b.state,
		"KAFKA_STOP_TIMEOUT=10",
		// If the test binary dies before its cleanup (a -timeout panic), so does the broker.
		"KAFKA_LOCAL_OWNER_PID="+strconv.Itoa(os.Getpid()),
	)
	b.run = func(ctx context.Context, arg string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, script, arg)
		cmd.Env = env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return out, fmt.Errorf("kafka-local.sh %s: %w\n%s", arg, err, stderr.String())
		}
		return out, nil
	}
	t.Cleanup(func() {
		if pid := b.pid; pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT) // a frozen broker cannot act on SIGTERM
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := b.run(ctx, "stop"); err != nil {
			t.Errorf("kafkatest: stop private broker: %v", err)
		}
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(b.state, "logs", "server.log")); err == nil {
				lines := strings.Split(strings.TrimSpace(string(log)), "\n")
				t.Logf("kafkatest: last lines of the private broker's log (%s):\n%s", b.state,
					strings.Join(lines[max(0, len(lines)-30):], "\n"))
			}
		}
	})
	return b
}

// launch runs scripts/kafka-local.sh start or restart and waits until the broker answers.
func (b *PrivateBroker) launch(t testing.TB, ctx context.Context, arg string) {
	t.Helper()
	if err := b.launchErr(ctx, arg); err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
}

// launchErr is launch for a goroutine other than the test's: it returns what went wrong.
func (b *PrivateBroker) launchErr(ctx context.Context, arg string) error {
	out, err := b.run(ctx, arg)
	if err != nil {
		return fmt.Errorf("%s private broker: %w", arg, err)
	}
	addr := lastLine(out)
	pid, err := os.ReadFile(filepath.Join(b.state, "kafka.pid"))
	if err != nil {
		return fmt.Errorf("private broker PID: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err != nil {
		return fmt.Errorf("private broker PID %q: %w", pid, err)
	}
	b.Addr, b.pid = addr, n
	if err := ping(b.Addr, pingTimeout); err != nil {
		return fmt.Errorf("private broker at %s: %w", b.Addr, err)
	}
	return nil
}

// Restart starts a killed (or stopped) broker again on the same ports and the data it
// left, as a broker restart in production: topics, committed offsets, transactions and
// group state survive, after the broker's own log recovery.
func (b *PrivateBroker) Restart(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	b.launch(t, ctx, "restart")
}

// Stop shuts the broker down cleanly (SIGTERM: a node of a cluster first hands its
// partitions' leadership to the others), waiting for it to exit, as an operator's
// rolling restart does; Restart starts it again.
func (b *PrivateBroker) Stop(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := b.run(ctx, "stop"); err != nil {
		t.Fatalf("kafkatest: stop broker %d: %v", b.pid, err)
	}
}

// Thaw resumes a broker stopped by Freeze.
func (b *PrivateBroker) Thaw(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(b.pid, syscall.SIGCONT); err != nil {
		t.Fatalf("kafkatest: thaw broker %d: %v", b.pid, err)
	}
}

// Freeze stops the broker process with SIGSTOP: its sockets stay open and nothing answers.
func (b *PrivateBroker) Freeze(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(b.pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("kafkatest: freeze broker %d: %v", b.pid, err)
	}
	// kill(2) only queues the signal: wait until every thread of the JVM has stopped, or a
	// request sent right after Freeze could still be served.
	deadline := time.Now().Add(10 * time.Second)
	for !allThreadsStopped(b.pid) {
		if time.Now().After(deadline) {
			t.Fatalf("kafkatest: broker %d not stopped 10s after SIGSTOP", b.pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// allThreadsStopped reports whether every thread of pid is in state T (stopped).
func allThreadsStopped(pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, f := range tasks {
		st, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// The state follows the parenthesised command name, which may itself hold spaces.
		rest := string(st[strings.LastIndexByte(string(st), ')')+1:])
		if f := strings.Fields(rest); len(f) == 0 || f[0] != "T" {
			return false
		}
	}
	return true
}

// Kill ends the broker process with SIGKILL, as a crash would.
func (b *PrivateBroker) Kill(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(b.pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kafkatest: kill broker %d: %v", b.pid, err)
	}
	// Wait for the process to be gone so that the next call sees a closed port.
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(b.pid, 0) == nil && time.Now().Before(deadline) {
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", b.pid)); err == nil && strings.Contains(string(st), ") Z ") {
			break // a zombie: dead, waiting for its parent (init) to reap it
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FreePorts returns n distinct ports that were free a moment ago on 127.0.0.1.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("kafkatest: find a free port: %v", err)
		}
		defer l.Close() // held until all n are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
