package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
)

// FileStore keeps each partition's snapshot in DIR/<group>/<topic>/<partition>.snap
// with the previous one beside it as .prev.
//
// Crash-safety invariant: a Save that returned is durable (data fsynced, rename
// fsynced in its directory), and at every instant at least one of .snap and .prev
// holds a complete frame written by a finished Save. A crash mid-Save leaves at
// worst a stray .tmp file, which Load ignores.
type FileStore struct {
	dir string
}

// NewFileStore creates dir if needed.
func NewFileStore(dir string) (*FileStore, error) {
	if dir == "" {
		return nil, errors.New("checkpoint: file store needs a directory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: create %s: %w", dir, err)
	}
	return &FileStore{dir: dir}, nil
}

func (s *FileStore) paths(key Key) (dir, cur, prev string) {
	dir = filepath.Join(s.dir, url.PathEscape(key.Group), url.PathEscape(key.Topic))
	base := filepath.Join(dir, strconv.Itoa(int(key.Partition)))
	return dir, base + ".snap", base + ".prev"
}

// Save implements Store.
func (s *FileStore) Save(_ context.Context, key Key, snap Snapshot) error {
	dir, cur, prev := s.paths(key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}
	tmp := cur + ".tmp"
	h, st, tr := frameParts(snap)
	if err := writeSync(tmp, h, st, tr); err != nil {
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}
	// Keep the previous snapshot: if the new one is ever found corrupt, Load
	// falls back to it.
	if err := os.Rename(cur, prev); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("save snapshot %s: keep previous: %w", key, err)
	}
	if err := os.Rename(tmp, cur); err != nil {
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("save snapshot %s: sync directory: %w", key, err)
	}
	return nil
}

// writeSync writes the parts to path and fsyncs it. The parts are written as
// they are (no concatenated copy: a state can be a hundred megabytes).
func writeSync(path string, parts ...[]byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	for _, data := range parts {
		if _, err := f.Write(data); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Load implements Store.
func (s *FileStore) Load(_ context.Context, key Key) (Loaded, error) {
	_, cur, prev := s.paths(key)
	newest, errCur := readFrame(cur)
	older, errPrev := readFrame(prev)
	if errCur == nil {
		l := Loaded{Snapshot: newest}
		if errPrev == nil {
			l.Previous = &older
		}
		return l, nil
	}
	switch {
	case errPrev == nil && errors.Is(errCur, os.ErrNotExist):
		// Crash between the two renames of a Save: .prev is the newest complete one.
		return Loaded{Snapshot: older}, nil
	case errPrev == nil:
		return Loaded{Snapshot: older, FellBack: true, CorruptErr: fmt.Errorf("%s: %w", cur, errCur)}, nil
	case errors.Is(errCur, os.ErrNotExist) && errors.Is(errPrev, os.ErrNotExist):
		return Loaded{}, ErrNotFound
	case errors.Is(errCur, os.ErrNotExist):
		return Loaded{}, fmt.Errorf("load snapshot %s: %w", key, errPrev)
	default:
		return Loaded{}, fmt.Errorf("load snapshot %s: newest: %w; previous: %v", key, errCur, errPrev)
	}
}

func readFrame(path string) (Snapshot, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Snapshot{}, err
	}
	return Decode(b)
}

// Close implements Store.
func (s *FileStore) Close() error { return nil }
