package sink

import (
	"strings"
	"testing"
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
	}
}
