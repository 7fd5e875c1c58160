package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// PrivateCluster is a cluster of several brokers that one test owns, each a combined
// KRaft broker and controller started by scripts/kafka-local.sh on free ports with its
// state in the test's temporary directory. Topics and the internal topics have three
// replicas (fewer with fewer nodes) and min.insync.replicas 2, as in production, so a
// test can kill, freeze or restart one node while the others carry on: partition
// leaders, the group and transaction coordinators and the active controller move.
type PrivateCluster struct {
	Addr  string           // every node's address, comma-separated (bootstrap list)
	Nodes []*PrivateBroker // node i has node.id i+1
	Links []*Link          // WithLinks: paths to every node that the test can cut
}

// A ClusterOption configures StartPrivateCluster.
type ClusterOption func(*clusterOptions)

type clusterOptions struct{ links int }

// WithLinks gives the cluster k Links: network paths of their own to every node, for
// clients whose connection to the cluster a test cuts and heals (Link).
func WithLinks(k int) ClusterOption { return func(o *clusterOptions) { o.links = k } }

// StartPrivateCluster starts a cluster of n nodes (n ≥ 1) for t alone and stops it when
// t ends. It needs what StartPrivateBroker needs. A cluster of one node is a single
// broker like StartPrivateBroker's (replication factor 1).
func StartPrivateCluster(t testing.TB, n int, opts ...ClusterOption) *PrivateCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("kafkatest: a cluster of %d nodes", n)
	}
	var o clusterOptions
	for _, f := range opts {
		f(&o)
	}
	script := privateScript(t)
	ports := FreePorts(t, (2+o.links)*n)
	linkPort := func(node, link int) int { return ports[2*n+node*o.links+link] }
	// proxies[node][link] forwards to node's listener of link.
	proxies := make([][]*proxy, n)
	c := &PrivateCluster{}
	for j := range o.links {
		l := &Link{}
		var addrs []string
		for i := range n {
			p, err := listenProxy()
			if err != nil {
				t.Fatalf("kafkatest: link proxy: %v", err)
			}
			t.Cleanup(p.close)
			p.serve("127.0.0.1:" + strconv.Itoa(linkPort(i, j)))
			proxies[i] = append(proxies[i], p)
			l.proxies = append(l.proxies, p)
			addrs = append(addrs, p.addr())
		}
		l.Addr = strings.Join(addrs, ",")
		c.Links = append(c.Links, l)
	}
	id := clusterID()
	var voters []string
	for i := range n {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, ports[2*i+1]))
	}
	env := []string{
		"KAFKA_CLUSTER_ID=" + id,
		"KAFKA_QUORUM_VOTERS=" + strings.Join(voters, ","),
		"KAFKA_REPLICATION=" + strconv.Itoa(min(n, 3)),
	}
	var addrs []string
	for i := range n {
		b := newPrivateBroker(t, script, ports[2*i], ports[2*i+1], func(state string) []string {
			env := append(env, "KAFKA_NODE_ID="+strconv.Itoa(i+1))
			if o.links == 0 {
				return env
			}
			// Later keys win in a properties file: these replace the script's
			// listeners with its own two and one per link, advertised at the
			// link's proxy.
			listeners := []string{fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", ports[2*i]), fmt.Sprintf("CONTROLLER://127.0.0.1:%d", ports[2*i+1])}
			advertised := []string{fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", ports[2*i])}
			protocols := []string{"PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"}
			for j := range o.links {
				name := fmt.Sprintf("LINK%d", j)
				listeners = append(listeners, fmt.Sprintf("%s://127.0.0.1:%d", name, linkPort(i, j)))
				advertised = append(advertised, name+"://"+proxies[i][j].addr())
				protocols = append(protocols, name+":PLAINTEXT")
			}
			props := filepath.Join(state, "links.properties")
			conf := "listeners=" + strings.Join(listeners, ",") + "\nadvertised.listeners=" + strings.Join(advertised, ",") +
				"\nlistener.security.protocol.map=" + strings.Join(protocols, ",") + "\n"
			if err := os.WriteFile(props, []byte(conf), 0o644); err != nil {
				t.Fatalf("kafkatest: %v", err)
			}
			return append(env, "KAFKA_EXTRA_PROPERTIES="+props)
		})
		c.Nodes = append(c.Nodes, b)
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(ports[2*i]))
	}
	c.Addr = strings.Join(addrs, ",")
	// Together: no node opens its client port before a quorum of the controllers is up.
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, b := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.launchErr(ctx, "start")
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("kafkatest: cluster node %d: %v", i+1, err)
		}
	}
	return c
}

// WaitInSync waits until every replica of every partition of the cluster is in its
// partition's in-sync set again (no under-replicated partition), as an operator waits
// between the nodes of a rolling restart, or until d has passed; it reports which.
func (c *PrivateCluster) WaitInSync(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(Seeds(c.Addr)...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	last := "no answer yet"
	for {
		md, err := adm.Metadata(ctx)
		if err == nil {
			last = ""
			for _, td := range md.Topics.Sorted() {
				for _, pd := range td.Partitions.Sorted() {
					if pd.Err != nil || len(pd.ISR) < len(pd.Replicas) {
						last = fmt.Sprintf("%s[%d] in sync %v of replicas %v (%v)", td.Topic, pd.Partition, pd.ISR, pd.Replicas, pd.Err)
						break
					}
				}
				if last != "" {
					break
				}
			}
			if last == "" {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replicas not in sync after %s: %s", d, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// clusterID is a new Kafka cluster id: 16 random bytes, URL-safe base64 without padding,
// not beginning with '-' (the storage tool would read it as an option).
func clusterID() string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:])
		if id := base64.RawURLEncoding.EncodeToString(b[:]); id[0] != '-' {
			return id
		}
	}
}
