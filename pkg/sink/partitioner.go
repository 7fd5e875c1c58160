package sink

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// RepartitionTopicPrefix starts the name of every repartition topic
// (repartition topics are named by the consumer group and the re-keyed group:
// docs/repartition.md).
const RepartitionTopicPrefix = "__velocity-repartition-"

// Partitioner is the partitioner of every producer the service makes: franz-go's
// default (Kafka's murmur2 for keyed records) for every topic but the repartition
// topics, whose records carry the partition the first stage chose. A hop event's
// partition is its key's by the same murmur2 (repartition.PartitionFor), but a
// marker goes to every partition and has no key, and a first stage and replay's
// in-memory routing must agree exactly, so the first stage decides and the
// producer only follows.
func Partitioner() kgo.Partitioner {
	return hopPartitioner{def: kgo.UniformBytesPartitioner(64<<10, true, true, nil), manual: kgo.ManualPartitioner()}
}

type hopPartitioner struct{ def, manual kgo.Partitioner }

func (h hopPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if strings.HasPrefix(topic, RepartitionTopicPrefix) {
		return h.manual.ForTopic(topic)
	}
	return h.def.ForTopic(topic)
}
