//go:build integration

package recovery

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

// TestFrozenInstanceAnswersNoStaleReads: an instance frozen (SIGSTOP) past its
// session timeout while the stream runs loses its partitions to the other
// instance, which goes on and commits past where the frozen one stopped. When it
// wakes up, the frozen one must not answer a lookup of those partitions from
// its old state (docs/api.md, "Answering"): every 200 it gives reflects every
// offset the group had committed before the request was sent. The requests are
// sent to it while it is frozen, once the new owner has committed past its
// state, so that they wait in its listener's queue and are served the moment it
// wakes up, before its first heartbeat tells it that it lost the partitions.
// A 503 must carry Retry-After; no other server error may come.
func TestFrozenInstanceAnswersNoStaleReads(t *testing.T) {
	inBothModes(t, func(t *testing.T, _ string, eos bool) {
		frozenStaleReads(t, eos)
	})
}

func frozenStaleReads(t *testing.T, eos bool) {
	r := newRig(t, 3*time.Minute)
	sc := r.group("zombie", eos, "kafka")
	ports := kafkatest.FreePorts(t, 2)
	urls := []string{"http://127.0.0.1:" + strconv.Itoa(ports[0]), "http://127.0.0.1:" + strconv.Itoa(ports[1])}
	a := newInstance(t, r.bin, "a", r.args(sc, "--api-addr", "127.0.0.1:"+strconv.Itoa(ports[0])))
	b := newInstance(t, r.bin, "b", r.args(sc, "--api-addr", "127.0.0.1:"+strconv.Itoa(ports[1])))
	sc.instances = []*instance{a, b}
	a.start()
	b.start()
	defer func() {
		b.signal(syscall.SIGCONT)
		a.kill(syscall.SIGTERM)
		b.kill(syscall.SIGTERM)
	}()
	var progress atomic.Int64
	produced := make(chan error, 1)
	go func() { produced <- produce(r.ctx, r.addr, r.input, genStream(17, 45_000), 30*time.Second, &progress) }()

	// b's partitions, once the group is stable with both members.
	var mine []int32
	for mine == nil {
		if r.ctx.Err() != nil {
			t.Fatal("the group did not settle with both instances")
		}
		time.Sleep(200 * time.Millisecond)
		groups, err := r.adm.DescribeGroups(r.ctx, sc.group)
		if err != nil {
			continue
		}
		g := groups[sc.group]
		if g.State != "Stable" || len(g.Members) != 2 {
			continue
		}
		for _, m := range g.Members {
			if c, ok := m.Assigned.AsConsumer(); ok && strings.HasSuffix(m.ClientID, urls[1]) {
				for _, tp := range c.Topics {
					mine = append(mine, tp.Partitions...)
				}
			}
		}
	}
	if len(mine) == 0 {
		t.Fatalf("the group gave b no partition")
	}
	// A probe id per partition of b's: the API looks an id up in the partition
	// Kafka's default partitioner gives it, whether or not it was ever produced.
	probes := map[int32][]string{}
	for i := 0; len(probes) < len(mine) || anyShort(probes, mine, 5); i++ {
		id := fmt.Sprintf("probe-%d", i)
		p := int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(id)}, recPartitions))
		probes[p] = append(probes[p], id)
	}
	// b answers for them before the freeze.
	waitProgress(r.ctx, &progress, 10_000)
	for _, p := range mine {
		for {
			if st, _, _ := lookup(http.DefaultClient, urls[1], probes[p][0]); st == http.StatusOK {
				break
			}
			if r.ctx.Err() != nil {
				t.Fatalf("b never answered for its partition %d", p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	b.signal(syscall.SIGSTOP)
	// Whatever b had processed is below the input's end now.
	frozenAt := endOffsets(t, r.ctx, r.adm, r.input)
	// The new owner commits past it: every request sent from then on that b
	// answers from its state is stale.
	var floor map[int32]int64
	for floor == nil {
		if r.ctx.Err() != nil {
			t.Fatal("the group did not commit past the frozen instance's state")
		}
		time.Sleep(200 * time.Millisecond)
		resp, err := r.adm.FetchOffsetsForTopics(r.ctx, sc.group, r.input)
		if err != nil {
			continue
		}
		past := map[int32]int64{}
		for _, p := range mine {
			if o, ok := resp.Lookup(r.input, p); ok && o.Err == nil && o.At > frozenAt[p] {
				past[p] = o.At
			}
		}
		if len(past) == len(mine) {
			floor = past
		}
	}
	client := &http.Client{Timeout: time.Minute}
	type answer struct {
		p      int32
		status int
		retry  string
		last   int64
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	for _, p := range mine {
		for _, id := range probes[p][:5] {
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, retry, last := lookup(client, urls[1], id)
					mu.Lock()
					answers = append(answers, answer{p: p, status: st, retry: retry, last: last})
					mu.Unlock()
				}()
			}
		}
	}
	time.Sleep(500 * time.Millisecond) // the connections wait in b's listener queue
	b.signal(syscall.SIGCONT)
	wg.Wait()
	if err := <-produced; err != nil {
		t.Fatalf("produce: %v", err)
	}

	stale, ok, unavailable := 0, 0, 0
	var first string
	for _, an := range answers {
		switch {
		case an.status == http.StatusOK:
			ok++
			if an.last+1 < floor[an.p] {
				stale++
				if first == "" {
					first = fmt.Sprintf("partition %d: last_offset %d, but the group had committed %d before the request was sent (the input's end at the freeze: %d)",
						an.p, an.last, floor[an.p], frozenAt[an.p])
				}
			}
		case an.status == http.StatusServiceUnavailable:
			unavailable++
			if an.retry == "" {
				t.Errorf("partition %d: a 503 without Retry-After", an.p)
			}
		case an.status >= 500:
			t.Errorf("partition %d: status %d", an.p, an.status)
		}
	}
	t.Logf("%d requests to the thawed instance: %d answered 200 (%d from its state before the freeze), %d 503, %d without an answer",
		len(answers), ok, stale, unavailable, len(answers)-ok-unavailable)
	if stale > 0 {
		t.Errorf("%d of %d answers came from the thawed instance's state before the freeze; first: %s; its log: %s", stale, len(answers), first, b.logs)
	}
	if !b.running() {
		t.Errorf("the thawed instance stopped; end of its log:\n%s", tailLog(b.logs, 20))
	}
}

func anyShort(m map[int32][]string, parts []int32, n int) bool {
	for _, p := range parts {
		if len(m[p]) < n {
			return true
		}
	}
	return false
}

// lookup is GET /v1/entities/{id}/velocity: its status (0: no answer),
// Retry-After and, for a 200, its last_offset.
func lookup(c *http.Client, base, id string) (status int, retry string, last int64) {
	resp, err := c.Get(base + "/v1/entities/" + id + "/velocity")
	if err != nil {
		return 0, "", 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var v struct {
		LastOffset int64 `json:"last_offset"`
	}
	if resp.StatusCode == http.StatusOK {
		_ = json.Unmarshal(body, &v)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), v.LastOffset
}
