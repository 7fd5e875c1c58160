package service

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestPoolClasses(t *testing.T) {
	for _, tc := range []struct{ n, up, down int }{
		{0, poolMinClass, -1}, {1, poolMinClass, 0}, {63, 6, 5}, {64, 6, 6}, {65, 7, 6},
		{4096, 12, 12}, {4097, 13, 12}, {1 << 20, 20, 20},
	} {
		if got := classUp(tc.n); got != tc.up {
			t.Errorf("classUp(%d) = %d, want %d", tc.n, got, tc.up)
		}
		if got := classDown(tc.n); got != tc.down {
			t.Errorf("classDown(%d) = %d, want %d", tc.n, got, tc.down)
		}
	}
}

func TestRecordPoolReuse(t *testing.T) {
	var p recordPool
	rs := p.GetRecords(100)
	if cap(rs) < 100 || len(rs) != 0 {
		t.Fatalf("GetRecords(100): len %d cap %d", len(rs), cap(rs))
	}
	p.PutRecords(rs[:37])
	again := p.GetRecords(120) // same class (128)
	if cap(again) != cap(rs) || &again[:1][0] != &rs[:1][0] {
		t.Fatalf("a returned slice of the class was not reused")
	}
	if other := p.GetRecords(129); cap(other) < 129 {
		t.Fatalf("GetRecords(129) cap %d", cap(other))
	}
	// A grown slice of an odd capacity goes to the class it fully covers.
	p.PutRecords(make([]kgo.Record, 0, 200))
	if got := p.GetRecords(128); cap(got) < 128 {
		t.Fatalf("cap %d < 128", cap(got))
	}

	b := p.GetDecompressBytes(make([]byte, 1000), kgo.CodecLz4)
	if cap(b) < 4000 || len(b) != 0 {
		t.Fatalf("GetDecompressBytes: len %d cap %d", len(b), cap(b))
	}
	p.PutDecompressBytes(b[:123])
	if b2 := p.GetDecompressBytes(make([]byte, 900), kgo.CodecLz4); &b2[:1][0] != &b[:1][0] {
		t.Fatalf("decompress buffer not reused")
	}
	// The pool is bounded per class.
	for range 3 * poolPerClass {
		p.PutDecompressBytes(make([]byte, 0, 1<<12))
	}
	if n := len(p.bytes[12]); n != poolPerClass {
		t.Fatalf("class 12 holds %d slices, want at most %d", n, poolPerClass)
	}
}
