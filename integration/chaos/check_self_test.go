//go:build integration

package chaos

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// TestChaosChecksFire needs no broker: each invariant of check reports the
// outputs that break it, naming the partition and offsets, and says nothing
// about outputs that keep it; and so does each check of the query API's
// answers (apiChecksFire).
func TestChaosChecksFire(t *testing.T) {
	feat := func(eventID string, count int64, src int64) output {
		native := map[string]any{
			"event_id": eventID, "entity_id": "card-1", "event_time": int64(1_795_000_000_000),
			"windows": []any{map[string]any{"window": "1m", "window_ms": int64(60_000), "bucket_ms": int64(1000),
				"count": count, "sum_minor": count * 10, "min_minor": int64(10), "max_minor": int64(10)}},
			"ms_since_previous": nil, "late": false,
			"source_topic": "in", "source_partition": int32(0), "source_offset": src,
		}
		b, err := featuresCodec.BinaryFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		return output{key: []byte("card-1"), value: b, srcTopic: "in", at: "out/0@x"}
	}
	dead := func(reason string) output {
		return output{dead: true, key: []byte("card-1"), value: []byte("not avro"), reason: reason, errText: "e", srcTopic: "in", at: "dlq/0@y"}
	}
	in := verdictInput{inputTopic: "in", ends: map[int32]int64{0: 3}, gen: map[srcKey]string{}}
	in.replay = map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2)}}
	good := map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2)}}
	if got := check(checkpoint{label: "cp", eos: true, outs: good}, in); len(got) != 0 {
		t.Fatalf("a clean checkpoint fails: %v", got)
	}
	if got := checkReplay(in); len(got) != 0 {
		t.Fatalf("a clean replay fails: %v", got)
	}

	cases := []struct {
		name string
		eos  bool
		outs map[srcKey][]output
		want []string
	}{
		{"missing", false, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}},
			[]string{"1 input offsets have no output", "partition 0: 1 offsets: 2"}},
		{"two committed", true, map[srcKey][]output{{0, 0}: {feat("a", 1, 0), feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2)}},
			[]string{"1 input offsets have more than one committed output", "partition 0: 1 offsets: 0"}},
		{"repeats differ", false, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2), feat("c", 3, 2)}},
			[]string{"outputs that differ from each other", "windows[0] (1m).count = 3, want 2", "differ from replay's"}},
		{"unlike replay", true, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("duplicate")}, {0, 2}: {feat("c", 2, 2)}},
			[]string{"differ from replay's", `velocity.reason "duplicate", want "late"`, "partition 0: 1 offsets: 1"}},
		{"beyond the input", false, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2)}, {0, 7}: {dead("late")}},
			[]string{"outputs name no input record", "names input 0/7"}},
		{"another topic", false, map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 1}: {dead("late")}, {0, 2}: {feat("c", 2, 2), func() output { o := feat("c", 2, 2); o.srcTopic = "other"; return o }()}},
			[]string{"outputs name no input record", `names source topic "other"`}},
	}
	for _, c := range cases {
		got := strings.Join(check(checkpoint{label: "cp", eos: c.eos, outs: c.outs}, in), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}
	in.replay = map[srcKey][]output{{0, 0}: {feat("a", 1, 0)}, {0, 2}: {feat("c", 2, 2), feat("c", 2, 2)}}
	if got := strings.Join(checkReplay(in), "\n"); !strings.Contains(got, "replay: 1 input offsets have no output") || !strings.Contains(got, "replay: 1 input offsets have more than one output") {
		t.Errorf("a broken replay is not reported:\n%s", got)
	}
	t.Run("query API", apiChecksFire)
}

// apiChecksFire: each check of the query API's answers (apicheck_test.go)
// reports an answer that breaks it (a wrong count, a wrong pending, an answer
// from a previous owner's state, a 503 without Retry-After, a 500, a 4xx, a
// wrong feature, a false claim of inexactness) and says nothing about answers
// that keep it, including one exactly at the committed offset.
func apiChecksFire(t *testing.T) {
	entity := ""
	for i := 0; entity == ""; i++ {
		if e := fmt.Sprintf("card-%06d", i); apiPartition(e) == 0 {
			entity = e
		}
	}
	const t0 = int64(1_795_000_000_000)
	// Partition 0: offsets 0, 2 and 3 are the entity's accepted events, 1 a
	// duplicate. After offset 3 the watermark is t0+500: 0 and 2 are counted, 3 is
	// pending.
	txs := map[string]genTx{
		"ev-1": {eventID: "ev-1", entity: entity, currency: "EUR", amount: 100, time: t0},
		"ev-2": {eventID: "ev-1", entity: entity, currency: "EUR", amount: 100, time: t0},
		"ev-3": {eventID: "ev-3", entity: entity, currency: "USD", amount: 300, time: t0 + 500},
		"ev-4": {eventID: "ev-4", entity: entity, currency: "EUR", amount: 50, time: t0 + 1500},
	}
	gen := map[srcKey]string{{0, 0}: "valid ev-1", {0, 1}: "duplicate ev-2", {0, 2}: "valid ev-3", {0, 3}: "valid ev-4"}
	feat := output{key: []byte(entity)}
	replay := map[srcKey][]output{{0, 0}: {feat}, {0, 1}: {{dead: true, reason: "duplicate"}}, {0, 2}: {feat}, {0, 3}: {feat}}
	ends := map[int32]int64{0: 4, 1: 0, 2: 0, 3: 0}
	specs, err := window.ParseSpecs("1m:1s")
	if err != nil {
		t.Fatal(err)
	}
	m, err := newAPIModel(ends, replay, gen, txs, specs, nil, "dlq")
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	floors := &commitTimeline{points: []commitPoint{{at: begin, offsets: map[int32]int64{0: 4}}}}
	sent := begin.Add(time.Second)
	velocity := func(last, pending, count, sum, mn, mx int64) []byte {
		asOf := t0 + 500
		return fmt.Appendf(nil, `{"entity_id":%q,"known":true,"partition":0,"as_of":%d,"as_of_time":%q,"last_offset":%d,"pending":%d,"at_range":{"from":%d,"to":%d},`+
			`"windows":[{"window":"1m","window_ms":60000,"bucket_ms":1000,"count":%d,"sum_minor":%d,"min_minor":%d,"max_minor":%d}]}`,
			entity, asOf, time.UnixMilli(asOf).UTC().Format(time.RFC3339Nano), last, pending, t0-1000, asOf+60_000, count, sum, mn, mx)
	}
	req := func(status int, retry string, body []byte) *apiRequest {
		return &apiRequest{mode: "default", ep: epVelocity, entity: entity, url: "http://127.0.0.1:1/v1/entities/" + entity + "/velocity",
			sent: sent, answered: sent, status: status, retry: retry, ctype: "application/json", body: body}
	}
	rel := func(at time.Time) string { return at.Sub(begin).String() }
	env := &judgeEnv{floors: map[string]*commitTimeline{"": floors}, rel: rel}

	good := []*apiRequest{
		req(200, "", velocity(3, 1, 2, 400, 100, 300)), // last_offset = committed − 1: not stale
		req(503, "1", []byte(`{"error":{"code":"unavailable","message":"restoring"}}`)),
		{mode: "default", entity: entity, url: "http://127.0.0.1:1/", sent: sent, err: "connection refused"},
	}
	var st apiStats
	if got := m.checkAnswers(good, env, &st); len(got) != 0 {
		t.Fatalf("answers that keep every invariant fail: %v", got)
	}
	if st.ok != 1 || st.unavailable != 1 || st.transport != 1 || st.floored != 1 {
		t.Errorf("stats %+v, want 1 answered 200 (with a committed offset before it), 1 503, 1 without an answer", st)
	}

	cases := []struct {
		name string
		req  *apiRequest
		want []string
	}{
		{"wrong count", req(200, "", velocity(3, 1, 3, 400, 100, 300)), []string{"answer unlike the input's", "windows[0]", "Count:3", "Count:2", "3 accepted events", "pending ones: the last 1 by offset, offsets 3-3"}},
		{"wrong pending", req(200, "", velocity(3, 2, 2, 400, 100, 300)), []string{"wrong pending", "pending 2, but only 1 accepted events"}},
		{"stale", req(200, "", velocity(2, 0, 2, 400, 100, 300)), []string{"answer from a previous owner's state", "last_offset 2, but the group had committed offset 4", "want last_offset ≥ 3"}},
		{"503 without Retry-After", req(503, "", []byte(`{}`)), []string{"503 without Retry-After"}},
		{"500", req(500, "", []byte(`{"error":{"code":"internal"}}`)), []string{"5xx other than 503", `"internal"`}},
		{"404", req(404, "", []byte(`{"error":{"code":"not_found"}}`)), []string{"4xx to a well-formed request"}},
		{"another entity", func() *apiRequest { r := req(200, "", velocity(3, 1, 2, 400, 100, 300)); r.entity = "card-x"; return r }(), []string{"wrong entity"}},
	}
	for _, c := range cases {
		got := strings.Join(m.checkAnswers([]*apiRequest{c.req}, env, &apiStats{}), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}

	// ?at=: answered at it, by whole buckets, only inside at_range and at or
	// after the bucket of the entity's newest counted event (t0+500, in the
	// bucket of t0); a 422 is judged by the range it gives.
	atReq := func(at int64, status int, body []byte) *apiRequest {
		r := req(status, "", body)
		r.at, r.url = &at, r.url+"?at="+strconv.FormatInt(at, 10)
		return r
	}
	velocityAt := func(at, count int64) []byte {
		return fmt.Appendf(nil, `{"entity_id":%q,"known":true,"partition":0,"as_of":%d,"as_of_time":%q,"last_offset":3,"pending":1,"at_range":{"from":%d,"to":%d},`+
			`"windows":[{"window":"1m","window_ms":60000,"bucket_ms":1000,"count":%d,"sum_minor":%d,"min_minor":100,"max_minor":300}]}`,
			entity, at, time.UnixMilli(at).UTC().Format(time.RFC3339Nano), t0-1000, t0+500+60_000, count, count*200)
	}
	outOfRange := []byte(fmt.Sprintf(`{"error":{"code":"at_out_of_range","message":"…","from":%d,"to":%d}}`, t0-1000, t0+500+60_000))
	var ast apiStats
	if got := m.checkAnswers([]*apiRequest{
		atReq(t0+30_000, 200, velocityAt(t0+30_000, 2)),
		atReq(t0+100, 200, velocityAt(t0+100, 2)), // before t0+500, in its bucket: it counts
		atReq(t0+500+60_001, 422, outOfRange),
		atReq(t0-500, 422, []byte(`{"error":{"code":"at_not_retained","message":"…"}}`)),
	}, env, &ast); len(got) != 0 {
		t.Fatalf("?at= answers that keep every invariant fail: %v", got)
	}
	if ast.ats != 2 || ast.outOfRange != 2 {
		t.Errorf("stats %+v, want 2 ?at= reads answered 200 and 2 answered 422", ast)
	}
	for _, c := range []struct {
		name string
		req  *apiRequest
		want []string
	}{
		{"not the whole bucket", atReq(t0+100, 200, velocityAt(t0+100, 1)), []string{"answer unlike the input's", "Count:1", "Count:2"}},
		{"as_of not at", atReq(t0+30_000, 200, velocityAt(t0+20_000, 2)), []string{"as_of = 1795000020000, want 1795000030000"}},
		{"answered outside at_range", atReq(t0+500+60_001, 200, velocityAt(t0+500+60_001, 0)), []string{"answer at an at outside at_range", "want 422 at_out_of_range"}},
		{"answered before the newest bucket", atReq(t0-500, 200, velocityAt(t0-500, 1)), []string{"answer at an at not retained", "want 422 at_not_retained"}},
		{"out of range inside its range", atReq(t0+30_000, 422, outOfRange), []string{"at_out_of_range inside its range"}},
		{"another 422", atReq(t0+30_000, 422, []byte(`{"error":{"code":"invalid_at","message":"…"}}`)), []string{"4xx to a well-formed request"}},
	} {
		got := strings.Join(m.checkAnswers([]*apiRequest{c.req}, env, &apiStats{}), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("?at=, %s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}

	// ?window=: the windows named, in the order first named, each once.
	wspecs, err := window.ParseSpecs("1m:1s,5m:5s")
	if err != nil {
		t.Fatal(err)
	}
	wm, err := newAPIModel(ends, replay, gen, txs, wspecs, nil, "dlq")
	if err != nil {
		t.Fatal(err)
	}
	win := func(name string, ms, bucket int64) string {
		return fmt.Sprintf(`{"window":%q,"window_ms":%d,"bucket_ms":%d,"count":2,"sum_minor":400,"min_minor":100,"max_minor":300}`, name, ms, bucket)
	}
	w1m, w5m := win("1m", 60_000, 1000), win("5m", 300_000, 5000)
	windowed := func(asked []int, query string, ws ...string) *apiRequest {
		asOf := t0 + 500
		r := req(200, "", fmt.Appendf(nil, `{"entity_id":%q,"known":true,"partition":0,"as_of":%d,"as_of_time":%q,"last_offset":3,"pending":1,"at_range":{"from":%d,"to":%d},"windows":[%s]}`,
			entity, asOf, time.UnixMilli(asOf).UTC().Format(time.RFC3339Nano), t0-1000, asOf+300_000, strings.Join(ws, ",")))
		r.windows, r.url = asked, r.url+"?"+query
		return r
	}
	var wst apiStats
	if got := wm.checkAnswers([]*apiRequest{windowed([]int{1, 0}, "window=5m,1m,5m", w5m, w1m), windowed([]int{1}, "window=5m", w5m), windowed(nil, "", w1m, w5m)}, env, &wst); len(got) != 0 {
		t.Fatalf("?window= answers that keep every invariant fail: %v", got)
	}
	if wst.windowed != 2 {
		t.Errorf("stats %+v, want 2 ?window= lookups", wst)
	}
	for _, c := range []struct {
		name string
		req  *apiRequest
		want []string
	}{
		{"configured order, not the asked one", windowed([]int{1, 0}, "window=5m,1m", w1m, w5m), []string{"answer unlike the input's", "windows[0]"}},
		{"every window, one asked", windowed([]int{1}, "window=5m", w1m, w5m), []string{"2 windows, want 1"}},
		{"a window twice", windowed([]int{0}, "window=1m,1m", w1m, w1m), []string{"2 windows, want 1"}},
	} {
		got := strings.Join(wm.checkAnswers([]*apiRequest{c.req}, env, &apiStats{}), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("?window=, %s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}

	// The batch: one result per id, each judged as that id's lookup, one
	// partition read at one state.
	batch := func(ids []string, results ...string) *apiRequest {
		r := req(200, "", []byte(`{"results":[`+strings.Join(results, ",")+`]}`))
		r.ep, r.entity, r.ids, r.url = epBatch, "", ids, "http://127.0.0.1:1/v1/velocity:batch"
		return r
	}
	ok200 := func(b []byte) string { return `{"status":200,"velocity":` + string(b) + `}` }
	unavail := `{"status":503,"error":{"code":"unavailable","message":"restoring"}}`
	var bst apiStats
	if got := m.checkAnswers([]*apiRequest{
		batch([]string{entity, entity}, ok200(velocity(3, 1, 2, 400, 100, 300)), ok200(velocity(3, 1, 2, 400, 100, 300))),
		batch([]string{entity, entity}, ok200(velocity(3, 1, 2, 400, 100, 300)), unavail),
	}, env, &bst); len(got) != 0 {
		t.Fatalf("batches that keep every invariant fail: %v", got)
	}
	if bst.batches != 2 || bst.ok != 5 || bst.unavailable != 1 {
		t.Errorf("stats %+v, want 2 batches answered 200, 3 results answered 200 (5 in all) and one 503", bst)
	}
	for _, c := range []struct {
		name string
		req  *apiRequest
		want []string
	}{
		{"a result short", batch([]string{entity, entity}, ok200(velocity(3, 1, 2, 400, 100, 300))), []string{"batch: wrong number of results", "1 results for 2 ids"}},
		{"a wrong count", batch([]string{entity, entity}, ok200(velocity(3, 1, 2, 400, 100, 300)), ok200(velocity(3, 1, 3, 400, 100, 300))), []string{"batch: answer unlike the input's", "result 1"}},
		{"two states of one partition", batch([]string{entity, entity}, ok200(velocity(3, 1, 2, 400, 100, 300)), ok200(velocity(3, 0, 2, 400, 100, 300))),
			[]string{"batch: one partition read at two states", "result 0 at last_offset 3, pending 1; result 1 at last_offset 3, pending 0"}},
		{"a 503 without its error", batch([]string{entity}, `{"status":503}`), []string{"batch: unreadable result", "status 503 without an error code"}},
		{"a 500 result", batch([]string{entity}, `{"status":500,"error":{"code":"internal"}}`), []string{"batch: 5xx other than 503"}},
		{"not a batch answer", batch([]string{entity}), []string{"batch: wrong number of results"}},
	} {
		got := strings.Join(m.checkAnswers([]*apiRequest{c.req}, env, &apiStats{}), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("batch, %s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}

	// The preview: a hypothetical transaction against the state at
	// (last_offset 3, pending 1): counted t0 (100) and t0+500 (300), pending
	// t0+1500 (50), watermark t0+500.
	previewReq := func(amount, eventTime int64, id *string, body string) *apiRequest {
		r := req(200, "", []byte(body))
		r.ep, r.url, r.preview = epPreview, r.url+":preview", &previewTx{amount: amount, eventTime: eventTime, eventID: id}
		return r
	}
	previewBody := func(outcome string, waits bool, features string) string {
		return fmt.Sprintf(`{"entity_id":%q,"partition":0,"outcome":%q,"waits":%v,"features":%s,"as_of":%d,"last_offset":3,"pending":1}`, entity, outcome, waits, features, t0+500)
	}
	pvFeatures := func(count, sum, mn, prev, srcOff int64) string {
		return fmt.Sprintf(`{"event_id":"preview","entity_id":%q,"event_time":%d,"windows":[{"window":"1m","window_ms":60000,"bucket_ms":1000,"count":%d,"sum_minor":%d,"min_minor":%d,"max_minor":300}],`+
			`"ms_since_previous":%d,"late":false,"source_topic":"in","source_partition":0,"source_offset":%d}`, entity, t0+2000, count, sum, mn, prev, srcOff)
	}
	ev1, ev3, fresh := "ev-1", "ev-3", "pv-1"
	var pst apiStats
	if got := m.checkAnswers([]*apiRequest{
		// t0+2000: waits; counts both counted ones, the pending one before it and itself.
		previewReq(10, t0+2000, nil, previewBody("features", true, pvFeatures(4, 460, 10, 500, 4))),
		previewReq(10, t0+2000, &fresh, previewBody("features", true, strings.Replace(pvFeatures(4, 460, 10, 500, 4), `"preview"`, `"pv-1"`, 1))),
		previewReq(10, t0+100, nil, previewBody("late", false, "null")),
		previewReq(10, t0+2000, &ev1, previewBody("duplicate", false, "null")),
		previewReq(10, t0+2000, &ev3, previewBody("duplicate", false, "null")),
		previewReq(10, t0+1500+25*3600*1000, nil, previewBody("invalid:event_time", false, "null")),
	}, env, &pst); len(got) != 0 {
		t.Fatalf("previews that keep every invariant fail: %v", got)
	}
	if pst.previews != 6 {
		t.Errorf("stats %+v, want 6 previews", pst)
	}
	for _, c := range []struct {
		name string
		req  *apiRequest
		want []string
	}{
		{"a wrong count", previewReq(10, t0+2000, nil, previewBody("features", true, pvFeatures(3, 410, 10, 500, 4))), []string{"preview: answer unlike the input's", "windows"}},
		{"waits wrong", previewReq(10, t0+2000, nil, previewBody("features", false, pvFeatures(4, 460, 10, 500, 4))), []string{"waits = false, want true"}},
		{"the pending one not counted first", previewReq(10, t0+2000, nil, previewBody("features", true, pvFeatures(4, 460, 10, 1500, 4))), []string{"ms_since_previous = 1500, want 500"}},
		{"where it would land", previewReq(10, t0+2000, nil, previewBody("features", true, pvFeatures(4, 460, 10, 500, 3))), []string{"source 0/3, want false, 0/4"}},
		{"features for a late one", previewReq(10, t0+100, nil, previewBody("features", true, pvFeatures(4, 460, 10, 500, 4))), []string{"preview: wrong outcome", `outcome "features", want "late"`}},
		{"not a duplicate", previewReq(10, t0+2000, &ev1, previewBody("features", true, pvFeatures(4, 460, 10, 500, 4))), []string{`want "duplicate"`}},
		{"a stale state", previewReq(10, t0+2000, nil, strings.Replace(previewBody("features", true, pvFeatures(4, 460, 10, 500, 4)), `"last_offset":3`, `"last_offset":2`, 1)),
			[]string{"preview: answer from a previous owner's state"}},
	} {
		got := strings.Join(m.checkAnswers([]*apiRequest{c.req}, env, &apiStats{}), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("preview, %s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}

	// Under --late=apply, a late preview (t0+100, 400 ms behind the watermark
	// t0+500) is counted at once: late=true, no wait, its windows the counted
	// t0 (100) and t0+500 (300) of its own bucket and itself, never the pending
	// t0+1500; ms_since_previous from t0+500, the last counted in release order.
	// More than the largest window (1m) behind the watermark it is late still.
	m.late = "apply"
	lateFeatures := func(late bool, count, sum, prev int64) string {
		return fmt.Sprintf(`{"event_id":"preview","entity_id":%q,"event_time":%d,"windows":[{"window":"1m","window_ms":60000,"bucket_ms":1000,"count":%d,"sum_minor":%d,"min_minor":10,"max_minor":300}],`+
			`"ms_since_previous":%d,"late":%v,"source_topic":"in","source_partition":0,"source_offset":4}`, entity, t0+100, count, sum, prev, late)
	}
	if got := m.checkAnswers([]*apiRequest{
		previewReq(10, t0+100, nil, previewBody("features", false, lateFeatures(true, 3, 410, -400))),
		previewReq(10, t0+500-60_001, nil, previewBody("late", false, "null")),
		previewReq(10, t0+100, &ev1, previewBody("duplicate", false, "null")),
	}, env, &apiStats{}); len(got) != 0 {
		t.Fatalf("--late=apply: previews that keep every invariant fail: %v", got)
	}
	for _, c := range []struct {
		name string
		req  *apiRequest
		want string
	}{
		{"dead-lettered", previewReq(10, t0+100, nil, previewBody("late", false, "null")), `outcome "late", want "features"`},
		{"without late=true", previewReq(10, t0+100, nil, previewBody("features", false, lateFeatures(false, 3, 410, -400))), "late false, source 0/4, want true, 0/4"},
		{"waits", previewReq(10, t0+100, nil, previewBody("features", true, lateFeatures(true, 3, 410, -400))), "waits = true, want false"},
		{"the pending one counted", previewReq(10, t0+100, nil, previewBody("features", false, lateFeatures(true, 4, 460, -400))), "windows"},
		{"a wrong ms_since_previous", previewReq(10, t0+100, nil, previewBody("features", false, lateFeatures(true, 3, 410, 100))), "ms_since_previous = 100, want -400"},
		{"counted though beyond the largest window", previewReq(10, t0+500-60_001, nil, previewBody("features", false, lateFeatures(true, 1, 10, -400))), `outcome "features", want "late"`},
	} {
		got := strings.Join(m.checkAnswers([]*apiRequest{c.req}, env, &apiStats{}), "\n")
		if !strings.Contains(got, c.want) {
			t.Errorf("preview under --late=apply, %s: the report lacks %q:\n%s", c.name, c.want, got)
		}
	}
	m.late = "dlq"

	// The features endpoint, under the file-features definition: its filters, a
	// distinct count, and the exactness a small set must claim.
	def, err := definition.LoadFile("testdata/tx_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fm, err := newAPIModel(ends, replay, gen, txs, def.Windows, def, "dlq")
	if err != nil {
		t.Fatal(err)
	}
	features := func(eurMin, idsExact string) []byte {
		asOf := t0 + 500
		return fmt.Appendf(nil, `{"entity_id":%q,"known":true,"partition":0,"as_of":%d,"as_of_time":%q,"last_offset":3,"pending":1,"at_range":{"from":%d,"to":%d},"definition":%q,`+
			`"features":{"txns_10s":2,"txns_1m":2,"txns_5m":2,"spend_1m":400,"spend_5m":400,"eur_min_1m":%s,"big_5m":null,"currencies_1m":2,"currencies_5m":2,"ids_1m":2},`+
			`"exact":{"currencies_exact":true,"ids_exact":%s}}`,
			entity, asOf, time.UnixMilli(asOf).UTC().Format(time.RFC3339Nano), t0-1000, asOf+300_000, def.Version+"@"+def.Hash(), eurMin, idsExact)
	}
	freq := func(body []byte) *apiRequest {
		r := req(200, "", body)
		r.ep = epFeatures
		return r
	}
	if got := fm.checkAnswers([]*apiRequest{freq(features("100", "true"))}, env, &apiStats{}); len(got) != 0 {
		t.Fatalf("a right features answer fails: %v", got)
	}
	for _, c := range []struct {
		name string
		body []byte
		want []string
	}{
		{"wrong filtered min", features("300", "true"), []string{"features.eur_min_1m = 300, want 100"}},
		{"inexact small set", features("100", "false"), []string{"exact.ids_exact = false, want true", "2 distinct values, max_exact 8"}},
	} {
		got := strings.Join(fm.checkAnswers([]*apiRequest{freq(c.body)}, env, &apiStats{}), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}
}

// TestFailureHistory: a difference from replay comes with its entity's accepted
// events in the minute before it, each with its outputs (where, late, first
// window's count), and nothing of other entities, dead letters or later events.
func TestFailureHistory(t *testing.T) {
	feat := func(count, src int64, at string) output {
		native := map[string]any{
			"event_id": "x", "entity_id": "card-1", "event_time": int64(0),
			"windows": []any{map[string]any{"window": "1m", "window_ms": int64(60_000), "bucket_ms": int64(1000),
				"count": count, "sum_minor": count, "min_minor": int64(1), "max_minor": int64(1)}},
			"ms_since_previous": nil, "late": false,
			"source_topic": "in", "source_partition": int32(0), "source_offset": src,
		}
		b, err := featuresCodec.BinaryFromNative(nil, native)
		if err != nil {
			t.Fatal(err)
		}
		return output{key: []byte("card-1"), value: b, srcTopic: "in", at: at}
	}
	const t0 = 1_795_000_000_000
	in := verdictInput{inputTopic: "in", ends: map[int32]int64{0: 5},
		gen: map[srcKey]string{{0, 0}: "valid e0", {0, 1}: "valid e1", {0, 2}: "late e2", {0, 3}: "valid e3", {0, 4}: "valid e4"},
		txs: map[string]genTx{"e0": {entity: "card-1", time: t0 - 90_000}, "e1": {entity: "card-1", time: t0 - 30_000},
			"e2": {entity: "card-1", time: t0 - 40_000}, "e3": {entity: "card-2", time: t0 - 10_000}, "e4": {entity: "card-1", time: t0}},
		replay: map[srcKey][]output{{0, 0}: {feat(1, 0, "r@0")}, {0, 1}: {feat(1, 1, "r@1")}, {0, 2}: {{dead: true, at: "rd@2"}},
			{0, 3}: {feat(1, 3, "r@3")}, {0, 4}: {feat(2, 4, "r@4")}},
	}
	outs := map[srcKey][]output{{0, 1}: {feat(1, 1, "o@1 (producer 7)")}, {0, 4}: {feat(2, 4, "o@4a"), feat(1, 4, "o@4b (producer 9)")}}
	h := history(srcKey{0, 4}, in, outs)
	for _, want := range []string{`entity "card-1" at input 0/4`, `0/1 "valid e1", event time -30000 ms: replay r@1 late=false count[0]=1`,
		"o@1 (producer 7) late=false count[0]=1", `0/4 "valid e4", event time +0 ms`, "o@4b (producer 9) late=false count[0]=1"} {
		if !strings.Contains(h, want) {
			t.Errorf("history lacks %q:\n%s", want, h)
		}
	}
	for _, not := range []string{"0/0", "0/2", "0/3"} {
		if strings.Contains(h, not+" ") {
			t.Errorf("history names %s (older than a minute, a dead letter, another entity):\n%s", not, h)
		}
	}
	if h := history(srcKey{0, 4}, verdictInput{gen: in.gen, replay: in.replay}, outs); h != "" {
		t.Errorf("history without the generator's transactions: %q", h)
	}
}
