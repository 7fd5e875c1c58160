package sink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// lz4Inputs are batches of the shapes the compressor meets and the edges of the
// format: empty, shorter than the 13 bytes a match needs, all one byte (matches
// that run to the end-of-block rules), random (nothing to find: stored blocks),
// features batches of several sizes (one block, several, a last block of a few
// bytes), and runs that cross a 64 KiB block boundary.
func lz4Inputs(t testing.TB) map[string][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	in := map[string][]byte{
		"empty":          {},
		"one byte":       {7},
		"12 bytes":       []byte("abcdabcdabcd"),
		"13 bytes":       []byte("abcdabcdabcda"),
		"zeros 17":       make([]byte, 17),
		"zeros 100 KiB":  make([]byte, 100<<10),
		"zeros 64 KiB":   make([]byte, 64<<10),
		"zeros 64 KiB+1": make([]byte, 64<<10+1),
		"random 1000":    random(1000),
		"random 200 KiB": random(200 << 10),
		"text 70 KiB":    bytes.Repeat([]byte("velocity features, card-12345, 1m 5m 1h 24h; "), 70<<10/45),
	}
	for _, n := range []int{1, 50, 200, 2000, 5000} {
		in[fmt.Sprintf("features %d", n)] = featuresBatch(t, n, int64(n))
	}
	// Half random, half repeated: stored and compressed blocks in one frame.
	mixed := append(random(64<<10), make([]byte, 64<<10)...)
	in["mixed"] = append(mixed, random(10)...)
	return in
}

// featuresBatch is n features records as a producer batch holds them (record
// framing, key, value, our headers), with values made as the pipeline makes them:
// 36-byte event ids, Zipf entities, the default windows.
func featuresBatch(t testing.TB, n int, seed int64) []byte {
	rng := rand.New(rand.NewPCG(uint64(seed), 9))
	z := rand.NewZipf(rng, 1.1, 10, 99_999)
	var b []byte
	for i := range n {
		id := fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", rng.Uint32(), rng.IntN(1<<16), rng.IntN(1<<16), rng.IntN(1<<16), rng.Uint64()&(1<<48-1))
		entity := fmt.Sprintf("card-%07d", z.Uint64())
		amount := rng.Int64N(100_000)
		f := codec.Features{EventID: id, EntityID: entity, EventTime: 1_700_000_000_000 + int64(i)*3, MsSincePrevious: rng.Int64N(90_000),
			HasPrevious: rng.IntN(3) != 0, SourceTopic: "transactions", SourcePartition: 2, SourceOffset: 5_000_000 + int64(i)}
		for k, w := range []struct {
			name        string
			window, bkt int64
		}{{"1m", 60_000, 1_000}, {"5m", 300_000, 10_000}, {"1h", 3_600_000, 60_000}, {"24h", 86_400_000, 3_600_000}} {
			c := 1 + rng.Int64N(int64(4<<k))
			f.Windows = append(f.Windows, codec.WindowAgg{Name: w.name, WindowMs: w.window, BucketMs: w.bkt, Count: c, SumMinor: c * amount, MinMinor: amount / 2, MaxMinor: amount * 2})
		}
		b = appendRecordV2(b, []byte(entity), codec.AppendFeatures(nil, &f), [][2]string{
			{HeaderEmittedAt, fmt.Sprint(1_700_000_000_000 + int64(i))}, {HeaderHost, "velocity-7f9c4-2"}, {HeaderBuild, "v1.4.0 (abc1234)"}})
	}
	return b
}

// decodeLZ4Strict decodes a frame as the LZ4 format describes it, independently of
// any library, and fails on anything a conforming compressor does not write: a
// block over 64 KiB, an offset of 0 or before the block, a block whose last
// sequence has a match, a last match that starts fewer than 12 bytes before the
// block's end or ends fewer than 5 before it.
func decodeLZ4Strict(frame []byte) ([]byte, error) {
	if len(frame) < 7 || binary.LittleEndian.Uint32(frame) != lz4Magic {
		return nil, errors.New("no frame magic")
	}
	if frame[4] != lz4FLG || frame[5] != lz4BD || frame[6] != byte(xxh32Short(frame[4:6])>>8) {
		return nil, fmt.Errorf("descriptor %x", frame[4:7])
	}
	p := frame[7:]
	var out []byte
	for {
		if len(p) < 4 {
			return nil, errors.New("truncated block size")
		}
		size := binary.LittleEndian.Uint32(p)
		p = p[4:]
		if size == 0 {
			if len(p) != 0 {
				return nil, fmt.Errorf("%d bytes after the end mark", len(p))
			}
			return out, nil
		}
		stored := size&lz4Uncompressed != 0
		size &^= lz4Uncompressed
		if size > lz4BlockMax || int(size) > len(p) {
			return nil, fmt.Errorf("block of %d bytes", size)
		}
		if stored {
			out = append(out, p[:size]...)
		} else {
			block, err := decodeLZ4BlockStrict(p[:size])
			if err != nil {
				return nil, err
			}
			if len(block) > lz4BlockMax {
				return nil, fmt.Errorf("block decodes to %d bytes", len(block))
			}
			out = append(out, block...)
		}
		p = p[size:]
	}
}

func decodeLZ4BlockStrict(b []byte) ([]byte, error) {
	var out []byte
	length := func(n int) (int, error) {
		if n < 15 {
			return n, nil
		}
		for {
			if len(b) == 0 {
				return 0, errors.New("truncated length")
			}
			c := b[0]
			b = b[1:]
			n += int(c)
			if c != 255 {
				return n, nil
			}
		}
	}
	lastMatchStart, lastMatchEnd := -1, -1
	for {
		if len(b) == 0 {
			return nil, errors.New("block ends without a literals-only sequence")
		}
		token := b[0]
		b = b[1:]
		ll, err := length(int(token >> 4))
		if err != nil {
			return nil, err
		}
		if ll > len(b) {
			return nil, errors.New("truncated literals")
		}
		out = append(out, b[:ll]...)
		b = b[ll:]
		if len(b) == 0 { // the last sequence: literals only
			if token&15 != 0 {
				return nil, errors.New("last sequence has a match length")
			}
			n := len(out)
			if lastMatchStart >= 0 && (n-lastMatchStart < lz4MFLimit || n-lastMatchEnd < lz4LastLiterals) {
				return nil, fmt.Errorf("last match [%d, %d) too close to the end %d", lastMatchStart, lastMatchEnd, n)
			}
			return out, nil
		}
		if len(b) < 2 {
			return nil, errors.New("truncated offset")
		}
		off := int(binary.LittleEndian.Uint16(b))
		b = b[2:]
		ml, err := length(int(token & 15))
		if err != nil {
			return nil, err
		}
		ml += lz4MinMatch
		if off == 0 || off > len(out) {
			return nil, fmt.Errorf("offset %d at %d", off, len(out))
		}
		lastMatchStart = len(out)
		for range ml {
			out = append(out, out[len(out)-off])
		}
		lastMatchEnd = len(out)
	}
}

// TestLZ4FramesRoundTrip: every input's frame decodes to it, by pierrec/lz4 (which
// the client's decompressor uses) and by the strict decoder above (the format's end
// rules, which other clients' decoders rely on); a compressible features batch
// comes out smaller, and within 10 % of pierrec/lz4's size.
func TestLZ4FramesRoundTrip(t *testing.T) {
	c := newLZ4Frames()
	dec := kgo.DefaultDecompressor()
	for name, in := range lz4Inputs(t) {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			buf.WriteString("left alone")
			out, codec := c.Compress(&buf, in)
			if codec != kgo.CodecLz4 || !bytes.HasPrefix(out, []byte("left alone")) {
				t.Fatalf("codec %v; the buffer's earlier bytes were not kept", codec)
			}
			frame := out[len("left alone"):]
			back, err := dec.Decompress(frame, codec)
			if err != nil || !bytes.Equal(back, in) {
				t.Fatalf("client's decompressor: %d bytes (%v), want %d", len(back), err, len(in))
			}
			if back, err = decodeLZ4Strict(frame); err != nil || !bytes.Equal(back, in) {
				t.Fatalf("strict decoder: %d bytes (%v), want %d", len(back), err, len(in))
			}
			if len(in) > 0 && len(frame) > 7+len(in)+4*(len(in)/lz4BlockMax+1)+4 {
				t.Fatalf("frame %d bytes for %d: larger than stored blocks", len(frame), len(in))
			}
			if name == "mixed" { // random, zeros, 10 random bytes: stored, compressed, stored
				stored, packed := lz4BlockKinds(t, frame)
				if stored != 2 || packed != 1 {
					t.Fatalf("%d stored and %d compressed blocks, want 2 and 1", stored, packed)
				}
			}
			if len(in) >= 1000 && bytes.HasPrefix([]byte(name), []byte("features")) {
				ref := referenceLZ4(in)
				if len(frame) >= len(in) || float64(len(frame)) > 1.1*float64(len(ref)) {
					t.Fatalf("%d bytes compressed to %d (pierrec/lz4: %d)", len(in), len(frame), len(ref))
				}
			}
		})
	}
}

// lz4BlockKinds counts a frame's stored and compressed blocks.
func lz4BlockKinds(t *testing.T, frame []byte) (stored, packed int) {
	p := frame[7:]
	for {
		size := binary.LittleEndian.Uint32(p)
		if size == 0 {
			return stored, packed
		}
		if size&lz4Uncompressed != 0 {
			stored++
		} else {
			packed++
		}
		p = p[4+size&^lz4Uncompressed:]
	}
}

// TestLZ4EveryLength: inputs of every length up to 600 bytes and around the 64 KiB
// block boundary, of four patterns, round-trip through the strict decoder, each input
// ending where an unreadable page begins (guardedInput, on Linux): a load past its end
// crashes the test.
func TestLZ4EveryLength(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	patterns := map[string]func(i int) byte{
		"zeros":  func(int) byte { return 0 },
		"period": func(i int) byte { return byte(i % 7) },
		"random": func(int) byte { return byte(rng.Uint32()) },
		"runs":   func(i int) byte { return byte(i / 19) },
	}
	var lengths []int
	for n := range 601 {
		lengths = append(lengths, n)
	}
	for n := lz4BlockMax - 20; n <= lz4BlockMax+20; n++ {
		lengths = append(lengths, n)
	}
	tab := new(lz4Table)
	for name, p := range patterns {
		for _, n := range lengths {
			in := guardedInput(t, n)
			for i := range in {
				in[i] = p(i)
			}
			frame := appendLZ4Frame(nil, in, tab)
			if back, err := decodeLZ4Strict(frame); err != nil || !bytes.Equal(back, in) {
				t.Fatalf("%s, %d bytes: %v", name, n, err)
			}
		}
	}
}

// TestLZ4FrameDescriptor: the descriptor's checksum byte is the one the reference
// writer computes for the same flags (pierrec/lz4, 64 KiB blocks, no checksums).
func TestLZ4FrameDescriptor(t *testing.T) {
	var buf bytes.Buffer
	w := lz4.NewWriter(&buf)
	if err := w.Apply(lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false), lz4.ConcurrencyOption(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	frame := appendLZ4Frame(nil, []byte("x"), new(lz4Table))
	if !bytes.Equal(frame[:7], buf.Bytes()[:7]) {
		t.Fatalf("header % x, the reference writer's % x", frame[:7], buf.Bytes()[:7])
	}
}

// FuzzLZ4Frames: any batch round-trips through both decoders.
func FuzzLZ4Frames(f *testing.F) {
	for _, in := range lz4Inputs(f) {
		if len(in) < 4096 {
			f.Add(in)
		}
	}
	f.Add(featuresBatch(f, 20, 1))
	c := newLZ4Frames()
	f.Fuzz(func(t *testing.T, in []byte) {
		var buf bytes.Buffer
		frame, _ := c.Compress(&buf, in)
		back, err := decodeLZ4Strict(frame)
		if err != nil || !bytes.Equal(back, in) {
			t.Fatalf("strict decoder: %v", err)
		}
		r := lz4.NewReader(bytes.NewReader(frame))
		if back, err = io.ReadAll(r); err != nil || !bytes.Equal(back, in) {
			t.Fatalf("pierrec/lz4: %v", err)
		}
	})
}

func referenceLZ4(in []byte) []byte {
	var buf bytes.Buffer
	out, _ := newPierrecFrames().Compress(&buf, in)
	return out
}

// pierrecFrames is the compressor lz4Frames replaced: pierrec/lz4's writer at its
// fastest level without the content checksum. Kept as the benchmark's baseline.
type pierrecFrames struct{ w *lz4.Writer }

func newPierrecFrames() *pierrecFrames {
	w := lz4.NewWriter(nil)
	if err := w.Apply(lz4.CompressionLevelOption(lz4.Fast), lz4.ChecksumOption(false)); err != nil {
		panic(err)
	}
	return &pierrecFrames{w}
}

func (c *pierrecFrames) Compress(dst *bytes.Buffer, src []byte, _ ...kgo.CompressFlag) ([]byte, kgo.CompressionCodecType) {
	c.w.Reset(dst)
	if _, err := c.w.Write(src); err != nil {
		return nil, kgo.CodecError
	}
	if err := c.w.Close(); err != nil {
		return nil, kgo.CodecError
	}
	return dst.Bytes(), kgo.CodecLz4
}

// BenchmarkLZ4Features: one features batch of 50, 200 or 2 000 records (about 11,
// 45 and 450 KB) through lz4Frames and through pierrec/lz4's writer (the client's
// codec, without the content checksum), the batch and the buffer reused as the
// client reuses them. ratio = compressed/uncompressed bytes.
func BenchmarkLZ4Features(b *testing.B) {
	for _, n := range []int{50, 200, 2000} {
		src := featuresBatch(b, n, 3)
		for _, c := range []struct {
			name string
			c    kgo.Compressor
		}{{"ours", newLZ4Frames()}, {"pierrec", newPierrecFrames()}} {
			b.Run(fmt.Sprintf("records=%d/%s", n, c.name), func(b *testing.B) {
				var buf bytes.Buffer
				var size int
				b.SetBytes(int64(len(src)))
				cpu0 := cpuclock.Nanos()
				for b.Loop() {
					buf.Reset()
					out, _ := c.c.Compress(&buf, src)
					size = len(out)
				}
				b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(size)/float64(len(src)), "ratio")
			})
		}
	}
}
