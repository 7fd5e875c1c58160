package replay

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

// TestSpoolSections: records appended to several spools that share one file, in
// interleaved sections, come back from each section's reader in order and intact,
// whether they stayed in memory, were spilled, or straddle a spill; and the file is
// gone after close.
func TestSpoolSections(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit int
		sizes func(*rand.Rand) int
	}{
		{"in memory", 1 << 20, func(r *rand.Rand) int { return 1 + r.IntN(200) }},
		{"spilled often", 64, func(r *rand.Rand) int { return 1 + r.IntN(200) }},
		{"records near the reader's buffer", 3000, func(r *rand.Rand) int { return spoolReaderBuf - 16 - r.IntN(100) }},
		{"empty records", 16, func(*rand.Rand) int { return 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := &spillFile{dir: dir}
			rng := rand.New(rand.NewPCG(1, 2))
			const spools, sections = 3, 4
			sp := make([]spool, spools)
			want := make([][][][]byte, spools) // [spool][section][record]
			rd := make([][]spoolReader, spools)
			for i := range sp {
				sp[i] = spool{file: file, limit: c.limit}
				want[i] = make([][][]byte, sections)
				rd[i] = make([]spoolReader, sections)
			}
			for sec := range sections {
				for i := range sp {
					rd[i][sec] = spoolReader{sp: &sp[i], pos: sp[i].size()}
				}
				for range 300 {
					i := rng.IntN(spools)
					rec := make([]byte, c.sizes(rng))
					for j := range rec {
						rec[j] = byte(rng.Uint32())
					}
					if err := sp[i].append(rec); err != nil {
						t.Fatal(err)
					}
					want[i][sec] = append(want[i][sec], rec)
				}
				for i := range sp {
					rd[i][sec].end = sp[i].size()
				}
			}
			// Read the sections interleaved, as catchUp does.
			next := make([][]int, spools)
			for i := range next {
				next[i] = make([]int, sections)
			}
			for left := true; left; {
				left = false
				for i := range sp {
					for sec := range sections {
						r := &rd[i][sec]
						for range 1 + rng.IntN(5) {
							rec, ok, err := r.next()
							if err != nil {
								t.Fatal(err)
							}
							k := next[i][sec]
							if !ok {
								if k != len(want[i][sec]) {
									t.Fatalf("spool %d section %d ended after %d records; want %d", i, sec, k, len(want[i][sec]))
								}
								break
							}
							if k >= len(want[i][sec]) || !bytes.Equal(rec, want[i][sec][k]) {
								t.Fatalf("spool %d section %d record %d: got %d bytes, want %s", i, sec, k, len(rec), describe(want[i][sec], k))
							}
							next[i][sec]++
							left = true
						}
					}
				}
			}
			if spilled := file.size > 0; spilled != (c.limit < 1<<20) {
				t.Errorf("file holds %d bytes with a %d-byte limit", file.size, c.limit)
			}
			if err := file.close(); err != nil {
				t.Fatal(err)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("%s holds %v after close", dir, left)
			}
		})
	}
}

func describe(recs [][]byte, k int) string {
	if k >= len(recs) {
		return "none"
	}
	return fmt.Sprintf("%d bytes", len(recs[k]))
}
