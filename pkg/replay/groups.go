package replay

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// secondStages are a replay's re-keyed groups: per group, one second stage per
// repartition partition, fed the hop records of every partition's first stage.
//
// The outputs, and the order they are written in, are those of the plain schedule:
// the partitions run one after another, each hop record goes to its second stage at
// once, and once the last partition has ended every second stage hears that every
// source ended, in (group, repartition partition) order. In that schedule nothing is
// released before the last partition L runs (its source has not been heard from), so
// a second stage would hold every event of the earlier partitions: memory for the
// whole range. Instead:
//
//   - Phase 1 (the partitions before L): hop records are kept in a spool per second
//     stage (memory, then a temporary file), one section per source partition.
//   - Phase 2 (L): when L hops an event to a second stage, the plain schedule's
//     frontier there becomes b = min(M, wL), where M is the smallest largest watermark
//     any other source sent it (final, as those partitions have ended) and wL the
//     largest watermark L sent it, this record's included. First every other source's
//     section is fed up to its first record whose watermark reaches b (or to its end),
//     then L's record: the frontier becomes exactly b, as in the plain schedule, and
//     the same events are released at the same point of L's outputs. The records fed
//     before L's cannot raise the frontier above the plain schedule's, which is
//     already reached (it is at most wL and M), so they release nothing. Once wL has
//     reached M the frontier can no longer rise before the end, so L's later records
//     for that second stage are spooled too.
//   - The end: for each group and repartition partition in turn, what is left of every
//     source's section is fed lowest watermark first, each source's end-of-input
//     (idle) marker as soon as its section is done. That second stage alone writes
//     meanwhile, and its release order depends on the records only
//     (docs/repartition.md), so the bytes are the plain schedule's.
//
// Each second stage so holds the events between its frontier and its sources'
// watermarks, bounded by the allowed lateness and the events' spread in time, not by
// the range; the spools cost the hop records of all partitions but the last on disk.
type secondStages struct {
	cfg        *Config
	res        *Result
	prog       *Progress
	partitions int32
	stages     [][]*stage // [group][repartition partition]
	file       spillFile
	// warmTo is, per source partition, its last warm-up offset (-1: none): the
	// second stages' outputs for those records are not written, as a first
	// stage's are not.
	warmTo map[int32]int64
	cur    int32 // the partition whose first stage runs
	last   bool  // cur is the range's last partition (phase 2)
	// pending and peak are per group the events its second stages hold, now and at
	// most so far (GroupResult.PeakPending).
	pending []int
	peak    []int
	// direct feeds every hop record at once and ends as the plain schedule does:
	// the tests' reference for the order of the outputs and for memory.
	direct bool
	err    error
}

// Memory for the spools' in-memory tails: spoolBudget in all, at least spoolMinTail
// each (variables so that tests can make the spools spill).
var (
	spoolBudget  = 64 << 20
	spoolMinTail = 16 << 10
)

// stage is one second stage (one group, one repartition partition) and the hop
// records kept for it.
type stage struct {
	proc    *pipeline.Processor
	next    int64 // the next in-memory "repartition offset"
	pending int   // proc.Pending() after the last feed
	sp      spool
	// Per source partition: its section of sp, its reader, the largest watermark
	// of the records fed to proc (fed) and of all its records (sent).
	rd        []spoolReader
	fed, sent []int64
	frontierM int64 // M: set when the last partition begins
	spoolingL bool  // phase 2 has reached M: the last partition's records are spooled
}

// newStages builds cfg's second stages and sets cfg.Pipeline.Hops (nil without groups).
func newStages(src Source, cfg *Config, prog *Progress, res *Result) (*secondStages, error) {
	if len(cfg.Groups) == 0 {
		return nil, nil
	}
	if cfg.Pipeline.Features == nil {
		return nil, fmt.Errorf("replay: re-keyed groups need a feature definition")
	}
	n := int32(0)
	if c, ok := src.(interface{ PartitionCount() int32 }); ok {
		n = c.PartitionCount()
	}
	for _, p := range src.Partitions() {
		n = max(n, p+1)
	}
	st := &secondStages{cfg: cfg, res: res, prog: prog, partitions: n, warmTo: map[int32]int64{},
		file: spillFile{dir: cfg.TempDir}, pending: make([]int, len(cfg.Groups)), peak: make([]int, len(cfg.Groups))}
	limit := min(max(spoolBudget/(len(cfg.Groups)*int(n)), spoolMinTail), 1<<20)
	hc := &pipeline.HopConfig{Partitions: n}
	for _, grp := range cfg.Groups {
		if grp.Features == nil {
			return nil, fmt.Errorf("replay: group %s has no features sink", grp.Name)
		}
		topic := sink.RepartitionTopicPrefix + "replay-" + grp.Name
		hc.Groups = append(hc.Groups, pipeline.HopGroup{Name: grp.Name, Topic: topic, Words: grp.Spec.Words()})
		res.Groups = append(res.Groups, GroupResult{Name: grp.Name})
		stages := make([]*stage, n)
		for rp := range n {
			pc := pipeline.Config{Topic: topic, Partition: rp, Specs: grp.Spec.Windows, Window: cfg.Pipeline.Window,
				Features: grp.Spec, Merge: &pipeline.MergeConfig{Group: grp.Name, Sources: int(n)}}
			p, err := pipeline.New(pc, 0)
			if err != nil {
				return nil, fmt.Errorf("replay group %s: %w", grp.Name, err)
			}
			s := &stage{proc: p, sp: spool{file: &st.file, limit: limit},
				rd: make([]spoolReader, n), fed: make([]int64, n), sent: make([]int64, n)}
			for i := range n {
				s.fed[i], s.sent[i] = repartition.NoWatermark, repartition.NoWatermark
			}
			stages[rp] = s
		}
		st.stages = append(st.stages, stages)
	}
	cfg.Pipeline.Hops = hc
	return st, nil
}

// close removes the spools' temporary file.
func (st *secondStages) close() error {
	if st == nil {
		return nil
	}
	return st.file.close()
}

func (st *secondStages) group(topic string) int {
	return slices.IndexFunc(st.cfg.Pipeline.Hops.Groups, func(h pipeline.HopGroup) bool { return h.Topic == topic })
}

// begin is called before partition p's first stage runs; last says it is the
// range's last partition.
func (st *secondStages) begin(p int32, last bool) {
	st.cur, st.last = p, last
	for _, stages := range st.stages {
		for _, s := range stages {
			s.rd[p] = spoolReader{sp: &s.sp, pos: s.sp.size(), end: s.sp.size()}
			if last {
				// M: every other source has sent all it will; one never heard from
				// (not in the range, or nothing for this stage) holds it at
				// NoWatermark. With no other source it is +inf.
				m := int64(math.MaxInt64)
				for src, w := range s.sent {
					if int32(src) != p {
						m = min(m, w)
					}
				}
				// With M at NoWatermark the frontier stays there until the end.
				s.frontierM, s.spoolingL = m, m == repartition.NoWatermark
			}
		}
	}
}

// endPartition closes partition p's sections.
func (st *secondStages) endPartition(p int32) {
	for _, stages := range st.stages {
		for _, s := range stages {
			s.rd[p].end = s.sp.size()
		}
	}
}

// hop takes one first-stage hop record of the current partition.
func (st *secondStages) hop(o *pipeline.Output) error {
	g := st.group(o.Topic)
	if g < 0 || o.Partition < 0 || o.Partition >= st.partitions {
		return fmt.Errorf("replay: hop record for %s partition %d: no such second stage", o.Topic, o.Partition)
	}
	if st.direct {
		st.feed(g, o.Partition, o.Value)
		return st.err
	}
	kind, w, err := repartition.PeekWatermark(o.Value)
	if err == nil && kind != repartition.KindEvent {
		err = fmt.Errorf("a %v", kind) // replay's first stages send events only
	}
	if err != nil {
		return fmt.Errorf("replay: hop record of partition %d offset %d: %w", st.cur, o.SourceOffset, err)
	}
	s := st.stages[g][o.Partition]
	src := st.cur
	s.sent[src] = max(s.sent[src], w)
	if !st.last || s.spoolingL {
		return s.sp.append(o.Value)
	}
	if w > s.fed[src] {
		// The plain schedule's frontier rises to b here: bring every other source
		// up to it first, so that this record raises it to exactly b.
		if err := st.catchUp(g, o.Partition, src, min(s.frontierM, w)); err != nil {
			return err
		}
	}
	st.feed(g, o.Partition, o.Value)
	s.fed[src] = max(s.fed[src], w)
	if s.fed[src] >= s.frontierM {
		s.spoolingL = true
	}
	return st.err
}

// markEvery is how many records catchUp feeds between two markers of the last
// partition.
const markEvery = 64

// catchUp feeds the spooled records of every source but last to stage (g, rp) until
// each has sent a watermark of at least b or has none left, lowest watermark first,
// each source until it passes the next lowest. Every markEvery records it sends a
// marker from last with the lowest watermark of those still short of b: the
// frontier follows them, and the events below it are released on the way instead
// of all at once when last's record raises it to b. They are the events the plain
// schedule releases at that record, and nothing is written between them (last's
// first stage waits for this call), so the bytes are the same. The marker keeps
// last's promise: its watermark is below b, at most the watermark of last's record
// that follows it.
func (st *secondStages) catchUp(g int, rp, last int32, b int64) error {
	s := st.stages[g][rp]
	fed, marked := 0, int64(repartition.NoWatermark)
	var marker []byte
	for {
		best, second := int32(-1), int64(math.MaxInt64)
		for src := range st.partitions {
			switch {
			case src == last || s.fed[src] >= b || s.rd[src].done():
			case best < 0 || s.fed[src] < s.fed[best]:
				if best >= 0 {
					second = min(second, s.fed[best])
				}
				best = src
			default:
				second = min(second, s.fed[src])
			}
		}
		if best < 0 {
			return nil
		}
		if lo := s.fed[best]; fed >= markEvery && lo > marked && lo > s.fed[last] {
			rec := repartition.Record{Kind: repartition.KindMarker, Watermark: lo, Event: repartition.Event{Source: last}}
			var err error
			if marker, err = repartition.AppendRecord(marker[:0], &rec); err != nil {
				return err
			}
			st.feed(g, rp, marker)
			if st.err != nil {
				return st.err
			}
			fed, marked = 0, lo
		}
		lim := b
		if second < b {
			lim = second + 1 // second < b <= MaxInt64: no overflow
		}
		n, err := st.feedSection(g, rp, best, lim, markEvery)
		if err != nil {
			return err
		}
		fed += n
	}
}

// feedSection feeds source src's spooled records to stage (g, rp) while the largest
// watermark fed from it is below b, at most limit records, and returns how many it
// fed.
func (st *secondStages) feedSection(g int, rp, src int32, b int64, limit int) (int, error) {
	s := st.stages[g][rp]
	r := &s.rd[src]
	n := 0
	for n < limit && s.fed[src] < b && !r.done() {
		rec, _, err := r.next()
		if err != nil {
			return n, err
		}
		_, w, err := repartition.PeekWatermark(rec)
		if err != nil {
			return n, fmt.Errorf("replay: spooled hop record: %w", err)
		}
		st.feed(g, rp, rec)
		n++
		s.fed[src] = max(s.fed[src], w)
		if st.err != nil {
			return n, st.err
		}
	}
	return n, nil
}

func (st *secondStages) feed(g int, rp int32, value []byte) {
	s := st.stages[g][rp]
	off := s.next
	s.next++
	s.proc.Process(pipeline.Record{Topic: st.cfg.Pipeline.Hops.Groups[g].Topic, Partition: rp, Offset: off, Value: value}, func(o *pipeline.Output) {
		st.emit(g, o)
	})
	n := s.proc.Pending()
	st.pending[g] += n - s.pending
	s.pending = n
	st.peak[g] = max(st.peak[g], st.pending[g])
}

func (st *secondStages) emit(g int, o *pipeline.Output) {
	if st.err != nil {
		return
	}
	if w, ok := st.warmTo[o.SourcePartition]; ok && o.SourceOffset <= w {
		return // a warm-up record's: it belongs before the range
	}
	gr := &st.res.Groups[g]
	var s Sink
	if o.Dead {
		gr.Dead++
		st.res.Dead++
		st.res.ByReason[o.Reason]++
		if s = st.cfg.Dead; s == nil {
			st.prog.Outputs.Add(1)
			return
		}
	} else {
		gr.Features++
		s = st.cfg.Groups[g].Features
	}
	if err := s.Write(o); err != nil {
		st.err = fmt.Errorf("replay group %s: %w", st.cfg.Groups[g].Name, err)
	}
	st.prog.Outputs.Add(1)
}

// end feeds, stage by stage in (group, repartition partition) order, what is left
// of every source's records and every source's end of input (an idle marker, which
// releases everything once all are in), and checks that nothing is left.
func (st *secondStages) end(ctx context.Context) error {
	var marker []byte
	for g := range st.stages {
		for rp, s := range st.stages[g] {
			if err := ctx.Err(); err != nil {
				return err
			}
			ended := make([]bool, st.partitions)
			endSource := func(src int32) error {
				rec := repartition.Record{Kind: repartition.KindMarker, Watermark: repartition.NoWatermark, Idle: true, Event: repartition.Event{Source: src}}
				var err error
				if marker, err = repartition.AppendRecord(marker[:0], &rec); err != nil {
					return err
				}
				st.feed(g, int32(rp), marker)
				ended[src] = true
				return st.err
			}
			if !st.direct {
				// The source with the lowest watermark fed goes first, until it
				// passes the next lowest: the frontier follows the slowest source,
				// and the events waiting for it are those of the others' lead.
				for {
					best, second := int32(-1), int64(math.MaxInt64)
					for src := range st.partitions {
						switch {
						case ended[src]:
						case s.rd[src].done():
							if err := endSource(src); err != nil {
								return err
							}
						case best < 0 || s.fed[src] < s.fed[best]:
							if best >= 0 {
								second = min(second, s.fed[best])
							}
							best = src
						default:
							second = min(second, s.fed[src])
						}
					}
					if best < 0 {
						break
					}
					b := second // feed best while its watermark is at most second
					if b < math.MaxInt64 {
						b++
					}
					if _, err := st.feedSection(g, int32(rp), best, b, math.MaxInt); err != nil {
						return err
					}
				}
			}
			for src := range st.partitions {
				if !ended[src] {
					if err := endSource(src); err != nil {
						return err
					}
				}
			}
			if n := s.proc.Pending(); n != 0 && st.err == nil {
				return fmt.Errorf("replay group %s partition %d: %d events still held after every source ended", st.cfg.Groups[g].Name, rp, n)
			}
			st.res.Groups[g].HopDuplicate += s.proc.MergeStats().Duplicates
			st.res.Groups[g].PeakPending = max(st.res.Groups[g].PeakPending, st.peak[g])
			st.res.Groups[g].Spooled += s.sp.size()
			s.sp.free()
			s.rd = nil
		}
	}
	return st.err
}
