package repartition

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Kafka's own test vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2).
func TestMurmur2KafkaVectors(t *testing.T) {
	for in, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := murmur2([]byte(in)); got != want {
			t.Errorf("murmur2(%q) = %d, Kafka says %d", in, got, want)
		}
	}
}

// TestPartitionForMatchesFranzGo: the producer library the service's tests use places
// keyed records where PartitionFor says.
func TestPartitionForMatchesFranzGo(t *testing.T) {
	part := kgo.StickyKeyPartitioner(nil).ForTopic("tx")
	for _, n := range []int{1, 3, 7, 12, 64} {
		for i := range 2000 {
			key := fmt.Sprintf("card-%d-é", i)
			want := part.Partition(&kgo.Record{Key: []byte(key)}, n)
			if got := PartitionFor(key, int32(n)); int(got) != want {
				t.Fatalf("%q over %d partitions: %d, franz-go %d", key, n, got, want)
			}
		}
	}
}
