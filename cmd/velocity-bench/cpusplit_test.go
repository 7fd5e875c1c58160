package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseBusy(t *testing.T) {
	cases := []struct {
		name, stat string
		want       time.Duration
		wantErr    bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"all fields", "cpu  100 5 50 1000 20 3 2 0 40 0\ncpu0 1 2 3\n", 160 * time.Second / clkTck, false},
		{"guest not counted twice", "cpu  100 0 0 0 0 0 0 0 100 100\n", 100 * time.Second / clkTck, false},
		{"old kernel, 8 fields", "cpu  10 0 10 500 0 0 0\n", 20 * time.Second / clkTck, false},
		{"not the cpu line", "intr 1 2 3 4 5 6 7 8\n", 0, true},
		{"bad number", "cpu  1 x 3 4 5 6 7 8\n", 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseBusy([]byte(c.stat))
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error %v", err, c.wantErr)
			}
			if got != c.want {
				t.Fatalf("busy = %v, want %v", got, c.want)
			}
		})
	}
}

func TestSteadyCPU(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := cpuMark{at: t0, busy: 10 * time.Second, proc: 2 * time.Second, harness: time.Second, broker: 3 * time.Second, brokerPIDs: []int{7}}
	b := cpuMark{at: t0.Add(4 * time.Second), busy: 17 * time.Second, proc: 5 * time.Second, harness: 2 * time.Second, broker: 5 * time.Second}
	s := steadyCPU(a, b)
	if s.Busy != 1.75 || s.Processor != 0.75 || s.Harness != 0.25 || s.Broker != 0.5 {
		t.Fatalf("got %+v, want busy 1.75, processor 0.75, harness 0.25, broker 0.5", s)
	}
	a.brokerPIDs = nil
	if s := steadyCPU(a, b); s.Broker != -1 {
		t.Fatalf("no broker found: broker = %v, want -1", s.Broker)
	}
	if !strings.Contains(steadyCPU(a, b).String(), "broker=?") {
		t.Fatalf("no broker found: %q should say broker=?", steadyCPU(a, b).String())
	}
	if s := steadyCPU(b, b); s != (SteadyCPU{}) {
		t.Fatalf("zero interval: got %+v, want the zero value", s)
	}
}

// TestMarkCPUSelf reads this process's own counters: burning CPU between two marks
// must show up as harness time and machine time.
func TestMarkCPUSelf(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc here")
	}
	a := markCPU(os.Getpid(), nil)
	deadline := time.Now().Add(300 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	s := steadyCPU(a, markCPU(os.Getpid(), nil))
	if s.Harness <= 0 || s.Processor <= 0 || s.Busy <= 0 {
		t.Fatalf("after 300 ms of spinning: %+v (x=%d); want harness, processor and busy > 0", s, x)
	}
}
