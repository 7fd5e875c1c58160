package sink

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPartitionerRepartitionTopicsAreManual: records of a repartition topic land on
// the partition they name, keyed or not; every other topic keeps Kafka's keyed rule.
func TestPartitionerRepartitionTopicsAreManual(t *testing.T) {
	def := kgo.StickyKeyPartitioner(nil).ForTopic("features")
	ours := Partitioner()
	for _, tt := range []struct {
		topic  string
		key    []byte
		preset int32
		manual bool
	}{
		{RepartitionTopicPrefix + "g-device", []byte("dev-1"), 2, true},
		{RepartitionTopicPrefix + "g-device", nil, 1, true}, // a marker
		{RepartitionTopicPrefix + "g-ip", []byte("10.0.0.1"), 0, true},
		{"velocity-features", []byte("card-7"), 2, false},
		{"velocity-features.device", []byte("dev-1"), 0, false},
		{"velocity-dlq", []byte("card-9"), 1, false},
	} {
		for _, n := range []int{3, 7} {
			tp := ours.ForTopic(tt.topic)
			r := &kgo.Record{Topic: tt.topic, Key: tt.key, Partition: tt.preset}
			var got int
			if bp, ok := tp.(kgo.TopicBackupPartitioner); ok {
				got = bp.PartitionByBackup(r, n, nil) // franz-go's path for this kind; keyed, it never iterates
			} else {
				got = tp.Partition(r, n)
			}
			want := int(tt.preset)
			if !tt.manual {
				want = def.Partition(&kgo.Record{Key: tt.key}, n)
			}
			if got != want {
				t.Errorf("%s key %q over %d partitions: %d, want %d", tt.topic, tt.key, n, got, want)
			}
			if !tt.manual && !tp.RequiresConsistency(r) {
				t.Errorf("%s: a keyed record must always go to its key's partition", tt.topic)
			}
		}
	}
}
