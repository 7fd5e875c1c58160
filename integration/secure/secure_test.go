//go:build integration

package secure

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/srtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/kafkaconn"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
	"github.com/velocity-consumer/velocity-consumer/pkg/registry"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// One SASL_SSL broker for every subtest: it takes ~10 s to start.
func TestProductionConnectivity(t *testing.T) {
	b := kafkatest.StartSecureBroker(t)
	scram := func(mech string) kafkaconn.Config {
		return kafkaconn.Config{TLS: kafkaconn.TLS{CAFile: b.CAFile},
			SASL: kafkaconn.SASL{Mechanism: mech, Username: b.ScramUser, Password: kafkaconn.NewSecret(b.ScramPassword)}}
	}
	plain := kafkaconn.Config{TLS: kafkaconn.TLS{CAFile: b.CAFile},
		SASL: kafkaconn.SASL{Mechanism: "PLAIN", Username: b.PlainUser, Password: kafkaconn.NewSecret(b.PlainPassword)}}

	t.Run("clients round trip", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			conn kafkaconn.Config
		}{
			{"SCRAM-SHA-512", scram("SCRAM-SHA-512")},
			{"SCRAM-SHA-256", scram("SCRAM-SHA-256")},
			{"PLAIN", plain},
			{"server name given explicitly", func() kafkaconn.Config {
				c := scram("SCRAM-SHA-512")
				c.TLS.ServerName = "localhost"
				return c
			}()},
		} {
			t.Run(tc.name, func(t *testing.T) {
				topic := kafkatest.CreateTopic(t, b.Addr, 1, nil)
				opts := options(t, tc.conn)
				ctx := kafkatest.Context(t, 30*time.Second)
				prod := kafkatest.Client(t, b.SASLAddr, opts...)
				if err := kafkatest.Produce(ctx, prod, &kgo.Record{Topic: topic, Value: []byte("over " + tc.name)}); err != nil {
					t.Fatal(err)
				}
				cons := kafkatest.Client(t, b.SASLAddr, append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
				fs := cons.PollFetches(ctx)
				if err := fs.Err(); err != nil {
					t.Fatal(err)
				}
				if recs := fs.Records(); len(recs) != 1 || string(recs[0].Value) != "over "+tc.name {
					t.Fatalf("read back %d records", len(recs))
				}
			})
		}
	})

	t.Run("clear errors", func(t *testing.T) {
		wrong := func(c kafkaconn.Config, f func(*kafkaconn.Config)) kafkaconn.Config { f(&c); return c }
		for _, tc := range []struct {
			name string
			conn kafkaconn.Config
			want []string // substrings of the error
		}{
			{"wrong SCRAM password", wrong(scram("SCRAM-SHA-512"), func(c *kafkaconn.Config) { c.SASL.Password = kafkaconn.NewSecret("not-it") }),
				[]string{"SASL_AUTHENTICATION_FAILED", "--sasl-password-file"}},
			{"wrong PLAIN password", wrong(plain, func(c *kafkaconn.Config) { c.SASL.Password = kafkaconn.NewSecret("not-it") }),
				[]string{"SASL_AUTHENTICATION_FAILED", "--sasl-username"}},
			{"SCRAM user tried with PLAIN", wrong(scram("PLAIN"), func(*kafkaconn.Config) {}),
				[]string{"SASL_AUTHENTICATION_FAILED"}},
			{"untrusted CA", wrong(scram("SCRAM-SHA-512"), func(c *kafkaconn.Config) { c.TLS.CAFile = b.OtherCAFile }),
				[]string{"unknown authority", "--tls-ca-file"}},
			{"system CAs do not know the broker's", wrong(scram("SCRAM-SHA-512"), func(c *kafkaconn.Config) { c.TLS = kafkaconn.TLS{Enabled: true} }),
				[]string{"unknown authority", "--tls-ca-file"}},
			{"no TLS against a TLS listener", wrong(scram("SCRAM-SHA-512"), func(c *kafkaconn.Config) { c.TLS = kafkaconn.TLS{} }),
				[]string{"add --tls"}},
			{"server name the certificate does not carry", wrong(scram("SCRAM-SHA-512"), func(c *kafkaconn.Config) { c.TLS.ServerName = "kafka.example.com" }),
				[]string{"--tls-server-name"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				start := time.Now()
				err := kafkaconn.Check(kafkatest.Context(t, 30*time.Second), append(options(t, tc.conn), kgo.SeedBrokers(b.SASLAddr)))
				if err == nil {
					t.Fatal("connected; want an error")
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				if p := tc.conn.SASL.Password.Reveal(); strings.Contains(err.Error(), p) {
					t.Errorf("error carries the password")
				}
				if d := time.Since(start); d > 15*time.Second {
					t.Errorf("took %v to fail: a misconfiguration must fail fast", d)
				}
			})
		}
	})

	// The whole service, plain Avro, over SASL_SSL with each kind of mechanism.
	for _, tc := range []struct {
		name string
		conn kafkaconn.Config
	}{
		{"service over SASL_SSL SCRAM-SHA-512", scram("SCRAM-SHA-512")},
		{"service over SASL_SSL PLAIN", plain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, out, dlq := kafkatest.CreateTopic(t, b.Addr, 2, nil), kafkatest.CreateTopic(t, b.Addr, 1, nil), kafkatest.CreateTopic(t, b.Addr, 1, nil)
			opts := options(t, tc.conn)
			cfg := serviceConfig(t, b.SASLAddr, in, out, dlq, opts)
			runService(t, cfg)
			now := time.Now().UnixMilli()
			var recs []*kgo.Record
			for i := range 20 {
				tx := codec.Transaction{EventID: fmt.Sprintf("e%d", i), EntityID: fmt.Sprintf("card-%d", i%3), AmountMinor: 100, Currency: "EUR", EventTime: now + int64(i)}
				recs = append(recs, &kgo.Record{Topic: in, Key: []byte(tx.EntityID), Value: codec.EncodeTransaction(&tx)})
			}
			recs = append(recs, &kgo.Record{Topic: in, Key: []byte("x"), Value: []byte{0xff, 0xff}})
			if err := kafkatest.Produce(kafkatest.Context(t, 30*time.Second), kafkatest.Client(t, b.SASLAddr, opts...), recs...); err != nil {
				t.Fatal(err)
			}
			r := newReader(t, b.SASLAddr, opts, out, dlq)
			r.waitFor(t, 20, 1, 60*time.Second)
			for _, v := range r.features() {
				if _, err := codec.DecodeFeatures(v); err != nil {
					t.Fatalf("features value is not plain Avro without a registry: %v", err)
				}
			}
		})
	}

	t.Run("service with a schema registry", func(t *testing.T) { testRegistry(t, b, scram("SCRAM-SHA-512")) })

	t.Run("velocity-consumer run with TLS, SCRAM and registry flags", func(t *testing.T) { testBinary(t, b) })

	t.Run("service refuses a wrong password at start", func(t *testing.T) {
		c := scram("SCRAM-SHA-512")
		c.SASL.Password = kafkaconn.NewSecret("not-it")
		cfg := serviceConfig(t, b.SASLAddr, "in-"+kafkatest.Topic(t), "out", "dlq", options(t, c))
		svc, err := service.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err = kafkaconn.Explain(svc.Run(kafkatest.Context(t, 60*time.Second)))
		if err == nil || !strings.Contains(err.Error(), "SASL_AUTHENTICATION_FAILED") || !strings.Contains(err.Error(), "--sasl-username") {
			t.Fatalf("Run: %v; want an authentication error naming the flags", err)
		}
		t.Logf("Run failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	})
}

// testRegistry runs the service with the registry decoder and wire-format output:
// ids resolve (our schema and an evolved version 2), bad records are decode dead
// letters, and a registry outage holds records without dead-lettering any.
func testRegistry(t *testing.T, b *kafkatest.SecureBroker, conn kafkaconn.Config) {
	reg := startRegistry(t)
	in, out, dlq := kafkatest.CreateTopic(t, b.Addr, 1, nil), kafkatest.CreateTopic(t, b.Addr, 1, nil), kafkatest.CreateTopic(t, b.Addr, 1, nil)
	ctx := kafkatest.Context(t, 3*time.Minute)
	cl, err := registry.NewClient(registry.Config{URLs: []string{reg.URL()}, RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	subject := in + "-value"
	v1 := createSchema(t, cl, subject, schemas.Transaction)
	v2 := createSchema(t, cl, subject, withField(`{"name":"merchant","type":["null","string"],"default":null}`))
	v3 := createSchema(t, cl, subject, withField(`{"name":"channel","type":"string","default":"web"}`))
	if v2.Version != 2 || v3.Version != 3 {
		t.Fatalf("evolved schemas at versions %d, %d; want 2, 3", v2.Version, v3.Version)
	}

	opts := options(t, conn)
	cfg := serviceConfig(t, b.SASLAddr, in, out, dlq, opts)
	outSubject, err := registry.Subject(registry.StrategyTopic, out, "io.velocity.v1.VelocityFeatures")
	if err != nil {
		t.Fatal(err)
	}
	outID, prefix, err := registry.RegisterOutput(ctx, cl, outSubject, schemas.VelocityFeatures)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Decoder = registry.NewDecoder(ctx, cl, cfg.Limits)
	cfg.FeaturesValuePrefix = prefix
	runService(t, cfg)

	now := time.Now().UnixMilli()
	n := 0
	tx := func(extra map[string]any) map[string]any {
		n++
		d := map[string]any{"event_id": fmt.Sprintf("e%d", n), "entity_id": fmt.Sprintf("card-%d", n%2),
			"amount_minor": int64(100 * n), "currency": "EUR", "event_time": time.UnixMilli(now + int64(n)).UTC()}
		for k, v := range extra {
			d[k] = v
		}
		return d
	}
	rec := func(v []byte) *kgo.Record { return &kgo.Record{Topic: in, Key: []byte("k"), Value: v} }
	prod := kafkatest.Client(t, b.SASLAddr, opts...)

	// 1. Registry up: v1 and v2 decode; no magic byte and an unknown id are dead letters.
	batch := []*kgo.Record{
		rec(wire(t, v1.ID, v1.Schema.Schema, tx(nil))),
		rec(wire(t, v2.ID, v2.Schema.Schema, tx(map[string]any{"merchant": goavro.Union("string", "shop")}))),
		rec(wire(t, v2.ID, v2.Schema.Schema, tx(map[string]any{"merchant": nil}))),
		rec(wire(t, v1.ID, v1.Schema.Schema, tx(nil))[registry.HeaderSize:]), // plain Avro
		rec(wire(t, 987654, v1.Schema.Schema, tx(nil))),                      // no such id
	}
	if err := kafkatest.Produce(ctx, prod, batch...); err != nil {
		t.Fatal(err)
	}
	r := newReader(t, b.SASLAddr, opts, out, dlq)
	r.waitFor(t, 3, 2, 60*time.Second)
	for _, v := range r.features() {
		if !bytes.HasPrefix(v, prefix) {
			t.Fatalf("features value starts %x, want the wire-format prefix %x (id %d)", v[:min(5, len(v))], prefix, outID)
		}
		if _, err := codec.DecodeFeatures(v[registry.HeaderSize:]); err != nil {
			t.Fatalf("features after the prefix: %v", err)
		}
	}
	got, err := cl.SchemaByID(ctx, outID)
	if err != nil || !strings.Contains(got.Schema, "VelocityFeatures") {
		t.Fatalf("output schema id %d in the registry: %v", outID, err)
	}
	dead := r.deadErrors()
	for _, want := range []string{"magic byte", "schema id 987654 does not exist"} {
		if !strings.Contains(strings.Join(dead, "\n"), want) {
			t.Errorf("dead letters %q: none says %q", dead, want)
		}
	}

	// 2. Registry down: records with an id not resolved yet wait; none is dead-lettered.
	reg.Down()
	outage := []*kgo.Record{
		rec(wire(t, v3.ID, v3.Schema.Schema, tx(map[string]any{"channel": "app"}))),
		rec(wire(t, v1.ID, v1.Schema.Schema, tx(nil))), // cached, but may not overtake the one above
		rec(wire(t, v3.ID, v3.Schema.Schema, tx(map[string]any{"channel": "pos"}))),
	}
	if err := kafkatest.Produce(ctx, prod, outage...); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	r.poll(t, time.Second)
	if f, d := len(r.features()), len(r.deadErrors()); f != 3 || d != 2 {
		t.Fatalf("during the registry outage: %d features, %d dead letters; want still 3 and 2", f, d)
	}

	// 3. Registry back: the held records are processed in order, none dead-lettered.
	reg.Up(t)
	r.waitFor(t, 6, 2, 60*time.Second)
	if d := len(r.deadErrors()); d != 2 {
		t.Fatalf("%d dead letters after the outage, want 2", d)
	}
}

// withField is our Transaction schema with one more field, as a producer's next version.
func withField(field string) string {
	i := strings.LastIndex(schemas.Transaction, "]")
	return schemas.Transaction[:i] + "," + field + schemas.Transaction[i:]
}

func createSchema(t *testing.T, cl *sr.Client, subject, schema string) sr.SubjectSchema {
	t.Helper()
	ss, err := cl.CreateSchema(kafkatest.Context(t, 10*time.Second), subject, sr.Schema{Schema: schema, Type: sr.TypeAvro})
	if err != nil {
		t.Fatalf("register under %s: %v", subject, err)
	}
	return ss
}

func wire(t *testing.T, id int, schema string, datum map[string]any) []byte {
	t.Helper()
	c, err := goavro.NewCodec(schema)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.BinaryFromNative(registry.AppendHeader(nil, id), datum)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func options(t *testing.T, c kafkaconn.Config) []kgo.Opt {
	t.Helper()
	opts, err := c.Options()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

func serviceConfig(t *testing.T, addr, in, out, dlq string, opts []kgo.Opt) service.Config {
	t.Helper()
	specs, err := window.ParseSpecs("1m:10s")
	if err != nil {
		t.Fatal(err)
	}
	return service.Config{
		Brokers: []string{addr}, Group: kafkatest.Group(t), InputTopic: in, OutputTopic: out, DLQTopic: dlq,
		Specs: specs, Limits: codec.DefaultLimits(), Store: checkpoint.NewMemoryStore(),
		CheckpointInterval: 500 * time.Millisecond, SessionTimeout: 10 * time.Second, Host: "secure-test",
		ClientOpts: opts,
	}
}

// runService runs svc until the test ends; the watermark holds events back until
// newer ones pass them, so tests use an idle timeout to see every output.
func runService(t *testing.T, cfg service.Config) {
	t.Helper()
	cfg.Watermark.IdleTimeout = 200 * time.Millisecond
	svc, err := service.New(cfg, zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("service: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("service did not stop within 30s")
		}
	})
}

// reader collects the features and dead-letter topics.
type reader struct {
	cl        *kgo.Client
	out, dlq  string
	feats     [][]byte
	deadErrs  []string
	deadCount int
}

func newReader(t *testing.T, addr string, opts []kgo.Opt, out, dlq string) *reader {
	cl := kafkatest.Client(t, addr, append(opts, kgo.ConsumeTopics(out, dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	return &reader{cl: cl, out: out, dlq: dlq}
}

func (r *reader) poll(t *testing.T, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	fs := r.cl.PollFetches(ctx)
	fs.EachRecord(func(rec *kgo.Record) {
		if rec.Topic == r.out {
			r.feats = append(r.feats, rec.Value)
			return
		}
		var reason, msg string
		for _, h := range rec.Headers {
			switch h.Key {
			case codec.HeaderReason:
				reason = string(h.Value)
			case codec.HeaderError:
				msg = string(h.Value)
			}
		}
		if reason != string(codec.ReasonDecode) {
			t.Errorf("dead letter with reason %q (%s), want only decode", reason, msg)
		}
		r.deadErrs = append(r.deadErrs, msg)
	})
}

func (r *reader) features() [][]byte   { return r.feats }
func (r *reader) deadErrors() []string { return r.deadErrs }

func (r *reader) waitFor(t *testing.T, features, dead int, within time.Duration) {
	t.Helper()
	end := time.Now().Add(within)
	for len(r.feats) < features || len(r.deadErrs) < dead {
		if time.Now().After(end) {
			t.Fatalf("after %v: %d features, %d dead letters; want %d and %d", within, len(r.feats), len(r.deadErrs), features, dead)
		}
		r.poll(t, time.Second)
	}
	if len(r.feats) != features || len(r.deadErrs) != dead {
		t.Fatalf("%d features, %d dead letters; want exactly %d and %d", len(r.feats), len(r.deadErrs), features, dead)
	}
}

func startRegistry(t *testing.T, opts ...srfake.Option) *srtest.Server {
	t.Helper()
	return srtest.Start(t, opts...)
}
