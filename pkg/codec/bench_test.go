package codec

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/twmb/avro"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// The benchmarks compare three codecs for the hot path: the hand-written one
// (fast), goavro (the generic reference), and github.com/twmb/avro
// (reflection-based with cached plans), so that the choice of the hand-written
// one stays justified as the others change. BENCHMARKS.md, "Codec", has the
// current figures.

func benchTx() []byte {
	tx := Transaction{EventID: "9f1c2a64-7d3b-4f0e-b5a8-2c7e91d04a3f", EntityID: "card-4242424242424242",
		AmountMinor: 12_345, Currency: "EUR", EventTime: t0 + 1234}
	return EncodeTransaction(&tx)
}

func BenchmarkDecode(b *testing.B) {
	value := benchTx()
	l := DefaultLimits()
	run := func(b *testing.B, dec Decoder) {
		var tx Transaction
		b.ReportAllocs()
		b.SetBytes(int64(len(value)))
		cpu0 := cpuclock.Nanos()
		for b.Loop() {
			if r := dec.Decode(value, t0, true, &tx); r != nil {
				b.Fatal(r)
			}
		}
		b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
	}
	b.Run("codec=fast", func(b *testing.B) { run(b, &fastDecoder{limits: l}) })
	b.Run("codec=fast/borrowed", func(b *testing.B) {
		dec := &fastDecoder{limits: l}
		var tx Transaction
		b.ReportAllocs()
		b.SetBytes(int64(len(value)))
		cpu0 := cpuclock.Nanos()
		for b.Loop() {
			if r := dec.DecodeBorrowed(value, t0, true, &tx); r != nil {
				b.Fatal(r)
			}
		}
		b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
	})
	b.Run("codec=goavro", func(b *testing.B) {
		dec, err := newGoavroDecoder(schemas.Transaction, l)
		if err != nil {
			b.Fatal(err)
		}
		run(b, dec)
	})
	b.Run("codec=twmb-avro", func(b *testing.B) { run(b, newTwmbDecoder(b, l)) })
}

// BenchmarkDecodeResolved is the slow path a producer on another writer
// schema gets: goavro decode with the writer schema, then projection onto ours.
func BenchmarkDecodeResolved(b *testing.B) {
	dec, err := NewDecoder(evolvedSchema, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	value := cat(varint(21), []byte("card-4242424242424242"), varint(36), []byte("9f1c2a64-7d3b-4f0e-b5a8-2c7e91d04a3f"),
		varint(1), varint(3), []byte("vip"), varint(0), varint(12_345), varint(0), varint(1), varint(3), []byte("EUR"), varint(t0+1234))
	var tx Transaction
	b.ReportAllocs()
	b.SetBytes(int64(len(value)))
	for b.Loop() {
		if r := dec.Decode(value, t0, true, &tx); r != nil {
			b.Fatal(r)
		}
	}
}

func BenchmarkEncodeFeatures(b *testing.B) {
	f := exampleFeatures() // four windows, the default set
	b.Run("codec=fast", func(b *testing.B) {
		buf := make([]byte, 0, 256)
		b.ReportAllocs()
		cpu0 := cpuclock.Nanos()
		for b.Loop() {
			buf = AppendFeatures(buf[:0], &f)
		}
		b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
		b.SetBytes(int64(len(buf)))
	})
	// The same record every time lets the branch predictor learn every varint's
	// length; the pipeline's records differ (times, counts, sums, offsets).
	varied := func() []Features {
		rng := rand.New(rand.NewPCG(25, 2))
		fs := make([]Features, 1024)
		for k := range fs {
			g := exampleFeatures()
			g.Windows = slices.Clone(g.Windows)
			g.EventTime += rng.Int64N(3_600_000)
			g.SourceOffset = rng.Int64N(1 << 20)
			g.MsSincePrevious = rng.Int64N(1 << uint(rng.IntN(32)))
			for w := range g.Windows {
				a := &g.Windows[w]
				a.Count = 1 + rng.Int64N(1<<uint(rng.IntN(12)))
				a.MinMinor = rng.Int64N(1 << uint(rng.IntN(20)))
				a.MaxMinor = a.MinMinor + rng.Int64N(1<<uint(rng.IntN(20)))
				a.SumMinor = a.Count * (a.MinMinor + a.MaxMinor) / 2
			}
			fs[k] = g
		}
		return fs
	}
	// FeaturesEncoder, as the pipeline encodes: the windows' names and widths, the
	// topic and the partition encoded once.
	for _, withEncoder := range []bool{false, true} {
		name := map[bool]string{false: "codec=fast/varied", true: "codec=fast/varied/encoder"}[withEncoder]
		b.Run(name, func(b *testing.B) {
			fs := varied()
			var enc FeaturesEncoder
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			cpu0 := cpuclock.Nanos()
			k := 0
			for b.Loop() {
				if withEncoder {
					buf = enc.Append(buf[:0], &fs[k&1023])
				} else {
					buf = AppendFeatures(buf[:0], &fs[k&1023])
				}
				k++
			}
			b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
	b.Run("codec=goavro", func(b *testing.B) {
		buf := make([]byte, 0, 256)
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, err = goavroFeatures(buf[:0], &f); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(int64(len(buf)))
	})
	b.Run("codec=twmb-avro", func(b *testing.B) {
		s := avro.MustParse(schemas.VelocityFeatures)
		tf := toTwmbFeatures(&f)
		buf := make([]byte, 0, 256)
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, err = s.AppendEncode(buf[:0], &tf); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(int64(len(buf)))
	})
}

// twmbTx and twmbFeatures mirror our schemas for github.com/twmb/avro, which
// maps by struct tags.
type twmbTx struct {
	EventID     string `avro:"event_id"`
	EntityID    string `avro:"entity_id"`
	AmountMinor int64  `avro:"amount_minor"`
	Currency    string `avro:"currency"`
	EventTime   int64  `avro:"event_time"`
}

type twmbWindow struct {
	Name     string `avro:"window"`
	WindowMs int64  `avro:"window_ms"`
	BucketMs int64  `avro:"bucket_ms"`
	Count    int64  `avro:"count"`
	SumMinor int64  `avro:"sum_minor"`
	MinMinor int64  `avro:"min_minor"`
	MaxMinor int64  `avro:"max_minor"`
}

type twmbFeatures struct {
	EventID         string       `avro:"event_id"`
	EntityID        string       `avro:"entity_id"`
	EventTime       int64        `avro:"event_time"`
	Windows         []twmbWindow `avro:"windows"`
	MsSincePrevious *int64       `avro:"ms_since_previous"`
	Late            bool         `avro:"late"`
	SourceTopic     string       `avro:"source_topic"`
	SourcePartition int32        `avro:"source_partition"`
	SourceOffset    int64        `avro:"source_offset"`
}

func toTwmbFeatures(f *Features) twmbFeatures {
	tf := twmbFeatures{EventID: f.EventID, EntityID: f.EntityID, EventTime: f.EventTime, Late: f.Late,
		SourceTopic: f.SourceTopic, SourcePartition: f.SourcePartition, SourceOffset: f.SourceOffset}
	for _, w := range f.Windows {
		tf.Windows = append(tf.Windows, twmbWindow(w))
	}
	if f.HasPrevious {
		v := f.MsSincePrevious
		tf.MsSincePrevious = &v
	}
	return tf
}

// twmbDecoder is the Decoder we would ship if twmb/avro were the fastest: its
// decode into a mirror struct, then the shared validation.
type twmbDecoder struct {
	s      *avro.Schema
	limits Limits
}

func newTwmbDecoder(tb testing.TB, l Limits) *twmbDecoder {
	s, err := avro.Parse(schemas.Transaction)
	if err != nil {
		tb.Fatal(err)
	}
	return &twmbDecoder{s: s, limits: l}
}

func (d *twmbDecoder) Decode(value []byte, maxSeen int64, hasMaxSeen bool, tx *Transaction) *Rejection {
	if len(value) > d.limits.MaxRecordBytes {
		return tooLarge(len(value), d.limits.MaxRecordBytes)
	}
	var t twmbTx
	rest, err := d.s.Decode(value, &t)
	if err != nil {
		return &Rejection{ReasonDecode, err.Error()}
	}
	if len(rest) != 0 {
		return &Rejection{ReasonDecode, "trailing bytes after the record"}
	}
	*tx = Transaction{EventID: t.EventID, EntityID: t.EntityID, AmountMinor: t.AmountMinor, Currency: t.Currency, EventTime: t.EventTime}
	return validate(tx, &d.limits, maxSeen, hasMaxSeen)
}
