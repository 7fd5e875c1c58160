package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcSpec names a processor under test: "ours", "kstreams" or "floor", then options
// joined by ':' — "eos" (exactly-once: our --exactly-once, Streams' exactly_once_v2) and,
// for ours, "late=DUR" (--allowed-lateness, default 0: the pipeline's latency without the
// reorder wait) and "bin=NAME" (run the build --vc-alt names NAME instead of --vc, so
// that two builds run in the same rounds on the same input: a before/after ratio).
// "groups=N" (ours and kstreams, N = 1..MaxBenchGroups) runs the groups benchmark
// (groups.go) over the payments workload: ours with `run --features` of an N-group
// definition, the peer with its N-group topology; without it, both run the single-key
// contract over Transaction records.
// "floor" is the transport ceiling (floor.go) and takes no options.
type ProcSpec struct {
	Kind     string // "ours" | "kstreams" | "floor"
	EOS      bool
	Lateness time.Duration
	Bin      string // ours: a --vc-alt name, or "" for --vc
	Groups   int    // 0: the single-key contract; 1..MaxBenchGroups: the groups benchmark
	Name     string // the spec as written, used in tables
}

// ParseProcSpec parses one processor spec.
func ParseProcSpec(s string) (ProcSpec, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	p := ProcSpec{Kind: parts[0], Name: strings.TrimSpace(s)}
	if p.Kind != "ours" && p.Kind != "kstreams" && p.Kind != "floor" {
		return p, fmt.Errorf("processor %q: kind must be ours, kstreams or floor", s)
	}
	if p.Kind == "floor" && len(parts) > 1 {
		return p, fmt.Errorf("processor %q: floor takes no options", s)
	}
	for _, o := range parts[1:] {
		switch {
		case o == "eos":
			p.EOS = true
		case strings.HasPrefix(o, "late=") && p.Kind == "ours":
			d, err := time.ParseDuration(strings.TrimPrefix(o, "late="))
			if err != nil || d < 0 {
				return p, fmt.Errorf("processor %q: late=%s is not a duration >= 0", s, strings.TrimPrefix(o, "late="))
			}
			p.Lateness = d
		case strings.HasPrefix(o, "bin=") && p.Kind == "ours" && len(o) > len("bin="):
			p.Bin = strings.TrimPrefix(o, "bin=")
		case strings.HasPrefix(o, "groups="):
			n, err := strconv.Atoi(strings.TrimPrefix(o, "groups="))
			if err != nil || n < 1 || n > MaxBenchGroups || p.Groups != 0 {
				return p, fmt.Errorf("processor %q: %s: want groups=N once, N in 1..%d", s, o, MaxBenchGroups)
			}
			p.Groups = n
		default:
			return p, fmt.Errorf("processor %q: unknown option %q (want eos, groups=N, or late=DUR or bin=NAME for ours)", s, o)
		}
	}
	return p, nil
}

// ParseProcSpecs parses a comma-separated list; empty gives none.
func ParseProcSpecs(s string) ([]ProcSpec, error) {
	var out []ProcSpec
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		p, err := ParseProcSpec(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// procEnv is how to start the processors.
type procEnv struct {
	Brokers     string
	VC          string            // path to the velocity-consumer binary
	VCAlt       map[string]string // other builds of it by name (ProcSpec.Bin)
	Jar         string            // path to bench/kstreams/target/velocity-kstreams.jar
	Java        string            // java executable
	JavaOpts    []string          // e.g. -Xmx1g
	IdleTimeout time.Duration
	Checkpoint  string // "file" (a fresh directory per run) or "memory"
	VCExtra     []string
	Self        string // this binary, for the floor processor (velocity-bench floor-proc)
	// MetricsAddr, when set, is where ours serves /metrics (latency runs read its
	// velocity_added_latency_seconds there); empty turns its metrics off.
	MetricsAddr string
	// Profile makes ours and the floor write cpu.pprof and mem.pprof (see
	// internal/profiling) into each run's directory.
	Profile bool
}

// vcFor is the velocity-consumer binary that runs p.
func (e procEnv) vcFor(p ProcSpec) string {
	if p.Bin != "" {
		return e.VCAlt[p.Bin]
	}
	return e.VC
}

// profileArgs are the profiling flags for a run in dir (none unless Profile).
func (e procEnv) profileArgs(dir string) []string {
	if !e.Profile {
		return nil
	}
	return []string{"--cpu-profile", filepath.Join(dir, "cpu.pprof"), "--mem-profile", filepath.Join(dir, "mem.pprof")}
}

// command builds the child process for one run; dir is the run's scratch directory.
func (e procEnv) command(p ProcSpec, input, output, dlq, group, dir string) (*exec.Cmd, error) {
	var cmd *exec.Cmd
	switch p.Kind {
	case "ours":
		store := "memory"
		if e.Checkpoint == "file" {
			store = "file://" + filepath.Join(dir, "state")
		}
		args := []string{"run",
			"--brokers", e.Brokers,
			"--group", group,
			"--input-topic", input,
			"--output-topic", output,
			"--dlq-topic", dlq,
			"--allowed-lateness", p.Lateness.String(),
			"--idle-timeout", e.IdleTimeout.String(),
			"--checkpoint-store", store,
			"--metrics-addr", e.MetricsAddr,
			"--log-level", "warn",
		}
		if p.EOS {
			args = append(args, "--exactly-once")
		}
		if p.Groups > 0 {
			// The re-keyed groups' outputs go to <output>.<group> (the default
			// --group-topic); their repartition topics are ours to create at start.
			def, err := writeGroupsDefinition(dir, p.Groups)
			if err != nil {
				return nil, err
			}
			args = append(args, "--features", def)
		}
		args = append(append(args, e.profileArgs(dir)...), e.VCExtra...)
		cmd = exec.Command(e.vcFor(p), args...)
	case "kstreams":
		mode := "alo"
		if p.EOS {
			mode = "eos"
		}
		args := append(append([]string{}, e.JavaOpts...), "-jar", e.Jar,
			e.Brokers, input, output, group, filepath.Join(dir, "kstreams-state"), mode)
		if p.Groups > 0 {
			// The groups topology (VelocityGroups.java): payment_event.avsc in,
			// group g's rows to output (the card group) or output.g.
			args = append(args, "groups="+strconv.Itoa(p.Groups))
		}
		cmd = exec.Command(e.Java, args...)
	case "floor":
		cmd = exec.Command(e.Self, append([]string{"floor-proc",
			"--brokers", e.Brokers,
			"--group", group,
			"--input-topic", input,
			"--output-topic", output}, e.profileArgs(dir)...)...)
	default:
		return nil, fmt.Errorf("unknown processor kind %q", p.Kind)
	}
	log, err := os.Create(filepath.Join(dir, "processor.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so a Ctrl-C of the harness reaches the harness first and
	// the harness stops the child in order (SIGTERM, then SIGKILL after a grace period).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// procSample is a child's resource use so far, from /proc.
type procSample struct {
	CPU      time.Duration // utime + stime of all its threads
	PeakRSSB int64         // VmHWM
}

// clkTck is USER_HZ, 100 on every Linux architecture Go supports.
const clkTck = 100

func sampleProc(pid int) (procSample, error) {
	var s procSample
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return s, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	s.CPU = time.Duration(ut+st) * time.Second / clkTck
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return s, fmt.Errorf("/proc/%d/status VmHWM %q: %w", pid, rest, err)
			}
			s.PeakRSSB = kb << 10
		}
	}
	return s, nil
}

// child is a running processor and a channel closed when it exits.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // Wait's result, valid after exited is closed
}

func startChild(cmd *exec.Cmd) (*child, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// stop sends SIGTERM and waits up to grace, then SIGKILLs the child's process group.
// It returns the child's total CPU and peak RSS from rusage (including shutdown).
func (c *child) stop(grace time.Duration) procSample {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
	}
	var s procSample
	if ps := c.cmd.ProcessState; ps != nil {
		s.CPU = ps.UserTime() + ps.SystemTime()
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
			s.PeakRSSB = ru.Maxrss << 10 // Linux reports kB
		}
	}
	return s
}
