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
// a column name says W but not the bucket width. A row group is cut at the
// first batch boundary past 256 Ki rows, so memory stays bounded at any
// replay size.
//
// Write only parses the record and fills a batch, column by column; a
// goroutine of the sink hands full batches to parquet-go's column writers
// (buffering, encoding, compression), so on a machine with a spare core the
// file is encoded while the pipeline computes the next batch. Two batches
// circulate between them, which bounds the memory and keeps the rows in
// order. Column-major batches skip parquet-go's row assembly and split
// (parquet.Row, Value.Level, Row.Range), a third of the sink's time: required
// flat columns read only the values' payloads.
type ParquetSink struct {
	f    *atomicFile
	w    *parquet.Writer
	nwin int
	view featureView

	// flat is a feature definition's output schema (NewFlatParquetSink): then
	// every field is one column, in schema order, and vals its parsed record.
	flat *flatSchema
	vals []flatValue

	cur  *rowBatch      // being filled by Write; nil between batches
	free chan *rowBatch // empty batches, back from the encoder
	full chan *rowBatch // batches for the encoder, in order
	done chan struct{}  // closed when the encoder has returned
	err  error          // the encoder's first error; read after done, or via errc
	errc chan error     // the encoder's first error, for Write to fail fast
	shut bool           // full is closed
	gone bool           // committed or aborted

	groupRows int // rows per row group (parquetRowGroupRows; tests make it small)
}

// rowBatch is a batch of rows stored by column, and the bytes their strings
// point into.
type rowBatch struct {
	cols  [][]parquet.Value // cols[c][i]: column c of row i
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
	// The Go struct only carries the schema: field names must be exported and
	// distinct, the column names come from the tags, the order is the struct's.
	for i := range fields {
		fields[i].Name = fmt.Sprintf("F%d", i)
	}
	return parquet.NewSchema("velocity_features", parquet.SchemaOf(reflect.New(reflect.StructOf(fields)).Elem().Interface()))
}

// NewParquetSink creates name.partial; Commit writes the footer and renames
// it to name.
func NewParquetSink(name string, specs []window.Spec) (*ParquetSink, error) {
	return newParquetSink(name, specs, parquetRowGroupRows)
}

func newParquetSink(name string, specs []window.Spec, groupRows int) (*ParquetSink, error) {
	s, err := openParquet(name, ParquetSchema(specs), 3+4*len(specs)+5, groupRows,
		parquet.KeyValueMetadata("velocity.windows", window.FormatSpecs(specs)))
	if err != nil {
		return nil, err
	}
	s.nwin = len(specs)
	return s, nil
}

// FlatParquetSchema returns the schema a flat ParquetSink writes for the
// output schema avsc: one column per field, in order, with the field's name;
// string → string (source_topic dictionary-encoded), long → int64 (event_time
// and other timestamp-millis fields as TIMESTAMP(MILLIS, UTC)), int → int32,
// boolean → boolean, ["null","long"] → optional int64.
func FlatParquetSchema(avsc string) (*parquet.Schema, error) {
	fs, err := parseFlatSchema(avsc)
	if err != nil {
		return nil, err
	}
	return flatParquetSchema(fs), nil
}

func flatParquetSchema(fs *flatSchema) *parquet.Schema {
	fields := make([]reflect.StructField, len(fs.fields))
	for i, f := range fs.fields {
		var v any
		tag := ""
		switch f.kind {
		case flatString:
			v = ""
			if f.name == "source_topic" {
				tag = ",dict"
			}
		case flatLong:
			v = int64(0)
			if f.timestamp {
				tag = ",timestamp(millisecond:utc)"
			}
		case flatInt:
			v = int32(0)
		case flatBool:
			v = false
		case flatOptLong:
			v, tag = new(int64), ",optional"
		}
		fields[i] = reflect.StructField{
			Name: fmt.Sprintf("F%d", i),
			Type: reflect.TypeOf(v),
			Tag:  reflect.StructTag(`parquet:"` + f.name + tag + `"`),
		}
	}
	return parquet.NewSchema(fs.name, parquet.SchemaOf(reflect.New(reflect.StructOf(fields)).Elem().Interface()))
}

// NewFlatParquetSink is NewParquetSink for a feature definition's features
// records, whose output schema avsc (feature.Spec's generated schema) gives
// the columns (FlatParquetSchema). The definition's version goes into the
// file's key-value metadata as velocity.definition.
func NewFlatParquetSink(name, avsc, definition string) (*ParquetSink, error) {
	fs, err := parseFlatSchema(avsc)
	if err != nil {
		return nil, err
	}
	s, err := openParquet(name, flatParquetSchema(fs), len(fs.fields), parquetRowGroupRows,
		parquet.KeyValueMetadata("velocity.definition", definition))
	if err != nil {
		return nil, err
	}
	s.flat, s.vals = fs, make([]flatValue, len(fs.fields))
	return s, nil
}

func openParquet(name string, schema *parquet.Schema, ncol, groupRows int, meta parquet.WriterOption) (*ParquetSink, error) {
	f, err := createAtomic(name)
	if err != nil {
		return nil, err
	}
	w := parquet.NewWriter(f, schema,
		parquet.Compression(&parquet.Snappy),
		meta,
		parquet.CreatedBy("velocity-consumer replay", "", ""),
	)
	s := &ParquetSink{
		f: f, w: w,
		free: make(chan *rowBatch, 2), full: make(chan *rowBatch, 2),
		done: make(chan struct{}), errc: make(chan error, 1),
		groupRows: groupRows,
	}
	for range 2 {
		b := &rowBatch{cols: make([][]parquet.Value, ncol)}
		for c := range b.cols {
			b.cols[c] = make([]parquet.Value, parquetBatch)
		}
		s.free <- b
	}
	go s.encode()
	return s, nil
}

// encode writes full batches until full is closed, cutting a row group at
// the first batch boundary past groupRows rows. After an error it keeps
// draining (so Write never blocks on a dead encoder) but writes nothing.
func (s *ParquetSink) encode() {
	defer close(s.done)
	inGroup := 0
	for b := range s.full {
		if s.err == nil {
			err := s.writeColumns(b)
			if inGroup += b.n; err == nil && inGroup >= s.groupRows {
				err, inGroup = s.w.Flush(), 0
			}
			if err != nil {
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

func (s *ParquetSink) writeColumns(b *rowBatch) error {
	for c, cw := range s.w.ColumnWriters() {
		if _, err := cw.WriteRowValues(b.cols[c][:b.n]); err != nil {
			return err
		}
	}
	return nil
}

// Write implements Sink: features only.
func (s *ParquetSink) Write(o *pipeline.Output) error {
	if s.flat != nil {
		return s.writeFlat(o.Value)
	}
	v := &s.view
	if err := v.parse(o.Value); err != nil {
		return err
	}
	if len(v.windows) != s.nwin {
		return fmt.Errorf("parquet sink: record has %d windows, the schema %d", len(v.windows), s.nwin)
	}
	b, err := s.batch()
	if err != nil {
		return err
	}
	// Columns are numbered in schema order (see ParquetSchema). Required
	// columns need no levels; ms_since_previous, the one optional column,
	// carries its definition level (1 for a value, 0 for null).
	i, cols := b.n, b.cols
	cols[0][i] = parquet.ByteArrayValue(b.keep(v.eventID))
	cols[1][i] = parquet.ByteArrayValue(b.keep(v.entityID))
	cols[2][i] = parquet.Int64Value(v.eventTime)
	c := 3
	for j := range v.windows {
		w := &v.windows[j]
		cols[c][i] = parquet.Int64Value(w.count)
		cols[c+1][i] = parquet.Int64Value(w.sumMinor)
		cols[c+2][i] = parquet.Int64Value(w.minMinor)
		cols[c+3][i] = parquet.Int64Value(w.maxMinor)
		c += 4
	}
	if v.hasPrevious {
		cols[c][i] = parquet.Int64Value(v.msSincePrevious).Level(0, 1, c)
	} else {
		cols[c][i] = parquet.NullValue().Level(0, 0, c)
	}
	cols[c+1][i] = parquet.BooleanValue(v.late)
	cols[c+2][i] = parquet.ByteArrayValue(b.keep(v.sourceTopic))
	cols[c+3][i] = parquet.Int32Value(v.sourcePartition)
	cols[c+4][i] = parquet.Int64Value(v.sourceOffset)
	s.rowDone(b)
	return nil
}

// writeFlat fills one row of a flat record: column c is field c. Optional
// columns carry their definition level (1 for a value, 0 for null).
func (s *ParquetSink) writeFlat(value []byte) error {
	if err := s.flat.parse(value, s.vals); err != nil {
		return err
	}
	b, err := s.batch()
	if err != nil {
		return err
	}
	i := b.n
	for c := range s.flat.fields {
		v := &s.vals[c]
		switch s.flat.fields[c].kind {
		case flatString:
			b.cols[c][i] = parquet.ByteArrayValue(b.keep(v.str))
		case flatLong:
			b.cols[c][i] = parquet.Int64Value(v.num)
		case flatInt:
			b.cols[c][i] = parquet.Int32Value(int32(v.num))
		case flatBool:
			b.cols[c][i] = parquet.BooleanValue(v.num == 1)
		case flatOptLong:
			if v.null {
				b.cols[c][i] = parquet.NullValue().Level(0, 0, c)
			} else {
				b.cols[c][i] = parquet.Int64Value(v.num).Level(0, 1, c)
			}
		}
	}
	s.rowDone(b)
	return nil
}

// batch returns the batch being filled, waiting for a free one if none is.
func (s *ParquetSink) batch() (*rowBatch, error) {
	if s.cur == nil {
		select {
		case err := <-s.errc:
			s.errc <- err
			return nil, err
		case s.cur = <-s.free:
		}
	}
	return s.cur, nil
}

// rowDone counts the row just filled and hands a full batch to the encoder.
func (s *ParquetSink) rowDone(b *rowBatch) {
	b.n++
	if b.n == parquetBatch {
		s.full <- b
		s.cur = nil
	}
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
