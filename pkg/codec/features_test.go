package codec

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/schemas"
)

var featuresCodec = func() *goavro.Codec {
	c, err := goavro.NewCodec(schemas.VelocityFeatures)
	if err != nil {
		panic(err)
	}
	return c
}()

// goavroFeatures encodes f through goavro's generic path: the reference that
// AppendFeatures must match byte for byte.
func goavroFeatures(dst []byte, f *Features) ([]byte, error) {
	windows := make([]any, len(f.Windows))
	for i, w := range f.Windows {
		windows[i] = map[string]any{"window": w.Name, "window_ms": w.WindowMs, "bucket_ms": w.BucketMs,
			"count": w.Count, "sum_minor": w.SumMinor, "min_minor": w.MinMinor, "max_minor": w.MaxMinor}
	}
	var prev any
	if f.HasPrevious {
		prev = goavro.Union("long", f.MsSincePrevious)
	}
	return featuresCodec.BinaryFromNative(dst, map[string]any{
		"event_id": f.EventID, "entity_id": f.EntityID, "event_time": f.EventTime, "windows": windows,
		"ms_since_previous": prev, "late": f.Late, "source_topic": f.SourceTopic,
		"source_partition": f.SourcePartition, "source_offset": f.SourceOffset,
	})
}

// goavroDecodeFeatures is the reference for DecodeFeatures.
func goavroDecodeFeatures(b []byte) (Features, error) {
	native, rest, err := featuresCodec.NativeFromBinary(b)
	if err != nil {
		return Features{}, err
	}
	if len(rest) != 0 {
		return Features{}, errors.New("trailing bytes")
	}
	m := native.(map[string]any)
	f := Features{
		EventID: m["event_id"].(string), EntityID: m["entity_id"].(string),
		EventTime: m["event_time"].(time.Time).UnixMilli(), Late: m["late"].(bool),
		SourceTopic: m["source_topic"].(string), SourcePartition: m["source_partition"].(int32),
		SourceOffset: m["source_offset"].(int64),
	}
	for _, x := range m["windows"].([]any) {
		w := x.(map[string]any)
		f.Windows = append(f.Windows, WindowAgg{w["window"].(string), w["window_ms"].(int64), w["bucket_ms"].(int64),
			w["count"].(int64), w["sum_minor"].(int64), w["min_minor"].(int64), w["max_minor"].(int64)})
	}
	if u, ok := m["ms_since_previous"].(map[string]any); ok {
		f.HasPrevious, f.MsSincePrevious = true, u["long"].(int64)
	}
	return f, nil
}

func exampleFeatures() Features {
	return Features{
		EventID: "e5", EntityID: "card-A", EventTime: t0 + 3200,
		Windows: []WindowAgg{
			{"1m", 60_000, 1_000, 5, 8900, 100, 5000},
			{"5m", 300_000, 5_000, 5, 8900, 100, 5000},
			{"1h", 3_600_000, 60_000, 5, 8900, 100, 5000},
			{"24h", 86_400_000, 3_600_000, 5, 8900, 100, 5000},
		},
		MsSincePrevious: 1300, HasPrevious: true,
		SourceTopic: "transactions", SourcePartition: 3, SourceOffset: 4,
	}
}

func TestFeaturesEncoding(t *testing.T) {
	full := exampleFeatures()
	tests := []struct {
		name string
		f    Features
	}{
		{"four windows with a previous event", full},
		{"first event: ms_since_previous null", func() Features { f := full; f.HasPrevious, f.MsSincePrevious = false, 0; return f }()},
		{"late event, gap 0", func() Features { f := full; f.Late, f.MsSincePrevious = true, 0; return f }()},
		{"no windows", Features{EventID: "x", EntityID: "y", SourceTopic: "t"}},
		{"extremes", Features{EventID: "é", EntityID: "\x00", EventTime: math.MinInt64, HasPrevious: true,
			MsSincePrevious: math.MaxInt64, SourcePartition: math.MinInt32, SourceOffset: math.MaxInt64,
			Windows: []WindowAgg{{"", math.MaxInt64, 1, math.MinInt64, -1, 0, 1}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendFeatures(nil, &tt.f)
			want, err := goavroFeatures(nil, &tt.f)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("AppendFeatures\n got %x\nwant %x (goavro)", got, want)
			}
			if again := AppendFeatures([]byte{0xAA}, &tt.f); !bytes.Equal(again[1:], got) || again[0] != 0xAA {
				t.Fatalf("appending to a non-empty buffer changed the bytes")
			}
			back, err := DecodeFeatures(got)
			if err != nil {
				t.Fatal(err)
			}
			want2 := tt.f
			if !want2.HasPrevious {
				want2.MsSincePrevious = 0
			}
			if !reflect.DeepEqual(back, want2) {
				t.Fatalf("DecodeFeatures\n got %+v\nwant %+v", back, want2)
			}
		})
	}
}

func TestDecodeFeaturesRejectsCorruptInput(t *testing.T) {
	f := exampleFeatures()
	good := AppendFeatures(nil, &f)
	bad := map[string][]byte{
		"empty":          nil,
		"trailing byte":  append(append([]byte{}, good...), 0),
		"huge array":     cat(varint(2), []byte("e5"), varint(1), []byte("A"), varint(t0), varint(math.MaxInt64)),
		"min block":      cat(varint(2), []byte("e5"), varint(1), []byte("A"), varint(t0), varint(math.MinInt64)),
		"bad union":      cat(varint(2), []byte("e5"), varint(1), []byte("A"), varint(t0), []byte{0, 4}),
		"bad boolean":    cat(varint(2), []byte("e5"), varint(1), []byte("A"), varint(t0), []byte{0, 0, 2}),
		"int over range": cat(varint(2), []byte("e5"), varint(1), []byte("A"), varint(t0), []byte{0, 0, 0}, varint(0), varint(1<<40), varint(1)),
	}
	for i := range good {
		bad[fmt.Sprintf("truncated to %d bytes", i)] = good[:i]
	}
	for name, b := range bad {
		if _, err := DecodeFeatures(b); !errors.Is(err, ErrBadFeatures) {
			t.Errorf("%s: err = %v, want ErrBadFeatures", name, err)
		}
	}
}

func TestAppendFeaturesDoesNotAllocate(t *testing.T) {
	f := exampleFeatures()
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(100, func() { buf = AppendFeatures(buf[:0], &f) }); n != 0 {
		t.Fatalf("AppendFeatures allocates %v times with enough capacity", n)
	}
}
