package checkpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/velocity-consumer/velocity-consumer/internal/retry"
)

// KafkaStore keeps snapshots in a compacted Kafka topic, so that any instance
// of the group can load the snapshot of a partition it was just assigned.
//
// Layout. Partition 0 of the topic holds manifests, one key per
// (group, topic, partition), and an index record per dedupe segment (see
// segments.go); the other partitions hold chunks. A snapshot
// (the same frame FileStore writes) is cut into chunks below the broker's
// message size, each keyed by (group, topic, partition, generation, nonce,
// index), produced to chunk partition 1 + p mod (partitions − 1). The
// manifest names the generation, chunk count, length, CRC32C and the offset
// of the first chunk, and repeats the previous generation's entry as the
// fallback.
//
// Crash-safety invariant: a manifest is produced only after every chunk it
// names has been acknowledged by all in-sync replicas, and chunks are deleted
// (tombstoned) only once they are two generations old, so every manifest a
// reader can see names complete chunks for both of its entries. A crash
// mid-Save leaves orphan chunks that no manifest names; they are never read,
// and the next Save of that partition does not reuse their keys (fresh nonce).
//
// Compaction keeps the last manifest per key and never removes a live chunk:
// chunk keys are unique and only tombstoned deliberately. Offsets survive
// compaction, so a reader seeks straight to a manifest's first chunk.
//
// Load is bounded: it lists the end offsets first and reads no further.
type KafkaStore struct {
	cl         *kgo.Client
	adm        *kadm.Client
	readOpts   []kgo.Opt // seeds and the caller's options, for the loaders' clients
	topic      string
	partitions int32
	chunkSize  int

	// The manifest partition's tail (refresh): one reader for the store's
	// life, the offset of the next record it applies, and every key's state.
	tailMu      sync.Mutex
	tail        *kgo.Client
	tailAnswers fetchAnswers // tail's Fetch responses
	tailNext    int64
	tailStates  map[string]*manifestState

	closeOnce sync.Once
}

// KafkaConfig configures NewKafkaStore.
type KafkaConfig struct {
	Brokers []string
	// Topic is the snapshot topic; created compacted if missing.
	Topic string
	// Partitions is used when the topic is created: 1 manifest partition plus
	// chunk partitions. Default 1 + 8. An existing topic keeps its count.
	Partitions int32
	// ChunkBytes caps one chunk record's value. Default: 900 KiB, lowered to
	// fit the topic's max.message.bytes.
	ChunkBytes int
	// ClientOpts are extra franz-go options (TLS, SASL, logging).
	ClientOpts []kgo.Opt
}

// DefaultKafkaTopic is the snapshot topic for a group when none is given:
// "__velocity-snapshots-<group>", with characters Kafka does not allow in
// topic names replaced by '_'.
func DefaultKafkaTopic(group string) string {
	name := "__velocity-snapshots-" + badTopicChars.ReplaceAllString(group, "_")
	if len(name) > 249 {
		name = name[:249]
	}
	return name
}

var badTopicChars = regexp.MustCompile(`[^a-zA-Z0-9._-]`)

const (
	manifestPartition = 0
	defaultChunkBytes = 900 << 10
	// recordOverhead is what a chunk record needs besides its value (key,
	// headers, batch framing), kept free under max.message.bytes.
	recordOverhead = 4 << 10
)

// idlePoll is how long one empty poll of a loader lasts; it decides that the
// rest of the range was compacted away only after silentPolls of them in a
// row while the broker answered other requests (see scan). That is a last resort: the cleaner never
// touches the active segment, so a range that ends at the listed end
// offset always ends with a record the scan sees (or the high watermark
// says it was reached). A silence is far more often a busy or stalled
// broker, and taking it for the end makes a snapshot look missing or
// corrupt, which costs a rebuild or stops the partition: so it is long.
var idlePoll = 10 * time.Second // a variable for tests

// silentPolls is how many empty polls in a row, with the broker answering
// other requests, a scan takes for the end of a compacted range.
const silentPolls = 3

// fetchAnswers counts the Fetch responses a loader's client has read (a
// kgo.HookBrokerRead). A silence is taken for the end of a compacted range
// only once at least two came back since the last records: a client sends a
// partition's next fetch only after the records of the previous one were
// taken, so the second answer shows that the first brought nothing. Polls
// that time out while the broker holds its answer back (a stalled fetch) then
// never count: counted by time alone, such a stall, outlasting silentPolls
// polls on a loaded machine, was taken for the end and a snapshot for missing.
type fetchAnswers struct{ n atomic.Int64 }

func (f *fetchAnswers) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.Fetch) && err == nil {
		f.n.Add(1)
	}
}

// NewKafkaStore connects, creates the topic if it does not exist (compacted,
// the broker's default replication factor) and reads its partition count and
// max.message.bytes.
func NewKafkaStore(ctx context.Context, cfg KafkaConfig) (*KafkaStore, error) {
	if len(cfg.Brokers) == 0 || cfg.Topic == "" {
		return nil, errors.New("checkpoint: kafka store needs brokers and a topic")
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 1 + 8
	}
	chunk := cfg.ChunkBytes
	if chunk <= 0 {
		chunk = defaultChunkBytes
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.ProducerBatchCompression(kgo.Lz4Compression(), kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(int32(chunk + recordOverhead)),
		kgo.RecordDeliveryTimeout(2 * time.Minute),
		// The store creates its topic just before its first Save, and a
		// broker refuses produces to a partition it has not taken on yet
		// with UNKNOWN_TOPIC_OR_PARTITION for a while (seconds on a loaded
		// machine); the client's default fails them after four such answers.
		kgo.UnknownTopicRetries(-1),
		// franz-go takes a connection closed at its first request for a
		// missing SASL or TLS setting and does not retry it; a broker
		// restarting does the same, and a save failed on it stops the
		// service. The service checks its configuration at start.
		kgo.AlwaysRetryEOF(),
	}, cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: kafka store client: %w", err)
	}
	s := &KafkaStore{
		cl: cl, adm: kadm.NewClient(cl), topic: cfg.Topic, chunkSize: chunk, tailStates: make(map[string]*manifestState),
		readOpts: append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.AlwaysRetryEOF()}, cfg.ClientOpts...),
	}
	if err := s.ensureTopic(ctx, cfg.Partitions); err != nil {
		cl.Close()
		return nil, err
	}
	return s, nil
}

func (s *KafkaStore) ensureTopic(ctx context.Context, partitions int32) error {
	// Every Save rewrites the whole snapshot, and superseded chunks only leave
	// the disk once their segment has rolled and been cleaned, so segments
	// roll early and the cleaner runs on a small dirty ratio. Tombstones need
	// not linger: a loader looks chunks up by exact key and never needs to
	// see a delete.
	configs := map[string]*string{
		"cleanup.policy":            kadm.StringPtr("compact"),
		"min.cleanable.dirty.ratio": kadm.StringPtr("0.1"),
		"segment.ms":                kadm.StringPtr(strconv.Itoa(int((10 * time.Minute).Milliseconds()))),
		"delete.retention.ms":       kadm.StringPtr(strconv.Itoa(int(time.Minute.Milliseconds()))),
	}
	// Through what a broker restarting answers (a refused dial, a connection
	// closed at once, NOT_CONTROLLER): the store is opened as the service
	// starts, which may be while a broker restarts, until ctx ends.
	err := retry.Do(ctx, 2*time.Second, retry.Transient, func() error {
		resp, err := s.adm.CreateTopic(ctx, partitions, -1, configs, s.topic)
		if err == nil {
			err = resp.Err
		}
		return err
	})
	if errors.Is(err, kerr.TopicAuthorizationFailed) {
		// A principal without Create is refused a CreateTopics even of a
		// topic that exists; an existing one needs no Create.
		if md, merr := s.adm.Metadata(ctx, s.topic); merr == nil {
			if td, ok := md.Topics[s.topic]; ok && td.Err == nil && len(td.Partitions) > 0 {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("checkpoint: create snapshot topic %s: %w (create it, compacted, or grant this principal Create on it)", s.topic, err)
		}
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("checkpoint: create snapshot topic %s: %w", s.topic, err)
	}
	// The topic may just have been created: wait until metadata shows every
	// partition with a leader.
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := s.adm.Metadata(ctx, s.topic)
		if err == nil {
			if td, ok := md.Topics[s.topic]; ok && td.Err == nil && len(td.Partitions) > 0 && allLeaders(td) {
				s.partitions = int32(len(td.Partitions))
				break
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("checkpoint: snapshot topic %s has no leader for every partition: %v", s.topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rcs, err := s.adm.DescribeTopicConfigs(ctx, s.topic)
	if err == nil {
		if rc, err := rcs.On(s.topic, nil); err == nil && rc.Err == nil {
			for _, c := range rc.Configs {
				if c.Key == "max.message.bytes" && c.Value != nil {
					if n, err := strconv.Atoi(*c.Value); err == nil && n-recordOverhead < s.chunkSize {
						s.chunkSize = max(n-recordOverhead, 1<<10)
					}
				}
			}
		}
	}
	return nil
}

func allLeaders(td kadm.TopicDetail) bool {
	for _, p := range td.Partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

// Topic is the snapshot topic's name.
func (s *KafkaStore) Topic() string { return s.topic }

// ChunkBytes is the size chunks are cut at.
func (s *KafkaStore) ChunkBytes() int { return s.chunkSize }

// entry describes one stored generation of a partition's snapshot.
type entry struct {
	Gen       uint64
	Nonce     uint64
	Next      int64
	Chunks    uint32
	Length    uint64
	CRC       uint32
	Partition int32 // chunk partition
	First     int64 // offset of chunk 0
}

// manifest is the value of a manifest record: the newest generation and, when
// there is one, the generation before it, and the owner epoch of the instance
// that wrote it. A claim (Claim) is a manifest that repeats the entries of the
// one it follows under a new epoch; a claim before any snapshot has none
// (HasCur false).
type manifest struct {
	Epoch   uint64
	HasCur  bool
	Cur     entry
	HasPrev bool
	Prev    entry
}

// Manifest value layout, big-endian:
//
//	magic "VMAN" | version u16 | epoch u64 | hasCur u8 | entry | hasPrev u8 | entry | crc32c u32
//	entry = gen u64 | nonce u64 | next i64 | chunks u32 | length u64 | crc u32 | partition i32 | first i64
//
// Version 1 had neither epoch nor hasCur; it is read as epoch 0 with an entry.
const (
	manifestVersion   = 2
	manifestVersionV1 = 1
	entryLen          = 8 + 8 + 8 + 4 + 8 + 4 + 4 + 8
	manifestLenV1     = 4 + 2 + entryLen + 1 + entryLen + 4
	manifestLen       = 4 + 2 + 8 + 1 + entryLen + 1 + entryLen + 4
)

var manifestMagic = [4]byte{'V', 'M', 'A', 'N'}

func appendEntry(b []byte, e entry) []byte {
	b = binary.BigEndian.AppendUint64(b, e.Gen)
	b = binary.BigEndian.AppendUint64(b, e.Nonce)
	b = binary.BigEndian.AppendUint64(b, uint64(e.Next))
	b = binary.BigEndian.AppendUint32(b, e.Chunks)
	b = binary.BigEndian.AppendUint64(b, e.Length)
	b = binary.BigEndian.AppendUint32(b, e.CRC)
	b = binary.BigEndian.AppendUint32(b, uint32(e.Partition))
	return binary.BigEndian.AppendUint64(b, uint64(e.First))
}

func readEntry(b []byte) entry {
	return entry{
		Gen:       binary.BigEndian.Uint64(b),
		Nonce:     binary.BigEndian.Uint64(b[8:]),
		Next:      int64(binary.BigEndian.Uint64(b[16:])),
		Chunks:    binary.BigEndian.Uint32(b[24:]),
		Length:    binary.BigEndian.Uint64(b[28:]),
		CRC:       binary.BigEndian.Uint32(b[36:]),
		Partition: int32(binary.BigEndian.Uint32(b[40:])),
		First:     int64(binary.BigEndian.Uint64(b[44:])),
	}
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func (m manifest) encode() []byte {
	b := make([]byte, 0, manifestLen)
	b = append(b, manifestMagic[:]...)
	b = binary.BigEndian.AppendUint16(b, manifestVersion)
	b = binary.BigEndian.AppendUint64(b, m.Epoch)
	b = appendBool(b, m.HasCur)
	b = appendEntry(b, m.Cur)
	b = appendBool(b, m.HasPrev)
	b = appendEntry(b, m.Prev)
	return binary.BigEndian.AppendUint32(b, crcOf(b))
}

func decodeManifest(b []byte) (manifest, error) {
	if len(b) < 6 || [4]byte(b[:4]) != manifestMagic {
		return manifest{}, fmt.Errorf("%w: manifest framing", ErrCorrupt)
	}
	var m manifest
	switch v := binary.BigEndian.Uint16(b[4:]); {
	case v == manifestVersion && len(b) == manifestLen:
		m.Epoch = binary.BigEndian.Uint64(b[6:])
		m.HasCur = b[14] == 1
		m.Cur = readEntry(b[15:])
		m.HasPrev = b[15+entryLen] == 1
		m.Prev = readEntry(b[16+entryLen:])
	case v == manifestVersionV1 && len(b) == manifestLenV1:
		m.HasCur = true
		m.Cur = readEntry(b[6:])
		m.HasPrev = b[6+entryLen] == 1
		m.Prev = readEntry(b[7+entryLen:])
	case v != manifestVersion && v != manifestVersionV1:
		return manifest{}, fmt.Errorf("%w: unknown manifest version %d (this build reads %d and %d)", ErrCorrupt, v, manifestVersionV1, manifestVersion)
	default:
		return manifest{}, fmt.Errorf("%w: manifest framing", ErrCorrupt)
	}
	if crcOf(b[:len(b)-4]) != binary.BigEndian.Uint32(b[len(b)-4:]) {
		return manifest{}, fmt.Errorf("%w: manifest checksum mismatch", ErrCorrupt)
	}
	for _, e := range []entry{m.Cur, m.Prev} {
		if e.Chunks == 0 && e.Gen != 0 || e.First < 0 || e.Next < 0 {
			return manifest{}, fmt.Errorf("%w: manifest entry out of range", ErrCorrupt)
		}
	}
	if m.HasPrev && !m.HasCur {
		return manifest{}, fmt.Errorf("%w: manifest has a previous entry and no current one", ErrCorrupt)
	}
	return m, nil
}

// manifestKeyPrefix starts every manifest record's key.
var manifestKeyPrefix = []byte("m/")

func manifestKey(k Key) []byte {
	return []byte("m/" + url.PathEscape(k.Group) + "/" + url.PathEscape(k.Topic) + "/" + strconv.Itoa(int(k.Partition)))
}

func chunkKey(k Key, e entry, i uint32) []byte {
	return fmt.Appendf(nil, "c/%s/%s/%d/%d-%016x/%d", url.PathEscape(k.Group), url.PathEscape(k.Topic), k.Partition, e.Gen, e.Nonce, i)
}

func (s *KafkaStore) chunkPartition(k Key) int32 {
	if s.partitions <= 1 {
		return manifestPartition
	}
	p := k.Partition % (s.partitions - 1)
	if p < 0 {
		p = -p
	}
	return 1 + p
}

// Claim implements Store: it reads the partition's manifests to the end,
// takes an epoch above the highest, and produces a claim: a manifest that
// repeats the effective one's entries under the new epoch. Readers take the
// manifest of the highest epoch (the last of them in the log), so from the
// claim on nothing an older owner writes is read.
func (s *KafkaStore) Claim(ctx context.Context, key Key, tiebreak uint32) (uint64, error) {
	st, err := s.refresh(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("claim %s: %w", key, err)
	}
	claim := st.eff
	claim.Epoch = NextEpoch(st.eff.Epoch, tiebreak)
	if !st.found {
		claim = manifest{Epoch: claim.Epoch}
	}
	if err := s.produceSync(ctx, &kgo.Record{Topic: s.topic, Partition: manifestPartition, Key: manifestKey(key), Value: claim.encode()}).FirstErr(); err != nil {
		return 0, fmt.Errorf("claim %s: produce to %s: %w", key, s.topic, s.explain(err))
	}
	return claim.Epoch, nil
}

// Save implements Store: chunks first, then the manifest that makes them
// visible, then tombstones for the generation that is no longer referenced.
//
// Fencing: a Save whose epoch is below the claim this store last saw fails at
// once. After producing the manifest, Save reads the manifest partition from
// where it last read: if a higher claim is there, the manifest it just wrote
// is (or will be) ignored by every reader, and it returns ErrFenced without
// tombstoning anything, since the new owner's manifests may refer to the
// generation it would have deleted.
func (s *KafkaStore) Save(ctx context.Context, key Key, snap Snapshot) error {
	st, err := s.refresh(ctx, key)
	if err != nil {
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}
	prev := st.eff
	if st.found && prev.Epoch > snap.writer() {
		return fmt.Errorf("save snapshot %s with epoch %d, claimed %d: %w", key, snap.writer(), prev.Epoch, ErrFenced)
	}
	gen := uint64(1)
	if st.found && prev.HasCur {
		gen = prev.Cur.Gen + 1
	}
	e, err := s.produceChunks(ctx, key, snap, gen)
	if err != nil {
		return fmt.Errorf("save snapshot %s: %w", key, err)
	}

	m := manifest{Epoch: snap.writer(), HasCur: true, Cur: e}
	if st.found && prev.HasCur {
		m.HasPrev, m.Prev = true, prev.Cur
	}
	// The invariant above: every chunk is acknowledged before this manifest
	// is produced.
	if err := s.produceSync(ctx, &kgo.Record{Topic: s.topic, Partition: manifestPartition, Key: manifestKey(key), Value: m.encode()}).FirstErr(); err != nil {
		return fmt.Errorf("save snapshot %s: produce manifest to %s: %w", key, s.topic, s.explain(err))
	}
	after, err := s.refresh(ctx, key)
	if err != nil {
		// The manifest is durable; whether a newer owner claimed the
		// partition meanwhile is unknown, so nothing is tombstoned.
		return nil
	}
	if after.eff.Epoch > snap.writer() {
		return fmt.Errorf("save snapshot %s with epoch %d: the partition was claimed with epoch %d meanwhile: %w", key, snap.writer(), after.eff.Epoch, ErrFenced)
	}

	// The generation the old manifest kept as its fallback is now referenced
	// by no manifest: tombstone its chunks so compaction reclaims them. A
	// failure here only leaves garbage behind, so it is not an error.
	if st.found && prev.HasPrev {
		_ = s.tombstone(ctx, key, prev.Prev)
	}
	return nil
}

// produceChunks frames snap, produces it as chunks of generation gen with a
// fresh nonce, and returns the entry that finds them once every chunk is
// acknowledged.
func (s *KafkaStore) produceChunks(ctx context.Context, key Key, snap Snapshot, gen uint64) (entry, error) {
	frame := Encode(snap)
	e := entry{
		Gen:       gen,
		Next:      snap.Next,
		Length:    uint64(len(frame)),
		CRC:       crcOf(frame),
		Partition: s.chunkPartition(key),
		Nonce:     randomNonce(),
		Chunks:    uint32((len(frame) + s.chunkSize - 1) / s.chunkSize),
	}
	recs := make([]*kgo.Record, 0, e.Chunks)
	for i := uint32(0); i < e.Chunks; i++ {
		lo := int(i) * s.chunkSize
		hi := min(lo+s.chunkSize, len(frame))
		recs = append(recs, &kgo.Record{Topic: s.topic, Partition: e.Partition, Key: chunkKey(key, e, i), Value: frame[lo:hi]})
	}
	res := s.produceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		return entry{}, fmt.Errorf("produce chunks to %s: %w", s.topic, s.explain(err))
	}
	// ProduceSync returns results in order; chunks are in one partition from
	// one producer, so chunk 0 has the lowest offset.
	e.First = res[0].Record.Offset
	for _, r := range res {
		e.First = min(e.First, r.Record.Offset)
	}
	return e, nil
}

// produceSync is the client's ProduceSync, again (up to cancelRetries times)
// when the records failed with a context's error while ctx is alive. franz-go
// fails every record buffered in a partition behind one whose context was
// cancelled before it was sent, with that context's error: a store shared by
// several services (the input's and the re-keyed groups' in one process)
// writes their claims and manifests to one partition, and a takeover that a
// rebalance cancelled failed another service's claim with "context
// canceled", which stopped that service. Producing the same records again is
// safe here: claims, manifests and index records are read by key and epoch,
// and the chunks of one attempt are found by the offsets of that attempt.
func (s *KafkaStore) produceSync(ctx context.Context, recs ...*kgo.Record) kgo.ProduceResults {
	return produceRetrying(ctx, s.cl.ProduceSync, recs...)
}

// cancelRetries bounds produceSync's attempts after other callers'
// cancellations.
const cancelRetries = 5

func produceRetrying(ctx context.Context, produce func(context.Context, ...*kgo.Record) kgo.ProduceResults, recs ...*kgo.Record) kgo.ProduceResults {
	for attempt := 1; ; attempt++ {
		res := produce(ctx, recs...)
		err := res.FirstErr()
		if err == nil || ctx.Err() != nil || attempt > cancelRetries ||
			!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return res
		}
		for _, r := range recs {
			// A fresh record each time: franz-go owns a record until its
			// promise has run, and sets its fields.
			*r = kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value}
		}
	}
}

// tombstone deletes the chunks of e so that compaction reclaims them.
func (s *KafkaStore) tombstone(ctx context.Context, key Key, e entry) error {
	tomb := make([]*kgo.Record, 0, e.Chunks)
	for i := uint32(0); i < e.Chunks; i++ {
		tomb = append(tomb, &kgo.Record{Topic: s.topic, Partition: e.Partition, Key: chunkKey(key, e, i)})
	}
	return s.produceSync(ctx, tomb...).FirstErr()
}

func randomNonce() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// manifestState is what a reader of the manifest partition knows of one key:
// the effective manifest (the last one of the highest epoch; found is false
// before any) and the offset of the last record of the partition it examined.
type manifestState struct {
	eff   manifest
	found bool
	seen  int64
}

// apply updates st with one record of the manifest partition. Invariant: eff
// is the last manifest of the highest epoch seen for the key, so a manifest an
// older owner writes after a newer owner's claim never becomes effective.
func (st *manifestState) apply(want string, r *kgo.Record) {
	st.seen = max(st.seen, r.Offset)
	if string(r.Key) != want {
		return
	}
	if r.Value == nil {
		// Deleted: what follows starts afresh, but never below an epoch
		// already claimed.
		st.eff, st.found = manifest{Epoch: st.eff.Epoch}, false
		return
	}
	m, err := decodeManifest(r.Value)
	if err != nil {
		return // a corrupt manifest record: the one before stands
	}
	if m.Epoch >= st.eff.Epoch {
		st.eff, st.found = m, true
	}
}

// refresh brings key's manifest state up to the manifest partition's current
// end. The store keeps one reader that tails the manifest partition from its
// start and applies every manifest record to the state of its key, so a
// refresh reads only the records written since the last one (a checkpoint's
// fencing read costs one list-offsets request and the new records, not a new
// client and a read of the partition). What it returns covers every manifest
// written before it began.
func (s *KafkaStore) refresh(ctx context.Context, key Key) (manifestState, error) {
	s.tailMu.Lock()
	defer s.tailMu.Unlock()
	end, err := s.listOffset(ctx, manifestPartition, s.adm.ListEndOffsets, "end")
	if err != nil {
		return manifestState{}, err
	}
	if err := s.tailTo(ctx, end); err != nil {
		return manifestState{}, err
	}
	if st, ok := s.tailStates[string(manifestKey(key))]; ok {
		return *st, nil
	}
	return manifestState{seen: s.tailNext - 1}, nil
}

// tailTo applies the manifest partition's records up to end (exclusive) to
// tailStates. Like scan, it takes silence for the end only after silentPolls
// empty polls while the broker answers other requests (compaction removed the
// last records), or when a fetch's high watermark says there is no more.
// Called with tailMu held.
func (s *KafkaStore) tailTo(ctx context.Context, end int64) error {
	if s.tailNext >= end {
		return nil
	}
	if s.tail == nil {
		cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), s.readOpts...),
			kgo.WithHooks(&s.tailAnswers),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.topic: {manifestPartition: kgo.NewOffset().AtStart()}}),
			kgo.FetchMaxBytes(64<<20),
			kgo.FetchMaxPartitionBytes(64<<20),
			kgo.FetchMaxWait(200*time.Millisecond),
		)...)
		if err != nil {
			return err
		}
		s.tail = cl
	}
	silent, answered, since := 0, false, s.tailAnswers.n.Load()
	for s.tailNext < end {
		pctx, cancel := context.WithTimeout(ctx, idlePoll)
		fs := s.tail.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %s/%d up to offset %d: %w", s.topic, manifestPartition, end, err)
		}
		// Errors first: a fetch the broker refuses (not authorized) comes
		// back with a poll that ran out its time, and must not be taken for
		// silence, or an unreadable topic looks empty.
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !retry.Transient(err) {
				ferr = err
			}
		})
		if ferr != nil {
			return fmt.Errorf("read %s/%d: %w", s.topic, manifestPartition, s.explain(ferr))
		}
		if pctx.Err() != nil && fs.NumRecords() == 0 {
			if _, err := s.adm.ListEndOffsets(ctx, s.topic); err == nil {
				answered = true
			}
			if silent++; silent >= silentPolls && answered && s.tailAnswers.n.Load()-since >= 2 {
				s.tailNext = end
				return nil
			}
			continue
		}
		silent, answered, since = 0, false, s.tailAnswers.n.Load()
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			for _, r := range fp.Records {
				if r.Offset < s.tailNext {
					continue
				}
				s.tailNext = r.Offset + 1
				if !bytes.HasPrefix(r.Key, manifestKeyPrefix) {
					continue // a segment's index record
				}
				st, ok := s.tailStates[string(r.Key)]
				if !ok {
					st = &manifestState{seen: -1}
					s.tailStates[string(r.Key)] = st
				}
				st.apply(string(r.Key), r)
			}
			// Compaction can remove the records just before the end offset;
			// the fetch's high watermark tells us we have seen all there is.
			if fp.HighWatermark >= 0 && fp.HighWatermark <= s.tailNext && fp.HighWatermark >= end {
				s.tailNext = max(s.tailNext, end)
			}
		})
	}
	return nil
}

// scan reads partition p of the topic from offset from (-1: the start) up to
// the end offset listed when it begins, calling fn for each record until fn
// returns false.
func (s *KafkaStore) scan(ctx context.Context, p int32, from int64, fn func(*kgo.Record) bool) error {
	end, err := s.listOffset(ctx, p, s.adm.ListEndOffsets, "end")
	if err != nil {
		return err
	}
	start, err := s.listOffset(ctx, p, s.adm.ListStartOffsets, "start")
	if err != nil {
		return err
	}
	from = max(from, start)
	if from >= end {
		return nil
	}
	var answers fetchAnswers
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), s.readOpts...),
		kgo.WithHooks(&answers),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.topic: {p: kgo.NewOffset().At(from)}}),
		kgo.FetchMaxBytes(64<<20),
		kgo.FetchMaxPartitionBytes(64<<20),
		kgo.FetchMaxWait(200*time.Millisecond),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	// Since the last record: polls that stayed empty, whether the broker
	// answered another request meanwhile, and the fetch answers before it.
	silent, answered, since := 0, false, answers.n.Load()
	for {
		// A poll that stays empty means compaction removed everything left
		// before the end offset, or a broker that does not answer (a stall,
		// a restart) or answers fetches slowly. Only silence that lasts
		// silentPolls polls while the broker answers other requests is taken
		// for the end: a stall taken for it made a sound snapshot look
		// corrupt (chunks "missing"), which stopped the service.
		pctx, cancel := context.WithTimeout(ctx, idlePoll)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %s/%d up to offset %d: %w", s.topic, p, end, err)
		}
		// Errors first, as in tailTo: a refused fetch is not silence.
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			// A broker restarting refuses dials for a while; the client
			// retries the fetch itself.
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !retry.Transient(err) {
				ferr = err
			}
		})
		if ferr != nil {
			return fmt.Errorf("read %s/%d: %w", s.topic, p, s.explain(ferr))
		}
		if pctx.Err() != nil && fs.NumRecords() == 0 {
			if _, err := s.adm.ListEndOffsets(ctx, s.topic); err == nil {
				answered = true
			}
			if silent++; silent >= silentPolls && answered && answers.n.Load()-since >= 2 {
				return nil
			}
			continue
		}
		silent, answered, since = 0, false, answers.n.Load()
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if done {
				return
			}
			if r.Offset >= end {
				done = true
				return
			}
			if !fn(r) || r.Offset >= end-1 {
				done = true
			}
		})
		if done {
			return nil
		}
		// Compaction can remove the records just before the end offset; the
		// fetch's high watermark tells us we have seen all there is.
		reached := false
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if n := len(fp.Records); n > 0 && fp.HighWatermark >= 0 && fp.Records[n-1].Offset+1 >= fp.HighWatermark {
				reached = true
			}
		})
		if reached {
			return nil
		}
	}
}

// retryTransient runs do until it succeeds, fails for a reason that does not
// pass, or ctx ends: the store's reads ride out a broker restart within the
// caller's bound, as its writes do (franz-go retries produces).
func retryTransient(ctx context.Context, do func() error) error {
	return retry.Do(ctx, 2*time.Second, retry.Transient, do)
}

// listOffset lists partition p's start or end offset (list: kadm's
// ListStartOffsets or ListEndOffsets), retrying what may pass. kadm returns a
// partition's error inside the answer, not as the call's: a partition whose
// leader is restarting or has just been elected answers NOT_LEADER_OR_FOLLOWER
// or UNKNOWN_TOPIC_OR_PARTITION for a while, and a topic the broker does not
// know yet is listed under partition -1. Taken for final, those stopped a
// checkpoint (a failed save stops the service) over a broker restart.
func (s *KafkaStore) listOffset(ctx context.Context, p int32, list func(context.Context, ...string) (kadm.ListedOffsets, error), which string) (int64, error) {
	var off int64
	err := retryTransient(ctx, func() error {
		listed, err := list(ctx, s.topic)
		if err != nil {
			return err
		}
		o, ok := listed.Lookup(s.topic, p)
		if !ok {
			if t, ok := listed.Lookup(s.topic, -1); ok && t.Err != nil {
				return t.Err
			}
			return fmt.Errorf("partition %d not in the answer", p)
		}
		off = o.Offset
		return o.Err
	})
	if err != nil {
		return 0, fmt.Errorf("list %s offset of %s/%d: %w", which, s.topic, p, s.explain(err))
	}
	return off, nil
}

// explain says what to grant when the broker refused the snapshot topic.
func (s *KafkaStore) explain(err error) error {
	if errors.Is(err, kerr.TopicAuthorizationFailed) {
		return fmt.Errorf("%w (the --checkpoint-store kafka topic %s needs Describe, Read and Write for this principal, and Create unless it exists)", err, s.topic)
	}
	return err
}

// Load implements Store: the effective manifest's snapshots (see apply).
func (s *KafkaStore) Load(ctx context.Context, key Key) (Loaded, error) {
	st, err := s.refresh(ctx, key)
	if err != nil {
		return Loaded{}, fmt.Errorf("load snapshot %s: %w", key, err)
	}
	if !st.found || !st.eff.HasCur {
		return Loaded{}, ErrNotFound
	}
	m := st.eff

	es := []entry{m.Cur}
	if m.HasPrev {
		es = append(es, m.Prev)
	}
	snaps, errs := s.readEntries(ctx, key, es)
	if errs[0] == nil {
		l := Loaded{Snapshot: snaps[0]}
		if len(es) > 1 && errs[1] == nil {
			l.Previous = &snaps[1]
		}
		return l, nil
	}
	if len(es) > 1 && errs[1] == nil {
		return Loaded{Snapshot: snaps[1], FellBack: true, CorruptErr: fmt.Errorf("generation %d: %w", m.Cur.Gen, errs[0])}, nil
	}
	if len(es) > 1 {
		return Loaded{}, fmt.Errorf("load snapshot %s: newest: %w; previous: %v", key, errs[0], errs[1])
	}
	return Loaded{}, fmt.Errorf("load snapshot %s: %w", key, errs[0])
}

// readEntries reads the chunks of every entry in one pass over their chunk
// partition (entries of one key share it) and checks each reassembled frame.
func (s *KafkaStore) readEntries(ctx context.Context, key Key, es []entry) ([]Snapshot, []error) {
	snaps := make([]Snapshot, len(es))
	errs := make([]error, len(es))
	chunks := make([][][]byte, len(es))
	missing := 0
	want := map[string][2]int{} // chunk key -> entry, index
	from := int64(-1)
	for i, e := range es {
		chunks[i] = make([][]byte, e.Chunks)
		missing += int(e.Chunks)
		for c := uint32(0); c < e.Chunks; c++ {
			want[string(chunkKey(key, e, c))] = [2]int{i, int(c)}
		}
		if from < 0 || e.First < from {
			from = e.First
		}
	}
	err := s.scan(ctx, es[0].Partition, from, func(r *kgo.Record) bool {
		at, ok := want[string(r.Key)]
		if !ok || r.Value == nil || chunks[at[0]][at[1]] != nil {
			return true
		}
		chunks[at[0]][at[1]] = r.Value
		missing--
		return missing > 0
	})
	for i, e := range es {
		if err != nil {
			errs[i] = err
			continue
		}
		frame := make([]byte, 0, e.Length)
		for c, b := range chunks[i] {
			if b == nil {
				errs[i] = fmt.Errorf("%w: chunk %d of %d missing from %s/%d", ErrCorrupt, c, e.Chunks, s.topic, e.Partition)
				break
			}
			frame = append(frame, b...)
		}
		if errs[i] != nil {
			continue
		}
		if uint64(len(frame)) != e.Length || crcOf(frame) != e.CRC {
			errs[i] = fmt.Errorf("%w: reassembled snapshot does not match its manifest", ErrCorrupt)
			continue
		}
		snap, err := Decode(frame)
		if err == nil && snap.Next != e.Next {
			err = fmt.Errorf("%w: snapshot offset %d differs from its manifest's %d", ErrCorrupt, snap.Next, e.Next)
		}
		snaps[i], errs[i] = snap, err
	}
	return snaps, errs
}

// Close implements Store. Closing twice is harmless.
func (s *KafkaStore) Close() error {
	s.closeOnce.Do(func() {
		s.tailMu.Lock()
		if s.tail != nil {
			s.tail.Close()
		}
		s.tailMu.Unlock()
		s.cl.Close()
	})
	return nil
}
