//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/oracle"
	"github.com/velocity-consumer/velocity-consumer/pkg/api"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// apiInstance is one member of the group with its query API, as `run --api-addr`
// wires them (cmd/velocity-consumer/apiserve.go), in process.
type apiInstance struct {
	name string
	url  string
	svc  *service.Service
	stop func()
}

func startAPIInstance(t *testing.T, cfg service.Config, name string) *apiInstance {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	cfg.ClientOpts = append(append([]kgo.Opt(nil), cfg.ClientOpts...), kgo.ClientID(api.ClientID(u)))
	cfg.Host = name
	svc, err := service.New(cfg, zaptest.NewLogger(t).Named(name), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	router, err := api.NewRouter(cfg.Brokers, cfg.ClientOpts, cfg.Group, cfg.InputTopic)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Backend: svc, Locator: router, Log: zaptest.NewLogger(t).Named(name + "-api")})
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	svcDone, routerDone := make(chan error, 1), make(chan struct{})
	go func() { svcDone <- svc.Run(ctx) }()
	go func() { router.Run(ctx); close(routerDone) }()
	go func() { _ = hs.Serve(ln) }()
	var once sync.Once
	in := &apiInstance{name: name, url: u, svc: svc}
	in.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-svcDone:
				if err != nil {
					t.Errorf("service %s: %v", name, err)
				}
			case <-time.After(60 * time.Second):
				t.Errorf("service %s did not shut down within 60s", name)
			}
			_ = hs.Close()
			<-routerDone
		})
	}
	t.Cleanup(in.stop)
	return in
}

// apiVelocity is the part of GET .../velocity's answer the test checks.
type apiVelocity struct {
	EntityID   string `json:"entity_id"`
	Known      bool   `json:"known"`
	Partition  int32  `json:"partition"`
	AsOf       int64  `json:"as_of"`
	LastOffset int64  `json:"last_offset"`
	Pending    int    `json:"pending"`
	Windows    []struct {
		Window   string `json:"window"`
		Count    int64  `json:"count"`
		SumMinor int64  `json:"sum_minor"`
		MinMinor int64  `json:"min_minor"`
		MaxMinor int64  `json:"max_minor"`
	} `json:"windows"`
}

var apiClient = &http.Client{Timeout: 10 * time.Second}

func getVelocity(base, entity string) (int, apiVelocity, error) {
	var v apiVelocity
	resp, err := apiClient.Get(base + "/v1/entities/" + url.PathEscape(entity) + "/velocity")
	if err != nil {
		return 0, v, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		err = json.Unmarshal(body, &v)
	} else if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
		err = errors.New("503 without Retry-After")
	}
	return resp.StatusCode, v, err
}

// apiStream is a seeded stream of keyed transactions, produced by franz-go's default
// partitioner (Kafka's murmur2), with what the oracle needs per partition.
type apiStream struct {
	specs    []window.Spec
	entities []string
	mu       sync.Mutex
	byPart   map[int32][]oracle.Event // offset order
}

func (s *apiStream) produce(t *testing.T, addr, topic string, seed uint64, n int, from time.Time) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 23))
	now := from.UnixMilli()
	recs := make([]*kgo.Record, 0, n)
	txs := make([]codec.Transaction, 0, n)
	for i := range n {
		now += rng.Int64N(40)
		tx := codec.Transaction{
			EventID: fmt.Sprintf("id-%d-%d", seed, i), EntityID: s.entities[rng.IntN(len(s.entities))],
			AmountMinor: rng.Int64N(100_000), Currency: "EUR", EventTime: now,
		}
		switch r := rng.Float64(); {
		case r < 0.03:
			tx.EventTime -= 2_000 + rng.Int64N(5_000) // late (lateness 0): dead-lettered, not counted
		case r < 0.05 && i > 0:
			tx.EventID = txs[rng.IntN(len(txs))].EventID // a resend: a duplicate if on the same partition
		}
		txs = append(txs, tx)
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)})
	}
	cl := kafkatest.Client(t, addr) // the default partitioner: murmur2 of the key
	if err := kafkatest.Produce(kafkatest.Context(t, 60*time.Second), cl, recs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range recs {
		s.byPart[r.Partition] = append(s.byPart[r.Partition], oracle.Event{
			Offset: r.Offset, Time: txs[i].EventTime, Amount: txs[i].AmountMinor, ID: txs[i].EventID, Entity: txs[i].EntityID,
		})
	}
	for p := range s.byPart {
		evs := s.byPart[p]
		for i := 1; i < len(evs); i++ {
			if evs[i].Offset < evs[i-1].Offset {
				t.Fatalf("partition %d: produced out of offset order", p)
			}
		}
	}
}

// check compares one answer with the oracle: the windows recomputed from the
// partition's records up to the answer's last_offset, at its as_of, which must be
// the newest counted event time among them.
func (s *apiStream) check(t *testing.T, v apiVelocity, partitions int32) error {
	s.mu.Lock()
	evs := s.byPart[v.Partition]
	s.mu.Unlock()
	if want := api.PartitionOf(v.EntityID, partitions); v.Partition != want {
		return fmt.Errorf("%s: partition %d, murmur2 says %d", v.EntityID, v.Partition, want)
	}
	if len(evs) == 0 || v.LastOffset > evs[len(evs)-1].Offset {
		return errNotYetKnown // records whose produce has not returned to the test yet
	}
	var upTo []oracle.Event
	for _, e := range evs {
		if e.Offset <= v.LastOffset {
			upTo = append(upTo, e)
		}
	}
	if v.Pending != 0 {
		return fmt.Errorf("%s: %d pending with lateness 0", v.EntityID, v.Pending)
	}
	counted := oracle.Counted(oracle.Config{Specs: s.specs, Partition: v.Partition}, upTo)
	if len(counted) > 0 && v.AsOf != counted[len(counted)-1].Time {
		return fmt.Errorf("%s: as_of %d, newest counted event time %d (up to offset %d)", v.EntityID, v.AsOf, counted[len(counted)-1].Time, v.LastOffset)
	}
	want := oracle.WindowsAt(s.specs, counted, v.EntityID, v.AsOf)
	if len(v.Windows) != len(want) {
		return fmt.Errorf("%s: %d windows, want %d", v.EntityID, len(v.Windows), len(want))
	}
	known := false
	for _, e := range counted {
		known = known || e.Entity == v.EntityID
	}
	if v.Known != known {
		return fmt.Errorf("%s: known=%v, oracle %v", v.EntityID, v.Known, known)
	}
	for i, w := range want {
		g := v.Windows[i]
		if g.Window != w.Name || g.Count != w.Count || g.SumMinor != w.SumMinor || g.MinMinor != w.MinMinor || g.MaxMinor != w.MaxMinor {
			return fmt.Errorf("%s at %d (offset %d) window %s: got %+v, oracle %+v", v.EntityID, v.AsOf, v.LastOffset, w.Name, g, w)
		}
	}
	return nil
}

// errNotYetKnown: an answer reflects records the test has not recorded yet (their
// produce call is still returning); it cannot be checked.
var errNotYetKnown = errors.New("answer reflects records not yet recorded")

// lastOffsets is the last produced offset of every partition.
func (s *apiStream) lastOffsets() map[int32]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int32]int64{}
	for p, evs := range s.byPart {
		out[p] = evs[len(evs)-1].Offset
	}
	return out
}

// checkAll asks every instance for every entity (and one never seen) until each
// answer reflects everything produced, and checks each against the oracle.
func (s *apiStream) checkAll(t *testing.T, instances []*apiInstance, partitions int32, timeout time.Duration) {
	t.Helper()
	last := s.lastOffsets()
	deadline := time.Now().Add(timeout)
	for _, in := range instances {
		for _, ent := range append(append([]string(nil), s.entities...), "never-seen-card") {
			for {
				code, v, err := getVelocity(in.url, ent)
				if err != nil {
					t.Fatalf("%s asked for %s: %v", in.name, ent, err)
				}
				if code == http.StatusOK {
					if err := s.check(t, v, partitions); err != nil {
						t.Fatalf("%s: %v", in.name, err)
					}
					if v.LastOffset >= last[v.Partition] {
						break
					}
				} else if code != http.StatusServiceUnavailable {
					t.Fatalf("%s asked for %s: status %d", in.name, ent, code)
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s asked for %s: not caught up after %v (status %d, last_offset %d, want %d)", in.name, ent, timeout, code, v.LastOffset, last[v.Partition])
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// TestQueryAPIThreeInstances runs three members of one group on the real broker, each
// with its query API, and asks every instance for every entity of a seeded stream
// before, during and after a rebalance (one member leaves, then another joins): every
// 200 answer must equal the as-of aggregates recomputed from the records it says it
// reflects; while partitions move, only 503 with Retry-After may come instead.
func TestQueryAPIThreeInstances(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	const partitions = 6
	in, out, dlq := liveTopics(t, addr, partitions)
	group := kafkatest.Group(t)
	openStore := func() checkpoint.Store {
		st, err := checkpoint.NewKafkaStore(context.Background(), checkpoint.KafkaConfig{
			Brokers: kafkatest.Seeds(addr), Topic: "__velocity-snapshots-" + group,
		})
		if err != nil {
			t.Fatalf("kafka store: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	cfg := liveConfig(t, addr, in, out, dlq, nil)
	cfg.Group = group
	s := &apiStream{specs: cfg.Specs, byPart: map[int32][]oracle.Event{}}
	for i := range 60 {
		s.entities = append(s.entities, fmt.Sprintf("card-%03d", i))
	}
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)

	var insts []*apiInstance
	for _, name := range []string{"a", "b", "c"} {
		c := cfg
		c.Store = openStore()
		insts = append(insts, startAPIInstance(t, c, name))
	}
	waitUntil(t, "the three instances share the partitions", 60*time.Second, func() bool {
		n := 0
		for _, x := range insts {
			if x.svc.Assigned() == 0 {
				return false
			}
			n += x.svc.Assigned()
		}
		return n == partitions
	})
	s.produce(t, addr, in, 1, 3000, start)
	s.checkAll(t, insts, partitions, 60*time.Second) // before

	// During: c leaves and d joins while records keep coming and lookups go on.
	var (
		stopAsk         = make(chan struct{})
		asked, ok, u503 atomic.Int64
		unchecked       atomic.Int64
		askErr          = make(chan error, 1)
		askers          sync.WaitGroup
	)
	for _, x := range insts[:2] {
		askers.Add(1)
		go func() {
			defer askers.Done()
			for i := 0; ; i++ {
				select {
				case <-stopAsk:
					return
				default:
				}
				code, v, err := getVelocity(x.url, s.entities[i%len(s.entities)])
				asked.Add(1)
				if err == nil {
					switch code {
					case http.StatusOK:
						if err = s.check(t, v, partitions); errors.Is(err, errNotYetKnown) {
							err = nil
							unchecked.Add(1)
						} else {
							ok.Add(1)
						}
					case http.StatusServiceUnavailable:
						u503.Add(1)
					default:
						err = fmt.Errorf("status %d", code)
					}
				}
				if err != nil {
					select {
					case askErr <- fmt.Errorf("%s during the rebalance: %w", x.name, err):
					default:
					}
					return
				}
			}
		}()
	}
	// In small pieces, so that the test's record of what was produced keeps up with
	// what the answers reflect.
	produceIn := func(seed uint64, from time.Time) {
		for i := range uint64(15) {
			s.produce(t, addr, in, seed*100+i, 100, from.Add(time.Duration(i)*100*20*time.Millisecond))
		}
	}
	produceIn(2, start.Add(3000*20*time.Millisecond))
	insts[2].stop()
	d := cfg
	d.Store = openStore()
	insts = append(insts[:2], startAPIInstance(t, d, "d"))
	produceIn(3, start.Add(4500*20*time.Millisecond+time.Minute))
	waitUntil(t, "a, b and d share the partitions", 60*time.Second, func() bool {
		n := 0
		for _, x := range insts {
			n += x.svc.Assigned()
		}
		return n == partitions && insts[2].svc.Assigned() > 0
	})
	time.Sleep(2 * time.Second)
	close(stopAsk)
	askers.Wait()
	select {
	case err := <-askErr:
		t.Fatal(err)
	default:
	}
	t.Logf("during the rebalance: %d lookups, %d answered and equal to the oracle, %d answered ahead of the test's record of what was produced (not checked), %d 503",
		asked.Load(), ok.Load(), unchecked.Load(), u503.Load())
	if ok.Load() == 0 {
		t.Fatal("no lookup answered during the rebalance")
	}

	s.checkAll(t, insts, partitions, 90*time.Second) // after
}
