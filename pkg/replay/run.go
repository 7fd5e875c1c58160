package replay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// Sink receives outputs. Write is called on the replay goroutine with an
// Output whose byte slices are valid only during the call.
type Sink interface {
	Write(o *pipeline.Output) error
	// Commit makes everything written durable and visible under its final
	// name (a file) or acknowledged (a topic). It is called once, at the end
	// of a replay that read its whole range.
	Commit(ctx context.Context) error
	// Abort discards what Commit would have published, as far as that is
	// possible (records already produced to a topic stay there). It is safe
	// to call after Commit, when it does nothing.
	Abort() error
}

// Config says how to run each partition and where its outputs go.
type Config struct {
	// Pipeline is the processor configuration shared by every partition: the
	// same as the live service's. Topic and Partition are set per partition
	// from the source, and Watermark.IdleTimeout is forced to 0 because a
	// replay never releases on wall-clock idleness: it flushes at the end.
	Pipeline pipeline.Config
	// Features receives features records; required.
	Features Sink
	// Dead receives dead letters. Nil means they are only counted (Result
	// names them by reason), which the command reports loudly.
	Dead Sink
	// Progress, if set, is updated as records are read and written.
	Progress *Progress
	// MaxPrepareWait bounds how long one record may wait for a decoder that
	// implements codec.Preparer (a schema-registry decoder whose registry is
	// unreachable) before the replay fails; 0 means 2 minutes. A record is
	// never dead-lettered for an unavailable registry, as in the live
	// service: the replay waits, retrying with backoff, or stops.
	MaxPrepareWait time.Duration
	// OnPrepareRetry, if set, is told about every failed Prepare (for a log line).
	OnPrepareRetry func(partition int32, offset int64, attempt int, err error)
	// Groups are a definition's re-keyed groups (docs/repartition.md), in the
	// order its Decoder fills codec.Transaction.Groups. Each is computed as
	// 'run' computes it, re-keyed in memory: every partition's processor is
	// their first stage, and one second stage per repartition partition merges
	// what all of them sent it. The second stages hear that every source ended
	// once the last partition is done, so they release everything then.
	// The hop records of every partition but the last are kept for the second
	// stages in memory up to about 64 MiB, then in a temporary file in TempDir.
	Groups []Group
	// TempDir is where that file goes; "" is os.TempDir().
	TempDir string
}

// Group is one re-keyed group of a replay.
type Group struct {
	Name     string
	Spec     *feature.Spec
	Features Sink // its features records; its dead letters go to Config.Dead
}

// GroupResult counts what a replay did for one re-keyed group: one features
// record or one dead letter per record the input partitions accepted with the
// group's key; KeyMissing were accepted without one.
type GroupResult struct {
	Name                     string
	Features, Dead           int64
	KeyMissing, HopDuplicate uint64
	// PeakPending is the most events the group's second stages held at once,
	// waiting for every source's watermark to pass them.
	PeakPending int
	// Spooled is how many bytes of hop records were kept for its second stages
	// (in memory or the temporary file) to be fed later.
	Spooled int64
}

// Result counts what a replay did. Every input record yields exactly one
// output, so Records == Features + Dead after a complete replay.
type Result struct {
	Records    int64 // in the range proper, warm-up excluded
	WarmUp     int64 // warm-up records read (their outputs are not written)
	Features   int64
	Dead       int64
	ByReason   map[codec.Reason]int64
	Partitions []int32
	// CapEvicted is how many entities the --max-entities cap evicted, warm-up
	// included: an entity seen again afterwards lost its earlier history.
	CapEvicted uint64
	// KeyMismatch is how many records' key was not their entity_id (null
	// included), warm-up included: the input may split entities over partitions.
	KeyMismatch uint64
	// Groups are the re-keyed groups' counts, in Config.Groups' order. Their
	// dead letters are in Dead and ByReason too.
	Groups []GroupResult
}

// Reasons returns the dead-letter reasons in a stable order, for reports.
func (r Result) Reasons() []codec.Reason {
	return slices.Sorted(maps.Keys(r.ByReason))
}

// Run replays every partition of src, in ascending order, through its own
// processor and writes the outputs to cfg's sinks. It neither commits nor
// aborts the sinks: the caller does, once, for all of them.
func Run(ctx context.Context, src Source, cfg Config) (Result, error) {
	res := Result{ByReason: map[codec.Reason]int64{}}
	if cfg.Features == nil {
		return res, errors.New("replay: a features sink is required")
	}
	prog := cfg.Progress
	if prog == nil {
		prog = new(Progress)
	}
	st, err := newStages(src, &cfg, prog, &res)
	if err != nil {
		return res, err
	}
	err = run(ctx, src, cfg, prog, &res, st)
	if cerr := st.close(); err == nil {
		err = cerr
	}
	return res, err
}

func run(ctx context.Context, src Source, cfg Config, prog *Progress, res *Result, st *secondStages) error {
	parts := src.Partitions()
	for i, p := range parts {
		if err := ctx.Err(); err != nil {
			return err
		}
		if st != nil {
			st.begin(p, i == len(parts)-1)
		}
		if err := runPartition(ctx, src, p, cfg, prog, res, st); err != nil {
			return err
		}
		if st != nil {
			st.endPartition(p)
		}
		res.Partitions = append(res.Partitions, p)
	}
	if st != nil {
		return st.end(ctx)
	}
	return nil
}

func runPartition(ctx context.Context, src Source, p int32, cfg Config, prog *Progress, res *Result, st *secondStages) error {
	pc := cfg.Pipeline
	pc.Topic, pc.Partition = src.Topic(), p
	pc.Watermark.IdleTimeout = 0
	proc, err := pipeline.New(pc, 0)
	if err != nil {
		return fmt.Errorf("replay partition %d: %w", p, err)
	}
	prep, _ := pc.Decoder.(codec.Preparer)
	var (
		cur     *Record // the record being processed, for Original
		sinkErr error
		dl      pipeline.Output
		warmTo  int64 = -1 // last warm-up offset seen
	)
	emit := func(o *pipeline.Output) {
		if sinkErr != nil {
			return
		}
		if o.Hop {
			// A warm-up record's hop goes through too: it builds the group's
			// state as it built this partition's; the second stage drops its
			// outputs by the same rule (secondStages.warmTo).
			sinkErr = st.hop(o)
			return
		}
		if o.SourceOffset <= warmTo {
			// The output of a warm-up record (possibly released only now):
			// it belongs before the range.
			return
		}
		var s Sink
		if o.Dead {
			res.Dead++
			res.ByReason[o.Reason]++
			if s = cfg.Dead; s == nil {
				prog.Outputs.Add(1)
				return
			}
			if cur != nil && cur.Original != nil && o.SourceOffset == cur.Offset {
				// The dead letter is the record being processed: give the
				// user's bytes back rather than the value built from them.
				dl = *o
				dl.Value = cur.Original
				o = &dl
			}
		} else {
			res.Features++
			s = cfg.Features
		}
		if err := s.Write(o); err != nil {
			sinkErr = err
		}
		prog.Outputs.Add(1)
	}
	err = src.Read(ctx, p, prog, func(r *Record) error {
		if r.WarmUp {
			res.WarmUp++
			warmTo = r.Offset
			if st != nil {
				st.warmTo[p] = r.Offset
			}
		} else {
			res.Records++
			prog.Records.Add(1)
		}
		r.Topic, r.Partition, r.Arrival = pc.Topic, p, 0
		cur = r
		if prep != nil && r.Reject == nil {
			if err := prepare(ctx, prep, r, cfg); err != nil {
				return err
			}
		}
		if r.Reject != nil {
			value := r.Value
			if r.Original != nil {
				value = r.Original
			}
			emit(&pipeline.Output{
				Dead: true, Key: r.Key, Value: value,
				Reason: r.Reject.Reason, Err: r.Reject.Detail,
				SourceTopic: pc.Topic, SourcePartition: p, SourceOffset: r.Offset,
			})
		} else {
			proc.Process(r.Record, emit)
		}
		cur = nil
		return sinkErr
	})
	if err != nil {
		return fmt.Errorf("replay partition %d: %w", p, err)
	}
	// The end of the range: release everything still waiting for the
	// watermark, in (event_time, offset) order (docs/contract.md, "Reorder
	// buffer and release order"): no later record can arrive to release them.
	proc.Flush(emit)
	res.CapEvicted += proc.CapEvictions()
	res.KeyMismatch += proc.Stats().KeyMismatch
	for g, n := range proc.KeyMissing() {
		res.Groups[g].KeyMissing += n
	}
	if sinkErr != nil {
		return fmt.Errorf("replay partition %d: %w", p, sinkErr)
	}
	return nil
}

// Backoff between two attempts to prepare a record, and the bound on one
// attempt, as the live service uses them (variables so tests can shorten them).
var (
	minPrepareBackoff = 200 * time.Millisecond
	maxPrepareBackoff = 10 * time.Second
	prepareAttempt    = 10 * time.Second
)

// prepare waits until the decoder can decode r's value, or fails after
// cfg.MaxPrepareWait or when ctx ends.
func prepare(ctx context.Context, prep codec.Preparer, r *Record, cfg Config) error {
	wait := cfg.MaxPrepareWait
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	deadline := time.Now().Add(wait)
	backoff := minPrepareBackoff
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, prepareAttempt)
		err := prep.Prepare(actx, r.Value)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if cfg.OnPrepareRetry != nil {
			cfg.OnPrepareRetry(r.Partition, r.Offset, attempt, err)
		}
		if time.Now().Add(backoff).After(deadline) {
			return fmt.Errorf("offset %d: the decoder could not prepare it for %v (is the schema registry reachable?): %w", r.Offset, wait, err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, maxPrepareBackoff)
	}
}
