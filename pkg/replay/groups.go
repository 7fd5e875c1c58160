package replay

import (
	"fmt"
	"slices"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// secondStages are a replay's re-keyed groups: per group, one second stage per
// repartition partition, fed the hop records of every partition's first stage as
// they are produced. The live service's repartition topic is a log that every
// input partition appends to; here the partitions run one after another, which is
// one interleaving among those the log could hold, and the second stages' outputs
// do not depend on the interleaving (docs/repartition.md). What differs is memory:
// a second stage holds each event until every source has promised nothing older
// will come, so with partitions replayed in turn it holds the group's events of
// the earlier partitions until the last one ends.
type secondStages struct {
	cfg        *Config
	res        *Result
	prog       *Progress
	partitions int32
	procs      [][]*pipeline.Processor // [group][repartition partition]
	offsets    [][]int64               // the next in-memory "repartition offset" of each
	// warmTo is, per source partition, its last warm-up offset (-1: none): the
	// second stages' outputs for those records are not written, as a first
	// stage's are not.
	warmTo map[int32]int64
	err    error
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
	st := &secondStages{cfg: cfg, res: res, prog: prog, partitions: n, warmTo: map[int32]int64{}}
	hc := &pipeline.HopConfig{Partitions: n}
	for _, grp := range cfg.Groups {
		if grp.Features == nil {
			return nil, fmt.Errorf("replay: group %s has no features sink", grp.Name)
		}
		topic := sink.RepartitionTopicPrefix + "replay-" + grp.Name
		hc.Groups = append(hc.Groups, pipeline.HopGroup{Name: grp.Name, Topic: topic, Words: grp.Spec.Words()})
		res.Groups = append(res.Groups, GroupResult{Name: grp.Name})
		procs := make([]*pipeline.Processor, n)
		for rp := range n {
			pc := pipeline.Config{Topic: topic, Partition: rp, Specs: grp.Spec.Windows, Window: cfg.Pipeline.Window,
				Features: grp.Spec, Merge: &pipeline.MergeConfig{Group: grp.Name, Sources: int(n)}}
			p, err := pipeline.New(pc, 0)
			if err != nil {
				return nil, fmt.Errorf("replay group %s: %w", grp.Name, err)
			}
			procs[rp] = p
		}
		st.procs = append(st.procs, procs)
		st.offsets = append(st.offsets, make([]int64, n))
	}
	cfg.Pipeline.Hops = hc
	return st, nil
}

func (st *secondStages) group(topic string) int {
	return slices.IndexFunc(st.cfg.Pipeline.Hops.Groups, func(h pipeline.HopGroup) bool { return h.Topic == topic })
}

// hop feeds one first-stage hop record to its second stage.
func (st *secondStages) hop(o *pipeline.Output) error {
	g := st.group(o.Topic)
	if g < 0 || o.Partition < 0 || o.Partition >= st.partitions {
		return fmt.Errorf("replay: hop record for %s partition %d: no such second stage", o.Topic, o.Partition)
	}
	st.feed(g, o.Partition, o.Value)
	return st.err
}

func (st *secondStages) feed(g int, rp int32, value []byte) {
	off := st.offsets[g][rp]
	st.offsets[g][rp]++
	st.procs[g][rp].Process(pipeline.Record{Topic: st.cfg.Pipeline.Hops.Groups[g].Topic, Partition: rp, Offset: off, Value: value}, func(o *pipeline.Output) {
		st.emit(g, o)
	})
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

// end tells every second stage that every source has ended (an idle marker from
// each, which releases everything once all are in) and checks that nothing is left.
func (st *secondStages) end() error {
	var buf []byte
	for g := range st.procs {
		for rp, p := range st.procs[g] {
			for src := range st.partitions {
				var err error
				rec := repartition.Record{Kind: repartition.KindMarker, Watermark: repartition.NoWatermark, Idle: true, Event: repartition.Event{Source: src}}
				if buf, err = repartition.AppendRecord(buf[:0], &rec); err != nil {
					return err
				}
				st.feed(g, int32(rp), buf)
			}
			if n := p.Pending(); n != 0 && st.err == nil {
				return fmt.Errorf("replay group %s partition %d: %d events still held after every source ended", st.cfg.Groups[g].Name, rp, n)
			}
			st.res.Groups[g].HopDuplicate += p.MergeStats().Duplicates
		}
	}
	return st.err
}
