package sink

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/kfaketest"
)

// A broker answers produces to a partition it has not yet taken on with
// UNKNOWN_TOPIC_OR_PARTITION ("This server does not host this
// topic-partition") for a while after the topic was created, longer on a
// loaded machine: two instances of one group starting together create a
// repartition topic and produce to it at once. The client's default gives up
// after four such answers and fails the records, which took the whole service
// down; ProducerOpts must keep retrying them until the delivery timeout.
func TestProducerOptsOutlastAJustCreatedTopic(t *testing.T) {
	const refusals = 10 // more than franz-go's default UnknownTopicRetries (4)
	for _, c := range []struct {
		name    string
		extra   []kgo.Opt
		wantErr error
	}{
		{"ProducerOpts", nil, nil},
		// The control: the client's default limit fails the same record, so
		// the case above shows the option, not a broker that gave in early.
		{"default limit", []kgo.Opt{kgo.UnknownTopicRetries(4)}, kerr.UnknownTopicOrPartition},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "fresh"))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			refused := kfaketest.RefuseProduces(cl, refusals)
			opts := append([]kgo.Opt{kgo.SeedBrokers(cl.ListenAddrs()...), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }), kgo.MetadataMinAge(10 * time.Millisecond)}, ProducerOpts()...)
			prod, err := kgo.NewClient(append(opts, c.extra...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = prod.ProduceSync(ctx, &kgo.Record{Topic: "fresh", Key: []byte("card-1"), Value: []byte("v")}).FirstErr()
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("produce after %d refusals: err %v, want %v", refused.Load(), err, c.wantErr)
			}
			if c.wantErr == nil && refused.Load() != refusals {
				t.Fatalf("the broker refused %d produces, want %d", refused.Load(), refusals)
			}
		})
	}
}
