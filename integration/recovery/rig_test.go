//go:build integration

package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

// rig is what a test of a few processes needs: the broker, the built binary,
// a bounded context, an admin client and an input topic of recPartitions
// partitions that keeps its records.
type rig struct {
	t         *testing.T
	addr, bin string
	input     string
	ctx       context.Context
	adm       *kadm.Client
}

var keepRecords = map[string]string{"retention.ms": "-1"}

func newRig(t *testing.T, d time.Duration) *rig {
	t.Helper()
	addr := kafkatest.Broker(t)
	r := &rig{t: t, addr: addr, bin: buildBinary(t), ctx: kafkatest.Context(t, d), adm: kafkatest.Admin(t, addr)}
	r.input = kafkatest.CreateTopic(t, addr, recPartitions, keepRecords)
	return r
}

// group is a consumer group of its own over the rig's input, with its own
// output and dead-letter topics, checkpointing to store: "file" (a new
// directory), "kafka" (a new snapshot topic, deleted at the end) or a
// --checkpoint-store value as it is.
func (r *rig) group(name string, eos bool, store string) *scenario {
	t := r.t
	t.Helper()
	switch store {
	case "file":
		store = "file://" + t.TempDir()
	case "kafka":
		topic := kafkatest.Name(t, "snap")
		store = "kafka://" + topic
		t.Cleanup(func() {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = r.adm.DeleteTopic(c, topic)
		})
	}
	return &scenario{name: name, eos: eos, group: kafkatest.Group(t), store: store,
		out: kafkatest.CreateTopic(t, r.addr, recPartitions, keepRecords), dlq: kafkatest.CreateTopic(t, r.addr, 1, keepRecords)}
}

// args is sc's flags over the rig's input, then extra (later flags win).
func (r *rig) args(sc *scenario, extra ...string) []string {
	return append(sc.args(r.addr, r.input), extra...)
}
