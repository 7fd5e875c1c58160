package streamtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// The feature definitions' independent reference
// (integration/reference/features_reference.py), run from Go tests.

// RequireReference skips without python3 and the reference's modules (fastavro,
// PyYAML), unless VELOCITY_REQUIRE_PYTHON=1 (make test, CI): then their absence
// fails the test.
func RequireReference(t testing.TB) {
	t.Helper()
	if err := exec.Command("python3", "-c", "import fastavro, yaml").Run(); err != nil {
		if v := os.Getenv("VELOCITY_REQUIRE_PYTHON"); v == "" || v == "0" {
			t.Skipf("python3 with fastavro and PyYAML not available (%v): VELOCITY_REQUIRE_PYTHON=1 makes this a failure", err)
		}
		t.Fatalf("python3 with fastavro and PyYAML is required (VELOCITY_REQUIRE_PYTHON=1): %v", err)
	}
}

// ReferenceLine is what the reference says of one input offset: a dead letter's
// reason, or the features record's fields (numbers as int64) and, per distinct
// count, whether the entity ever held more values than max_exact (only then may
// the service report an estimate).
type ReferenceLine struct {
	Offset   int64           `json:"offset"`
	Dead     string          `json:"dead"`
	Features map[string]any  `json:"features"`
	Over     map[string]bool `json:"distinct_over_bound"`
}

// RunReference runs the reference script over an Avro container file holding one
// partition's records in offset order, and returns its lines by offset.
func RunReference(t testing.TB, script, definition, input string, lateness time.Duration, topic string, partition int32) map[int64]ReferenceLine {
	t.Helper()
	cmd := exec.Command("python3", script, definition, input, "--lateness-ms", fmt.Sprint(lateness.Milliseconds()),
		"--topic", topic, "--partition", fmt.Sprint(partition))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference: %v\n%s", err, stderr.Bytes())
	}
	got := map[int64]ReferenceLine{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r ReferenceLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("reference line %s: %v", sc.Bytes(), err)
		}
		IntNumbers(r.Features)
		got[r.Offset] = r
	}
	return got
}

// IntNumbers turns the json.Numbers of m into int64, so that maps decoded with
// UseNumber compare with reflect.DeepEqual.
func IntNumbers(m map[string]any) {
	for k, v := range m {
		if n, ok := v.(json.Number); ok {
			i, err := n.Int64()
			if err != nil {
				panic(fmt.Sprintf("%s: %v", k, err))
			}
			m[k] = i
		}
	}
}
