package watermark

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The differential test of the compact dedupe table, by golden transcripts.
//
// Commit 18512b0 replaced the dedupe set's 24-byte {hash, time} slots with the compact
// table (8-byte slots pointing into the acceptance FIFO) and proved the behaviour
// unchanged by running a frozen copy of the old package (internal/refwm) side by side
// with the new one on random operation sequences, comparing every verdict, release,
// count and snapshot byte. Its successor db89bd3 had that twin also hash everything
// the reference answered into a transcript per (case, seed, steps) and wrote the
// digests to testdata/dedupe_transcripts.golden (-update-transcripts), from runs on
// which the new Stage agreed with the reference at every step. The reference package
// was then deleted; this test replays exactly the same operation sequences (the same
// rand draws, in the same order) on the current Stage alone, hashes the same
// observations the same way, and compares the digests with the golden file.
//
// The golden file is the old package's behaviour. Never regenerate it from the current
// code to make a failure pass: a mismatch means the Stage now answers differently from
// the old dedupe set on that run. To find the first step that differs, check out
// db89bd3 (the last commit with internal/refwm), bring this package's non-test files
// over, and run the failing case there: its twin stops at the first disagreement.

// replay drives the Stage with the operations the twin of db89bd3 drove it and the
// reference with, and records in tr what the reference recorded there.
type replay struct {
	t     *testing.T
	tr    *transcript
	cfg   Config
	n     *Stage
	store *memSegments
	// snapshots begun and not yet finished: the Stage goes on under their views
	open []replaySnap
}

type replaySnap struct {
	buf       []byte
	p         *PendingSnapshot
	segmented bool
}

func newReplay(t *testing.T, cfg Config, segmented bool) *replay {
	tw := &replay{t: t, tr: newTranscript(), cfg: cfg, store: newMemSegments()}
	if segmented {
		tw.cfg.Segments = tw.store
	}
	var err error
	if tw.n, err = New(tw.cfg); err != nil {
		t.Fatal(err)
	}
	return tw
}

func (tw *replay) check(what string) {
	tw.t.Helper()
	n := tw.n
	if n.ids.len() > n.DedupeIDs() {
		tw.t.Fatalf("%s: the table holds %d ids, more than the %d live", what, n.ids.len(), n.DedupeIDs())
	}
	wm, ok := n.Watermark()
	tw.tr.state(n.DedupeIDs(), n.DedupeCapEvictions(), n.Pending(), n.PendingBytes(), n.Pressure(), wm, ok)
}

// finish completes the oldest open snapshot.
func (tw *replay) finish() {
	tw.t.Helper()
	s := tw.open[0]
	tw.open = tw.open[1:]
	b, err := s.p.Finish(s.buf, 0)
	tw.tr.tag('E')
	tw.tr.bool(s.segmented)
	tw.tr.bytes(b)
	tw.tr.err(err)
	tw.n.EndSnapshot(s.p)
	if s.segmented && err == nil {
		g := tw.n.SnapshotSaved(s.p)
		tw.tr.tag('G')
		tw.tr.int(int64(len(g)))
		for _, ref := range g {
			tw.tr.bytes(ref)
		}
		tw.store.delete(g)
	}
}

// restore replaces the stage with a restore of its snapshot under cfg.
func (tw *replay) restore(cfg Config) {
	tw.t.Helper()
	for len(tw.open) > 0 {
		tw.finish()
	}
	data := tw.n.AppendSnapshot(nil)
	tw.tr.tag('A')
	tw.tr.bytes(data)
	if tw.cfg.Segments != nil {
		cfg.Segments = tw.store
	}
	n, err := Restore(cfg, data)
	if err != nil {
		tw.t.Fatalf("restore: %v", err)
	}
	tw.tr.tag('T')
	tw.tr.int(cfg.DedupeHorizon)
	tw.tr.int(int64(cfg.MaxDedupeIDs))
	tw.tr.err(err)
	tw.n, tw.cfg = n, cfg
	tw.check("restore")
	tw.tr.tag('A')
	tw.tr.bytes(n.AppendSnapshot(nil))
}

// run drives the stage with steps random operations over ids drawn from a pool of
// poolSize (so that ids repeat: duplicates, and re-acceptances after expiry), event
// times that move on by up to step ms with some behind, and now and then a long
// jump that expires most of the set.
//
// Every draw from r must stay as it was in db89bd3's twin: one more, one fewer or one
// moved changes every operation after it, and the transcripts no longer match.
func (tw *replay) run(r *rand.Rand, steps, poolSize int, step int64) {
	var maxT int64 = 1_000_000
	off := int64(0)
	var out []Event
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
				tw.tr.verdict(uint8(tw.n.Offer(ev)), false, false)
			case 1, 2:
				var v Verdict
				var now bool
				borrowed := r.IntN(2) != 0
				if !borrowed {
					v, now = tw.n.OfferNow(&ev)
				} else {
					v, now = tw.n.OfferNowBorrowed(&ev)
				}
				tw.tr.bool(borrowed)
				tw.tr.verdict(uint8(v), now, true)
			}
			what = "offer"
		case op < 60:
			out = tw.n.Ready(out[:0])
			tw.tr.events('R', out)
			what = "ready"
		case op < 70:
			// Remember of older times, of ids live and not, and now and then of
			// one outside the horizon.
			e, t := id(), maxT-r.Int64N(tw.cfg.DedupeHorizon+tw.cfg.DedupeHorizon/4+1)
			tw.n.Remember(e, t)
			what = "remember"
		case op < 78:
			e := id()
			tw.tr.tag('Q')
			tw.tr.bool(tw.n.Seen(e))
		case op < 85:
			if len(tw.open) < 3 {
				s := replaySnap{segmented: r.IntN(2) == 0 && tw.cfg.Segments != nil}
				s.buf, s.p = tw.n.BeginSnapshotWith(nil, s.segmented)
				tw.tr.tag('B')
				tw.tr.bool(s.segmented)
				tw.tr.bytes(s.buf)
				tw.open = append(tw.open, s)
			}
			what = "begin snapshot"
		case op < 93:
			if len(tw.open) > 0 {
				tw.finish()
			}
			what = "finish snapshot"
		case op < 95:
			tw.tr.tag('A')
			tw.tr.bytes(tw.n.AppendSnapshot(nil))
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
			out = tw.n.FlushAll(out[:0])
			tw.tr.events('F', out)
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

// TestMatchesReferenceSet runs random operation sequences on the Stage (see replay):
// inserts, duplicates, expiry, cap evictions, Remember of older times, snapshots left
// open while the stage goes on, segmented and inline snapshots, and restores under the
// same or a changed config. The transcript of each run must match the one the old
// dedupe set (the reference package) produced on it, kept in transcriptGolden for
// every case and seed at both the full and the -short number of steps.
func TestMatchesReferenceSet(t *testing.T) {
	if *updateTranscripts {
		t.Fatalf("%s holds the old package's answers and cannot be regenerated from this one: "+
			"check out db89bd3 (the last commit with internal/refwm) to rewrite it", transcriptGolden)
	}
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
	golden := readTranscripts(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			steps, seeds := c.steps, 4
			if testing.Short() {
				steps /= 10
			}
			if raceEnabled && c.steps > 100_000 {
				// The race detector makes the large set about 30 times slower,
				// and this test runs on one goroutine: one seed is enough there
				// (the run without -race checks the other three).
				seeds = 1
			}
			for seed := range seeds {
				tw := newReplay(t, c.cfg, c.segmented)
				tw.run(rand.New(rand.NewPCG(uint64(seed), 7)), steps, c.pool, c.step)
				k := transcriptKey{c.name, seed, steps}
				want, ok := golden[k]
				if !ok {
					t.Errorf("case %q, seed %d, %d steps: no transcript in %s", c.name, seed, steps, transcriptGolden)
					continue
				}
				if got := tw.tr.sum(); got != want {
					t.Errorf("case %q, seed %d, %d steps: the Stage no longer answers as the reference did "+
						"(transcript %s, golden %s). To find the first step that differs, check out db89bd3, "+
						"the last commit with internal/refwm, bring this package's non-test files over and run "+
						"go test ./pkg/watermark -run 'TestMatchesReferenceSet' there. Do not regenerate the golden file.",
						c.name, seed, steps, got, want)
				}
			}
		})
	}
}
