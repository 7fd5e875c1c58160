package window

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultSpecs is the window set the service runs with unless configured otherwise.
const DefaultSpecs = "1m:1s,5m:5s,1h:1m,24h:1h"

// MaxBuckets bounds N = W/b for one window. Per-entity work and memory in the worst
// case grow with N, so an accidental "24h:1ms" must be refused, not attempted.
const MaxBuckets = 100000

// Spec is one window W:b: W milliseconds of history in buckets of b milliseconds.
type Spec struct {
	Name     string // canonical name of W: largest of h, m, s, ms that divides it ("5m", "24h", "90s", "1500ms")
	WindowMs int64
	BucketMs int64
	Buckets  int // N = WindowMs / BucketMs
}

// ParseSpecs parses a comma-separated list of W:b windows such as DefaultSpecs.
// W and b are Go durations (time.ParseDuration) or whole days with a "d" suffix
// ("7d"); both must be whole, positive milliseconds, W a multiple of b, at most
// MaxBuckets buckets per window, and no window length may appear twice (outputs
// are named by W, so two windows of the same length would be indistinguishable).
// The order is kept: it is the order of the windows in every output record.
func ParseSpecs(s string) ([]Spec, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("window specs: empty list; give at least one W:b such as " + DefaultSpecs)
	}
	parts := strings.Split(s, ",")
	specs := make([]Spec, 0, len(parts))
	seen := make(map[int64]string, len(parts))
	for _, p := range parts {
		p = strings.TrimSpace(p)
		wStr, bStr, ok := strings.Cut(p, ":")
		if !ok {
			return nil, fmt.Errorf("window spec %q: want W:b, e.g. 5m:5s", p)
		}
		w, err := parseMs(strings.TrimSpace(wStr))
		if err != nil {
			return nil, fmt.Errorf("window spec %q: window length: %w", p, err)
		}
		b, err := parseMs(strings.TrimSpace(bStr))
		if err != nil {
			return nil, fmt.Errorf("window spec %q: bucket width: %w", p, err)
		}
		sp, err := NewSpec(w, b)
		if err != nil {
			return nil, fmt.Errorf("window spec %q: %w", p, err)
		}
		if prev, dup := seen[w]; dup {
			return nil, fmt.Errorf("window spec %q: window length %s already configured by %q; each window length may appear once", p, sp.Name, prev)
		}
		seen[w] = p
		specs = append(specs, sp)
	}
	return specs, nil
}

// NewSpec validates one window of w ms in buckets of b ms.
func NewSpec(w, b int64) (Spec, error) {
	switch {
	case w <= 0:
		return Spec{}, fmt.Errorf("window length %dms must be positive", w)
	case b <= 0:
		return Spec{}, fmt.Errorf("bucket width %dms must be positive", b)
	case w%b != 0:
		return Spec{}, fmt.Errorf("window length %s is not a multiple of bucket width %s", msName(w), msName(b))
	case w/b > MaxBuckets:
		return Spec{}, fmt.Errorf("window %s in buckets of %s has %d buckets, more than the limit of %d; use wider buckets", msName(w), msName(b), w/b, MaxBuckets)
	}
	return Spec{Name: msName(w), WindowMs: w, BucketMs: b, Buckets: int(w / b)}, nil
}

// FormatSpecs renders specs canonically; ParseSpecs(FormatSpecs(x)) equals x.
func FormatSpecs(specs []Spec) string {
	var sb strings.Builder
	for i, sp := range specs {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(msName(sp.WindowMs))
		sb.WriteByte(':')
		sb.WriteString(msName(sp.BucketMs))
	}
	return sb.String()
}

// parseMs reads a Go duration or whole days ("2d") as whole milliseconds.
func parseMs(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("missing duration")
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: want whole days such as 1d", s)
		}
		const dayMs = int64(24 * time.Hour / time.Millisecond)
		if n > (1<<62)/dayMs || n < -(1<<62)/dayMs {
			return 0, fmt.Errorf("%q: too long", s)
		}
		return n * dayMs, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: want a duration such as 5m, 1500ms or 1d", s)
	}
	if d%time.Millisecond != 0 {
		return 0, fmt.Errorf("%q: must be a whole number of milliseconds", s)
	}
	return int64(d / time.Millisecond), nil
}

// msName names a length by the largest of h, m, s, ms that divides it exactly,
// so that names are short and round-trip through parseMs.
func msName(ms int64) string {
	switch {
	case ms != 0 && ms%3600000 == 0:
		return strconv.FormatInt(ms/3600000, 10) + "h"
	case ms != 0 && ms%60000 == 0:
		return strconv.FormatInt(ms/60000, 10) + "m"
	case ms != 0 && ms%1000 == 0:
		return strconv.FormatInt(ms/1000, 10) + "s"
	default:
		return strconv.FormatInt(ms, 10) + "ms"
	}
}

func validSpecs(specs []Spec) error {
	if len(specs) == 0 {
		return errors.New("window specs: need at least one window")
	}
	if len(specs) > 64 {
		return fmt.Errorf("window specs: %d windows, at most 64 supported", len(specs))
	}
	seen := make(map[int64]bool, len(specs))
	for i, sp := range specs {
		want, err := NewSpec(sp.WindowMs, sp.BucketMs)
		if err != nil {
			return fmt.Errorf("window spec %d: %w", i, err)
		}
		if sp != want {
			return fmt.Errorf("window spec %d: %+v is inconsistent; build specs with ParseSpecs or NewSpec", i, sp)
		}
		if seen[sp.WindowMs] {
			return fmt.Errorf("window spec %d: window length %s appears twice", i, sp.Name)
		}
		seen[sp.WindowMs] = true
	}
	return nil
}
