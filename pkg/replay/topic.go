package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Bound is one end of a topic range: an offset, a time, or the log's start or end.
type Bound struct {
	kind   boundKind
	offset int64 // kind == boundOffset
	millis int64 // kind == boundTime
}

type boundKind uint8

const (
	boundStart boundKind = iota
	boundEnd
	boundOffset
	boundTime
)

// Start is the first offset still in the log; End is the last stable offset
// (the end of committed data) at the moment the range is resolved.
var (
	Start = Bound{kind: boundStart}
	End   = Bound{kind: boundEnd}
)

// OffsetBound is the given offset.
func OffsetBound(o int64) Bound { return Bound{kind: boundOffset, offset: o} }

// TimeBound is the first offset whose record timestamp is at or after t.
func TimeBound(t time.Time) Bound { return Bound{kind: boundTime, millis: t.UnixMilli()} }

// ParseBound reads a --from/--to value: "start", "end", a non-negative
// offset, or an RFC 3339 time.
func ParseBound(s string) (Bound, error) {
	switch s {
	case "start", "":
		return Start, nil
	case "end":
		return End, nil
	}
	if o, err := strconv.ParseInt(s, 10, 64); err == nil {
		if o < 0 {
			return Bound{}, fmt.Errorf("offset %d is negative", o)
		}
		return OffsetBound(o), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return Bound{}, fmt.Errorf("%q is neither start, end, an offset nor an RFC 3339 time such as 2026-11-01T00:00:00Z", s)
	}
	return TimeBound(t), nil
}

func (b Bound) String() string {
	switch b.kind {
	case boundStart:
		return "start"
	case boundEnd:
		return "end"
	case boundOffset:
		return strconv.FormatInt(b.offset, 10)
	}
	return time.UnixMilli(b.millis).UTC().Format(time.RFC3339Nano)
}

// NotAfter reports whether a cannot resolve to a later offset than b in any
// partition, where that is known without the broker: start, end, and two
// offsets or two times. Bounds of different kinds count as in order.
func NotAfter(a, b Bound) bool {
	switch {
	case a.kind == boundStart || b.kind == boundEnd:
		return true
	case a.kind == boundEnd || b.kind == boundStart:
		return false
	case a.kind == boundOffset && b.kind == boundOffset:
		return a.offset <= b.offset
	case a.kind == boundTime && b.kind == boundTime:
		return a.millis <= b.millis
	}
	return true
}

// TopicConfig describes a topic range to replay.
type TopicConfig struct {
	Brokers    []string
	Topic      string
	Partitions []int32 // empty: every partition of the topic
	From, To   Bound   // From inclusive, To exclusive
	// WarmUpFrom, if set, is where reading starts: records from it up to
	// From build the windows, dedupe set and reorder buffer without emitting
	// anything, so the features of the range count history that precedes it,
	// as the live service's did. Start gives exactly the live values (the
	// live service saw the whole partition); a time a window plus the
	// lateness before From gives the same windows, if not ms_since_previous
	// for entities idle longer than that.
	WarmUpFrom *Bound
	// ClientOpts are extra franz-go options (TLS, SASL, logging).
	ClientOpts []kgo.Opt
	// StallTimeout ends a partition's read with an error when no record
	// arrives for this long although its range is not done: the brokers are
	// unreachable (franz-go retries for ever), or the range ends inside a
	// transaction that is still open. 0 = DefaultStallTimeout.
	StallTimeout time.Duration
}

// DefaultStallTimeout is TopicConfig.StallTimeout's default: as long as the
// live service waits for a produce, and replay for the schema registry.
const DefaultStallTimeout = 2 * time.Minute

// Range is one partition's resolved offsets, From inclusive, To exclusive;
// reading starts at WarmUp (<= From), records before From only warm up.
// Truncated says that the range or its warm-up asked for offsets before the
// log start: records retention has deleted, which the replay cannot read.
type Range struct {
	WarmUp, From, To int64
	Truncated        bool
}

// TopicSource reads a fixed offset range of each partition of a topic with
// read_committed isolation, as the live consumer does, so aborted records are
// skipped exactly as the live service skips them.
type TopicSource struct {
	cfg    TopicConfig
	ranges map[int32]Range
	parts  []int32
	total  int64
	count  int32 // the topic's partitions, replayed or not
}

// OpenTopic resolves cfg's bounds to offsets once, up front, so the range is
// fixed even while producers keep writing.
func OpenTopic(ctx context.Context, cfg TopicConfig) (*TopicSource, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, cfg.Topic)
	if errors.Is(err, kerr.TopicAuthorizationFailed) {
		return nil, fmt.Errorf("not authorized to read --input-topic %s (%w): grant this principal Read on it (Read includes Describe)", cfg.Topic, err)
	}
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s on %v: %w (check --brokers and --input-topic)", cfg.Topic, cfg.Brokers, err)
	}
	if err := starts.Error(); err != nil {
		return nil, fmt.Errorf("list offsets of %s: %w", cfg.Topic, err)
	}
	ends, err := adm.ListCommittedOffsets(ctx, cfg.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list end offsets of %s: %w", cfg.Topic, err)
	}
	resolve := func(b Bound) (map[int32]int64, error) {
		out := map[int32]int64{}
		switch b.kind {
		case boundStart:
			starts.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
		case boundEnd:
			ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
		case boundOffset:
			starts.Each(func(o kadm.ListedOffset) { out[o.Partition] = b.offset })
		case boundTime:
			at, err := adm.ListOffsetsAfterMilli(ctx, b.millis, cfg.Topic)
			if err == nil {
				err = at.Error()
			}
			if err != nil {
				return nil, fmt.Errorf("list offsets of %s at %s: %w", cfg.Topic, b, err)
			}
			at.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
		}
		return out, nil
	}
	from, err := resolve(cfg.From)
	if err != nil {
		return nil, err
	}
	to, err := resolve(cfg.To)
	if err != nil {
		return nil, err
	}
	warm := from
	if cfg.WarmUpFrom != nil {
		if warm, err = resolve(*cfg.WarmUpFrom); err != nil {
			return nil, err
		}
	}
	s := &TopicSource{cfg: cfg, ranges: map[int32]Range{}, count: int32(len(starts[cfg.Topic]))}
	if len(starts[cfg.Topic]) == 0 {
		return nil, fmt.Errorf("topic %s has no partitions (does it exist?)", cfg.Topic)
	}
	parts := cfg.Partitions
	if len(parts) == 0 {
		for p := range starts[cfg.Topic] {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	parts = slices.Compact(parts)
	for _, p := range parts {
		st, ok := starts.Lookup(cfg.Topic, p)
		if !ok {
			return nil, fmt.Errorf("topic %s has no partition %d", cfg.Topic, p)
		}
		end, _ := ends.Lookup(cfg.Topic, p)
		// Clamp to what the log holds: records before the start were deleted
		// by retention, and nothing at or after the stable end is readable yet.
		r := Range{From: max(from[p], st.Offset), To: min(to[p], end.Offset)}
		if r.To < r.From {
			r.To = r.From
		}
		r.WarmUp = min(max(warm[p], st.Offset), r.From)
		// (A time past the last record may resolve to -1: not a request
		// for deleted records.)
		r.Truncated = from[p] >= 0 && from[p] < st.Offset || warm[p] >= 0 && warm[p] < st.Offset
		s.ranges[p] = r
		s.total += r.To - r.WarmUp
		s.parts = append(s.parts, p)
	}
	return s, nil
}

// Topic implements Source.
func (s *TopicSource) Topic() string { return s.cfg.Topic }

// Partitions implements Source.
func (s *TopicSource) Partitions() []int32 { return s.parts }

// PartitionCount is how many partitions the topic has, replayed or not: the
// repartition partition count of a re-keyed group, as the live service has it.
func (s *TopicSource) PartitionCount() int32 { return s.count }

// Range returns partition p's resolved range.
func (s *TopicSource) Range(p int32) Range { return s.ranges[p] }

// Size implements Source: the number of offsets in the whole range.
func (s *TopicSource) Size() (int64, string) { return s.total, "offsets" }

// Close implements Source.
func (s *TopicSource) Close() error { return nil }

// fetchBatch is what the fetching goroutine hands to the replay goroutine.
type fetchBatch struct {
	records []*kgo.Record
	err     error
}

// Read implements Source. A goroutine fetches while the caller processes, so
// fetching and decompression overlap with the pipeline.
//
// The range ends at the last offset before To. Offsets with no record for
// read_committed readers are transaction markers, which KeepControlRecords
// makes visible (and which are not fed to the pipeline), and aborted records,
// which always lie before their abort marker: so the last offset of a range
// that ends at the stable end is always seen, and a record at or past To
// also ends it. One case waits: when the range ends in records of an aborted
// transaction whose abort marker lies past another transaction still open,
// nothing at or past To is readable until that one ends (at worst the
// producer's transaction timeout).
func (s *TopicSource) Read(ctx context.Context, p int32, prog *Progress, fn func(*Record) error) error {
	r, ok := s.ranges[p]
	if !ok {
		return fmt.Errorf("partition %d is not in the range", p)
	}
	if r.From >= r.To {
		// Nothing to emit: a warm-up alone would only cost time.
		return nil
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.cfg.Topic: {p: kgo.NewOffset().At(r.WarmUp)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		// Records deleted by retention while the replay runs must fail it:
		// the default reset would jump to the new log start and skip them.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.FetchMaxBytes(64 << 20),
		kgo.FetchMaxPartitionBytes(32 << 20),
	}, s.cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	fctx, cancel := context.WithCancel(ctx)
	batches := make(chan fetchBatch, 2)
	fetcherDone := make(chan struct{})
	// Stop the fetcher and wait for it before closing its client, on every
	// return path.
	defer func() {
		cancel()
		<-fetcherDone
		cl.Close()
	}()
	go func() {
		defer close(fetcherDone)
		defer close(batches)
		for {
			fs := cl.PollFetches(fctx)
			if fctx.Err() != nil {
				return
			}
			var ferr error
			fs.EachError(func(_ string, _ int32, err error) {
				if ferr == nil && !errors.Is(err, context.Canceled) {
					ferr = err
				}
			})
			b := fetchBatch{records: fs.Records(), err: ferr}
			if b.err == nil && len(b.records) == 0 {
				continue
			}
			select {
			case batches <- b:
			case <-fctx.Done():
				return
			}
			if ferr != nil {
				return
			}
		}
	}()

	var rec Record
	done := r.WarmUp
	stall := cmp.Or(s.cfg.StallTimeout, DefaultStallTimeout)
	stalled := time.NewTimer(stall)
	defer stalled.Stop()
	for {
		var (
			b  fetchBatch
			ok bool
		)
		select {
		case b, ok = <-batches:
			stalled.Reset(stall)
		case <-ctx.Done():
			return ctx.Err()
		case <-stalled.C:
			return fmt.Errorf("read %s/%d: no record for %v with offsets %d to %d still to read: the brokers %v do not answer, or the range ends inside a transaction that is still open",
				s.cfg.Topic, p, stall, done, r.To-1, s.cfg.Brokers)
		}
		if !ok {
			// The fetcher stops early only when ctx ends.
			return errors.Join(ctx.Err(), errors.New("fetching stopped"))
		}
		if errors.Is(b.err, kerr.OffsetOutOfRange) {
			// The range was resolved against the log start when the replay
			// began; only a deletion since (retention, DeleteRecords) moves
			// the start past what is still to read.
			return fmt.Errorf("fetch %s/%d: records from offset %d on, still to read, were deleted by retention or DeleteRecords while the replay ran: raise the topic's retention.ms or replay from a later --from (%w)",
				s.cfg.Topic, p, done, b.err)
		}
		if b.err != nil {
			return fmt.Errorf("fetch %s/%d: %w", s.cfg.Topic, p, b.err)
		}
		for i, kr := range b.records {
			if i&1023 == 1023 {
				// A fetch can hold a whole partition (tens of MB): keep the
				// progress moving and Ctrl-C working within it.
				if err := ctx.Err(); err != nil {
					return err
				}
				prog.advance(kr.Offset - done)
				done = max(done, kr.Offset)
			}
			if kr.Offset >= r.To {
				prog.advance(r.To - done)
				return nil
			}
			if !kr.Attrs.IsControl() {
				rec = Record{}
				rec.Offset = kr.Offset
				rec.Key = kr.Key
				rec.Value = kr.Value
				rec.WarmUp = kr.Offset < r.From
				if err := fn(&rec); err != nil {
					return err
				}
			}
			if kr.Offset == r.To-1 {
				prog.advance(r.To - done)
				return nil
			}
		}
		last := b.records[len(b.records)-1].Offset + 1
		prog.advance(last - done)
		done = last
	}
}

func (p *Progress) advance(n int64) {
	if p != nil && n > 0 {
		p.Done.Add(n)
	}
}
