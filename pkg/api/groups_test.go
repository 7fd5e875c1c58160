package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// The groups' definitions of the fake deployment: the in-place group "card" is
// apiDefinition; "device" and "ip" are kept per their own key, each with its own
// windows and features, by processors fed that key's events as a second stage
// would count them (the API reads the state; how it was fed is not its concern).
var groupDefs = map[string]string{
	"card": apiDefinition,
	"device": `
version: api-test
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [5m:5s]
features:
  - {name: spend, agg: sum, windows: [5m]}
  - {name: currencies, agg: distinct_count, field: currency, windows: [5m]}
`,
	"ip": `
version: api-test
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [5m:5s, 1h:1m]
features:
  - {name: attempts, agg: count, windows: [5m, 1h]}
`,
}

var groupOrder = []string{"card", "device", "ip"}

// groupOwner is the member ("A" or "B") that owns partition p of a group: card's
// even partitions are A's, device's odd ones, and ip's are all B's, so one
// transaction's keys are spread over both instances in every combination.
func groupOwner(group string, p int32) string {
	switch {
	case group == "card" && p%2 == 0, group == "device" && p%2 == 1:
		return "A"
	}
	return "B"
}

// keysOf are transaction i's keys, per group.
func keysOf(i int) map[string]string {
	return map[string]string{"card": fmt.Sprintf("card-%d", i%20), "device": fmt.Sprintf("dev-%d", i%7), "ip": fmt.Sprintf("ip-%d", i%3)}
}

// submitBackend is a featureBackend that also reads in two steps (Submitter),
// logging each step to the cluster's log.
type submitBackend struct {
	*featureBackend
	mu      sync.Mutex
	pending map[*service.ReadRequest]int32
	log     func(string)
}

func (b *submitBackend) Submit(p int32, req *service.ReadRequest) error {
	if b.procs[p] == nil {
		return service.ErrNotOwned
	}
	b.mu.Lock()
	b.pending[req] = p
	b.mu.Unlock()
	if b.log != nil {
		b.log("submit " + b.member)
	}
	return nil
}

func (b *submitBackend) Wait(ctx context.Context, req *service.ReadRequest) error {
	b.mu.Lock()
	p, ok := b.pending[req]
	delete(b.pending, req)
	b.mu.Unlock()
	if !ok {
		return service.ErrNotOwned
	}
	if b.log != nil {
		b.log("wait " + b.member)
	}
	return b.fakeBackend.Read(ctx, p, req)
}

// groupCluster is two instances, A and B, serving three groups, each group's
// partitions owned as groupOwner says.
type groupCluster struct {
	a, b     *httptest.Server
	hits     map[string]*atomic.Int64 // requests each instance received
	procs    map[string]map[int32]*pipeline.Processor
	locs     map[string]*fakeLocator
	backends map[string]*submitBackend // by member "A.card" …
	mu       sync.Mutex
	steps    []string
}

func (c *groupCluster) log(s string) {
	c.mu.Lock()
	c.steps = append(c.steps, s)
	c.mu.Unlock()
}

func newGroupCluster(t *testing.T, token string) *groupCluster {
	t.Helper()
	c := &groupCluster{hits: map[string]*atomic.Int64{"A": {}, "B": {}}, procs: map[string]map[int32]*pipeline.Processor{},
		locs: map[string]*fakeLocator{}, backends: map[string]*submitBackend{}}
	specs := map[string]*feature.Spec{}
	for _, g := range groupOrder {
		spec, dec := compileDefinition(t, groupDefs[g])
		specs[g] = spec
		c.procs[g] = map[int32]*pipeline.Processor{}
		c.locs[g] = &fakeLocator{owners: map[int32]Owner{}, stable: true}
		for p := range int32(parts) {
			proc, err := pipeline.New(pipeline.Config{Topic: g, Partition: p, Decoder: dec, Features: spec, Watermark: watermark.Config{}}, 0)
			if err != nil {
				t.Fatal(err)
			}
			c.procs[g][p] = proc
		}
		for m := range c.hits {
			fb := &fakeBackend{member: m + "." + g, specs: spec.Windows, procs: map[int32]*pipeline.Processor{}}
			for p := range int32(parts) {
				if groupOwner(g, p) == m {
					fb.procs[p] = c.procs[g][p]
				}
			}
			c.backends[m+"."+g] = &submitBackend{featureBackend: &featureBackend{fb, spec}, pending: map[*service.ReadRequest]int32{}, log: c.log}
		}
	}
	for i := range 300 {
		for g, key := range keysOf(i) {
			p := PartitionOf(key, parts)
			proc := c.procs[g][p]
			tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: key, AmountMinor: int64(100 + i), Currency: []string{"EUR", "USD", "GBP"}[i%3], EventTime: t0 + int64(i)*100}
			proc.Process(pipeline.Record{Topic: g, Partition: p, Offset: proc.Next(), Key: []byte(key), Value: codec.EncodeTransaction(&tx)}, func(o *pipeline.Output) {
				if o.Dead {
					t.Fatalf("dead letter: %s", o.Err)
				}
			})
		}
	}
	urls := map[string]string{}
	for _, m := range []string{"A", "B"} {
		cfg := Config{Backend: c.backends[m+".card"], Locator: c.locs["card"], Token: token, Group: "card"}
		for _, g := range groupOrder[1:] {
			cfg.Groups = append(cfg.Groups, Group{Name: g, Backend: c.backends[m+"."+g], Locator: c.locs[g]})
		}
		srv, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hits := c.hits[m]
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			srv.ServeHTTP(w, r)
		}))
		t.Cleanup(hs.Close)
		urls[m] = hs.URL
		if m == "A" {
			c.a = hs
		} else {
			c.b = hs
		}
	}
	for _, g := range groupOrder {
		for p := range int32(parts) {
			m := groupOwner(g, p)
			c.locs[g].owners[p] = Owner{MemberID: m + "." + g, URL: urls[m]}
		}
	}
	return c
}

func post(t *testing.T, u, body string, hdr ...string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", u, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.Bytes()
}

type groupAnswer struct {
	Group string `json:"group"`
	featuresAnswer
}

type txnEntry struct {
	Status   int              `json:"status"`
	Features *json.RawMessage `json:"features"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// txnEntries reads a transaction answer: its entries by group, and the groups'
// order in it.
func txnEntries(t *testing.T, body []byte) (map[string]txnEntry, []string) {
	t.Helper()
	var got struct {
		Groups map[string]txnEntry `json:"groups"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return got.Groups, objectKeys(t, body, "groups")
}

// TestGroupFeaturesAnyInstance: every group's features of every key, asked of
// either instance, are the key's partition's processor's in that group (where that
// group's consumer group put it), with the group named first; the in-place group
// by its name is the features endpoint's answer plus that name.
func TestGroupFeaturesAnyInstance(t *testing.T) {
	c := newGroupCluster(t, "")
	for _, g := range groupOrder {
		row := feature.NewRow(c.procs[g][0].FeatureSpec())
		seen := map[string]bool{}
		for i := range 25 {
			key := keysOf(i)[g]
			if i >= 20 {
				key = fmt.Sprintf("%s-never-%d", g, i)
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			p := PartitionOf(key, parts)
			_, bodyA := mustGet(t, c.a.URL+"/v1/groups/"+g+"/entities/"+key+"/features")
			_, bodyB := mustGet(t, c.b.URL+"/v1/groups/"+g+"/entities/"+key+"/features")
			if !bytes.Equal(bodyA, bodyB) {
				t.Fatalf("%s %s: A %s, B %s", g, key, bodyA, bodyB)
			}
			if !bytes.HasPrefix(bodyA, []byte(`{"group":"`+g+`","entity_id":`)) {
				t.Fatalf("%s %s: %s", g, key, bodyA)
			}
			var got groupAnswer
			if err := json.Unmarshal(bodyA, &got); err != nil {
				t.Fatal(err)
			}
			info, err := c.procs[g][p].LookupFeatures(key, got.AsOf, false, row)
			if err != nil {
				t.Fatal(err)
			}
			if got.Group != g || got.EntityID != key || got.Partition != p || got.Known != info.Known || got.Known != !strings.Contains(key, "never") ||
				got.LastOffset != info.LastOffset || got.Definition != "api-test@0123" {
				t.Fatalf("%s %s: %s (processor %+v)", g, key, bodyA, info)
			}
			for v, col := range c.procs[g][p].FeatureSpec().Columns() {
				if col.Window < 0 {
					continue
				}
				if f := got.Features[col.Name]; (f == nil) != row.Null[v] || (f != nil && *f != row.Values[v]) {
					t.Fatalf("%s %s: %s = %v, processor %d", g, key, col.Name, f, row.Values[v])
				}
			}
			if g == "card" {
				_, plain := mustGet(t, c.a.URL+"/v1/entities/"+key+"/features")
				if want := append([]byte(`{"group":"card",`), plain[1:]...); !bytes.Equal(bodyA, want) {
					t.Fatalf("card %s by name:\n %s\nthe features endpoint:\n %s", key, bodyA, plain)
				}
			}
		}
	}
	// A group's own windows: ip's 1h window at a time only ip has.
	_, body := mustGet(t, c.b.URL+"/v1/groups/ip/entities/ip-1/features?at="+strconv.FormatInt(t0+29_900, 10))
	var got groupAnswer
	_ = json.Unmarshal(body, &got)
	if got.AsOf != t0+29_900 || got.Features["attempts_5m"] == nil || *got.Features["attempts_5m"] != 100 || *got.Features["attempts_1h"] != 100 {
		t.Fatalf("ip-1 at the last event: %s", body)
	}
}

// TestTransactionAcrossOwners: one call with a transaction's keys gets every
// group's answer, each the group endpoint's answer for its key wherever its owner
// is; both instances answer the same; the groups an instance does not own are
// asked of their owner in one forwarded call, not one per group.
func TestTransactionAcrossOwners(t *testing.T) {
	c := newGroupCluster(t, "")
	for i := range 40 {
		keys := keysOf(i)
		body := fmt.Sprintf(`{"keys": {"ip": %q, "card": %q, "device": %q}}`, keys["ip"], keys["card"], keys["device"])
		var answers [][]byte
		for _, inst := range []*httptest.Server{c.a, c.b} {
			before := map[string]int64{"A": c.hits["A"].Load(), "B": c.hits["B"].Load()}
			code, got := post(t, inst.URL+"/v1/transaction/features", body)
			if code != 200 {
				t.Fatalf("%d: %d %s", i, code, got)
			}
			// The other instance got at most one request (the forwarded call).
			other, self := "B", "A"
			if inst == c.b {
				other, self = "A", "B"
			}
			needOther := false
			for g, k := range keys {
				needOther = needOther || groupOwner(g, PartitionOf(k, parts)) == other
			}
			wantOther := int64(0)
			if needOther {
				wantOther = 1
			}
			if n := c.hits[other].Load() - before[other]; n != wantOther || c.hits[self].Load()-before[self] != 1 {
				t.Fatalf("%d at %s: %d calls forwarded to %s, want %d", i, self, n, other, wantOther)
			}
			answers = append(answers, got)
		}
		if !bytes.Equal(answers[0], answers[1]) {
			t.Fatalf("%d: A %s\nB %s", i, answers[0], answers[1])
		}
		entries, order := txnEntries(t, answers[0])
		if fmt.Sprint(order) != fmt.Sprint(groupOrder) {
			t.Fatalf("%d: groups in order %v, want the definition's %v", i, order, groupOrder)
		}
		for _, g := range groupOrder {
			_, single := mustGet(t, c.a.URL+"/v1/groups/"+g+"/entities/"+keys[g]+"/features")
			e := entries[g]
			if e.Status != 200 || e.Features == nil || !bytes.Equal(*e.Features, bytes.TrimSuffix(single, []byte("\n"))) {
				t.Fatalf("%d %s: %+v\n the group endpoint: %s", i, g, e, single)
			}
		}
	}
}

// TestTransactionSubmitsBeforeWaiting: the local groups' reads are all handed to
// their workers before any is waited for.
func TestTransactionSubmitsBeforeWaiting(t *testing.T) {
	c := newGroupCluster(t, "")
	// A transaction whose card and device are both A's.
	i := 0
	for ; i < 300; i++ {
		k := keysOf(i)
		if groupOwner("card", PartitionOf(k["card"], parts)) == "A" && groupOwner("device", PartitionOf(k["device"], parts)) == "A" {
			break
		}
	}
	k := keysOf(i)
	c.steps = nil
	code, body := post(t, c.a.URL+"/v1/transaction/features", fmt.Sprintf(`{"keys":{"card":%q,"device":%q}}`, k["card"], k["device"]))
	if code != 200 {
		t.Fatal(code, string(body))
	}
	if got := fmt.Sprint(c.steps); got != "[submit A.card submit A.device wait A.card wait A.device]" {
		t.Fatalf("steps %s", got)
	}
}

// TestTransactionKeys: a group the call does not name, or names with null or "",
// is left out of the answer; a name the definition does not have is that entry's
// 404 unknown_group, listing the groups; an invalid key is that entry's 400; the
// other entries are answered all the same.
func TestTransactionKeys(t *testing.T) {
	c := newGroupCluster(t, "")
	k := keysOf(3)
	for _, tc := range []struct {
		body  string
		order string
		codes map[string]string // group: status code
	}{
		{`{"keys":{}}`, "[]", nil},
		{fmt.Sprintf(`{"keys":{"device":%q}}`, k["device"]), "[device]", map[string]string{"device": "200"}},
		{fmt.Sprintf(`{"keys":{"card":%q,"device":null,"ip":""}}`, k["card"]), "[card]", map[string]string{"card": "200"}},
		{fmt.Sprintf(`{"keys":{"merchant":"m-1","card":%q,"Device":"x"}}`, k["card"]), "[card merchant Device]",
			map[string]string{"card": "200", "merchant": "404 unknown_group", "Device": "404 unknown_group"}},
		{fmt.Sprintf(`{"keys":{"card":%q,"device":"%s"}}`, k["card"], strings.Repeat("d", 257)), "[card device]",
			map[string]string{"card": "200", "device": "400 invalid_entity_id"}},
		{`{"keys":{"ip":"bad\udfff","card":"\u00e9t\u00e9"}, "at": null}`, "", nil}, // at null: invalid_at (below)
		{fmt.Sprintf(`{"at":%d,"keys":{"ip":%q}}`, t0+29_900, k["ip"]), "[ip]", map[string]string{"ip": "200"}},
		{fmt.Sprintf(`{"at":%d,"keys":{"ip":%q,"card":%q}}`, t0+40_000_000, k["ip"], k["card"]), "[card ip]",
			map[string]string{"card": "422 at_out_of_range", "ip": "422 at_out_of_range"}},
	} {
		code, body := post(t, c.a.URL+"/v1/transaction/features", tc.body)
		if tc.order == "" {
			if code != 400 || !strings.Contains(string(body), `"invalid_at"`) {
				t.Errorf("%s: %d %s", tc.body, code, body)
			}
			continue
		}
		if code != 200 {
			t.Fatalf("%s: %d %s", tc.body, code, body)
		}
		entries, order := txnEntries(t, body)
		if fmt.Sprint(order) != tc.order {
			t.Errorf("%s: groups %v, want %s", tc.body, order, tc.order)
		}
		for g, want := range tc.codes {
			e := entries[g]
			got := strconv.Itoa(e.Status)
			if e.Error != nil {
				got += " " + e.Error.Code
				if e.Error.Code == "unknown_group" && !strings.Contains(e.Error.Message, "card, device, ip") {
					t.Errorf("%s: %s: %s does not list the groups", tc.body, g, e.Error.Message)
				}
			}
			if got != want || (e.Status == 200) != (e.Features != nil) {
				t.Errorf("%s: %s: %s, want %s", tc.body, g, got, want)
			}
		}
	}
}

// TestTransactionAndGroupErrors: what the transaction call and the group endpoint
// refuse, with the codes the other endpoints use.
func TestTransactionAndGroupErrors(t *testing.T) {
	c := newGroupCluster(t, "tok")
	auth := []string{"Authorization", "Bearer tok"}
	many := `{"keys":{`
	for i := range maxTxnKeys + 1 {
		if i > 0 {
			many += ","
		}
		many += fmt.Sprintf(`"g%d":"k"`, i)
	}
	many += "}}"
	for _, tc := range []struct {
		method, path, body string
		hdr                []string
		status             int
		code               string
	}{
		{"POST", "/v1/transaction/features", `{"keys":{"card":"c"}}`, nil, 401, "unauthorized"},
		{"GET", "/v1/transaction/features", "", auth, 405, "method_not_allowed"},
		{"POST", "/v1/transaction/features", ``, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `[]`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{}`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{"keys":null}`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{"keys":["card"]}`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{"keys":{"card":7}}`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{"keys":{"card":"a","card":"b"}}`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{"keys":{},"keys":{}}`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{"keys":{},"windows":[]}`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{"keys":{}} {}`, auth, 400, "invalid_body"},
		{"POST", "/v1/transaction/features", `{"keys":{"card":"c"},"at":"soon"}`, auth, 400, "invalid_at"},
		{"POST", "/v1/transaction/features", `{"keys":{"card":"c"},"at":"1"}`, auth, 400, "invalid_at"},
		{"POST", "/v1/transaction/features", many, auth, 400, "too_many_keys"},
		{"GET", "/v1/groups/device/entities/dev-1/features", "", nil, 401, "unauthorized"},
		{"POST", "/v1/groups/device/entities/dev-1/features", "", auth, 405, "method_not_allowed"},
		{"GET", "/v1/groups/merchant/entities/m-1/features", "", auth, 404, "unknown_group"},
		{"GET", "/v1/groups/entity/entities/m-1/features", "", auth, 404, "unknown_group"}, // the in-place group is "card" here
		{"GET", "/v1/groups/device/entities//features", "", auth, 400, "invalid_entity_id"},
		{"GET", "/v1/groups/device/entities/%FF/features", "", auth, 400, "invalid_entity_id"},
		{"GET", "/v1/groups/device/entities/dev-1/features?at=x", "", auth, 400, "invalid_at"},
		{"GET", "/v1/groups/device/entities/dev-1/features?at=" + strings.Repeat("0", 64) + "1", "", auth, 400, "invalid_at"}, // over the document's 64
		{"GET", "/v1/entities/card-1/features?at=" + strings.Repeat("0", 64) + "1", "", auth, 400, "invalid_at"},
		{"GET", "/v1/entities/card-1/velocity?at=" + strings.Repeat("0", 64) + "1", "", auth, 400, "invalid_at"},
		{"GET", "/v1/groups/device/entities/dev-1/velocity", "", auth, 404, "not_found"},
		{"GET", "/v1/groups/device/dev-1/features", "", auth, 404, "not_found"},
		{"GET", "/v1/groups/device", "", auth, 404, "not_found"},
		{"GET", "/v1/groups", "", nil, 401, "unauthorized"},
	} {
		req, _ := http.NewRequest(tc.method, c.a.URL+tc.path, strings.NewReader(tc.body))
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
			t.Errorf("%s %s %s: %d %v, want %d %s", tc.method, tc.path, tc.body, resp.StatusCode, v, tc.status, tc.code)
		}
		if tc.code == "unknown_group" && !strings.Contains(v["error"].(map[string]any)["message"].(string), "card, device, ip") {
			t.Errorf("%s: %v does not list the groups", tc.path, v)
		}
	}
	code, _, body := getRaw(t, c.a.URL+"/v1/groups", auth...)
	if code != 200 || string(body) != `{"groups":[{"name":"card","in_place":true},{"name":"device","in_place":false},{"name":"ip","in_place":false}],"definition":"api-test@0123"}`+"\n" {
		t.Fatalf("GET /v1/groups: %d %s", code, body)
	}
}

// TestTransactionWhileAGroupMoves: a group whose partition is being assigned is
// that entry's 503; the other groups are answered.
func TestTransactionWhileAGroupMoves(t *testing.T) {
	c := newGroupCluster(t, "")
	c.locs["ip"].stable = false
	for i := range 10 {
		k := keysOf(i)
		code, body := post(t, c.a.URL+"/v1/transaction/features", fmt.Sprintf(`{"keys":{"card":%q,"device":%q,"ip":%q}}`, k["card"], k["device"], k["ip"]))
		if code != 200 {
			t.Fatal(code, string(body))
		}
		e, _ := txnEntries(t, body)
		if e["card"].Status != 200 || e["device"].Status != 200 || e["ip"].Status != 503 || e["ip"].Error.Code != "unavailable" {
			t.Fatalf("%d: %s", i, body)
		}
	}
	code, h, _ := getRaw(t, c.a.URL+"/v1/groups/ip/entities/ip-0/features")
	if code != 503 || h.Get("Retry-After") != "1" {
		t.Fatalf("group endpoint while ip moves: %d %v", code, h)
	}
}

// TestGroupsConfig: what New refuses.
func TestGroupsConfig(t *testing.T) {
	spec, _ := compileDefinition(t, apiDefinition)
	fb := &featureBackend{&fakeBackend{member: "A", specs: spec.Windows}, spec}
	plain := &fakeBackend{member: "A", specs: spec.Windows}
	loc := &fakeLocator{}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Backend: plain, Locator: loc, Groups: []Group{{Name: "device", Backend: fb, Locator: loc}}}, "need a Backend that runs a feature definition"},
		{Config{Backend: fb, Locator: loc, Groups: []Group{{Name: "entity", Backend: fb, Locator: loc}}}, "two groups are named entity"},
		{Config{Backend: fb, Locator: loc, Group: "card", Groups: []Group{{Name: "device", Backend: plain, Locator: loc}}}, "runs no feature definition"},
		{Config{Backend: fb, Locator: loc, Groups: []Group{{Name: "device", Backend: fb}}}, "Locator are required"},
		{Config{Backend: fb, Locator: loc, Groups: []Group{{Backend: fb, Locator: loc}}}, "no name"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg.Groups, err, tc.want)
		}
	}
}

// FuzzTxnBody: what parseTxnFast accepts, parseTxnStrict accepts with the same
// keys and at; what it declines parseTxnStrict decides alone.
func FuzzTxnBody(f *testing.F) {
	for _, s := range []string{
		`{"keys":{"card":"c-1","device":"d","ip":null}}`, `{"at":1800000000000,"keys":{"card":"x"}}`,
		`{"keys":{"card":""},"at":"2026-12-01T00:00:00Z"}`, ` { "keys" : { } } `, `{"keys":{"a":"1","a":"2"}}`,
		`{"keys":{"card":"\u00e9"}}`, `{"keys":{"card":nul}}`, `{"keys":{"card":"c"},"at":-0}`, `{"keys":{"card":"c"},"at":01}`,
		`{"keys":{"card":"c"}}x`, `{"keys":{"card":"c"},}`, `{"keys":{"card":"c"}`, `{"keys":{"c":null,"d":"e"},"at":12}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var fast, strict txnCall
		if !parseTxnFast(body, &fast) {
			return
		}
		if e := parseTxnStrict([]byte(body), &strict); e != nil {
			t.Fatalf("%q: fast accepts, strict refuses: %s", body, e.Msg)
		}
		if fast.nkeys != strict.nkeys || fast.keys != strict.keys || !bytes.Equal(fast.at, strict.at) {
			t.Fatalf("%q: fast %+v %q, strict %+v %q", body, fast.keys[:fast.nkeys], fast.at, strict.keys[:strict.nkeys], strict.at)
		}
	})
}

// BenchmarkTransactionHandler: the transaction call's own cost when every group is
// local (no network, reads answered in the caller's goroutine by the fake
// Submitter), for one, two and three keys, beside three calls of the group
// endpoint for the ratio.
func BenchmarkTransactionHandler(b *testing.B) {
	cfg := Config{Group: "card"}
	for _, g := range groupOrder {
		spec, dec := compileDefinition(b, groupDefs[g])
		fb := &fakeBackend{member: "A." + g, specs: spec.Windows, procs: map[int32]*pipeline.Processor{}}
		for p := range int32(parts) {
			proc, err := pipeline.New(pipeline.Config{Topic: g, Partition: p, Decoder: dec, Features: spec}, 0)
			if err != nil {
				b.Fatal(err)
			}
			fb.procs[p] = proc
		}
		for i := range 3000 {
			key := keysOf(i)[g]
			p := PartitionOf(key, parts)
			tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: key, AmountMinor: int64(i), Currency: []string{"EUR", "USD", "GBP"}[i%3], EventTime: t0 + int64(i)*100}
			fb.procs[p].Process(pipeline.Record{Offset: fb.procs[p].Next(), Key: []byte(key), Value: codec.EncodeTransaction(&tx)}, func(*pipeline.Output) {})
		}
		sb := &submitBackend{featureBackend: &featureBackend{fb, spec}, pending: map[*service.ReadRequest]int32{}}
		loc := &fakeLocator{stable: true}
		if g == "card" {
			cfg.Backend, cfg.Locator = sb, loc
		} else {
			cfg.Groups = append(cfg.Groups, Group{Name: g, Backend: sb, Locator: loc})
		}
	}
	srv, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			bodies := make([]string, 20)
			for i := range bodies {
				k := keysOf(i)
				var parts []string
				for _, g := range groupOrder[:n] {
					parts = append(parts, fmt.Sprintf("%q:%q", g, k[g]))
				}
				bodies[i] = `{"keys":{` + strings.Join(parts, ",") + `}}`
			}
			reqs := make([]*http.Request, len(bodies))
			rds := make([]*strings.Reader, len(bodies))
			for i := range reqs {
				rds[i] = strings.NewReader(bodies[i])
				reqs[i] = httptest.NewRequest("POST", "/v1/transaction/features", rds[i])
			}
			w := &nullWriter{}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				j := i % len(reqs)
				rds[j].Reset(bodies[j])
				w.Reset()
				srv.ServeHTTP(w, reqs[j])
				if w.code != 200 || w.n == 0 {
					b.Fatal(w.code, w.n)
				}
			}
		})
	}
	b.Run("group-endpoint-x3", func(b *testing.B) {
		reqs := make([]*http.Request, 60)
		for i := range reqs {
			g := groupOrder[i%3]
			reqs[i] = httptest.NewRequest("GET", "/v1/groups/"+g+"/entities/"+keysOf(i / 3)[g]+"/features", nil)
		}
		w := &nullWriter{}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			for k := range 3 {
				w.Reset()
				srv.ServeHTTP(w, reqs[(3*i+k)%len(reqs)])
				if w.code != 200 || w.n == 0 {
					b.Fatal(w.code, w.n)
				}
			}
		}
	})
}
