//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
)

const exampleDefinitionPath = "../examples/features/card_features.yaml"

// apiFeatures is the features answer (docs/api.md) as a test reads it.
type apiFeatures struct {
	EntityID   string                   `json:"entity_id"`
	Known      bool                     `json:"known"`
	Partition  int32                    `json:"partition"`
	AsOf       int64                    `json:"as_of"`
	LastOffset int64                    `json:"last_offset"`
	Pending    int                      `json:"pending"`
	AtRange    struct{ From, To int64 } `json:"at_range"`
	Definition string                   `json:"definition"`
	Features   map[string]*int64        `json:"features"`
	Exact      map[string]bool          `json:"exact"`
}

// TestFeaturesAPIOnTheBroker runs the built binary under the example definition
// (examples/features/card_features.yaml) with the query API on, over records in the
// definition's own schema on the real broker, and holds the API's features of every
// card to what the service published: asked at the event time of a card's last
// features record, the answer is that record's feature fields, name for name (the
// record counts everything the card has, and nothing later exists); asked at the
// default as_of, the card whose record is its partition's newest gets that record.
// A card whose last event is before its partition's last idle sweep is refused
// (422 at_out_of_range), as docs/api.md says.
func TestFeaturesAPIOnTheBroker(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	bin := replayBinary(t)
	schema, err := os.ReadFile(cardSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	def, err := definition.LoadFile(exampleDefinitionPath)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := definition.EngineSpec(def)
	if err != nil {
		t.Fatal(err)
	}
	outCodec, err := goavro.NewCodec(feature.AvroSchema(spec))
	if err != nil {
		t.Fatal(err)
	}
	wantDefinition := def.Version + "@" + def.Hash()

	const partitions = 3
	in := kafkatest.CreateTopic(t, addr, partitions, nil)
	out, dlq := kafkatest.CreateTopic(t, addr, 1, nil), kafkatest.CreateTopic(t, addr, 1, nil)
	ctx := kafkatest.Context(t, 4*time.Minute)
	port := kafkatest.FreePorts(t, 1)[0]
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.CommandContext(ctx, bin, "run", "--brokers", addr, "--group", kafkatest.Group(t), "--input-topic", in,
		"--output-topic", out, "--dlq-topic", dlq, "--checkpoint-store", "memory", "--metrics-addr", "",
		"--features", exampleDefinitionPath, "--allowed-lateness", "0s", "--log-level", "warn",
		"--api-addr", "127.0.0.1:"+strconv.Itoa(port))
	// No idle release: the state depends on the records alone.
	cmd.Env = append(os.Environ(), "VELOCITY_IDLE_TIMEOUT=0s")
	logs := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		err := cmd.Wait()
		if t.Failed() {
			t.Logf("service (%v):\n%s", err, logs.String())
		}
	})

	// Few cards, so that most have an event after their partition's last sweep; a
	// hot card with many merchants, so that distinct counts are estimates too.
	recs := streamtest.CardStream(streamtest.CardStreamConfig{Seed: 29, N: 2500, Cards: 12, HotShare: 0.2, Merchants: 40, HotDistinct: 300, Lateness: time.Second})
	values, err := streamtest.EncodeCards(string(schema), recs)
	if err != nil {
		t.Fatal(err)
	}
	var batch []*kgo.Record
	for i, v := range values {
		card := recs[i]["card"].(map[string]any)["id"].(string)
		batch = append(batch, &kgo.Record{Topic: in, Key: []byte(card), Value: v})
	}
	// Keyed by card with the client's default partitioner (murmur2): where the API
	// looks for them.
	if err := kafkatest.Produce(ctx, kafkatest.Client(t, addr), batch...); err != nil {
		t.Fatal(err)
	}
	pub := readFlatOutputs(t, ctx, addr, out, dlq, len(values), outCodec, wantDefinition)

	// Each card's last record (lateness 0: a partition counts in event-time order,
	// so its last record is its newest), and each partition's newest record.
	type last struct {
		pos replayPos
		row map[string]any
	}
	lastOf := map[string]last{}
	newestOf := map[int32]last{}
	for pos, row := range pub.rows {
		card := row["entity_id"].(string)
		if l, ok := lastOf[card]; !ok || pos.offset > l.pos.offset {
			lastOf[card] = last{pos, row}
		}
		if l, ok := newestOf[pos.partition]; !ok || pos.offset > l.pos.offset {
			newestOf[pos.partition] = last{pos, row}
		}
	}
	var lastOffset [partitions]int64
	for pos := range pub.features {
		lastOffset[pos.partition] = max(lastOffset[pos.partition], pos.offset)
	}
	for pos := range pub.dead {
		lastOffset[pos.partition] = max(lastOffset[pos.partition], pos.offset)
	}

	cols := spec.Columns()
	compare := func(what string, got apiFeatures, row map[string]any) {
		t.Helper()
		if got.Definition != wantDefinition || !got.Known || got.Pending != 0 || got.LastOffset != lastOffset[got.Partition] {
			t.Errorf("%s: definition %q known %v pending %d last_offset %d (want %d)", what, got.Definition, got.Known, got.Pending, got.LastOffset, lastOffset[got.Partition])
		}
		if len(got.Features)+len(got.Exact) != len(cols) {
			t.Errorf("%s: %d features and %d exact, the record has %d feature fields", what, len(got.Features), len(got.Exact), len(cols))
		}
		for _, c := range cols {
			if c.Window < 0 {
				if e, ok := got.Exact[c.Name]; !ok || e != row[c.Name] {
					t.Errorf("%s: %s = %v (present %v), published %v", what, c.Name, e, ok, row[c.Name])
				}
				continue
			}
			g, ok := got.Features[c.Name]
			switch w := row[c.Name].(type) {
			case nil:
				if !ok || g != nil {
					t.Errorf("%s: %s = %v (present %v), published null", what, c.Name, g, ok)
				}
			case int64:
				if !ok || g == nil || *g != w {
					t.Errorf("%s: %s = %v (present %v), published %d", what, c.Name, g, ok, w)
				}
			}
		}
	}
	client := &http.Client{Timeout: 5 * time.Second}
	compared, refused, estimates := 0, 0, 0
	for card, l := range lastOf {
		at := l.row["event_time"].(int64)
		code, body := getFeatures(t, ctx, client, base, card, "?at="+strconv.FormatInt(at, 10))
		var got apiFeatures
		switch code {
		case http.StatusOK:
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("%s: %v: %s", card, err, body)
			}
			if got.Partition != l.pos.partition || got.AsOf != at {
				t.Fatalf("%s: partition %d as_of %d, published on %d at %d", card, got.Partition, got.AsOf, l.pos.partition, at)
			}
			compare(fmt.Sprintf("%s at its last record's time %d", card, at), got, l.row)
			compared++
			for _, e := range got.Exact {
				if !e {
					estimates++
				}
			}
		case http.StatusUnprocessableEntity:
			var e struct {
				Error struct {
					Code string
					From int64
				}
			}
			if json.Unmarshal(body, &e) != nil || e.Error.Code != "at_out_of_range" || e.Error.From <= at {
				t.Fatalf("%s at %d: 422 %s, want at_out_of_range from after it", card, at, body)
			}
			refused++
		default:
			t.Fatalf("%s: %d %s", card, code, body)
		}
	}
	for p, l := range newestOf {
		card := l.row["entity_id"].(string)
		code, body := getFeatures(t, ctx, client, base, card, "")
		var got apiFeatures
		if code != http.StatusOK || json.Unmarshal(body, &got) != nil {
			t.Fatalf("%s (newest of partition %d): %d %s", card, p, code, body)
		}
		if got.AsOf != l.row["event_time"].(int64) {
			t.Fatalf("%s: default as_of %d, partition %d's newest record is at %v", card, got.AsOf, p, l.row["event_time"])
		}
		compare(fmt.Sprintf("%s at the default as_of", card), got, l.row)
	}
	if code, body := getFeatures(t, ctx, client, base, "never-seen", ""); code != http.StatusOK || !bytes.Contains(body, []byte(`"known":false`)) {
		t.Fatalf("an unknown card: %d %s", code, body)
	}
	if compared < len(lastOf)/2 || estimates == 0 {
		t.Fatalf("%d cards compared, %d refused, %d estimated distinct counts: too few to say much", compared, refused, estimates)
	}
	_, example := getFeatures(t, ctx, client, base, "card-000", "")
	t.Logf("an answer: %s", example)
	t.Logf("%d cards: %d answers equal their last published record (%d estimated distinct counts among them), %d refused as before the last sweep; %d partitions' newest at the default as_of",
		len(lastOf), compared, estimates, refused, len(newestOf))
}

// getFeatures GETs an entity's features (query, e.g. "?at=…"), retrying a 503 (the
// group settling) until ctx ends.
func getFeatures(t *testing.T, ctx context.Context, client *http.Client, base, entity, query string) (int, []byte) {
	t.Helper()
	for {
		resp, err := client.Get(base + "/v1/entities/" + url.PathEscape(entity) + "/features" + query)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				return resp.StatusCode, body
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET features of %s: no answer before the deadline (%v)", entity, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
