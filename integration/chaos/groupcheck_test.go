//go:build integration

package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

// What a re-keyed group's answers are judged by (docs/repartition.md). A
// second stage's state after the records of its repartition partition up to
// last_offset is a function of those records alone (the merger reads no
// clock), so the model reads the partition back after the run: which hop
// events it holds, at which offsets, from which input records. The amounts,
// event times and keys are the generator's (by the input record each event
// names), never the hop record's.
//
// Which events are pending. The merger holds what it received at or above its
// frontier F and releases the rest in (event time, source partition, source
// offset) order; F only rises, and an event that arrives below F (its source
// was idle, the idle rule let the order pass it) is counted at once, out of
// order (late=true), or dead-lettered late_after_idle, never held. So the
// pending events are always the received ones at or above F, which are the
// last ones in that order: an answer's pending = n names exactly the last n of
// the distinct events received up to last_offset (a re-send of a (source
// partition, source offset) is one event), less those dead-lettered
// late_after_idle. One of those n counted out of order is a wrong pending.
//
// Which events are counted out of order, or dead-lettered, the model takes
// from the group's committed outputs (one per event: the checks of the
// group's topic hold them to that), since that depends on how the hop
// records interleaved. It matters for sweeps: the second stage sweeps idle
// entities as the released sequence passes sweepEveryMs of event time (the
// first released event sweeps), and an event counted out of order neither
// sweeps nor is released in sequence. When the outputs disagree on one event
// (counted out of order in one, in order in a repeat of it) the last sweep is
// not known, and at_range.from is left unjudged for that partition.

// hopEvent is one hop event a repartition partition holds.
type hopEvent struct {
	off int64  // its offset in the repartition partition
	src srcKey // the input record it carries
	tx  genTx
}

// hopOutcome is how the group's outputs say the second stage counted an
// event.
type hopOutcome int

const (
	inOrder      hopOutcome = iota // released in sequence and counted (or no output says otherwise)
	outOfOrder                     // counted at once, late=true
	deadAtIdle                     // dead-lettered late_after_idle: never held, never counted
	deadReleased                   // released in sequence, then dead-lettered (its bucket had left the windows)
)

// rpModel is one repartition partition as its second stage's answers are
// judged by it.
type rpModel struct {
	offs    []int64    // every record's offset (events and markers), ascending
	evs     []hopEvent // the events, by offset; re-sends included
	outcome map[srcKey]hopOutcome
	mixed   string // non-empty: the outputs disagree on an event's outcome; the last sweep is not known
}

// groupModel is a re-keyed group's repartition topic as its answers are
// judged by it.
type groupModel struct {
	name, key string                 // the group, and the transaction field it is keyed by
	topic     string                 // its repartition topic
	def       *definition.Definition // the group's windows and features, as a definition of its own
	label     string                 // what "definition" says
	ends      map[int32]int64        // the repartition partitions' end offsets
	parts     [partitions]rpModel
}

// hopRecord is one record read back from a repartition partition.
type hopRecord struct {
	off   int64
	value []byte
	ts    int64 // its timestamp, Unix ms: the brokers' append time, the idle leases' clock
}

// newGroupModel builds the model of group dg of def from its repartition
// topic's records below ends (recs, by partition), the group's committed
// outputs (outs, by input record, read with c), the input's generator notes
// (gen) and the generator's transactions (txs). An error says the model
// cannot be built, and no answer of the group can be judged.
func newGroupModel(def *definition.Definition, dg definition.Group, topic string, recs map[int32][]hopRecord, ends map[int32]int64,
	outs map[srcKey][]output, c *goavro.Codec, gen map[srcKey]string, txs map[string]genTx) (*groupModel, error) {
	gm := &groupModel{
		name: dg.Name, key: dg.Key, topic: topic, ends: ends, label: def.Version + "@" + def.Hash(),
		def: &definition.Definition{Group: dg.Name, Windows: dg.Windows, Features: dg.Features, Filters: dg.Filters, Distincts: dg.Distincts},
	}
	if err := checkModelled(gm.def); err != nil {
		return nil, fmt.Errorf("group %s: %w", dg.Name, err)
	}
	if _, err := txField(genTx{}, dg.Key); err != nil {
		return nil, fmt.Errorf("group %s's key: %w", dg.Name, err)
	}
	var dec repartition.Decoder
	for p := range int32(partitions) {
		pm := &gm.parts[p]
		pm.outcome = map[srcKey]hopOutcome{}
		rs := slices.SortedFunc(slices.Values(recs[p]), func(a, b hopRecord) int { return cmp.Compare(a.off, b.off) })
		for _, hr := range rs {
			var rec repartition.Record
			if err := dec.Decode(hr.value, &rec); err != nil {
				return nil, fmt.Errorf("%s/%d@%d is not a hop record: %w", topic, p, hr.off, err)
			}
			pm.offs = append(pm.offs, hr.off)
			if rec.Kind != repartition.KindEvent {
				continue
			}
			src := srcKey{rec.Source, rec.Offset}
			note, ok := gen[src]
			if !ok {
				return nil, fmt.Errorf("%s/%d@%d names input record %d/%d, which the input does not have", topic, p, hr.off, src.part, src.offset)
			}
			tx, ok := txs[genID(note)]
			if !ok {
				return nil, fmt.Errorf("%s/%d@%d names input record %d/%d (%q), which carries no transaction", topic, p, hr.off, src.part, src.offset, note)
			}
			if k, _ := txField(tx, dg.Key); k != rec.Key || tx.time != rec.EventTime {
				return nil, fmt.Errorf("%s/%d@%d: key %q, event time %d; input record %d/%d has %s %q, event time %d",
					topic, p, hr.off, rec.Key, rec.EventTime, src.part, src.offset, dg.Key, k, tx.time)
			}
			if want := apiPartition(rec.Key); want != p {
				return nil, fmt.Errorf("%s/%d@%d: key %q belongs in partition %d", topic, p, hr.off, rec.Key, want)
			}
			if _, seen := pm.outcome[src]; !seen {
				o, mixed, err := outcomeOf(outs[src], c)
				if err != nil {
					return nil, fmt.Errorf("group %s's output for input %d/%d: %w", dg.Name, src.part, src.offset, err)
				}
				pm.outcome[src] = o
				if mixed && pm.mixed == "" {
					pm.mixed = fmt.Sprintf("the group's outputs for input %d/%d disagree on how it was counted", src.part, src.offset)
				}
			}
			pm.evs = append(pm.evs, hopEvent{off: hr.off, src: src, tx: tx})
		}
	}
	return gm, nil
}

// outcomeOf reads how the outputs of one input record in a group say it was
// counted; mixed when they disagree.
func outcomeOf(outs []output, c *goavro.Codec) (o hopOutcome, mixed bool, err error) {
	for i, out := range outs {
		var this hopOutcome
		switch {
		case out.dead && out.reason == "late_after_idle":
			this = deadAtIdle
		case out.dead:
			this = deadReleased
		default:
			nat, _, err := c.NativeFromBinary(out.value)
			if err != nil {
				return 0, false, err
			}
			if late, _ := nat.(map[string]any)["late"].(bool); late {
				this = outOfOrder
			}
		}
		if i > 0 && this != o {
			mixed = true
		}
		o = this
	}
	return o, mixed, nil
}

// received is the distinct events of partition p up to offset last, less
// those never held, in release order: (event time, source partition, source
// offset).
func (gm *groupModel) received(p int32, last int64) []hopEvent {
	pm := &gm.parts[p]
	n := sort.Search(len(pm.evs), func(i int) bool { return pm.evs[i].off > last })
	seen := map[srcKey]bool{}
	var out []hopEvent
	for _, e := range pm.evs[:n] {
		if seen[e.src] || pm.outcome[e.src] == deadAtIdle {
			continue
		}
		seen[e.src] = true
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b hopEvent) int {
		return cmp.Or(cmp.Compare(a.tx.time, b.tx.time), cmp.Compare(a.src.part, b.src.part), cmp.Compare(a.src.offset, b.src.offset))
	})
	return out
}

// at computes partition p's state when its second stage has processed every
// record up to last and its merger holds pending events, for key.
func (gm *groupModel) at(p int32, last int64, pending int, key string) (state, error) {
	pm := &gm.parts[p]
	s := state{from: -maxTime, to: maxTime, fromUnknown: pm.mixed != ""}
	var largest int64
	for _, sp := range gm.def.Windows {
		largest = max(largest, sp.WindowMs)
	}
	recv := gm.received(p, last)
	s.accepted = len(recv)
	if pending < 0 {
		return s, fmt.Errorf("pending %d is negative", pending)
	}
	if pending > len(recv) {
		return s, fmt.Errorf("pending %d, but the partition holds only %d distinct events up to offset %d", pending, len(recv), last)
	}
	released := recv[:len(recv)-pending]
	for _, e := range recv[len(released):] {
		if pm.outcome[e.src] == outOfOrder {
			return s, fmt.Errorf("pending %d would hold input %d/%d (t %d), which the group counted out of order (late=true): counted at once, never held", pending, e.src.part, e.src.offset, e.tx.time)
		}
	}
	for i := range pending {
		s.pending = append(s.pending, len(released)+i)
	}
	for i, e := range released {
		o := pm.outcome[e.src]
		if o != outOfOrder && e.tx.time-s.lastSweep >= sweepEveryMs {
			s.lastSweep = e.tx.time
		}
		if o == deadReleased {
			continue
		}
		if !s.hasNewest || e.tx.time > s.newest {
			s.newest, s.hasNewest = e.tx.time, true
		}
		if k, _ := txField(e.tx, gm.key); k == key {
			s.counted = append(s.counted, i)
			s.entityEvs = append(s.entityEvs, e.tx)
		}
	}
	// as_of: the newest counted event time, or the last sweep if later; with
	// nothing counted, 0 (a second stage has no watermark of its own).
	swept := s.lastSweep != 0
	switch {
	case s.hasNewest:
		s.asOf = s.newest
		if swept {
			s.asOf = max(s.asOf, s.lastSweep)
		}
	case swept:
		s.asOf = s.lastSweep
	}
	if swept {
		s.from = s.lastSweep
	}
	if s.hasNewest || swept {
		s.to = min(s.asOf+largest, maxTime)
	}
	return s, nil
}

// view is the group's model as judge reads it.
func (gm *groupModel) view() *view {
	return &view{
		ends: gm.ends, def: gm.def, label: gm.label, group: gm.name, specs: gm.def.Windows,
		at: gm.at,
		behind: func(p int32, last, floor int64) bool {
			offs := gm.parts[p].offs
			i := sort.Search(len(offs), func(i int) bool { return offs[i] > last })
			return i < len(offs) && offs[i] < floor
		},
		describe: func(s state, p int32, last int64) string {
			var b strings.Builder
			fmt.Fprintf(&b, "\n      expected from %s/%d up to offset %d: %d distinct events held or counted, the last %d of them pending; last sweep %d, newest counted %d (counted: %v), as_of %d, at_range [%d, %d]; the key's counted events: %d",
				gm.topic, p, last, s.accepted, len(s.pending), s.lastSweep, s.newest, s.hasNewest, s.asOf, s.from, s.to, len(s.entityEvs))
			if m := gm.parts[p].mixed; m != "" {
				fmt.Fprintf(&b, " (%s: the last sweep is uncertain)", m)
			}
			return b.String()
		},
	}
}

// repartitionTopic is the repartition topic of a re-keyed group under a
// consumer group (docs/repartition.md).
func repartitionTopic(consumerGroup, group string) string {
	return "__velocity-repartition-" + consumerGroup + "-" + group
}

// readRepartition reads every record of topic back (read_committed under
// --exactly-once), with the partitions' end offsets. The topic is complete:
// every instance has stopped.
func readRepartition(ctx context.Context, addr, topic string, committed bool) (map[int32][]hopRecord, map[int32]int64, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(kafkatest.Seeds(addr)...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DialTimeout(5 * time.Second)}
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	ends := map[int32]int64{}
	for p := range int32(partitions) {
		ends[p] = 0
	}
	recs := map[int32][]hopRecord{}
	// A poll that waits pollQuiet for nothing has found the end: the topic no
	// longer grows, and a fetch with records to give answers at once. The
	// high watermark of the last fetch of a partition is its end.
	const pollQuiet = 3 * time.Second
	for {
		pctx, cancel := context.WithTimeout(ctx, pollQuiet)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("read %s: %w", topic, ctx.Err())
		}
		n := 0
		for _, fe := range fs.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) {
				return nil, nil, fmt.Errorf("read %s: %w", topic, fe.Err)
			}
		}
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			ends[fp.Partition] = max(ends[fp.Partition], fp.HighWatermark)
			for _, r := range fp.Records {
				recs[r.Partition] = append(recs[r.Partition], hopRecord{off: r.Offset, value: r.Value, ts: r.Timestamp.UnixMilli()})
				ends[r.Partition] = max(ends[r.Partition], r.Offset+1)
				n++
			}
		})
		if n == 0 {
			return recs, ends, nil
		}
	}
}

// repartitionRecords is readRepartition of topic, read once per run: the
// answers' model and the idle lease rule (lease_test.go) both judge by it.
func (r *run) repartitionRecords(topic string, committed bool) (map[int32][]hopRecord, map[int32]int64, error) {
	if rr, ok := r.hopRecs[topic]; ok {
		return rr.recs, rr.ends, nil
	}
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
	defer cancel()
	recs, ends, err := readRepartition(ctx, r.addr, topic, committed)
	if err != nil {
		return nil, nil, err
	}
	if r.hopRecs == nil {
		r.hopRecs = map[string]repartitionRead{}
	}
	r.hopRecs[topic] = repartitionRead{recs, ends}
	return recs, ends, nil
}

// repartitionRead is a repartition topic as readRepartition read it.
type repartitionRead struct {
	recs map[int32][]hopRecord
	ends map[int32]int64
}

// groupModels builds the models of g's re-keyed groups from their
// repartition topics and their outputs at the last checkpoint.
func (r *run) groupModels(g *group, gen map[srcKey]string) (map[string]*groupModel, error) {
	def, err := definition.LoadFile(r.v.features)
	if err != nil {
		return nil, err
	}
	out := map[string]*groupModel{}
	for _, rk := range g.groups.rk {
		i := slices.IndexFunc(def.Groups, func(dg definition.Group) bool { return dg.Name == rk.name })
		if i < 0 {
			return nil, fmt.Errorf("group %s is not in %s", rk.name, r.v.features)
		}
		topic := repartitionTopic(g.name, rk.name)
		recs, ends, err := r.repartitionRecords(topic, g.eos)
		if err != nil {
			return nil, err
		}
		gm, err := newGroupModel(def, def.Groups[i], topic, recs, ends, rk.cps[len(rk.cps)-1].outs, rk.out.codec, gen, r.prod.gen.txs)
		if err != nil {
			return nil, err
		}
		out[rk.name] = gm
	}
	return out, nil
}
