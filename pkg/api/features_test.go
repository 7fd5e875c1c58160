package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// featureBackend is a fakeBackend that runs a feature definition (FeatureSource).
type featureBackend struct {
	*fakeBackend
	spec *feature.Spec
}

func (b *featureBackend) Features() *feature.Spec { return b.spec }
func (b *featureBackend) Definition() string      { return "api-test@0123" }

const apiDefinition = `
version: api-test
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [1m:1s, 1h:1m]
features:
  - {name: n, agg: count, windows: [1m, 1h]}
  - {name: eur, agg: sum, windows: [1h], where: [{field: currency, eq: EUR}]}
  - {name: big_min, agg: min, windows: [1m], where: [{field: amount_minor, ge: 250}]}
  - {name: cur, agg: distinct_count, field: currency, windows: [1h]}
`

func compileDefinition(t testing.TB, src string) (*feature.Spec, codec.Decoder) {
	t.Helper()
	d, err := definition.Parse("api.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	c, err := definition.Compile(d, "", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	spec, err := definition.EngineSpec(d)
	if err != nil {
		t.Fatal(err)
	}
	return spec, c.Decoder()
}

// newFeatureCluster is newCluster's two instances under apiDefinition: card-i's
// events (200 in all, 100 ms apart) alternate EUR and USD, amounts 100 + i.
func newFeatureCluster(t *testing.T, token string) *cluster {
	t.Helper()
	spec, dec := compileDefinition(t, apiDefinition)
	c := &cluster{backends: map[string]*fakeBackend{}, loc: &fakeLocator{owners: map[int32]Owner{}, stable: true}, specs: spec.Windows}
	for _, m := range []string{"A", "B"} {
		c.backends[m] = &fakeBackend{member: m, specs: spec.Windows, procs: map[int32]*pipeline.Processor{}}
	}
	for p := range int32(parts) {
		proc, err := pipeline.New(pipeline.Config{Topic: "tx", Partition: p, Decoder: dec, Features: spec, Watermark: watermark.Config{}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		c.backends[[]string{"A", "B"}[p%2]].procs[p] = proc
	}
	for i := range 200 {
		id := fmt.Sprintf("card-%d", i%20)
		p := PartitionOf(id, parts)
		proc := c.backends[[]string{"A", "B"}[p%2]].procs[p]
		tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: id, AmountMinor: int64(100 + i), Currency: []string{"EUR", "USD"}[i/20%2], EventTime: t0 + int64(i)*100}
		proc.Process(pipeline.Record{Topic: "tx", Partition: p, Offset: proc.Next(), Key: []byte(id), Value: codec.EncodeTransaction(&tx)}, func(o *pipeline.Output) {
			if o.Dead {
				t.Fatalf("dead letter: %s", o.Err)
			}
		})
	}
	for _, m := range []string{"A", "B"} {
		srv, err := New(Config{Backend: &featureBackend{c.backends[m], spec}, Locator: c.loc, Token: token})
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
		u := c.a.URL
		if p%2 == 1 {
			u = c.b.URL
		}
		c.loc.owners[p] = Owner{MemberID: []string{"A", "B"}[p%2], URL: u}
	}
	return c
}

// getRaw is a GET's status and body.
func getRaw(t *testing.T, u string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// objectKeys lists the keys of the JSON object at path (nested keys) in order.
func objectKeys(t *testing.T, body []byte, key string) []string {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(top[key])))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%s is not an object: %s", key, top[key])
	}
	var keys []string
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

type featuresAnswer struct {
	EntityID   string            `json:"entity_id"`
	Known      bool              `json:"known"`
	Partition  int32             `json:"partition"`
	AsOf       int64             `json:"as_of"`
	AsOfTime   string            `json:"as_of_time"`
	LastOffset int64             `json:"last_offset"`
	Pending    int               `json:"pending"`
	AtRange    rangeJSON         `json:"at_range"`
	Definition string            `json:"definition"`
	Features   map[string]*int64 `json:"features"`
	Exact      map[string]bool   `json:"exact"`
}

// TestFeaturesAnyInstance: every entity's features, asked of either instance, are
// its partition's processor's LookupFeatures, named and ordered as the definition's
// record names its fields; at a past or future as-of too.
func TestFeaturesAnyInstance(t *testing.T) {
	c := newFeatureCluster(t, "")
	spec := c.backends["A"].procs[0].FeatureSpec()
	cols := spec.Columns()
	var valueNames, exactNames []string
	for _, col := range cols {
		if col.Window >= 0 {
			valueNames = append(valueNames, col.Name)
		} else {
			exactNames = append(exactNames, col.Name)
		}
	}
	if fmt.Sprint(valueNames) != "[n_1m n_1h eur_1h big_min_1m cur_1h]" || fmt.Sprint(exactNames) != "[cur_exact]" {
		t.Fatalf("columns %v %v", valueNames, exactNames)
	}
	row := feature.NewRow(spec)
	for i := range 21 {
		id := fmt.Sprintf("card-%d", i) // card-20: never seen
		p := PartitionOf(id, parts)
		proc := c.backends[[]string{"A", "B"}[p%2]].procs[p]
		def, _, _ := proc.AsOf()
		for _, at := range []string{"", "?at=" + strconv.FormatInt(def+30_000, 10), "?at=" + msTime(def+61_000)} {
			_, bodyA := mustGet(t, c.a.URL+"/v1/entities/"+id+"/features"+at)
			_, bodyB := mustGet(t, c.b.URL+"/v1/entities/"+id+"/features"+at)
			if string(bodyA) != string(bodyB) {
				t.Fatalf("%s%s: A %s, B %s", id, at, bodyA, bodyB)
			}
			var got featuresAnswer
			if err := json.Unmarshal(bodyA, &got); err != nil {
				t.Fatal(err)
			}
			info, err := proc.LookupFeatures(id, got.AsOf, false, row)
			if err != nil {
				t.Fatal(err)
			}
			if got.EntityID != id || got.Known != (i < 20) || got.Partition != p || got.Definition != "api-test@0123" ||
				got.LastOffset != info.LastOffset || got.AtRange != (rangeJSON{info.From, info.To}) || got.AsOfTime != msTime(got.AsOf) {
				t.Fatalf("%s%s: %s", id, at, bodyA)
			}
			if at == "" && got.AsOf != def {
				t.Fatalf("%s: as_of %d, want the default %d", id, got.AsOf, def)
			}
			if k := objectKeys(t, bodyA, "features"); fmt.Sprint(k) != fmt.Sprint(valueNames) {
				t.Fatalf("%s: features in order %v, want %v", id, k, valueNames)
			}
			if k := objectKeys(t, bodyA, "exact"); fmt.Sprint(k) != fmt.Sprint(exactNames) {
				t.Fatalf("%s: exact in order %v, want %v", id, k, exactNames)
			}
			for v, name := range valueNames {
				g := got.Features[name]
				if (g == nil) != row.Null[v] || (g != nil && *g != row.Values[v]) {
					t.Fatalf("%s%s: %s = %v, processor %d (null %v)", id, at, name, g, row.Values[v], row.Null[v])
				}
			}
			if got.Exact["cur_exact"] != row.Exact[0] {
				t.Fatalf("%s: cur_exact %v", id, got.Exact["cur_exact"])
			}
		}
	}
	// card-0 by hand: events i = 0, 20, …, 180 at t0 + 0 s, 2 s, …, 18 s, amounts
	// 100, 120, …, 280; EUR when i/20 is even (i = 0, 40, 80, 120, 160).
	_, body := mustGet(t, c.a.URL+"/v1/entities/card-0/features?at="+strconv.FormatInt(t0+18_000, 10))
	var got featuresAnswer
	_ = json.Unmarshal(body, &got)
	want := map[string]int64{"n_1m": 10, "n_1h": 10, "eur_1h": 100 + 140 + 180 + 220 + 260, "big_min_1m": 260, "cur_1h": 2}
	for name, w := range want {
		if g := got.Features[name]; g == nil || *g != w {
			t.Errorf("card-0 %s = %v, want %d", name, g, w)
		}
	}
	if !got.Exact["cur_exact"] {
		t.Error("card-0 cur_exact false")
	}
	// A minute and a second later the 1m window is empty: big_min_1m is null.
	_, body = mustGet(t, c.a.URL+"/v1/entities/card-0/features?at="+strconv.FormatInt(t0+79_000, 10))
	got = featuresAnswer{}
	_ = json.Unmarshal(body, &got)
	if g, ok := got.Features["big_min_1m"]; !ok || g != nil || *got.Features["n_1m"] != 0 || *got.Features["n_1h"] != 10 {
		t.Errorf("card-0 a minute later: %s", body)
	}
}

func mustGet(t *testing.T, u string) (http.Header, []byte) {
	t.Helper()
	code, h, b := getRaw(t, u)
	if code != 200 || h.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %s", u, code, b)
	}
	return h, b
}

// TestFeaturesErrors: the features endpoint refuses what the velocity lookup
// refuses, with the same codes.
func TestFeaturesErrors(t *testing.T) {
	c := newFeatureCluster(t, "tok")
	auth := []string{"Authorization", "Bearer tok"}
	proc := c.backends["A"].procs[0]
	_, from, to := proc.AsOf()
	var id0 string // an entity of partition 0
	for i := range 20 {
		if id := fmt.Sprintf("card-%d", i); PartitionOf(id, parts) == 0 {
			id0 = id
			break
		}
	}
	for _, tc := range []struct {
		method, path string
		hdr          []string
		status       int
		code         string
	}{
		{"GET", "/v1/entities/" + id0 + "/features", nil, 401, "unauthorized"},
		{"POST", "/v1/entities/" + id0 + "/features", auth, 405, "method_not_allowed"},
		{"GET", "/v1/entities//features", auth, 400, "invalid_entity_id"},
		{"GET", "/v1/entities/" + strings.Repeat("x", 257) + "/features", auth, 400, "invalid_entity_id"},
		{"GET", "/v1/entities/%FF/features", auth, 400, "invalid_entity_id"},
		{"GET", "/v1/entities/" + id0 + "/features?at=soon", auth, 400, "invalid_at"},
		{"GET", "/v1/entities/" + id0 + "/features?at=1&at=2", auth, 400, "invalid_at"},
		{"GET", "/v1/entities/" + id0 + "/features?at=" + strconv.FormatInt(to+1, 10), auth, 422, "at_out_of_range"},
		{"GET", "/v1/entities/" + id0 + "/features?at=" + strconv.FormatInt(from-1, 10), auth, 422, "at_out_of_range"},
		{"GET", "/v1/entities/" + id0 + "/features?at=" + strconv.FormatInt(from, 10), auth, 422, "at_not_retained"},
	} {
		req, _ := http.NewRequest(tc.method, c.a.URL+tc.path, nil)
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			req.Header.Set(tc.hdr[i], tc.hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if resp.StatusCode != tc.status || errCode(v) != tc.code {
			t.Errorf("%s %s: %d %v, want %d %s", tc.method, tc.path, resp.StatusCode, v, tc.status, tc.code)
		}
		if tc.code == "at_out_of_range" {
			e := v["error"].(map[string]any)
			if int64(e["from"].(float64)) != from || int64(e["to"].(float64)) != to {
				t.Errorf("%s: range %v", tc.path, e)
			}
		}
	}
}

// TestFeaturesAbsentWithoutDefinition: without a definition the features path is
// unknown, answered exactly as any unknown path, and the other answers do not
// depend on whether the server knows the endpoint.
func TestFeaturesAbsentWithoutDefinition(t *testing.T) {
	c := newCluster(t, "")
	code, _, got := getRaw(t, c.a.URL+"/v1/entities/card-1/features")
	_, _, unknown := getRaw(t, c.a.URL+"/v1/entities/card-1/nothing")
	if code != 404 || string(got) != string(unknown) {
		t.Fatalf("features without a definition: %d %s; an unknown path: %s", code, got, unknown)
	}
	if string(got) != `{"error":{"code":"not_found","message":"no such endpoint; see /v1/openapi.yaml"}}`+"\n" {
		t.Fatalf("404 body %q", got)
	}
}

// TestAppendFeaturesEncodesJSON: the hand-written answer is valid JSON that reads
// back to the values written, ids with characters to escape included, for a
// definition without distinct counts (exact is then {}) too.
func TestAppendFeaturesEncodesJSON(t *testing.T) {
	spec, _ := compileDefinition(t, `
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [1m:1s]
features:
  - {name: lo, agg: min, windows: [1m]}
  - {name: n, agg: count, windows: [1m]}
`)
	s := &Server{feats: newFeatureText(spec, `odd "label"@h`)}
	row := feature.NewRow(spec)
	row.Values[0], row.Null[0], row.Values[1] = 0, true, -7
	for _, id := range []string{"card-1", `a"b\c`, "tab\tnl\n<&>", "é€😀", "bad\xff\xfe"} {
		it := serviceItem(id, row)
		b := s.appendFeatures(nil, it, 3)
		var got featuresAnswer
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q: %v: %s", id, err, b)
		}
		enc, _ := json.Marshal(id)
		var wantID string
		_ = json.Unmarshal(enc, &wantID)
		if got.EntityID != wantID || got.Definition != `odd "label"@h` || got.Features["lo_1m"] != nil ||
			got.Features["n_1m"] == nil || *got.Features["n_1m"] != -7 || len(got.Exact) != 0 || got.Partition != 3 || got.AsOf != -5 {
			t.Fatalf("%q: %s", id, b)
		}
		if !strings.Contains(string(b), `"exact":{}}`) {
			t.Fatalf("%q: %s", id, b)
		}
	}
}

func serviceItem(id string, row *feature.Row) *service.ReadItem {
	return &service.ReadItem{Entity: id, Row: row, Info: pipeline.LookupInfo{AsOf: -5, Known: true, LastOffset: 9, From: -10, To: 10}}
}

// BenchmarkFeaturesHandler: the features handler's own cost for a local lookup
// (as BenchmarkVelocityHandler: no network, the read in the caller's goroutine),
// beside the velocity handler on the same state for the ratio.
func BenchmarkFeaturesHandler(b *testing.B) {
	spec, dec := compileDefinition(b, apiDefinition)
	be := &fakeBackend{member: "A", specs: spec.Windows, procs: map[int32]*pipeline.Processor{}}
	for p := range int32(parts) {
		proc, err := pipeline.New(pipeline.Config{Topic: "tx", Partition: p, Decoder: dec, Features: spec}, 0)
		if err != nil {
			b.Fatal(err)
		}
		be.procs[p] = proc
	}
	for i := range 2000 {
		id := fmt.Sprintf("card-%d", i%100)
		p := PartitionOf(id, parts)
		tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: id, AmountMinor: int64(i), Currency: []string{"EUR", "USD", "GBP"}[i%3], EventTime: t0 + int64(i)*100}
		be.procs[p].Process(pipeline.Record{Offset: be.procs[p].Next(), Key: []byte(id), Value: codec.EncodeTransaction(&tx)}, func(*pipeline.Output) {})
	}
	srv, err := New(Config{Backend: &featureBackend{be, spec}, Locator: &fakeLocator{stable: true}})
	if err != nil {
		b.Fatal(err)
	}
	for _, path := range []string{"features", "velocity"} {
		b.Run(path, func(b *testing.B) {
			reqs := make([]*http.Request, 100)
			for i := range reqs {
				reqs[i] = httptest.NewRequest("GET", fmt.Sprintf("/v1/entities/card-%d/%s", i, path), nil)
			}
			w := &nullWriter{}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				w.Reset()
				srv.ServeHTTP(w, reqs[i%len(reqs)])
				if w.code != 200 || w.n == 0 {
					b.Fatal(w.code, w.n)
				}
			}
		})
	}
}
