package replay

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// TestFeatureViewMatchesDecodeFeatures checks the in-place parser against
// codec's decoder on random records, and that it refuses damaged ones.
func TestFeatureViewMatchesDecodeFeatures(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	extremes := []int64{0, 1, -1, 63, 64, -65, math.MaxInt64, math.MinInt64, 1 << 40}
	num := func() int64 {
		if rng.IntN(3) == 0 {
			return extremes[rng.IntN(len(extremes))]
		}
		return rng.Int64N(1<<50) - 1<<49
	}
	str := func() string {
		b := make([]byte, rng.IntN(200))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return string(b)
	}
	var v featureView
	for i := range 2000 {
		f := codec.Features{
			EventID: str(), EntityID: str(), EventTime: num(),
			MsSincePrevious: num(), HasPrevious: rng.IntN(2) == 0, Late: rng.IntN(2) == 0,
			SourceTopic: str(), SourcePartition: int32(rng.Int64N(1<<32) - 1<<31), SourceOffset: num(),
		}
		if !f.HasPrevious {
			f.MsSincePrevious = 0
		}
		for range rng.IntN(6) {
			f.Windows = append(f.Windows, codec.WindowAgg{Name: str(), WindowMs: num(), BucketMs: num(), Count: num(), SumMinor: num(), MinMinor: num(), MaxMinor: num()})
		}
		b := codec.AppendFeatures(nil, &f)
		want, err := codec.DecodeFeatures(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.parse(b); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		got := codec.Features{
			EventID: string(v.eventID), EntityID: string(v.entityID), EventTime: v.eventTime,
			MsSincePrevious: v.msSincePrevious, HasPrevious: v.hasPrevious, Late: v.late,
			SourceTopic: string(v.sourceTopic), SourcePartition: v.sourcePartition, SourceOffset: v.sourceOffset,
		}
		for _, w := range v.windows {
			got.Windows = append(got.Windows, codec.WindowAgg{Name: string(w.name), WindowMs: w.windowMs, BucketMs: w.bucketMs, Count: w.count, SumMinor: w.sumMinor, MinMinor: w.minMinor, MaxMinor: w.maxMinor})
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("record %d:\n got %+v\nwant %+v", i, got, want)
		}
		// Every strict prefix is damaged and must be refused, never read as
		// a shorter record.
		for cut := 0; cut < len(b); cut += 1 + len(b)/17 {
			if err := v.parse(b[:cut]); !errors.Is(err, errBadValue) {
				t.Fatalf("record %d cut at %d of %d: err %v, want errBadValue", i, cut, len(b), err)
			}
		}
		if err := v.parse(append(b, 0)); !errors.Is(err, errBadValue) {
			t.Fatalf("record %d with a trailing byte: err %v", i, err)
		}
	}
}

// TestAppendJSONString checks the hand-written escaper against encoding/json:
// decoding what it writes gives back the input (with invalid UTF-8 replaced).
func TestAppendJSONString(t *testing.T) {
	tests := []struct{ name, in string }{
		{"empty", ""},
		{"plain", "card-A"},
		{"quote and backslash", `a"b\c`},
		{"control characters", "a\nb\rc\td\x00e\x1f"},
		{"html is left alone", "<a&b>"},
		{"multibyte", "carte-é-日本-🙂"},
		{"invalid utf-8", "a\xffb\xc3"},
		{"line separator", "a\u2028b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := appendJSONString(nil, []byte(tt.in))
			var got string
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("%s is not a JSON string: %v", b, err)
			}
			want := strings.ToValidUTF8(tt.in, "\uFFFD")
			if tt.name == "invalid utf-8" {
				want = "a\uFFFDb\uFFFD"
			}
			if got != want {
				t.Errorf("round trip %q, want %q (encoded %s)", got, want, b)
			}
		})
	}
}

// TestDeadJSONLSink checks a dead letter's fields, including a record without
// a key (null, not "") and binary bytes in base64.
func TestDeadJSONLSink(t *testing.T) {
	tests := []struct {
		name    string
		key     []byte
		wantKey *string
	}{
		{"with key", []byte("card-\xff"), ptr(base64.StdEncoding.EncodeToString([]byte("card-\xff")))},
		{"empty key", []byte{}, ptr("")},
		{"no key", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "dlq.jsonl")
			s, err := NewDeadJSONLSink(path)
			if err != nil {
				t.Fatal(err)
			}
			value := []byte{0, 1, 2, 0xff}
			err = s.Write(&pipeline.Output{Dead: true, Key: tt.key, Value: value, Reason: codec.Invalid("currency"), Err: "currency \"eur\"\n",
				SourceTopic: "t", SourcePartition: 3, SourceOffset: 42})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatalf("%s exists before commit (%v)", path, err)
			}
			if err := s.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := readLines[jsonDead](t, path)
			want := jsonDead{Reason: "invalid:currency", Error: "currency \"eur\"\n", SourceTopic: "t", SourcePartition: 3, SourceOffset: 42,
				Key: tt.wantKey, Value: base64.StdEncoding.EncodeToString(value)}
			if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

// TestDeadJSONLSinkNullValue: a tombstone's null value is written as null,
// an empty value as "", so the file tells them apart as the topic does.
func TestDeadJSONLSinkNullValue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dlq.jsonl")
	s, err := NewDeadJSONLSink(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range [][]byte{nil, {}} {
		if err := s.Write(&pipeline.Output{Dead: true, Key: []byte("k"), Value: v, Reason: codec.ReasonDecode, SourceTopic: "t", SourceOffset: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := readRawLines(t, path)
	if len(lines) != 2 || !strings.HasSuffix(lines[0], `"value":null}`) || !strings.HasSuffix(lines[1], `"value":""}`) {
		t.Errorf("lines %q, want the tombstone's value null and the empty one \"\"", lines)
	}
}

func ptr[T any](v T) *T { return &v }

// cancelAfter is a source wrapper that cancels the replay after n records, as
// a Ctrl-C would.
type cancelAfter struct {
	Source
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(ctx context.Context, p int32, prog *Progress, fn func(*Record) error) error {
	seen := 0
	return c.Source.Read(ctx, p, prog, func(r *Record) error {
		if seen++; seen == c.n {
			c.cancel()
		}
		return fn(r)
	})
}

// TestInterruptedReplayLeavesNoCompleteFile checks, for each file output, that
// a replay cancelled midway fails, and that after Abort neither the final name
// nor a .partial file exists, while a previous complete file is left as it was.
func TestInterruptedReplayLeavesNoCompleteFile(t *testing.T) {
	var lines strings.Builder
	for i := range 3000 {
		lines.WriteString(`{"event_id":"e` + strconv.Itoa(i) + `","entity_id":"c","amount_minor":1,"event_time":` + strconv.Itoa(1793491200000+i) + "}\n")
	}
	in := writeFile(t, "in.jsonl", lines.String())
	specs := exampleConfig(t).Specs
	tests := []struct {
		name string
		open func(path string) (Sink, error)
	}{
		{"jsonl", func(p string) (Sink, error) { return NewJSONLSink(p) }},
		{"parquet", func(p string) (Sink, error) { return NewParquetSink(p, specs) }},
	}
	for _, tt := range tests {
		for _, previous := range []bool{false, true} {
			name := tt.name
			if previous {
				name += "/over a previous file"
			}
			t.Run(name, func(t *testing.T) {
				out := filepath.Join(t.TempDir(), "out."+tt.name)
				if previous {
					if err := os.WriteFile(out, []byte("previous"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				s, err := tt.open(out)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				src := &cancelAfter{Source: mustOpenJSONL(t, in), n: 2000, cancel: cancel}
				_, err = Run(ctx, src, Config{Pipeline: exampleConfig(t), Features: s})
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Run: %v, want context.Canceled", err)
				}
				if _, err := os.Stat(out + PartialSuffix); err != nil {
					t.Fatalf("no .partial while the replay ran: %v", err)
				}
				if err := s.Abort(); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(out + PartialSuffix); !os.IsNotExist(err) {
					t.Errorf(".partial left behind: %v", err)
				}
				b, err := os.ReadFile(out)
				switch {
				case previous && string(b) != "previous":
					t.Errorf("previous file became %q (%v)", b, err)
				case !previous && !os.IsNotExist(err):
					t.Errorf("%s exists after an interrupted replay (%v)", out, err)
				}
			})
		}
	}
}

func TestParseBound(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{"", "start", false},
		{"start", "start", false},
		{"end", "end", false},
		{"0", "0", false},
		{"12345", "12345", false},
		{"-1", "", true},
		{"2026-11-01T00:00:00Z", "2026-11-01T00:00:00Z", false},
		{"2026-11-01T01:00:00.5+01:00", "2026-11-01T00:00:00.5Z", false},
		{"yesterday", "", true},
		{"2026-11-01", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			b, err := ParseBound(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && b.String() != tt.want {
				t.Errorf("got %s, want %s", b, tt.want)
			}
		})
	}
}

// TestAtomicFileKeepsEveryByte writes through the double-buffered file in
// pieces of awkward sizes across many buffer turns, and reads back exactly
// what was written, only under the final name.
func TestAtomicFileKeepsEveryByte(t *testing.T) {
	for _, piece := range []int{1, 7, 4096, fileChunk - 1, fileChunk + 3} {
		t.Run(strconv.Itoa(piece), func(t *testing.T) {
			name := filepath.Join(t.TempDir(), "out")
			a, err := createAtomic(name)
			if err != nil {
				t.Fatal(err)
			}
			var want []byte
			rng := rand.New(rand.NewPCG(uint64(piece), 9))
			for len(want) < 3*fileChunk+12345 && (piece > 1 || len(want) < 200_000) {
				p := make([]byte, piece)
				for i := range p {
					p[i] = byte(rng.IntN(256))
				}
				if _, err := a.Write(p); err != nil {
					t.Fatal(err)
				}
				want = append(want, p...)
			}
			if err := a.commit(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(name)
			if err != nil || string(got) != string(want) {
				t.Fatalf("read %d bytes (%v), wrote %d; equal=%v", len(got), err, len(want), string(got) == string(want))
			}
			if _, err := os.Stat(name + PartialSuffix); !os.IsNotExist(err) {
				t.Errorf(".partial left: %v", err)
			}
		})
	}
}
