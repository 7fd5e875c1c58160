package service

import (
	"math/bits"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// recordPool lends the consumer the memory it decodes fetched batches into: the
// slices of kgo.Record and the buffers of decompressed batches. A worker hands
// each record back (kgo.Record.Recycle) once it has processed it; when every
// record of a batch is back, the client returns both slices here. Before this,
// those two allocations were a third of the service's garbage and set how often
// the collector ran.
//
// Nothing may keep a record's Key, Value or headers past its Recycle: the
// pipeline copies what it keeps (decoded strings, the sink's arena).
//
// Slices are kept in power-of-two size classes, at most poolPerClass per class,
// so the pool holds a bounded amount of memory after a burst.
type recordPool struct {
	mu    sync.Mutex
	recs  [poolClasses][][]kgo.Record
	bytes [poolClasses][][]byte
}

const (
	poolClasses  = 28 // capacities up to 2^27 (bytes) or 2^27 records
	poolMinClass = 6  // nothing smaller than 64 is pooled: allocate it
	poolPerClass = 16
)

var (
	_ kgo.PoolRecords         = (*recordPool)(nil)
	_ kgo.PoolDecompressBytes = (*recordPool)(nil)
)

// classUp is the class whose capacity 2^c holds n; classDown is the largest
// class a capacity of n fully covers.
func classUp(n int) int   { return max(bits.Len(uint(max(n, 1)-1)), poolMinClass) }
func classDown(n int) int { return bits.Len(uint(n)) - 1 }

func (p *recordPool) GetRecords(n int) []kgo.Record {
	c := classUp(n)
	if c < poolClasses {
		p.mu.Lock()
		if k := len(p.recs[c]); k > 0 {
			s := p.recs[c][k-1]
			p.recs[c][k-1] = nil
			p.recs[c] = p.recs[c][:k-1]
			p.mu.Unlock()
			return s[:0]
		}
		p.mu.Unlock()
	}
	return make([]kgo.Record, 0, 1<<c)
}

// PutRecords keeps s if it fits a class. The client has zeroed each record
// (Recycle does), so nothing it pointed to is kept alive here.
func (p *recordPool) PutRecords(s []kgo.Record) {
	c := classDown(cap(s))
	if c < poolMinClass || c >= poolClasses {
		return
	}
	p.mu.Lock()
	if len(p.recs[c]) < poolPerClass {
		p.recs[c] = append(p.recs[c], s[:0:1<<c])
	}
	p.mu.Unlock()
}

// GetDecompressBytes guesses 4× the compressed size; the decompressor grows the
// slice if that is short, and the grown one comes back to PutDecompressBytes.
func (p *recordPool) GetDecompressBytes(compressed []byte, _ kgo.CompressionCodecType) []byte {
	c := classUp(4 * len(compressed))
	if c < poolClasses {
		p.mu.Lock()
		if k := len(p.bytes[c]); k > 0 {
			b := p.bytes[c][k-1]
			p.bytes[c][k-1] = nil
			p.bytes[c] = p.bytes[c][:k-1]
			p.mu.Unlock()
			return b[:0]
		}
		p.mu.Unlock()
		return make([]byte, 0, 1<<c)
	}
	return make([]byte, 0, 4*len(compressed))
}

func (p *recordPool) PutDecompressBytes(b []byte) {
	c := classDown(cap(b))
	if c < poolMinClass || c >= poolClasses {
		return
	}
	p.mu.Lock()
	if len(p.bytes[c]) < poolPerClass {
		p.bytes[c] = append(p.bytes[c], b[:0:1<<c])
	}
	p.mu.Unlock()
}
