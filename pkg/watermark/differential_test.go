package watermark

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/watermark/internal/refwm"
)

// twin runs this package's Stage and the frozen reference (refwm: the same Stage with
// the {hash, time} table the compact one replaced) on the same operations; every
// answer, release, count and snapshot byte of the two must be equal. Everything the
// reference answers also goes into tr, whose digest per (case, seed, steps) is kept
// in transcriptGolden: that file lets a test without the reference check the same
// runs once refwm is gone.
type twin struct {
	t              *testing.T
	tr             *transcript
	cfg            Config
	n              *Stage
	o              *refwm.Stage
	nstore, ostore *memSegments
	// snapshots begun and not yet finished: the Stage goes on under their views
	open []twinSnap
}

type twinSnap struct {
	nbuf, obuf []byte
	np         *PendingSnapshot
	op         *refwm.PendingSnapshot
	segmented  bool
}

func refConfig(c Config, store *memSegments) refwm.Config {
	rc := refwm.Config{
		AllowedLateness: c.AllowedLateness, DedupeHorizon: c.DedupeHorizon, DisableDedupe: c.DisableDedupe,
		MaxDedupeIDs: c.MaxDedupeIDs, HighEvents: c.HighEvents, LowEvents: c.LowEvents,
		HighBytes: c.HighBytes, LowBytes: c.LowBytes, MaxMergeBytes: c.MaxMergeBytes,
	}
	if c.Segments != nil {
		rc.Segments = store
	}
	return rc
}

func newTwin(t *testing.T, cfg Config, segmented bool) *twin {
	tw := &twin{t: t, tr: newTranscript(), cfg: cfg, nstore: newMemSegments(), ostore: newMemSegments()}
	if segmented {
		tw.cfg.Segments = tw.nstore
	}
	var err error
	if tw.n, err = New(tw.cfg); err != nil {
		t.Fatal(err)
	}
	if tw.o, err = refwm.New(refConfig(tw.cfg, tw.ostore)); err != nil {
		t.Fatal(err)
	}
	return tw
}

func sameAsRef(a []Event, b []refwm.Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], Event(b[i])
		if x.Offset != y.Offset || x.EventTime != y.EventTime || x.EventID != y.EventID || x.EntityID != y.EntityID ||
			x.Amount != y.Amount || x.Size != y.Size || x.Aux != y.Aux || !slices.Equal(x.Ext, y.Ext) {
			return false
		}
	}
	return true
}

func (tw *twin) check(what string) {
	tw.t.Helper()
	n, o := tw.n, tw.o
	nw, nok := n.Watermark()
	ow, ook := o.Watermark()
	if n.DedupeIDs() != o.DedupeIDs() || n.DedupeCapEvictions() != o.DedupeCapEvictions() ||
		n.Pending() != o.Pending() || n.PendingBytes() != o.PendingBytes() || n.Pressure() != o.Pressure() ||
		nw != ow || nok != ook || n.ids.len() > n.DedupeIDs() {
		tw.t.Fatalf("%s: ids %d/%d (table %d), evictions %d/%d, pending %d/%d, bytes %d/%d, pressure %v/%v, watermark %d,%v/%d,%v",
			what, n.DedupeIDs(), o.DedupeIDs(), n.ids.len(), n.DedupeCapEvictions(), o.DedupeCapEvictions(), n.Pending(), o.Pending(),
			n.PendingBytes(), o.PendingBytes(), n.Pressure(), o.Pressure(), nw, nok, ow, ook)
	}
	tw.tr.state(o.DedupeIDs(), o.DedupeCapEvictions(), o.Pending(), o.PendingBytes(), o.Pressure(), ow, ook)
}

// refEvents converts the reference's events for the transcript.
func refEvents(b []refwm.Event) []Event {
	a := make([]Event, len(b))
	for i := range b {
		a[i] = Event(b[i])
	}
	return a
}

// finish completes the oldest open snapshot of both and compares their bytes.
func (tw *twin) finish() {
	tw.t.Helper()
	s := tw.open[0]
	tw.open = tw.open[1:]
	nb, nerr := s.np.Finish(s.nbuf, 0)
	ob, oerr := s.op.Finish(s.obuf, 0)
	if (nerr == nil) != (oerr == nil) || (nerr != nil && nerr.Error() != oerr.Error()) || !bytes.Equal(nb, ob) {
		tw.t.Fatalf("snapshot (segmented %v) differs: %d bytes, err %v; reference %d bytes, err %v", s.segmented, len(nb), nerr, len(ob), oerr)
	}
	tw.tr.tag('E')
	tw.tr.bool(s.segmented)
	tw.tr.bytes(ob)
	tw.tr.err(oerr)
	tw.n.EndSnapshot(s.np)
	tw.o.EndSnapshot(s.op)
	if s.segmented && nerr == nil {
		ng, og := tw.n.SnapshotSaved(s.np), tw.o.SnapshotSaved(s.op)
		if !slices.EqualFunc(ng, og, bytes.Equal) {
			tw.t.Fatalf("segments dropped differ: %q, reference %q", ng, og)
		}
		tw.tr.tag('G')
		tw.tr.int(int64(len(og)))
		for _, g := range og {
			tw.tr.bytes(g)
		}
		tw.nstore.delete(ng)
		tw.ostore.delete(og)
	}
}

// restore replaces both stages with restores of the current Stage's snapshot under
// cfg; the reference reads the same bytes.
func (tw *twin) restore(cfg Config) {
	tw.t.Helper()
	for len(tw.open) > 0 {
		tw.finish()
	}
	data := tw.n.AppendSnapshot(nil)
	if ref := tw.o.AppendSnapshot(nil); !bytes.Equal(data, ref) {
		tw.t.Fatalf("AppendSnapshot differs before restore: %d bytes, reference %d", len(data), len(ref))
	} else {
		tw.tr.tag('A')
		tw.tr.bytes(ref)
	}
	if tw.cfg.Segments != nil {
		cfg.Segments = tw.nstore
	}
	n, nerr := Restore(cfg, data)
	o, oerr := refwm.Restore(refConfig(cfg, tw.ostore), data)
	if nerr != nil || oerr != nil {
		tw.t.Fatalf("restore: %v; reference %v", nerr, oerr)
	}
	tw.tr.tag('T')
	tw.tr.int(cfg.DedupeHorizon)
	tw.tr.int(int64(cfg.MaxDedupeIDs))
	tw.tr.err(oerr)
	tw.n, tw.o, tw.cfg = n, o, cfg
	tw.check("restore")
	if a, b := n.AppendSnapshot(nil), o.AppendSnapshot(nil); !bytes.Equal(a, b) {
		tw.t.Fatalf("snapshot after restore differs: %d bytes, reference %d", len(a), len(b))
	} else {
		tw.tr.tag('A')
		tw.tr.bytes(b)
	}
}

// run drives the twin with steps random operations over ids drawn from a pool of
// poolSize (so that ids repeat: duplicates, and re-acceptances after expiry), event
// times that move on by up to step ms with some behind, and now and then a long
// jump that expires most of the set.
func (tw *twin) run(r *rand.Rand, steps, poolSize int, step int64) {
	var maxT int64 = 1_000_000
	off := int64(0)
	var nout []Event
	var oout []refwm.Event
	id := func() string { return fmt.Sprintf("e-%d", r.IntN(poolSize)) }
	evTime := func() int64 {
		switch x := r.IntN(100); {
		case x < 60:
			maxT += r.Int64N(step + 1)
			return maxT
		case x < 61:
			maxT += 50 * tw.cfg.DedupeHorizon // expire most of the set
			return maxT
		default:
			return maxT - r.Int64N(2*tw.cfg.AllowedLateness+tw.cfg.DedupeHorizon/2+2)
		}
	}
	for i := range steps {
		what := ""
		op := r.IntN(100)
		tw.tr.step(i, op)
		switch {
		case op < 45:
			off++
			ev := Event{Offset: off, EventTime: evTime(), EventID: id(), EntityID: "x", Amount: r.Int64N(100), Size: int32(r.IntN(300)), Aux: r.Int64()}
			if r.IntN(8) == 0 {
				ev.Ext = []uint64{r.Uint64()}
			}
			tw.n.PrefetchID([]byte(ev.EventID))
			switch r.IntN(3) {
			case 0:
				nv, ov := tw.n.Offer(ev), tw.o.Offer(refwm.Event(ev))
				if int(nv) != int(ov) {
					tw.t.Fatalf("step %d: Offer(%q at %d) = %v, reference %v", i, ev.EventID, ev.EventTime, nv, ov)
				}
				tw.tr.verdict(uint8(ov), false, false)
			case 1, 2:
				oev := refwm.Event(ev)
				var nv Verdict
				var ov refwm.Verdict
				var nnow, onow bool
				borrowed := r.IntN(2) != 0
				if !borrowed {
					nv, nnow = tw.n.OfferNow(&ev)
					ov, onow = tw.o.OfferNow(&oev)
				} else {
					nv, nnow = tw.n.OfferNowBorrowed(&ev)
					ov, onow = tw.o.OfferNowBorrowed(&oev)
				}
				if int(nv) != int(ov) || nnow != onow {
					tw.t.Fatalf("step %d: OfferNow(%q at %d) = %v, %v; reference %v, %v", i, ev.EventID, ev.EventTime, nv, nnow, ov, onow)
				}
				tw.tr.bool(borrowed)
				tw.tr.verdict(uint8(ov), onow, true)
			}
			what = "offer"
		case op < 60:
			nout, oout = tw.n.Ready(nout[:0]), tw.o.Ready(oout[:0])
			if !sameAsRef(nout, oout) {
				tw.t.Fatalf("step %d: Ready released %d events, reference %d (or others)", i, len(nout), len(oout))
			}
			tw.tr.events('R', refEvents(oout))
			what = "ready"
		case op < 70:
			// Remember of older times, of ids live and not, and now and then of
			// one outside the horizon.
			e, t := id(), maxT-r.Int64N(tw.cfg.DedupeHorizon+tw.cfg.DedupeHorizon/4+1)
			tw.n.Remember(e, t)
			tw.o.Remember(e, t)
			what = "remember"
		case op < 78:
			e := id()
			a, b := tw.n.Seen(e), tw.o.Seen(e)
			if a != b {
				tw.t.Fatalf("step %d: Seen(%q) = %v, reference %v", i, e, a, b)
			}
			tw.tr.tag('Q')
			tw.tr.bool(b)
		case op < 85:
			if len(tw.open) < 3 {
				s := twinSnap{segmented: r.IntN(2) == 0 && tw.cfg.Segments != nil}
				s.nbuf, s.np = tw.n.BeginSnapshotWith(nil, s.segmented)
				s.obuf, s.op = tw.o.BeginSnapshotWith(nil, s.segmented)
				if !bytes.Equal(s.nbuf, s.obuf) {
					tw.t.Fatalf("step %d: BeginSnapshot differs", i)
				}
				tw.tr.tag('B')
				tw.tr.bool(s.segmented)
				tw.tr.bytes(s.obuf)
				tw.open = append(tw.open, s)
			}
			what = "begin snapshot"
		case op < 93:
			if len(tw.open) > 0 {
				tw.finish()
			}
			what = "finish snapshot"
		case op < 95:
			if a, b := tw.n.AppendSnapshot(nil), tw.o.AppendSnapshot(nil); !bytes.Equal(a, b) {
				tw.t.Fatalf("step %d: AppendSnapshot differs: %d bytes, reference %d", i, len(a), len(b))
			} else {
				tw.tr.tag('A')
				tw.tr.bytes(b)
			}
		case op < 97:
			cfg := tw.cfg
			switch r.IntN(4) {
			case 0: // a longer or shorter horizon, a cap set, changed or lifted
				cfg.DedupeHorizon = max(cfg.AllowedLateness, cfg.DedupeHorizon/2+r.Int64N(cfg.DedupeHorizon+1), 1)
			case 1:
				cfg.MaxDedupeIDs = r.IntN(3) * r.IntN(2*poolSize+1)
			}
			tw.restore(cfg)
			what = "restore"
		case op < 98:
			nout, oout = tw.n.FlushAll(nout[:0]), tw.o.FlushAll(oout[:0])
			if !sameAsRef(nout, oout) {
				tw.t.Fatalf("step %d: FlushAll released %d events, reference %d (or others)", i, len(nout), len(oout))
			}
			tw.tr.events('F', refEvents(oout))
			what = "flush"
		default:
			what = "nothing"
		}
		tw.check(fmt.Sprintf("step %d (%s)", i, what))
	}
	for len(tw.open) > 0 {
		tw.finish()
	}
	tw.restore(tw.cfg)
}

// TestMatchesReferenceSet runs random operation sequences on this package's Stage and
// on the frozen reference side by side (see twin): inserts, duplicates, expiry, cap
// evictions, Remember of older times, snapshots left open while the stages go on,
// segmented and inline snapshots, and restores under the same or a changed config.
// Each run's transcript of the reference's answers must match transcriptGolden;
// -update-transcripts writes that file instead, for every case and seed at both the
// full and the -short number of steps, from runs on which the two stages agreed at
// every step.
func TestMatchesReferenceSet(t *testing.T) {
	cases := []struct {
		name      string
		cfg       Config
		segmented bool
		pool      int
		steps     int
		step      int64
	}{
		{"small pool, short horizon", Config{AllowedLateness: 20, DedupeHorizon: 200}, false, 60, 20000, 5},
		{"no lateness", Config{DedupeHorizon: 500}, false, 300, 20000, 3},
		{"capped", Config{AllowedLateness: 50, DedupeHorizon: 5000, MaxDedupeIDs: 150}, false, 400, 20000, 4},
		{"segmented", Config{AllowedLateness: 30, DedupeHorizon: 2000, MaxMergeBytes: 40 * idEntryLen}, true, 500, 20000, 3},
		{"segmented and capped", Config{AllowedLateness: 10, DedupeHorizon: 3000, MaxDedupeIDs: 300}, true, 1000, 20000, 2},
		{"dedupe off", Config{AllowedLateness: 30, DisableDedupe: true}, false, 100, 5000, 5},
		// Many ids live at once: every shard grows through several doublings and
		// expires back, and the ring spans many blocks.
		{"large set", Config{AllowedLateness: 100, DedupeHorizon: 1 << 20}, false, 400_000, 300_000, 3},
	}
	const allSeeds = 4
	var golden map[transcriptKey]string
	if !*updateTranscripts {
		golden = readTranscripts(t)
	}
	var keys []transcriptKey
	sums := map[transcriptKey]string{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stepCounts, seeds := []int{c.steps}, allSeeds
			switch {
			case *updateTranscripts:
				stepCounts = []int{c.steps, c.steps / 10}
			case testing.Short():
				stepCounts = []int{c.steps / 10}
			}
			if raceEnabled && c.steps > 100_000 && !*updateTranscripts {
				// The race detector makes the large set about 30 times slower,
				// and this test runs on one goroutine: one seed is enough there.
				seeds = 1
			}
			for _, steps := range stepCounts {
				for seed := range seeds {
					tw := newTwin(t, c.cfg, c.segmented)
					tw.run(rand.New(rand.NewPCG(uint64(seed), 7)), steps, c.pool, c.step)
					k := transcriptKey{c.name, seed, steps}
					keys = append(keys, k)
					sums[k] = tw.tr.sum()
					if golden == nil {
						continue
					}
					if want, ok := golden[k]; !ok {
						t.Errorf("seed %d, %d steps: no transcript in %s", seed, steps, transcriptGolden)
					} else if sums[k] != want {
						t.Errorf("seed %d, %d steps: transcript %s, golden %s", seed, steps, sums[k], want)
					}
				}
			}
		})
	}
	if *updateTranscripts && !t.Failed() {
		header := "# TestMatchesReferenceSet: case, seed, steps, SHA-256 of the transcript of the reference's answers.\n" +
			"# Recorded by the twin (this Stage and pkg/watermark/internal/refwm agreeing at every step);\n" +
			"# never regenerate it from the current package alone.\n"
		if err := writeTranscripts(keys, sums, header); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d transcripts to %s", len(keys), transcriptGolden)
	}
}
