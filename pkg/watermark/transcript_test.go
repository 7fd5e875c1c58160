package watermark

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"hash"
	"os"
	"strconv"
	"strings"
	"testing"
)

// updateTranscripts wrote transcriptGolden in db89bd3, the last commit with the
// reference package; here TestMatchesReferenceSet refuses it (see differential_test.go).
var updateTranscripts = flag.Bool("update-transcripts", false,
	"refused: "+transcriptGolden+" is written only by db89bd3, which has the reference package")

// transcriptGolden holds one line per (case, seed, steps) of TestMatchesReferenceSet:
// the case's name, the seed, the number of steps and the SHA-256 of the transcript of
// everything the reference package (the dedupe set before the compact table) answered
// on that run, tab-separated. Lines starting with # are comments. Recorded by
// db89bd3's twin; never regenerate it from the current package.
const transcriptGolden = "testdata/dedupe_transcripts.golden"

// transcript is a SHA-256 of a sequence of observations, each tagged with what it is,
// numbers fixed-width little-endian and byte strings length-prefixed, so that two
// different sequences cannot be written as the same bytes.
type transcript struct {
	h   hash.Hash
	buf []byte
}

func newTranscript() *transcript {
	return &transcript{h: sha256.New(), buf: make([]byte, 0, 8192)}
}

func (tr *transcript) flushIfFull() {
	if len(tr.buf) >= 4096 {
		tr.h.Write(tr.buf)
		tr.buf = tr.buf[:0]
	}
}

func (tr *transcript) tag(b byte) { tr.buf = append(tr.buf, b); tr.flushIfFull() }

func (tr *transcript) int(v int64) {
	tr.buf = binary.LittleEndian.AppendUint64(tr.buf, uint64(v))
	tr.flushIfFull()
}

func (tr *transcript) uint(v uint64) {
	tr.buf = binary.LittleEndian.AppendUint64(tr.buf, v)
	tr.flushIfFull()
}

func (tr *transcript) bool(v bool) {
	b := byte(0)
	if v {
		b = 1
	}
	tr.buf = append(tr.buf, b)
	tr.flushIfFull()
}

func (tr *transcript) bytes(b []byte) {
	tr.int(int64(len(b)))
	if len(b) >= 4096 {
		tr.h.Write(tr.buf)
		tr.buf = tr.buf[:0]
		tr.h.Write(b)
		return
	}
	tr.buf = append(tr.buf, b...)
	tr.flushIfFull()
}

func (tr *transcript) str(s string) {
	tr.int(int64(len(s)))
	tr.buf = append(tr.buf, s...)
	tr.flushIfFull()
}

func (tr *transcript) err(err error) {
	tr.bool(err != nil)
	if err != nil {
		tr.str(err.Error())
	}
}

// step marks the start of step i, operation op, so that an observation cannot move
// to another step unnoticed.
func (tr *transcript) step(i int, op int) {
	tr.tag('S')
	tr.int(int64(i))
	tr.int(int64(op))
}

func (tr *transcript) verdict(v uint8, now, hasNow bool) {
	tr.tag('V')
	tr.int(int64(v))
	tr.bool(hasNow)
	if hasNow {
		tr.bool(now)
	}
}

// events records released events, every field.
func (tr *transcript) events(what byte, evs []Event) {
	tr.tag(what)
	tr.int(int64(len(evs)))
	for i := range evs {
		ev := &evs[i]
		tr.int(ev.Offset)
		tr.int(ev.EventTime)
		tr.str(ev.EventID)
		tr.str(ev.EntityID)
		tr.int(ev.Amount)
		tr.int(int64(ev.Size))
		tr.int(ev.Aux)
		tr.bool(ev.Ext == nil)
		tr.int(int64(len(ev.Ext)))
		for _, w := range ev.Ext {
			tr.uint(w)
		}
	}
}

// state records the counts and the watermark after a step.
func (tr *transcript) state(ids int, evictions uint64, pending int, pendingBytes int64, pressure bool, wm int64, wmOK bool) {
	tr.tag('C')
	tr.int(int64(ids))
	tr.uint(evictions)
	tr.int(int64(pending))
	tr.int(pendingBytes)
	tr.bool(pressure)
	tr.int(wm)
	tr.bool(wmOK)
}

func (tr *transcript) sum() string {
	tr.h.Write(tr.buf)
	tr.buf = tr.buf[:0]
	return hex.EncodeToString(tr.h.Sum(nil))
}

type transcriptKey struct {
	name        string
	seed, steps int
}

// readTranscripts reads transcriptGolden.
func readTranscripts(t *testing.T) map[transcriptKey]string {
	t.Helper()
	f, err := os.Open(transcriptGolden)
	if err != nil {
		t.Fatalf("%v: the golden transcripts are recorded by the commit that still has the reference package (see transcriptGolden)", err)
	}
	defer f.Close()
	m := map[transcriptKey]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 4 {
			t.Fatalf("%s:%d: %d fields, want 4 (name, seed, steps, digest)", transcriptGolden, n, len(fields))
		}
		seed, err1 := strconv.Atoi(fields[1])
		steps, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil || len(fields[3]) != 2*sha256.Size {
			t.Fatalf("%s:%d: malformed line %q", transcriptGolden, n, line)
		}
		m[transcriptKey{fields[0], seed, steps}] = fields[3]
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}
