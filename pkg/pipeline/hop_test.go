package pipeline

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
)

// The re-keyed groups of these tests are keyed by the currency of our Transaction
// schema: a low-cardinality, skewed key that every input partition carries, and that
// some records lack (""). Each group's features are a definition of their own with
// entity_id: currency, so that a one-stage processor of that definition, fed the
// group's events in (event time, partition, offset) order, is the reference.
var hopGroupDefs = []string{`
version: group-cur
input: {event_id: event_id, entity_id: currency, event_time: event_time, amount: amount_minor}
windows: [10s:1s, 1m:10s]
features:
  - {name: n, agg: count, windows: [10s, 1m]}
  - {name: big, agg: count, windows: [1m], where: [{field: amount_minor, ge: 500}]}
  - {name: cards, agg: distinct_count, field: entity_id, windows: [1m], max_exact: 2}
`, `
version: group-cur-sum
input: {event_id: event_id, entity_id: currency, event_time: event_time, amount: amount_minor}
windows: [5s:1s]
features:
  - {name: spend, agg: sum, windows: [5s]}
  - {name: top, agg: max, windows: [5s]}
`}

type hopGroup struct {
	spec *feature.Spec
	dec  codec.Decoder
}

func loadHopGroups(t testing.TB) []hopGroup {
	t.Helper()
	var gs []hopGroup
	for i, src := range hopGroupDefs {
		d, err := definition.Parse(fmt.Sprintf("group%d.yaml", i), []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		c, err := definition.Compile(d, "", codec.DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		spec, err := definition.EngineSpec(d)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, hopGroup{spec: spec, dec: c.Decoder()})
	}
	return gs
}

// groupsDecoder is the in-place definition's decoder plus, per group, the key and
// the words that group's own definition gives the same record: what a definition
// with groups compiles to (pkg/definition tests hold it to that).
type groupsDecoder struct {
	inner  codec.Decoder
	groups []hopGroup
	txs    []codec.Transaction
}

func (d *groupsDecoder) Decode(value []byte, maxSeen int64, hasMax bool, tx *codec.Transaction) *codec.Rejection {
	if r := d.inner.Decode(value, maxSeen, hasMax, tx); r != nil {
		return r
	}
	if d.txs == nil {
		d.txs = make([]codec.Transaction, len(d.groups))
	}
	tx.Groups = tx.Groups[:0]
	for i, g := range d.groups {
		gv := codec.GroupValues{}
		// The group's definition refuses a record without a currency (its
		// entity): that record has no key for the group.
		if r := g.dec.Decode(value, 0, false, &d.txs[i]); r == nil {
			gv.Key, gv.Ext = d.txs[i].EntityID, d.txs[i].Ext
		}
		tx.Groups = append(tx.Groups, gv)
	}
	return nil
}

func hopTopic(g int) string { return fmt.Sprintf("%sgrp-g%d", "__velocity-repartition-", g) }

// hopInput is records of three input partitions: featureRecords' mix (out of order,
// late, duplicates within a partition, the same ids on several partitions).
func hopInput() [][]Record {
	all := featureRecords(900)
	parts := make([][]Record, 3)
	for i, r := range all {
		p := int32(i % 3)
		r.Partition, r.Offset = p, int64(len(parts[p]))
		parts[p] = append(parts[p], r)
	}
	return parts
}

// firstStages runs every input partition's first stage and returns, per group and
// repartition partition, each source's hop records in the order it sent them
// (markers every markEvery records, as a live tick would, and the end of input),
// plus the accepted records' (partition, offset) per group.
func firstStages(t testing.TB, parts [][]Record, groups []hopGroup, markEvery int) (hops [][][][][]byte, accepted []map[[2]int64]bool) {
	t.Helper()
	inner := newFeaturesProcessor(t, txDefinition, 1500).cfg.Decoder
	hc := &HopConfig{Partitions: int32(len(parts))}
	for i, g := range groups {
		hc.Groups = append(hc.Groups, HopGroup{Name: fmt.Sprintf("g%d", i), Topic: hopTopic(i), Words: g.spec.Words()})
	}
	spec := newFeaturesProcessor(t, txDefinition, 1500).cfg.Features
	hops = make([][][][][]byte, len(groups))
	accepted = make([]map[[2]int64]bool, len(groups))
	for g := range groups {
		accepted[g] = map[[2]int64]bool{}
		hops[g] = make([][][][]byte, len(parts))
		for rp := range parts {
			hops[g][rp] = make([][][]byte, len(parts))
		}
	}
	for src, recs := range parts {
		p, err := New(Config{Topic: "tx", Partition: int32(src), Decoder: &groupsDecoder{inner: inner, groups: groups},
			Features: spec, Hops: hc, Watermark: watermark.Config{AllowedLateness: 1500}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		p.SetOwnerEpoch(7)
		emit := func(o *Output) {
			if !o.Hop {
				return
			}
			g := slices.IndexFunc(hc.Groups, func(h HopGroup) bool { return h.Topic == o.Topic })
			if g < 0 || o.Group != hc.Groups[g].Name {
				t.Fatalf("hop to %q (group %q): not a configured group", o.Topic, o.Group)
			}
			if o.Key != nil {
				if want := repartition.PartitionFor(string(o.Key), hc.Partitions); o.Partition != want {
					t.Fatalf("key %q hopped to partition %d, murmur2 says %d", o.Key, o.Partition, want)
				}
				accepted[g][[2]int64{int64(src), o.SourceOffset}] = true
			}
			hops[g][o.Partition][src] = append(hops[g][o.Partition][src], bytes.Clone(o.Value))
		}
		for i, r := range recs {
			p.Process(r, emit)
			if markEvery > 0 && i%markEvery == markEvery-1 {
				p.HopMarkers(false, emit)
			}
		}
		p.Flush(emit)
		p.EndOfInput(emit)
	}
	return hops, accepted
}

type mergedOut struct {
	dead  bool
	value []byte
}

// secondStage feeds one repartition partition's stage the sources' records in a
// random interleaving that keeps each source's order, re-sends a random suffix of a
// source now and then (an owner restarted from an older checkpoint), and restores
// from its own snapshot at random points. It returns its outputs by source position.
func secondStage(t testing.TB, g hopGroup, name string, rp int, perSource [][][]byte, rng *rand.Rand) map[[2]int64]mergedOut {
	t.Helper()
	cfg := Config{Topic: "__velocity-repartition-grp-" + name, Partition: int32(rp), Features: g.spec, Merge: &MergeConfig{Group: name, Sources: len(perSource)}}
	p, err := New(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[[2]int64]mergedOut{}
	emit := func(o *Output) {
		if o.Hop {
			t.Fatal("a second stage hopped")
		}
		k := [2]int64{int64(o.SourcePartition), o.SourceOffset}
		if prev, ok := out[k]; ok {
			t.Fatalf("group %s: input %v yielded twice (%v, then dead=%v %s)", name, k, prev.dead, o.Dead, o.Err)
		}
		if o.Dead && o.Group != name {
			t.Fatalf("a second stage's dead letter names group %q, want %q", o.Group, name)
		}
		out[k] = mergedOut{o.Dead, bytes.Clone(o.Value)}
	}
	next := make([]int, len(perSource))
	var off int64
	// A snapshot taken in steps while records go on (the service's way), to be
	// finished a few records later and held to AppendSnapshot at its cut: the
	// Merger's part is encoded at the cut into the buffer the previous snapshot
	// gave back.
	var (
		stepped   *PendingSnapshot
		wantAtCut []byte
	)
	for {
		var live []int
		for s := range perSource {
			if next[s] < len(perSource[s]) {
				live = append(live, s)
			}
		}
		if len(live) == 0 {
			break
		}
		s := live[rng.IntN(len(live))]
		if next[s] > 0 && rng.IntN(200) == 0 {
			next[s] = rng.IntN(next[s]) // re-send from an earlier point
		}
		p.Process(Record{Topic: cfg.Topic, Partition: cfg.Partition, Offset: off, Value: perSource[s][next[s]]}, emit)
		next[s]++
		off++
		if stepped != nil && rng.IntN(5) == 0 {
			stepped.Step(math.MaxInt)
			if got, err := stepped.Finish(); err != nil || !bytes.Equal(got, wantAtCut) {
				t.Fatalf("group %s partition %d: a snapshot finished later differs from AppendSnapshot at its cut (%v)", name, rp, err)
			}
			p.EndSnapshot(stepped)
			stepped = nil
		} else if stepped == nil && rng.IntN(100) == 0 {
			wantAtCut = p.AppendSnapshot(nil)
			stepped = p.BeginSnapshot(nil)
		}
		if stepped == nil && rng.IntN(150) == 0 {
			snap := p.AppendSnapshot(nil)
			if p, err = Restore(cfg, snap); err != nil {
				t.Fatal(err)
			}
			if again := p.AppendSnapshot(nil); !bytes.Equal(again, snap) {
				t.Fatal("a restored second stage writes another snapshot")
			}
		}
	}
	if p.Pending() != 0 {
		t.Fatalf("group %s partition %d: %d events still pending after every source ended", name, rp, p.Pending())
	}
	return out
}

// TestTwoStagesEqualOneStageOverTheSortedGroup: whatever the interleaving, the
// re-sends and the restarts, each group's outputs are, byte for byte, the same, one
// per accepted record with the group's key, and equal to a one-stage processor of the
// group's own definition fed the group's events in (event time, partition, offset)
// order.
func TestTwoStagesEqualOneStageOverTheSortedGroup(t *testing.T) {
	groups := loadHopGroups(t)
	parts := hopInput()
	hops, accepted := firstStages(t, parts, groups, 25)
	for g, grp := range groups {
		name := fmt.Sprintf("g%d", g)
		var first map[[2]int64]mergedOut
		for seed := range 6 {
			rng := rand.New(rand.NewPCG(uint64(seed), 99))
			got := map[[2]int64]mergedOut{}
			for rp := range parts {
				for k, v := range secondStage(t, grp, name, rp, hops[g][rp], rng) {
					got[k] = v
				}
			}
			if len(got) != len(accepted[g]) {
				t.Fatalf("group %s seed %d: %d outputs for %d accepted records with a key", name, seed, len(got), len(accepted[g]))
			}
			for k := range accepted[g] {
				if _, ok := got[k]; !ok {
					t.Fatalf("group %s seed %d: accepted record %v yielded nothing", name, seed, k)
				}
			}
			if first == nil {
				first = got
				continue
			}
			for k, v := range first {
				if w := got[k]; w.dead != v.dead || !bytes.Equal(w.value, v.value) {
					t.Fatalf("group %s: seed %d gave another output for %v than seed 0", name, seed, k)
				}
			}
		}
		checkAgainstOneStage(t, grp, parts, accepted[g], first)
	}
}

func checkAgainstOneStage(t *testing.T, g hopGroup, parts [][]Record, accepted map[[2]int64]bool, got map[[2]int64]mergedOut) {
	t.Helper()
	type ev struct {
		t        int64
		src, off int64
		value    []byte
	}
	var evs []ev
	var tx codec.Transaction
	for src, recs := range parts {
		for _, r := range recs {
			if !accepted[[2]int64{int64(src), r.Offset}] {
				continue
			}
			if rej := g.dec.Decode(r.Value, 0, false, &tx); rej != nil {
				t.Fatal(rej)
			}
			evs = append(evs, ev{tx.EventTime, int64(src), r.Offset, r.Value})
		}
	}
	slices.SortFunc(evs, func(a, b ev) int {
		return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.src, b.src), cmp.Compare(a.off, b.off))
	})
	ref, err := New(Config{Topic: "ref", Decoder: g.dec, Features: g.spec, Watermark: watermark.Config{DisableDedupe: true}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var want, have feature.Head
	wantRow, haveRow := feature.NewRow(g.spec), feature.NewRow(g.spec)
	compared := 0
	for i, e := range evs {
		ref.Process(Record{Topic: "ref", Offset: int64(i), Value: e.value}, func(o *Output) {
			if o.Dead {
				t.Fatalf("reference dead-lettered %v: %s", o.Reason, o.Err)
			}
			out := got[[2]int64{e.src, e.off}]
			if out.dead {
				t.Fatalf("input %d/%d: the second stage dead-lettered what one stage counts", e.src, e.off)
			}
			if err := feature.ParseRow(o.Value, g.spec, &want, wantRow); err != nil {
				t.Fatal(err)
			}
			if err := feature.ParseRow(out.value, g.spec, &have, haveRow); err != nil {
				t.Fatal(err)
			}
			if have.SourceTopic != "tx" || have.SourcePartition != int32(e.src) || have.SourceOffset != e.off {
				t.Fatalf("lineage %s/%d/%d, want tx/%d/%d", have.SourceTopic, have.SourcePartition, have.SourceOffset, e.src, e.off)
			}
			have.SourceTopic, have.SourcePartition, have.SourceOffset = want.SourceTopic, want.SourcePartition, want.SourceOffset
			if have != want || !slices.Equal(haveRow.Values, wantRow.Values) || !slices.Equal(haveRow.Null, wantRow.Null) || !slices.Equal(haveRow.Exact, wantRow.Exact) {
				t.Fatalf("input %d/%d: second stage %+v %v, one stage %+v %v", e.src, e.off, have, haveRow.Values, want, wantRow.Values)
			}
			compared++
		})
	}
	if compared != len(evs) || compared == 0 {
		t.Fatalf("compared %d of %d events", compared, len(evs))
	}
}

// TestSecondStageAfterIdle: an event whose source was idle while the frontier passed
// its time is counted out of order and marked late, a re-send of it is dropped, and
// one whose bucket has left the windows is a late_after_idle dead letter, once.
func TestSecondStageAfterIdle(t *testing.T) {
	g := loadHopGroups(t)[1] // spend (sum 5s), top (max 5s): no words
	cfg := Config{Topic: "__velocity-repartition-grp-g1", Features: g.spec, Merge: &MergeConfig{Group: "g1", Sources: 2}}
	p, err := New(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	const t0 = int64(1_793_491_200_000)
	var off int64
	type got struct {
		dead   bool
		reason codec.Reason
		late   bool
		spend  int64
	}
	var outs []got
	send := func(r repartition.Record) {
		t.Helper()
		b, err := repartition.AppendRecord(nil, &r)
		if err != nil {
			t.Fatal(err)
		}
		p.Process(Record{Topic: cfg.Topic, Offset: off, Value: b}, func(o *Output) {
			var h feature.Head
			row := feature.NewRow(g.spec)
			if o.Dead {
				outs = append(outs, got{dead: true, reason: o.Reason})
				return
			}
			if err := feature.ParseRow(o.Value, g.spec, &h, row); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, got{late: h.Late, spend: row.Values[0]})
		})
		off++
	}
	ev := func(src int32, o, at, amount int64) repartition.Record {
		return repartition.Record{Kind: repartition.KindEvent, Watermark: at, Event: repartition.Event{
			Source: src, Offset: o, EventTime: at, Topic: "tx", Key: "EUR", EventID: fmt.Sprintf("e%d-%d", src, o), Amount: amount}}
	}
	send(ev(0, 0, t0+10_000, 100))
	send(repartition.Record{Kind: repartition.KindMarker, Watermark: repartition.NoWatermark, Idle: true, Event: repartition.Event{Source: 1}})
	send(repartition.Record{Kind: repartition.KindMarker, Watermark: t0 + 10_500, Event: repartition.Event{Source: 0}})
	if len(outs) != 1 || outs[0].late || outs[0].spend != 100 {
		t.Fatalf("with source 1 idle the first event is released in order: %+v", outs)
	}
	send(ev(1, 0, t0+1_000, 7)) // below the frontier, 9 s behind the entity's newest event: its bucket left the 5 s window
	send(ev(1, 1, t0+9_000, 5)) // below the frontier, still in the window: counted as of its own time, late
	send(ev(1, 0, t0+1_000, 7)) // re-sends: nothing
	send(ev(1, 1, t0+9_000, 5))
	send(ev(0, 1, t0+12_000, 1)) // the window as of 12 s holds all but the expired one, once both sources pass it
	send(repartition.Record{Kind: repartition.KindMarker, Watermark: t0 + 20_000, Event: repartition.Event{Source: 0}})
	send(repartition.Record{Kind: repartition.KindMarker, Watermark: t0 + 20_000, Event: repartition.Event{Source: 1}})
	want := []got{{spend: 100}, {dead: true, reason: repartition.ReasonLateAfterIdle}, {late: true, spend: 5}, {spend: 106}}
	if !slices.Equal(outs, want) {
		t.Fatalf("outputs %+v, want %+v", outs, want)
	}
	if st := p.MergeStats(); st.LateAfterIdle != 2 || st.Duplicates != 2 {
		t.Fatalf("merge stats %+v, want 2 late after idle and 2 duplicates", st)
	}
}

// TestFirstStageWakeUpReachesEveryRepartitionPartition: the first record after a
// first stage declared its input idle sends a marker that is not idle to every
// repartition partition of every group, at once, not only hop records to those its
// keys go to: until a repartition partition hears from the source, its second
// stage leaves it out of the order and lets the other sources' watermarks move
// the frontier past its new events. It failed before the wake-up sent them: the
// record reached one repartition partition per group and the rest waited for the
// next tick's markers (and, under --exactly-once, the next interval's commit).
func TestFirstStageWakeUpReachesEveryRepartitionPartition(t *testing.T) {
	groups := loadHopGroups(t)
	const parts = 3
	inner := newFeaturesProcessor(t, txDefinition, 1500).cfg.Decoder
	hc := &HopConfig{Partitions: parts}
	for i, g := range groups {
		hc.Groups = append(hc.Groups, HopGroup{Name: fmt.Sprintf("g%d", i), Topic: hopTopic(i), Words: g.spec.Words()})
	}
	p, err := New(Config{Topic: "tx", Partition: 0, Decoder: &groupsDecoder{inner: inner, groups: groups},
		Features: newFeaturesProcessor(t, txDefinition, 1500).cfg.Features, Hops: hc, Watermark: watermark.Config{AllowedLateness: 1500}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	recs := hopInput()[0]
	var outs []*Output
	emit := func(o *Output) {
		if o.Hop {
			c := *o
			c.Value = bytes.Clone(o.Value)
			outs = append(outs, &c)
		}
	}
	for _, r := range recs[:20] {
		p.Process(r, emit)
	}
	p.HopMarkers(true, emit)
	if !p.IdleDeclared() {
		t.Fatal("the idle verdict was not declared")
	}
	outs = nil
	p.Process(recs[20], emit)
	if p.IdleDeclared() {
		t.Error("a record did not end the idle declaration")
	}
	active := map[[2]int]bool{} // (group, repartition partition) that heard a marker that is not idle
	var dec repartition.Decoder
	for _, o := range outs {
		var r repartition.Record
		if err := dec.Decode(o.Value, &r); err != nil {
			t.Fatal(err)
		}
		g := slices.IndexFunc(hc.Groups, func(h HopGroup) bool { return h.Topic == o.Topic })
		if r.Kind == repartition.KindMarker && !r.Idle {
			active[[2]int{g, int(o.Partition)}] = true
		}
	}
	for g := range hc.Groups {
		for rp := range parts {
			if !active[[2]int{g, rp}] {
				t.Errorf("group %d, repartition partition %d: no marker that is not idle after the wake-up (%d hop records sent)", g, rp, len(outs))
			}
		}
	}
}

// TestBorrowedKeysChangeNothing: a definition's decoder with re-keyed groups
// (payment_groups.yaml: card in place, device and ip re-keyed) leaves the ids and
// the groups' keys in the input record's bytes (codec.BorrowingDecoder); the first
// stages' outputs, hop records included, and snapshots are byte for byte those of
// the same decoder copying them, with every input's bytes overwritten as soon as
// Process returns.
func TestBorrowedKeysChangeNothing(t *testing.T) {
	comp, specs := compileBenchGroups(t, -1)
	if _, ok := comp.Decoder().(codec.BorrowingDecoder); !ok {
		t.Fatal("a definition's decoder does not borrow: nothing to test")
	}
	hc := &HopConfig{Partitions: benchSources}
	for _, gs := range specs[1:] {
		hc.Groups = append(hc.Groups, HopGroup{Name: gs.Name, Topic: "__velocity-repartition-t-" + gs.Name, Words: gs.Spec.Words()})
	}
	parts := paymentBenchStream(t, 3000)
	type emitted struct {
		dead, hop     bool
		topic, reason string
		partition     int32
		offset        int64
		key, value    []byte
	}
	for _, lateness := range []int64{0, 1000} {
		var outs [2][]emitted
		var snaps [2][][]byte
		for run, dec := range []codec.Decoder{plainDecoder{comp.Decoder()}, comp.Decoder()} {
			for src := range int32(benchSources) {
				p, err := New(Config{Topic: "payments", Partition: src, Decoder: dec, Features: specs[0].Spec, Hops: hc,
					Watermark: watermark.Config{AllowedLateness: lateness}}, 0)
				if err != nil {
					t.Fatal(err)
				}
				if (p.borrow != nil) != (run == 1) {
					t.Fatalf("run %d: borrowing %v", run, p.borrow != nil)
				}
				emit := func(o *Output) {
					outs[run] = append(outs[run], emitted{o.Dead, o.Hop, o.Topic, string(o.Reason), o.Partition, o.SourceOffset, bytes.Clone(o.Key), bytes.Clone(o.Value)})
				}
				for i, v := range parts[src] {
					r := Record{Topic: "payments", Partition: src, Offset: int64(i), Value: bytes.Clone(v)}
					p.Process(r, emit)
					for j := range r.Value {
						r.Value[j] = 0xee // as a fetch buffer reused or freed
					}
					if i%211 == 0 {
						p.HopMarkers(false, emit)
						snaps[run] = append(snaps[run], p.AppendSnapshot(nil))
					}
				}
				p.Flush(emit)
				p.EndOfInput(emit)
				snaps[run] = append(snaps[run], p.AppendSnapshot(nil))
			}
		}
		if len(outs[0]) < 3000 || !slices.EqualFunc(outs[0], outs[1], func(a, b emitted) bool {
			return a.dead == b.dead && a.hop == b.hop && a.topic == b.topic && a.reason == b.reason && a.partition == b.partition &&
				a.offset == b.offset && bytes.Equal(a.key, b.key) && bytes.Equal(a.value, b.value)
		}) {
			t.Fatalf("lateness %d: %d and %d outputs, not the same with borrowed ids and keys", lateness, len(outs[0]), len(outs[1]))
		}
		if !slices.EqualFunc(snaps[0], snaps[1], bytes.Equal) {
			t.Fatalf("lateness %d: snapshots differ with borrowed ids and keys", lateness)
		}
	}
}

// TestIdleDeclarationOfALostOwner (docs/repartition.md, the idle rule: "A lost
// owner's declaration runs out"): source 1's owner declares its input idle, renews
// the declaration once, then is lost (SIGKILL, a freeze, or a network cut past the
// session) before its input resumes, and nobody else can speak for the partition
// until the group gives it to a new owner, --session-timeout later. Meanwhile
// source 0 goes on for 30 s. The new owner announces itself with the watermark it
// restored and hops what its input received after the loss. With the lease run
// out, source 0 could not carry the frontier more than the lease past source 1's
// last renewal, so every one of the new owner's events is in order; with
// unleased declarations (leased false) every one of them is counted out of order
// (late=true), where replay counts them in order. Seed 2502371208 of the
// kafka-groups fault checker showed it: 281-425 such events per group, all from
// the input partition whose owner was SIGKILLed 6 s after its idle declaration.
func TestIdleDeclarationOfALostOwner(t *testing.T) {
	for _, leased := range []bool{true, false} {
		t.Run(fmt.Sprint("leased=", leased), func(t *testing.T) {
			g := loadHopGroups(t)[1]
			cfg := Config{Topic: "__velocity-repartition-grp-g1", Features: g.spec, Merge: &MergeConfig{Group: "g1", Sources: 2}}
			p, err := New(cfg, 0)
			if err != nil {
				t.Fatal(err)
			}
			const t0 = int64(1_793_491_200_000)
			const lateness = 1000
			var off int64
			late := 0
			send := func(r repartition.Record, ts int64) {
				t.Helper()
				if !leased {
					r.Lease = 0
				}
				b, err := repartition.AppendRecord(nil, &r)
				if err != nil {
					t.Fatal(err)
				}
				p.Process(Record{Topic: cfg.Topic, Offset: off, Value: b, Timestamp: ts}, func(o *Output) {
					var h feature.Head
					row := feature.NewRow(g.spec)
					if o.Dead {
						late++
						return
					}
					if err := feature.ParseRow(o.Value, g.spec, &h, row); err != nil {
						t.Fatal(err)
					}
					if h.Late {
						late++
					}
				})
				off++
			}
			ev := func(src int32, epoch uint64, o, at, wm int64) repartition.Record {
				return repartition.Record{Kind: repartition.KindEvent, Epoch: epoch, Watermark: min(wm, at), Event: repartition.Event{
					Source: src, Offset: o, EventTime: at, Topic: "tx", Key: "EUR", EventID: fmt.Sprintf("e%d-%d", src, o), Amount: 1}}
			}
			mark := func(src int32, epoch uint64, wm int64, idle bool) repartition.Record {
				r := repartition.Record{Kind: repartition.KindMarker, Epoch: epoch, Watermark: wm, Idle: idle, Event: repartition.Event{Source: src}}
				if idle {
					r.Lease = 1000 // service.IdleLease of a 1 s lateness
				}
				return r
			}
			// Event times follow the clock; both sources up to t0, then quiet for
			// the idle timeout (2 s): both declare idle, and renew every 250 ms.
			send(ev(0, 1, 0, t0, t0-lateness), t0)
			send(ev(1, 1, 0, t0, t0-lateness), t0)
			send(mark(0, 1, t0-lateness, true), t0+2_000)
			send(mark(1, 1, t0-lateness, true), t0+2_010)
			send(mark(0, 1, t0-lateness, true), t0+2_250)
			send(mark(1, 1, t0-lateness, true), t0+2_260)
			// Source 1's owner is lost at t0+2.3 s. Source 0's input resumes at
			// t0+2.6 s for 30 s, and so does source 1's, which nobody reads.
			send(mark(0, 1, t0-lateness, false), t0+2_600)
			for i := range int64(300) {
				at := t0 + 2_600 + 100*i
				send(ev(0, 1, 1+i, at, at-lateness), at+5)
			}
			passed := p.merge.m.Frontier() - t0
			// The new owner (epoch 2), 6 s after the burst's end: it announces
			// itself with the watermark it restored, then hops the backlog.
			now := t0 + 38_600
			send(mark(1, 2, t0-lateness, false), now)
			for i := range int64(300) {
				at := t0 + 2_600 + 100*i
				send(ev(1, 2, 1+i, at, at-lateness), now+i/10)
			}
			send(mark(0, 1, t0+40_000, false), now+100)
			send(mark(1, 2, t0+40_000, false), now+100)
			if leased && late > 0 {
				t.Fatalf("%d of the new owner's 300 events counted out of order (late=true or late_after_idle): the lost owner's idle declaration let source 0 carry the frontier to t0+%d ms", late, passed)
			}
			if !leased && late == 0 {
				t.Fatalf("without leases no event was counted out of order (frontier at t0+%d ms): the test does not reach the gap", passed)
			}
			if st := p.MergeStats(); leased != (st.IdleExpired == 1) {
				t.Fatalf("%d idle declarations ran out, leased %v", st.IdleExpired, leased)
			}
		})
	}
}

// TestIdleLeaseRenewal: a first stage with IdleLease declares its input idle with
// the lease in every idle marker, renews the declaration every quarter of the lease
// while the caller confirms the input quiet (and only then), and a record ends the
// declaration; the end of a replay's input is never leased.
func TestIdleLeaseRenewal(t *testing.T) {
	groups := loadHopGroups(t)
	const parts = 3
	hc := &HopConfig{Partitions: parts, IdleLease: time.Second}
	for i, g := range groups {
		hc.Groups = append(hc.Groups, HopGroup{Name: fmt.Sprintf("g%d", i), Topic: hopTopic(i), Words: g.spec.Words()})
	}
	inner := newFeaturesProcessor(t, txDefinition, 1500).cfg.Decoder
	p, err := New(Config{Topic: "tx", Partition: 0, Decoder: &groupsDecoder{inner: inner, groups: groups},
		Features: newFeaturesProcessor(t, txDefinition, 1500).cfg.Features, Hops: hc, Watermark: watermark.Config{AllowedLateness: 1500}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var markers []repartition.Record
	var dec repartition.Decoder
	emit := func(o *Output) {
		var r repartition.Record
		if o.Hop {
			if err := dec.Decode(o.Value, &r); err != nil {
				t.Fatal(err)
			}
			if r.Kind == repartition.KindMarker {
				markers = append(markers, r)
			}
		}
	}
	recs := hopInput()[0]
	for _, r := range recs[:20] {
		p.Process(r, emit)
	}
	t0 := time.Unix(1_800_000_000, 0)
	steps := []struct {
		at         time.Duration
		inputQuiet bool // SetInputQuiet: the whole input has been quiet a while
		quiet      bool
		needs      bool // NeedsIdleVerdict before the call
		sent       bool
		markers    int   // idle markers sent
		lease      int64 // on each of them
	}{
		{0, false, false, true, false, 0, 0},
		{0, false, true, true, true, 2 * parts, 1000},                      // the declaration
		{100 * time.Millisecond, false, true, false, false, 0, 0},          // not due
		{249 * time.Millisecond, false, true, false, false, 0, 0},          // not due
		{250 * time.Millisecond, false, false, true, false, 0, 0},          // due, but not confirmed quiet
		{300 * time.Millisecond, false, true, true, true, 2 * parts, 1000}, // renewed
		{500 * time.Millisecond, false, true, false, false, 0, 0},
		{550 * time.Millisecond, false, true, true, true, 2 * parts, 1000},
		{800 * time.Millisecond, true, true, true, false, 0, 0},             // due, but the input is quiet: held
		{1000 * time.Millisecond, true, true, false, false, 0, 0},           // asked again a quarter lease after the hold
		{1050 * time.Millisecond, true, true, true, false, 0, 0},            // held again
		{1100 * time.Millisecond, false, true, false, false, 0, 0},          // input again, not yet asked
		{1300 * time.Millisecond, false, true, true, true, 2 * parts, 1000}, // renewed
	}
	for i, s := range steps {
		p.SetClock(t0.Add(s.at))
		p.SetInputQuiet(s.inputQuiet)
		if got := p.NeedsIdleVerdict(); got != s.needs {
			t.Fatalf("step %d: NeedsIdleVerdict %v, want %v", i, got, s.needs)
		}
		markers = markers[:0]
		sent := p.HopMarkers(s.quiet, emit)
		idle := 0
		for _, m := range markers {
			if m.Idle {
				idle++
				if m.Lease != s.lease {
					t.Fatalf("step %d: idle marker with lease %d, want %d", i, m.Lease, s.lease)
				}
			}
		}
		if sent != s.sent || idle != s.markers {
			t.Fatalf("step %d: sent %v with %d idle markers, want %v with %d", i, sent, idle, s.sent, s.markers)
		}
	}
	if !p.IdleDeclared() {
		t.Fatal("the declaration ended without a record")
	}
	p.Process(recs[20], emit)
	if p.IdleDeclared() || !p.NeedsIdleVerdict() {
		t.Fatal("a record did not end the declaration")
	}
	markers = markers[:0]
	p.EndOfInput(emit)
	for _, m := range markers {
		if !m.Idle || m.Lease != 0 {
			t.Fatalf("end of input sent %+v; want idle markers without a lease", m)
		}
	}
	if len(markers) != 2*parts {
		t.Fatalf("end of input sent %d markers, want %d", len(markers), 2*parts)
	}
}
