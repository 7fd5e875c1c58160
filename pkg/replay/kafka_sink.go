package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// KafkaSink produces features records and dead letters to topics through
// pkg/sink, the live service's producer: same key (the entity id), same value
// bytes, same headers (velocity.emitted_at and velocity.host on features, the
// velocity.* dead-letter headers on dead letters, velocity.build on both once
// SetBuild names it), same idempotent acks=all
// client options. One KafkaSink can serve as both the features and the
// dead-letter sink; it routes each Output by its kind.
type KafkaSink struct {
	cl                    *kgo.Client // nil when built on another sink.Producer (tests)
	prod                  sink.Producer
	host, build           string
	definition            string
	featuresTopic, dlqTop string
	prefix                []byte
	tr                    *sink.Tracker
	committed             bool
}

// NewKafkaSink connects a producer to brokers. Set the topics before the
// first Write.
func NewKafkaSink(ctx context.Context, brokers []string, host string, opts ...kgo.Opt) (*KafkaSink, error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, sink.ProducerOpts()...), opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cl.Ping(pctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("reach brokers %v: %w (check --brokers)", brokers, err)
	}
	return &KafkaSink{cl: cl, prod: cl, host: host}, nil
}

// SetBuild names the build in a velocity.build header of every record, as
// the live service does. Call it before the first Write.
func (k *KafkaSink) SetBuild(build string) { k.build = build }

// SetDefinition names the feature definition in a velocity.definition header of
// every record, as the live service does under --features. Call it before the
// first Write.
func (k *KafkaSink) SetDefinition(definition string) { k.definition = definition }

// EnsureTopic creates topic if it does not exist, with as many partitions as
// likeTopic has (1 if likeTopic is empty or missing), so a backtest can write to
// a new topic without a separate admin step. flag names the option in errors.
func (k *KafkaSink) EnsureTopic(ctx context.Context, flag, topic, likeTopic string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(k.cl)
	partitions := int32(1)
	if likeTopic != "" {
		if md, err := adm.Metadata(ctx, likeTopic); err == nil {
			if td, ok := md.Topics[likeTopic]; ok && td.Err == nil {
				partitions = int32(len(td.Partitions))
			}
		}
	}
	_, err := sink.EnsureTopics(ctx, adm, partitions, sink.OutputTopic{Flag: flag, Name: topic})
	return err
}

// Sibling returns a sink for another features topic (a re-keyed group's) that
// shares k's producer, build and definition and has its own features prefix, its
// own tracker and no dead-letter topic. Commit and Abort it like any sink; Close
// only closes k.
func (k *KafkaSink) Sibling(featuresTopic string) *KafkaSink {
	return &KafkaSink{prod: k.prod, host: k.host, build: k.build, definition: k.definition, featuresTopic: featuresTopic}
}

// SetFeaturesTopic names the topic for features records.
func (k *KafkaSink) SetFeaturesTopic(t string) { k.featuresTopic = t }

// SetDLQTopic names the topic for dead letters.
func (k *KafkaSink) SetDLQTopic(t string) { k.dlqTop = t }

// SetFeaturesPrefix makes every features value start with prefix: the
// Confluent wire-format header of our registered schema when the live
// service writes through a schema registry (sink.WithFeaturesPrefix). Set it
// before the first Write.
func (k *KafkaSink) SetFeaturesPrefix(prefix []byte) { k.prefix = append([]byte(nil), prefix...) }

// Write implements Sink. It blocks while the producer's buffer is full, which
// is the replay's backpressure.
func (k *KafkaSink) Write(o *pipeline.Output) error {
	if k.tr == nil {
		k.tr = sink.New(k.prod, k.featuresTopic, k.dlqTop, k.host).WithFeaturesPrefix(k.prefix).WithBuild(k.build).WithDefinition(k.definition).NewTracker(nil)
	}
	if o.Dead {
		if k.dlqTop == "" {
			return errors.New("kafka sink: a dead letter but no DLQ topic")
		}
		k.tr.Dead(sink.DeadLetter{
			Key: o.Key, Value: o.Value, Reason: o.Reason, Err: o.Err,
			SourceTopic: o.SourceTopic, SourcePartition: o.SourcePartition, SourceOffset: o.SourceOffset,
			Group: o.Group,
		})
	} else {
		if k.featuresTopic == "" {
			return errors.New("kafka sink: a features record but no features topic")
		}
		k.tr.Features(o.Key, o.Value, 0)
	}
	// A failed produce is kept by the tracker; stop at the first one instead
	// of replaying the rest of the range into a broken producer.
	return k.tr.Err()
}

// Commit implements Sink: it waits until every record is acknowledged.
func (k *KafkaSink) Commit(ctx context.Context) error {
	if k.committed || k.tr == nil {
		k.committed = true
		return nil
	}
	k.committed = true
	if err := k.tr.Flush(ctx); err != nil {
		return fmt.Errorf("kafka sink: %w", err)
	}
	return nil
}

// Abort implements Sink. Records already produced cannot be taken back; it
// waits briefly for those in flight so none is left half-sent, and the
// command says that the topic holds a partial replay.
func (k *KafkaSink) Abort() error {
	if k.committed || k.tr == nil {
		return nil
	}
	k.committed = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return k.tr.Flush(ctx)
}

// Close closes the producer.
func (k *KafkaSink) Close() {
	if k.cl != nil {
		k.cl.Close()
	}
}
