package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// JSONLSource reads transactions from a JSON-lines file, one object per line
// with the Transaction schema's field names:
//
//	{"event_id":"e1","entity_id":"card-A","amount_minor":1000,"currency":"EUR","event_time":1793491200000}
//
// event_time is Unix milliseconds and amount_minor minor units, both JSON
// integers. Other fields are ignored, as a newer writer schema's would be.
// Each line becomes the Avro value a producer would have written (key = the
// entity id), so it goes through the same decoder and validation as a topic
// record. A missing or null event_id, entity_id or currency reads as "" (the
// validator then names the field, e.g. invalid:entity_id); a line that is not
// a JSON object, or whose amount_minor or event_time is missing or not an
// integer, is dead-lettered with reason decode. Every dead letter of a line
// (decode, invalid, duplicate, late) has the line's bytes as read for its
// value, without the \n that ends the line and with nothing trimmed.
//
// The file is partition 0, blank lines are skipped, and a record's offset is
// its 0-based position among the non-blank lines. source_topic is the file's
// base name ("txns.jsonl").
type JSONLSource struct {
	name string
	f    *os.File
	size int64
}

// OpenJSONL opens path for reading.
func OpenJSONL(path string) (*JSONLSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open input: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open input: %w", err)
	}
	return &JSONLSource{name: filepath.Base(path), f: f, size: st.Size()}, nil
}

// Topic implements Source: the file's base name.
func (s *JSONLSource) Topic() string { return s.name }

// Partitions implements Source: a file is one partition, 0.
func (s *JSONLSource) Partitions() []int32 { return []int32{0} }

// Size implements Source: the file's size in bytes.
func (s *JSONLSource) Size() (int64, string) { return s.size, "bytes" }

// Close implements Source.
func (s *JSONLSource) Close() error { return s.f.Close() }

// Read implements Source. Progress counts bytes of the file.
func (s *JSONLSource) Read(ctx context.Context, p int32, prog *Progress, fn func(*Record) error) error {
	if p != 0 {
		return fmt.Errorf("%s has only partition 0", s.name)
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	br := bufio.NewReaderSize(s.f, 1<<20)
	var (
		rec    Record
		value  []byte
		offset int64
		line   int
	)
	for {
		if offset&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		raw, err := br.ReadBytes('\n')
		if len(raw) > 0 {
			line++
			if prog != nil {
				prog.Done.Add(int64(len(raw)))
			}
			// The dead letter of a line is the line as read, without the
			// \n that ends it: surrounding spaces or a \r stay, as the live
			// DLQ keeps a record's value byte for byte. Only the parser
			// (and the blank-line test) looks at the trimmed text.
			asRead := bytes.TrimSuffix(raw, []byte{'\n'})
			text := bytes.TrimSpace(asRead)
			if len(text) > 0 {
				rec = Record{}
				rec.Offset = offset
				rec.Original = asRead
				var tx codec.Transaction
				if rej := parseJSONTransaction(text, &tx); rej != nil {
					rej.Detail = "line " + strconv.Itoa(line) + ": " + rej.Detail
					rec.Reject = rej
				} else {
					value = codec.AppendTransaction(value[:0], &tx)
					rec.Key = []byte(tx.EntityID)
					rec.Value = value
				}
				if err := fn(&rec); err != nil {
					return err
				}
				offset++
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", s.name, err)
		}
	}
}

func parseJSONTransaction(line []byte, tx *codec.Transaction) *codec.Rejection {
	if parseJSONFast(line, tx) {
		return nil
	}
	*tx = codec.Transaction{}
	return parseJSONGeneral(line, tx)
}

// parseJSONGeneral is the reference reading of a line: any JSON object,
// escapes and all, each field checked for its JSON type (a string where a
// long belongs is a decode error, as in Avro).
//
// Two things differ from decoding into a struct with encoding/json, on
// purpose. Field names match exactly, as Avro's do (encoding/json would take
// "EVENT_ID" for event_id). And a string keeps the bytes the line holds:
// encoding/json replaces invalid UTF-8 and lone surrogate escapes with
// U+FFFD, which would make two different invalid ids equal (a false
// duplicate) and merge entities, where the same bytes in an Avro record are
// dead-lettered as invalid:<field>. Here they reach the validator as they
// are, and are dead-lettered the same way.
func parseJSONGeneral(line []byte, tx *codec.Transaction) *codec.Rejection {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil {
		return &codec.Rejection{Reason: codec.ReasonDecode, Detail: "not a JSON transaction object: " + err.Error()}
	}
	if fields == nil {
		return &codec.Rejection{Reason: codec.ReasonDecode, Detail: "not a JSON transaction object: null"}
	}
	var rej *codec.Rejection
	str := func(field string) string {
		raw := fields[field]
		if rej != nil || len(raw) == 0 || string(raw) == "null" {
			return ""
		}
		s, ok := unquoteJSON(raw)
		if !ok {
			rej = &codec.Rejection{Reason: codec.ReasonDecode, Detail: field + ": want a JSON string, got " + clip(raw)}
		}
		return s
	}
	long := func(field string) int64 {
		raw := fields[field]
		if rej != nil {
			return 0
		}
		if len(raw) == 0 || string(raw) == "null" {
			rej = &codec.Rejection{Reason: codec.ReasonDecode, Detail: field + " is missing"}
			return 0
		}
		v, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil {
			rej = &codec.Rejection{Reason: codec.ReasonDecode, Detail: field + ": want a JSON integer (64-bit), got " + clip(raw)}
		}
		return v
	}
	tx.EventID = str("event_id")
	tx.EntityID = str("entity_id")
	tx.AmountMinor = long("amount_minor")
	tx.Currency = str("currency")
	tx.EventTime = long("event_time")
	return rej
}

// unquoteJSON decodes a JSON string token that encoding/json has already
// checked for syntax, keeping what encoding/json would replace with U+FFFD:
// bytes that are not UTF-8 are copied as they are, and a \u escape of a lone
// surrogate becomes its three-byte (invalid UTF-8) form. ok is false when raw
// is not a string token.
func unquoteJSON(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	raw = raw[1 : len(raw)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw), true
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		if i+1 >= len(raw) {
			return "", false
		}
		i++
		switch raw[i] {
		case '"', '\\', '/':
			out = append(out, raw[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(raw[i+1:])
			if !ok {
				return "", false
			}
			i += 4
			if utf16.IsSurrogate(r) {
				// A high surrogate followed by an escaped low one is one
				// character; anything else is a lone surrogate.
				if r < 0xdc00 && i+2 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					if r2, ok := hex4(raw[i+3:]); ok && 0xdc00 <= r2 && r2 <= 0xdfff {
						out = utf8.AppendRune(out, utf16.DecodeRune(r, r2))
						i += 6
						continue
					}
				}
				out = append(out, 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
				continue
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", false
		}
	}
	return string(out), true
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func clip(raw []byte) string {
	if len(raw) > 40 {
		return string(raw[:40]) + "…"
	}
	return string(raw)
}
