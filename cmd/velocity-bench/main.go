// Command velocity-bench measures velocity-consumer end to end on a real Kafka broker,
// side by side with its peers (a Kafka Streams processor and the seed Python library),
// in one invocation, so that every processor sees the same workload and the same
// machine.
//
//	velocity-bench compare    produce seeded workloads, run each processor over them, report medians and ratios
//	velocity-bench summarize  print the tables of a results file written by compare
//	velocity-bench produce    write one workload to a topic (to look at, or to feed something else)
//	velocity-bench seq        write a workload's event sequence to a file, for bench/python/seed_window.py
//	                          and the Go benchmark BenchmarkSeedSequence in this directory
//	velocity-bench equal      run ours and Kafka Streams on one workload and compare their features
//	                          record by record, each difference explained (equal.go, equalcmp.go)
//	velocity-bench groups-check  run the Kafka Streams groups peer (groups=N) and replay each group's
//	                          rows through our engine in the peer's order: same values? (peercheck.go)
//	velocity-bench stages     account CPU or allocation profiles (compare --profile) by hot-path stage
//
// A processor is a child process: our binary's `run`, the Kafka Streams peer in
// bench/kstreams, or the floor (this binary's hidden `floor-proc`, floor.go): a
// passthrough with our producer settings, the ceiling ours is measured against. The harness creates fresh topics and a fresh group per run (the
// outputs with message.timestamp.type=LogAppendTime, so that every time it reports comes
// from the broker's clock), waits until the outputs hold one record per input, samples
// the child's CPU time and peak RSS from /proc at that moment, stops it, and reads the
// outputs back to check the accounting and compute latencies.
//
// It is for a local test broker (it refuses non-loopback addresses; it floods and
// deletes topics) and for a human reading numbers; it is not a load test of a cluster
// and not part of CI beyond the unit tests of its pure parts.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `velocity-bench: end-to-end and peer benchmarks on a local Kafka broker.

Usage:
  velocity-bench compare   [flags]   rounds of: produce, run every processor, read back; tables of medians
  velocity-bench summarize [flags]   tables from a results file of compare
  velocity-bench produce   [flags]   write one seeded workload to a topic
  velocity-bench seq       [flags]   write a workload's event sequence to a file
  velocity-bench equal     [flags]   ours and Kafka Streams on one workload: are the features equal, and why not
  velocity-bench groups-check [flags] the Kafka Streams groups peer's rows against our engine in the peer's order
  velocity-bench stages    [flags] PROFILE...   CPU or allocation profiles by stage of the hot path

Run 'velocity-bench <command> --help' for a command's flags.`

var commands = map[string]func(context.Context, []string) error{
	"compare":      cmdCompare,
	"summarize":    cmdSummarize,
	"produce":      cmdProduce,
	"seq":          cmdSeq,
	"equal":        cmdEqual,
	"groups-check": cmdGroupsCheck,
	"stages":       cmdStages,
	// Hidden: the floor processor, started by compare as a child (floor.go).
	"floor-proc": cmdFloorProc,
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		fmt.Fprintln(os.Stderr, usage)
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "velocity-bench: unknown command %q\n\n%s\n", os.Args[1], usage)
		os.Exit(2)
	}
	// Ctrl-C cancels the context; the current run stops its child and cleans up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd(ctx, os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "velocity-bench:", err)
		os.Exit(1)
	}
}
