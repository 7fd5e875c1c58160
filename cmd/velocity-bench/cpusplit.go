package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// SteadyCPU is where the machine's CPU went during a latency run's steady phase, in
// cores (CPU seconds per wall second). It tells a run that was bound by the machine
// (Busy near Cores: every process waits for a core, whatever it is) from one bound by
// the processor alone.
type SteadyCPU struct {
	Cores     int     `json:"cores"`      // logical CPUs of the machine
	Busy      float64 `json:"busy_cores"` // every process and the kernel (/proc/stat)
	Processor float64 `json:"processor_cores"`
	Harness   float64 `json:"harness_cores"` // this process: the load generator
	// Broker is every local process whose command line runs the main class kafka.Kafka
	// (scripts/kafka-local.sh; none for a broker in a container): −1 when none was found.
	Broker float64 `json:"broker_cores"`
}

// cpuMark is the CPU counters at one moment.
type cpuMark struct {
	at                    time.Time
	busy                  time.Duration // the machine's non-idle time, summed over CPUs
	proc, harness, broker time.Duration
	brokerPIDs            []int
}

// markCPU reads the counters; pid is the processor's. Brokers found at the first mark
// are the ones read at the second (pass the first mark's list as brokers).
func markCPU(pid int, brokers []int) cpuMark {
	m := cpuMark{at: time.Now(), brokerPIDs: brokers}
	m.busy, _ = machineBusy()
	if s, err := sampleProc(pid); err == nil {
		m.proc = s.CPU
	}
	if s, err := sampleProc(os.Getpid()); err == nil {
		m.harness = s.CPU
	}
	for _, b := range brokers {
		if s, err := sampleProc(b); err == nil {
			m.broker += s.CPU
		}
	}
	return m
}

// steadyCPU is the use between two marks.
func steadyCPU(a, b cpuMark) SteadyCPU {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return SteadyCPU{}
	}
	cores := func(d time.Duration) float64 { return d.Seconds() / wall }
	s := SteadyCPU{
		Cores:     runtime.NumCPU(),
		Busy:      cores(b.busy - a.busy),
		Processor: cores(b.proc - a.proc),
		Harness:   cores(b.harness - a.harness),
		Broker:    -1,
	}
	if len(a.brokerPIDs) > 0 {
		s.Broker = cores(b.broker - a.broker)
	}
	return s
}

// machineBusy is the machine's non-idle CPU time so far: the first line of /proc/stat
// less idle and iowait (guest time is already inside user).
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseBusy(b)
}

func parseBusy(b []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var total, idle int64
	for i, v := range f[1:] {
		if i >= 8 { // guest and guest_nice are counted in user and nice
			break
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: field %d %q: %w", i+1, v, err)
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return time.Duration(total-idle) * time.Second / clkTck, nil
}

// localBrokers lists the processes running the Kafka broker's main class.
func localBrokers() []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(cmdline, []byte{0}) {
			if string(arg) == "kafka.Kafka" {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

func (s SteadyCPU) String() string {
	if s.Cores == 0 {
		return ""
	}
	broker := "?"
	if s.Broker >= 0 {
		broker = fmt.Sprintf("%.2f", s.Broker)
	}
	return fmt.Sprintf("steady cores: busy=%.2f/%d processor=%.2f broker=%s load generator=%.2f", s.Busy, s.Cores, s.Processor, broker, s.Harness)
}
