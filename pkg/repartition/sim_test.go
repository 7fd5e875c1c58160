package repartition

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// This file simulates the sources of one repartition partition the way the service
// runs them: each input partition is a real watermark.Stage (lateness, dedupe by
// event id, snapshots), its owners restart from older checkpoints and old owners go
// on producing after a new owner took over, and what each owner produces for this
// repartition partition is appended to that source's log in the order it produced
// it. Only the merge of the sources' logs into one partition is left to the tests.

const (
	simLateness = 50
	simExtWords = 2
	simTopic    = "transactions"
)

type simInput struct {
	t  int64
	id string
}

// genInput is one input partition: event times rise ~10 ms per offset with jitter
// inside and beyond the lateness (so the stage reorders, and rejects some as late),
// and some event ids repeat (rejected as duplicates at the source).
func genInput(r *rand.Rand, p, n int) []simInput {
	in := make([]simInput, n)
	base := int64(1_700_000_000_000) + r.Int64N(200)
	clock := base
	for i := range in {
		clock += r.Int64N(15)
		t := clock + r.Int64N(simLateness) - simLateness/2
		if r.IntN(30) == 0 {
			t -= 3 * simLateness // late at the source
		}
		if r.IntN(4) == 0 {
			t = in[max(i-1, 0)].t // equal times, so ties at the watermark are common
		}
		id := "e" + strconv.Itoa(p) + "-" + strconv.Itoa(i)
		if i > 0 && r.IntN(25) == 0 {
			id = in[r.IntN(i)].id
		}
		in[i] = simInput{t: max(t, base), id: id}
	}
	return in
}

func simKey(off int64) string { return "k" + strconv.FormatInt((off*7919)%23, 10) }

// ours: about a third of the keys hash to the simulated repartition partition; the
// others go elsewhere, and then only a marker tells this partition the watermark.
func ours(off int64) bool { return (off*7919)%23%3 == 0 }

func simWords(p int32, off int64) []uint64 {
	return []uint64{uint64(off) * 0x9e3779b97f4a7c15, uint64(p)<<32 | uint64(off)&0xffff}
}

type checkpoint struct {
	next int
	snap []byte
}

// owner is one process owning an input partition.
type owner struct {
	p        int32
	epoch    uint64
	st       *watermark.Stage
	next     int
	sentWM   int64 // the newest watermark sent to this repartition partition
	out      []Record
	batch    []watermark.Event
	markProb int // percent of releases followed by a marker
	leases   bool
}

func newOwner(p int32, epoch uint64, cp *checkpoint, markProb int) *owner {
	cfg := watermark.Config{AllowedLateness: simLateness, DedupeHorizon: 10_000}
	var st *watermark.Stage
	var err error
	next := 0
	if cp == nil {
		st, err = watermark.New(cfg)
	} else {
		st, err = watermark.Restore(cfg, cp.snap)
		next = cp.next
	}
	if err != nil {
		panic(err)
	}
	return &owner{p: p, epoch: epoch, st: st, next: next, sentWM: NoWatermark, markProb: markProb}
}

func (o *owner) stageWM() int64 {
	if wm, ok := o.st.Watermark(); ok {
		return wm
	}
	return NoWatermark
}

// emit sends a release to this repartition partition, each event with
// EventWatermark, then maybe a marker carrying the stage's watermark.
func (o *owner) emit(r *rand.Rand, in []simInput) {
	wm := o.stageWM()
	for _, ev := range o.batch {
		if !ours(ev.Offset) {
			continue
		}
		w := EventWatermark(ev.EventTime, wm)
		o.out = append(o.out, Record{Kind: KindEvent, Epoch: o.epoch, Watermark: w, Event: Event{
			Source: o.p, Offset: ev.Offset, EventTime: ev.EventTime, Topic: simTopic,
			Key: simKey(ev.Offset), EventID: in[ev.Offset].id, Amount: ev.Offset % 1000, Ext: simWords(o.p, ev.Offset),
		}})
		o.sentWM = max(o.sentWM, w)
	}
	if wm > o.sentWM && r.IntN(100) < o.markProb {
		o.out = append(o.out, Record{Kind: KindMarker, Epoch: o.epoch, Watermark: wm, Event: Event{Source: o.p}})
		o.sentWM = wm
	}
}

// step processes one input offset: offer, release what the watermark allows, send it.
func (o *owner) step(r *rand.Rand, in []simInput) {
	i := o.next
	o.next++
	o.st.Offer(watermark.Event{Offset: int64(i), EventTime: in[i].t, EventID: in[i].id})
	o.batch = o.st.Ready(o.batch[:0])
	o.emit(r, in)
}

// flush is the source's own idle rule: release everything pending (above the
// watermark too) and send it; with idle, declare the partition idle in a marker.
func (o *owner) flush(r *rand.Rand, in []simInput, idle bool) {
	o.batch = o.st.FlushAll(o.batch[:0])
	o.emit(r, in)
	if idle {
		var lease int64
		if o.leases {
			lease = 1 + r.Int64N(10)
		}
		o.out = append(o.out, Record{Kind: KindMarker, Epoch: o.epoch, Watermark: o.stageWM(), Idle: true, Lease: lease, Event: Event{Source: o.p}})
	}
}

type simOptions struct {
	sources    int
	offsets    int
	crashes    int  // restarts from an older checkpoint, each with a zombie
	flushes    bool // the source's idle rule releases mid-stream
	idle       bool // ... and declares the partition idle in a marker
	leases     bool // ... with a lease (then stamp the interleaving)
	duplicates int  // percent of records repeated later in their source's log
}

// simulate returns each source's log for one repartition partition, ending with the
// final owner's end-of-stream marker (watermark math.MaxInt64).
func simulate(r *rand.Rand, o simOptions) [][]Record {
	logs := make([][]Record, o.sources)
	for p := range logs {
		in := genInput(r, p, o.offsets)
		markProb := 10 + r.IntN(80)
		cur := newOwner(int32(p), 1, nil, markProb)
		cur.leases = o.leases
		var cps []checkpoint
		var log []Record
		crashAt := make([]int, o.crashes)
		for k := range crashAt {
			crashAt[k] = 1 + r.IntN(o.offsets-1)
		}
		slices.Sort(crashAt)
		for k := 0; cur.next < len(in); {
			if cur.next%20 == 0 {
				cps = append(cps, checkpoint{next: cur.next, snap: cur.st.AppendSnapshot(nil)})
			}
			if o.flushes && r.IntN(60) == 0 {
				cur.flush(r, in, o.idle && r.IntN(2) == 0)
			}
			cur.step(r, in)
			if k < len(crashAt) && cur.next >= crashAt[k] && len(cps) > 0 {
				k++
				// The new owner restarts from one of the checkpoints so far, not
				// necessarily the newest (a damaged newest falls back to .prev).
				cp := cps[max(0, len(cps)-1-r.IntN(3))]
				next := newOwner(int32(p), cur.epoch+1, &cp, markProb)
				next.leases = o.leases
				zombie := cur
				log = append(log, zombie.out...)
				zombie.out = nil
				// The zombie goes on for a while, and may find its input silent and
				// declare the partition idle, until it is fenced.
				for range r.IntN(40) {
					if zombie.next >= len(in) {
						break
					}
					zombie.step(r, in)
				}
				if o.idle && r.IntN(2) == 0 {
					zombie.flush(r, in, true)
				}
				for next.next < len(in) && next.next < zombie.next+r.IntN(40) {
					next.step(r, in)
				}
				log = append(log, interleave(r, [][]Record{zombie.out, next.out})...)
				next.out = nil
				cps = slices.DeleteFunc(cps, func(c checkpoint) bool { return c.next > cp.next })
				cur = next
			}
		}
		cur.flush(r, in, false)
		cur.out = append(cur.out, Record{Kind: KindMarker, Epoch: cur.epoch, Watermark: math.MaxInt64, Event: Event{Source: cur.p}})
		log = append(log, cur.out...)
		logs[p] = duplicateSome(r, log, o.duplicates)
	}
	return logs
}

// duplicateSome repeats some events later in the same log (a producer retry that
// landed twice); the original stays in place, so no watermark overtakes it.
func duplicateSome(r *rand.Rand, log []Record, pct int) []Record {
	if pct == 0 {
		return log
	}
	out := make([]Record, 0, len(log)+len(log)*pct/100)
	var later []Record
	for _, rec := range log {
		out = append(out, rec)
		if rec.Kind == KindEvent && r.IntN(100) < pct {
			later = append(later, rec)
		}
		if len(later) > 0 && r.IntN(3) == 0 {
			out = append(out, later[0])
			later = later[1:]
		}
	}
	return append(out, later...)
}

// interleave merges the logs in a random order that keeps each log's own order, with
// random bursts so that one source can run far ahead of the others.
func interleave(r *rand.Rand, logs [][]Record) []Record {
	var out []Record
	pos := make([]int, len(logs))
	weight := make([]int, len(logs))
	for i := range weight {
		weight[i] = 1 + r.IntN(10)
	}
	for {
		total := 0
		for i := range logs {
			if pos[i] < len(logs[i]) {
				total += weight[i]
			}
		}
		if total == 0 {
			return out
		}
		pick := r.IntN(total)
		for i := range logs {
			if pos[i] == len(logs[i]) {
				continue
			}
			if pick -= weight[i]; pick < 0 {
				for n := 1 + r.IntN(8); n > 0 && pos[i] < len(logs[i]); n-- {
					out = append(out, logs[i][pos[i]])
					pos[i]++
				}
				break
			}
		}
	}
}

// stamp gives an interleaving's records timestamps (Record.LogTime): their position,
// give or take a few, as producers' clocks that disagree a little; now and then none.
func stamp(r *rand.Rand, recs []Record) []Record {
	for i := range recs {
		recs[i].LogTime = 2*int64(i) + 1 + r.Int64N(5)
		if r.IntN(50) == 0 {
			recs[i].LogTime = 0
		}
	}
	return recs
}

// reference is the sort the issue states: every unique (source, offset) event of the
// logs in (event_time, source, offset) order. It shares no code with the Merger.
func reference(logs [][]Record) []Event {
	seen := map[[2]int64]bool{}
	var evs []Event
	for _, log := range logs {
		for _, rec := range log {
			k := [2]int64{int64(rec.Source), rec.Offset}
			if rec.Kind != KindEvent || seen[k] {
				continue
			}
			seen[k] = true
			evs = append(evs, rec.Event)
		}
	}
	slices.SortFunc(evs, func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.EventTime, b.EventTime), cmp.Compare(a.Source, b.Source), cmp.Compare(a.Offset, b.Offset))
	})
	return evs
}

// refMerger is the obvious second stage with unbounded memory: it remembers every
// (source, offset) it ever received. The Merger must decide every record as it does.
type refMerger struct {
	wm       []int64
	idle     []bool
	lease    []int64 // with idle: the clock value the declaration holds to (math.MaxInt64: no lease)
	clock    int64
	expired  int
	epoch    []uint64
	F        int64
	received map[[2]int64]bool
	pending  []Event
}

func newRefMerger(n int) *refMerger {
	m := &refMerger{wm: make([]int64, n), idle: make([]bool, n), lease: make([]int64, n), clock: math.MinInt64, epoch: make([]uint64, n), F: NoWatermark, received: map[[2]int64]bool{}}
	for i := range m.wm {
		m.wm[i] = NoWatermark
	}
	return m
}

func (m *refMerger) offer(r *Record) Verdict {
	p := r.Source
	v := Marked
	if r.LogTime > 0 && r.LogTime > m.clock {
		m.clock = r.LogTime
		for i := range m.idle {
			if m.idle[i] && m.lease[i] < m.clock {
				m.idle[i] = false
				m.expired++
			}
		}
		m.frontier()
	}
	switch {
	case r.Kind == KindEvent:
		k := [2]int64{int64(p), r.Offset}
		switch {
		case m.received[k]:
			v = Duplicate
		case r.EventTime < m.F:
			v = LateAfterIdle
		default:
			v = Accepted
			ev := r.Event
			ev.Ext = slices.Clone(ev.Ext)
			m.pending = append(m.pending, ev)
		}
		m.received[k] = true
		m.idle[p] = false
	case !r.Idle:
		m.idle[p] = false
	case r.Epoch >= m.epoch[p]:
		m.idle[p] = true
		m.lease[p] = math.MaxInt64
		if r.Lease > 0 && m.clock != math.MinInt64 {
			m.lease[p] = m.clock + r.Lease
		}
	default:
		v = StaleIdle
	}
	m.epoch[p] = max(m.epoch[p], r.Epoch)
	m.wm[p] = max(m.wm[p], r.Watermark)
	m.frontier()
	return v
}

func (m *refMerger) frontier() {
	cand, active := int64(math.MaxInt64), false
	for i := range m.wm {
		if !m.idle[i] {
			cand, active = min(cand, m.wm[i]), true
		}
	}
	if !active {
		cand = math.MinInt64
		for _, e := range m.pending {
			cand = max(cand, e.EventTime+1)
		}
	}
	m.F = max(m.F, cand)
}

func (m *refMerger) ready() []Event {
	slices.SortFunc(m.pending, func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.EventTime, b.EventTime), cmp.Compare(a.Source, b.Source), cmp.Compare(a.Offset, b.Offset))
	})
	i := 0
	for i < len(m.pending) && m.pending[i].EventTime < m.F {
		i++
	}
	out := slices.Clone(m.pending[:i])
	m.pending = m.pending[i:]
	return out
}

func evString(e Event) string {
	return fmt.Sprintf("(t=%d p=%d o=%d %s %s %d %v)", e.EventTime, e.Source, e.Offset, e.Key, e.EventID, e.Amount, e.Ext)
}
