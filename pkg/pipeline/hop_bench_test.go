package pipeline

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

const (
	benchGroupsDef    = "../../examples/features/payment_groups.yaml"
	benchGroupsSchema = "../../examples/features/payment_event.avsc"
	benchSources      = 3
)

// paymentBenchStream is n payment records of the example schema over benchSources
// input partitions (by the card's murmur2, as a keyed producer places them): 100 000
// cards, 30 000 devices of which a few are shared by many cards, 50 000 IPs and a hot
// one, device and IP null now and then, event times in order with a second's jitter.
// feedInterleaved processes n records of parts in the first stages, the
// partitions taking turns in slices of 64 records, as fetches of several
// partitions interleave in a live process, each sending its watermark every 1024.
func feedInterleaved(first *[benchSources]*Processor, parts *[benchSources][][]byte, n int, hop func(*Output)) {
	var next [benchSources]int
	for left := n; left > 0; {
		for src := range first {
			for range 64 {
				i := next[src]
				if i == len(parts[src]) {
					break
				}
				first[src].Process(Record{Topic: "payments", Partition: int32(src), Offset: int64(i), Value: parts[src][i]}, hop)
				next[src]++
				left--
				if i%1024 == 1023 {
					first[src].HopMarkers(false, hop)
				}
			}
		}
	}
}

func paymentBenchStream(b testing.TB, n int) (parts [benchSources][][]byte) {
	b.Helper()
	schema, err := os.ReadFile(benchGroupsSchema)
	if err != nil {
		b.Fatal(err)
	}
	c, err := goavro.NewCodec(string(schema))
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	nullable := func(p float64, v string) any {
		if rng.Float64() < p {
			return nil
		}
		return map[string]any{"string": v}
	}
	for i := range n {
		card := fmt.Sprintf("card-%d", rng.IntN(100_000))
		device := fmt.Sprintf("dev-%d", rng.IntN(30_000))
		if rng.IntN(20) == 0 {
			device = fmt.Sprintf("dev-shared-%d", rng.IntN(5))
		}
		ip := fmt.Sprintf("10.%d.%d.%d", rng.IntN(4), rng.IntN(250), rng.IntN(50))
		if rng.IntN(8) == 0 {
			ip = "10.9.9.9"
		}
		t := exampleT + int64(i) - rng.Int64N(1000)
		rec := map[string]any{
			"txn_id":    fmt.Sprintf("txn-%09d", i),
			"card":      map[string]any{"id": card, "bin": nil},
			"device_id": nullable(0.05, device),
			"ip":        nullable(0.05, ip),
			"merchant":  nil,
			"amount":    big.NewRat(rng.Int64N(100_000), 100),
			"ts":        time.UnixMilli(t).UTC(),
			"status":    []string{"APPROVED", "APPROVED", "APPROVED", "DECLINED"}[rng.IntN(4)],
		}
		v, err := c.BinaryFromNative(nil, rec)
		if err != nil {
			b.Fatal(err)
		}
		p := repartition.PartitionFor(card, benchSources)
		parts[p] = append(parts[p], v)
	}
	return parts
}

// BenchmarkGroups is the whole pipeline of a definition with 0, 1 and 2 re-keyed
// groups, in one process and without Kafka: each input record through its input
// partition's first stage (decode, dedupe, reorder, the in-place group, one hop
// record encoded per group), each hop record straight into its repartition
// partition's second stage (decode, merge, the group's features), markers as a
// tick sends them. One op is one input record, so groups=1 over groups=0 is what
// a group adds per event apart from the hop's produce and fetch.
func BenchmarkGroups(b *testing.B) {
	for _, groups := range []int{0, 1, 2} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			comp, specs := compileBenchGroups(b, groups)
			var hc *HopConfig
			second := make([][]*Processor, groups)
			if groups > 0 {
				hc = &HopConfig{Partitions: benchSources}
				for g, gs := range specs[1:] {
					hc.Groups = append(hc.Groups, HopGroup{Name: gs.Name, Topic: "__velocity-repartition-bench-" + gs.Name, Words: gs.Spec.Words()})
					for rp := range int32(benchSources) {
						p, err := New(Config{Topic: hc.Groups[g].Topic, Partition: rp, Features: gs.Spec, Merge: &MergeConfig{Group: gs.Name, Sources: benchSources}}, 0)
						if err != nil {
							b.Fatal(err)
						}
						second[g] = append(second[g], p)
					}
				}
			}
			var first [benchSources]*Processor
			for src := range first {
				var err error
				if first[src], err = New(Config{Topic: "payments", Partition: int32(src), Decoder: comp.Decoder(), Features: specs[0].Spec,
					Hops: hc, Watermark: watermark.Config{AllowedLateness: 1000}}, 0); err != nil {
					b.Fatal(err)
				}
			}
			parts := paymentBenchStream(b, b.N)
			var offs [2][benchSources]int64
			drop := func(*Output) {}
			hop := func(o *Output) {
				if !o.Hop {
					return
				}
				g := 0
				if groups > 1 && o.Topic == hc.Groups[1].Topic {
					g = 1
				}
				off := &offs[g][o.Partition]
				second[g][o.Partition].Process(Record{Topic: o.Topic, Partition: o.Partition, Offset: *off, Value: o.Value}, drop)
				*off++
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuclock.Nanos()
			feedInterleaved(&first, &parts, b.N, hop)
			b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkSecondStageCheckpoint is one checkpoint of a second stage whose Merger
// holds 50 000 events (two of its three sources ahead, the third silent), taken as
// the service takes it: BeginSnapshot into the buffer the last one gave back, Step,
// Finish, EndSnapshot.
func BenchmarkSecondStageCheckpoint(b *testing.B) {
	_, specs := compileBenchGroups(b, -1)
	gs := specs[1]
	p, err := New(Config{Topic: "__velocity-repartition-bench-" + gs.Name, Features: gs.Spec, Merge: &MergeConfig{Group: gs.Name, Sources: benchSources}}, 0)
	if err != nil {
		b.Fatal(err)
	}
	drop := func(*Output) {}
	ext := make([]uint64, gs.Spec.Words())
	var v []byte
	for i := range 50_000 {
		src := int32(i % 2)
		t := exampleT + int64(i)
		r := repartition.Record{Kind: repartition.KindEvent, Watermark: t, Event: repartition.Event{
			Source: src, Offset: int64(i), EventTime: t, Topic: "payments",
			Key: fmt.Sprintf("dev-%d", i%30_000), EventID: fmt.Sprintf("txn-%09d", i), Amount: int64(i), Ext: ext,
		}}
		if v, err = repartition.AppendRecord(v[:0], &r); err != nil {
			b.Fatal(err)
		}
		p.Process(Record{Topic: p.cfg.Topic, Offset: int64(i), Value: v}, drop)
	}
	if p.Pending() != 50_000 {
		b.Fatalf("%d pending, want 50000", p.Pending())
	}
	var buf []byte
	b.ReportAllocs()
	cpu0 := cpuclock.Nanos()
	for b.Loop() {
		ps := p.BeginSnapshot(buf[:0])
		ps.Step(math.MaxInt)
		if _, err := ps.Finish(); err != nil {
			b.Fatal(err)
		}
		p.EndSnapshot(ps)
		buf = ps.Bytes()
	}
	b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
}

// compileBenchGroups compiles benchGroupsDef keeping its first keep re-keyed
// groups (all when keep < 0): its decoder, and the engine spec of every group,
// the in-place group first.
func compileBenchGroups(tb testing.TB, keep int) (*definition.Compiled, []definition.GroupSpec) {
	tb.Helper()
	d, err := definition.LoadFile(benchGroupsDef)
	if err != nil {
		tb.Fatal(err)
	}
	if keep >= 0 {
		d.Groups = d.Groups[:keep]
	}
	schema, err := os.ReadFile(d.SchemaFile())
	if err != nil {
		tb.Fatal(err)
	}
	comp, err := definition.Compile(d, string(schema), codec.DefaultLimits())
	if err != nil {
		tb.Fatal(err)
	}
	specs, err := definition.EngineSpecs(d)
	if err != nil {
		tb.Fatal(err)
	}
	return comp, specs
}
