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
// integer, is dead-lettered with reason decode and the line as its value.
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
			text := bytes.TrimSpace(raw)
			if len(text) > 0 {
				rec = Record{}
				rec.Offset = offset
				rec.Original = text
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

// jsonTransaction holds the raw fields so that each can be checked for its
// JSON type: a string where a long belongs is a decode error, as in Avro.
type jsonTransaction struct {
	EventID     json.RawMessage `json:"event_id"`
	EntityID    json.RawMessage `json:"entity_id"`
	AmountMinor json.RawMessage `json:"amount_minor"`
	Currency    json.RawMessage `json:"currency"`
	EventTime   json.RawMessage `json:"event_time"`
}

func parseJSONTransaction(line []byte, tx *codec.Transaction) *codec.Rejection {
	if parseJSONFast(line, tx) {
		return nil
	}
	*tx = codec.Transaction{}
	return parseJSONGeneral(line, tx)
}

// parseJSONGeneral is encoding/json's reading of a line, the reference
// behaviour: any JSON, escapes and all, with the field type checks above.
func parseJSONGeneral(line []byte, tx *codec.Transaction) *codec.Rejection {
	var j jsonTransaction
	if err := json.Unmarshal(line, &j); err != nil {
		return &codec.Rejection{Reason: codec.ReasonDecode, Detail: "not a JSON transaction object: " + err.Error()}
	}
	var rej *codec.Rejection
	str := func(field string, raw json.RawMessage) string {
		if rej != nil || len(raw) == 0 || string(raw) == "null" {
			return ""
		}
		var s string
		if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			rej = &codec.Rejection{Reason: codec.ReasonDecode, Detail: field + ": want a JSON string, got " + clip(raw)}
		}
		return s
	}
	long := func(field string, raw json.RawMessage) int64 {
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
	tx.EventID = str("event_id", j.EventID)
	tx.EntityID = str("entity_id", j.EntityID)
	tx.AmountMinor = long("amount_minor", j.AmountMinor)
	tx.Currency = str("currency", j.Currency)
	tx.EventTime = long("event_time", j.EventTime)
	return rej
}

func clip(raw []byte) string {
	if len(raw) > 40 {
		return string(raw[:40]) + "…"
	}
	return string(raw)
}
