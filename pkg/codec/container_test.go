package codec

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"
)

func TestContainerRoundTrip(t *testing.T) {
	txs := []Transaction{goodTx(), {EventID: "e2", EntityID: "card-B", EventTime: t0 + 1}, {EntityID: "card-C", AmountMinor: 5, Currency: "usd"}}
	for _, compression := range []string{"null", "deflate", "snappy"} {
		t.Run(compression, func(t *testing.T) {
			var file bytes.Buffer
			w, err := NewContainerWriter(&file, compression)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Append(txs[:2]...); err != nil {
				t.Fatal(err)
			}
			if err := w.Append(txs[2:]...); err != nil { // a second block
				t.Fatal(err)
			}
			r, err := NewContainerReader(&file)
			if err != nil {
				t.Fatal(err)
			}
			var got []Transaction
			for {
				value, rej, ok := r.Next()
				if !ok {
					break
				}
				if rej != nil {
					t.Fatalf("record %d rejected: %v", len(got), rej)
				}
				// The value is in our schema: it must equal the direct encoding,
				// so a replay's dead letters and decodes match a topic's.
				want := txs[len(got)]
				if !bytes.Equal(value, EncodeTransaction(&want)) {
					t.Fatalf("record %d: value %x, want %x", len(got), value, EncodeTransaction(&want))
				}
				var tx Transaction
				if err := decodeTransaction(value, &tx, false); err != nil {
					t.Fatal(err)
				}
				got = append(got, tx)
			}
			if err := r.Err(); err != nil {
				t.Fatalf("Err() = %v at a clean end", err)
			}
			if len(got) != len(txs) {
				t.Fatalf("read %d records, wrote %d", len(got), len(txs))
			}
		})
	}
}

func TestContainerWithForeignSchema(t *testing.T) {
	const writer = `{"type":"record","name":"Txn","fields":[
		{"name":"entity_id","type":["null","string"]},{"name":"event_id","type":"string"},
		{"name":"amount_minor","type":"int"},{"name":"event_time","type":"long"},{"name":"extra","type":"string"}]}`
	var file bytes.Buffer
	w, err := goavro.NewOCFWriter(goavro.OCFConfig{W: &file, Schema: writer})
	if err != nil {
		t.Fatal(err)
	}
	err = w.Append([]any{
		map[string]any{"entity_id": goavro.Union("string", "card-A"), "event_id": "e1", "amount_minor": int32(7), "event_time": int64(t0), "extra": "x"},
		map[string]any{"entity_id": nil, "event_id": "e2", "amount_minor": int32(8), "event_time": int64(t0), "extra": "y"},
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewContainerReader(&file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.WriterSchema(), `"extra"`) {
		t.Fatalf("WriterSchema() = %s", r.WriterSchema())
	}
	value, rej, ok := r.Next()
	var tx Transaction
	if !ok || rej != nil || decodeTransaction(value, &tx, false) != nil || !reflect.DeepEqual(tx, Transaction{EventID: "e1", EntityID: "card-A", AmountMinor: 7, Currency: "", EventTime: t0}) {
		t.Fatalf("first record: %x %v %v -> %+v", value, rej, ok, tx)
	}
	// The null entity id cannot be written in our schema: the record comes
	// back in the writer's schema with the reason its dead letter carries.
	value, rej, ok = r.Next()
	if !ok || rej == nil || rej.Reason != ReasonInvalidEntityID {
		t.Fatalf("second record: %v %v", rej, ok)
	}
	wc, err := goavro.NewCodec(writer)
	if err != nil {
		t.Fatal(err)
	}
	if m, rest, err := wc.NativeFromBinary(value); err != nil || len(rest) != 0 || m.(map[string]any)["event_id"] != "e2" {
		t.Fatalf("dead-letter value %x is not the record in the writer schema: %v", value, err)
	}
	if _, _, ok := r.Next(); ok || r.Err() != nil {
		t.Fatalf("after the last record: ok=%v err=%v", ok, r.Err())
	}
}

func TestContainerErrors(t *testing.T) {
	var file bytes.Buffer
	w, err := NewContainerWriter(&file, "null")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(goodTx(), goodTx()); err != nil {
		t.Fatal(err)
	}
	whole := file.Bytes()

	if _, err := NewContainerReader(bytes.NewReader(EncodeTransaction(&Transaction{}))); err == nil {
		t.Error("a bare record was read as a container file")
	}
	var other bytes.Buffer
	ow, _ := goavro.NewOCFWriter(goavro.OCFConfig{W: &other, Schema: `{"type":"record","name":"X","fields":[{"name":"event_id","type":"string"}]}`})
	_ = ow.Append([]any{map[string]any{"event_id": "e"}})
	if _, err := NewContainerReader(&other); err == nil || !strings.Contains(err.Error(), "entity_id") {
		t.Errorf("incompatible file schema: err = %v", err)
	}

	// Cut inside the block: the reader must stop with an error, not invent
	// records or end cleanly.
	r, err := NewContainerReader(bytes.NewReader(whole[:len(whole)-20]))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, _, ok := r.Next(); ok; _, _, ok = r.Next() {
		n++
	}
	if r.Err() == nil {
		t.Fatalf("truncated file ended cleanly after %d records", n)
	}
}
