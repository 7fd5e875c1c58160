package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/velocity-consumer/velocity-consumer/internal/kfaketest"
)

// newFakeKafkaStore returns a KafkaStore on an in-process kfake cluster (the
// real-broker behaviour is covered by integration/). chunk is tiny so that
// every snapshot spans several chunks.
func newFakeKafkaStore(t *testing.T, chunk int) (*KafkaStore, []string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return openFake(t, c.ListenAddrs(), chunk), c.ListenAddrs()
}

func openFake(t *testing.T, addrs []string, chunk int) *KafkaStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := NewKafkaStore(ctx, KafkaConfig{Brokers: addrs, Topic: DefaultKafkaTopic("grp/1"), Partitions: 3, ChunkBytes: chunk})
	if err != nil {
		t.Fatalf("NewKafkaStore: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestDefaultKafkaTopic(t *testing.T) {
	for _, tc := range []struct{ group, want string }{
		{"velocity", "__velocity-snapshots-velocity"},
		{"team/a b", "__velocity-snapshots-team_a_b"},
	} {
		if got := DefaultKafkaTopic(tc.group); got != tc.want {
			t.Errorf("DefaultKafkaTopic(%q) = %q, want %q", tc.group, got, tc.want)
		}
	}
}

func TestManifestRoundTripAndDamage(t *testing.T) {
	m := manifest{Epoch: 5<<32 | 3, HasCur: true, Cur: entry{Gen: 7, Nonce: 99, Next: 1234, Chunks: 3, Length: 2500, CRC: 0xdeadbeef, Partition: 2, First: 40}, HasPrev: true,
		Prev: entry{Gen: 6, Nonce: 1, Next: 1000, Chunks: 1, Length: 10, CRC: 5, Partition: 2, First: 30}}
	b := m.encode()
	got, err := decodeManifest(b)
	if err != nil || got != m {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for i := range b {
		bad := append([]byte(nil), b...)
		bad[i] ^= 0x10
		if _, err := decodeManifest(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipping a bit of byte %d: %v, want ErrCorrupt", i, err)
		}
	}
	if _, err := decodeManifest(b[:len(b)-1]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated manifest: %v", err)
	}
}

func TestKafkaStore(t *testing.T) {
	ctx := context.Background()
	s, addrs := newFakeKafkaStore(t, 64)
	key := Key{Group: "grp/1", Topic: "tx", Partition: 5}
	if _, err := s.Load(ctx, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("empty store: %v, want ErrNotFound", err)
	}
	state := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 100+i*37) }
	for i := 1; i <= 4; i++ {
		mustSave(t, s, key, Snapshot{Next: int64(i * 100), State: state(i)})
	}
	// Another instance (fresh store, nothing cached) sees the newest and the previous.
	other := openFake(t, addrs, 64)
	l := mustLoad(t, other, key)
	if l.Next != 400 || !bytes.Equal(l.State, state(4)) || l.FellBack || l.Previous == nil || l.Previous.Next != 300 || !bytes.Equal(l.Previous.State, state(3)) {
		t.Fatalf("load after four saves: next %d prev %v fellBack %v", l.Next, l.Previous != nil, l.FellBack)
	}
	if _, err := other.Load(ctx, Key{Group: "grp/1", Topic: "tx", Partition: 6}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another partition: %v, want ErrNotFound", err)
	}

	// The other instance continues the chain (a partition moved).
	mustSave(t, other, key, Snapshot{Next: 500, State: state(5)})
	if l = mustLoad(t, s, key); l.Next != 500 || l.Previous == nil || l.Previous.Next != 400 {
		t.Fatalf("after a save from the other instance: next %d", l.Next)
	}

	// Generations 1..3 are tombstoned; 4 and 5 are not.
	live := countLiveChunks(t, addrs, s.topic, s.chunkPartition(key))
	wantLive := chunksOf(s, state(4)) + chunksOf(s, state(5))
	if live != wantLive {
		t.Fatalf("%d live chunk records after tombstoning, want %d (generations 4 and 5)", live, wantLive)
	}

	// A crash mid-Save: chunks of generation 6 without a manifest. Invisible.
	cl := fakeClient(t, addrs)
	e := entry{Gen: 6, Nonce: 1}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: s.topic, Partition: s.chunkPartition(key), Key: chunkKey(key, e, 0), Value: []byte("orphan")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if l = mustLoad(t, openFake(t, addrs, 64), key); l.Next != 500 || l.FellBack {
		t.Fatalf("orphan chunks changed the load: next %d fellBack %v", l.Next, l.FellBack)
	}

	// A manifest whose newest generation lost a chunk: fall back to the previous.
	ms, err := s.refresh(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	m := ms.eff
	broken := manifest{HasCur: true, Cur: m.Cur, HasPrev: true, Prev: m.Prev}
	broken.Cur.Chunks++ // names a chunk that does not exist
	broken.Cur.Length += 64
	produceManifest(t, cl, s, key, broken.encode())
	l = mustLoad(t, openFake(t, addrs, 64), key)
	if !l.FellBack || !errors.Is(l.CorruptErr, ErrCorrupt) || l.Next != 400 || !bytes.Equal(l.State, state(4)) {
		t.Fatalf("missing chunk: next %d fellBack %v err %v, want the previous (400)", l.Next, l.FellBack, l.CorruptErr)
	}

	// A corrupt manifest record is skipped: the one before it stands.
	produceManifest(t, cl, s, key, m.encode())
	produceManifest(t, cl, s, key, []byte("not a manifest"))
	if l = mustLoad(t, openFake(t, addrs, 64), key); l.Next != 500 || l.FellBack {
		t.Fatalf("corrupt manifest record: next %d fellBack %v, want 500", l.Next, l.FellBack)
	}
}

func chunksOf(s *KafkaStore, state []byte) int {
	n := len(Encode(Snapshot{State: state}))
	return (n + s.chunkSize - 1) / s.chunkSize
}

func fakeClient(t *testing.T, addrs []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func produceManifest(t *testing.T, cl *kgo.Client, s *KafkaStore, key Key, v []byte) {
	t.Helper()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: s.topic, Partition: manifestPartition, Key: manifestKey(key), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// countLiveChunks counts chunk keys whose last record is not a tombstone.
func countLiveChunks(t *testing.T, addrs []string, topic string, p int32) int {
	t.Helper()
	s := &KafkaStore{topic: topic, readOpts: []kgo.Opt{kgo.SeedBrokers(addrs...)}}
	cl := fakeClient(t, addrs)
	s.cl = cl
	s.adm = kadmClient(cl)
	last := map[string]bool{}
	if err := s.scan(context.Background(), p, -1, func(r *kgo.Record) bool {
		last[string(r.Key)] = r.Value != nil
		return true
	}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for k, alive := range last {
		if alive {
			n++
		}
		_ = k
	}
	return n
}

func TestKafkaStoreSnapshotLargerThanAChunk(t *testing.T) {
	for _, size := range []int{0, 1, 63, 64, 65, 1000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			s, addrs := newFakeKafkaStore(t, 64)
			key := Key{Group: "g", Topic: "t", Partition: 0}
			st := bytes.Repeat([]byte{7}, size)
			mustSave(t, s, key, Snapshot{Next: 3, State: st})
			if l := mustLoad(t, openFake(t, addrs, 64), key); l.Next != 3 || !bytes.Equal(l.State, st) { // read from the topic
				t.Fatalf("state of %d bytes did not round-trip", size)
			}
		})
	}
}

func kadmClient(cl *kgo.Client) *kadm.Client { return kadm.NewClient(cl) }

// FuzzDecodeManifest: the manifest decoder never panics, rejects with
// ErrCorrupt, and what it accepts re-encodes to the same bytes.
func FuzzDecodeManifest(f *testing.F) {
	f.Add(manifest{Cur: entry{Gen: 1, Chunks: 1, Length: 30}}.encode())
	f.Add(manifest{HasCur: true, Cur: entry{Gen: 3, Nonce: 9, Next: 7, Chunks: 2, Length: 900, Partition: 1, First: 12}, HasPrev: true, Prev: entry{Gen: 2, Chunks: 1}}.encode())
	f.Add([]byte("VMAN"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeManifest(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatalf("accepted manifest re-encodes differently")
		}
	})
}

// fakeWithShortPolls is a one-broker kfake cluster, with idlePoll at 200 ms
// for the test, so that silences are quick to reach.
func fakeWithShortPolls(t *testing.T) *kfake.Cluster {
	t.Helper()
	d := idlePoll
	idlePoll = 200 * time.Millisecond
	t.Cleanup(func() { idlePoll = d })
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestKafkaStoreLoadThroughAStall: the broker stalls fetches for longer than
// idlePoll while a snapshot is loaded (a GC pause, a frozen or restarting
// broker). The silence must not be taken for the end of a compacted range:
// that made a sound snapshot look corrupt ("chunk 0 of 1 missing"), and the
// service stopped on it.
func TestKafkaStoreLoadThroughAStall(t *testing.T) {
	c := fakeWithShortPolls(t)
	s := openFake(t, c.ListenAddrs(), 64)
	key := Key{Group: "g", Topic: "t", Partition: 1}
	want := Snapshot{Next: 42, State: bytes.Repeat([]byte("state "), 50)}
	mustSave(t, s, key, Snapshot{Next: 41, State: []byte("older")})
	mustSave(t, s, key, want)

	s.Close()                                 // its manifest reader would take the stalled fetches
	fresh := openFake(t, c.ListenAddrs(), 64) // nothing read yet: reads the topic
	var stalled atomic.Int32
	stall := 2 * idlePoll
	c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		if stalled.Add(1) <= 3 {
			c.KeepControl()
			c.SleepControl(func() { time.Sleep(stall) })
		}
		return nil, nil, false
	})
	got := mustLoad(t, fresh, key)
	if got.Next != want.Next || !bytes.Equal(got.State, want.State) || got.FellBack {
		t.Fatalf("loaded next %d, %d bytes, fell back %v: want the newest snapshot, intact", got.Next, len(got.State), got.FellBack)
	}
	if stalled.Load() < 3 {
		t.Fatalf("only %d fetches: the stall was not injected", stalled.Load())
	}
}

// TestManifestStateIgnoresOlderOwners: the reader's rule over the manifest
// partition, record by record. A manifest of an older owner that lands after
// a newer owner's claim (it passed its fence check just before the claim) is
// never effective; a tombstone forgets the entries but not the epoch.
func TestManifestStateIgnoresOlderOwners(t *testing.T) {
	key := Key{Group: "g", Topic: "t", Partition: 0}
	want := string(manifestKey(key))
	e := func(gen uint64) entry {
		return entry{Gen: gen, Nonce: gen, Next: int64(gen) * 10, Chunks: 1, Length: 30, Partition: 1}
	}
	m := func(epoch uint64, cur, prev uint64) []byte {
		mf := manifest{Epoch: epoch, HasCur: true, Cur: e(cur)}
		if prev > 0 {
			mf.HasPrev, mf.Prev = true, e(prev)
		}
		return mf.encode()
	}
	const old, newer = 1 << 32, 2 << 32
	recs := []struct {
		key      string
		value    []byte
		wantCur  uint64 // effective Cur.Gen after the record (0: none)
		wantEpoc uint64
	}{
		{want, m(old, 1, 0), 1, old},
		{"m/other/key/0", m(9<<32, 7, 0), 1, old}, // another partition's manifest
		{want, m(old, 2, 1), 2, old},
		{want, manifest{Epoch: newer, HasCur: true, Cur: e(2), HasPrev: true, Prev: e(1)}.encode(), 2, newer}, // the claim
		{want, m(old, 3, 2), 2, newer}, // the old owner, too late
		{want, []byte("garbage"), 2, newer},
		{want, m(newer, 3, 2), 3, newer},
		{want, nil, 0, newer}, // deleted
		{want, m(old, 4, 0), 0, newer},
	}
	st := manifestState{seen: -1}
	for i, r := range recs {
		st.apply(want, &kgo.Record{Key: []byte(r.key), Value: r.value, Offset: int64(i)})
		cur := uint64(0)
		if st.found {
			cur = st.eff.Cur.Gen
		}
		if cur != r.wantCur || st.eff.Epoch != r.wantEpoc || st.seen != int64(i) {
			t.Fatalf("after record %d: effective gen %d epoch %#x seen %d; want gen %d epoch %#x seen %d", i, cur, st.eff.Epoch, st.seen, r.wantCur, r.wantEpoc, i)
		}
	}
}

// TestKafkaStoreReadsToAnEndItCannotSee: the manifest partition ends with an
// offset no reader receives (here a transaction's commit marker, as compaction
// can leave a gap before the end offset), so neither a last record nor the
// high watermark says the end was reached, and only the silence rule ends the
// read: after silentPolls empty polls, with the broker answering and two empty
// fetch answers read. Load must still find the snapshot, and soon.
func TestKafkaStoreReadsToAnEndItCannotSee(t *testing.T) {
	c := fakeWithShortPolls(t)
	s := openFake(t, c.ListenAddrs(), 64)
	key := Key{Group: "g", Topic: "t", Partition: 2}
	want := Snapshot{Next: 7, State: []byte("state")}
	mustSave(t, s, key, want)
	s.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	txn, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("end-marker"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, &kgo.Record{Topic: s.Topic(), Partition: manifestPartition, Key: []byte("not-a-manifest"), Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	fresh := openFake(t, c.ListenAddrs(), 64)
	start := time.Now()
	lctx, lcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer lcancel()
	got, err := fresh.Load(lctx, key)
	if err != nil {
		t.Fatalf("Load after %v: %v", time.Since(start), err)
	}
	if got.Next != want.Next || !bytes.Equal(got.State, want.State) {
		t.Fatalf("loaded next %d %q, want %d %q", got.Next, got.State, want.Next, want.State)
	}
}

// TestKafkaStoreSavesThroughAJustCreatedTopic: the store creates its topic and
// saves at once, and a broker that has not taken the new partitions on yet
// refuses the produces with UNKNOWN_TOPIC_OR_PARTITION, more often than the
// client's default limit of four, on a loaded machine. The Save must wait it
// out, not fail the partition's checkpoint.
func TestKafkaStoreSavesThroughAJustCreatedTopic(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := NewKafkaStore(ctx, KafkaConfig{Brokers: c.ListenAddrs(), Topic: DefaultKafkaTopic("grp/1"), Partitions: 3, ChunkBytes: 64,
		ClientOpts: []kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond })}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	const refusals = 10
	refused := kfaketest.RefuseProduces(c, refusals)
	key := Key{Group: "grp/1", Topic: "tx", Partition: 0}
	want := Snapshot{Next: 7, State: bytes.Repeat([]byte("state "), 40)}
	mustSave(t, s, key, want)
	if n := refused.Load(); n != refusals {
		t.Fatalf("the broker refused %d produces, want %d", n, refusals)
	}
	if got := mustLoad(t, s, key); got.Next != want.Next || !bytes.Equal(got.State, want.State) {
		t.Fatalf("loaded next %d, %d bytes: want the saved snapshot", got.Next, len(got.State))
	}
}

// TestKafkaStoreThroughPartitionErrorsInListings: while the snapshot topic's
// partition leader restarts or moves, the broker answers list-offsets requests
// with an error per partition inside a successful response. Save's fencing
// read and Load's scan must retry those as they retry a failed request: taken
// for final, one stopped the checkpoint, and a failed save stops the service.
func TestKafkaStoreThroughPartitionErrorsInListings(t *testing.T) {
	for _, code := range []*kerr.Error{kerr.NotLeaderForPartition, kerr.LeaderNotAvailable, kerr.UnknownTopicOrPartition} {
		t.Run(code.Message, func(t *testing.T) {
			cl, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			s := openFake(t, cl.ListenAddrs(), 64)
			key := Key{Group: "grp/1", Topic: "tx", Partition: 2}
			want := Snapshot{Next: 9, State: bytes.Repeat([]byte("state "), 30)}
			failed := kfaketest.FailListOffsets(cl, 3, code)
			mustSave(t, s, key, want)
			if n := failed.Load(); n != 3 {
				t.Fatalf("%d list-offsets requests failed, want 3", n)
			}
			failed = kfaketest.FailListOffsets(cl, 3, code)
			fresh := openFake(t, cl.ListenAddrs(), 64)
			if got := mustLoad(t, fresh, key); got.Next != want.Next || !bytes.Equal(got.State, want.State) {
				t.Fatalf("loaded next %d, %d bytes: want the saved snapshot", got.Next, len(got.State))
			}
			if n := failed.Load(); n != 3 {
				t.Fatalf("%d list-offsets requests failed during the load, want 3", n)
			}
		})
	}
}

// TestNewKafkaStoreRidesOutABrokerRestart: the store is opened when the service
// starts, and a broker restarting then (or a proxy in front of it whose backend
// is down) closes connections as soon as a request arrives. Creating the
// snapshot topic is retried through that, as every other request of the store
// is; the service exited at start on the first one ("broker closed the
// connection immediately ... is SASL missing?").
func TestNewKafkaStoreRidesOutABrokerRestart(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var drops atomic.Int32
	c.ControlKey(int16(kmsg.CreateTopics), func(kmsg.Request) (kmsg.Response, error, bool) {
		if drops.Add(1) > 3 {
			return nil, nil, false
		}
		c.KeepControl()
		return nil, errors.New("connection dropped by the test"), true
	})
	s := openFake(t, c.ListenAddrs(), 64)
	if n := drops.Load(); n < 4 {
		t.Fatalf("%d CreateTopics requests: the fault was not injected", n)
	}
	if err := s.Save(context.Background(), Key{Group: "g", Topic: "t", Partition: 0}, Snapshot{Next: 1, State: []byte("state")}); err != nil {
		t.Fatalf("save after the topic was created: %v", err)
	}
}

// TestProduceRetryingAfterAnotherCancellation: records that failed with a
// context's error while the caller's context is alive failed for another
// caller's cancellation (franz-go fails the records buffered behind a
// cancelled one with its error) and are produced again; a failure for the
// caller's own context, or any other error, is returned as it is, and the
// retries are bounded.
func TestProduceRetryingAfterAnotherCancellation(t *testing.T) {
	other := errors.New("NOT_LEADER_FOR_PARTITION")
	for _, tc := range []struct {
		name      string
		fails     []error // the error of each attempt, then success
		cancelled bool    // the caller's own context is cancelled
		wantCalls int
		wantErr   error
	}{
		{"no error", nil, false, 1, nil},
		{"another caller's cancellation, then success", []error{context.Canceled}, false, 2, nil},
		{"another caller's deadline twice, then success", []error{context.DeadlineExceeded, context.DeadlineExceeded}, false, 3, nil},
		{"our own cancellation", []error{context.Canceled}, true, 1, context.Canceled},
		{"another error", []error{other}, false, 1, other},
		{"cancellations without end", slices.Repeat([]error{context.Canceled}, 100), false, cancelRetries + 1, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancelled {
				cancel()
			}
			calls := 0
			produce := func(_ context.Context, recs ...*kgo.Record) kgo.ProduceResults {
				var err error
				if calls < len(tc.fails) {
					err = tc.fails[calls]
				}
				calls++
				res := make(kgo.ProduceResults, len(recs))
				for i, r := range recs {
					if r.Offset != 0 {
						t.Errorf("attempt %d: a record reused with the fields of the attempt before (offset %d)", calls, r.Offset)
					}
					r.Offset = int64(calls) // as franz-go sets it
					res[i] = kgo.ProduceResult{Record: r, Err: err}
				}
				return res
			}
			recs := []*kgo.Record{{Topic: "t", Key: []byte("k"), Value: []byte("v")}, {Topic: "t", Key: []byte("k2")}}
			err := produceRetrying(ctx, produce, recs...).FirstErr()
			if calls != tc.wantCalls || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("%d attempts, error %v; want %d, %v", calls, err, tc.wantCalls, tc.wantErr)
			}
			if string(recs[0].Key) != "k" || string(recs[0].Value) != "v" || recs[1].Value != nil {
				t.Errorf("records changed: %+v %+v", recs[0], recs[1])
			}
		})
	}
}
