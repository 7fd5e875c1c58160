package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/replay"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

const produceUsage = `velocity-consumer produce: write a JSON-lines file of transactions to a topic.

Each line with the Transaction field names (as 'replay --input-file' reads
them, event_time in Unix ms) becomes one record: key = its entity_id, value =
the plain Avro Transaction a producer of the input topic would write. A line
that is not a transaction is sent as its bytes, as a faulty producer would, so
that 'run' dead-letters it as decode. Records go out in file order; a topic
that does not exist is created with --partitions partitions. For trying the
service on a local broker (examples/transactions.jsonl), not for loading
production data: it writes no schema registry wire format.`

type produceFlags struct {
	brokers, topic, inputFile string
	partitions                int
	logLevel                  string
	conn                      connFlags
}

func (p *produceFlags) register(e *envFlags) {
	e.String(&p.brokers, "brokers", "localhost:9092", "comma-separated Kafka bootstrap brokers")
	e.String(&p.topic, "topic", "transactions", "topic to write the transactions to (run's --input-topic)")
	e.String(&p.inputFile, "input-file", "", "JSON-lines file of transactions, e.g. examples/transactions.jsonl")
	e.Int(&p.partitions, "partitions", 1, "partitions of the topic if it has to be created (an existing topic keeps its own)")
	e.String(&p.logLevel, "log-level", "warn", "debug, info, warn or error")
	p.conn.register(e)
}

func cmdProduce(ctx context.Context, args []string) error {
	var p produceFlags
	e := newEnvFlags("produce", produceUsage)
	p.register(e)
	if err := e.Parse(args); err != nil {
		return err
	}
	return runProduce(ctx, &p, os.Stdout)
}

func runProduce(ctx context.Context, p *produceFlags, out io.Writer) error {
	switch {
	case p.inputFile == "":
		return errors.New("--input-file (VELOCITY_INPUT_FILE) is required: a JSON-lines file of transactions, e.g. examples/transactions.jsonl")
	case !strings.HasSuffix(p.inputFile, ".jsonl"):
		return fmt.Errorf("--input-file %s: want a .jsonl file (JSON lines)", p.inputFile)
	case p.topic == "":
		return errors.New("--topic (VELOCITY_TOPIC) must not be empty")
	case p.partitions < 1:
		return errors.New("--partitions (VELOCITY_PARTITIONS) must be at least 1")
	case p.conn.registryURL != "":
		return errors.New("--schema-registry: produce writes plain Avro only; use a registry-aware producer for a deployment with a registry")
	}
	brokers := splitList(p.brokers)
	if len(brokers) == 0 {
		return errors.New("--brokers (VELOCITY_BROKERS) is empty: give host:port of at least one broker")
	}
	log, err := newLogger(p.logLevel, "console")
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing useful to do on a failed log flush at exit
	opts, _, err := p.conn.clientOpts(log)
	if err != nil {
		return err
	}
	src, err := replay.OpenJSONL(p.inputFile)
	if err != nil {
		return fmt.Errorf("--input-file: %w", err)
	}
	defer src.Close()

	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(p.topic)}, sink.ProducerOpts()...), opts...)...)
	if err != nil {
		return fmt.Errorf("kafka producer: %w", err)
	}
	defer cl.Close()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	created, err := sink.EnsureTopics(tctx, kadm.NewClient(cl), int32(p.partitions), sink.OutputTopic{Flag: "--topic", Name: p.topic})
	cancel()
	if err != nil {
		return err
	}

	var (
		mu       sync.Mutex
		firstErr error
		n, bad   int
	)
	err = src.Read(ctx, 0, nil, func(r *replay.Record) error {
		rec := &kgo.Record{}
		if r.Reject != nil {
			// Not a transaction: its bytes, unkeyed, as a broken producer
			// would send them.
			rec.Value = append([]byte(nil), r.Original...)
			bad++
		} else {
			rec.Key = append([]byte(nil), r.Key...)
			rec.Value = append([]byte(nil), r.Value...)
		}
		n++
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
		return nil
	})
	if ferr := cl.Flush(ctx); err == nil {
		err = ferr
	}
	if err == nil {
		err = firstErr
	}
	if err != nil {
		return fmt.Errorf("produce to %s: %w", p.topic, err)
	}
	how := "existing topic"
	if len(created) > 0 {
		how = fmt.Sprintf("created with %d partition(s)", p.partitions)
	}
	fmt.Fprintf(out, "produced %d records from %s to topic %s (%s) at %s: %d transactions, %d lines that are not one (sent as their bytes)\n",
		n, p.inputFile, p.topic, how, strings.Join(brokers, ","), n-bad, bad)
	return nil
}
