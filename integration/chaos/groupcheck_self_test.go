//go:build integration

package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

// TestGroupChecksFire needs no broker: the model of a re-keyed group's
// answers (groupcheck_test.go) takes re-sends once, leaves events never held
// out, holds the last ones in release order pending, refuses a pending count
// that would hold an event counted out of order, sweeps along the released
// sequence only, and calls an answer stale by the records, not the offsets,
// below a commit; and a wrong answer through the groups route is reported, as
// is a transaction call's wrong entry, wrong set of entries, or unreadable one.
func TestGroupChecksFire(t *testing.T) {
	def, err := definition.LoadFile("testdata/tx_groups.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dg := def.Groups[0]
	if dg.Name != "cur" || dg.Key != "currency" {
		t.Fatalf("testdata/tx_groups.yaml's first group is %s by %s, want cur by currency", dg.Name, dg.Key)
	}
	const t0 = int64(1_795_000_000_000)
	r := apiPartition("EUR")
	type ev struct {
		id       string
		src      srcKey
		t, amt   int64
		entity   string
		outcome  string // "", "late", "late_after_idle"
		resendOf bool   // a re-send: the input record's second hop record
	}
	evs := []ev{
		{id: "ev-1", src: srcKey{0, 0}, t: t0, amt: 100, entity: "card-a"},
		{id: "ev-2", src: srcKey{1, 0}, t: t0 + 100, amt: 200, entity: "card-a"},
		{id: "ev-1", src: srcKey{0, 0}, t: t0, amt: 100, entity: "card-a", resendOf: true},
		{id: "ev-3", src: srcKey{0, 1}, t: t0 + 70_000, amt: 300, entity: "card-c"},
		{id: "ev-4", src: srcKey{1, 1}, t: t0 + 50, amt: 30_000, entity: "card-b", outcome: "late"},
		{id: "ev-5", src: srcKey{2, 0}, t: t0 + 20, amt: 5, entity: "card-d", outcome: "late_after_idle"},
	}
	lateCodec, err := goavro.NewCodec(`{"type":"record","name":"o","fields":[{"name":"late","type":"boolean"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	gen, txs, outs := map[srcKey]string{}, map[string]genTx{}, map[srcKey][]output{}
	marker, err := repartition.AppendRecord(nil, &repartition.Record{Kind: repartition.KindMarker, Watermark: t0 - 5, Event: repartition.Event{Source: 3}})
	if err != nil {
		t.Fatal(err)
	}
	recs := map[int32][]hopRecord{r: {{off: 0, value: marker}}} // offset 0: a marker
	for i, e := range evs {
		gen[e.src] = "valid " + e.id
		txs[e.id] = genTx{eventID: e.id, entity: e.entity, currency: "EUR", amount: e.amt, time: e.t}
		v, err := repartition.AppendRecord(nil, &repartition.Record{Kind: repartition.KindEvent, Watermark: e.t, Event: repartition.Event{
			Source: e.src.part, Offset: e.src.offset, EventTime: e.t, Topic: "in", Key: "EUR", EventID: e.id, Amount: e.amt}})
		if err != nil {
			t.Fatal(err)
		}
		recs[r] = append(recs[r], hopRecord{off: int64(i) + 1, value: v})
		if e.resendOf {
			continue
		}
		o := output{}
		switch e.outcome {
		case "late_after_idle":
			o = output{dead: true, reason: "late_after_idle"}
		default:
			if o.value, err = lateCodec.BinaryFromNative(nil, map[string]any{"late": e.outcome == "late"}); err != nil {
				t.Fatal(err)
			}
		}
		outs[e.src] = []output{o}
	}
	ends := map[int32]int64{0: 0, 1: 0, 2: 0, 3: 0}
	ends[r] = 7
	gm, err := newGroupModel(def, dg, "rp", recs, ends, outs, lateCodec, gen, txs)
	if err != nil {
		t.Fatal(err)
	}

	// Up to offset 6, the distinct events held or counted, in release order:
	// ev-1 (t0), ev-4 (t0+50, counted out of order), ev-2 (t0+100), ev-3
	// (t0+70000); ev-5 was never held, the re-send of ev-1 is ev-1.
	for _, c := range []struct {
		last           int64
		pending        int
		wantErr        string
		counted        int
		asOf, from, to int64
	}{
		{last: 6, pending: 1, counted: 3, asOf: t0 + 100, from: t0, to: t0 + 100 + 60_000},
		{last: 6, pending: 2, counted: 2, asOf: t0 + 50, from: t0, to: t0 + 50 + 60_000},
		{last: 6, pending: 3, wantErr: "counted out of order"},
		{last: 6, pending: 5, wantErr: "only 4 distinct events"},
		// ev-3 released: 70 s past the first sweep, it sweeps.
		{last: 6, pending: 0, counted: 4, asOf: t0 + 70_000, from: t0 + 70_000, to: t0 + 130_000},
		// Before any event: nothing counted, no sweep.
		{last: 0, pending: 0, counted: 0, asOf: 0, from: -maxTime, to: maxTime},
		{last: 0, pending: 1, wantErr: "only 0 distinct events"},
	} {
		s, err := gm.at(r, c.last, c.pending, "EUR")
		name := fmt.Sprintf("last %d pending %d", c.last, c.pending)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err %v, want one saying %q", name, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(s.entityEvs) != c.counted || s.asOf != c.asOf || s.from != c.from || s.to != c.to {
			t.Errorf("%s: %d counted, as_of %d, at_range [%d, %d]; want %d, %d, [%d, %d]", name, len(s.entityEvs), s.asOf, s.from, s.to, c.counted, c.asOf, c.from, c.to)
		}
	}

	v := gm.view()
	for _, c := range []struct {
		last, floor int64
		behind      bool
	}{{3, 5, true}, {4, 5, false}, {6, 7, false}, {5, 9, true}} {
		if got := v.behind(r, c.last, c.floor); got != c.behind {
			t.Errorf("state at %d, commit %d: behind %v, want %v", c.last, c.floor, got, c.behind)
		}
	}

	// The groups route, judged by the model.
	begin := time.Now()
	env := &judgeEnv{floors: map[string]*commitTimeline{"": {}, "cur": {}}, groups: map[string]*groupModel{"cur": gm},
		rel: func(at time.Time) string { return at.Sub(begin).String() }}
	answer := func(txns10s int) *apiRequest {
		asOf := t0 + 100
		body := fmt.Appendf(nil, `{"group":"cur","entity_id":"EUR","known":true,"partition":%d,"as_of":%d,"as_of_time":%q,"last_offset":6,"pending":1,"at_range":{"from":%d,"to":%d},"definition":%q,`+
			`"features":{"txns_10s":%d,"txns_1m":3,"spend_1m":30300,"big_1m":1,"entities_1m":2},"exact":{"entities_exact":true}}`,
			r, asOf, time.UnixMilli(asOf).UTC().Format(time.RFC3339Nano), t0, asOf+60_000, def.Version+"@"+def.Hash(), txns10s)
		return &apiRequest{mode: "default", ep: epRekeyed, group: "cur", entity: "EUR", url: "http://127.0.0.1:1/v1/groups/cur/entities/EUR/features",
			sent: begin, answered: begin, status: 200, ctype: "application/json", body: body}
	}
	var st apiStats
	var m apiModel
	if got := m.checkAnswers([]*apiRequest{answer(3)}, env, &st); len(got) != 0 {
		t.Fatalf("a right answer of group cur fails: %v", got)
	}
	if st.groups != 1 {
		t.Errorf("stats %+v, want one re-keyed group's answer judged", st)
	}
	got := strings.Join(m.checkAnswers([]*apiRequest{answer(2)}, env, &apiStats{}), "\n")
	for _, w := range []string{"answer unlike the input's", "features.txns_10s = 2, want 3", "expected from rp/"} {
		if !strings.Contains(got, w) {
			t.Errorf("a wrong count: the report lacks %q:\n%s", w, got)
		}
	}

	// The transaction call: the in-place group's key null (left out), cur's
	// EUR; each entry judged as the group's own lookup.
	tm := apiModel{def: def}
	eur := "EUR"
	txn := func(groups string) *apiRequest {
		return &apiRequest{mode: "default", ep: epTxn, keys: map[string]*string{"entity": nil, "cur": &eur}, url: "http://127.0.0.1:1/v1/transaction/features",
			sent: begin, answered: begin, status: 200, ctype: "application/json", body: []byte(`{"groups":{` + groups + `}}`)}
	}
	entry := func(txns10s int) string {
		return `"cur":{"status":200,"features":` + string(answer(txns10s).body) + `}`
	}
	st = apiStats{}
	if got := tm.checkAnswers([]*apiRequest{txn(entry(3))}, env, &st); len(got) != 0 {
		t.Fatalf("a right transaction call fails: %v", got)
	}
	if st.txns != 1 || st.groups != 1 {
		t.Errorf("stats %+v, want one transaction call and its one re-keyed entry judged", st)
	}
	for _, c := range []struct {
		name, groups string
		want         []string
	}{
		{"a wrong entry", entry(2), []string{"transaction call: answer unlike the input's", "group cur: features.txns_10s = 2, want 3"}},
		{"a null key answered", entry(3) + `,"entity":{"status":503,"error":{"code":"unavailable"}}`, []string{"transaction call: wrong groups", "want one per group asked with a key: [cur]"}},
		{"a group left out", ``, []string{"transaction call: wrong groups"}},
		{"a 503 without its error", `"cur":{"status":503}`, []string{"transaction call: unreadable entry", "status 503 without an error code"}},
		{"a 404 entry", `"cur":{"status":404,"error":{"code":"not_found"}}`, []string{"transaction call: 4xx to a well-formed request"}},
	} {
		got := strings.Join(tm.checkAnswers([]*apiRequest{txn(c.groups)}, env, &apiStats{}), "\n")
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: the report lacks %q:\n%s", c.name, w, got)
			}
		}
	}

	// With the call's at, an entry may be a 422, judged by the range it gives;
	// without one, a 422 is a client error to a well-formed call.
	at := int64(1_000)
	atTxn := func(groups string) *apiRequest { r := txn(groups); r.at = &at; return r }
	outside := `"cur":{"status":422,"error":{"code":"at_out_of_range","message":"…","from":5000,"to":9000}}`
	if got := tm.checkAnswers([]*apiRequest{atTxn(outside)}, env, &apiStats{}); len(got) != 0 {
		t.Fatalf("a transaction call's 422 entry for an at outside its range fails: %v", got)
	}
	for _, c := range []struct {
		name string
		req  *apiRequest
		want string
	}{
		{"a range that holds the at", atTxn(`"cur":{"status":422,"error":{"code":"at_out_of_range","message":"…","from":0,"to":9000}}`), "transaction call: at_out_of_range inside its range"},
		{"a 422 without an at", txn(outside), "transaction call: 4xx to a well-formed request"},
	} {
		if got := strings.Join(tm.checkAnswers([]*apiRequest{c.req}, env, &apiStats{}), "\n"); !strings.Contains(got, c.want) {
			t.Errorf("%s: the report lacks %q:\n%s", c.name, c.want, got)
		}
	}
}

// TestDescribeOffsets: the timeline's list of out-of-order events, as ranges per
// partition in offset order.
func TestDescribeOffsets(t *testing.T) {
	keys := map[srcKey]bool{{0, 650}: true, {0, 645}: true, {0, 646}: true, {0, 1148}: true, {2, 7}: true, {2, 8}: true}
	if got, want := describeOffsets(keys), " partition 0: 645-646 (2) 650 1148; partition 2: 7-8 (2);"; got != want {
		t.Fatalf("describeOffsets = %q, want %q", got, want)
	}
	if got := describeOffsets(nil); got != "" {
		t.Fatalf("describeOffsets(nil) = %q, want nothing", got)
	}
}
