package pipeline

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// benchStream is 100 000 entities, uniform, events in time order with a jitter
// of up to a second (so with lateness they wait in the reorder buffer), five
// currencies.
func benchStream(n int) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([][]byte, n)
	for i := range vals {
		tx := codec.Transaction{EventID: fmt.Sprintf("evt-%09d", i), EntityID: fmt.Sprintf("card-%d", rng.IntN(100_000)),
			AmountMinor: rng.Int64N(10000), Currency: []string{"EUR", "USD", "GBP", "CHF", ""}[rng.IntN(5)],
			EventTime: exampleT + int64(i) - rng.Int64N(1000)}
		vals[i] = codec.EncodeTransaction(&tx)
	}
	return vals
}

func benchRun(b *testing.B, p *Processor) {
	vals := benchStream(b.N)
	emit := func(*Output) {}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p.Process(Record{Offset: int64(i), Value: vals[i]}, emit)
	}
}

// BenchmarkDefaultPath is the pipeline without a definition (today's contract),
// with lateness 0 and 1 s: the cost a definition-free deployment pays, to be
// compared with the same benchmark on a build before feature definitions.
func BenchmarkDefaultPath(b *testing.B) {
	for _, lateness := range []int64{0, 1000} {
		b.Run(fmt.Sprintf("lateness=%d", lateness), func(b *testing.B) {
			benchRun(b, newTestProcessor(b, window.DefaultSpecs, lateness, LateDLQ))
		})
	}
}

// BenchmarkDefinition is the pipeline under feature definitions over our own
// Transaction schema, lateness 1 s: one that computes what the default
// contract does (count, sum, min, max over the default windows) and one of 8
// features with two filters and two distinct counts.
func BenchmarkDefinition(b *testing.B) {
	defaultLike := `
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [1m:1s, 5m:5s, 1h:1m, 24h:1h]
features:
  - {name: count, agg: count, windows: [1m, 5m, 1h, 24h]}
  - {name: sum, agg: sum, windows: [1m, 5m, 1h, 24h]}
  - {name: min, agg: min, windows: [1m, 5m, 1h, 24h]}
  - {name: max, agg: max, windows: [1m, 5m, 1h, 24h]}
`
	eight := `
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [1m:1s, 10m:10s, 1h:1m, 24h:1h]
features:
  - {name: txns, agg: count, windows: [1m, 1h, 24h]}
  - {name: spend, agg: sum, windows: [1h, 24h]}
  - {name: eur, agg: count, windows: [10m], where: [{field: currency, eq: EUR}]}
  - {name: currencies, agg: distinct_count, field: currency, windows: [24h]}
  - {name: small, agg: count, windows: [1h], where: [{field: amount_minor, lt: 100}]}
  - {name: biggest, agg: max, windows: [24h]}
  - {name: ids, agg: distinct_count, field: event_id, windows: [1h], max_exact: 32}
  - {name: eur_spend, agg: sum, windows: [24h], where: [{field: currency, eq: EUR}]}
`
	for _, c := range []struct{ name, def string }{{"default-like", defaultLike}, {"8-features", eight}} {
		b.Run(c.name, func(b *testing.B) { benchRun(b, newFeaturesProcessor(b, c.def, 1000)) })
	}
	b.Run("none", func(b *testing.B) { benchRun(b, newTestProcessor(b, window.DefaultSpecs, 1000, LateDLQ)) })
}
