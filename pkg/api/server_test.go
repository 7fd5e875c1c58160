package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

const parts = 4

var t0 = int64(1_800_000_000_000)

// fakeBackend serves the partitions it holds from real Processors, as the service
// does, one read at a time.
type fakeBackend struct {
	mu     sync.Mutex
	member string
	specs  []window.Spec
	procs  map[int32]*pipeline.Processor
	reads  int
}

func (b *fakeBackend) Read(_ context.Context, p int32, req *service.ReadRequest) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	proc := b.procs[p]
	if proc == nil {
		return service.ErrNotOwned
	}
	b.reads++
	for i := range req.Items {
		it := &req.Items[i]
		if it.Preview != nil {
			dec, _ := codec.NewDecoder("", codec.DefaultLimits())
			it.Tx.EntityID = it.Entity
			proc.Preview(&it.Tx, it.HasEventID, dec, it.Preview)
			continue
		}
		if it.Row != nil {
			it.Info, it.Err = proc.LookupFeatures(it.Entity, it.AsOf, it.UseDefault, it.Row)
			continue
		}
		it.Info, it.Err = proc.Lookup(it.Entity, it.AsOf, it.UseDefault, it.Aggs)
	}
	req.Specs = b.specs
	return nil
}

func (b *fakeBackend) GroupMember() (string, bool) { return b.member, true }
func (b *fakeBackend) Specs() []window.Spec        { return b.specs }

type fakeLocator struct {
	owners map[int32]Owner
	stable bool
}

func (l *fakeLocator) Partitions() (int32, bool) { return parts, true }
func (l *fakeLocator) Owner(p int32) (Owner, bool, bool) {
	o, ok := l.owners[p]
	return o, ok, l.stable
}
func (l *fakeLocator) Poke() {}

// cluster is two instances, A and B, each owning two of the four partitions, with
// events for entities card-0 … card-19 counted where murmur2 puts them.
type cluster struct {
	a, b     *httptest.Server
	backends map[string]*fakeBackend
	loc      *fakeLocator
	specs    []window.Spec
}

func newCluster(t *testing.T, token string) *cluster {
	t.Helper()
	specs, _ := window.ParseSpecs("1m:1s,1h:1m")
	dec, _ := codec.NewDecoder("", codec.DefaultLimits())
	c := &cluster{backends: map[string]*fakeBackend{}, loc: &fakeLocator{owners: map[int32]Owner{}, stable: true}, specs: specs}
	for _, m := range []string{"A", "B"} {
		c.backends[m] = &fakeBackend{member: m, specs: specs, procs: map[int32]*pipeline.Processor{}}
	}
	for p := range int32(parts) {
		proc, err := pipeline.New(pipeline.Config{Topic: "tx", Partition: p, Specs: specs, Decoder: dec, Watermark: watermark.Config{}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		m := []string{"A", "B"}[p%2]
		c.backends[m].procs[p] = proc
	}
	for i := range 200 {
		id := fmt.Sprintf("card-%d", i%20)
		p := PartitionOf(id, parts)
		proc := c.backends[[]string{"A", "B"}[p%2]].procs[p]
		tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: id, AmountMinor: int64(100 + i), EventTime: t0 + int64(i)*100}
		proc.Process(pipeline.Record{Topic: "tx", Partition: p, Offset: proc.Next(), Key: []byte(id), Value: codec.EncodeTransaction(&tx)}, func(*pipeline.Output) {})
	}
	for _, m := range []string{"A", "B"} {
		srv, err := New(Config{Backend: c.backends[m], Locator: c.loc, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)
		if m == "A" {
			c.a = hs
		} else {
			c.b = hs
		}
	}
	for p := range int32(parts) {
		m := []string{"A", "B"}[p%2]
		u := c.a.URL
		if m == "B" {
			u = c.b.URL
		}
		c.loc.owners[p] = Owner{MemberID: m, URL: u}
	}
	return c
}

func do(t *testing.T, method, u, body string, hdr ...string) (int, http.Header, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &v); err != nil && resp.Header.Get("Content-Type") == "application/json" {
		t.Fatalf("%s %s: body not JSON: %q", method, u, raw)
	}
	return resp.StatusCode, resp.Header, v
}

func errCode(v map[string]any) string {
	e, _ := v["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// TestAnyInstanceAnswers: every entity, asked of either instance, gets the same
// answer: its partition's owner's.
func TestAnyInstanceAnswers(t *testing.T) {
	c := newCluster(t, "")
	for i := range 20 {
		id := fmt.Sprintf("card-%d", i)
		_, _, va := do(t, "GET", c.a.URL+"/v1/entities/"+id+"/velocity", "")
		code, _, vb := do(t, "GET", c.b.URL+"/v1/entities/"+id+"/velocity", "")
		if code != 200 || fmt.Sprint(va) != fmt.Sprint(vb) {
			t.Fatalf("%s: A %v, B %d %v", id, va, code, vb)
		}
		if va["known"] != true || int32(va["partition"].(float64)) != PartitionOf(id, parts) {
			t.Fatalf("%s: %v", id, va)
		}
		ws := va["windows"].([]any)
		if len(ws) != 2 || ws[1].(map[string]any)["count"].(float64) != 10 {
			t.Fatalf("%s: windows %v", id, ws)
		}
	}
	if c.backends["A"].reads == 0 || c.backends["B"].reads == 0 {
		t.Fatal("one instance answered everything")
	}
}

func TestBadInputIsAClear4xx(t *testing.T) {
	c := newCluster(t, "")
	long := strings.Repeat("x", 257)
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", "/v1/entities//velocity", "", 400, "invalid_entity_id"},
		{"GET", "/v1/entities/" + long + "/velocity", "", 400, "invalid_entity_id"},
		{"GET", "/v1/entities/%FF%FE/velocity", "", 400, "invalid_entity_id"},
		{"GET", "/v1/entities/card-1/velocity?at=yesterday", "", 400, "invalid_at"},
		{"GET", "/v1/entities/card-1/velocity?at=1&at=2", "", 400, "invalid_at"},
		{"GET", "/v1/entities/card-1/velocity?at=99999999999999999999", "", 400, "invalid_at"},
		{"GET", "/v1/entities/card-1/velocity?at=1000", "", 422, "at_out_of_range"},
		{"GET", "/v1/entities/card-1/velocity?window=7m", "", 400, "unknown_window"},
		{"GET", "/v1/entities/card-1/velocity:preview", "", 405, "method_not_allowed"},
		{"POST", "/v1/entities/card-1/velocity", "", 405, "method_not_allowed"},
		{"GET", "/v1/nothing", "", 404, "not_found"},
		{"GET", "/v1/entities/card-1/other", "", 404, "not_found"},
		{"POST", "/v1/entities/card-1/velocity:preview", "", 400, "invalid_body"},
		{"POST", "/v1/entities/card-1/velocity:preview", "[]", 400, "invalid_body"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": 5}`, 400, "invalid_event_time"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"event_time": 5}`, 400, "invalid_amount_minor"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": 1.5, "event_time": 5}`, 400, "invalid_amount_minor"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": -1, "event_time": 5}`, 400, "invalid_amount_minor"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": 1, "event_time": "5"}`, 400, "invalid_event_time"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": 1, "event_time": 5, "x": 1}`, 400, "invalid_body"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": 1, "event_time": 5, "event_id": ""}`, 400, "invalid_event_id"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": 1, "event_time": 5} {}`, 400, "invalid_body"},
		{"POST", "/v1/velocity:batch", `{}`, 400, "invalid_body"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": ["a"], "x": 1}`, 400, "invalid_body"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": ["a"], "windows": null}`, 400, "invalid_body"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": ["a"], "at": null}`, 400, "invalid_at"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": null}`, 400, "invalid_body"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": [null]}`, 400, "invalid_body"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": [5]}`, 400, "invalid_body"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": 1, "event_time": 5, "event_id": null}`, 400, "invalid_event_id"},
		{"POST", "/v1/entities/card-1/velocity:preview", `{"amount_minor": 1, "event_time": 5, "event_id": 7}`, 400, "invalid_event_id"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": ["a"], "windows": ["2m"]}`, 400, "unknown_window"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": ["a"], "at": true}`, 400, "invalid_at"},
		{"POST", "/v1/velocity:batch", `{"entity_ids": [` + strings.Repeat(`"a",`, MaxBatch) + `"a"]}`, 400, "too_many_entities"},
	} {
		code, _, v := do(t, tc.method, c.a.URL+tc.path, tc.body)
		if code != tc.status || errCode(v) != tc.code {
			t.Errorf("%s %s %s: %d %v, want %d %s", tc.method, truncate(tc.path, 60), truncate(tc.body, 60), code, v, tc.status, tc.code)
		}
	}
}

func TestBearerToken(t *testing.T) {
	c := newCluster(t, "s3cret")
	code, h, v := do(t, "GET", c.a.URL+"/v1/entities/card-1/velocity", "")
	if code != 401 || errCode(v) != "unauthorized" || h.Get("WWW-Authenticate") == "" {
		t.Fatalf("no token: %d %v", code, v)
	}
	if code, _, _ := do(t, "GET", c.a.URL+"/v1/entities/card-1/velocity", "", "Authorization", "Bearer wrong"); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	// card-ids on both instances: forwarded requests carry the caller's token.
	for i := range 20 {
		if code, _, v := do(t, "GET", c.a.URL+fmt.Sprintf("/v1/entities/card-%d/velocity", i), "", "Authorization", "Bearer s3cret"); code != 200 {
			t.Fatalf("right token: %d %v", code, v)
		}
	}
	if code, _, _ := do(t, "GET", c.a.URL+"/v1/openapi.yaml", ""); code != 200 {
		t.Fatalf("the document needs no token: %d", code)
	}
}

// TestUnavailableWhileMoving: a partition whose owner runs no worker for it (being
// restored there, or moving) gets 503 with Retry-After from every instance, never an
// answer from elsewhere, and a forwarded request is not forwarded again.
func TestUnavailableWhileMoving(t *testing.T) {
	c := newCluster(t, "")
	id := "card-3"
	p := PartitionOf(id, parts)
	owner := []string{"A", "B"}[p%2]
	other := map[string]string{"A": "B", "B": "A"}[owner]
	url := map[string]string{"A": c.a.URL, "B": c.b.URL}
	// The owner has released it; the group says the other now owns it, which has not
	// restored it yet.
	proc := c.backends[owner].procs[p]
	delete(c.backends[owner].procs, p)
	c.loc.owners[p] = Owner{MemberID: other, URL: url[other]}
	for _, m := range []string{"A", "B"} {
		code, h, v := do(t, "GET", url[m]+"/v1/entities/"+id+"/velocity", "")
		if code != 503 || h.Get("Retry-After") == "" || errCode(v) != "unavailable" {
			t.Fatalf("asking %s while %s restores: %d %v", m, other, code, v)
		}
	}
	// Rebalancing: 503 too.
	c.loc.stable = false
	if code, _, _ := do(t, "GET", url[owner]+"/v1/entities/"+id+"/velocity", ""); code != 503 {
		t.Fatalf("while rebalancing: %d", code)
	}
	// Restored on the new owner: both answer.
	c.loc.stable = true
	c.backends[other].procs[p] = proc
	for _, m := range []string{"A", "B"} {
		if code, _, v := do(t, "GET", url[m]+"/v1/entities/"+id+"/velocity", ""); code != 200 || v["known"] != true {
			t.Fatalf("asking %s after the move: %d %v", m, code, v)
		}
	}
}

func TestBatchAcrossInstances(t *testing.T) {
	c := newCluster(t, "")
	var ids []string
	for i := range 20 {
		ids = append(ids, fmt.Sprintf("card-%d", i))
	}
	ids = append(ids, "", "never-seen")
	body, _ := json.Marshal(map[string]any{"entity_ids": ids, "windows": []string{"1h"}})
	code, _, v := do(t, "POST", c.a.URL+"/v1/velocity:batch", string(body))
	if code != 200 {
		t.Fatalf("%d %v", code, v)
	}
	res := v["results"].([]any)
	if len(res) != len(ids) {
		t.Fatalf("%d results for %d ids", len(res), len(ids))
	}
	for i, r := range res {
		r := r.(map[string]any)
		switch id := ids[i]; id {
		case "":
			if r["status"].(float64) != 400 {
				t.Fatalf("empty id: %v", r)
			}
		default:
			vel := r["velocity"].(map[string]any)
			if r["status"].(float64) != 200 || vel["entity_id"] != id {
				t.Fatalf("%s: %v", id, r)
			}
			_, _, single := do(t, "GET", c.b.URL+"/v1/entities/"+id+"/velocity?window=1h", "")
			if fmt.Sprint(single) != fmt.Sprint(vel) {
				t.Fatalf("%s: batch %v, single %v", id, vel, single)
			}
		}
	}
}

func TestPreviewForwardedAndChangesNothing(t *testing.T) {
	c := newCluster(t, "")
	for i := range 20 {
		id := fmt.Sprintf("card-%d", i)
		_, _, before := do(t, "GET", c.a.URL+"/v1/entities/"+id+"/velocity", "")
		code, _, pv := do(t, "POST", c.a.URL+"/v1/entities/"+id+"/velocity:preview", fmt.Sprintf(`{"amount_minor": 7, "event_time": %d, "event_id": "p-%d"}`, t0+20_000, i))
		if code != 200 || pv["outcome"] != "features" {
			t.Fatalf("%s: %d %v", id, code, pv)
		}
		w := pv["features"].(map[string]any)["windows"].([]any)[1].(map[string]any)
		if w["count"].(float64) != 11 {
			t.Fatalf("%s: preview windows %v", id, w)
		}
		if _, _, after := do(t, "GET", c.b.URL+"/v1/entities/"+id+"/velocity", ""); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("%s: state changed by a preview:\n%v\n%v", id, before, after)
		}
		// A duplicate id is what a real resend would be.
		if _, _, dup := do(t, "POST", c.b.URL+"/v1/entities/"+id+"/velocity:preview", fmt.Sprintf(`{"amount_minor": 7, "event_time": %d, "event_id": "%d"}`, t0+20_000, i)); dup["outcome"] != "duplicate" {
			t.Fatalf("%s: %v", id, dup)
		}
	}
}

// BenchmarkVelocityHandler: the handler's own cost for a local lookup, without the
// network, net/http or the hand-over to a partition's goroutine (the fake backend
// reads in the caller's goroutine; its decoder is made once).
func BenchmarkVelocityHandler(b *testing.B) {
	specs, _ := window.ParseSpecs(window.DefaultSpecs)
	dec, _ := codec.NewDecoder("", codec.DefaultLimits())
	be := &fakeBackend{member: "A", specs: specs, procs: map[int32]*pipeline.Processor{}}
	for p := range int32(parts) {
		proc, _ := pipeline.New(pipeline.Config{Topic: "tx", Partition: p, Specs: specs, Decoder: dec}, 0)
		be.procs[p] = proc
	}
	for i := range 2000 {
		id := fmt.Sprintf("card-%d", i%100)
		p := PartitionOf(id, parts)
		tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: id, AmountMinor: int64(i), EventTime: t0 + int64(i)*100}
		be.procs[p].Process(pipeline.Record{Offset: be.procs[p].Next(), Key: []byte(id), Value: codec.EncodeTransaction(&tx)}, func(*pipeline.Output) {})
	}
	srv, err := New(Config{Backend: be, Locator: &fakeLocator{stable: true}})
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*http.Request, 100)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", fmt.Sprintf("/v1/entities/card-%d/velocity", i), nil)
	}
	// A reused writer: httptest's recorder allocates more per request than the
	// handler does, and net/http's own response is not the handler's cost.
	w := &nullWriter{}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w.Reset()
		srv.ServeHTTP(w, reqs[i%len(reqs)])
		if w.code != 200 || w.n == 0 {
			b.Fatal(w.code, w.n)
		}
	}
}

// TestEncodeMatchesEncodingJSON: the hand-written velocity JSON is what encoding/json
// writes, for ids with every kind of character that needs escaping.
func TestEncodeMatchesEncodingJSON(t *testing.T) {
	type plain velocityJSON // without the MarshalJSON method
	for _, id := range []string{"card-1", `a"b\c`, "tab\tnl\n<&>", "\x00\x1f\x7f", "é€😀", "bad\xff\xfeutf8", "\u2028\u2029", ""} {
		v := velocityJSON{EntityID: id, Known: true, Partition: 3, AsOf: -5, AsOfTime: "t", LastOffset: -1, Pending: 2,
			AtRange: rangeJSON{-1 << 62, 1 << 62}, Windows: []windowJSON{{"1m", 60000, 1000, 1, 2, 3, 4}, {"5m", 1, 2, 3, 4, 5, 6}}}
		want, err := json.Marshal(plain(v))
		if err != nil {
			t.Fatal(err)
		}
		if got := appendVelocity(nil, &v); string(got) != string(want) {
			t.Errorf("id %q:\n got  %s\n want %s", id, got, want)
		}
	}
}

// TestOwnerUnreachableLogsNoEntityID: a forward that fails is a 503, and its log line
// names the owner, not the entity.
func TestOwnerUnreachableLogsNoEntityID(t *testing.T) {
	c := newCluster(t, "")
	core, logs := observer.New(zap.DebugLevel)
	srv, err := New(Config{Backend: c.backends["A"], Locator: c.loc, Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	c.b.Close() // B's partitions' owner is gone
	id := "secret-card-id"
	for PartitionOf(id, parts)%2 == 0 { // a partition of B's
		id += "x"
	}
	code, h, _ := do(t, "GET", hs.URL+"/v1/entities/"+id+"/velocity", "")
	if code != 503 || h.Get("Retry-After") == "" {
		t.Fatalf("%d", code)
	}
	if logs.Len() == 0 {
		t.Fatal("nothing logged")
	}
	for _, e := range logs.All() {
		line := e.Message + fmt.Sprint(e.ContextMap())
		if strings.Contains(line, "secret-card") {
			t.Fatalf("entity id in a log line: %s", line)
		}
	}
}
