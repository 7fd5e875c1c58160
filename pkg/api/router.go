package api

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Routing: which member of the consumer group owns a partition, and where its API is.
//
// Everything comes from Kafka. Each instance's group consumer sets its Kafka client id
// to ClientID(advertised URL) ("velocity-consumer;api=https://10.0.0.5:8081"), and
// DescribeGroups (kadm) returns, for every member, its client id and the partitions the
// group assigned it. The router asks for that (and the input topic's partition count)
// every RefreshEvery and whenever a lookup misses, and keeps the last answer.
//
// The table may be stale by up to one refresh; that costs an extra hop or a 503, never
// a wrong answer, because only a partition's registered worker answers for it (see
// pkg/service/query.go): a request forwarded to a member that no longer runs the
// partition gets 503 there, and a forwarded request is never forwarded again.

// RefreshEvery is how often the router re-reads the group.
const RefreshEvery = time.Second

const clientIDMark = ";api="

// ClientID is the Kafka client id that advertises url as an instance's API address.
func ClientID(url string) string { return "velocity-consumer" + clientIDMark + url }

// AdvertisedURL reads the API address from a member's client id (ok=false: the member
// advertises none, e.g. its --api-addr is off).
func AdvertisedURL(clientID string) (string, bool) {
	i := strings.LastIndex(clientID, clientIDMark)
	if i < 0 || i+len(clientIDMark) == len(clientID) {
		return "", false
	}
	return clientID[i+len(clientIDMark):], true
}

// Owner is the group member that owns a partition.
type Owner struct {
	MemberID string
	URL      string // "" when it advertises no API
}

type routes struct {
	partitions int32
	owners     map[int32]Owner
	stable     bool // the group was Stable when described
	err        error
	at         time.Time
}

// Router keeps the group's partition owners. Safe for concurrent use.
type Router struct {
	cl           *kgo.Client
	adm          *kadm.Client
	group, topic string

	mu   sync.RWMutex
	tab  routes
	poke chan struct{}
}

// NewRouter makes a router with its own admin client of the cluster (brokers and
// connection options as the service's).
func NewRouter(brokers []string, opts []kgo.Opt, group, topic string) (*Router, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("api router: %w", err)
	}
	return &Router{cl: cl, adm: kadm.NewClient(cl), group: group, topic: topic, poke: make(chan struct{}, 1)}, nil
}

// Run refreshes the table until ctx ends, then closes the router's client.
func (r *Router) Run(ctx context.Context) {
	defer r.cl.Close()
	tick := time.NewTicker(RefreshEvery)
	defer tick.Stop()
	for {
		r.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-r.poke:
			// At most one refresh per 200 ms however often lookups miss.
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// Poke asks for a refresh soon (a lookup found the table wrong).
func (r *Router) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

func (r *Router) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tab := routes{owners: map[int32]Owner{}, at: time.Now()}
	md, err := r.adm.Metadata(ctx, r.topic)
	if err == nil {
		td, ok := md.Topics[r.topic]
		switch {
		case !ok:
			err = fmt.Errorf("topic %s not in metadata", r.topic)
		case td.Err != nil:
			err = td.Err
		default:
			tab.partitions = int32(len(td.Partitions))
		}
	}
	if err == nil {
		var groups kadm.DescribedGroups
		groups, err = r.adm.DescribeGroups(ctx, r.group)
		if err == nil {
			g, ok := groups[r.group]
			switch {
			case !ok:
				err = fmt.Errorf("group %s not described", r.group)
			case g.Err != nil:
				err = g.Err
			default:
				tab.stable = g.State == "Stable"
				for _, m := range g.Members {
					url, _ := AdvertisedURL(m.ClientID)
					c, ok := m.Assigned.AsConsumer()
					if !ok {
						continue
					}
					for _, t := range c.Topics {
						if t.Topic != r.topic {
							continue
						}
						for _, p := range t.Partitions {
							tab.owners[p] = Owner{MemberID: m.MemberID, URL: url}
						}
					}
				}
			}
		}
	}
	if err != nil {
		r.mu.Lock()
		r.tab.err = err // keep the last good owners; report the failure
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	r.tab = tab
	r.mu.Unlock()
}

// Partitions is the input topic's partition count (ok=false until known).
func (r *Router) Partitions() (int32, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.tab.partitions, r.tab.partitions > 0
}

// Owner returns p's owner per the last description of the group; ok=false when the
// group gave p to no member (or was not described yet), stable=false while it was
// rebalancing.
func (r *Router) Owner(p int32) (o Owner, ok, stable bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	o, ok = r.tab.owners[p]
	return o, ok, r.tab.stable
}

// PartitionCounter and OwnerFinder are what the server needs of a Router.
type Locator interface {
	Partitions() (int32, bool)
	Owner(p int32) (o Owner, ok, stable bool)
	Poke()
}
