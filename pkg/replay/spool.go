package replay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
)

// A spool is an append-only log of length-prefixed records (hop records, here) that
// stays in memory up to a limit and moves to a temporary file beyond it. Every spool
// of a replay shares one file, so that the number of open files does not grow with
// the number of groups and partitions: a spool's spilled bytes are chunks of it.
// Records are read back by spoolReaders, each over one section (a byte range) of
// the log, while the log may still grow.

// spillFile is the temporary file the spools of one replay spill to. It is created
// on the first spill, unlinked at once where the system allows it (so that a killed
// replay leaves nothing behind), and removed by close.
type spillFile struct {
	dir  string // "" is os.TempDir()
	f    *os.File
	size int64
}

func (sf *spillFile) write(b []byte) (int64, error) {
	if sf.f == nil {
		f, err := os.CreateTemp(sf.dir, "velocity-replay-hops-*")
		if err != nil {
			return 0, fmt.Errorf("replay: a temporary file for the re-keyed groups' hop records: %w", err)
		}
		sf.f = f
		_ = os.Remove(f.Name()) // Linux keeps it readable through f; close removes it otherwise
	}
	off := sf.size
	if _, err := sf.f.WriteAt(b, off); err != nil {
		return 0, fmt.Errorf("replay: write %s: %w", sf.f.Name(), err)
	}
	sf.size += int64(len(b))
	return off, nil
}

func (sf *spillFile) close() error {
	if sf.f == nil {
		return nil
	}
	err := sf.f.Close()
	if rerr := os.Remove(sf.f.Name()); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
		err = rerr
	}
	sf.f = nil
	return err
}

type chunk struct {
	logical, file int64 // where the chunk starts in the spool's log and in the file
	n             int
}

type spool struct {
	file    *spillFile
	limit   int // bytes kept in memory before a spill
	chunks  []chunk
	spilled int64  // logical bytes in chunks
	tail    []byte // logical bytes from spilled on
}

// size is the log's length in bytes: where the next record starts.
func (s *spool) size() int64 { return s.spilled + int64(len(s.tail)) }

func (s *spool) append(rec []byte) error {
	s.tail = binary.AppendUvarint(s.tail, uint64(len(rec)))
	s.tail = append(s.tail, rec...)
	if len(s.tail) < s.limit {
		return nil
	}
	off, err := s.file.write(s.tail)
	if err != nil {
		return err
	}
	s.chunks = append(s.chunks, chunk{logical: s.spilled, file: off, n: len(s.tail)})
	s.spilled += int64(len(s.tail))
	s.tail = s.tail[:0]
	return nil
}

// readAt copies log bytes from off into p, at most up to the end of the chunk (or the
// in-memory tail) off lies in, and returns how many.
func (s *spool) readAt(p []byte, off int64) (int, error) {
	if off >= s.spilled {
		return copy(p, s.tail[off-s.spilled:]), nil
	}
	i := sort.Search(len(s.chunks), func(i int) bool { return s.chunks[i].logical+int64(s.chunks[i].n) > off })
	c := s.chunks[i]
	k := off - c.logical
	n := min(int64(len(p)), int64(c.n)-k)
	return s.file.f.ReadAt(p[:n], c.file+k)
}

// free drops the spool's memory; its file chunks stay in the shared file until it
// is closed.
func (s *spool) free() { *s = spool{} }

// spoolReaderBuf bounds one reader's buffer; a hop record is at most about 1.1 KiB.
const spoolReaderBuf = 4 << 10

// spoolReader reads the records of one section [pos, end) of a spool, in order.
type spoolReader struct {
	sp       *spool
	pos, end int64 // the next unread byte (buffered ones included) and the section's end
	buf      []byte
	lo, hi   int // buffered bytes, from log position pos
}

func (r *spoolReader) done() bool { return r.pos >= r.end }

// next returns the next record, valid until the next call, or ok=false at the
// section's end.
func (r *spoolReader) next() (rec []byte, ok bool, err error) {
	if r.pos >= r.end {
		return nil, false, nil
	}
	for {
		avail := r.buf[r.lo:r.hi]
		if n, k := binary.Uvarint(avail); k > 0 && uint64(len(avail)-k) >= n {
			rec = avail[k : k+int(n)]
			r.lo += k + int(n)
			r.pos += int64(k + int(n))
			if r.pos >= r.end {
				r.buf = nil // a finished section needs no buffer
			}
			return rec, true, nil
		}
		if r.buf == nil {
			r.buf = make([]byte, spoolReaderBuf)
		}
		m := copy(r.buf, avail)
		r.lo, r.hi = 0, m
		want := min(int64(len(r.buf)-m), r.end-r.pos-int64(m))
		if want <= 0 {
			return nil, false, fmt.Errorf("replay: spooled hop record at byte %d of its log is cut or longer than %d bytes", r.pos, len(r.buf))
		}
		n, err := r.sp.readAt(r.buf[m:m+int(want)], r.pos+int64(m))
		if n == 0 {
			return nil, false, fmt.Errorf("replay: read spooled hop records at byte %d: %w", r.pos+int64(m), errors.Join(err, errors.New("no bytes")))
		}
		r.hi += n
	}
}
