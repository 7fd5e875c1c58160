package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// syncBuffer is a bytes.Buffer the demo writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func parseDemo(t *testing.T, args ...string) *demoFlags {
	t.Helper()
	var d demoFlags
	e := newEnvFlags("demo", demoUsage)
	d.register(e)
	if err := e.Parse(append([]string{"--rate", "2000", "--entities", "5000", "--log-level", "error"}, args...)); err != nil {
		t.Fatal(err)
	}
	return &d
}

// TestDemoAccounting runs the README's first command for a few seconds: the
// demo itself fails unless every input offset comes back exactly once on the
// output or dead-letter topic. It also shows what it computed (a few features
// records, decoded, with the topic, partition and offset each was read at)
// and says that its latency includes the reorder wait of --allowed-lateness.
func TestDemoAccounting(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline for a few seconds")
	}
	var out syncBuffer
	if err := runDemo(context.Background(), parseDemo(t, "--duration", "3s"), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`accounting +OK: each of the \d+ input offsets has exactly one output`),
		regexp.MustCompile(`it includes the reorder wait\s+of up to --allowed-lateness \(1s\)`),
		regexp.MustCompile(`including the reorder wait of up to --allowed-lateness \(1s\); --allowed-lateness 0 leaves it out`),
		regexp.MustCompile(`features records, decoded .*topic velocity-features on 127\.0\.0\.1:\d+`),
		regexp.MustCompile(`velocity-features partition \d offset \d+, key "card-\d+": event tx-1-\d+ at .* from transactions/\d@\d+`),
		regexp.MustCompile(`\n +5m +count +\d+ +sum_minor +\d+ +min +\d+ +max +\d+\n`),
	} {
		if !want.MatchString(got) {
			t.Errorf("demo output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "--keep-running:") {
		t.Errorf("without --keep-running the demo talks about it:\n%s", got)
	}
}

// TestDemoKeepRunning: with --keep-running the broker outlives the summary,
// the demo prints its address and kcat commands, a client can read the
// features topic there, and cancelling (Ctrl-C) stops it.
func TestDemoKeepRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline for a few seconds")
	}
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runDemo(ctx, parseDemo(t, "--duration", "2s", "--keep-running"), &out) }()

	up := regexp.MustCompile(`--keep-running: the in-process broker stays up at (127\.0\.0\.1:\d+)`)
	var addr string
	for deadline := time.Now().Add(90 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("demo returned before Ctrl-C: %v\n%s", err, out.String())
		default:
		}
		if m := up.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("no broker address printed:\n%s", out.String())
	}
	for _, want := range []string{"kcat -b " + addr + " -L", "kcat -b " + addr + " -C -t velocity-features", "kcat -b " + addr + " -C -t velocity-dlq"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("velocity-features"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	var f codec.Features
	var read int
	for read == 0 && pctx.Err() == nil {
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			if read == 0 {
				if f, err = codec.DecodeFeatures(r.Value); err != nil {
					t.Errorf("features record p%d@%d: %v", r.Partition, r.Offset, err)
				}
			}
			read++
		})
	}
	if read == 0 || f.EventID == "" {
		t.Fatalf("read %d features records from the kept broker (first %+v)", read, f)
	}
	select {
	case err := <-done:
		t.Fatalf("demo returned before Ctrl-C: %v", err)
	default:
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo after Ctrl-C: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("demo did not stop within 30s of Ctrl-C")
	}
	if !strings.HasSuffix(out.String(), "stopping the broker\n") {
		t.Errorf("output does not end by saying the broker stops:\n%s", out.String())
	}
}
