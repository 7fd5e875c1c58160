package repartition

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// snapshotStream is one simulated partition's records with restarts, flushes, idle
// markers and duplicates: every part of the state is non-empty somewhere along it.
func snapshotStream(seed uint64) (int, []Record) {
	r := rand.New(rand.NewPCG(seed, 99))
	opt := simOptions{sources: 3, offsets: 200, crashes: 2, flushes: true, idle: true, leases: true, duplicates: 10}
	return opt.sources, stamp(r, interleave(r, simulate(r, opt)))
}

// TestSnapshotRestoreEveryPoint restores a snapshot taken after every record of a
// stream and checks that the restored Merger writes the same image, and, continued
// with the rest of the stream, gives the same verdicts, releases and final image as
// the Merger that was never interrupted.
func TestSnapshotRestoreEveryPoint(t *testing.T) {
	sources, recs := snapshotStream(1)
	cfg := Config{Sources: sources, ExtWords: simExtWords}
	type point struct {
		snap     []byte
		verdicts []Verdict
		released []Event
	}
	// The uninterrupted run, remembering at each point the image and what follows.
	m, _ := New(cfg)
	snaps := make([][]byte, len(recs))
	verdicts := make([]Verdict, len(recs))
	releasedAfter := make([][]Event, len(recs)) // what Ready returns right after record i
	sawRel, sawLate, sawIdle, sawLease := false, false, false, false
	for i := range recs {
		snaps[i] = m.AppendSnapshot(nil)
		v, err := m.Offer(&recs[i])
		if err != nil {
			t.Fatal(err)
		}
		verdicts[i] = v
		sawLate = sawLate || v == LateAfterIdle
		for _, e := range m.Ready(nil) {
			e.Ext = slices.Clone(e.Ext)
			releasedAfter[i] = append(releasedAfter[i], e)
		}
		for p := range m.src {
			sawRel = sawRel || len(m.src[p].rel) > m.src[p].rh
			sawIdle = sawIdle || m.src[p].idle
			_, l := m.Lease(p)
			sawLease = sawLease || l
		}
	}
	final := m.AppendSnapshot(nil)
	if !sawRel || !sawLate || !sawIdle || !sawLease || m.Stats().Expired == 0 {
		t.Fatalf("the stream never reaches some state (counted keys %v, late %v, idle %v, leased %v, %d leases run out)", sawRel, sawLate, sawIdle, sawLease, m.Stats().Expired)
	}
	for i := 0; i < len(recs); i += 1 + i/50 {
		m2, err := Restore(cfg, snaps[i])
		if err != nil {
			t.Fatalf("point %d: %v", i, err)
		}
		if again := m2.AppendSnapshot(nil); !bytes.Equal(again, snaps[i]) {
			t.Fatalf("point %d: restored image differs", i)
		}
		for j := i; j < len(recs); j++ {
			v, err := m2.Offer(&recs[j])
			if err != nil || v != verdicts[j] {
				t.Fatalf("restored at %d, record %d: %v, %v; uninterrupted %v", i, j, v, err, verdicts[j])
			}
			var got []Event
			for _, e := range m2.Ready(nil) {
				e.Ext = slices.Clone(e.Ext)
				got = append(got, e)
			}
			diffEvents(t, "restored", got, releasedAfter[j])
		}
		if end := m2.AppendSnapshot(nil); !bytes.Equal(end, final) {
			t.Fatalf("restored at %d: final image differs", i)
		}
	}
}

// TestSnapshotBetweenOfferAndReady: an image taken after an Offer raised the frontier
// but before Ready releases the same events once restored.
func TestSnapshotBetweenOfferAndReady(t *testing.T) {
	cfg := Config{Sources: 2}
	m, _ := New(cfg)
	for _, r := range []Record{hop(0, 0, 100, 100), hop(1, 0, 90, 90), hop(1, 1, 200, 200), mark(0, 300)} {
		m.Offer(&r)
	}
	m2, err := Restore(cfg, m.AppendSnapshot(nil))
	if err != nil {
		t.Fatal(err)
	}
	want, got := released(m.Ready(nil)), released(m2.Ready(nil))
	if !slices.Equal(got, want) || len(want) != 2 {
		t.Fatalf("restored released %v, uninterrupted %v (want two)", got, want)
	}
}

func TestRestoreRefuses(t *testing.T) {
	sources, recs := snapshotStream(2)
	cfg := Config{Sources: sources, ExtWords: simExtWords}
	m, _ := New(cfg)
	for i := range recs[:len(recs)/2] {
		m.Offer(&recs[i])
		m.Ready(nil)
	}
	good := m.AppendSnapshot(nil)
	if _, err := Restore(cfg, good); err != nil {
		t.Fatal(err)
	}
	// reseal rewrites the checksum so that the body's own checks are reached.
	reseal := func(b []byte) []byte {
		b = slices.Clone(b)
		body := b[:len(b)-4]
		binary.LittleEndian.PutUint32(b[len(body):], crc32.Checksum(body, castagnoli))
		return b
	}
	flip := slices.Clone(good)
	flip[len(flip)/2] ^= 0x40
	version := slices.Clone(good)
	version[4] = 3
	cases := []struct {
		name string
		cfg  Config
		data []byte
	}{
		{"empty", cfg, nil},
		{"not a snapshot", cfg, []byte("VRPX\x01abcd")},
		{"a flipped bit", cfg, flip},
		{"version 3", cfg, reseal(version)},
		{"truncated", cfg, reseal(good[:len(good)-9])},
		{"trailing byte", cfg, reseal(append(slices.Clone(good[:len(good)-4]), 0, 0, 0, 0, 0))},
		{"other source count", Config{Sources: sources + 1, ExtWords: simExtWords}, good},
		{"other word count", Config{Sources: sources, ExtWords: simExtWords + 1}, good},
	}
	// Hand-built images for the rules a random stream does not break.
	img := func(f func(b []byte) []byte) []byte {
		b := []byte(snapMagic + "\x01")
		b = binary.AppendUvarint(b, 1) // one source
		b = binary.AppendUvarint(b, 0) // no words
		b = binary.AppendVarint(b, 500)
		return reseal(append(f(b), 0, 0, 0, 0))
	}
	src := func(b []byte, wm int64, idle byte) []byte {
		b = binary.AppendVarint(b, wm)
		b = binary.AppendUvarint(b, 0)
		return append(b, idle)
	}
	pend := func(b []byte, t, off int64, topic uint64) []byte {
		b = binary.AppendVarint(b, t)
		b = binary.AppendUvarint(b, uint64(off))
		b = binary.AppendVarint(b, 1)
		b = binary.AppendUvarint(b, topic)
		b = appendString(b, "k")
		return appendString(b, "i")
	}
	oneTopic := func(b []byte) []byte { b = binary.AppendUvarint(b, 1); return appendString(b, "in") }
	cfg1 := Config{Sources: 1}
	valid := img(func(b []byte) []byte {
		b = src(oneTopic(b), 100, 0)
		b = binary.AppendUvarint(b, 2)
		b = pend(pend(b, 600, 1, 0), 600, 2, 0)
		b = binary.AppendUvarint(b, 1)
		b = binary.AppendVarint(b, 200)
		return binary.AppendUvarint(b, 9)
	})
	if _, err := Restore(cfg1, valid); err != nil {
		t.Fatalf("the hand-built base image is refused: %v", err)
	}
	// Version 2: the clock after F; an idle source with a lease.
	img2 := func(clock int64, f func(b []byte) []byte) []byte {
		b := []byte(snapMagic + "\x02")
		b = binary.AppendUvarint(b, 1)
		b = binary.AppendUvarint(b, 0)
		b = binary.AppendVarint(b, 500)
		b = binary.AppendVarint(b, clock)
		return reseal(append(f(b), 0, 0, 0, 0))
	}
	leasedSrc := func(b []byte, lease int64) []byte {
		b = src(append(b, 0), 100, 2) // no topics
		b = binary.AppendVarint(b, lease)
		return append(b, 0, 0) // nothing pending, nothing counted
	}
	valid2 := img2(1000, func(b []byte) []byte { return leasedSrc(b, 1000) })
	if m, err := Restore(cfg1, valid2); err != nil {
		t.Fatalf("the hand-built version 2 image is refused: %v", err)
	} else if l, ok := m.Lease(0); !ok || l != 1000 || m.Clock() != 1000 {
		t.Fatalf("restored lease %d (%v), clock %d; want 1000, 1000", l, ok, m.Clock())
	} else if again := m.AppendSnapshot(nil); !bytes.Equal(again, valid2) {
		t.Fatal("the version 2 image is not written back identically")
	}
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"version 2 without a clock", img2(NoClock, func(b []byte) []byte { return append(src(append(b, 0), 100, 1), 0, 0) })},
		{"lease before the clock", img2(1000, func(b []byte) []byte { return leasedSrc(b, 999) })},
		{"lease reserved", img2(1000, func(b []byte) []byte { return leasedSrc(b, math.MaxInt64) })},
		{"idle flag 3", img2(1000, func(b []byte) []byte { return append(src(append(b, 0), 100, 3), 0, 0) })},
	} {
		cases = append(cases, struct {
			name string
			cfg  Config
			data []byte
		}{c.name, cfg1, c.data})
	}
	for _, c := range []struct {
		name string
		f    func([]byte) []byte
	}{
		{"idle flag 2 in version 1", func(b []byte) []byte { return append(src(append(b, 0), 100, 2), 0, 0) }},
		{"pending out of order", func(b []byte) []byte {
			b = src(oneTopic(b), 100, 0)
			b = binary.AppendUvarint(b, 2)
			return append(pend(pend(b, 600, 2, 0), 600, 1, 0), 0)
		}},
		{"pending repeated", func(b []byte) []byte {
			b = src(oneTopic(b), 100, 0)
			b = binary.AppendUvarint(b, 2)
			return append(pend(pend(b, 600, 1, 0), 600, 1, 0), 0)
		}},
		{"topic index past the table", func(b []byte) []byte {
			b = src(oneTopic(b), 100, 0)
			b = binary.AppendUvarint(b, 1)
			return append(pend(b, 600, 1, 1), 0)
		}},
		{"topic listed but unused", func(b []byte) []byte { return append(src(oneTopic(b), 100, 0), 0, 0) }},
		{"topic listed twice", func(b []byte) []byte {
			b = binary.AppendUvarint(b, 2)
			b = appendString(appendString(b, "in"), "in")
			b = src(b, 100, 0)
			b = binary.AppendUvarint(b, 2)
			return append(pend(pend(b, 600, 1, 0), 600, 2, 1), 0)
		}},
		{"counted key at the frontier", func(b []byte) []byte {
			b = src(append(b, 0), 100, 0)
			b = binary.AppendUvarint(b, 0)
			b = binary.AppendUvarint(b, 1)
			b = binary.AppendVarint(b, 500)
			return binary.AppendUvarint(b, 1)
		}},
		{"counted key below the watermark", func(b []byte) []byte {
			b = src(append(b, 0), 100, 0)
			b = binary.AppendUvarint(b, 0)
			b = binary.AppendUvarint(b, 1)
			b = binary.AppendVarint(b, 99)
			return binary.AppendUvarint(b, 1)
		}},
		{"pending count beyond the bytes", func(b []byte) []byte {
			b = src(append(b, 0), 100, 0)
			return binary.AppendUvarint(b, 1<<40)
		}},
		{"non-minimal varint", func(b []byte) []byte {
			b = append(b, 0)                  // no topics
			b = append(b, 0x80|0x48, 0x81, 0) // watermark 100 padded: non-minimal
			return append(b, 0, 0, 0, 0)
		}},
	} {
		cases = append(cases, struct {
			name string
			cfg  Config
			data []byte
		}{c.name, cfg1, img(c.f)})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Restore(c.cfg, c.data); err == nil {
				t.Fatal("accepted")
			} else if !errors.Is(err, ErrSnapshot) {
				t.Fatalf("err %v does not wrap ErrSnapshot", err)
			}
		})
	}
}
