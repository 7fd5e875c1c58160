package registry

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/velocity-consumer/velocity-consumer/internal/srtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/kafkaconn"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// evolvedTransaction is our schema plus an optional field, as a producer that
// moved on would register it as the subject's next version.
const evolvedTransaction = `{"type":"record","name":"Transaction","namespace":"io.velocity.v1","fields":[
	{"name":"event_id","type":"string"},{"name":"entity_id","type":"string"},
	{"name":"amount_minor","type":"long"},{"name":"currency","type":"string","default":""},
	{"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}},
	{"name":"merchant","type":["null","string"],"default":null}]}`

const t0 = int64(1_700_000_000_000)

// wire encodes datum with schema and puts the wire-format prefix for id before it.
func wire(t *testing.T, id int, schema string, datum map[string]any) []byte {
	t.Helper()
	c, err := goavro.NewCodec(schema)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.BinaryFromNative(AppendHeader(nil, id), datum)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func txDatum(event, entity string) map[string]any {
	return map[string]any{"event_id": event, "entity_id": entity, "amount_minor": int64(1234), "currency": "EUR",
		"event_time": time.UnixMilli(t0).UTC()}
}

// server is the fake registry with a client helper.
type server struct{ *srtest.Server }

func startServer(t *testing.T) *server { return &server{srtest.Start(t)} }

func (s *server) client(t *testing.T) *sr.Client {
	t.Helper()
	cl, err := NewClient(Config{URLs: []string{s.URL()}, RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func TestDecodeByRegistryID(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	cl := s.client(t)
	v1, err := cl.CreateSchema(ctx, "transactions-value", sr.Schema{Schema: schemas.Transaction, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := cl.CreateSchema(ctx, "transactions-value", sr.Schema{Schema: evolvedTransaction, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	if v2.ID == v1.ID || v2.Version != 2 {
		t.Fatalf("evolved schema registered as id %d version %d; want a new id at version 2", v2.ID, v2.Version)
	}
	proto, err := cl.CreateSchema(ctx, "other-value", sr.Schema{Schema: `syntax = "proto3"; message M { string a = 1; }`, Type: sr.TypeProtobuf})
	if err != nil {
		t.Fatal(err)
	}
	noTime, err := cl.CreateSchema(ctx, "bad-value", sr.Schema{Schema: `{"type":"record","name":"T","fields":[{"name":"event_id","type":"string"}]}`, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	evolved := txDatum("e2", "card-B")
	evolved["merchant"] = goavro.Union("string", "shop")

	tests := []struct {
		name   string
		value  []byte
		want   codec.Transaction
		reason codec.Reason // "" = accepted
		detail string       // substring of the rejection
	}{
		{"our schema by id", wire(t, v1.ID, schemas.Transaction, txDatum("e1", "card-A")),
			codec.Transaction{EventID: "e1", EntityID: "card-A", AmountMinor: 1234, Currency: "EUR", EventTime: t0}, "", ""},
		{"evolved writer schema (added optional field) as version 2", wire(t, v2.ID, evolvedTransaction, evolved),
			codec.Transaction{EventID: "e2", EntityID: "card-B", AmountMinor: 1234, Currency: "EUR", EventTime: t0}, "", ""},
		{"no magic byte: plain Avro is refused", wire(t, v1.ID, schemas.Transaction, txDatum("e3", "c"))[HeaderSize:],
			codec.Transaction{}, codec.ReasonDecode, "magic byte"},
		{"shorter than the prefix", []byte{0, 0, 1}, codec.Transaction{}, codec.ReasonDecode, "shorter than the 5-byte prefix"},
		{"an id the registry does not have", wire(t, 4242, schemas.Transaction, txDatum("e4", "c")),
			codec.Transaction{}, codec.ReasonDecode, "schema id 4242 does not exist"},
		{"a protobuf schema id", append(AppendHeader(nil, proto.ID), 0), codec.Transaction{}, codec.ReasonDecode, "not Avro"},
		{"a schema without our required fields", wire(t, noTime.ID, `{"type":"record","name":"T","fields":[{"name":"event_id","type":"string"}]}`, map[string]any{"event_id": "x"}),
			codec.Transaction{}, codec.ReasonDecode, "cannot be read by this consumer"},
		{"field rules still apply", wire(t, v1.ID, schemas.Transaction, txDatum("", "c")),
			codec.Transaction{}, codec.ReasonInvalidEventID, "event_id"},
		{"too large before any lookup", append(AppendHeader(nil, 999), make([]byte, 2000)...),
			codec.Transaction{}, codec.ReasonTooLarge, "over the limit"},
	}
	d := NewDecoder(ctx, cl, codec.Limits{MaxRecordBytes: 1024})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := d.Prepare(ctx, tt.value); err != nil {
				t.Fatalf("Prepare with the registry up: %v", err)
			}
			var tx codec.Transaction
			rej := d.Decode(tt.value, 0, false, &tx)
			switch {
			case tt.reason == "" && rej != nil:
				t.Fatalf("rejected: %v", rej)
			case tt.reason == "" && !reflect.DeepEqual(tx, tt.want):
				t.Fatalf("decoded %+v, want %+v", tx, tt.want)
			case tt.reason != "" && rej == nil:
				t.Fatalf("accepted %+v, want a %s rejection", tx, tt.reason)
			case tt.reason != "" && (rej.Reason != tt.reason || !strings.Contains(rej.Detail, tt.detail)):
				t.Fatalf("rejection %v, want %s containing %q", rej, tt.reason, tt.detail)
			}
		})
	}
}

// The cache: a resolved id costs no further registry call, even with the
// registry gone.
func TestResolvedIDsAreCached(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	cl := s.client(t)
	ss, err := cl.CreateSchema(ctx, "t-value", sr.Schema{Schema: schemas.Transaction, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	var mu sync.Mutex
	s.Reg.Intercept(func(_ http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		calls++
		mu.Unlock()
		return false
	})
	d := NewDecoder(ctx, cl, codec.Limits{})
	v := wire(t, ss.ID, schemas.Transaction, txDatum("e1", "c"))
	var tx codec.Transaction
	if rej := d.Decode(v, 0, false, &tx); rej != nil {
		t.Fatal(rej)
	}
	s.Down()
	for range 100 {
		if err := d.Prepare(ctx, v); err != nil {
			t.Fatalf("Prepare of a cached id with the registry down: %v", err)
		}
		if rej := d.Decode(v, 0, false, &tx); rej != nil {
			t.Fatal(rej)
		}
	}
	if calls != 1 {
		t.Fatalf("%d registry calls for one id, want 1", calls)
	}
}

// An outage is never a rejection: Prepare says "not now" for every kind of
// unavailability, and the same id prepares once the registry answers again.
func TestOutageIsRetryNotRejection(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(s *server)
	}{
		{"connection refused", func(s *server) { s.Down() }},
		{"503 from the registry", func(s *server) {
			s.Reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
				http.Error(w, `{"error_code":50301,"message":"overloaded"}`, http.StatusServiceUnavailable)
				return true
			})
		}},
		{"bare 404 from a proxy (wrong path), not the registry's 40403", func(s *server) {
			s.Reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
				http.Error(w, "<html>not here</html>", http.StatusNotFound)
				return true
			})
		}},
		{"401: credentials rejected", func(s *server) {
			s.Reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
				http.Error(w, `{"error_code":40101,"message":"unauthorized"}`, http.StatusUnauthorized)
				return true
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t)
			ctx := context.Background()
			cl := s.client(t)
			ss, err := cl.CreateSchema(ctx, "t-value", sr.Schema{Schema: schemas.Transaction, Type: sr.TypeAvro})
			if err != nil {
				t.Fatal(err)
			}
			v := wire(t, ss.ID, schemas.Transaction, txDatum("e1", "c"))
			d := NewDecoder(ctx, cl, codec.Limits{})
			tt.break_(s)
			for range 3 {
				err := d.Prepare(ctx, v)
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("Prepare during the outage: %v, want ErrUnavailable", err)
				}
			}
			s.Reg.ClearInterceptors()
			s.Up(t) // a no-op unless the case took it down
			if err := d.Prepare(ctx, v); err != nil {
				t.Fatalf("Prepare after the outage: %v", err)
			}
			var tx codec.Transaction
			if rej := d.Decode(v, 0, false, &tx); rej != nil || tx.EventID != "e1" {
				t.Fatalf("Decode after the outage: %v %+v", rej, tx)
			}
		})
	}
}

// A caller that never prepares (replay) gets no dead letter for an outage
// either: Decode waits until the registry is back.
func TestDecodeWaitsOutAnOutage(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	cl := s.client(t)
	ss, err := cl.CreateSchema(ctx, "t-value", sr.Schema{Schema: schemas.Transaction, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	s.Down()
	d := NewDecoder(ctx, cl, codec.Limits{})
	d.minBackoff, d.maxBackoff = 10*time.Millisecond, 50*time.Millisecond
	retried := make(chan struct{}, 100)
	d.onRetry = func(int, error) { retried <- struct{}{} }
	go func() {
		<-retried
		<-retried // two failed attempts, then the registry comes back
		s.Up(t)
	}()
	var tx codec.Transaction
	if rej := d.Decode(wire(t, ss.ID, schemas.Transaction, txDatum("e1", "c")), 0, false, &tx); rej != nil {
		t.Fatalf("Decode across an outage: %v", rej)
	}
	if tx.EventID != "e1" {
		t.Fatalf("decoded %+v", tx)
	}
}

// Only shutdown ends Decode's wait, and the rejection then names the outage.
func TestDecodeWaitEndsWithContext(t *testing.T) {
	s := startServer(t)
	cl := s.client(t)
	s.Down()
	ctx, cancel := context.WithCancel(context.Background())
	d := NewDecoder(ctx, cl, codec.Limits{})
	d.minBackoff = 10 * time.Millisecond
	d.onRetry = func(int, error) { cancel() }
	var tx codec.Transaction
	rej := d.Decode(wire(t, 7, schemas.Transaction, txDatum("e1", "c")), 0, false, &tx)
	if rej == nil || !strings.Contains(rej.Detail, "schema registry was unavailable") {
		t.Fatalf("Decode at shutdown during an outage: %v", rej)
	}
}

func TestSubject(t *testing.T) {
	name, err := RecordFullName(schemas.VelocityFeatures)
	if err != nil || name != "io.velocity.v1.VelocityFeatures" {
		t.Fatalf("RecordFullName = %q, %v", name, err)
	}
	tests := []struct{ strategy, want, err string }{
		{"", "features-value", ""},
		{"topic", "features-value", ""},
		{"record", "io.velocity.v1.VelocityFeatures", ""},
		{"topic-record", "features-io.velocity.v1.VelocityFeatures", ""},
		{"TopicNameStrategy", "", "want topic, record or topic-record"},
	}
	for _, tt := range tests {
		got, err := Subject(tt.strategy, "features", name)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "--schema-subject-strategy") {
				t.Errorf("Subject(%q) error %v, want one naming the flag and %q", tt.strategy, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Subject(%q) = %q, %v; want %q", tt.strategy, got, err, tt.want)
		}
	}
}

// Registering is idempotent: a restart finds the same id; the prefix is the
// magic byte and the id big-endian.
func TestRegisterOutput(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	cl := s.client(t)
	id1, h1, err := RegisterOutput(ctx, cl, "features-value", schemas.VelocityFeatures)
	if err != nil {
		t.Fatal(err)
	}
	id2, h2, err := RegisterOutput(ctx, cl, "features-value", schemas.VelocityFeatures)
	if err != nil {
		t.Fatal(err)
	}
	if id1 != id2 || string(h1) != string(h2) {
		t.Fatalf("second registration: id %d, first %d", id2, id1)
	}
	if len(h1) != HeaderSize || h1[0] != 0 || int(h1[1])<<24|int(h1[2])<<16|int(h1[3])<<8|int(h1[4]) != id1 {
		t.Fatalf("prefix %x for id %d", h1, id1)
	}
	got, err := cl.SchemaByID(ctx, id1)
	if err != nil || got.Schema == "" {
		t.Fatalf("registered schema %d not served: %v", id1, err)
	}
	s.Down()
	dctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	if _, _, err := RegisterOutput(dctx, cl, "features-value", schemas.VelocityFeatures); err == nil ||
		!strings.Contains(err.Error(), `subject "features-value"`) {
		t.Fatalf("RegisterOutput with the registry down until its deadline: %v, want an error naming the subject", err)
	}
}

// A registry that is down, restarting or overloaded when the service starts is
// waited for within the start's bound; one that answers no (credentials,
// incompatible schema) fails the start at once.
func TestRegisterOutputWaitsForTheRegistry(t *testing.T) {
	s := startServer(t)
	cl := s.client(t)
	// answer makes the registry answer status and body to the next n requests
	// (0: every one).
	answer := func(n int32, status int, body string) func(*testing.T) {
		return func(*testing.T) {
			var seen atomic.Int32
			s.Reg.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
				if n > 0 && seen.Add(1) > n {
					return false
				}
				w.WriteHeader(status)
				w.Write([]byte(body))
				return true
			})
		}
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) // before RegisterOutput; the registry is up
		want  string             // "": registered
		fast  bool               // fails well before the deadline
	}{
		{"down, then back", func(t *testing.T) {
			s.Down()
			time.AfterFunc(600*time.Millisecond, func() { s.Up(t) })
		}, "", false},
		{"answering 503, then 200", answer(3, http.StatusServiceUnavailable, `{"error_code":50301,"message":"restarting"}`), "", false},
		{"credentials refused", answer(0, http.StatusUnauthorized, `{"error_code":401,"message":"Unauthorized"}`), "Unauthorized", true},
		{"an incompatible schema", answer(0, http.StatusConflict,
			`{"error_code":409,"message":"Schema being registered is incompatible with an earlier schema"}`), "incompatible", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.Up(t)
			s.Reg.ClearInterceptors()
			tc.setup(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			begin := time.Now()
			_, _, err := RegisterOutput(ctx, cl, "waits-value", schemas.VelocityFeatures)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("RegisterOutput: %v, want it to wait for the registry", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("RegisterOutput: %v, want an error with %q", err, tc.want)
			case tc.fast && time.Since(begin) > 5*time.Second:
				t.Fatalf("RegisterOutput took %s to fail on a definite no", time.Since(begin))
			}
		})
	}
	s.Reg.ClearInterceptors()
}

func TestNewClientRefusesBadURLs(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		err  string
	}{
		{"no URL", Config{}, "no URL"},
		{"not http", Config{URLs: []string{"localhost:8081"}}, "want an http:// or https:// URL"},
		{"password in the URL is refused and not echoed", Config{URLs: []string{"http://u:hunter2@reg:8081"}}, "not in the URL"},
		{"user without password", Config{URLs: []string{"http://reg:8081"}, Username: "u"}, "go together"},
		{"password without user", Config{URLs: []string{"http://reg:8081"}, Password: kafkaconn.NewSecret("hunter2")}, "go together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewClient(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("error %v, want %q", err, tt.err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error %q echoes the password", err)
			}
		})
	}
}

// Every partition shares one Decoder.
func TestConcurrentDecode(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	cl := s.client(t)
	var ids []int
	for i, sch := range []string{schemas.Transaction, evolvedTransaction} {
		ss, err := cl.CreateSchema(ctx, "t-value", sr.Schema{Schema: sch, Type: sr.TypeAvro})
		if err != nil {
			t.Fatal(i, err)
		}
		ids = append(ids, ss.ID)
	}
	vals := [][]byte{wire(t, ids[0], schemas.Transaction, txDatum("a", "c")), wire(t, ids[1], evolvedTransaction, func() map[string]any {
		d := txDatum("b", "c")
		d["merchant"] = nil
		return d
	}())}
	d := NewDecoder(ctx, cl, codec.Limits{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var tx codec.Transaction
			for i := range 200 {
				v := vals[(g+i)%2]
				if err := d.Prepare(ctx, v); err != nil {
					t.Error(err)
					return
				}
				if rej := d.Decode(v, 0, false, &tx); rej != nil {
					t.Error(rej)
					return
				}
			}
		})
	}
	wg.Wait()
}
