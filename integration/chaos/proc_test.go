//go:build integration

package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Every process is started from one goroutine locked to its OS thread for the
// life of the test binary, with Pdeathsig: if the test binary dies without its
// cleanup (a -timeout panic, a SIGKILL), the kernel kills the instances too,
// so none is left running. (Pdeathsig follows the thread that forked, which is
// why that thread must never exit.)
var spawnReqs = make(chan spawnReq)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func init() {
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
		for r := range spawnReqs {
			r.done <- r.cmd.Start()
		}
	}()
}

func spawn(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	spawnReqs <- spawnReq{cmd, done}
	return <-done
}

// instance is one slot of the group: a `velocity-consumer run` process that
// the schedule starts, signals and starts again. Its file store directory (in
// the file matrix cell) and its log file outlive its processes, as a
// machine's disk would.
type instance struct {
	name string
	bin  string
	args []string
	logs string
	tl   *timeline

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	frozen   bool
	expected bool // the exit about to come was asked for (SIGKILL, SIGTERM)
	starts   int
	selfExit []string // exits nobody asked for: "status at +t"
}

// start runs a new process of the instance. Its stdout and stderr (the JSON
// log) are appended to the instance's log file, after a marker line.
func (in *instance) start() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cmd != nil {
		return fmt.Errorf("%s: already running", in.name)
	}
	f, err := os.OpenFile(in.logs, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	in.starts++
	fmt.Fprintf(f, "=== chaos: %s start #%d at %s\n", in.name, in.starts, in.tl.now())
	cmd := exec.Command(in.bin, append([]string{"run"}, in.args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := spawn(cmd); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", in.name, err)
	}
	exited := make(chan struct{})
	in.cmd, in.exited, in.frozen, in.expected = cmd, exited, false, false
	go func() {
		err := cmd.Wait()
		in.mu.Lock()
		if !in.expected {
			what := fmt.Sprintf("%v at %s", err, in.tl.now())
			in.selfExit = append(in.selfExit, what)
			in.tl.logf("%s (pid %d) EXITED BY ITSELF: %s", in.name, cmd.Process.Pid, what)
		}
		if in.cmd == cmd {
			in.cmd = nil
		}
		in.mu.Unlock()
		fmt.Fprintf(f, "=== chaos: %s process %d ended at %s: %v\n", in.name, cmd.Process.Pid, in.tl.now(), err)
		f.Close()
		close(exited)
	}()
	return nil
}

func (in *instance) running() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.cmd != nil
}

// state reports whether a process of the instance is running, and whether
// it is frozen (SIGSTOP).
func (in *instance) state() (running, frozen bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.cmd != nil, in.cmd != nil && in.frozen
}

// signal sends sig to the running process, if any, without waiting.
func (in *instance) signal(sig syscall.Signal) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cmd == nil {
		return false
	}
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		in.expected = true
	}
	switch sig {
	case syscall.SIGSTOP:
		in.frozen = true
	case syscall.SIGCONT:
		in.frozen = false
	}
	_ = in.cmd.Process.Signal(sig)
	return true
}

// stop sends sig (SIGKILL or SIGTERM) and waits for the process to end. A
// graceful stop that takes longer than grace is noted and ended by SIGKILL;
// it returns how long the process took to end.
func (in *instance) stop(sig syscall.Signal, grace time.Duration) (time.Duration, error) {
	in.mu.Lock()
	cmd, exited, frozen := in.cmd, in.exited, in.frozen
	in.mu.Unlock()
	if cmd == nil {
		return 0, nil
	}
	begin := time.Now()
	if frozen && sig != syscall.SIGKILL {
		in.signal(syscall.SIGCONT) // a frozen process cannot act on SIGTERM
	}
	in.signal(sig)
	select {
	case <-exited:
		return time.Since(begin), nil
	case <-time.After(grace):
	}
	in.signal(syscall.SIGKILL)
	<-exited
	return time.Since(begin), fmt.Errorf("%s: still running %s after %v; SIGKILLed", in.name, grace, sig)
}

// tail returns the last n lines of the instance's log.
func (in *instance) tail(n int) string {
	b, err := os.ReadFile(in.logs)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// timeline is a run's log of what was done when, relative to its start,
// written to the run's log directory and echoed to the test log.
type timeline struct {
	begin time.Time
	mu    sync.Mutex
	f     *os.File
	echo  func(string, ...any) // the test log
}

func newTimeline(dir string, logf func(string, ...any)) (*timeline, error) {
	f, err := os.Create(filepath.Join(dir, "timeline.log"))
	if err != nil {
		return nil, err
	}
	return &timeline{begin: time.Now(), f: f, echo: logf}, nil
}

func (tl *timeline) now() string {
	return fmt.Sprintf("+%.1fs", time.Since(tl.begin).Seconds())
}

func (tl *timeline) logf(format string, args ...any) {
	line := tl.now() + " " + fmt.Sprintf(format, args...)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	fmt.Fprintln(tl.f, line)
	tl.echo("%s", line)
}

func (tl *timeline) close() { tl.f.Close() }
