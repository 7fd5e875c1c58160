package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		snap Snapshot
	}{
		{"empty state at offset zero", Snapshot{Next: 0, State: nil}},
		{"small state", Snapshot{Next: 42, State: []byte("state")}},
		{"large offset", Snapshot{Next: 1<<62 + 7, State: bytes.Repeat([]byte{0xab}, 1<<16)}},
		{"epoch and seq", Snapshot{Next: 5, State: []byte("s"), Epoch: 3<<32 | 17, Seq: 1 << 40}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Encode(tc.snap)
			if want := frameHeader + len(tc.snap.State) + frameTrailer; len(b) != want {
				t.Fatalf("frame is %d bytes, want %d", len(b), want)
			}
			h, st, tr := frameParts(tc.snap)
			if parts := append(append(append([]byte(nil), h...), st...), tr...); !bytes.Equal(parts, b) {
				t.Fatalf("frameParts differs from Encode")
			}
			got, err := Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got.Next != tc.snap.Next || !bytes.Equal(got.State, tc.snap.State) || got.ID() != tc.snap.ID() {
				t.Fatalf("round trip: got next %d, %d state bytes; want next %d, %d bytes", got.Next, len(got.State), tc.snap.Next, len(tc.snap.State))
			}
		})
	}
}

// TestDecodeRejects checks that every kind of damage is reported as ErrCorrupt,
// never returned as a (half-)valid snapshot.
func TestDecodeRejects(t *testing.T) {
	good := Encode(Snapshot{Next: 9, State: []byte("some partition state")})
	mutate := func(fn func(b []byte) []byte) []byte { return fn(append([]byte(nil), good...)) }
	reframe := func(b []byte) []byte { // fix the CRC after a deliberate header change
		body := b[:len(b)-frameTrailer]
		return binary.BigEndian.AppendUint32(body, crcOf(body))
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"shorter than a frame", good[:frameHeader+frameTrailer-1]},
		{"truncated state", good[:len(good)-frameTrailer-3]},
		{"truncated trailer", good[:len(good)-1]},
		{"torn write: tail zeroed", mutate(func(b []byte) []byte { clear(b[len(b)/2:]); return b })},
		{"flipped state bit", mutate(func(b []byte) []byte { b[frameHeader+2] ^= 1; return b })},
		{"flipped crc bit", mutate(func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b })},
		{"bad magic", mutate(func(b []byte) []byte { b[0] = 'X'; return reframe(b) })},
		{"unknown version", mutate(func(b []byte) []byte { b[5] = 99; return reframe(b) })},
		{"length field lies", mutate(func(b []byte) []byte { b[frameHeader-1]++; return reframe(b) })},
		{"negative next", mutate(func(b []byte) []byte { b[6] = 0x80; return reframe(b) })},
		{"trailing garbage", append(append([]byte(nil), good...), 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, err := Decode(tc.b)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode = (next %d, %d bytes), %v; want ErrCorrupt", snap.Next, len(snap.State), err)
			}
		})
	}
}

// TestStoresFallBack runs every store through the same story: nothing, one
// snapshot, two, then the newest damaged.
func TestStoresFallBack(t *testing.T) {
	ctx := context.Background()
	key := Key{Group: "g/with slash", Topic: "tx", Partition: 3}
	type corrupter func(t *testing.T)
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) (Store, corrupter)
	}{
		{"file", func(t *testing.T) (Store, corrupter) {
			fs, err := NewFileStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			_, cur, _ := fs.paths(key)
			return fs, func(t *testing.T) {
				b, err := os.ReadFile(cur)
				if err != nil {
					t.Fatal(err)
				}
				// A torn write: the file has its length but the tail never reached the disk.
				clear(b[len(b)-8:])
				if err := os.WriteFile(cur, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"memory", func(t *testing.T) (Store, corrupter) {
			ms := NewMemoryStore()
			return ms, func(t *testing.T) {
				ms.mu.Lock()
				pair := ms.snaps[key]
				pair[0] = pair[0][:len(pair[0])-1]
				ms.snaps[key] = pair
				ms.mu.Unlock()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, corrupt := tc.store(t)
			defer st.Close()
			if _, err := st.Load(ctx, key); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Load of an empty store: %v, want ErrNotFound", err)
			}
			mustSave(t, st, key, Snapshot{Next: 10, State: []byte("ten")})
			l := mustLoad(t, st, key)
			if l.Next != 10 || string(l.State) != "ten" || l.FellBack || l.Previous != nil {
				t.Fatalf("after one save: %+v", l)
			}
			mustSave(t, st, key, Snapshot{Next: 20, State: []byte("twenty")})
			l = mustLoad(t, st, key)
			if l.Next != 20 || l.FellBack || l.Previous == nil || l.Previous.Next != 10 || string(l.Previous.State) != "ten" {
				t.Fatalf("after two saves: %+v", l)
			}
			other := key
			other.Partition++
			if _, err := st.Load(ctx, other); !errors.Is(err, ErrNotFound) {
				t.Fatalf("another partition sees a snapshot: %v", err)
			}
			corrupt(t)
			l = mustLoad(t, st, key)
			if !l.FellBack || !errors.Is(l.CorruptErr, ErrCorrupt) || l.Next != 10 || string(l.State) != "ten" || l.Previous != nil {
				t.Fatalf("after corrupting the newest: %+v, want the previous with FellBack", l)
			}
		})
	}
}

// TestFileStoreCrashStates checks the states a crash can leave between the
// steps of FileStore.Save.
func TestFileStoreCrashStates(t *testing.T) {
	ctx := context.Background()
	key := Key{Group: "g", Topic: "t", Partition: 0}
	for _, tc := range []struct {
		name     string
		setup    func(t *testing.T, fs *FileStore)
		wantNext int64
		wantErr  error
		fellBack bool
	}{
		{"crash before the renames leaves a stray tmp", func(t *testing.T, fs *FileStore) {
			mustSave(t, fs, key, Snapshot{Next: 5, State: []byte("a")})
			_, cur, _ := fs.paths(key)
			writeFile(t, cur+".tmp", Encode(Snapshot{Next: 6, State: []byte("b")})[:7])
		}, 5, nil, false},
		{"crash between the renames: only .prev", func(t *testing.T, fs *FileStore) {
			mustSave(t, fs, key, Snapshot{Next: 5, State: []byte("a")})
			_, cur, prev := fs.paths(key)
			if err := os.Rename(cur, prev); err != nil {
				t.Fatal(err)
			}
		}, 5, nil, false},
		{"both damaged", func(t *testing.T, fs *FileStore) {
			_, cur, prev := fs.paths(key)
			writeFile(t, cur, []byte("garbage"))
			writeFile(t, prev, []byte("more garbage"))
		}, 0, ErrCorrupt, false},
		{"only a damaged .prev", func(t *testing.T, fs *FileStore) {
			_, _, prev := fs.paths(key)
			writeFile(t, prev, []byte("garbage"))
		}, 0, ErrCorrupt, false},
		{"damaged newest, good previous", func(t *testing.T, fs *FileStore) {
			mustSave(t, fs, key, Snapshot{Next: 5, State: []byte("a")})
			mustSave(t, fs, key, Snapshot{Next: 6, State: []byte("b")})
			_, cur, _ := fs.paths(key)
			writeFile(t, cur, Encode(Snapshot{Next: 6, State: []byte("b")})[:10])
		}, 5, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := NewFileStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			tc.setup(t, fs)
			l, err := fs.Load(ctx, key)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Load: %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if l.Next != tc.wantNext || l.FellBack != tc.fellBack {
				t.Fatalf("Load = next %d fellBack %v, want %d %v", l.Next, l.FellBack, tc.wantNext, tc.fellBack)
			}
		})
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustSave(t *testing.T, st Store, key Key, snap Snapshot) {
	t.Helper()
	if err := st.Save(context.Background(), key, snap); err != nil {
		t.Fatalf("Save %s next %d: %v", key, snap.Next, err)
	}
}

func mustLoad(t *testing.T, st Store, key Key) Loaded {
	t.Helper()
	l, err := st.Load(context.Background(), key)
	if err != nil {
		t.Fatalf("Load %s: %v", key, err)
	}
	return l
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to the
// same bytes (no two framings of one snapshot, nothing ignored).
func FuzzDecode(f *testing.F) {
	f.Add(Encode(Snapshot{Next: 1, State: []byte("x")}))
	f.Add(Encode(Snapshot{}))
	f.Add([]byte("VSNP"))
	f.Fuzz(func(t *testing.T, b []byte) {
		snap, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if again := Encode(snap); !bytes.Equal(again, b) {
			t.Fatalf("accepted frame re-encodes differently")
		}
	})
}

// TestFileStoreConcurrentSavers: two owners of one partition (a zombie and the
// new owner) saving to one directory at once must not break each other's Save,
// and what is left must be a complete snapshot one of them wrote.
func TestFileStoreConcurrentSavers(t *testing.T) {
	ctx := context.Background()
	key := Key{Group: "g", Topic: "t", Partition: 3}
	dir := t.TempDir()
	const writers, saves = 4, 40
	errs := make(chan error, writers*saves)
	done := make(chan struct{})
	for w := range writers {
		fs, err := NewFileStore(dir) // one store per process, as in production
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range saves {
				state := bytes.Repeat([]byte{byte(w)}, 64<<10)
				errs <- fs.Save(ctx, key, Snapshot{Next: int64(w*1000 + i), State: state})
			}
		}()
	}
	for range writers {
		<-done
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Save beside another saver: %v", err)
		}
	}
	fs, _ := NewFileStore(dir)
	l := mustLoad(t, fs, key)
	w := int(l.Next / 1000)
	if l.FellBack || w >= writers || l.Next%1000 >= saves || !bytes.Equal(l.State, bytes.Repeat([]byte{byte(w)}, 64<<10)) {
		t.Fatalf("after concurrent saves: next %d, fellBack %v, %d state bytes: not a snapshot a writer saved", l.Next, l.FellBack, len(l.State))
	}
	if l.Previous == nil {
		t.Fatalf("after concurrent saves: no previous snapshot kept")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*"+tmpSuffix)); len(left) != 0 {
		t.Fatalf("temporary files left behind by finished saves: %v", left)
	}
}

// TestFileStoreRemovesStaleTemps: Load removes a crashed Save's temporary
// files once they are old, and leaves a fresh one (a Save may be running).
func TestFileStoreRemovesStaleTemps(t *testing.T) {
	fs, err := NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	key := Key{Group: "g", Topic: "t", Partition: 0}
	mustSave(t, fs, key, Snapshot{Next: 5, State: []byte("a")})
	_, cur, _ := fs.paths(key)
	old := time.Now().Add(-2 * staleTemp)
	for _, tc := range []struct {
		name   string
		mtime  time.Time
		remain bool
	}{
		{cur + ".tmp", old, false}, // the name before unique names
		{cur + ".123456" + tmpSuffix, old, false},
		{cur + ".654321" + tmpSuffix, time.Now(), true},
	} {
		writeFile(t, tc.name, []byte("partial"))
		if err := os.Chtimes(tc.name, tc.mtime, tc.mtime); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, err := os.Stat(tc.name)
			if exists := err == nil; exists != tc.remain {
				t.Errorf("%s: exists %v after Load, want %v", filepath.Base(tc.name), exists, tc.remain)
			}
		}()
	}
	if l := mustLoad(t, fs, key); l.Next != 5 {
		t.Fatalf("Load next %d, want 5", l.Next)
	}
}

// TestDecodeVersion1 reads a frame of the first version (no epoch, no seq), as
// stores written before owner epochs hold: it decodes with the zero ID.
func TestDecodeVersion1(t *testing.T) {
	state := []byte("old state")
	b := append([]byte("VSNP"), 0, 1)
	b = binary.BigEndian.AppendUint64(b, 77)
	b = binary.BigEndian.AppendUint64(b, uint64(len(state)))
	b = append(b, state...)
	b = binary.BigEndian.AppendUint32(b, crcOf(b))
	got, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode of a version 1 frame: %v", err)
	}
	if got.Next != 77 || !bytes.Equal(got.State, state) || got.ID() != (ID{}) {
		t.Fatalf("version 1 frame decoded as next %d state %q id %+v", got.Next, got.State, got.ID())
	}
}

func TestNextEpoch(t *testing.T) {
	for _, tc := range []struct {
		highest  uint64
		tiebreak uint32
		want     uint64
	}{
		{0, 0, 1 << 32},
		{0, 9, 1<<32 | 9},
		{1<<32 | 9, 3, 2<<32 | 3},  // a lower generation still claims above
		{7<<32 | 1, 1, 8<<32 | 1},  // the counter decides first
		{7<<32 | 99, 0, 8<<32 | 0}, // whatever the tiebreak was
	} {
		if got := NextEpoch(tc.highest, tc.tiebreak); got != tc.want || got <= tc.highest {
			t.Errorf("NextEpoch(%#x, %d) = %#x, want %#x (above the highest)", tc.highest, tc.tiebreak, got, tc.want)
		}
	}
}

// TestStoresFenceOldOwners: two handles on one store's storage play two
// instances. A owns the partition and saves; B claims it; from then on every
// Save of A fails with ErrFenced and Load returns what B saved, never what A
// tried to save after the claim. A later claim by A (it got the partition back)
// fences B in turn.
func TestStoresFenceOldOwners(t *testing.T) {
	ctx := context.Background()
	key := Key{Group: "g", Topic: "t", Partition: 1}
	for _, tc := range []struct {
		name string
		pair func(t *testing.T) (a, b Store)
	}{
		{"file", func(t *testing.T) (Store, Store) {
			dir := t.TempDir()
			a, err := NewFileStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := NewFileStore(dir)
			return a, b
		}},
		{"memory", func(t *testing.T) (Store, Store) { m := NewMemoryStore(); return m, m }},
		{"kafka", func(t *testing.T) (Store, Store) {
			a, addrs := newFakeKafkaStore(t, 64)
			return a, openFake(t, addrs, 64)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.pair(t)
			ea, err := a.Claim(ctx, key, 1)
			if err != nil {
				t.Fatalf("A claims: %v", err)
			}
			mustSave(t, a, key, Snapshot{Next: 10, State: []byte("a10"), Epoch: ea, Seq: 1})
			eb, err := b.Claim(ctx, key, 2)
			if err != nil {
				t.Fatalf("B claims: %v", err)
			}
			if eb <= ea {
				t.Fatalf("B's epoch %#x is not above A's %#x", eb, ea)
			}
			if l := mustLoad(t, b, key); l.Next != 10 || string(l.State) != "a10" {
				t.Fatalf("after B's claim, Load = next %d %q; want A's last save (10)", l.Next, l.State)
			}
			err = a.Save(ctx, key, Snapshot{Next: 20, State: []byte("a20"), Epoch: ea, Seq: 2})
			if !errors.Is(err, ErrFenced) {
				t.Fatalf("A saves after B's claim: %v, want ErrFenced", err)
			}
			for _, st := range []Store{a, b} {
				if l := mustLoad(t, st, key); l.Next != 10 || string(l.State) != "a10" {
					t.Fatalf("A's fenced save was loaded: next %d %q", l.Next, l.State)
				}
			}
			mustSave(t, b, key, Snapshot{Next: 15, State: []byte("b15"), Epoch: eb, Seq: 1})
			if l := mustLoad(t, a, key); l.Next != 15 || l.ID() != (ID{eb, 1}) || l.Previous == nil || l.Previous.Next != 10 {
				t.Fatalf("after B's save: %+v", l)
			}
			ea2, err := a.Claim(ctx, key, 1)
			if err != nil || ea2 <= eb {
				t.Fatalf("A claims back: epoch %#x, %v; want above %#x", ea2, err, eb)
			}
			if err := b.Save(ctx, key, Snapshot{Next: 30, State: []byte("b30"), Epoch: eb, Seq: 2}); !errors.Is(err, ErrFenced) {
				t.Fatalf("B saves after A claimed back: %v, want ErrFenced", err)
			}
			mustSave(t, a, key, Snapshot{Next: 40, State: []byte("a40"), Epoch: ea2, Seq: 1})
			if l := mustLoad(t, b, key); l.Next != 40 || l.Previous == nil || l.Previous.Next != 15 {
				t.Fatalf("after A's save: next %d prev %+v; want 40 then 15", l.Next, l.Previous)
			}
		})
	}
}
