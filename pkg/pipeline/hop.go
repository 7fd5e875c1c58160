package pipeline

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Re-keyed groups (docs/repartition.md) are computed in two stages, both Processors.
//
// The first stage is an input partition's processor with Config.Hops: everything it
// did before, plus, for every event it accepts (not a duplicate, not late), one hop
// record per re-keyed group for which the record has a key, to the repartition
// partition of that key. Hopping at acceptance rather than at release keeps the
// reorder buffer as it is: the second stage orders events itself, and the promise a
// hop carries, W = the partition's watermark after the Offer, holds because every
// event accepted later has an event time at or above the watermark at its acceptance,
// which only rises. HopMarkers sends W alone to every repartition partition that has
// not heard it, and the idle rule's verdict.
//
// The second stage is a processor with Config.Merge: its input records are one
// repartition partition's hop records, its Merger releases them in (event time,
// source partition, source offset) order, and it counts them in the group's feature
// state. It decides nothing the first stage decided (validation, dedupe of event
// ids, lateness), and reads no wall clock: its idle leases run on the Kafka
// timestamps of the records it reads (Record.Timestamp).

// HopGroup is one re-keyed group as its first stage sees it.
type HopGroup struct {
	Name  string // the group's name (docs/features.md)
	Topic string // its repartition topic
	Words int    // len(codec.GroupValues.Ext) of its records
}

// HopConfig makes a Processor the first stage of re-keyed groups.
type HopConfig struct {
	// Groups are indexed as codec.Transaction.Groups: the Decoder fills one entry
	// per group, in this order.
	Groups []HopGroup
	// Partitions is each repartition topic's partition count: the input topic's.
	Partitions int32
	// IdleLease, when positive, is how long each idle declaration holds at the
	// second stages without a renewal (repartition.Record.Lease), in whole
	// milliseconds up to repartition.MaxLease; the first stage renews it every
	// quarter of it while the caller confirms the input quiet. 0: a declaration
	// holds until the partition sends anything else (replay).
	IdleLease time.Duration
}

// MergeConfig makes a Processor the second stage of one re-keyed group, reading one
// partition of its repartition topic. Config.Features is the group's features;
// Config.Topic and Partition name the repartition partition.
type MergeConfig struct {
	Group string
	// Sources is the input topic's partition count: how many first stages feed
	// every repartition partition.
	Sources int
}

// hopState is a first stage's per-group, per-repartition-partition bookkeeping.
// None of it is in snapshots: markers are idempotent, so a restored or new owner
// simply sends its watermark again.
type hopState struct {
	cfg   HopConfig
	epoch uint64 // the owner epoch every hop record carries (SetOwnerEpoch)
	// sent[g*Partitions+rp] is the largest watermark sent to that repartition
	// partition (repartition.NoWatermark before any).
	sent []int64
	// idleSent: the idle verdict went to every repartition partition since the
	// last record this partition processed; renewedAt is when it last went (the
	// declaration or its latest renewal) or a due renewal was last held back
	// (inputQuiet), and now the caller's clock (Processor.SetClock).
	idleSent       bool
	renewedAt, now time.Time
	lease          int64 // cfg.IdleLease in ms (0: none)
	// inputQuiet is the caller's word that no partition of the input has
	// received or still holds records to process for a while (SetInputQuiet): a
	// due renewal then waits.
	inputQuiet bool
	rec        repartition.Record
	buf        []byte
	keyBuf     []byte
	out        Output
	// Missing counts, per group, accepted records without a key for it.
	missing []uint64
}

func newHopState(cfg HopConfig) (*hopState, error) {
	if len(cfg.Groups) == 0 {
		return nil, errors.New("pipeline: Hops has no groups")
	}
	if cfg.Partitions < 1 {
		return nil, fmt.Errorf("pipeline: Hops.Partitions %d; want the input topic's partition count", cfg.Partitions)
	}
	if cfg.IdleLease < 0 || cfg.IdleLease%time.Millisecond != 0 || cfg.IdleLease > repartition.MaxLease*time.Millisecond {
		return nil, fmt.Errorf("pipeline: Hops.IdleLease %v; want whole milliseconds, at most %v", cfg.IdleLease, repartition.MaxLease*time.Millisecond)
	}
	h := &hopState{cfg: cfg, sent: make([]int64, len(cfg.Groups)*int(cfg.Partitions)), missing: make([]uint64, len(cfg.Groups)), lease: cfg.IdleLease.Milliseconds()}
	for i := range h.sent {
		h.sent[i] = repartition.NoWatermark
	}
	for _, g := range cfg.Groups {
		if g.Topic == "" || g.Words < 0 || g.Words > repartition.MaxExtWords {
			return nil, fmt.Errorf("pipeline: hop group %q: topic %q, %d words", g.Name, g.Topic, g.Words)
		}
	}
	return h, nil
}

// SetOwnerEpoch sets the owner epoch a first stage's hop records carry (the
// checkpoint store's claim on the input partition; 0 without one, and in replay).
func (p *Processor) SetOwnerEpoch(epoch uint64) {
	if p.hop != nil {
		p.hop.epoch = epoch
	}
}

// KeyMissing returns, per re-keyed group, how many accepted records had no key for
// it (null, absent or empty) and so count for the other groups only; nil without
// Hops.
func (p *Processor) KeyMissing() []uint64 {
	if p.hop == nil {
		return nil
	}
	return p.hop.missing
}

// hopEvent sends the event just accepted to every group it has a key for.
func (p *Processor) hopEvent(ev *watermark.Event, emit func(*Output)) {
	h := p.hop
	wm, _ := p.stage.Watermark() // an event was just accepted: there is one
	w := repartition.EventWatermark(ev.EventTime, wm)
	n := h.cfg.Partitions
	for g := range h.cfg.Groups {
		gv := &p.tx.Groups[g]
		if gv.Key == "" {
			h.missing[g]++
			continue
		}
		rp := repartition.PartitionFor(gv.Key, n)
		h.rec = repartition.Record{Kind: repartition.KindEvent, Epoch: h.epoch, Watermark: w, Event: repartition.Event{
			Source: p.cfg.Partition, Offset: ev.Offset, EventTime: ev.EventTime, Topic: p.cfg.Topic,
			Key: gv.Key, EventID: ev.EventID, Amount: ev.Amount, Ext: gv.Ext,
		}}
		var err error
		if h.buf, err = repartition.AppendRecord(h.buf[:0], &h.rec); err != nil {
			// The decoder holds every field to the rules the hop record checks
			// (codec.Validate, the definition's key rule): a refusal here is a bug.
			panic(fmt.Sprintf("pipeline: hop record for group %s at offset %d: %v", h.cfg.Groups[g].Name, ev.Offset, err))
		}
		if s := &h.sent[g*int(n)+int(rp)]; w > *s {
			*s = w
		}
		h.keyBuf = append(h.keyBuf[:0], gv.Key...)
		p.emitHop(g, rp, h.keyBuf, ev.Offset, ev.Aux, emit)
	}
}

func (p *Processor) emitHop(g int, rp int32, key []byte, offset, arrival int64, emit func(*Output)) {
	h := p.hop
	h.out = Output{
		Hop: true, Topic: h.cfg.Groups[g].Topic, Partition: rp, Group: h.cfg.Groups[g].Name,
		Key: key, Value: h.buf,
		SourceTopic: p.cfg.Topic, SourcePartition: p.cfg.Partition, SourceOffset: offset, Arrival: arrival,
	}
	emit(&h.out)
}

// HopMarkers sends, as a first stage, the partition's watermark to every repartition
// partition that has not received it (nothing sent there carried it), and, when the
// idle rule holds (quiet), the idle verdict to every repartition partition once per
// quiet spell, and again every quarter of its lease (IdleLease) while the spell
// lasts. It reports whether it sent the verdict. quiet is the caller's verdict that
// the input is quiet: the service passes Quiet only once the broker confirms the
// partition has nothing left to read (worker.idleVerdict), so that a slow fetch, a
// woken old owner or one cut off from the brokers is never taken for a quiet input,
// and a lost owner's declaration runs out at the second stages. Call it on the
// processor's goroutine between records, after SetClock (the service does at every
// tick; replay does not: its second stages hear every source's end instead, see
// EndOfInput).
func (p *Processor) HopMarkers(quiet bool, emit func(*Output)) bool {
	h := p.hop
	if h == nil {
		return false
	}
	idle := quiet && (!h.idleSent || h.renewalDue())
	if idle && h.idleSent && h.inputQuiet {
		h.renewedAt = h.now // nothing for a renewal to cover: ask again a quarter lease on
		idle = false
	}
	return p.hopMarkers(idle, h.lease, emit)
}

// SetInputQuiet tells a first stage whether the whole input topic has been quiet
// long enough that its renewals can wait (the service's word, from the brokers:
// no partition's end offset moved and every one was committed to its end, for at
// least the idle timeout plus the lease and a margin; worker.renewalsWanted). A
// lease renewal only keeps this partition from holding up the second stages'
// order while other sources send them records; records reach a repartition
// partition only from input the first stages are processing, and every record
// there moves its clock, the one the leases are measured on. So once the input
// is quiet, the renewals that every quiet partition would go on sending are the
// only records left, and they stop: a quiet deployment writes nothing. When
// input arrives again anywhere, the service says so at the next check (a quarter
// lease at most), the renewals start again, and a second stage whose leases ran
// out meanwhile holds that input's events back until then, which is safe: a
// lapsed declaration only makes the second stage wait. The declaration itself
// (the first verdict of a quiet spell) is never held. The default, false, renews
// every quarter lease.
func (p *Processor) SetInputQuiet(quiet bool) {
	if p.hop != nil {
		p.hop.inputQuiet = quiet
	}
}

// hopMarkers is HopMarkers once the verdict is decided: idle sends it to every
// repartition partition, leased for lease ms (0: until the partition sends
// anything else).
func (p *Processor) hopMarkers(idle bool, lease int64, emit func(*Output)) bool {
	h := p.hop
	wm, ok := p.stage.Watermark()
	if !ok {
		wm = repartition.NoWatermark
	}
	if !ok && !idle {
		return false // nothing to promise yet
	}
	n := int(h.cfg.Partitions)
	for g := range h.cfg.Groups {
		for rp := range n {
			s := &h.sent[g*n+rp]
			if !idle && (!ok || wm <= *s) {
				continue
			}
			if !idle {
				lease = 0
			}
			p.appendMarker(wm, idle, lease)
			*s = max(*s, wm)
			p.emitHop(g, int32(rp), nil, -1, 0, emit)
		}
	}
	if idle {
		h.idleSent, h.renewedAt = true, h.now
	}
	return idle
}

// renewalDue reports whether a leased idle declaration is due for renewal: a
// quarter of the lease has passed since it was last sent (or held back), which
// leaves the renewal three quarters to reach the second stages (a broker check, a
// tick, a produce and, under exactly-once, a commit).
func (h *hopState) renewalDue() bool {
	return h.idleSent && h.lease > 0 && h.now.Sub(h.renewedAt) >= time.Duration(h.lease)*time.Millisecond/4
}

// AnnounceOwner sends, as a first stage that has just been given its partition, a
// marker to every repartition partition: its owner epoch, its watermark if it has
// one, and not idle. A second stage then knows the new owner before a frozen old
// owner that wakes up can declare the partition idle (an idle marker from an older
// epoch is not honoured), and counts the partition in its order again until the
// new owner finds its input quiet.
func (p *Processor) AnnounceOwner(emit func(*Output)) {
	if p.hop != nil {
		p.markActive(emit)
	}
}

// markActive sends a marker that is not idle, with the watermark if there is one,
// to every repartition partition, and ends the idle declaration.
func (p *Processor) markActive(emit func(*Output)) {
	h := p.hop
	wm, ok := p.stage.Watermark()
	if !ok {
		wm = repartition.NoWatermark
	}
	h.idleSent = false
	n := int(h.cfg.Partitions)
	for g := range h.cfg.Groups {
		for rp := range n {
			p.appendMarker(wm, false, 0)
			s := &h.sent[g*n+rp]
			*s = max(*s, wm)
			p.emitHop(g, int32(rp), nil, -1, 0, emit)
		}
	}
}

// IdleDeclared reports whether a first stage has told its second stages that its
// input is quiet and has processed no record since.
func (p *Processor) IdleDeclared() bool { return p.hop != nil && p.hop.idleSent }

// NeedsIdleVerdict reports whether a first stage has not yet told its second
// stages that its input is quiet, or its declaration is due for renewal: the
// caller checks that the input is really read to its end only then.
func (p *Processor) NeedsIdleVerdict() bool {
	return p.hop != nil && (!p.hop.idleSent || p.hop.renewalDue())
}

// EndOfInput sends, as a first stage, the idle verdict to every repartition
// partition: the end of a replay's range, after Flush, where every source has sent
// all it ever will. A second stage that has heard it from every source releases
// everything it holds.
func (p *Processor) EndOfInput(emit func(*Output)) {
	if p.hop != nil {
		p.hopMarkers(true, 0, emit) // the end of the input is for good: no lease
	}
}

func (p *Processor) appendMarker(wm int64, idle bool, lease int64) {
	h := p.hop
	h.rec = repartition.Record{Kind: repartition.KindMarker, Epoch: h.epoch, Watermark: wm, Idle: idle, Lease: lease, Event: repartition.Event{Source: p.cfg.Partition}}
	var err error
	if h.buf, err = repartition.AppendRecord(h.buf[:0], &h.rec); err != nil {
		panic(fmt.Sprintf("pipeline: hop marker: %v", err)) // a marker has no field to refuse
	}
}

// mergeState is a second stage's Merger and what it releases.
type mergeState struct {
	cfg      MergeConfig
	m        *repartition.Merger
	dec      repartition.Decoder
	rec      repartition.Record
	released []repartition.Event
	ev       watermark.Event
	stats    MergeStats
	// snap is the buffer the Merger's snapshot is encoded into at a cut, reused
	// from one snapshot to the next (BeginSnapshot, EndSnapshot).
	snap []byte
}

// MergeStats count what a second stage's Merger decided (not snapshotted).
type MergeStats struct {
	Duplicates    uint64 // hop records received again (a retry, a restart, an old owner)
	LateAfterIdle uint64 // events the frontier had passed while their source was idle: counted out of order (late=true) or dead-lettered
	Markers       uint64
	StaleIdle     uint64 // idle markers from an old owner epoch, not honoured
	IdleExpired   uint64 // idle declarations whose lease ran out unrenewed (a lost owner, or late renewals)
}

// MergeStats returns a second stage's counters (zero otherwise).
func (p *Processor) MergeStats() MergeStats {
	if p.merge == nil {
		return MergeStats{}
	}
	st := p.merge.stats
	st.IdleExpired = p.merge.m.Stats().Expired
	return st
}

// Frontier is a second stage's released frontier (repartition.NoWatermark before
// every source was heard from); ok is false for other processors.
func (p *Processor) Frontier() (int64, bool) {
	if p.merge == nil {
		return 0, false
	}
	return p.merge.m.Frontier(), true
}

// processHop is Process for a second stage.
func (p *Processor) processHop(r *Record, emit func(*Output)) {
	ms := p.merge
	if err := ms.dec.Decode(r.Value, &ms.rec); err != nil {
		p.deadHop(r, codec.ReasonDecode, "not a hop record: "+err.Error(), emit)
		return
	}
	ms.rec.LogTime = r.Timestamp
	v, err := ms.m.Offer(&ms.rec)
	if err != nil {
		p.deadHop(r, codec.ReasonDecode, "hop record refused by the second stage: "+err.Error(), emit)
		return
	}
	switch v {
	case repartition.Duplicate:
		ms.stats.Duplicates++
	case repartition.Marked:
		ms.stats.Markers++
	case repartition.StaleIdle:
		ms.stats.Markers++
		ms.stats.StaleIdle++
	case repartition.LateAfterIdle:
		// Its source was left out of the order while idle, and the frontier has
		// passed its time: it cannot take its place in the sequence. It is counted
		// now, out of order, as an input partition counts an event its idle
		// release let through (its bucket is still in the entity's windows), and
		// marked late=true; only when its bucket has left the windows is it a
		// dead letter. Either way once: the Merger remembers it until its source's
		// watermark passes it, so a re-send is a Duplicate.
		ms.stats.LateAfterIdle++
		e := &ms.rec.Event
		ms.ev = watermark.Event{Offset: e.Offset, EventTime: e.EventTime, EventID: e.EventID, EntityID: e.Key, Amount: e.Amount, Ext: e.Ext}
		p.feat.SourceTopic, p.feat.SourcePartition = e.Topic, e.Source
		p.head.SourceTopic, p.head.SourcePartition = e.Topic, e.Source
		if err := p.apply(&ms.ev, true, emit); err != nil {
			reason, detail := repartition.ReasonLateAfterIdle, fmt.Sprintf(
				"event_time %d from input partition %d arrived after the group's frontier %d passed it, while that partition was idle, and its bucket has left the windows: %v",
				e.EventTime, e.Source, ms.m.Frontier(), err)
			if !errors.Is(err, window.ErrExpired) {
				reason, detail = codec.Invalid("amount_minor"), err.Error()
			}
			p.deadMerged(e, reason, detail, emit)
		}
	}
	ms.released = ms.m.Ready(ms.released[:0])
	p.applyMerged(emit)
}

func (p *Processor) applyMerged(emit func(*Output)) {
	ms := p.merge
	for i := range ms.released {
		e := &ms.released[i]
		if j := i + HintDistance; j < len(ms.released) {
			p.table.PrefetchRecord(ms.released[j].Key)
		}
		// Sweeps follow the released sequence, a function of the input alone, never
		// the frontier's steps, which depend on how the hop interleaved: an entity is
		// evicted at the same point of the sequence in every run. Every later event
		// is at or after this one, so an eviction at its time changes no output.
		if e.EventTime-p.lastSweep >= sweepEveryMs {
			p.lastSweep = e.EventTime
			p.stats.Evicted += uint64(p.fstate.EvictIdle(e.EventTime))
		}
		ms.ev = watermark.Event{Offset: e.Offset, EventTime: e.EventTime, EventID: e.EventID, EntityID: e.Key, Amount: e.Amount, Ext: e.Ext}
		p.feat.SourceTopic, p.feat.SourcePartition = e.Topic, e.Source
		p.head.SourceTopic, p.head.SourcePartition = e.Topic, e.Source
		if err := p.apply(&ms.ev, false, emit); err != nil {
			reason := codec.ReasonLate
			if !errors.Is(err, window.ErrExpired) {
				reason = codec.Invalid("amount_minor")
			}
			p.deadMerged(e, reason, err.Error(), emit)
		}
	}
	clear(ms.released)
}

// deadHop dead-letters a repartition record that is not a hop record this stage can
// count, with its own bytes and position: nothing in it can be trusted to name a
// source.
func (p *Processor) deadHop(r *Record, reason codec.Reason, detail string, emit func(*Output)) {
	p.dead(r, reason, detail, emit)
	p.out.Group = p.merge.cfg.Group
}

// deadMerged dead-letters an event the second stage received and cannot count: the
// transaction re-encoded in our schema (the hop does not carry the source bytes),
// with the source record's position, and the group it failed in.
func (p *Processor) deadMerged(e *repartition.Event, reason codec.Reason, detail string, emit func(*Output)) {
	tx := codec.Transaction{EventID: e.EventID, EntityID: e.Key, AmountMinor: e.Amount, EventTime: e.EventTime}
	p.out = Output{
		Dead: true, Key: []byte(e.Key), Value: codec.EncodeTransaction(&tx),
		Reason: reason, Err: detail + " (group " + strconv.Quote(p.merge.cfg.Group) + ")",
		SourceTopic: e.Topic, SourcePartition: e.Source, SourceOffset: e.Offset,
		Group: p.merge.cfg.Group,
	}
	p.stats.Dead++
	emit(&p.out)
}

// StartServing restarts the idle timeout's clock at t (watermark.Stage.Touch): a
// partition just handed to its worker has not been quiet for the time its
// restore took.
func (p *Processor) StartServing(t time.Time) {
	p.stage.SetClock(t)
	p.stage.Touch()
}

// Quiet reports the idle rule's verdict on this partition's input as a first stage
// tells its second stages (watermark.Stage.Quiet).
func (p *Processor) Quiet() bool { return p.stage.Quiet() }
