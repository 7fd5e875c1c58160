package replay

import (
	"context"
	"encoding/base64"
	"strconv"
	"unicode/utf8"

	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
)

// JSONLSink writes features records as JSON lines, one object per record with
// the VelocityFeatures field names:
//
//	{"event_id":"e2","entity_id":"card-A","event_time":1793491200400,
//	 "windows":[{"window":"10s","window_ms":10000,"bucket_ms":1000,"count":2,
//	            "sum_minor":3500,"min_minor":1000,"max_minor":2500}, …],
//	 "ms_since_previous":400,"late":false,
//	 "source_topic":"t","source_partition":0,"source_offset":1}
//
// ms_since_previous is null for an entity's first retained event. Numbers are
// integers (event_time in Unix ms), never floats.
type JSONLSink struct {
	f    *atomicFile
	view featureView
	buf  []byte
}

// NewJSONLSink creates name.partial; Commit renames it to name.
func NewJSONLSink(name string) (*JSONLSink, error) {
	f, err := createAtomic(name)
	if err != nil {
		return nil, err
	}
	return &JSONLSink{f: f, buf: make([]byte, 0, 1024)}, nil
}

// Write appends one features record; dead letters are not its business.
func (s *JSONLSink) Write(o *pipeline.Output) error {
	if err := s.view.parse(o.Value); err != nil {
		return err
	}
	s.buf = appendFeaturesJSON(s.buf[:0], &s.view)
	_, err := s.f.Write(s.buf)
	return err
}

// Commit implements Sink.
func (s *JSONLSink) Commit(context.Context) error { return s.f.commit() }

// Abort implements Sink.
func (s *JSONLSink) Abort() error { return s.f.abort() }

func appendFeaturesJSON(b []byte, v *featureView) []byte {
	b = append(b, `{"event_id":`...)
	b = appendJSONString(b, v.eventID)
	b = append(b, `,"entity_id":`...)
	b = appendJSONString(b, v.entityID)
	b = append(b, `,"event_time":`...)
	b = strconv.AppendInt(b, v.eventTime, 10)
	b = append(b, `,"windows":[`...)
	for i := range v.windows {
		w := &v.windows[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"window":`...)
		b = appendJSONString(b, w.name)
		b = append(b, `,"window_ms":`...)
		b = strconv.AppendInt(b, w.windowMs, 10)
		b = append(b, `,"bucket_ms":`...)
		b = strconv.AppendInt(b, w.bucketMs, 10)
		b = append(b, `,"count":`...)
		b = strconv.AppendInt(b, w.count, 10)
		b = append(b, `,"sum_minor":`...)
		b = strconv.AppendInt(b, w.sumMinor, 10)
		b = append(b, `,"min_minor":`...)
		b = strconv.AppendInt(b, w.minMinor, 10)
		b = append(b, `,"max_minor":`...)
		b = strconv.AppendInt(b, w.maxMinor, 10)
		b = append(b, '}')
	}
	b = append(b, `],"ms_since_previous":`...)
	if v.hasPrevious {
		b = strconv.AppendInt(b, v.msSincePrevious, 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"late":`...)
	b = strconv.AppendBool(b, v.late)
	b = append(b, `,"source_topic":`...)
	b = appendJSONString(b, v.sourceTopic)
	b = append(b, `,"source_partition":`...)
	b = strconv.AppendInt(b, int64(v.sourcePartition), 10)
	b = append(b, `,"source_offset":`...)
	b = strconv.AppendInt(b, v.sourceOffset, 10)
	return append(b, "}\n"...)
}

// DeadJSONLSink writes dead letters as JSON lines:
//
//	{"reason":"late","error":"event_time … behind the watermark …",
//	 "source_topic":"t","source_partition":0,"source_offset":6,
//	 "key":"Y2FyZC1C","value":"BGU3…"}
//
// key and value are the original bytes in standard base64 (null when the
// record had none: no key, or a tombstone's null value). For a JSON-lines input the value is the input line
// itself, for other inputs the record value exactly as read. A dead letter a
// re-keyed group's second stage decided has "group":"<name>" after the offset
// (the velocity.group header of 'run'), and its value is the transaction
// re-encoded in our schema.
type DeadJSONLSink struct {
	f   *atomicFile
	buf []byte
}

// NewDeadJSONLSink creates name.partial; Commit renames it to name.
func NewDeadJSONLSink(name string) (*DeadJSONLSink, error) {
	f, err := createAtomic(name)
	if err != nil {
		return nil, err
	}
	return &DeadJSONLSink{f: f}, nil
}

// Write appends one dead letter; features records are not its business.
func (s *DeadJSONLSink) Write(o *pipeline.Output) error {
	b := append(s.buf[:0], `{"reason":`...)
	b = appendJSONString(b, []byte(o.Reason))
	b = append(b, `,"error":`...)
	b = appendJSONString(b, []byte(o.Err))
	b = append(b, `,"source_topic":`...)
	b = appendJSONString(b, []byte(o.SourceTopic))
	b = append(b, `,"source_partition":`...)
	b = strconv.AppendInt(b, int64(o.SourcePartition), 10)
	b = append(b, `,"source_offset":`...)
	b = strconv.AppendInt(b, o.SourceOffset, 10)
	if o.Group != "" {
		b = append(b, `,"group":`...)
		b = appendJSONString(b, []byte(o.Group))
	}
	b = append(b, `,"key":`...)
	if o.Key == nil {
		b = append(b, "null"...)
	} else {
		b = appendBase64(b, o.Key)
	}
	b = append(b, `,"value":`...)
	if o.Value == nil {
		b = append(b, "null"...) // a tombstone: a null value, not an empty one
	} else {
		b = appendBase64(b, o.Value)
	}
	b = append(b, "}\n"...)
	s.buf = b
	_, err := s.f.Write(b)
	return err
}

// Commit implements Sink.
func (s *DeadJSONLSink) Commit(context.Context) error { return s.f.commit() }

// Abort implements Sink.
func (s *DeadJSONLSink) Abort() error { return s.f.abort() }

func appendBase64(b, src []byte) []byte {
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, src)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as encoding/json does, so every line is valid JSON whatever the input held.
func appendJSONString(b, s []byte) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
