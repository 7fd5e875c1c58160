package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

func TestCompression(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"lz4", true}, {"zstd", true}, {"snappy", true}, {"gzip", true}, {"none", true},
		{"", false}, {"LZ4", false}, {"brotli", false},
	} {
		opt, err := Compression(c.name)
		if c.ok != (err == nil) || c.ok != (opt != nil) {
			t.Errorf("Compression(%q) = %v, %v; want ok=%v", c.name, opt, err, c.ok)
		}
		if !c.ok && err != nil && !strings.Contains(err.Error(), "want lz4, zstd, snappy, gzip or none") {
			t.Errorf("Compression(%q): error %q does not list the choices", c.name, err)
		}
		opt, err = Compressor("lz4", c.name)
		if c.ok != (err == nil) || c.ok != (opt != nil) {
			t.Errorf("Compressor(lz4, %q) = %v, %v; want ok=%v", c.name, opt, err, c.ok)
		}
		if !c.ok && err != nil && !strings.Contains(err.Error(), "hop records") {
			t.Errorf("Compressor(lz4, %q): error %q does not say it is the hop records' codec", c.name, err)
		}
	}
}

// appendRecordV2 appends one record as Kafka's record format v2 lays it out in a
// batch (what isHopBatch reads): a nil key or value is length -1.
func appendRecordV2(dst, key, value []byte, headers [][2]string) []byte {
	var body []byte
	body = append(body, 0)              // attributes
	body = binary.AppendVarint(body, 0) // timestamp delta
	body = binary.AppendVarint(body, 0) // offset delta
	for _, f := range [][]byte{key, value} {
		if f == nil {
			body = binary.AppendVarint(body, -1)
			continue
		}
		body = binary.AppendVarint(body, int64(len(f)))
		body = append(body, f...)
	}
	body = binary.AppendVarint(body, int64(len(headers)))
	for _, h := range headers {
		body = binary.AppendVarint(body, int64(len(h[0])))
		body = append(body, h[0]...)
		body = binary.AppendVarint(body, int64(len(h[1])))
		body = append(body, h[1]...)
	}
	dst = binary.AppendVarint(dst, int64(len(body)))
	return append(dst, body...)
}

func hopEventValue(t testing.TB, offset int64) []byte {
	r := repartition.Record{Kind: repartition.KindEvent, Epoch: 3, Watermark: 1_700_000_000_000, Event: repartition.Event{
		Source: 1, Offset: offset, EventTime: 1_700_000_000_000 + offset, Topic: "payments",
		Key: "device-42", EventID: fmt.Sprintf("evt-%036d", offset), Amount: 1250, Ext: []uint64{1, 2},
	}}
	b, err := repartition.AppendRecord(nil, &r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hopMarkerValue(t testing.TB) []byte {
	b, err := repartition.AppendRecord(nil, &repartition.Record{Kind: repartition.KindMarker, Epoch: 1, Watermark: 42, Idle: true})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestIsHopBatch(t *testing.T) {
	ev, marker := hopEventValue(t, 7), hopMarkerValue(t)
	hdr := [][2]string{{HeaderEmittedAt, "1700000000000"}}
	for _, c := range []struct {
		name    string
		records []byte
		want    bool
	}{
		{"hop event", appendRecordV2(nil, []byte("device-42"), ev, nil), true},
		{"hop marker, null key", appendRecordV2(nil, nil, marker, nil), true},
		{"hop event then features", appendRecordV2(appendRecordV2(nil, []byte("k"), ev, nil), []byte("k"), []byte("row"), hdr), true},
		{"features record", appendRecordV2(nil, []byte("card-1"), []byte("row"), hdr), false},
		{"hop value with a header", appendRecordV2(nil, []byte("k"), ev, hdr), false},
		{"headerless, not a hop value", appendRecordV2(nil, []byte("k"), []byte("\x00\x01plain"), nil), false},
		{"headerless, null value", appendRecordV2(nil, []byte("k"), nil, nil), false},
		{"headerless, hop version, unknown kind", appendRecordV2(nil, nil, []byte{repartition.RecordVersion, 9, 0, 0, 0}, nil), false},
		{"empty", nil, false},
		{"truncated in the value", appendRecordV2(nil, []byte("k"), ev, nil)[:20], false},
		{"truncated before the header count", appendRecordV2(nil, []byte("k"), ev, nil)[:len(appendRecordV2(nil, []byte("k"), ev, nil))-1], false},
		{"key length below -1", append(binary.AppendVarint(nil, 10), 0, 0, 0, 3), false},
		{"malformed varint", bytes.Repeat([]byte{0xff}, 12), false},
	} {
		if got := isHopBatch(c.records); got != c.want {
			t.Errorf("%s: isHopBatch = %v, want %v", c.name, got, c.want)
		}
	}
}

func FuzzIsHopBatch(f *testing.F) {
	ev, marker := hopEventValue(f, 7), hopMarkerValue(f)
	f.Add(appendRecordV2(nil, []byte("device-42"), ev, nil))
	f.Add(appendRecordV2(nil, nil, marker, nil))
	f.Add(appendRecordV2(nil, []byte("card-1"), []byte("row"), [][2]string{{"a", "b"}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got := isHopBatch(b) // must not panic on any input
		// A verdict of true means the first record has no headers and a value
		// that PeekWatermark accepts: re-check it independently.
		if got {
			r := recordReader{b: b}
			r.varint()
			r.skip(1)
			r.varint()
			r.varint()
			r.skip(r.len())
			v := r.bytes(r.len())
			if h := r.varint(); r.bad || h != 0 {
				t.Fatalf("isHopBatch true for a record with %d headers (bad %v)", h, r.bad)
			}
			if _, _, err := repartition.PeekWatermark(v); err != nil {
				t.Fatalf("isHopBatch true for a value PeekWatermark refuses: %v", err)
			}
		}
	})
}

// TestHopBatchesLeftUncompressed produces features, dead letters and hop records
// through one client, as a first stage does (and, with eos, through one
// transactional client, as under --exactly-once), and reads back which codec
// each record's batch was written with: hops follow the hops codec, the rest the
// outputs codec, and every value arrives as produced.
func TestHopBatchesLeftUncompressed(t *testing.T) {
	for _, c := range []struct {
		outputs, hops string
		eos           bool
		wantOut       kgo.CompressionCodecType
		wantHop       kgo.CompressionCodecType
	}{
		{"lz4", "none", false, kgo.CodecLz4, kgo.CodecNone},
		{"lz4", "none", true, kgo.CodecLz4, kgo.CodecNone},
		{"zstd", "none", false, kgo.CodecZstd, kgo.CodecNone},
		{"lz4", "lz4", false, kgo.CodecLz4, kgo.CodecLz4},
		{"none", "lz4", false, kgo.CodecNone, kgo.CodecLz4},
		{"none", "none", false, kgo.CodecNone, kgo.CodecNone},
	} {
		t.Run(fmt.Sprintf("%s-%s-eos=%v", c.outputs, c.hops, c.eos), func(t *testing.T) {
			cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "out", "dlq", "hop"))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			comp, err := Compressor(c.outputs, c.hops)
			if err != nil {
				t.Fatal(err)
			}
			opts := append([]kgo.Opt{kgo.SeedBrokers(cl.ListenAddrs()...)}, ProducerOpts()...)
			opts = append(opts, comp, kgo.ProducerLinger(50*time.Millisecond))
			if c.eos {
				opts = append(opts, kgo.TransactionalID("compression-test"))
			}
			prod, err := kgo.NewClient(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if c.eos {
				if err := prod.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
			}
			tr := New(prod, "out", "dlq", "host-1").WithBuild("velocity-consumer/test").NewTracker(nil)
			tr.SetClock(time.Now().UnixMilli()) // the client times records out from their timestamp
			want := map[string][][]byte{}
			const n = 200
			for i := range n {
				row := []byte(strings.Repeat(fmt.Sprintf("row %d of card-%d; ", i, i%7), 8))
				tr.Features([]byte(fmt.Sprintf("card-%d", i%7)), row, 1)
				want["out"] = append(want["out"], row)
				hv := hopEventValue(t, int64(i))
				if i%50 == 49 {
					hv = hopMarkerValue(t)
				}
				tr.Hop("hop", 0, []byte("device-42"), hv)
				want["hop"] = append(want["hop"], hv)
				if i%4 == 0 {
					dv := []byte(strings.Repeat("bad input ", 10))
					tr.Dead(DeadLetter{Key: []byte("k"), Value: dv, Reason: codec.ReasonDecode, Err: "test", SourceTopic: "in", SourceOffset: int64(i)})
					want["dlq"] = append(want["dlq"], dv)
				}
			}
			if err := tr.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if c.eos {
				if err := prod.EndTransaction(ctx, kgo.TryCommit); err != nil {
					t.Fatal(err)
				}
			}
			cons, err := kgo.NewClient(kgo.SeedBrokers(cl.ListenAddrs()...), kgo.ConsumeTopics("out", "dlq", "hop"),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
			if err != nil {
				t.Fatal(err)
			}
			defer cons.Close()
			got := map[string][][]byte{}
			codecs := map[string]map[kgo.CompressionCodecType]int{}
			for total := 0; total < len(want["out"])+len(want["hop"])+len(want["dlq"]); {
				fs := cons.PollFetches(ctx)
				if err := fs.Err(); err != nil {
					t.Fatal(err)
				}
				fs.EachRecord(func(r *kgo.Record) {
					got[r.Topic] = append(got[r.Topic], r.Value)
					if codecs[r.Topic] == nil {
						codecs[r.Topic] = map[kgo.CompressionCodecType]int{}
					}
					codecs[r.Topic][kgo.CompressionCodecType(r.Attrs.CompressionType())]++
					total++
				})
			}
			for topic, wantCodec := range map[string]kgo.CompressionCodecType{"out": c.wantOut, "dlq": c.wantOut, "hop": c.wantHop} {
				if len(codecs[topic]) != 1 || codecs[topic][wantCodec] != len(want[topic]) {
					t.Errorf("%s: records by codec %v, want all %d with codec %d", topic, codecs[topic], len(want[topic]), wantCodec)
				}
				if len(got[topic]) != len(want[topic]) {
					t.Fatalf("%s: %d records, want %d", topic, len(got[topic]), len(want[topic]))
				}
				for i := range want[topic] {
					if !bytes.Equal(got[topic][i], want[topic][i]) {
						t.Fatalf("%s record %d: value %q, want %q", topic, i, got[topic][i], want[topic][i])
					}
				}
			}
		})
	}
}

// TestLZ4FramesWithoutContentChecksum: the outputs' LZ4 frames are Kafka's own
// producer's (no content checksum, independent blocks), decompress to the batch,
// and a match table taken from the pool again gives the same frame.
func TestLZ4FramesWithoutContentChecksum(t *testing.T) {
	var src []byte
	for i := range 3000 { // about 300 KB: a large batch, five blocks of the frame
		row := []byte(strings.Repeat(fmt.Sprintf("row %d of card-%d; ", i, i%7), 4))
		src = appendRecordV2(src, []byte(fmt.Sprintf("card-%d", i)), row, [][2]string{{HeaderEmittedAt, "1700000000000"}})
	}
	c := newLZ4Frames()
	dec := kgo.DefaultDecompressor()
	var first []byte
	for _, in := range [][]byte{src, src[:100], src} {
		var buf bytes.Buffer
		out, codec := c.Compress(&buf, in)
		if codec != kgo.CodecLz4 || len(out) < 7 {
			t.Fatalf("codec %v, %d bytes", codec, len(out))
		}
		if magic := binary.LittleEndian.Uint32(out); magic != 0x184D2204 {
			t.Fatalf("frame magic %#x", magic)
		}
		const contentChecksum, blockIndependence, blockChecksum = 1 << 2, 1 << 5, 1 << 4
		if flg := out[4]; flg&contentChecksum != 0 || flg&blockChecksum != 0 || flg&blockIndependence == 0 || flg>>6 != 1 {
			t.Fatalf("frame flags %08b: want version 1, independent blocks, no checksums", flg)
		}
		back, err := dec.Decompress(out, codec)
		if err != nil || !bytes.Equal(back, in) {
			t.Fatalf("decompressed %d bytes (%v), want the %d of the batch", len(back), err, len(in))
		}
		if len(in) == len(src) {
			if first == nil {
				first = bytes.Clone(out)
			} else if !bytes.Equal(out, first) {
				t.Fatal("a pooled table gave another frame for the same batch")
			}
		}
	}
}

// BenchmarkHopBatch is what one batch of 100 hop events costs the producer's
// compressor and then the fetching second stage's decompressor: "lz4" as before
// hop batches were told apart (every batch LZ4-compressed and decompressed again),
// "hop-aware" as Compressor("lz4", "none") does now (read the first record's
// framing, send the batch as it is, nothing to decompress). "features" is a batch
// of features records through the hop-aware compressor: the framing read is all it
// adds to their compression. Per op: one batch.
func BenchmarkHopBatch(b *testing.B) {
	var hops, feats []byte
	for i := range 100 {
		hops = appendRecordV2(hops, []byte(fmt.Sprintf("device-%d", i%37)), hopEventValue(b, int64(1_000_000+i)), nil)
		row := []byte(strings.Repeat(fmt.Sprintf("row %d of card-%d; ", i, i%7), 8))
		feats = appendRecordV2(feats, []byte(fmt.Sprintf("card-%d", i)), row, [][2]string{{HeaderEmittedAt, "1700000000000"}, {HeaderHost, "host-1"}})
	}
	lz4, err := kgo.DefaultCompressor(kgo.Lz4Compression(), kgo.NoCompression())
	if err != nil {
		b.Fatal(err)
	}
	aware := &batchCompressor{other: lz4}
	dec := kgo.DefaultDecompressor()
	run := func(b *testing.B, c kgo.Compressor, src []byte) {
		var buf bytes.Buffer
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			buf.Reset()
			out, codec := c.Compress(&buf, src)
			if out == nil || codec == kgo.CodecNone {
				continue // sent as it is: the fetch has nothing to decompress
			}
			if _, err := dec.Decompress(out, codec); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("hops/lz4", func(b *testing.B) { run(b, lz4, hops) })
	b.Run("hops/hop-aware", func(b *testing.B) { run(b, aware, hops) })
	b.Run("features/lz4", func(b *testing.B) { run(b, lz4, feats) })
	b.Run("features/hop-aware", func(b *testing.B) { run(b, aware, feats) })
	// The outputs' LZ4 as Compressor("lz4", ...) writes it: no content checksum.
	b.Run("features/lz4-frames", func(b *testing.B) { run(b, &batchCompressor{other: newLZ4Frames()}, feats) })
}
