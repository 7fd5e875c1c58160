//go:build integration

package recovery

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
)

// BenchmarkKafkaStore125MB saves and loads a 125 MB state (the size of the
// 1 M-entity snapshot in pkg/checkpoint's benchmarks) through the kafka store
// on the real broker. The payload is random bytes: incompressible, so lz4
// does not flatter the numbers.
func BenchmarkKafkaStore125MB(b *testing.B) {
	ctx := context.Background()
	st := openBenchStore(b)
	state := make([]byte, 125_500_000)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(state); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			state[i+j] = byte(v >> (8 * j))
		}
	}
	key := checkpoint.Key{Group: "bench", Topic: "transactions", Partition: 0}
	var save, load time.Duration
	b.SetBytes(int64(len(state)))
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		if err := st.Save(ctx, key, checkpoint.Snapshot{Next: int64(i), State: state}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		l, err := st.Load(ctx, key)
		if err != nil || l.Next != int64(i) || len(l.State) != len(state) {
			b.Fatalf("load: next %d, %d bytes, %v", l.Next, len(l.State), err)
		}
		save += t1.Sub(t0)
		load += time.Since(t1)
	}
	b.ReportMetric(save.Seconds()/float64(b.N), "s/save")
	b.ReportMetric(load.Seconds()/float64(b.N), "s/load")
	b.Logf("chunk size %d bytes", st.ChunkBytes())
}

// BenchmarkKafkaStoreSmallSave is the per-checkpoint cost of the kafka store
// for a small state (16 KiB), where the fixed costs show: the chunk and
// manifest produces, and the read of the manifest partition that fences an old
// owner. 64 other partitions save in between, as other partitions of a group
// would, so the fencing read has records to skip.
func BenchmarkKafkaStoreSmallSave(b *testing.B) {
	ctx := context.Background()
	st := openBenchStore(b)
	state := make([]byte, 16<<10)
	others := make([]checkpoint.Key, 64)
	for i := range others {
		others[i] = checkpoint.Key{Group: "bench", Topic: "transactions", Partition: int32(i + 1)}
	}
	key := checkpoint.Key{Group: "bench", Topic: "transactions", Partition: 0}
	var own time.Duration
	for i := 0; b.Loop(); i++ {
		for _, k := range others {
			if err := st.Save(ctx, k, checkpoint.Snapshot{Next: int64(i), State: state}); err != nil {
				b.Fatal(err)
			}
		}
		t0 := time.Now()
		if err := st.Save(ctx, key, checkpoint.Snapshot{Next: int64(i), State: state}); err != nil {
			b.Fatal(err)
		}
		own += time.Since(t0)
	}
	b.ReportMetric(own.Seconds()*1e3/float64(b.N), "ms/save")
}

// openBenchStore opens a kafka store on a new snapshot topic of the test broker,
// closed and deleted when b ends.
func openBenchStore(b *testing.B) *checkpoint.KafkaStore {
	b.Helper()
	addr := kafkatest.Broker(b)
	topic := kafkatest.Name(b, "snap")
	st, err := checkpoint.NewKafkaStore(context.Background(), checkpoint.KafkaConfig{Brokers: kafkatest.Seeds(addr), Topic: topic})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		st.Close()
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kafkatest.Admin(b, addr).DeleteTopic(c, topic)
	})
	return st
}
