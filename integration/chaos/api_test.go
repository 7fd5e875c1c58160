//go:build integration

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// The query API under the schedule: every instance serves it on a port of its
// slot (the same port across its restarts), a querier sends lookups to random
// slots during the whole run, and a poller keeps a timeline of each group's
// committed offsets. The answers are judged after the replay (apicheck_test.go).

// Querier's rate and patience. The rate is per group; the timeout is longer than
// the longest freeze of a schedule (--session-timeout + 5 s), so that a request a
// frozen instance holds is answered when it wakes and is judged like any other.
const (
	queryEvery   = 40 * time.Millisecond // 25 requests/s per group
	queryTimeout = 15 * time.Second
	maxInFlight  = 400 // per group; a tick beyond it is skipped (and counted)
	commitPoll   = 250 * time.Millisecond
)

// freePort finds a TCP port on 127.0.0.1 that nothing listens on, below the
// kernel's ephemeral range (32768 and up on Linux): a port of that range that
// an instance gives up while it is down (killed, or between a SIGTERM and its
// restart) may be taken by any client's outgoing connection meanwhile, and the
// instance would then not start again.
func freePort(rng *rand.Rand, taken map[int]bool) (int, error) {
	for range 200 {
		port := 20000 + rng.IntN(12000)
		if taken[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		taken[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port on 127.0.0.1 in 20000-31999 after 200 tries")
}

// endpoint is one of the API's reads the querier sends.
type endpoint int

const (
	epVelocity endpoint = iota // GET /v1/entities/{id}/velocity
	epFeatures                 // GET /v1/entities/{id}/features (under a definition)
	epGroup                    // GET /v1/groups/{in-place group}/entities/{id}/features (under a definition with groups)
	epRekeyed                  // GET /v1/groups/{re-keyed group}/entities/{key}/features
	epTxn                      // POST /v1/transaction/features: every group's key of one transaction
	epBatch                    // POST /v1/velocity:batch: several entities' velocity
	epPreview                  // POST /v1/entities/{id}/velocity:preview: a hypothetical transaction
)

func (e endpoint) String() string {
	return [...]string{"velocity", "features", "group", "rekeyed", "transaction", "batch", "preview"}[e]
}

// rekeyedTarget is a re-keyed group the querier asks, and how it draws keys.
type rekeyedTarget struct {
	name string
	pick func(*rand.Rand) string
}

// apiRequest is one request the querier sent and what came back.
type apiRequest struct {
	mode   string // the group's: default or eos
	slot   int
	ep     endpoint
	group  string // epRekeyed: the re-keyed group
	entity string // the entity id, or the re-keyed group's key
	// keys are a transaction call's (epTxn): by group, the key asked, or
	// nil for a null one (which leaves the group out of the answer).
	keys map[string]*string
	ids  []string // a batch's entity ids, in request order (epBatch)
	// preview is the hypothetical transaction of a preview (epPreview).
	preview *previewTx
	at      *int64 // ?at=, or a batch's at: Unix ms (nil: the default as_of)
	// windows, for a velocity lookup with ?window=, are the windows the
	// answer must hold, in that order: indices into the velocity endpoint's
	// windows, as asked, each once (nil: every window, in configured order).
	windows      []int
	windowsAsked []string // a batch's windows field, as sent
	url          string
	sent         time.Time // just before the request was handed to the client
	answered     time.Time
	err          string // a transport error (refused, timed out, reset): no answer
	status       int
	retry        string // Retry-After
	ctype        string // Content-Type
	body         []byte
}

// previewTx is a preview's body: an amount, an event time and, or not, an
// event id.
type previewTx struct {
	amount, eventTime int64
	eventID           *string
}

// querier sends lookups for one group at a steady rate to random slots, live or
// not, until stopped.
type querier struct {
	mode    string
	bases   [slots]string // http://127.0.0.1:<port> of each slot
	eps     []endpoint
	group   string // the in-place group's name on /v1/groups/... (epGroup)
	pick    func(*rand.Rand) string
	rekeyed []rekeyedTarget // asked as often as each endpoint of eps
	txn     bool            // also the transaction call, with the in-place group and every re-keyed one
	// windowNames are the velocity endpoint's windows, in configured order,
	// which ?window= names.
	windowNames []string
	// previews: also the velocity endpoint's preview, with event ids drawn up
	// to lastSeq's (duplicates, where accepted).
	previews bool
	lastSeq  func() int64
	// recent is the latest default as_of answered so far: where ?at= reads
	// are drawn around (0: none yet, no ?at=).
	recent  atomic.Int64
	rng     *rand.Rand
	client  *http.Client
	mu      sync.Mutex
	reqs    []*apiRequest
	skipped int
	wg      sync.WaitGroup
	stop    chan struct{}
	done    chan struct{}
	halted  sync.Once
}

func newQuerier(mode string, bases [slots]string, eps []endpoint, group string, pick func(*rand.Rand) string, rekeyed []rekeyedTarget, seed uint64) *querier {
	return &querier{
		mode: mode, bases: bases, eps: eps, group: group, pick: pick, rekeyed: rekeyed,
		rng: rand.New(rand.NewPCG(seed, 0x717565727920)),
		client: &http.Client{Timeout: queryTimeout, Transport: &http.Transport{
			MaxIdleConnsPerHost: 8, IdleConnTimeout: 30 * time.Second,
			DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		}},
		stop: make(chan struct{}), done: make(chan struct{}),
	}
}

func (q *querier) path(ep endpoint, group, entity string) string {
	id := url.PathEscape(entity)
	switch ep {
	case epFeatures:
		return "/v1/entities/" + id + "/features"
	case epGroup:
		return "/v1/groups/" + url.PathEscape(q.group) + "/entities/" + id + "/features"
	case epRekeyed:
		return "/v1/groups/" + url.PathEscape(group) + "/entities/" + id + "/features"
	case epTxn:
		return "/v1/transaction/features"
	case epBatch:
		return "/v1/velocity:batch"
	case epPreview:
		return "/v1/entities/" + id + "/velocity:preview"
	}
	return "/v1/entities/" + id + "/velocity"
}

// run sends a request every queryEvery, each on a goroutine of its own, until
// halt; then it waits for those in flight.
func (q *querier) run() {
	defer close(q.done)
	tick := time.NewTicker(queryEvery)
	defer tick.Stop()
	inFlight := make(chan struct{}, maxInFlight)
	for {
		select {
		case <-q.stop:
			q.wg.Wait()
			return
		case <-tick.C:
		}
		slot := q.rng.IntN(slots)
		var ep endpoint
		var group, entity string
		var keys map[string]*string
		n := len(q.eps) + len(q.rekeyed)
		if q.txn {
			n++
		}
		var ids []string
		var preview *previewTx
		switch i := q.rng.IntN(n); {
		case i < len(q.eps) && q.eps[i] == epVelocity && q.previews && q.recent.Load() > 0 && q.rng.IntN(5) == 0:
			// One velocity read in five is a preview:
			// an event time around the latest as_of answered (late, waiting
			// or released at once), one in twenty more than --max-ahead ahead
			// (invalid); no event id, a new one, or one the generator gave
			// a record (a duplicate where the partition accepted it).
			ep, entity = epPreview, q.pick(q.rng)
			pv := &previewTx{amount: q.rng.Int64N(50_000), eventTime: q.recent.Load() - 3000 + q.rng.Int64N(6000)}
			if q.rng.IntN(20) == 0 {
				pv.eventTime = q.recent.Load() + 25*3600*1000
			}
			switch q.rng.IntN(4) {
			case 2:
				id := fmt.Sprintf("pv-%d", q.rng.Int64())
				pv.eventID = &id
			case 3:
				id := fmt.Sprintf("ev-%08d", 1+q.rng.Int64N(max(1, q.lastSeq())))
				pv.eventID = &id
			}
			preview = pv
		case i < len(q.eps) && q.eps[i] == epVelocity && q.rng.IntN(5) == 0:
			// One velocity read in five is a batch of 2-6 entities, at times
			// one of them twice.
			ep = epBatch
			for range 2 + q.rng.IntN(5) {
				ids = append(ids, q.pick(q.rng))
			}
			if q.rng.IntN(4) == 0 {
				ids = append(ids, ids[q.rng.IntN(len(ids))])
			}
		case i < len(q.eps):
			ep, entity = q.eps[i], q.pick(q.rng)
		case i < len(q.eps)+len(q.rekeyed):
			t := q.rekeyed[i-len(q.eps)]
			ep, group, entity = epRekeyed, t.name, t.pick(q.rng)
		default:
			// Keys drawn each on its own (a transaction of the input has one
			// of each, but any combination is a valid call), one in six of
			// the re-keyed ones null: the group is then left out.
			ep, keys = epTxn, map[string]*string{}
			e := q.pick(q.rng)
			keys[q.group] = &e
			for _, t := range q.rekeyed {
				if q.rng.IntN(6) == 0 {
					keys[t.name] = nil
					continue
				}
				k := t.pick(q.rng)
				keys[t.name] = &k
			}
		}
		select {
		case inFlight <- struct{}{}:
		default:
			q.mu.Lock()
			q.skipped++
			q.mu.Unlock()
			continue
		}
		req := &apiRequest{mode: q.mode, slot: slot, ep: ep, group: group, entity: entity, keys: keys, ids: ids, preview: preview, url: q.bases[slot] + q.path(ep, group, entity)}
		var query []string
		// One read in four asks ?at= (a batch's or a transaction call's in its
		// body), from 30 s before the latest as_of answered to 60 s after:
		// mostly inside at_range, some before an entity's retained buckets or
		// the last sweep (422s).
		if r := q.recent.Load(); r > 0 && ep != epPreview && q.rng.IntN(4) == 0 {
			at := r - 30_000 + q.rng.Int64N(90_000)
			req.at = &at
			query = append(query, "at="+strconv.FormatInt(at, 10))
		}
		// One velocity lookup in four names some windows, in a random order,
		// comma-separated or repeated, one of them at times twice.
		if (ep == epVelocity || ep == epBatch) && len(q.windowNames) > 0 && q.rng.IntN(4) == 0 {
			req.windows = q.rng.Perm(len(q.windowNames))[:1+q.rng.IntN(len(q.windowNames))]
			asked := make([]string, 0, len(req.windows)+1)
			for _, i := range req.windows {
				asked = append(asked, q.windowNames[i])
			}
			if q.rng.IntN(3) == 0 {
				asked = append(asked, asked[q.rng.IntN(len(asked))])
			}
			switch {
			case ep == epBatch:
				req.windowsAsked = asked
			case q.rng.IntN(2) == 0:
				query = append(query, "window="+strings.Join(asked, ","))
			default:
				for _, n := range asked {
					query = append(query, "window="+n)
				}
			}
		}
		if len(query) > 0 && ep != epBatch && ep != epTxn { // theirs are in the body
			req.url += "?" + strings.Join(query, "&")
		}
		q.wg.Add(1)
		go func() {
			defer q.wg.Done()
			defer func() { <-inFlight }()
			q.send(req)
			q.mu.Lock()
			q.reqs = append(q.reqs, req)
			q.mu.Unlock()
		}()
	}
}

func (q *querier) send(req *apiRequest) {
	method, body := http.MethodGet, io.Reader(nil)
	if req.ep == epTxn || req.ep == epBatch || req.ep == epPreview {
		fields := map[string]any{"keys": req.keys}
		if pv := req.preview; pv != nil {
			fields = map[string]any{"amount_minor": pv.amount, "event_time": pv.eventTime}
			if pv.eventID != nil {
				fields["event_id"] = *pv.eventID
			}
		}
		if req.ep == epBatch {
			fields = map[string]any{"entity_ids": req.ids}
			if req.windowsAsked != nil {
				fields["windows"] = req.windowsAsked
			}
		}
		if req.at != nil {
			fields["at"] = *req.at
		}
		b, err := json.Marshal(fields)
		if err != nil {
			req.err = err.Error()
			return
		}
		method, body = http.MethodPost, bytes.NewReader(b)
	}
	hr, err := http.NewRequest(method, req.url, body)
	if err != nil {
		req.err = err.Error()
		return
	}
	req.sent = time.Now()
	resp, err := q.client.Do(hr)
	if err == nil {
		req.body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		req.status, req.retry, req.ctype = resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type")
	}
	req.answered = time.Now()
	if err != nil {
		req.err, req.status = err.Error(), 0
	}
	if req.status == 200 && req.at == nil && req.ep != epTxn && req.ep != epBatch && req.ep != epPreview {
		var a struct {
			AsOf int64 `json:"as_of"`
		}
		if json.Unmarshal(req.body, &a) == nil {
			for r := q.recent.Load(); a.AsOf > r && !q.recent.CompareAndSwap(r, a.AsOf); r = q.recent.Load() {
			}
		}
	}
}

// halt stops the querier and returns every request it sent.
func (q *querier) halt() ([]*apiRequest, int) {
	q.halted.Do(func() { close(q.stop) })
	<-q.done
	q.client.CloseIdleConnections()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.reqs, q.skipped
}

// commitPoint is one answer of the group coordinator: the committed offsets
// (the next offset to consume) of a group's partitions of one topic (the input,
// or a re-keyed group's repartition topic), as known when the answer arrived.
type commitPoint struct {
	at      time.Time // when the answer arrived: every offset in it was committed before
	offsets map[int32]int64
}

// commitTimeline is a group's committed offsets over the run, in order.
type commitTimeline struct {
	mu     sync.Mutex
	points []commitPoint
}

// before returns the committed offset of partition p according to the last
// answer that arrived before t, and whether there is one: what the group had
// certainly committed by t. A nil timeline has none.
func (c *commitTimeline) before(p int32, t time.Time) (int64, time.Time, bool) {
	if c == nil {
		return 0, time.Time{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.points) - 1; i >= 0; i-- {
		if c.points[i].at.Before(t) {
			o, ok := c.points[i].offsets[p]
			return o, c.points[i].at, ok
		}
	}
	return 0, time.Time{}, false
}

// pollTarget is a consumer group whose committed offsets of one topic are
// polled into a timeline.
type pollTarget struct {
	group, topic string
	tl           *commitTimeline
}

// pollCommits asks for the committed offsets of every target every
// commitPoll until ctx ends, riding out a broker restart.
func pollCommits(ctx context.Context, adm *kadm.Client, targets []pollTarget) {
	for ctx.Err() == nil {
		for _, t := range targets {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := adm.FetchOffsets(pctx, t.group)
			cancel()
			if err != nil || resp.Error() != nil {
				continue
			}
			tl := t.tl
			pt := commitPoint{at: time.Now(), offsets: map[int32]int64{}}
			resp.Each(func(o kadm.OffsetResponse) {
				if o.Topic == t.topic && o.Err == nil && o.At >= 0 {
					pt.offsets[o.Partition] = o.At
				}
			})
			tl.mu.Lock()
			tl.points = append(tl.points, pt)
			tl.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(commitPoll):
		}
	}
}

// apiPartition is where the query API looks an entity up: Kafka's default
// partitioner over its id (docs/api.md), here franz-go's, not the service's.
func apiPartition(entity string) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(entity)}, partitions))
}

// entityPicker draws the entities the querier asks for: half of them among the
// generator's entities that live where the API looks for them (the generator
// places an entity by its own hash, so only about a quarter do; of those, half
// of the draws among the hot ones when there are any), a third among all its
// entities (most of them live in another partition, where the API's partition
// does not know them), and the rest ids that were never produced.
func entityPicker(g *generator) func(*rand.Rand) string {
	var aligned, hot, all []string
	for p, es := range g.entities {
		for i, e := range es {
			all = append(all, e)
			if apiPartition(e) == int32(p) {
				aligned = append(aligned, e)
				if i < 10 {
					hot = append(hot, e)
				}
			}
		}
	}
	return func(rng *rand.Rand) string {
		switch x := rng.IntN(6); {
		case x < 3 && len(aligned) > 0:
			if len(hot) > 0 && rng.IntN(2) == 0 {
				return hot[rng.IntN(len(hot))]
			}
			return aligned[rng.IntN(len(aligned))]
		case x < 5:
			return all[rng.IntN(len(all))]
		default:
			return fmt.Sprintf("never-%06d", rng.IntN(1_000_000))
		}
	}
}

// at is t relative to the run's start, as the timeline writes it ("+12.3s").
func (tl *timeline) at(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return fmt.Sprintf("+%.3fs", t.Sub(tl.begin).Seconds())
}

// keyPicker draws the keys the querier asks a re-keyed group for: mostly keys
// the input has (for a group keyed by the currency, the generator's two; by the
// event id, the generator's ids up to about the most a run produces), and some
// it never has.
func keyPicker(field string) func(*rand.Rand) string {
	return func(rng *rand.Rand) string {
		if rng.IntN(8) == 0 {
			return fmt.Sprintf("never-%06d", rng.IntN(1_000_000))
		}
		switch field {
		case "currency":
			return []string{"EUR", "USD"}[rng.IntN(2)]
		case "event_id":
			return fmt.Sprintf("ev-%08d", 1+rng.IntN(30_000))
		}
		return fmt.Sprintf("never-%06d", rng.IntN(1_000_000))
	}
}

// startQueries starts the committed-offset poller and each group's querier.
func (r *run) startQueries(seed uint64) {
	eps := []endpoint{epVelocity}
	inPlace := ""
	var rekeyed []rekeyedTarget
	if r.v.features != "" {
		eps = append(eps, epFeatures)
		def, err := definition.LoadFile(r.v.features)
		r.must(err)
		if len(def.Groups) > 0 {
			// The in-place group through the groups route, and every re-keyed
			// group's keys (judged by groupcheck_test.go).
			eps = append(eps, epGroup)
			inPlace = def.Group
			for _, dg := range def.Groups {
				rekeyed = append(rekeyed, rekeyedTarget{name: dg.Name, pick: keyPicker(dg.Key)})
			}
		}
	}
	pick := entityPicker(r.prod.gen)
	specs, err := r.velocitySpecs()
	r.must(err)
	var windowNames []string
	for _, sp := range specs {
		windowNames = append(windowNames, sp.Name)
	}
	var targets []pollTarget
	for i, g := range r.groups {
		targets = append(targets, pollTarget{group: g.name, topic: r.input, tl: g.commits})
		for _, t := range rekeyed {
			tl := &commitTimeline{}
			g.groupCommits[t.name] = tl
			targets = append(targets, pollTarget{group: g.name + "." + t.name, topic: repartitionTopic(g.name, t.name), tl: tl})
		}
		g.q = newQuerier(g.mode, g.api, eps, inPlace, pick, rekeyed, seed+uint64(i))
		g.q.txn = len(rekeyed) > 0
		g.q.windowNames = windowNames
		// Under a definition too: the preview answers the definition's windows
		// over every counted event (docs/api.md), which the model computes.
		g.q.previews, g.q.lastSeq = true, r.prod.gen.seq.Load
		go g.q.run()
	}
	ctx, cancel := context.WithCancel(r.ctx)
	adm := kafkatest.Admin(r.t, r.addr)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pollCommits(ctx, adm, targets)
	}()
	var once sync.Once
	r.stopPoll = func() { once.Do(func() { cancel(); <-done }) }
	// A run that ends early (t.Fatal) stops them too.
	r.t.Cleanup(func() {
		for _, g := range r.groups {
			g.q.halt()
		}
		r.stopPoll()
	})
	var names []string
	for _, t := range rekeyed {
		names = append(names, t.name)
	}
	r.tl.logf("query API: slots default %v, eos %v; %d requests/s per group to random slots (%v, re-keyed groups %v, transaction call %v)",
		r.groups[0].api, r.groups[1].api, time.Second/queryEvery, eps, names, len(rekeyed) > 0)
}

// stopQueries stops the queriers (waiting for the requests in flight) and the
// poller, keeps what they got, and writes every request to api-<mode>.log in
// the run's directory, for the reader of a failure.
func (r *run) stopQueries() {
	for _, g := range r.groups {
		g.reqs, g.skipped = g.q.halt()
		slices.SortFunc(g.reqs, func(a, b *apiRequest) int { return a.sent.Compare(b.sent) })
		var b strings.Builder
		b.WriteString("# sent\tanswered\tslot\tendpoint\tentity\tstatus\tretry-after\tbody or error\n")
		for _, q := range g.reqs {
			what := q.err
			if what == "" {
				what = string(bytes.TrimSpace(q.body))
			}
			if q.ep == epTxn {
				k, _ := json.Marshal(q.keys)
				what = string(k) + " " + what
			}
			ep := q.ep.String()
			if q.group != "" {
				ep += " " + q.group
			}
			fmt.Fprintf(&b, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", r.tl.at(q.sent), r.tl.at(q.answered), q.slot, ep, q.entity, q.status, q.retry, what)
		}
		if err := os.WriteFile(filepath.Join(r.dir, "api-"+g.mode+".log"), []byte(b.String()), 0o644); err != nil {
			r.t.Logf("write the query API's log: %v", err)
		}
	}
	r.stopPoll()
	r.tl.logf("query API: %d and %d requests sent (api-default.log, api-eos.log)", len(r.groups[0].reqs), len(r.groups[1].reqs))
}

// apiModel builds the model of the whole input the answers are judged by.
func (r *run) apiModel(ends map[int32]int64, replay map[srcKey][]output, gen map[srcKey]string) (*apiModel, error) {
	specs, err := r.velocitySpecs()
	if err != nil {
		return nil, err
	}
	if r.v.features == "" {
		return newAPIModel(ends, replay, gen, r.prod.gen.txs, specs, nil, r.sched.Late)
	}
	def, err := definition.LoadFile(r.v.features)
	if err != nil {
		return nil, err
	}
	return newAPIModel(ends, replay, gen, r.prod.gen.txs, specs, def, r.sched.Late)
}

// velocitySpecs are the windows of the velocity endpoint: the definition's, or
// the default ones.
func (r *run) velocitySpecs() ([]window.Spec, error) {
	if r.v.features == "" {
		return window.ParseSpecs(window.DefaultSpecs)
	}
	def, err := definition.LoadFile(r.v.features)
	if err != nil {
		return nil, err
	}
	return def.Windows, nil
}
