package pipeline

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// BenchmarkLookupFeatures: Processor.LookupFeatures of one entity at the default
// as-of time, over 10 000 entities with a day of history between them (the state
// BenchmarkLookup reads), under the default-like definition (count, sum, min and
// max over the default windows: what Lookup reads, as features) and the 8-feature
// one of BenchmarkDefinition (two filters, two distinct counts, one of them sampled
// beyond 32 values). "lookup" is Processor.Lookup of the unfiltered windows of the
// same processor, for the ratio.
func BenchmarkLookupFeatures(b *testing.B) {
	defs := map[string]string{
		"default-like": `
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [1m:1s, 5m:5s, 1h:1m, 24h:1h]
features:
  - {name: count, agg: count, windows: [1m, 5m, 1h, 24h]}
  - {name: sum, agg: sum, windows: [1m, 5m, 1h, 24h]}
  - {name: min, agg: min, windows: [1m, 5m, 1h, 24h]}
  - {name: max, agg: max, windows: [1m, 5m, 1h, 24h]}
`,
		"8-features": `
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
`,
	}
	for _, name := range []string{"default-like", "8-features"} {
		p := newFeaturesProcessor(b, defs[name], 1000)
		emit := func(*Output) {}
		t0 := int64(1_700_000_000_000)
		ids := make([]string, 10_000)
		for i := range ids {
			ids[i] = fmt.Sprintf("card-%08d", i)
		}
		rng := rand.New(rand.NewPCG(1, 1))
		for i := range 200_000 {
			id := ids[rng.IntN(len(ids))]
			tx := codec.Transaction{EventID: fmt.Sprint(i), EntityID: id, AmountMinor: rng.Int64N(10_000),
				Currency: []string{"EUR", "USD", "GBP", "CHF", ""}[rng.IntN(5)], EventTime: t0 + int64(i)*400}
			p.Process(Record{Offset: int64(i), Key: []byte(id), Value: codec.EncodeTransaction(&tx)}, emit)
		}
		b.Run(name+"/features", func(b *testing.B) {
			row := feature.NewRow(p.FeatureSpec())
			var sink int64
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := p.LookupFeatures(ids[i%len(ids)], 0, true, row); err != nil {
					b.Fatal(err)
				}
				sink += row.Values[0]
			}
			if sink == 0 {
				b.Fatal("nothing read")
			}
		})
		b.Run(name+"/lookup", func(b *testing.B) {
			out := make([]window.Agg, len(p.Specs()))
			var sink int64
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := p.Lookup(ids[i%len(ids)], 0, true, out); err != nil {
					b.Fatal(err)
				}
				sink += out[0].Count + out[3].Count
			}
			if sink == 0 {
				b.Fatal("nothing read")
			}
		})
	}
}
