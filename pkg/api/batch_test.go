package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

var batchSeeds = []string{
	`{"entity_ids":["card-0","card-3"]}`,
	` { "entity_ids" : [ "card-0" , "card-3" ] , "windows" : [ "1m" ] , "at" : 1800000000000 } `,
	`{"entity_ids":[],"at":"2026-01-02T03:04:05Z"}`,
	`{"at":-0,"entity_ids":["a"]}`,
	`{"at":-12,"entity_ids":["a"],"windows":[]}`,
	`{}`,
	`{"entity_ids":["x"],"entity_ids":["y"]}`,
	`{"Entity_IDs":["x"]}`,
	`{"entity_ids":["caf\u00e9","tab\t"]}`,
	`{"entity_ids":["é"]}`,
	`{"entity_ids":null}`,
	`{"entity_ids":["a",null]}`,
	`{"windows":null,"entity_ids":["a"]}`,
	`{"at":01,"entity_ids":["a"]}`,
	`{"at":1.5,"entity_ids":["a"]}`,
	`{"at":1e3,"entity_ids":["a"]}`,
	`{"at":null,"entity_ids":["a"]}`,
	`{"entity_ids":["a"]} {}`,
	`{"entity_ids":["a"],}`,
	`{"entity_ids":["a"]`,
	`{"extra":1,"entity_ids":["a"]}`,
	``,
	`[]`,
}

// FuzzBatchBodyFast: whatever parseBatchFast accepts, the strict encoding/json path
// accepts too, with the same result; what it declines is left to that path.
func FuzzBatchBodyFast(f *testing.F) {
	for _, s := range batchSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		fast, ok := parseBatchFast(body)
		if !ok {
			return
		}
		var slow batchBody
		if e := decodeStrict([]byte(body), &slow); e != nil {
			t.Fatalf("%q: fast path accepted what encoding/json refuses: %s", body, e.Msg)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q:\n fast %#v\n slow %#v", body, fast, slow)
		}
	})
}

// TestBatchBodyFastAcceptsTheCommonForms: the fast path is taken for what clients send
// (else it would be correct but no faster), and declines what it must leave alone.
func TestBatchBodyFastAcceptsTheCommonForms(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{batchSeeds[0], true}, {batchSeeds[1], true}, {batchSeeds[2], true}, {batchSeeds[3], true}, {`{}`, true},
		{batchSeeds[4], false}, {batchSeeds[6], false}, {batchSeeds[7], false}, {batchSeeds[8], false},
		{batchSeeds[9], false}, {batchSeeds[12], false}, {batchSeeds[13], false}, {batchSeeds[14], false},
		{batchSeeds[17], false}, {batchSeeds[18], false}, {batchSeeds[20], false}, {``, false},
	} {
		if _, ok := parseBatchFast(tc.body); ok != tc.ok {
			t.Errorf("%q: fast %v, want %v", tc.body, ok, tc.ok)
		}
	}
}

// TestAppendBatchMatchesEncodingJSON: the hand-written batch answer is what
// encoding/json writes for the same results (local answers, forwarded ones, errors
// with and without a range).
func TestAppendBatchMatchesEncodingJSON(t *testing.T) {
	specs, _ := window.ParseSpecs(window.DefaultSpecs)
	s := &Server{specs: specs, windowHead: windowHeads(specs)}
	it := &service.ReadItem{Entity: `card<"7">`, Aggs: []window.Agg{{Count: 1, Sum: 2, Min: 3, Max: 4}, {Count: 5, Sum: 6, Min: 7, Max: 8}, {}, {Count: 9, Sum: 9, Min: 9, Max: 9}},
		Info: pipeline.LookupInfo{AsOf: t0, Known: true, Pending: 3, LastOffset: 41, From: -pipeline.MaxTime, To: t0 + 86_400_000}}
	from, to := int64(-5), int64(1<<62)
	remote := s.velocityOf(it, 1, []int{0, 3})
	results := []batchItem{
		{Status: 200, local: it, part: 2},
		{Status: 200, Velocity: &remote},
		{Status: 422, Error: &apiError{status: 422, Code: "at_out_of_range", Msg: "at & <range>", From: &from, To: &to}},
		{Status: 400, Error: errf(400, "invalid_entity_id", "entity_id is \x01 empty")},
	}
	for _, sel := range [][]int{{0, 1, 2, 3}, {0, 3}} {
		want := []batchItem{{Status: 200, Velocity: ptr(s.velocityOf(it, 2, sel))}}
		want = append(want, results[1:]...)
		exp, err := json.Marshal(batchResponse{Results: want})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.appendBatch(nil, results, sel); !bytes.Equal(got, exp) {
			t.Fatalf("sel %v:\n got  %s\n want %s", sel, got, exp)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestBatchSpreadOverPartitions: a batch over every partition of both instances, with
// invalid ids among them, answers each id in request order as its single lookup does.
func TestBatchSpreadOverPartitions(t *testing.T) {
	c := newCluster(t, "")
	var ids []string
	for i := range 20 {
		ids = append(ids, fmt.Sprintf("card-%d", i), "", fmt.Sprintf("card-%d", 19-i))
	}
	body, _ := json.Marshal(map[string]any{"entity_ids": ids})
	code, _, v := do(t, "POST", c.a.URL+"/v1/velocity:batch", string(body))
	if code != 200 {
		t.Fatalf("%d %v", code, v)
	}
	res := v["results"].([]any)
	if len(res) != len(ids) {
		t.Fatalf("%d results for %d ids", len(res), len(ids))
	}
	for i, id := range ids {
		r := res[i].(map[string]any)
		if id == "" {
			if r["status"].(float64) != 400 {
				t.Fatalf("empty id: %v", r)
			}
			continue
		}
		_, _, single := do(t, "GET", c.b.URL+"/v1/entities/"+id+"/velocity", "")
		if fmt.Sprint(r["velocity"]) != fmt.Sprint(single) || r["status"].(float64) != 200 {
			t.Fatalf("%s: batch %v, single %v", id, r, single)
		}
	}
}

// BenchmarkBatchHandler: one batch of 50 ids over the four partitions of one
// instance, the handler's cost without the network (compare 50 single lookups of
// BenchmarkVelocityHandler).
func BenchmarkBatchHandler(b *testing.B) {
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
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = fmt.Sprintf("%q", fmt.Sprintf("card-%d", i*2))
	}
	body := `{"entity_ids":[` + strings.Join(ids, ",") + `]}`
	w := &nullWriter{}
	b.ReportAllocs()
	for b.Loop() {
		w.Reset()
		srv.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/velocity:batch", strings.NewReader(body)))
		if w.code != 200 || w.n < 50*300 {
			b.Fatal(w.code, w.n)
		}
	}
}
