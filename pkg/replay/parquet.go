package replay

import (
	"context"
	"fmt"
	"reflect"

	"github.com/parquet-go/parquet-go"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// ParquetSink writes features records to a Parquet file with flat columns, in
// this order:
//
//	event_id          string
//	entity_id         string
//	event_time        int64, TIMESTAMP(MILLIS, UTC)
//	count_<W>, sum_minor_<W>, min_minor_<W>, max_minor_<W>
//	                  int64, for each window in configured order (W is its
//	                  name: count_5m, sum_minor_5m, …)
//	ms_since_previous optional int64 (null for an entity's first retained event)
//	late              boolean
//	source_topic      string
//	source_partition  int32
//	source_offset     int64
//
// Flat columns rather than a list of window structs, because that is what a
// notebook or a SQL engine reads without unnesting. The window specs go into
// the file's key-value metadata as velocity.windows ("1m:1s,5m:5s,…"), since
// a column name says W but not the bucket width. Row groups hold up to
// 256 Ki rows, so memory stays bounded at any replay size.
//
// Write only parses the record and fills a batch of rows; a goroutine of the
// sink hands full batches to parquet-go (column buffering, encoding,
// compression), so on a machine with a spare core the file is encoded while
// the pipeline computes the next batch. Two batches circulate between them,
// which bounds the memory and keeps the rows in order.
type ParquetSink struct {
	f    *atomicFile
	w    *parquet.Writer
	nwin int
	view featureView

	cur  *rowBatch      // being filled by Write; nil between batches
	free chan *rowBatch // empty batches, back from the encoder
	full chan *rowBatch // batches for the encoder, in order
	done chan struct{}  // closed when the encoder has returned
	err  error          // the encoder's first error; read after done, or via errc
	errc chan error     // the encoder's first error, for Write to fail fast
	shut bool           // full is closed
	gone bool           // committed or aborted
}

// rowBatch is a batch of rows and the bytes their strings point into.
type rowBatch struct {
	rows  []parquet.Row
	n     int
	arena []byte
}

const (
	parquetBatch        = 1024
	parquetRowGroupRows = 256 << 10
)

// ParquetSchema returns the schema ParquetSink writes for specs.
func ParquetSchema(specs []window.Spec) *parquet.Schema {
	field := func(name string, v any, tag string) reflect.StructField {
		return reflect.StructField{
			Name: "F",
			Type: reflect.TypeOf(v),
			Tag:  reflect.StructTag(`parquet:"` + name + tag + `"`),
		}
	}
	var fields []reflect.StructField
	fields = append(fields,
		field("event_id", "", ""),
		field("entity_id", "", ""),
		field("event_time", int64(0), ",timestamp(millisecond:utc)"),
	)
	for _, s := range specs {
		for _, agg := range []string{"count_", "sum_minor_", "min_minor_", "max_minor_"} {
			fields = append(fields, field(agg+s.Name, int64(0), ""))
		}
	}
	fields = append(fields,
		field("ms_since_previous", new(int64), ",optional"),
		field("late", false, ""),
		field("source_topic", "", ",dict"),
		field("source_partition", int32(0), ""),
		field("source_offset", int64(0), ""),
	)
	// Exported, distinct Go field names; the parquet names come from the tags.
	for i := range fields {
		fields[i].Name = fmt.Sprintf("F%d", i)
	}
	return parquet.NewSchema("velocity_features", parquet.SchemaOf(reflect.New(reflect.StructOf(fields)).Elem().Interface()))
}

// NewParquetSink creates name.partial; Commit writes the footer and renames
// it to name.
func NewParquetSink(name string, specs []window.Spec) (*ParquetSink, error) {
	f, err := createAtomic(name)
	if err != nil {
		return nil, err
	}
	schema := ParquetSchema(specs)
	w := parquet.NewWriter(f, schema,
		parquet.Compression(&parquet.Snappy),
		parquet.MaxRowsPerRowGroup(parquetRowGroupRows),
		parquet.KeyValueMetadata("velocity.windows", window.FormatSpecs(specs)),
		parquet.CreatedBy("velocity-consumer replay", "", ""),
	)
	s := &ParquetSink{
		f: f, w: w, nwin: len(specs),
		free: make(chan *rowBatch, 2), full: make(chan *rowBatch, 2),
		done: make(chan struct{}), errc: make(chan error, 1),
	}
	ncol := 3 + 4*len(specs) + 5
	for range 2 {
		b := &rowBatch{rows: make([]parquet.Row, parquetBatch)}
		for i := range b.rows {
			b.rows[i] = make(parquet.Row, 0, ncol)
		}
		s.free <- b
	}
	go s.encode()
	return s, nil
}

// encode writes full batches until full is closed. After an error it keeps
// draining (so Write never blocks on a dead encoder) but writes nothing.
func (s *ParquetSink) encode() {
	defer close(s.done)
	for b := range s.full {
		if s.err == nil {
			if _, err := s.w.WriteRows(b.rows[:b.n]); err != nil {
				s.err = fmt.Errorf("parquet sink: %w", err)
				s.errc <- s.err
			}
		}
		// parquet-go has copied the values, byte arrays included, into its
		// column buffers: the batch and its arena can be refilled.
		b.n, b.arena = 0, b.arena[:0]
		s.free <- b
	}
}

// Write implements Sink: features only.
func (s *ParquetSink) Write(o *pipeline.Output) error {
	v := &s.view
	if err := v.parse(o.Value); err != nil {
		return err
	}
	if len(v.windows) != s.nwin {
		return fmt.Errorf("parquet sink: record has %d windows, the schema %d", len(v.windows), s.nwin)
	}
	if s.cur == nil {
		select {
		case err := <-s.errc:
			s.errc <- err
			return err
		case s.cur = <-s.free:
		}
	}
	b := s.cur
	row := b.rows[b.n][:0]
	// Strings are copied into the batch's arena: o.Value is reused after
	// this call, and the rows are handed to the writer a batch at a time.
	// Columns are numbered in schema order (see ParquetSchema); every column
	// but ms_since_previous is required, so its definition level is 0.
	row = append(row,
		parquet.ByteArrayValue(b.keep(v.eventID)).Level(0, 0, 0),
		parquet.ByteArrayValue(b.keep(v.entityID)).Level(0, 0, 1),
		parquet.Int64Value(v.eventTime).Level(0, 0, 2),
	)
	col := 3
	for i := range v.windows {
		w := &v.windows[i]
		row = append(row,
			parquet.Int64Value(w.count).Level(0, 0, col),
			parquet.Int64Value(w.sumMinor).Level(0, 0, col+1),
			parquet.Int64Value(w.minMinor).Level(0, 0, col+2),
			parquet.Int64Value(w.maxMinor).Level(0, 0, col+3),
		)
		col += 4
	}
	if v.hasPrevious {
		row = append(row, parquet.Int64Value(v.msSincePrevious).Level(0, 1, col))
	} else {
		row = append(row, parquet.NullValue().Level(0, 0, col))
	}
	row = append(row,
		parquet.BooleanValue(v.late).Level(0, 0, col+1),
		parquet.ByteArrayValue(b.keep(v.sourceTopic)).Level(0, 0, col+2),
		parquet.Int32Value(v.sourcePartition).Level(0, 0, col+3),
		parquet.Int64Value(v.sourceOffset).Level(0, 0, col+4),
	)
	b.rows[b.n] = row
	b.n++
	if b.n == len(b.rows) {
		s.full <- b
		s.cur = nil
	}
	return nil
}

func (b *rowBatch) keep(p []byte) []byte {
	at := len(b.arena)
	b.arena = append(b.arena, p...)
	return b.arena[at:len(b.arena):len(b.arena)]
}

// stop hands over the last partial batch (when flush) and waits for the
// encoder to finish, returning its error.
func (s *ParquetSink) stop(flush bool) error {
	if !s.shut {
		s.shut = true
		if s.cur != nil && s.cur.n > 0 && flush {
			s.full <- s.cur
		}
		s.cur = nil
		close(s.full)
	}
	<-s.done
	return s.err
}

// Commit implements Sink: the last rows, the footer, fsync, rename.
func (s *ParquetSink) Commit(context.Context) error {
	if s.gone {
		return nil
	}
	s.gone = true
	err := s.stop(true)
	if err == nil {
		if err = s.w.Close(); err != nil {
			err = fmt.Errorf("parquet sink: %w", err)
		}
	}
	if err != nil {
		_ = s.f.abort()
		return err
	}
	return s.f.commit()
}

// Abort implements Sink.
func (s *ParquetSink) Abort() error {
	if s.gone {
		return nil
	}
	s.gone = true
	_ = s.stop(false)
	return s.f.abort()
}
