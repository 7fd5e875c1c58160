package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FileStore keeps each partition's snapshot in DIR/<group>/<topic>/<partition>.snap
// with the previous one beside it as .prev.
//
// Crash-safety invariant: a Save that returned is durable (data fsynced, rename
// fsynced in its directory), and at every instant at least one of .snap and .prev
// holds a complete frame written by a finished Save. A crash mid-Save leaves at
// worst a stray temporary file, which Load ignores and removes once it is an
// hour old.
//
// Two processes may Save the same partition at once: a zombie that has not yet
// seen its partition revoked and the new owner, sharing one volume. Each Save
// writes its own uniquely named temporary file, so neither can truncate or
// rename away the other's. Fencing: <partition>.owner holds the highest owner
// epoch claimed, and Claim and Save hold an exclusive lock on
// <partition>.lock (flock) while they read it and write, so a Save with a
// lower epoch than the claim is refused (ErrFenced), and one that passed the
// check finishes before the claim can return. (flock serialises processes on
// one machine; on a network file system that does not honour it, give each
// instance its own directory, or use the kafka store.)
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

// lock takes the partition's exclusive lock, creating its directory, and
// returns the function that releases it.
func (s *FileStore) lock(key Key) (unlock func(), err error) {
	dir, cur, _ := s.paths(key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(strings.TrimSuffix(cur, ".snap")+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil // closing the descriptor releases the lock
}

func (s *FileStore) ownerPath(key Key) string {
	_, cur, _ := s.paths(key)
	return strings.TrimSuffix(cur, ".snap") + ".owner"
}

// claimed reads the partition's claimed epoch (0: never claimed).
func (s *FileStore) claimed(key Key) (uint64, error) {
	b, err := os.ReadFile(s.ownerPath(key))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	e, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrCorrupt, s.ownerPath(key), err)
	}
	return e, nil
}

// Claim implements Store.
func (s *FileStore) Claim(_ context.Context, key Key, tiebreak uint32) (uint64, error) {
	unlock, err := s.lock(key)
	if err != nil {
		return 0, fmt.Errorf("claim %s: %w", key, err)
	}
	defer unlock()
	highest, err := s.claimed(key)
	if err != nil {
		return 0, fmt.Errorf("claim %s: %w", key, err)
	}
	e := NextEpoch(highest, tiebreak)
	owner := s.ownerPath(key)
	dir := filepath.Dir(owner)
	tmp, err := writeTemp(dir, filepath.Base(owner)+".*"+tmpSuffix, []byte(strconv.FormatUint(e, 10)+"\n"))
	if err != nil {
		return 0, fmt.Errorf("claim %s: %w", key, err)
	}
	if err := os.Rename(tmp, owner); err != nil {
		os.Remove(tmp)
		return 0, fmt.Errorf("claim %s: %w", key, err)
	}
	if err := syncDir(dir); err != nil {
		return 0, fmt.Errorf("claim %s: sync directory: %w", key, err)
	}
	return e, nil
}

// Save implements Store.
func (s *FileStore) Save(_ context.Context, key Key, snap Snapshot) error {
	dir, cur, prev := s.paths(key)
	unlock, err := s.lock(key)
	if err != nil {
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}
	defer unlock()
	c, err := s.claimed(key)
	if err != nil {
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}
	if snap.writer() < c {
		return fmt.Errorf("save snapshot %s with epoch %d, claimed %d: %w", key, snap.writer(), c, ErrFenced)
	}
	h, st, tr := frameParts(snap)
	tmp, err := writeTemp(dir, filepath.Base(cur)+".*"+tmpSuffix, h, st, tr)
	if err != nil {
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}
	// Keep the previous snapshot: if the new one is ever found corrupt, Load
	// falls back to it.
	if err := os.Rename(cur, prev); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("save snapshot %s: keep previous: %w", key, err)
	}
	if err := os.Rename(tmp, cur); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("save snapshot %s: sync directory: %w", key, err)
	}
	return nil
}

// tmpSuffix ends the name of a snapshot being written.
const tmpSuffix = ".tmp"

// staleTemp is how old a temporary file must be before Load removes it: far
// longer than any Save takes, so only a crashed Save's leftovers qualify.
const staleTemp = time.Hour

// writeTemp writes the parts to a new file in dir named after pattern (see
// os.CreateTemp) and fsyncs it. The parts are written as they are (no
// concatenated copy: a state can be a hundred megabytes).
func writeTemp(dir, pattern string, parts ...[]byte) (string, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(f.Name())
		return "", err
	}
	// CreateTemp makes the file private; snapshots were always 0644.
	if err := f.Chmod(0o644); err != nil {
		return fail(err)
	}
	for _, data := range parts {
		if _, err := f.Write(data); err != nil {
			return fail(err)
		}
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// removeStaleTemps deletes the partition's temporary files older than
// staleTemp. Errors are ignored: a leftover file costs disk, never correctness.
func removeStaleTemps(cur string, now time.Time) {
	// Both the old fixed name (<p>.snap.tmp) and the unique ones match.
	names, _ := filepath.Glob(cur + "*" + tmpSuffix)
	for _, name := range names {
		if fi, err := os.Stat(name); err == nil && now.Sub(fi.ModTime()) > staleTemp {
			os.Remove(name)
		}
	}
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
	removeStaleTemps(cur, time.Now())
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
