package pipeline

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// memGroupsStream is events payment records of the example schema for cards cards,
// each with a home device (two cards a device) and a home IP (four cards an IP),
// spread evenly over span in time order with jitter inside the lateness, over
// benchSources input partitions by the card's murmur2.
func memGroupsStream(t *testing.T, cards, events int, span time.Duration) (parts [benchSources][][]byte) {
	t.Helper()
	schema, err := os.ReadFile(benchGroupsSchema)
	if err != nil {
		t.Fatal(err)
	}
	c, err := goavro.NewCodec(string(schema))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	step := span.Milliseconds() / int64(events)
	for i := range events {
		n := i % cards // every card the same number of events
		card := fmt.Sprintf("card-%08d", n)
		rec := map[string]any{
			"txn_id":    fmt.Sprintf("txn-%09d", i),
			"card":      map[string]any{"id": card, "bin": nil},
			"device_id": map[string]any{"string": fmt.Sprintf("dev-%08d", n/2)},
			"ip":        map[string]any{"string": fmt.Sprintf("10.%d.%d.%d", n/4/65536, n/4/256%256, n/4%256)},
			"merchant":  nil,
			"amount":    big.NewRat(rng.Int64N(100_000), 100),
			"ts":        time.UnixMilli(exampleT + int64(i)*step - rng.Int64N(500)).UTC(),
			"status":    []string{"APPROVED", "APPROVED", "APPROVED", "DECLINED"}[rng.IntN(4)],
		}
		v, err := c.BinaryFromNative(nil, rec)
		if err != nil {
			t.Fatal(err)
		}
		p := repartition.PartitionFor(card, benchSources)
		parts[p] = append(parts[p], v)
	}
	return parts
}

func heapAfterGC() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestMemoryPerEntityGroups measures the heap a definition with 1, 2 and 3 groups
// (examples/features/payment_groups.yaml: card in place; + device; + ip) holds per
// key once a stream has been processed and every event released: the first stages
// (the card group's state, the dedupe ids, the hop bookkeeping) and, per re-keyed
// group, its second stages (the merger and the group's window state), each measured
// as the heap freed when it is dropped. The first stages are measured with the
// default dedupe horizon (24 h: every event id of the stream is kept) and with 1 s
// (almost none): the difference is the dedupe ids, a cost per event within the
// horizon rather than per key. It fails when a key costs more than
// maxBytesPerKey, or when the stages do not hold the keys the stream has.
func TestMemoryPerEntityGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("measures heap over 100 000s of events")
	}
	const maxBytesPerKey = 8 << 10
	for _, c := range []struct {
		cards, events int
		span          time.Duration
	}{
		{20_000, 60_000, time.Hour},     // 3 events per card, 6 per device, 12 per IP
		{2_000, 60_000, time.Hour},      // 30 per card
		{2_000, 60_000, 24 * time.Hour}, // 30 per card over a day: every window bucket apart
	} {
		parts := memGroupsStream(t, c.cards, c.events, c.span)
		for _, dedupe := range []time.Duration{0, time.Second} {
			for groups := 1; groups <= 3; groups++ {
				name := fmt.Sprintf("%d cards, %d events over %v, dedupe horizon %v, %d groups", c.cards, c.events, c.span, dedupe, groups)
				t.Run(name, func(t *testing.T) {
					comp, specs := compileBenchGroups(t, groups-1)
					base := heapAfterGC()
					var hc *HopConfig
					second := make([][]*Processor, groups-1)
					if groups > 1 {
						hc = &HopConfig{Partitions: benchSources}
						for g, gs := range specs[1:] {
							hc.Groups = append(hc.Groups, HopGroup{Name: gs.Name, Topic: "__velocity-repartition-mem-" + gs.Name, Words: gs.Spec.Words()})
							for rp := range int32(benchSources) {
								p, err := New(Config{Topic: hc.Groups[g].Topic, Partition: rp, Specs: gs.Spec.Windows, Features: gs.Spec, Merge: &MergeConfig{Group: gs.Name, Sources: benchSources}}, 0)
								if err != nil {
									t.Fatal(err)
								}
								second[g] = append(second[g], p)
							}
						}
					}
					var first [benchSources]*Processor
					for src := range first {
						var err error
						if first[src], err = New(Config{Topic: "payments", Partition: int32(src), Specs: specs[0].Spec.Windows, Decoder: comp.Decoder(), Features: specs[0].Spec,
							Hops: hc, Watermark: watermark.Config{AllowedLateness: 1000, DedupeHorizon: dedupe.Milliseconds()}}, 0); err != nil {
							t.Fatal(err)
						}
					}
					var offs [2][benchSources]int64
					features := make([]int, groups)
					hop := func(o *Output) {
						if !o.Hop {
							if !o.Dead {
								features[0]++
							}
							return
						}
						g := 0
						if groups > 2 && o.Topic == hc.Groups[1].Topic {
							g = 1
						}
						off := &offs[g][o.Partition]
						second[g][o.Partition].Process(Record{Topic: o.Topic, Partition: o.Partition, Offset: *off, Value: o.Value}, func(o *Output) {
							if !o.Dead {
								features[g+1]++
							}
						})
						*off++
					}
					feedInterleaved(&first, &parts, c.events, hop)
					for _, p := range first {
						p.Flush(hop)
						p.EndOfInput(hop)
					}
					keys, ids := []int{0, 0, 0}, 0
					for _, p := range first {
						keys[0] += p.Entities()
						ids += p.DedupeIDs()
					}
					for g := range second {
						for _, p := range second[g] {
							keys[g+1] += p.Entities()
							if n := p.Pending(); n != 0 {
								t.Fatalf("group %d: %d events still pending after every source ended", g+1, n)
							}
						}
					}
					wantKeys := []int{c.cards, c.cards / 2, c.cards / 4}
					for g := range groups {
						if keys[g] != wantKeys[g] || features[g] != c.events {
							t.Fatalf("group %s: %d keys and %d rows; want %d and %d", specs[g].Name, keys[g], features[g], wantKeys[g], c.events)
						}
					}
					total := heapAfterGC() - base
					// Drop the groups' second stages one by one, then the first stages:
					// each step frees what that part held.
					per := make([]float64, groups)
					prev := total + base
					for g := len(second) - 1; g >= 0; g-- {
						second[g] = nil
						now := heapAfterGC()
						per[g+1] = float64(prev-now) / float64(keys[g+1])
						prev = now
					}
					// The first stages stay reachable up to here (the compiler would
					// otherwise let them go after their last use above).
					runtime.KeepAlive(first)
					runtime.KeepAlive(comp)
					hc, first, comp, hop = nil, [benchSources]*Processor{}, nil, nil
					now := heapAfterGC()
					per[0] = float64(prev-now) / float64(keys[0])
					runtime.KeepAlive(parts)
					line := fmt.Sprintf("total %.0f B per card (%d B; %d event ids kept for dedupe)", float64(total)/float64(keys[0]), total, ids)
					for g := range groups {
						line += fmt.Sprintf("; %s: %.0f B per key (%d keys, %d events each)", specs[g].Name, per[g], keys[g], c.events/keys[g])
						if per[g] <= 0 || per[g] > maxBytesPerKey {
							t.Errorf("group %s: %.0f bytes per key; want 1..%d", specs[g].Name, per[g], maxBytesPerKey)
						}
					}
					t.Log(line)
				})
			}
		}
	}
}
