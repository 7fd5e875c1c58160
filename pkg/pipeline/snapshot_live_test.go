package pipeline

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// TestSnapshotsInProgressChangeNoOutput: the live service takes its checkpoints
// while the partition goes on, a snapshot begun at one record and stepped a few
// entities at a time between the next ones, and finished on another goroutine
// (copy-on-write: an entity about to change is copied first). A snapshot in
// progress must change nothing a record's output reads: the outputs, and the
// state at the end, are those of the same records processed with no snapshot at
// all, under either late policy, with the reorder buffer and without, over a
// stream with out-of-order, late and repeated events, gaps that age entities out
// of their windows, and many entities, so that steps and changes meet.
func TestSnapshotsInProgressChangeNoOutput(t *testing.T) {
	const specs = "10s:1s,1m:10s,5m:30s"
	for _, late := range []LatePolicy{LateDLQ, LateApply} {
		for _, lateness := range []int64{0, 1500} {
			for seed := range uint64(4) {
				t.Run(fmt.Sprintf("%s/lateness=%d/seed=%d", late, lateness, seed), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 0x736e6170))
					records := liveSnapshotStream(rng, 4000)
					want := map[int64]result{}
					clean := newTestProcessor(t, specs, lateness, late)
					for _, r := range records {
						clean.Process(r, collect(t, want))
					}
					wantState := clean.AppendSnapshot(nil)

					got := map[int64]result{}
					p := newTestProcessor(t, specs, lateness, late)
					// Each snapshot, finished later, must hold the state at its
					// beginning (AppendSnapshot then).
					type pending struct {
						ps   *PendingSnapshot
						want []byte
					}
					var open []pending
					finish := func(at string, s pending) {
						b, err := s.ps.Finish()
						if err != nil {
							t.Fatalf("%s: finish: %v", at, err)
						}
						if !bytes.Equal(b, s.want) {
							t.Fatalf("%s: a snapshot finished later differs from the state at its beginning", at)
						}
						p.EndSnapshot(s.ps)
					}
					for i, r := range records {
						p.Process(r, collect(t, got))
						switch x := rng.IntN(100); {
						case x < 3 && len(open) < 2:
							open = append(open, pending{want: p.AppendSnapshot(nil), ps: p.BeginSnapshot(nil)})
						case x < 60 && len(open) > 0:
							if open[0].ps.Step(1 + rng.IntN(40)) {
								finish(fmt.Sprint("record ", i), open[0])
								open = open[1:]
							}
						}
					}
					for _, s := range open {
						for !s.ps.Step(1 << 20) {
						}
						finish("end", s)
					}
					if len(got) != len(want) {
						t.Fatalf("%d outputs with snapshots in progress, %d without", len(got), len(want))
					}
					for off, w := range want {
						if g := got[off]; g.dead != w.dead || g.reason != w.reason || !bytes.Equal(g.value, w.value) {
							t.Fatalf("offset %d: with snapshots in progress %+v, without %+v", off, g.f, w.f)
						}
					}
					if st := p.AppendSnapshot(nil); !bytes.Equal(st, wantState) {
						t.Fatalf("state at the end differs from the one never snapshotted (%d and %d bytes)", len(st), len(wantState))
					}
				})
			}
		}
	}
}

// liveSnapshotStream is n records over 300 entities (a few hot): event times
// moving on by up to 400 ms, now and then far ahead (entities age out of every
// window), 10 % behind the newest by up to 2 s (within the lateness or not), 4 %
// behind by up to 5 min (late; under --late=apply counted if their buckets are
// kept), 3 % resends of an earlier record (duplicates), 1 % undecodable.
func liveSnapshotStream(rng *rand.Rand, n int) []Record {
	var out []Record
	now := exampleT
	entity := func() string {
		if rng.IntN(3) == 0 {
			return fmt.Sprint("hot-", rng.IntN(5))
		}
		return fmt.Sprint("e-", rng.IntN(300))
	}
	for i := range n {
		off := int64(i)
		var t int64
		switch x := rng.IntN(100); {
		case x < 1:
			out = append(out, Record{Topic: "tx", Offset: off, Key: []byte("x"), Value: []byte("not avro")})
			continue
		case x < 4 && len(out) > 0:
			r := out[rng.IntN(len(out))]
			r.Offset = off
			out = append(out, r)
			continue
		case x < 8:
			t = now - rng.Int64N(300_000)
		case x < 18:
			t = now - rng.Int64N(2000)
		case x < 19:
			now += 400_000 + rng.Int64N(3_600_000)
			t = now
		default:
			now += rng.Int64N(400)
			t = now
		}
		e := entity()
		tx := codec.Transaction{EventID: fmt.Sprint("id-", i), EntityID: e, AmountMinor: rng.Int64N(10_000), Currency: "EUR", EventTime: t}
		out = append(out, Record{Topic: "tx", Offset: off, Key: []byte(e), Value: codec.EncodeTransaction(&tx)})
	}
	return out
}
