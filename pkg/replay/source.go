package replay

import (
	"context"
	"sync/atomic"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// Source yields the records to replay, one partition at a time.
type Source interface {
	// Topic is the source_topic written into lineage: the topic name, or a
	// file's base name for file inputs.
	Topic() string
	// Partitions lists the partitions to replay, in ascending order.
	Partitions() []int32
	// Read calls fn with every record of partition p in offset order, until
	// the end of the range, an error from fn, or ctx ends (ctx's error). The
	// Record and its byte slices are only valid during the call.
	// Read advances prog.Done (prog may be nil).
	Read(ctx context.Context, p int32, prog *Progress, fn func(*Record) error) error
	// Size is the amount of work in the whole replay and its unit, for the
	// progress ETA: offsets of a topic range, bytes of a file.
	Size() (total int64, unit string)
	// Close releases the source's files or clients.
	Close() error
}

// Record is one input record as a source hands it over.
type Record struct {
	pipeline.Record
	// Original, if set, is the input as the user wrote it when Value had to be
	// built from it (a JSON line): dead letters carry it instead of Value, so
	// the DLQ holds what the user can find in their file.
	Original []byte
	// Reject, if set, means the source could not turn the input into a value
	// (a line that is not a JSON transaction). The record is dead-lettered
	// with this reason without reaching the processor, exactly as the
	// processor would dead-letter an undecodable value: it has no state effect.
	Reject *codec.Rejection
	// WarmUp marks a record before the range proper: it is processed so the
	// state is what the live service had, but nothing it yields is written.
	// Warm-up records come first and all of them.
	WarmUp bool
}

// Progress is how far a replay has come, read concurrently by a progress bar.
// Done and Total count Unit (offsets for a topic, bytes for a file) so that an
// ETA can be had before the number of records is known.
type Progress struct {
	Records atomic.Int64 // input records read
	Outputs atomic.Int64 // features records and dead letters written
	Done    atomic.Int64 // units consumed
	Total   atomic.Int64 // units in the whole range; 0 when unknown
	Unit    string       // "offsets" or "bytes"; set before the replay starts
}

// NewProgress returns a Progress sized for src.
func NewProgress(src Source) *Progress {
	total, unit := src.Size()
	p := &Progress{Unit: unit}
	p.Total.Store(total)
	return p
}
