package replay

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// PartialSuffix is appended to an output file's name while it is being
// written. A file under its final name is complete; a .partial one never is.
const PartialSuffix = ".partial"

// atomicFile writes NAME.partial and renames it to NAME on commit.
//
// Invariant: NAME appears only after every byte was written and fsynced, and
// the rename is the last step, so a crash or Ctrl-C at any point leaves either
// the previous NAME (or none) or a complete new one, never a truncated file
// under the final name.
type atomicFile struct {
	name string
	f    *os.File
	w    *bufio.Writer
	done bool
}

func createAtomic(name string) (*atomicFile, error) {
	f, err := os.OpenFile(name+PartialSuffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create output: %w", err)
	}
	return &atomicFile{name: name, f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

func (a *atomicFile) Write(p []byte) (int, error) { return a.w.Write(p) }

// commit flushes, syncs and renames the partial file to its final name, then
// syncs the directory so the rename itself survives a crash.
func (a *atomicFile) commit() error {
	if a.done {
		return nil
	}
	a.done = true
	partial := a.name + PartialSuffix
	err := a.w.Flush()
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
	if a.done {
		return nil
	}
	a.done = true
	return errors.Join(a.f.Close(), os.Remove(a.name+PartialSuffix))
}
