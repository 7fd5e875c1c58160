package sink

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

// Compression returns the producer option for a batch compression codec by name:
// lz4 (the default: cheap, and Kafka's usual choice), zstd (smaller, more CPU),
// snappy, gzip, or none (for a broker on the same host, where compressing only costs
// CPU: on this project's 2-core benchmark machine LZ4 was a fifth of our CPU). Hop
// records are left uncompressed (Compressor with hops "none").
func Compression(name string) (kgo.Opt, error) { return Compressor(name, "none") }

// Compressor returns the producer option that compresses the batches of features
// records and dead letters with the codec named outputs and the batches of hop
// records (docs/repartition.md) with the codec named hops; the names are
// Compression's.
//
// Hop records are the service's own traffic: produced by a first stage and fetched
// back by a second stage of the same deployment, never read by anyone else. With
// LZ4 on both sides, compressing them and decompressing them again was 14-18 % of the
// CPU of a run with 2 or 3 groups (BENCHMARKS.md, "Re-keyed groups"), so
// "none" is the service's default for them; a deployment whose brokers are far
// enough away for the bytes to matter can compress them too.
//
// The producer client compresses a batch, which holds records of one topic
// partition, without saying which topic it is for, so the compressor recognises a
// hop batch by its first record: no headers, and a value that reads as a hop
// record's first fields (isHopBatch). Every features record and dead letter carries
// headers (Tracker.Features, Tracker.Dead), so a batch of them is never taken for a
// hop batch. Under --exactly-once the hop records share the input partition's
// transactional client with its features; this rule applies there unchanged. A
// mistaken verdict could only change whether a batch is compressed, never what it
// holds: the broker and every consumer read either form.
func Compressor(outputs, hops string) (kgo.Opt, error) {
	o, err := codecNamed(outputs)
	if err != nil {
		return nil, err
	}
	h, err := codecNamed(hops)
	if err != nil {
		return nil, fmt.Errorf("hop records: %w", err)
	}
	// Always a Compressor option, even for none and none: a client takes its
	// last WithCompressor over any ProducerBatchCompression, so only another
	// WithCompressor overrides ProducerOpts' default.
	c := &batchCompressor{}
	if c.other, err = compressorFor(outputs, o); err != nil {
		return nil, err
	}
	if c.hops, err = compressorFor(hops, h); err != nil {
		return nil, err
	}
	return kgo.WithCompressor(c), nil
}

// compressorFor is the client's default compressor for codec c (named name),
// but for LZ4, which is lz4Frames.
func compressorFor(name string, c kgo.CompressionCodec) (kgo.Compressor, error) {
	if name == "lz4" {
		return newLZ4Frames(), nil
	}
	// The fallback matters only for brokers too old for the codec.
	return kgo.DefaultCompressor(c, kgo.NoCompression())
}

// defaultCompression is ProducerOpts' compression: LZ4 for features and dead
// letters, none for hop records.
var defaultCompression = func() kgo.Opt {
	o, err := Compressor("lz4", "none")
	if err != nil {
		panic(err) // constant arguments
	}
	return o
}()

func codecNamed(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "none":
		return kgo.NoCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("unknown compression %q: want lz4, zstd, snappy, gzip or none", name)
}

// batchCompressor compresses hop batches with hops and every other batch with
// other; a nil compressor leaves its batches uncompressed (kgo sends a batch
// uncompressed when Compress returns nil).
type batchCompressor struct {
	other, hops kgo.Compressor
}

func (c *batchCompressor) Compress(dst *bytes.Buffer, src []byte, flags ...kgo.CompressFlag) ([]byte, kgo.CompressionCodecType) {
	if c.other == nil && c.hops == nil {
		return nil, kgo.CodecNone
	}
	comp := c.other
	if isHopBatch(src) {
		comp = c.hops
	}
	if comp == nil {
		return nil, kgo.CodecNone
	}
	return comp.Compress(dst, src, flags...)
}

// isHopBatch reports whether records, the records of a batch as the producer
// client encodes them (Kafka's record format v2: per record a varint length, an
// int8 of attributes, a varint timestamp delta and offset delta, the key and the
// value each as a varint length and bytes, then a varint header count and the
// headers), starts with a hop record: one without headers whose value reads as
// a hop record's first fields (repartition.PeekWatermark). It reads one record's
// framing, a few varints per batch, and never panics on any input.
func isHopBatch(records []byte) bool {
	r := recordReader{b: records}
	r.varint()      // record length
	r.skip(1)       // attributes
	r.varint()      // timestamp delta
	r.varint()      // offset delta
	r.skip(r.len()) // key
	value := r.bytes(r.len())
	headers := r.varint()
	if r.bad || headers != 0 {
		return false
	}
	_, _, err := repartition.PeekWatermark(value)
	return err == nil
}

// recordReader reads Kafka's zigzag varints; after a malformed or short read,
// bad is set and every further read returns zero.
type recordReader struct {
	b   []byte
	bad bool
}

func (r *recordReader) varint() int64 {
	if r.bad {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

// len reads a key's or value's length; -1 (null) is an empty field.
func (r *recordReader) len() int {
	n := r.varint()
	switch {
	case n == -1:
		return 0
	case n < -1 || n > int64(len(r.b)):
		r.bad = true
		return 0
	}
	return int(n)
}

func (r *recordReader) skip(n int) { r.bytes(n) }

func (r *recordReader) bytes(n int) []byte {
	if r.bad || n > len(r.b) {
		r.bad = true
		return nil
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}
