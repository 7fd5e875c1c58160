package api

import (
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// The velocity answer is the hot response; it is written by hand rather than through
// encoding/json's reflection, which was about a third of the handler's CPU. The
// result is the same JSON encoding/json gives (field order, escapes), which the tests
// compare.

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string, escaped as encoding/json escapes it
// (HTML-safe: <, > and & too; invalid UTF-8 as U+FFFD; U+2028 and U+2029).
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func appendField(dst []byte, name string, v int64) []byte {
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return strconv.AppendInt(dst, v, 10)
}

// appendVelocity appends v as encoding/json would encode it.
func appendVelocity(dst []byte, v *velocityJSON) []byte {
	dst = append(dst, `{"entity_id":`...)
	dst = appendJSONString(dst, v.EntityID)
	dst = append(dst, `,"known":`...)
	dst = strconv.AppendBool(dst, v.Known)
	dst = appendField(dst, "partition", int64(v.Partition))
	dst = appendField(dst, "as_of", v.AsOf)
	dst = append(dst, `,"as_of_time":`...)
	dst = appendJSONString(dst, v.AsOfTime)
	dst = appendField(dst, "last_offset", v.LastOffset)
	dst = appendField(dst, "pending", int64(v.Pending))
	dst = append(dst, `,"at_range":{"from":`...)
	dst = strconv.AppendInt(dst, v.AtRange.From, 10)
	dst = appendField(dst, "to", v.AtRange.To)
	dst = append(dst, `},"windows":[`...)
	for i := range v.Windows {
		w := &v.Windows[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"window":`...)
		dst = appendJSONString(dst, w.Window)
		dst = appendField(dst, "window_ms", w.WindowMs)
		dst = appendField(dst, "bucket_ms", w.BucketMs)
		dst = appendField(dst, "count", w.Count)
		dst = appendField(dst, "sum_minor", w.SumMinor)
		dst = appendField(dst, "min_minor", w.MinMinor)
		dst = appendField(dst, "max_minor", w.MaxMinor)
		dst = append(dst, '}')
	}
	return append(dst, ']', '}')
}

// appendLookup appends the answer of a local lookup: the bytes appendVelocity writes
// for s.velocityOf(it, p, sel), without building that value first (its windows slice
// and as_of_time string were two allocations per lookup).
func (s *Server) appendLookup(dst []byte, it *service.ReadItem, p int32, sel []int) []byte {
	dst = append(dst, `{"entity_id":`...)
	dst = appendJSONString(dst, it.Entity)
	dst = append(dst, `,"known":`...)
	dst = strconv.AppendBool(dst, it.Info.Known)
	dst = appendField(dst, "partition", int64(p))
	dst = appendField(dst, "as_of", it.Info.AsOf)
	dst = append(dst, `,"as_of_time":"`...)
	dst = time.UnixMilli(it.Info.AsOf).UTC().AppendFormat(dst, time.RFC3339Nano) // nothing in it to escape
	dst = append(dst, '"')
	dst = appendField(dst, "last_offset", it.Info.LastOffset)
	dst = appendField(dst, "pending", int64(it.Info.Pending))
	dst = append(dst, `,"at_range":{"from":`...)
	dst = strconv.AppendInt(dst, it.Info.From, 10)
	dst = appendField(dst, "to", it.Info.To)
	dst = append(dst, `},"windows":[`...)
	for j, i := range sel {
		a := it.Aggs[i]
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, s.windowHead[i]...)
		dst = strconv.AppendInt(dst, a.Count, 10)
		dst = appendField(dst, "sum_minor", a.Sum)
		dst = appendField(dst, "min_minor", a.Min)
		dst = appendField(dst, "max_minor", a.Max)
		dst = append(dst, '}')
	}
	return append(dst, ']', '}')
}

// windowHeads are each window's constant start in an answer: `{"window":"1m",
// "window_ms":60000,"bucket_ms":1000,"count":` (what appendLookup would otherwise
// format again for every lookup).
func windowHeads(specs []window.Spec) [][]byte {
	heads := make([][]byte, len(specs))
	for i, sp := range specs {
		b := append([]byte(`{"window":`), appendJSONString(nil, sp.Name)...)
		b = appendField(b, "window_ms", sp.WindowMs)
		b = appendField(b, "bucket_ms", sp.BucketMs)
		heads[i] = append(b, `,"count":`...)
	}
	return heads
}

// MarshalJSON makes the batch's encoding/json use the same writer.
func (v velocityJSON) MarshalJSON() ([]byte, error) { return appendVelocity(nil, &v), nil }
