package api

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// TestAppendLookupMatchesVelocityJSON: a local lookup's answer, written straight from
// the read item, is byte for byte what encoding/json writes for the velocityJSON
// built from it, for every window selection and for extreme times and values.
func TestAppendLookupMatchesVelocityJSON(t *testing.T) {
	specs, _ := window.ParseSpecs(window.DefaultSpecs)
	s := &Server{specs: specs, windowHead: windowHeads(specs)}
	type plain velocityJSON // without the MarshalJSON method
	rng := rand.New(rand.NewPCG(3, 4))
	times := []int64{0, -1, 1, t0, -pipeline.MaxTime, pipeline.MaxTime, 1<<62 - 7, -1<<62 + 999}
	ids := []string{"card-1", `a"b\c`, "tab\tnl\n<&>", "\x00\x1f", "é€😀", "\u2028x"}
	sels := [][]int{{0, 1, 2, 3}, {3}, {2, 0}, {}}
	for n := range 500 {
		it := service.ReadItem{Entity: ids[n%len(ids)], Aggs: make([]window.Agg, len(specs))}
		it.Info = pipeline.LookupInfo{AsOf: times[rng.IntN(len(times))], Known: rng.IntN(2) == 0, Pending: rng.IntN(1000),
			LastOffset: rng.Int64N(1<<40) - 1, From: times[rng.IntN(len(times))], To: times[rng.IntN(len(times))]}
		for i := range it.Aggs {
			it.Aggs[i] = window.Agg{Count: rng.Int64(), Sum: rng.Int64() - 1<<62, Min: -rng.Int64(), Max: rng.Int64()}
		}
		sel := sels[n%len(sels)]
		p := int32(rng.IntN(1 << 20))
		v := s.velocityOf(&it, p, sel)
		want, err := json.Marshal(plain(v))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.appendLookup(nil, &it, p, sel); string(got) != string(want) {
			t.Fatalf("item %d:\n got  %s\n want %s", n, got, want)
		}
	}
}

// TestRequestMetricsPerCode: the cached series count each (op, code) apart, as
// WithLabelValues would.
func TestRequestMetricsPerCode(t *testing.T) {
	c := newCluster(t, "")
	reg := prometheus.NewRegistry()
	srv, err := New(Config{Backend: c.backends["A"], Locator: c.loc, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		srv.ServeHTTP(&nullWriter{}, mustRequest(t, "GET", "/v1/entities/card-1/velocity"))
	}
	srv.ServeHTTP(&nullWriter{}, mustRequest(t, "GET", "/v1/entities//velocity"))
	srv.ServeHTTP(&nullWriter{}, mustRequest(t, "GET", "/nowhere"))
	for _, tc := range []struct {
		op, code string
		want     float64
	}{{"velocity", "200", 3}, {"velocity", "400", 1}, {"other", "404", 1}, {"batch", "200", 0}} {
		if got := testutil.ToFloat64(srv.requests.WithLabelValues(tc.op, tc.code)); got != tc.want {
			t.Errorf("%s %s: %v, want %v", tc.op, tc.code, got, tc.want)
		}
	}
}

func mustRequest(t testing.TB, method, target string) *http.Request {
	r, err := http.NewRequest(method, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// nullWriter is a ResponseWriter that keeps the status and discards the body, reused
// across requests (Reset) so that a benchmark counts the handler's allocations only.
type nullWriter struct {
	h    http.Header
	code int
	n    int
}

func (w *nullWriter) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{}
	}
	return w.h
}
func (w *nullWriter) WriteHeader(code int) { w.code = code }
func (w *nullWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	w.n += len(b)
	return len(b), nil
}
func (w *nullWriter) Reset() { clear(w.h); w.code, w.n = 0, 0 }
