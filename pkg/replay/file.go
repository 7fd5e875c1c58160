package replay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// PartialSuffix is appended to an output file's name while it is being
// written. A file under its final name is complete; a .partial one never is.
const PartialSuffix = ".partial"

// fileChunk is how much an atomicFile buffers before handing bytes to its
// writing goroutine.
const fileChunk = 1 << 20

// atomicFile writes NAME.partial and renames it to NAME on commit.
//
// Invariant: NAME appears only after every byte was written and fsynced, and
// the rename is the last step, so a crash or Ctrl-C at any point leaves either
// the previous NAME (or none) or a complete new one, never a truncated file
// under the final name.
//
// The write(2) calls run on a goroutine of the file, two 1 MiB buffers
// taking turns, so that copying a JSON-lines output (hundreds of bytes per
// record) into the page cache overlaps with computing the next records.
// Write must be called from one goroutine at a time.
type atomicFile struct {
	name string
	f    *os.File
	buf  []byte      // being filled by Write
	free chan []byte // empty buffers back from the writer
	full chan []byte // buffers for the writer, in order
	errc chan error  // the writer's first error, for Write to fail fast
	done chan struct{}
	err  error // the writer's first error; read after done
	shut bool  // full is closed
	gone bool  // committed or aborted
}

func createAtomic(name string) (*atomicFile, error) {
	f, err := os.OpenFile(name+PartialSuffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create output: %w", err)
	}
	// Each channel can hold both buffers, so neither side ever waits for
	// the other to take one back (stop hands over the last one and closes).
	a := &atomicFile{
		name: name, f: f, buf: make([]byte, 0, fileChunk),
		free: make(chan []byte, 2), full: make(chan []byte, 2),
		errc: make(chan error, 1), done: make(chan struct{}),
	}
	a.free <- make([]byte, 0, fileChunk)
	go a.write()
	return a, nil
}

func (a *atomicFile) write() {
	defer close(a.done)
	for b := range a.full {
		if a.err == nil {
			if _, err := a.f.Write(b); err != nil {
				a.err = err
				a.errc <- err
			}
		}
		a.free <- b[:0]
	}
}

func (a *atomicFile) Write(p []byte) (int, error) {
	a.buf = append(a.buf, p...)
	if len(a.buf) >= fileChunk {
		a.full <- a.buf
		select {
		case err := <-a.errc:
			a.errc <- err
			return 0, fmt.Errorf("write %s: %w", a.name+PartialSuffix, err)
		case a.buf = <-a.free:
		}
	}
	return len(p), nil
}

// stop hands over what is buffered (when flush) and waits for the writer.
func (a *atomicFile) stop(flush bool) error {
	if !a.shut {
		a.shut = true
		if flush && len(a.buf) > 0 {
			a.full <- a.buf
		}
		a.buf = nil
		close(a.full)
	}
	<-a.done
	return a.err
}

// commit writes the rest, syncs and renames the partial file to its final
// name, then syncs the directory so the rename itself survives a crash.
func (a *atomicFile) commit() error {
	if a.gone {
		return nil
	}
	a.gone = true
	partial := a.name + PartialSuffix
	err := a.stop(true)
	if err == nil {
		err = a.f.Sync()
	}
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(partial, a.name)
	}
	if err != nil {
		_ = os.Remove(partial)
		return fmt.Errorf("write %s: %w", a.name, err)
	}
	if d, err := os.Open(filepath.Dir(a.name)); err == nil {
		_ = d.Sync() // best effort: not every filesystem can sync a directory
		_ = d.Close()
	}
	return nil
}

// abort removes the partial file. An interrupted replay's output is not a
// prefix anyone should use (partitions are written one after another, so it
// may miss whole partitions), so it is not kept.
func (a *atomicFile) abort() error {
	if a.gone {
		return nil
	}
	a.gone = true
	_ = a.stop(false)
	return errors.Join(a.f.Close(), os.Remove(a.name+PartialSuffix))
}
