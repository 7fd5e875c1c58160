package replay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/linkedin/goavro/v2"
)

// OCFSource reads Transactions from an Avro object container file. The file's
// header carries its writer schema: values are re-encoded in it exactly as a
// producer would have written them (Avro binary is canonical for a schema),
// and the replay decodes them with that writer schema resolved against ours,
// so a file written with a newer schema (extra or reordered fields) replays
// like a topic written with it. The key is the entity_id field, as the
// contract keys input records.
//
// As with JSON lines, the file is partition 0, a record's offset is its
// 0-based position in the file, and source_topic is the file's base name.
type OCFSource struct {
	name   string
	f      *os.File
	size   int64
	schema string
}

// OpenOCF opens path and reads its header.
func OpenOCF(path string) (*OCFSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open input: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open input: %w", err)
	}
	r, err := goavro.NewOCFReader(bufio.NewReader(f))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s is not an Avro object container file: %w", path, err)
	}
	return &OCFSource{name: filepath.Base(path), f: f, size: st.Size(), schema: r.Codec().Schema()}, nil
}

// WriterSchema is the schema in the file's header, for codec.NewDecoder.
func (s *OCFSource) WriterSchema() string { return s.schema }

// Topic implements Source: the file's base name.
func (s *OCFSource) Topic() string { return s.name }

// Partitions implements Source.
func (s *OCFSource) Partitions() []int32 { return []int32{0} }

// Size implements Source: the file's size in bytes.
func (s *OCFSource) Size() (int64, string) { return s.size, "bytes" }

// Close implements Source.
func (s *OCFSource) Close() error { return s.f.Close() }

// countingReader reports bytes read to a Progress.
type countingReader struct {
	r    io.Reader
	prog *Progress
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.prog.advance(int64(n))
	return n, err
}

// Read implements Source. A block that does not decode fails the replay: a
// corrupt file is not a stream of bad records, and its offsets would be lost.
func (s *OCFSource) Read(ctx context.Context, p int32, prog *Progress, fn func(*Record) error) error {
	if p != 0 {
		return fmt.Errorf("%s has only partition 0", s.name)
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	r, err := goavro.NewOCFReader(bufio.NewReaderSize(countingReader{s.f, prog}, 1<<20))
	if err != nil {
		return fmt.Errorf("read %s: %w", s.name, err)
	}
	codec := r.Codec()
	var (
		rec    Record
		value  []byte
		offset int64
	)
	for r.Scan() {
		if offset&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		datum, err := r.Read()
		if err != nil {
			return fmt.Errorf("read %s record %d: %w", s.name, offset, err)
		}
		if value, err = codec.BinaryFromNative(value[:0], datum); err != nil {
			return fmt.Errorf("re-encode %s record %d: %w", s.name, offset, err)
		}
		rec = Record{}
		rec.Offset = offset
		rec.Value = value
		if m, ok := datum.(map[string]any); ok {
			switch id := m["entity_id"].(type) {
			case string:
				rec.Key = []byte(id)
			case []byte:
				rec.Key = id
			}
		}
		if err := fn(&rec); err != nil {
			return err
		}
		offset++
	}
	if err := r.Err(); err != nil {
		return fmt.Errorf("read %s after record %d: %w", s.name, offset, err)
	}
	return nil
}
