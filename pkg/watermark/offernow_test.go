package watermark

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestOfferNowIsOfferThenReady runs the random partitions of TestMatchesOracle through
// two stages, one with Offer and the other with OfferNow: whenever OfferNow says an
// event is released at once, Ready on the Offer stage must return exactly that event,
// and after every op both stages must hold the same state (the same snapshot bytes,
// pending counts and pressure) and release the same events.
func TestOfferNowIsOfferThenReady(t *testing.T) {
	seeds := 100
	if testing.Short() {
		seeds = 15
	}
	cfgs := append(slices.Clone(propertyConfigs),
		Config{AllowedLateness: 0, HighEvents: 3, LowEvents: 1, HighBytes: 400, LowBytes: 100},
		Config{AllowedLateness: 100, HighEvents: 4, LowEvents: 2},
		Config{AllowedLateness: 0, MaxDedupeIDs: 7})
	nows := 0
	for ci, cfg := range cfgs {
		for seed := range seeds {
			r := rand.New(rand.NewPCG(uint64(seed), uint64(ci)+100))
			ops := genOps(r, 50+r.IntN(300), max(cfg.AllowedLateness, 10))
			a, b := mustNew(t, cfg), mustNew(t, cfg)
			var bufA, bufB []Event
			for i, o := range ops {
				var gotA, gotB []Event
				switch o.kind {
				case opOffer:
					va := a.Offer(o.ev)
					ev := o.ev
					vb, now := b.OfferNow(&ev)
					if va != vb {
						t.Fatalf("cfg %+v seed %d op %d: Offer %v, OfferNow %v", cfg, seed, i, va, vb)
					}
					if now {
						nows++
						if vb != Accepted {
							t.Fatalf("cfg %+v seed %d op %d: released at once but %v", cfg, seed, i, vb)
						}
						bufA = a.Ready(bufA[:0])
						if !sameEvents(bufA, []Event{o.ev}) {
							t.Fatalf("cfg %+v seed %d op %d: OfferNow released %+v at once, Ready after Offer %+v", cfg, seed, i, o.ev, bufA)
						}
					}
				case opReady:
					bufA, bufB = a.Ready(bufA[:0]), b.Ready(bufB[:0])
					gotA, gotB = bufA, bufB
				case opRemember:
					a.Remember(o.ev.EventID, o.ev.EventTime)
					b.Remember(o.ev.EventID, o.ev.EventTime)
				case opFlush:
					bufA, bufB = a.FlushAll(bufA[:0]), b.FlushAll(bufB[:0])
					gotA, gotB = bufA, bufB
				}
				if !sameEvents(gotA, gotB) {
					t.Fatalf("cfg %+v seed %d op %d: released %v after Offer, %v after OfferNow", cfg, seed, i, gotA, gotB)
				}
				if a.Pending() != b.Pending() || a.PendingBytes() != b.PendingBytes() || a.Pressure() != b.Pressure() || a.DedupeIDs() != b.DedupeIDs() {
					t.Fatalf("cfg %+v seed %d op %d: pending %d/%d bytes %d/%d pressure %v/%v ids %d/%d (Offer/OfferNow)", cfg, seed, i,
						a.Pending(), b.Pending(), a.PendingBytes(), b.PendingBytes(), a.Pressure(), b.Pressure(), a.DedupeIDs(), b.DedupeIDs())
				}
				if sa, sb := a.AppendSnapshot(nil), b.AppendSnapshot(nil); !bytes.Equal(sa, sb) {
					t.Fatalf("cfg %+v seed %d op %d: snapshots differ after Offer and OfferNow", cfg, seed, i)
				}
			}
		}
	}
	if nows == 0 {
		t.Fatal("OfferNow never released an event at once: the test exercises nothing")
	}
}
