package sink

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestEnsureTopics(t *testing.T) {
	adm := newFakeAdmin(t)
	ctx := context.Background()

	created, err := EnsureTopics(ctx, adm, 3, OutputTopic{Flag: "--a", Name: "exists"}, OutputTopic{Flag: "--b", Name: "fresh"}, OutputTopic{Flag: "--c"})
	if err != nil {
		t.Fatal(err)
	}
	if len(created) != 1 || created[0] != "fresh" {
		t.Fatalf("created %v, want only fresh", created)
	}
	// All topics: the client briefly caches the per-topic answer "unknown"
	// from before the creation.
	md, err := adm.Metadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(md.Topics["fresh"].Partitions); n != 3 {
		t.Errorf("fresh has %d partitions, want 3", n)
	}
	if n := len(md.Topics["exists"].Partitions); n != 2 {
		t.Errorf("an existing topic changed to %d partitions", n)
	}
	if again, err := EnsureTopics(ctx, adm, 3, OutputTopic{Flag: "--b", Name: "fresh"}); err != nil || len(again) != 0 {
		t.Fatalf("second call: created %v, err %v; want nothing", again, err)
	}
	// A repartition topic must have the input's partition count, existing or not.
	if _, err := EnsureTopics(ctx, adm, 3, OutputTopic{Flag: "repartition", Name: "exists", Exact: true}); err == nil || !strings.Contains(err.Error(), "has 2 partitions and the input topic 3") {
		t.Fatalf("existing repartition topic with 2 of 3 partitions: err %v", err)
	}
	if _, err := EnsureTopics(ctx, adm, 2, OutputTopic{Flag: "repartition", Name: "exists", Exact: true}); err != nil {
		t.Fatalf("existing repartition topic with the input's count: %v", err)
	}
}

// TestEnsureTopicsConfigs: a topic created here gets its Configs (a repartition
// topic's records then carry the broker's append time); an existing one keeps its own.
func TestEnsureTopicsConfigs(t *testing.T) {
	adm := newFakeAdmin(t)
	ctx := context.Background()
	if _, err := EnsureTopics(ctx, adm, 2,
		OutputTopic{Flag: "repartition", Name: "rp", Exact: true, Configs: RepartitionConfigs()},
		OutputTopic{Flag: "repartition", Name: "exists", Exact: true, Configs: RepartitionConfigs()}); err != nil {
		t.Fatal(err)
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, "rp", "exists")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		topic, value string
	}{{"rp", "LogAppendTime"}, {"exists", ""}} {
		rc, err := rcs.On(want.topic, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, c := range rc.Configs {
			if c.Key == "message.timestamp.type" && c.Source == kmsg.ConfigSourceDynamicTopicConfig && c.Value != nil {
				got = *c.Value
			}
		}
		if got != want.value {
			t.Errorf("%s: message.timestamp.type set to %q, want %q", want.topic, got, want.value)
		}
	}
}

// newFakeAdmin is an admin client of a fake cluster holding one topic, "exists",
// of 2 partitions.
func newFakeAdmin(t *testing.T) *kadm.Client {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "exists"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}
