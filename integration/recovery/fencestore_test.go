//go:build integration

package recovery

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
)

// TestKafkaStoreFencesAnOldOwner plays on the real broker what a frozen
// instance does to the shared snapshot store: A owns a partition and saves; B
// is given the partition and claims it; A wakes up and saves again (twice, as
// a zombie whose checkpoint timer fired on thaw would). A's saves must fail
// with ErrFenced, and every reader, A's store handle included, must load B's
// snapshots, never A's late ones. The kafka store used to take the generation
// and previous snapshot from its memory, so A's late save replaced B's.
func TestKafkaStoreFencesAnOldOwner(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	ctx := kafkatest.Context(t, 2*time.Minute)
	topic := kafkatest.Name(t, "snap")
	adm := kafkatest.Admin(t, addr)
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopic(c, topic)
	})
	open := func() *checkpoint.KafkaStore {
		st, err := checkpoint.NewKafkaStore(ctx, checkpoint.KafkaConfig{Brokers: kafkatest.Seeds(addr), Topic: topic})
		if err != nil {
			t.Fatalf("open the kafka store: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, b := open(), open()
	key := checkpoint.Key{Group: "g", Topic: "in", Partition: 2}
	save := func(st checkpoint.Store, next int64, state string, epoch, seq uint64) error {
		return st.Save(ctx, key, checkpoint.Snapshot{Next: next, State: []byte(state), Epoch: epoch, Seq: seq})
	}

	ea, err := a.Claim(ctx, key, 1)
	if err != nil {
		t.Fatalf("A claims: %v", err)
	}
	for i, next := range []int64{100, 200} {
		if err := save(a, next, "a", ea, uint64(i+1)); err != nil {
			t.Fatalf("A saves %d: %v", next, err)
		}
	}
	eb, err := b.Claim(ctx, key, 2)
	if err != nil {
		t.Fatalf("B claims: %v", err)
	}
	l, err := b.Load(ctx, key)
	if err != nil || l.Next != 200 {
		t.Fatalf("B loads after its claim: next %d, %v; want A's last (200)", l.Next, err)
	}
	if err := save(b, 300, "b", eb, 1); err != nil {
		t.Fatalf("B saves: %v", err)
	}
	for _, next := range []int64{250, 260} {
		if err := save(a, next, "zombie", ea, 9); !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("A saves %d after B's claim: %v, want ErrFenced", next, err)
		}
	}
	if err := save(b, 400, "b", eb, 2); err != nil {
		t.Fatalf("B saves again: %v", err)
	}
	for name, st := range map[string]checkpoint.Store{"A": a, "B": b, "a fresh reader": open()} {
		l, err := st.Load(ctx, key)
		if err != nil {
			t.Fatalf("%s loads: %v", name, err)
		}
		if l.Next != 400 || string(l.State) != "b" || l.ID() != (checkpoint.ID{Epoch: eb, Seq: 2}) || l.Previous == nil || l.Previous.Next != 300 {
			t.Errorf("%s loads next %d %q id %+v previous %+v; want B's 400 with 300 before it", name, l.Next, l.State, l.ID(), l.Previous)
		}
	}
}

// TestKafkaStoreRidesOutABrokerRestart: the broker is killed while the store
// is in use and restarted 3 s later. A Save, a Claim and a Load issued while
// it is down must wait for it and succeed (within their context's bound), as
// a produce does, instead of failing on the first refused dial: the fencing
// reads that Save makes used to stop an exactly-once instance 0.7 s after a
// broker crash (the fault checker found it).
func TestKafkaStoreRidesOutABrokerRestart(t *testing.T) {
	t.Parallel()
	b := kafkatest.StartPrivateBroker(t)
	ctx := kafkatest.Context(t, 3*time.Minute)
	st, err := checkpoint.NewKafkaStore(ctx, checkpoint.KafkaConfig{Brokers: []string{b.Addr}, Topic: "snapshots"})
	if err != nil {
		t.Fatalf("open the kafka store: %v", err)
	}
	defer st.Close()
	key := checkpoint.Key{Group: "g", Topic: "in", Partition: 0}
	epoch, err := st.Claim(ctx, key, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Save(ctx, key, checkpoint.Snapshot{Next: 10, State: []byte("ten"), Epoch: epoch, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	b.Kill(t)
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(3 * time.Second)
		b.Restart(t)
	}()
	opCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := st.Save(opCtx, key, checkpoint.Snapshot{Next: 20, State: []byte("twenty"), Epoch: epoch, Seq: 2}); err != nil {
		t.Fatalf("Save while the broker restarts: %v", err)
	}
	<-restarted
	other, err := checkpoint.NewKafkaStore(ctx, checkpoint.KafkaConfig{Brokers: []string{b.Addr}, Topic: "snapshots"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Claim(opCtx, key, 2); err != nil {
		t.Fatalf("Claim after the restart: %v", err)
	}
	l, err := other.Load(opCtx, key)
	if err != nil || l.Next != 20 || string(l.State) != "twenty" {
		t.Fatalf("Load after the restart: next %d %q, %v; want the save made while the broker was down", l.Next, l.State, err)
	}
}
