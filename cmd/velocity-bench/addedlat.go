package main

// The time ours adds, read from its own histogram (velocity_added_latency_seconds:
// per batch, from the poll that fetched it to the hand-off of its last output to the
// producer), so that a latency run shows the part of the end-to-end latency that is
// the processor's, apart from the broker, the load generator and the reorder wait.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// addedLatencyMetric is ours' histogram of the latency it adds per batch.
const addedLatencyMetric = "velocity_added_latency_seconds"

// histogram is a Prometheus histogram as scraped: cumulative counts per upper bound
// (the +Inf bucket last).
type histogram struct {
	le  []float64
	cum []float64
}

// count is the number of observations.
func (h histogram) count() float64 {
	if len(h.cum) == 0 {
		return 0
	}
	return h.cum[len(h.cum)-1]
}

// since is h minus an earlier scrape of the same histogram: the observations in
// between. A histogram whose buckets differ from earlier's (another process) is an
// error.
func (h histogram) since(earlier histogram) (histogram, error) {
	if len(earlier.le) == 0 {
		return h, nil
	}
	if len(earlier.le) != len(h.le) {
		return histogram{}, fmt.Errorf("histogram buckets changed between scrapes")
	}
	d := histogram{le: h.le, cum: make([]float64, len(h.cum))}
	for i := range h.cum {
		if h.le[i] != earlier.le[i] {
			return histogram{}, fmt.Errorf("histogram buckets changed between scrapes")
		}
		d.cum[i] = h.cum[i] - earlier.cum[i]
	}
	return d, nil
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile does: linear
// within the bucket that holds it, the lower bound of the first bucket being 0; a
// quantile in the +Inf bucket is the largest finite bound. NaN without observations.
func (h histogram) quantile(q float64) float64 {
	n := h.count()
	if n == 0 {
		return math.NaN()
	}
	rank := q * n
	i := sort.Search(len(h.cum), func(i int) bool { return h.cum[i] >= rank })
	if i >= len(h.le) {
		i = len(h.le) - 1
	}
	if math.IsInf(h.le[i], 1) {
		if i == 0 {
			return math.NaN()
		}
		return h.le[i-1]
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = h.le[i-1], h.cum[i-1]
	}
	inBucket := h.cum[i] - below
	if inBucket == 0 {
		return h.le[i]
	}
	return lo + (h.le[i]-lo)*(rank-below)/inBucket
}

// parseHistogram reads histogram name from Prometheus's text format.
func parseHistogram(r io.Reader, name string) (histogram, error) {
	var h histogram
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	prefix := name + `_bucket{le="`
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		le, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			return histogram{}, fmt.Errorf("%s: bad bucket line %q", name, line)
		}
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return histogram{}, fmt.Errorf("%s: bad bound in %q: %w", name, line, err)
		}
		c, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return histogram{}, fmt.Errorf("%s: bad count in %q: %w", name, line, err)
		}
		h.le, h.cum = append(h.le, bound), append(h.cum, c)
	}
	if err := sc.Err(); err != nil {
		return histogram{}, err
	}
	if len(h.le) == 0 {
		return histogram{}, fmt.Errorf("%s: not in the scrape", name)
	}
	return h, nil
}

// scrapeHistogram fetches http://addr/metrics and reads histogram name.
func scrapeHistogram(ctx context.Context, addr, name string) (histogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return histogram{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return histogram{}, err
	}
	defer resp.Body.Close()
	return parseHistogram(resp.Body, name)
}

// freeLoopbackAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
