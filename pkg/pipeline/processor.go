// Package pipeline is one partition's processing: decode and validate a record,
// check it for duplicates and lateness, hold it in the reorder buffer, count it in
// the window table, and encode its features record or its dead letter.
//
// A Processor is the single place where the contract's semantics are wired
// together, and it is deterministic: the same records in the same order give the
// same outputs, byte for byte. The live service (pkg/service) and the replay
// command feed it from different sources; that is why a backtest reproduces what
// the live service published. It knows nothing of Kafka clients: records come in
// as values and outputs leave through a callback. It is not safe for concurrent
// use; the service runs one Processor per assigned partition on its own goroutine.
package pipeline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
	"unsafe"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
	"github.com/velocity-consumer/velocity-consumer/pkg/watermark"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// LatePolicy says what happens to an event older than the watermark.
type LatePolicy uint8

const (
	// LateDLQ sends late events to the dead-letter topic uncounted (the default).
	LateDLQ LatePolicy = iota
	// LateApply counts a late event if its bucket is still retained in every
	// window and emits its features with late=true; otherwise it is dead-lettered.
	// Retained means within the window of the entity's newest event, and at most
	// the largest window behind the watermark: idle entities are swept that far
	// behind it, so a sweep never drops what a counted late event reads.
	LateApply
)

// ParseLatePolicy reads the --late flag value.
func ParseLatePolicy(s string) (LatePolicy, error) {
	switch s {
	case "dlq", "":
		return LateDLQ, nil
	case "apply":
		return LateApply, nil
	}
	return 0, fmt.Errorf("late policy %q: want dlq or apply", s)
}

func (p LatePolicy) String() string {
	if p == LateApply {
		return "apply"
	}
	return "dlq"
}

// sweepEveryMs is how much event time passes between two sweeps of idle entities.
// Sweeps are driven by the watermark, not the wall clock, so that a replay evicts
// at exactly the same points as the live run did (ms_since_previous depends on it).
const sweepEveryMs = 60_000

// Config is everything a Processor needs. All fields are required unless noted.
type Config struct {
	Topic     string
	Partition int32
	Specs     []window.Spec
	Window    window.Options
	Watermark watermark.Config
	Late      LatePolicy
	Decoder   codec.Decoder

	// Features is a feature definition's features (pkg/definition compiles it;
	// optional). Without it the processor keeps the default contract: each
	// features record is a VelocityFeatures value over Specs. With it, Specs
	// must be Features.Windows, Decoder must fill codec.Transaction.Ext, and
	// each features record is the flat record of feature.AvroSchema(Features).
	Features *feature.Spec

	// Hops makes the processor the first stage of a definition's re-keyed groups
	// (hop.go; optional, with Features): the Decoder fills
	// codec.Transaction.Groups in Hops.Groups' order.
	Hops *HopConfig
	// Merge makes the processor the second stage of one re-keyed group (hop.go):
	// its records are hop records, Features is the group's, and Decoder and
	// Watermark are not used.
	Merge *MergeConfig
}

// Output is one record the processor wants published: a features record for the
// output topic, or a dead letter carrying the source record's bytes unchanged.
// Value (for features) and Source's byte slices are only valid until the emit
// callback returns; a caller that keeps them must copy them.
type Output struct {
	Dead   bool
	Key    []byte // features: the entity id; dead letter: the original key
	Value  []byte // features: the Avro VelocityFeatures record; dead letter: the original value
	Reason codec.Reason
	Err    string // human-readable detail for velocity.error
	// Source identifies the input record this output accounts for.
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	// Arrival is the wall-clock time the source record reached the processor,
	// for the event→feature latency metric (zero in replay). Never encoded.
	Arrival int64
	// EntityID and Windows are the features in decoded form, for the live view
	// and metrics; valid only during the callback.
	EntityID string
	Windows  []codec.WindowAgg

	// Hop marks a first stage's hop record (hop.go): Value is the record for
	// partition Partition of Topic, Key the group's key (nil for a marker, whose
	// SourceOffset is -1).
	Hop       bool
	Topic     string
	Partition int32
	// Group names the re-keyed group of a hop record, and of a dead letter a
	// second stage decided (the velocity.group header); "" otherwise.
	Group string
}

// Record is one input record.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	// Arrival is the wall-clock arrival time in Unix nanoseconds (0 in replay).
	Arrival int64
	// Timestamp is the Kafka record's timestamp in Unix ms (0: none). A second
	// stage's Merger reads its clock from it (leases of idle declarations), so
	// every reader of a repartition partition, warm-up reads included, passes it.
	Timestamp int64
}

// Stats are running counters a caller can export as metrics.
type Stats struct {
	Processed   uint64 // input records seen
	Features    uint64 // features records emitted
	Dead        uint64 // dead letters emitted
	LateApplied uint64 // late events counted under --late=apply
	KeyMismatch uint64 // decoded records whose key is not their entity_id (null keys included)
	Evicted     uint64 // idle entities evicted by sweeps
}

// Processor runs one partition's pipeline. See the package comment.
type Processor struct {
	cfg   Config
	stage *watermark.Stage
	table *window.Table

	next      int64 // next input offset to consume
	lastSweep int64 // watermark at the last idle-entity sweep
	stats     Stats

	// lateHorizon is, under --late=apply, the largest window: how far behind the
	// watermark a late event may be and still be counted, and how far behind it
	// sweeps run. 0 under --late=dlq.
	lateHorizon int64

	// newest is the largest event time counted so far (hasNewest: any), behind the
	// query API's default as-of time (query.go). Not in snapshots: Restore takes the
	// largest newest time of the entities the table holds, which differs only when
	// the entity of the newest event was swept, so both lie before lastSweep and
	// the default, the later of newest and lastSweep, is the same.
	newest    int64
	hasNewest bool

	// With Config.Features: the definition's state (its unfiltered table is
	// table), the row Apply fills, the record head, and the arena the Ext words
	// of events in the reorder buffer are copied into (see keepExt).
	fstate   *feature.State
	row      *feature.Row
	head     feature.Head
	extArena []uint64

	hop   *hopState   // Config.Hops
	merge *mergeState // Config.Merge

	// borrow is Config.Decoder when it can leave the ids in the input record's
	// bytes (codec.BorrowingDecoder): an event counted within Process, every one
	// without allowed lateness, then needs no copy of them, and the reorder buffer
	// copies those it keeps (watermark.Stage.OfferNowBorrowed).
	borrow codec.BorrowingDecoder

	tx       codec.Transaction
	aggs     []window.Agg
	feat     codec.Features
	enc      codec.FeaturesEncoder // feat's windows, topic and partition, encoded once
	out      Output
	released []watermark.Event
	buf      []byte
	keyBuf   []byte
}

// New builds a Processor with empty state that will start at offset next.
func New(cfg Config, next int64) (*Processor, error) {
	if err := checkConfig(&cfg); err != nil {
		return nil, err
	}
	if len(cfg.Specs) == 0 {
		return nil, errors.New("pipeline: at least one window spec is required")
	}
	stage, err := watermark.New(cfg.Watermark)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	p := &Processor{cfg: cfg, stage: stage, next: next}
	if cfg.Features != nil {
		if p.fstate, err = feature.NewState(*cfg.Features, cfg.Window); err != nil {
			return nil, fmt.Errorf("pipeline: %w", err)
		}
		p.table = p.fstate.Table()
	} else if p.table, err = window.NewTable(cfg.Specs, cfg.Window); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	if cfg.Merge != nil {
		m, err := repartition.New(repartition.Config{Sources: cfg.Merge.Sources, ExtWords: cfg.Features.Words()})
		if err != nil {
			return nil, fmt.Errorf("pipeline: %w", err)
		}
		p.merge = &mergeState{cfg: *cfg.Merge, m: m}
	}
	if err := p.init(); err != nil {
		return nil, err
	}
	return p, nil
}

// checkConfig holds the fields that go together to go together.
func checkConfig(cfg *Config) error {
	if cfg.Merge != nil {
		if cfg.Features == nil {
			return errors.New("pipeline: Config.Merge needs the group's Features")
		}
		if cfg.Hops != nil {
			return errors.New("pipeline: a second stage (Merge) feeds no further groups (Hops)")
		}
		if cfg.Late == LateApply {
			return errors.New("pipeline: --late=apply does not apply to a re-keyed group's second stage")
		}
		// The first stages decided dedupe and lateness; nothing waits here but in
		// the Merger, and no clock is read.
		cfg.Watermark = watermark.Config{DisableDedupe: true}
	} else if cfg.Decoder == nil {
		return errors.New("pipeline: Config.Decoder is required")
	}
	if cfg.Hops != nil {
		if cfg.Features == nil {
			return errors.New("pipeline: Config.Hops needs a feature definition (Features)")
		}
		if cfg.Late == LateApply {
			return errors.New("pipeline: --late=apply cannot be used with re-keyed groups: a late event counted at its input partition would reach their second stages below the frontier they released")
		}
	}
	return checkFeatures(cfg)
}

// checkFeatures holds a definition's windows and the table's to be the same.
func checkFeatures(cfg *Config) error {
	if cfg.Features == nil {
		return nil
	}
	if len(cfg.Specs) == 0 {
		cfg.Specs = slices.Clone(cfg.Features.Windows)
	}
	if !slices.Equal(cfg.Specs, cfg.Features.Windows) {
		return fmt.Errorf("pipeline: Specs %s differ from the feature definition's windows %s",
			window.FormatSpecs(cfg.Specs), window.FormatSpecs(cfg.Features.Windows))
	}
	return nil
}

func (p *Processor) init() error {
	if p.merge == nil {
		p.borrow, _ = p.cfg.Decoder.(codec.BorrowingDecoder)
	}
	if p.cfg.Hops != nil {
		h, err := newHopState(*p.cfg.Hops)
		if err != nil {
			return err
		}
		p.hop = h
	}
	if p.cfg.Late == LateApply {
		for _, s := range p.cfg.Specs {
			p.lateHorizon = max(p.lateHorizon, s.WindowMs)
		}
	}
	p.aggs = make([]window.Agg, len(p.cfg.Specs))
	p.feat.Windows = make([]codec.WindowAgg, len(p.cfg.Specs))
	for i, s := range p.cfg.Specs {
		p.feat.Windows[i] = codec.WindowAgg{Name: s.Name, WindowMs: s.WindowMs, BucketMs: s.BucketMs}
	}
	p.feat.SourceTopic = p.cfg.Topic
	p.feat.SourcePartition = p.cfg.Partition
	p.buf = make([]byte, 0, 512)
	if p.fstate != nil {
		p.row = feature.NewRow(p.fstate.Spec())
		p.head.SourceTopic, p.head.SourcePartition = p.cfg.Topic, p.cfg.Partition
	}
	return nil
}

// extChunk is how many words keepExt allocates at a time.
const extChunk = 4096

// keepExt copies a decoded record's Ext words (the decoder reuses its array) into
// the processor's arena and returns the copy, which the event keeps while it
// waits in the reorder buffer. The arena is cut in chunks so the hot path does
// not allocate per event; a chunk is garbage once every event pointing into it
// has been released.
func (p *Processor) keepExt(ext []uint64) []uint64 {
	if len(ext) == 0 {
		return nil
	}
	if cap(p.extArena)-len(p.extArena) < len(ext) {
		p.extArena = make([]uint64, 0, max(extChunk, len(ext)))
	}
	at := len(p.extArena)
	p.extArena = append(p.extArena, ext...)
	return p.extArena[at:len(p.extArena):len(p.extArena)]
}

// Next is the offset of the next input record this processor expects: every
// offset before it has been emitted or is held in the (snapshotted) reorder buffer.
func (p *Processor) Next() int64 { return p.next }

// Stats returns the running counters.
func (p *Processor) Stats() Stats { return p.stats }

// Pressure reports whether the reorder buffer is above its high mark (and not
// yet back below its low mark): the caller should pause fetching.
func (p *Processor) Pressure() bool { return p.stage.Pressure() }

// Pending is the number of events waiting in the reorder buffer.
func (p *Processor) Pending() int {
	if p.merge != nil {
		return p.merge.m.Pending() // a second stage holds events in its Merger
	}
	return p.stage.Pending()
}

// Entities is the number of entities in the window table.
func (p *Processor) Entities() int { return p.table.Len() }

// CapEvictions is how many entities the --max-entities cap has evicted.
func (p *Processor) CapEvictions() uint64 { return p.table.CapEvictions() }

// DedupeIDs is how many event ids the partition's dedupe set remembers
// (watermark.Stage.DedupeIDs): its memory is about 40-50 bytes per id.
func (p *Processor) DedupeIDs() int { return p.stage.DedupeIDs() }

// DedupeCapEvictions is how many ids watermark.Config.MaxDedupeIDs (--max-dedupe-ids)
// made the partition forget.
func (p *Processor) DedupeCapEvictions() uint64 { return p.stage.DedupeCapEvictions() }

// Watermark returns the partition's watermark (ok=false before any accepted event).
// A second stage's is its Merger's released frontier.
func (p *Processor) Watermark() (int64, bool) {
	if p.merge != nil {
		f := p.merge.m.Frontier()
		return f, f != repartition.NoWatermark
	}
	return p.stage.Watermark()
}

// MaxSeen returns the largest accepted event time.
func (p *Processor) MaxSeen() (int64, bool) { return p.stage.MaxSeen() }

// Table exposes the window table for read-only inspection (tests, the crash
// comparison and the demo's top-entities view).
func (p *Processor) Table() *window.Table { return p.table }

// Process handles one input record. emit is called zero or more times: once for
// a dead letter, or once for each event the record's arrival released from the
// reorder buffer (possibly none, possibly several older ones).
func (p *Processor) Process(r Record, emit func(*Output)) {
	p.stats.Processed++
	if r.Offset >= p.next {
		p.next = r.Offset + 1
	}
	if len(r.Value) == 0 {
		// Said plainly, rather than as a decoder's "truncated at byte 0".
		detail := "the value is empty, not a transaction"
		if r.Value == nil {
			detail = "the value is null (a tombstone), not a transaction"
		}
		p.dead(&r, codec.ReasonDecode, detail, emit)
		return
	}
	if p.merge != nil {
		p.processHop(&r, emit)
		return
	}
	if p.hop != nil && p.hop.idleSent {
		// Any record ends a quiet spell, as any Offer does, and the second
		// stages hear it at once, from every repartition partition, not only
		// those this record's keys go to: until then each of them leaves this
		// source out of its order and lets the others' watermarks move its
		// frontier past this source's new events (docs/repartition.md, the idle
		// rule). Under --exactly-once the commit that follows a wake-up carries
		// these markers.
		p.markActive(emit)
	}
	maxSeen, hasMax := p.stage.MaxSeen()
	var rej *codec.Rejection
	if p.borrow != nil {
		// The ids stay r.Value's bytes: nothing below keeps them past this call
		// but the reorder buffer, which copies (OfferNowBorrowed); the window
		// table copies a new entity's id, dedupe keeps a hash, outputs are
		// encoded, and Output.EntityID is valid only during the emit callback.
		rej = p.borrow.DecodeBorrowed(r.Value, maxSeen, hasMax, &p.tx)
	} else {
		rej = p.cfg.Decoder.Decode(r.Value, maxSeen, hasMax, &p.tx)
	}
	if rej != nil {
		p.dead(&r, rej.Reason, rej.Detail, emit)
		return
	}
	if string(r.Key) != p.tx.EntityID {
		// Counted, not refused: the contract keys records by entity id so that
		// an entity lives in one partition; a producer that does not may split
		// entities, which the caller reports.
		p.stats.KeyMismatch++
	}
	ev := watermark.Event{
		Offset:    r.Offset,
		EventTime: p.tx.EventTime,
		EventID:   p.tx.EventID,
		EntityID:  p.tx.EntityID,
		Amount:    p.tx.AmountMinor,
		Size:      int32(min(len(r.Key)+len(r.Value), 1<<31-1)),
		Aux:       r.Arrival,
	}
	if p.fstate != nil {
		ev.Ext = p.keepExt(p.tx.Ext)
	}
	var (
		verdict watermark.Verdict
		now     bool
	)
	if p.borrow != nil {
		verdict, now = p.stage.OfferNowBorrowed(&ev)
	} else {
		verdict, now = p.stage.OfferNow(&ev)
	}
	switch verdict {
	case watermark.Duplicate:
		p.dead(&r, codec.ReasonDuplicate, "event_id "+strconv.Quote(ev.EventID)+" already accepted on this partition", emit)
		return
	case watermark.Late:
		wm, _ := p.stage.Watermark()
		behind := uint64(wm) - uint64(ev.EventTime) // wm > EventTime: exact, whatever the range
		if p.cfg.Late == LateApply && behind > uint64(p.lateHorizon) {
			p.dead(&r, codec.ReasonLate, fmt.Sprintf("event_time %d is %d ms behind the watermark %d, more than the largest window (%d ms): too old to count under --late=apply",
				ev.EventTime, behind, wm, p.lateHorizon), emit)
			return
		}
		if p.cfg.Late == LateApply {
			if err := p.apply(&ev, true, emit); err == nil {
				p.stage.Remember(ev.EventID, ev.EventTime)
				p.stats.LateApplied++
				return
			} else if !errors.Is(err, window.ErrExpired) {
				p.dead(&r, codec.Invalid("amount_minor"), err.Error(), emit)
				return
			}
		}
		p.dead(&r, codec.ReasonLate, fmt.Sprintf("event_time %d is %d ms behind the watermark %d", ev.EventTime, wm-ev.EventTime, wm), emit)
		return
	}
	if p.hop != nil {
		p.hopEvent(&ev, emit)
	}
	if now {
		// Released at once (nothing was pending): counted without a trip through
		// the reorder buffer, as Ready would have returned it alone.
		p.applyReleased(&ev, emit)
	} else {
		p.released = p.stage.Ready(p.released[:0])
		p.emitReleased(emit)
	}
	if p.cfg.Watermark.AllowedLateness > 0 {
		// Events wait in the reorder buffer and about one leaves it per record:
		// hint the entities of those that will leave a few records from now.
		if e, ok := p.stage.Upcoming(2 * HintDistance); ok {
			p.table.Prefetch(e)
		}
		if e, ok := p.stage.Upcoming(HintDistance); ok {
			p.table.PrefetchRecord(e)
		}
	}
	p.maybeSweep()
}

// HintDistance is how many events ahead of the one being counted the window table
// is told which entities come next (window.Table.Prefetch at twice the distance,
// PrefetchRecord at the distance), so that their cache misses overlap the work on
// the events in between. Closer, a miss is not done before its event is applied;
// further, the prefetched lines may be evicted again: 4 to 16 measured within noise of
// each other in pkg/window's lookahead benchmarks, so 6 sits in the middle.
const HintDistance = 6

// Hint tells the processor that the record with this key and value comes about
// distance records from now: a caller processing a fetched batch knows its records
// ahead of time. At 2·HintDistance it starts loading the dedupe slot of the record's
// event id (codec.PeekEventID) and, with no allowed lateness (events counted as they
// arrive; the contract makes the key the entity id), the window table's index entry;
// at HintDistance, the entity's record. With lateness the reorder buffer gives the
// window hints instead. It never changes anything.
func (p *Processor) Hint(key, value []byte, distance int) {
	if p.merge != nil {
		return // hop records: the Merger decides which entity comes when
	}
	far := distance > HintDistance
	// PeekEventID reads our Transaction layout; a definition's schema has its own.
	if far && p.fstate == nil {
		if id, ok := codec.PeekEventID(value); ok {
			p.stage.PrefetchID(id)
		}
	}
	if p.cfg.Watermark.AllowedLateness > 0 || len(key) == 0 {
		return
	}
	entity := unsafe.String(&key[0], len(key)) // not kept beyond the call
	if far {
		p.table.Prefetch(entity)
	} else {
		p.table.PrefetchRecord(entity)
	}
}

// SetClock sets the wall-clock time the idle timeout reads until the next call
// (watermark.Stage.SetClock): call it once per fetched batch and before Tick.
func (p *Processor) SetClock(t time.Time) {
	p.stage.SetClock(t)
	if p.hop != nil {
		p.hop.now = t
	}
}

// WaitsForIdle reports whether the partition's reorder buffer holds events and
// the idle timeout has passed since its last record: what Tick would release, if
// the caller confirms that no record waits to be read (the service asks the
// broker).
func (p *Processor) WaitsForIdle() bool {
	return p.merge == nil && p.stage.Pending() > 0 && p.stage.Quiet()
}

// Tick releases everything pending if the partition has been idle for the idle
// timeout (live mode only: this is where wall-clock time enters). The caller
// calls it only once it knows that no record waits to be read (WaitsForIdle).
func (p *Processor) Tick(emit func(*Output)) {
	p.released = p.stage.Idle(p.released[:0])
	p.emitReleased(emit)
}

// Flush releases everything pending: the end of a replay range.
func (p *Processor) Flush(emit func(*Output)) {
	p.released = p.stage.FlushAll(p.released[:0])
	p.emitReleased(emit)
}

func (p *Processor) emitReleased(emit func(*Output)) {
	for i := range p.released {
		// A batch released at once (the end of a replay, an idle release, a
		// watermark jump) is its own lookahead.
		if j := i + 2*HintDistance; j < len(p.released) {
			p.table.Prefetch(p.released[j].EntityID)
		}
		if j := i + HintDistance; j < len(p.released) {
			p.table.PrefetchRecord(p.released[j].EntityID)
		}
		p.applyReleased(&p.released[i], emit)
	}
	// Drop references to id strings so the GC can free them.
	clear(p.released)
}

// applyReleased counts one event the reorder buffer released.
func (p *Processor) applyReleased(ev *watermark.Event, emit func(*Output)) {
	if err := p.apply(ev, false, emit); err != nil {
		// An event released from the reorder buffer can only be older than its
		// entity's newest one after an idle release; if its bucket has already
		// left the ring it cannot be counted, so it is accounted for as late.
		// An overflow is an amount the windows cannot hold: invalid.
		reason := codec.ReasonLate
		if !errors.Is(err, window.ErrExpired) {
			reason = codec.Invalid("amount_minor")
		}
		p.deadReleased(ev, reason, err.Error(), emit)
	}
}

// apply counts ev and emits its features. On error nothing was counted or emitted.
// Under a feature definition the record is the flat one of feature.AvroSchema, and
// Output.Windows are its unfiltered windows (the live view and the metrics read
// them as they read the default contract's).
func (p *Processor) apply(ev *watermark.Event, late bool, emit func(*Output)) error {
	var (
		gap     int64
		hasPrev bool
		err     error
	)
	aggs := p.aggs
	if p.fstate != nil {
		gap, hasPrev, err = p.fstate.Apply(ev.EntityID, ev.EventTime, ev.Amount, ev.Ext, p.row)
		aggs = p.row.Base
	} else {
		gap, hasPrev, err = p.table.Apply(ev.EntityID, ev.EventTime, ev.Amount, p.aggs)
	}
	if err != nil {
		return err
	}
	if !p.hasNewest || ev.EventTime > p.newest {
		p.newest, p.hasNewest = ev.EventTime, true
	}
	f := &p.feat
	for i := range f.Windows {
		a := &aggs[i]
		w := &f.Windows[i]
		w.Count, w.SumMinor, w.MinMinor, w.MaxMinor = a.Count, a.Sum, a.Min, a.Max
	}
	if p.fstate != nil {
		h := &p.head
		h.EventID, h.EntityID, h.EventTime = ev.EventID, ev.EntityID, ev.EventTime
		h.MsSincePrevious, h.HasPrevious, h.Late = gap, hasPrev, late
		h.SourceOffset = ev.Offset
		p.buf = feature.AppendRow(p.buf[:0], p.fstate.Spec(), h, p.row)
	} else {
		f.EventID, f.EntityID, f.EventTime = ev.EventID, ev.EntityID, ev.EventTime
		f.MsSincePrevious, f.HasPrevious = gap, hasPrev
		f.Late = late
		f.SourceOffset = ev.Offset
		p.buf = p.enc.Append(p.buf[:0], f)
	}

	// The key gets a buffer of its own: p.out.Key may still point at a dead
	// letter's source record, whose backing array belongs to the fetch.
	p.keyBuf = append(p.keyBuf[:0], ev.EntityID...)
	o := &p.out
	*o = Output{
		Key:             p.keyBuf,
		Value:           p.buf,
		SourceTopic:     f.SourceTopic, // the input record's, also through a hop
		SourcePartition: f.SourcePartition,
		SourceOffset:    ev.Offset,
		Arrival:         ev.Aux,
		EntityID:        ev.EntityID,
		Windows:         f.Windows,
	}
	p.stats.Features++
	emit(o)
	return nil
}

func (p *Processor) dead(r *Record, reason codec.Reason, detail string, emit func(*Output)) {
	p.out = Output{
		Dead:            true,
		Key:             r.Key,
		Value:           r.Value,
		Reason:          reason,
		Err:             detail,
		SourceTopic:     p.cfg.Topic,
		SourcePartition: p.cfg.Partition,
		SourceOffset:    r.Offset,
		Arrival:         r.Arrival,
	}
	p.stats.Dead++
	emit(&p.out)
}

// deadReleased dead-letters an event that was already accepted into the reorder
// buffer. Its original bytes are not kept there, so the dead letter carries the
// transaction re-encoded in our schema; the reason and source position are exact.
func (p *Processor) deadReleased(ev *watermark.Event, reason codec.Reason, detail string, emit func(*Output)) {
	tx := codec.Transaction{EventID: ev.EventID, EntityID: ev.EntityID, AmountMinor: ev.Amount, EventTime: ev.EventTime}
	r := Record{Topic: p.cfg.Topic, Partition: p.cfg.Partition, Offset: ev.Offset, Key: []byte(ev.EntityID), Value: codec.EncodeTransaction(&tx), Arrival: ev.Aux}
	p.dead(&r, reason, detail, emit)
}

func (p *Processor) maybeSweep() {
	wm, ok := p.stage.Watermark()
	if !ok || wm-p.lastSweep < sweepEveryMs {
		return
	}
	p.lastSweep = wm
	if wm < math.MinInt64+p.lateHorizon {
		return // cannot be: event times are bounded far inside int64
	}
	if p.fstate != nil {
		p.stats.Evicted += uint64(p.fstate.EvictIdle(wm - p.lateHorizon))
		return
	}
	p.stats.Evicted += uint64(p.table.EvictIdle(wm - p.lateHorizon))
}

// Snapshot format (inside pkg/checkpoint's versioned, checksummed frame):
//
//	magic "VCP1" | next int64 | lastSweep int64 | len+stage snapshot | len+table snapshot
//
// The topic, partition and configuration are checked by the caller's store key
// and by the packages' own decoders (the table snapshot carries its specs).
//
// Under a feature definition (Config.Features) the magic is "VCP2" and a third
// section follows: the definition's state beside its unfiltered table
// (feature.State.AppendExtras). Each magic is read only by a processor of the
// same kind, so a partition never resumes a definition's state without it, or
// the default contract's state under a definition.
//
// A re-keyed group's second stage (Config.Merge) writes "VCP3": the "VCP2"
// sections (its watermark stage is empty) and a fourth, its Merger's snapshot
// (repartition.Merger.AppendSnapshot, taken at the cut).
var (
	snapMagic         = [4]byte{'V', 'C', 'P', '1'}
	snapMagicFeatures = [4]byte{'V', 'C', 'P', '2'}
	snapMagicMerge    = [4]byte{'V', 'C', 'P', '3'}
)

// AppendSnapshot appends the processor's whole state, deterministically.
func (p *Processor) AppendSnapshot(dst []byte) []byte {
	ps := p.beginSnapshot(dst, false)
	ps.Step(math.MaxInt)
	dst, _ = ps.Finish() // inline ids: no segment to write, cannot fail
	p.EndSnapshot(ps)
	return dst
}

// PendingSnapshot is a snapshot begun by BeginSnapshot: the processor's state as it
// was then, taken in Steps while the Processor goes on. Once Step reports it complete,
// Finish may run on another goroutine, and gives exactly the bytes AppendSnapshot would
// have given at BeginSnapshot.
type PendingSnapshot struct {
	buf        []byte
	stageLenAt int
	stage      *watermark.PendingSnapshot
	table      *window.PendingSnapshot
	extras     *feature.PendingExtras // under a definition: its state beside the table, in steps like it
	merger     []byte                 // a second stage's Merger, encoded at the cut
	finished   bool
}

// BeginSnapshot starts a snapshot of the processor's state as it is now, to be
// appended to buf as AppendSnapshot does, while stopping the Processor's goroutine as
// little as possible: it encodes the pending events and takes a view of the dedupe
// ids (which the stage never rewrites); the window table's entities are encoded a
// share at a time by Step (and any the Processor is about to change, first); the id
// list (most of the bytes at a long horizon), sorting and checksumming are left to
// Finish. Call Step between Process calls until it returns true, then Finish, then
// EndSnapshot on the Processor's goroutine.
func (p *Processor) BeginSnapshot(buf []byte) *PendingSnapshot {
	return p.beginSnapshot(buf, true)
}

func (p *Processor) beginSnapshot(buf []byte, segmented bool) *PendingSnapshot {
	magic := snapMagic
	if p.fstate != nil {
		magic = snapMagicFeatures
	}
	if p.merge != nil {
		magic = snapMagicMerge
	}
	buf = append(buf, magic[:]...)
	buf = binary.BigEndian.AppendUint64(buf, uint64(p.next))
	buf = binary.BigEndian.AppendUint64(buf, uint64(p.lastSweep))
	ps := &PendingSnapshot{stageLenAt: len(buf)}
	buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0)
	ps.buf, ps.stage = p.stage.BeginSnapshotWith(buf, segmented && p.cfg.Watermark.Segments != nil)
	ps.table = p.table.BeginSnapshot()
	if p.fstate != nil {
		// Taken at the same point as the table's (no Apply in between), so that a
		// restore pairs them as they were; stepped like it, so a checkpoint does not
		// stall the partition for the definition's state.
		ps.extras = p.fstate.BeginExtras()
	}
	if p.merge != nil {
		// Whole, at the cut: its pending events are what the slowest source holds
		// back, far fewer than the table's entities. Into the buffer the last
		// snapshot's EndSnapshot gave back: grown from nil at every checkpoint, its
		// doublings were most of the checkpoints' CPU and allocations with 3 groups.
		ps.merger = p.merge.m.AppendSnapshot(p.merge.snap[:0])
		p.merge.snap = nil // the snapshot's until EndSnapshot
	}
	return ps
}

// Step encodes up to budget more entities of the window table (and of the
// definition's state) and reports whether the snapshot is ready for Finish. Call it
// on the Processor's goroutine.
func (ps *PendingSnapshot) Step(budget int) bool {
	done := ps.table.Step(budget)
	if ps.extras != nil {
		done = ps.extras.Step(budget) && done
	}
	return done
}

// Finish completes the snapshot and returns it: the buf given to BeginSnapshot,
// extended. Call it once, after Step returned true. With Config.Watermark.Segments
// it writes the dedupe ids accepted since the last saved snapshot as a segment
// first, and fails if that write fails; pass ps to SnapshotSaved once the snapshot
// is durable.
func (ps *PendingSnapshot) Finish() ([]byte, error) {
	if ps.finished {
		panic("pipeline: PendingSnapshot.Finish called twice")
	}
	ps.finished = true
	buf := ps.buf
	if need := ps.stage.Size() + 8 + ps.table.Size(); cap(buf)-len(buf) < need {
		// Grow with room to spare: a state that grows (the dedupe set in its first
		// day) would otherwise need a new, larger buffer at every checkpoint, and
		// faulting in tens of fresh megabytes each time was a tenth of the CPU.
		buf = slices.Grow(buf, need+(len(buf)+need)/2)
	}
	buf, err := ps.stage.Finish(buf, ps.stageLenAt+8)
	if err != nil {
		ps.buf = buf
		return nil, err
	}
	binary.BigEndian.PutUint64(buf[ps.stageLenAt:], uint64(len(buf)-ps.stageLenAt-8))
	tableLenAt := len(buf)
	buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0)
	buf = ps.table.AppendTo(buf)
	binary.BigEndian.PutUint64(buf[tableLenAt:], uint64(len(buf)-tableLenAt-8))
	if ps.extras != nil {
		extrasLenAt := len(buf)
		buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0)
		buf = ps.extras.AppendTo(buf)
		binary.BigEndian.PutUint64(buf[extrasLenAt:], uint64(len(buf)-extrasLenAt-8))
	}
	if ps.merger != nil {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(ps.merger)))
		buf = append(buf, ps.merger...)
	}
	ps.buf = buf
	return buf, nil
}

// SegmentBytes is the size of the dedupe id segment Finish wrote to the store (0 if
// none): with the snapshot's own bytes, what the checkpoint wrote.
func (ps *PendingSnapshot) SegmentBytes() int { return ps.stage.SegmentBytes() }

// Bytes returns the snapshot Finish returned (nil before), so that a caller can reuse
// its buffer once done with it.
func (ps *PendingSnapshot) Bytes() []byte {
	if !ps.finished {
		return nil
	}
	return ps.buf
}

// EndSnapshot releases what ps kept of the processor's state; call it on the
// Processor's goroutine after ps.Finish returned. A snapshot never ended costs
// allocations, not correctness.
func (p *Processor) EndSnapshot(ps *PendingSnapshot) {
	p.stage.EndSnapshot(ps.stage)
	p.table.EndSnapshot(ps.table)
	if p.fstate != nil {
		p.fstate.EndExtras(ps.extras)
	}
	if p.merge != nil && ps.finished && ps.merger != nil {
		p.merge.snap, ps.merger = ps.merger[:0], nil // Finish has copied it out
	}
}

// SnapshotSaved reports that ps's snapshot is durable (see watermark.Stage.SnapshotSaved)
// and returns the references of dedupe segments no kept snapshot lists any more, for
// the caller to delete from its store. Call it on the Processor's goroutine, in save
// order, after EndSnapshot.
func (p *Processor) SnapshotSaved(ps *PendingSnapshot) [][]byte {
	return p.stage.SnapshotSaved(ps.stage)
}

// Restore builds a Processor from a snapshot made by AppendSnapshot with the same
// configuration. A snapshot that does not decode is an error, never half-loaded.
func Restore(cfg Config, data []byte) (*Processor, error) {
	if err := checkConfig(&cfg); err != nil {
		return nil, err
	}
	if len(data) < 4+8+8 {
		return nil, errors.New("pipeline snapshot: bad header")
	}
	switch magic := [4]byte(data[:4]); {
	case magic == snapMagicMerge && cfg.Merge == nil:
		return nil, errors.New("pipeline snapshot: made by a re-keyed group's second stage, and this processor is not one")
	case magic != snapMagicMerge && cfg.Merge != nil:
		return nil, errors.New("pipeline snapshot: not made by a re-keyed group's second stage, and this processor is one")
	case magic == snapMagicMerge:
	case magic == snapMagic && cfg.Features != nil:
		return nil, errors.New("pipeline snapshot: made without a feature definition, and this processor has one (--features): its state cannot be resumed under a definition")
	case magic == snapMagicFeatures && cfg.Features == nil:
		return nil, errors.New("pipeline snapshot: made under a feature definition (--features), and this processor has none")
	case magic != snapMagic && magic != snapMagicFeatures:
		return nil, errors.New("pipeline snapshot: bad header")
	}
	next := int64(binary.BigEndian.Uint64(data[4:]))
	lastSweep := int64(binary.BigEndian.Uint64(data[12:]))
	rest := data[20:]
	stageBytes, rest, err := section(rest)
	if err != nil {
		return nil, fmt.Errorf("pipeline snapshot: watermark section: %w", err)
	}
	tableBytes, rest, err := section(rest)
	if err != nil {
		return nil, fmt.Errorf("pipeline snapshot: window section: %w", err)
	}
	var extras []byte
	if cfg.Features != nil {
		if extras, rest, err = section(rest); err != nil {
			return nil, fmt.Errorf("pipeline snapshot: feature section: %w", err)
		}
	}
	var mergerBytes []byte
	if cfg.Merge != nil {
		if mergerBytes, rest, err = section(rest); err != nil {
			return nil, fmt.Errorf("pipeline snapshot: merger section: %w", err)
		}
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("pipeline snapshot: %d trailing bytes", len(rest))
	}
	if next < 0 {
		return nil, fmt.Errorf("pipeline snapshot: negative next offset %d", next)
	}
	stage, err := watermark.Restore(cfg.Watermark, stageBytes)
	if err != nil {
		return nil, fmt.Errorf("pipeline snapshot: %w", err)
	}
	table, err := window.RestoreTable(cfg.Specs, cfg.Window, tableBytes)
	if err != nil {
		return nil, fmt.Errorf("pipeline snapshot: %w", err)
	}
	p := &Processor{cfg: cfg, stage: stage, table: table, next: next, lastSweep: lastSweep}
	if cfg.Features != nil {
		if p.fstate, err = feature.Restore(*cfg.Features, cfg.Window, table, extras); err != nil {
			return nil, fmt.Errorf("pipeline snapshot: %w", err)
		}
	}
	if cfg.Merge != nil {
		m, err := repartition.Restore(repartition.Config{Sources: cfg.Merge.Sources, ExtWords: cfg.Features.Words()}, mergerBytes)
		if err != nil {
			return nil, fmt.Errorf("pipeline snapshot: %w", err)
		}
		p.merge = &mergeState{cfg: *cfg.Merge, m: m}
	}
	p.newest, p.hasNewest = table.MaxNewest()
	if err := p.init(); err != nil {
		return nil, err
	}
	return p, nil
}

// SegmentRefs returns the dedupe segments a snapshot made by a Processor lists
// (see watermark.SegmentRefs), without reading them.
func SegmentRefs(data []byte) ([][]byte, error) {
	if len(data) < 4+8+8 {
		return nil, errors.New("pipeline snapshot: bad header")
	}
	if m := [4]byte(data[:4]); m != snapMagic && m != snapMagicFeatures && m != snapMagicMerge {
		return nil, errors.New("pipeline snapshot: bad header")
	}
	stageBytes, _, err := section(data[20:])
	if err != nil {
		return nil, fmt.Errorf("pipeline snapshot: watermark section: %w", err)
	}
	refs, err := watermark.SegmentRefs(stageBytes)
	if err != nil {
		return nil, fmt.Errorf("pipeline snapshot: %w", err)
	}
	return refs, nil
}

func section(b []byte) (sec, rest []byte, err error) {
	if len(b) < 8 {
		return nil, nil, errors.New("truncated length")
	}
	n := binary.BigEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return nil, nil, fmt.Errorf("length %d exceeds the %d bytes left", n, len(b)-8)
	}
	return b[8 : 8+n], b[8+n:], nil
}
