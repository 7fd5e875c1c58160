package service

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
)

// losingStore is a file store that, once lose is set, has lost the dedupe
// segment each partition wrote last: one the newest snapshot lists and the
// previous one cannot.
type losingStore struct {
	*checkpoint.FileStore
	mu   sync.Mutex
	last map[checkpoint.Key][]byte
	lose atomic.Bool
	lost atomic.Int64 // reads of the lost segment
	read atomic.Int64 // reads of other segments after the loss
	puts atomic.Int64
}

func (s *losingStore) PutSegment(ctx context.Context, key checkpoint.Key, data []byte) ([]byte, error) {
	ref, err := s.FileStore.PutSegment(ctx, key, data)
	if err == nil {
		s.puts.Add(1)
		s.mu.Lock()
		s.last[key] = ref
		s.mu.Unlock()
	}
	return ref, err
}

func (s *losingStore) GetSegment(ctx context.Context, key checkpoint.Key, ref []byte) ([]byte, error) {
	s.mu.Lock()
	last := s.last[key]
	s.mu.Unlock()
	if s.lose.Load() && bytes.Equal(ref, last) {
		s.lost.Add(1)
		return nil, checkpoint.ErrNotFound
	}
	if s.lose.Load() {
		s.read.Add(1)
	}
	return s.FileStore.GetSegment(ctx, key, ref)
}

// TestServiceRestartWithALostSegment: the service keeps its dedupe ids in
// segments, and when a segment the newest snapshot lists is gone, a restart
// still gives every output the oracle gives. The default mode resumes from
// the previous snapshot (records after it are read again, as at least once
// allows); exactly-once rebuilds from the committed offset, once each.
func TestServiceRestartWithALostSegment(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) { testLostSegment(t, eos) })
	}
}

func testLostSegment(t *testing.T, eos bool) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 5, 2000, partitions)
	fs, err := checkpoint.NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &losingStore{FileStore: fs, last: map[checkpoint.Key][]byte{}}
	cfg := testConfig(t, brokers, store)
	cfg.ExactlyOnce = eos
	// Two snapshots at least, each with a segment of its own: one after the
	// first 500 records (a background checkpoint: the interval is 200 ms),
	// the newest after the next 500.
	_, stop := startService(t, cfg)
	produce(t, brokers, st.Records[:500])
	readOutputs(t, brokers, 500, 30*time.Second)
	time.Sleep(3 * cfg.CheckpointInterval)
	produce(t, brokers, st.Records[500:1000])
	readOutputs(t, brokers, 1000, 30*time.Second)
	stop()
	if store.puts.Load() == 0 {
		t.Fatal("no dedupe segment was written: the snapshots do not use segments")
	}
	store.lose.Store(true)
	produce(t, brokers, st.Records[1000:])
	startService(t, cfg)
	got := readOutputs(t, brokers, len(st.Records), 60*time.Second)
	streamtest.Check(t, st, cfg.Specs, got, eos)
	if store.lost.Load() == 0 {
		t.Fatal("the restart never asked for the lost segment")
	}
	if !eos && store.read.Load() == 0 {
		t.Fatal("the default mode rebuilt instead of restoring the previous snapshot, whose segments are all there")
	}
}

// TestServiceSweepsUnlistedSegments: at its first save an owner deletes the
// partition's segments that no kept snapshot lists (a crashed owner's), but
// not a young one (a checkpoint in progress may be about to list it), and
// never its own.
func TestServiceSweepsUnlistedSegments(t *testing.T) {
	ctx := context.Background()
	brokers, dir, fs, cfg, key := fileStoreSetup(t)
	orphan, err := fs.PutSegment(ctx, key, []byte("left by a crash"))
	if err != nil {
		t.Fatal(err)
	}
	young, err := fs.PutSegment(ctx, key, []byte("being listed"))
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * segmentSweepAge)
	if err := os.Chtimes(filepath.Join(dir, cfg.Group, inTopic, "0.seg-"+string(orphan)), old, old); err != nil {
		t.Fatal(err)
	}
	st := streamtest.Generate(inTopic, 6, 500, 1)
	produce(t, brokers, st.Records)
	_, stop := startService(t, cfg)
	readOutputs(t, brokers, len(st.Records), 30*time.Second)
	has := func(ref []byte) bool {
		_, err := fs.GetSegment(ctx, key, ref)
		return err == nil
	}
	for end := time.Now().Add(10 * time.Second); has(orphan) && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if has(orphan) {
		t.Fatal("an old segment no snapshot lists was not deleted")
	}
	if !has(young) {
		t.Fatal("a young unlisted segment was deleted")
	}
	segs, err := fs.ListSegments(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) < 2 {
		t.Fatalf("%d segments left: the service's own are gone", len(segs))
	}
	// What the service listed is all there: a restart restores and carries on.
	produce(t, brokers, streamtest.Generate(inTopic, 6, 600, 1).Records[500:])
	startService(t, cfg)
	readOutputs(t, brokers, 600, 30*time.Second)
}

// TestSweepKeepsWhatTheStoreLists: a sweep by an instance whose own state lists
// none of the partition's segments (one that was frozen past its session and
// thawed, while another owner saved) deletes only segments that no snapshot in
// the store lists, however old the listed ones are.
func TestSweepKeepsWhatTheStoreLists(t *testing.T) {
	ctx := context.Background()
	brokers, dir, fs, cfg, key := fileStoreSetup(t)
	// The other owner's run: several checkpoints, so its snapshots list segments.
	runCheckpointing(t, brokers, cfg, streamtest.Generate(inTopic, 7, 1500, 1).Records)
	orphan, err := fs.PutSegment(ctx, key, []byte("left by a crash"))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := storeListed(ctx, fs, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) == 0 {
		t.Fatal("the stored snapshots list no segment")
	}
	// Much later, by the sweeper's clock: every segment is old.
	later := time.Now().Add(24 * time.Hour)
	n, err := sweepUnlisted(ctx, fs, key, later)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.GetSegment(ctx, key, orphan); err == nil {
		t.Fatal("the unlisted old segment was kept")
	}
	for ref := range stored {
		if _, err := fs.GetSegment(ctx, key, []byte(ref)); err != nil {
			t.Fatalf("segment %s, listed by a stored snapshot, was deleted: %v", ref, err)
		}
	}
	t.Logf("deleted %d, kept the %d the stored snapshots list", n, len(stored))
	// A newest snapshot that cannot be read stops the sweep: nothing is deleted.
	snapPath := filepath.Join(dir, cfg.Group, inTopic, "0.snap")
	b, err := os.ReadFile(snapPath)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(snapPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.PutSegment(ctx, key, []byte("another")); err != nil {
		t.Fatal(err)
	}
	if n, err := sweepUnlisted(ctx, fs, key, later); err == nil || n != 0 {
		t.Fatalf("sweep over a damaged newest snapshot: %d deleted, err %v; want none and an error", n, err)
	}
}

// runCheckpointing runs a service over recs in steps of 500, letting it
// checkpoint a few times after each, so that its snapshots list segments,
// and stops it.
func runCheckpointing(t *testing.T, brokers []string, cfg Config, recs []*kgo.Record) {
	t.Helper()
	_, stop := startService(t, cfg)
	for i := 0; i < len(recs); i += 500 {
		produce(t, brokers, recs[i:min(i+500, len(recs))])
		readOutputs(t, brokers, min(i+500, len(recs)), 30*time.Second)
		time.Sleep(3 * cfg.CheckpointInterval)
	}
	stop()
}

// fileStoreSetup is a one-partition cluster and a service configuration on a
// file store, with the store's directory and partition 0's key.
func fileStoreSetup(t *testing.T) ([]string, string, *checkpoint.FileStore, Config, checkpoint.Key) {
	t.Helper()
	brokers := newCluster(t, 1)
	dir := t.TempDir()
	fs, err := checkpoint.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, brokers, fs)
	return brokers, dir, fs, cfg, checkpoint.Key{Group: cfg.Group, Topic: inTopic, Partition: 0}
}

// TestSweepKafkaStore: the kafka store lists its segments too (from their
// index records), so a sweep deletes what a crash left there and keeps what
// the stored snapshots list, as with the file store.
func TestSweepKafkaStore(t *testing.T) {
	ctx := context.Background()
	brokers := newCluster(t, 1)
	ks, err := checkpoint.NewKafkaStore(ctx, checkpoint.KafkaConfig{Brokers: brokers, Topic: "snapshots", Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ks.Close() })
	cfg := testConfig(t, brokers, ks)
	key := checkpoint.Key{Group: cfg.Group, Topic: inTopic, Partition: 0}
	runCheckpointing(t, brokers, cfg, streamtest.Generate(inTopic, 8, 1000, 1).Records)
	orphan, err := ks.PutSegment(ctx, key, []byte("left by a crash"))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := storeListed(ctx, ks, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) == 0 {
		t.Fatal("the stored snapshots list no segment")
	}
	if n, err := sweepUnlisted(ctx, ks, key, time.Now()); err != nil || n != 0 {
		t.Fatalf("sweep now: %d deleted, %v; want none (every unlisted segment is young)", n, err)
	}
	n, err := sweepUnlisted(ctx, ks, key, time.Now().Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	segs, err := ks.ListSegments(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for _, sg := range segs {
		left[string(sg.Ref)] = true
	}
	if left[string(orphan)] || n == 0 {
		t.Fatalf("the unlisted old segment is still listed (%d deleted)", n)
	}
	for ref := range stored {
		if !left[ref] {
			t.Fatalf("a segment a stored snapshot lists was deleted")
		}
		if _, err := ks.GetSegment(ctx, key, []byte(ref)); err != nil {
			t.Fatalf("a listed segment does not read back: %v", err)
		}
	}
	// The service restores from the store as it left it and carries on.
	produce(t, brokers, streamtest.Generate(inTopic, 8, 1100, 1).Records[1000:])
	startService(t, cfg)
	readOutputs(t, brokers, 1100, 30*time.Second)
}

// slowSweepStore is a memory store whose segment listing, the first step of a
// sweep, waits until the gate opens: a sweep against a slow store.
type slowSweepStore struct {
	*checkpoint.MemoryStore
	gate             chan struct{}
	entered, through atomic.Bool
}

func (s *slowSweepStore) ListSegments(ctx context.Context, key checkpoint.Key) ([]checkpoint.SegmentInfo, error) {
	s.entered.Store(true)
	<-s.gate
	defer s.through.Store(true)
	return s.MemoryStore.ListSegments(ctx, key)
}

// TestRunWaitsForItsBackgroundWork: a segment sweep runs beside the partition
// (sweepSegments), and Run returned while one still ran: the process's exit
// cut it off, and in tests it logged for a test that had ended, which the race
// detector reports outside any test. Run now waits for it (up to
// bgShutdownWait).
func TestRunWaitsForItsBackgroundWork(t *testing.T) {
	brokers := newCluster(t, 1)
	st := streamtest.Generate(inTopic, 8, 300, 1)
	produce(t, brokers, st.Records)
	store := &slowSweepStore{MemoryStore: checkpoint.NewMemoryStore(), gate: make(chan struct{})}
	svc, err := New(testConfig(t, brokers, store), zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	waitFor(t, "a segment sweep to start", 30*time.Second, store.entered.Load)
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a segment sweep still ran", err)
	case <-time.After(time.Second):
	}
	close(store.gate)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(bgShutdownWait + 5*time.Second):
		t.Fatal("Run did not return once the sweep was through")
	}
	if !store.through.Load() {
		t.Fatal("Run returned before the sweep's listing was through")
	}
}
