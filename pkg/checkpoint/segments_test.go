package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"
)

// TestSegmentStores: every store keeps segments apart from snapshots and from
// each other, returns them verified, and deletes them on request only.
func TestSegmentStores(t *testing.T) {
	ctx := context.Background()
	key := Key{Group: "g", Topic: "t", Partition: 2}
	other := Key{Group: "g", Topic: "t", Partition: 5}
	for _, tc := range []struct {
		name    string
		store   func(t *testing.T) SegmentStore
		corrupt func(t *testing.T, s SegmentStore, ref []byte) // nil: the store cannot be damaged from outside
	}{
		{"file", func(t *testing.T) SegmentStore {
			fs, err := NewFileStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return fs
		}, func(t *testing.T, s SegmentStore, ref []byte) {
			path, err := s.(*FileStore).segmentPath(key, ref)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 1
			writeFile(t, path, b)
		}},
		{"memory", func(*testing.T) SegmentStore { return NewMemoryStore() }, nil},
		{"kafka", func(t *testing.T) SegmentStore { s, _ := newFakeKafkaStore(t, 100); return s }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.store(t)
			big := bytes.Repeat([]byte("segment "), 100) // several Kafka chunks
			mustSave(t, st, key, Snapshot{Next: 7, State: []byte("snap")})
			a, err := st.PutSegment(ctx, key, big)
			if err != nil {
				t.Fatalf("PutSegment: %v", err)
			}
			b, err := st.PutSegment(ctx, key, []byte("second"))
			if err != nil {
				t.Fatalf("PutSegment: %v", err)
			}
			if _, err := st.PutSegment(ctx, other, []byte("other partition")); err != nil {
				t.Fatalf("PutSegment: %v", err)
			}
			if bytes.Equal(a, b) {
				t.Fatalf("two segments got the same reference %q", a)
			}
			for _, want := range []struct {
				ref  []byte
				data []byte
			}{{a, big}, {b, []byte("second")}} {
				got, err := st.GetSegment(ctx, key, want.ref)
				if err != nil || !bytes.Equal(got, want.data) {
					t.Fatalf("GetSegment: %d bytes, %v; want %d bytes", len(got), err, len(want.data))
				}
			}
			if ls, ok := st.(SegmentLister); ok {
				segs, err := ls.ListSegments(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				var refs []string
				for _, sg := range segs {
					refs = append(refs, string(sg.Ref))
					if time.Since(sg.Written) > time.Minute || sg.Written.After(time.Now()) {
						t.Fatalf("segment written at %v, not just now", sg.Written)
					}
				}
				slices.Sort(refs)
				if want := slices.Sorted(slices.Values([]string{string(a), string(b)})); !slices.Equal(refs, want) {
					t.Fatalf("ListSegments = %q, want this partition's %q", refs, want)
				}
			}
			if l := mustLoad(t, st, key); l.Next != 7 || string(l.State) != "snap" {
				t.Fatalf("snapshot changed by segments: %+v", l)
			}
			if err := st.DeleteSegment(ctx, key, a); err != nil {
				t.Fatalf("DeleteSegment: %v", err)
			}
			if err := st.DeleteSegment(ctx, key, a); err != nil {
				t.Fatalf("DeleteSegment again: %v", err)
			}
			// (Kafka keeps a tombstoned chunk readable until compaction.)
			if _, err := st.GetSegment(ctx, key, a); tc.name != "kafka" && !errors.Is(err, ErrNotFound) {
				t.Fatalf("deleted segment: %v, want ErrNotFound", err)
			}
			if got, err := st.GetSegment(ctx, key, b); err != nil || string(got) != "second" {
				t.Fatalf("the other segment after a delete: %q, %v", got, err)
			}
			if ls, ok := st.(SegmentLister); ok {
				segs, err := ls.ListSegments(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if len(segs) != 1 || !bytes.Equal(segs[0].Ref, b) {
					t.Fatalf("ListSegments after deleting one of two: %d segments, want only the other", len(segs))
				}
			}
			if _, err := st.GetSegment(ctx, key, []byte("../../etc/passwd")); err == nil {
				t.Fatalf("malformed reference: no error")
			}
			if tc.corrupt != nil {
				tc.corrupt(t, st, b)
				if _, err := st.GetSegment(ctx, key, b); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("damaged segment: %v, want ErrCorrupt", err)
				}
			}
		})
	}
}
