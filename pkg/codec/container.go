package codec

import (
	"fmt"
	"io"

	"github.com/linkedin/goavro/v2"
)

// ContainerReader reads transactions from an Avro object container file (the
// replay's file input). The file carries its own writer schema; it is resolved
// against ours exactly as NewDecoder resolves a configured writer schema, and
// each record comes back as a value in our schema, so that a replay feeds it
// through the same Decoder, validation and dead-letter path as a topic record.
type ContainerReader struct {
	ocf  *goavro.OCFReader
	res  *goavroDecoder
	buf  []byte
	tx   Transaction
	err  error
	read int64
}

// NewContainerReader reads the container header from r. It fails when r is not
// an Avro container file or when its writer schema cannot supply our
// Transaction (a required field missing or of an incompatible type).
func NewContainerReader(r io.Reader) (*ContainerReader, error) {
	ocf, err := goavro.NewOCFReader(r)
	if err != nil {
		return nil, fmt.Errorf("read Avro container header: %w", err)
	}
	res, err := newGoavroDecoder(ocf.Codec().Schema(), DefaultLimits())
	if err != nil {
		return nil, fmt.Errorf("container file schema: %w", err)
	}
	return &ContainerReader{ocf: ocf, res: res}, nil
}

// WriterSchema is the schema the file was written with.
func (c *ContainerReader) WriterSchema() string { return c.ocf.Codec().Schema() }

// Next reads the next record. Usually it returns the record in our
// Transaction schema and a nil Rejection; validation is left to the Decoder.
// A record our schema cannot express (a required field that is null, a union
// branch of the wrong type) comes back in the file's writer schema with the
// Rejection a dead letter for it carries, since there is no other copy of its
// bytes to keep. ok is false at the end of the file or on a read error (see
// Err); a corrupt block ends the file, because container files have no
// record boundaries to resume at. value is valid until the next call.
func (c *ContainerReader) Next() (value []byte, rej *Rejection, ok bool) {
	if c.err != nil || !c.ocf.Scan() {
		c.err = c.ocf.Err()
		return nil, nil, false
	}
	native, err := c.ocf.Read()
	if err != nil {
		c.err = fmt.Errorf("read record %d of container file: %w", c.read, err)
		return nil, nil, false
	}
	c.read++
	if rej = c.res.project(native, &c.tx); rej != nil {
		if c.buf, err = c.ocf.Codec().BinaryFromNative(c.buf[:0], native); err != nil {
			c.err = fmt.Errorf("re-encode record %d of container file: %w", c.read-1, err)
			return nil, nil, false
		}
		return c.buf, rej, true
	}
	c.buf = AppendTransaction(c.buf[:0], &c.tx)
	return c.buf, nil, true
}

// Err is the error that ended Next, or nil at a clean end of file.
func (c *ContainerReader) Err() error { return c.err }

// ContainerWriter writes transactions in our schema to an Avro object
// container file, for generators, tests and backtest inputs.
type ContainerWriter struct {
	ocf *goavro.OCFWriter
}

// NewContainerWriter writes the container header to w. compression is one of
// goavro's codec names: "null" (or ""), "deflate", "snappy".
func NewContainerWriter(w io.Writer, compression string) (*ContainerWriter, error) {
	ocf, err := goavro.NewOCFWriter(goavro.OCFConfig{W: w, Codec: ourTransaction, CompressionName: compression})
	if err != nil {
		return nil, fmt.Errorf("write Avro container header: %w", err)
	}
	return &ContainerWriter{ocf: ocf}, nil
}

// Append writes txs as one block; their fields are written as they are, valid
// or not, so tests can build files of bad records.
func (c *ContainerWriter) Append(txs ...Transaction) error {
	items := make([]any, len(txs))
	for i, tx := range txs {
		items[i] = map[string]any{"event_id": tx.EventID, "entity_id": tx.EntityID,
			"amount_minor": tx.AmountMinor, "currency": tx.Currency, "event_time": tx.EventTime}
	}
	return c.ocf.Append(items)
}
