// Command velocity-consumer turns a Kafka topic of transactions into real-time
// velocity features: per entity, how many transactions and how much money in
// each configured window, one features record per transaction.
//
//	velocity-consumer run      the live service (consumer group)
//	velocity-consumer replay   backtests over a topic range or a file
//	velocity-consumer demo     the whole pipeline on an in-process broker
//	velocity-consumer produce  JSON-lines transactions onto a topic, as Avro
//	velocity-consumer version  the build: module version, revision, Go version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `velocity-consumer: real-time velocity features from a Kafka topic of transactions.

Usage:
  velocity-consumer run     [flags]  the live service: consume, compute, publish, checkpoint
  velocity-consumer replay  [flags]  backtest: a topic range or a file through the same pipeline
  velocity-consumer demo    [flags]  the whole pipeline on an in-process Kafka broker, one command
  velocity-consumer produce [flags]  write a JSON-lines file of transactions to a topic, as Avro
  velocity-consumer version          the build: module version, VCS revision and time, Go version
                                     (also --version)

Run 'velocity-consumer <command> --help' for a command's flags. Every flag can
also be set through the environment as VELOCITY_<FLAG_NAME>, e.g.
--input-topic is VELOCITY_INPUT_TOPIC. docs/flags.md lists them all.`

var commands = map[string]func(context.Context, []string) error{
	"run":     cmdRun,
	"demo":    cmdDemo,
	"replay":  cmdReplay,
	"produce": cmdProduce,
}

func main() {
	os.Exit(mainErr(os.Args[1:]))
}

func mainErr(args []string) int {
	return mainTo(os.Stdout, os.Stderr, args)
}

// mainTo runs a command line. Asked-for output (help, the version) goes to
// stdout with exit status 0, so that 'velocity-consumer run --help | less'
// works; mistakes go to stderr with status 2 (usage) or 1 (a command failed).
func mainTo(stdout, stderr io.Writer, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	case "version", "--version", "-version":
		printVersion(stdout, readBuildInfo())
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "velocity-consumer: unknown command %q\n\n%s\n", args[0], usage)
		return 2
	}
	// SIGINT/SIGTERM cancel the context: each command shuts down cleanly
	// (the live service checkpoints every partition before it leaves).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd(ctx, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "velocity-consumer %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
