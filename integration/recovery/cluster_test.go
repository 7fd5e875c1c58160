//go:build integration

package recovery

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

// TestServiceRidesOutClusterFaults: what TestServiceRidesOutBrokerFaults does to one
// broker, done to a node of a three-node cluster (replication factor 3,
// min.insync.replicas 2, every node a KRaft controller too), where the others carry
// on and the partitions' leadership, the group and transaction coordinators and the
// active controller move under the service's clients instead of coming back where
// they were:
//
//   - the group coordinator's node is killed, and restarted 2 s later;
//   - the transaction coordinator's node is killed, and restarted 2 s later;
//   - the node leading most input partitions is frozen (SIGSTOP) for 12 s, past the
//     brokers' 9 s session with the controller: the controller fences it and moves its
//     leadership while its clients' requests hang, and it wakes up a stale leader;
//   - two nodes are killed at once for 5 s: below min.insync.replicas nothing can be
//     produced or committed, and the controllers have no quorum, until they return.
//
// All land while the input is produced. The same groups as the single-broker test must
// ride them out without a fatal error and catch up, with every input offset's output
// (exactly one read_committed) byte-identical to a clean instance's.
func TestServiceRidesOutClusterFaults(t *testing.T) {
	c := kafkatest.StartPrivateCluster(t, 3)
	addr := c.Addr
	ctx := kafkatest.Context(t, 8*time.Minute)
	adm := kafkatest.Admin(t, addr)
	keep := map[string]string{"retention.ms": "-1"}
	input := kafkatest.CreateTopic(t, addr, recPartitions, keep)
	const n = 60_000
	recs := genStream(29, n)

	clean, alo, eos := faultScenarios(t, addr, input, nil)
	for _, in := range append(append([]*instance(nil), alo.instances...), eos.instances...) {
		in.start()
	}
	var progress atomic.Int64
	produced := make(chan error, 1)
	go func() { produced <- produce(ctx, addr, input, recs, 50*time.Second, &progress) }()

	restartAfter := func(d time.Duration, nodes ...int) {
		for _, i := range nodes {
			c.Nodes[i].Kill(t)
		}
		time.Sleep(d)
		for _, i := range nodes {
			c.Nodes[i].Restart(t)
		}
	}
	waitProgress(ctx, &progress, n/5)
	gc := leaderNode(t, ctx, adm, "__consumer_offsets", 0)
	restartAfter(2*time.Second, gc)
	t.Logf("node %d (group coordinator) killed at %d of %d records produced, restarted", gc+1, n/5, n)

	waitProgress(ctx, &progress, 2*n/5)
	tc := leaderNode(t, ctx, adm, "__transaction_state", 0)
	restartAfter(2*time.Second, tc)
	t.Logf("node %d (transaction coordinator) killed at %d of %d records produced, restarted", tc+1, 2*n/5, n)

	waitProgress(ctx, &progress, 3*n/5)
	busiest := busiestLeader(t, ctx, adm, input)
	c.Nodes[busiest].Freeze(t)
	time.Sleep(12 * time.Second) // broker.session.timeout.ms is 9s
	c.Nodes[busiest].Thaw(t)
	t.Logf("node %d (leader of most input partitions) frozen for 12s at %d of %d records produced", busiest+1, 3*n/5, n)

	waitProgress(ctx, &progress, 4*n/5)
	two := []int{(busiest + 1) % 3, (busiest + 2) % 3}
	restartAfter(5*time.Second, two...)
	t.Logf("nodes %d and %d killed together for 5s at %d of %d records produced, restarted", two[0]+1, two[1]+1, 4*n/5, n)

	if err := <-produced; err != nil {
		t.Fatalf("produce the input: %v", err)
	}
	checkRodeOut(t, ctx, addr, input, clean, alo, eos)
}

// leaderNode is the index in the cluster's Nodes of the leader of topic's partition p,
// waiting for one while the partition has none.
func leaderNode(t *testing.T, ctx context.Context, adm *kadm.Client, topic string, p int32) int {
	t.Helper()
	for {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			if pd, ok := md.Topics[topic].Partitions[p]; ok && pd.Err == nil && pd.Leader > 0 {
				return int(pd.Leader) - 1
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no leader of %s[%d]: %v (last error: %v)", topic, p, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// busiestLeader is the index in the cluster's Nodes of the node leading most of
// topic's partitions.
func busiestLeader(t *testing.T, ctx context.Context, adm *kadm.Client, topic string) int {
	t.Helper()
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	led := map[int32]int{}
	best := int32(1)
	for _, pd := range md.Topics[topic].Partitions {
		if pd.Leader > 0 {
			led[pd.Leader]++
			if led[pd.Leader] > led[best] {
				best = pd.Leader
			}
		}
	}
	return int(best) - 1
}
