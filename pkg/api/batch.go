package api

import (
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/velocity-consumer/velocity-consumer/pkg/service"
)

// The batch endpoint's hot path. A batch is where many lookups per second are cheap:
// one request, one body read, one response write and one hand-over per partition for
// all its entities, where single lookups pay each of those per entity. So its body is
// parsed, and its answer written, without encoding/json in the common case:
//
//   - parseBatchFast takes the bodies clients send (the three known fields, each at
//     most once; ids and window names of printable ASCII without escapes; at as an
//     integer or such a string) and declines anything else, which decodeStrict then
//     decodes (and refuses, with its message) exactly as before. What it accepts it
//     decodes as encoding/json would (FuzzBatchBodyFast checks the two agree).
//   - appendBatch writes the bytes encoding/json writes for batchResponse
//     (TestAppendBatchMatchesEncodingJSON).
//   - every local partition is read at once: the batch waits for the slowest
//     partition's turn, not for the sum of them.

// bodyPool recycles request body buffers of the batch endpoint.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// batch serves POST /v1/velocity:batch: many entities in one request, grouped by
// partition; each partition is read once, here or at its owner (one forwarded
// batch per owner partition), and results come back in request order, each with
// its own status.
func (s *Server) batch(w http.ResponseWriter, r *http.Request) {
	bp := bodyPool.Get().(*[]byte)
	raw, e := readBody(r, *bp)
	if e != nil {
		writeError(w, e)
		return
	}
	// The ids are substrings of one copy of the body, which outlives the buffer.
	body := string(raw)
	*bp = raw[:0]
	bodyPool.Put(bp)
	b, ok := parseBatchFast(body)
	if !ok {
		b = batchBody{}
		if e := decodeStrict([]byte(body), &b); e != nil {
			writeError(w, e)
			return
		}
	}
	if b.EntityIDs == nil {
		writeError(w, errf(http.StatusBadRequest, "invalid_body", "entity_ids is required"))
		return
	}
	if len(b.EntityIDs) > MaxBatch {
		writeError(w, errf(http.StatusBadRequest, "too_many_entities", "at most %d entity ids per batch", MaxBatch))
		return
	}
	if b.nullWindows {
		writeError(w, errf(http.StatusBadRequest, "invalid_body", "windows must be an array of window names"))
		return
	}
	useDefault, asOf := true, int64(0)
	if len(b.At) > 0 {
		var e *apiError
		if asOf, e = jsonTime("at", b.At); e != nil {
			writeError(w, e)
			return
		}
		useDefault = false
	}
	sel, e := s.windows(b.Windows)
	if e != nil {
		writeError(w, e)
		return
	}
	n, ok := s.cfg.Locator.Partitions()
	if !ok {
		s.cfg.Locator.Poke()
		writeError(w, unavailable("the input topic's partitions are not known yet"))
		return
	}
	results := make([]batchItem, len(b.EntityIDs))
	groups := s.groupByPartition(b.EntityIDs, n, results)
	for g := range groups {
		gr := &groups[g]
		gr.req = service.NewReadRequest(len(gr.idx), len(s.specs))
		for j, i := range gr.idx {
			it := &gr.req.Items[j]
			it.Entity, it.AsOf, it.UseDefault = b.EntityIDs[i], asOf, useDefault
		}
	}
	// Every partition's request is handed over before any is waited for.
	if len(groups) == 1 {
		groups[0].e = s.readLocal(r.Context(), groups[0].p, groups[0].req)
	} else {
		var wg sync.WaitGroup
		for g := range groups {
			wg.Go(func() { groups[g].e = s.readLocal(r.Context(), groups[g].p, groups[g].req) })
		}
		wg.Wait()
	}
	type remote struct {
		base string
		idx  []int
	}
	var remotes []remote
	for g := range groups {
		gr := &groups[g]
		e := gr.e
		if e == errNotHere {
			var base string
			if base, e = s.owner(r, gr.p); e == nil {
				remotes = append(remotes, remote{base, gr.idx})
				continue
			}
		}
		for j, i := range gr.idx {
			switch it := &gr.req.Items[j]; {
			case e != nil:
				results[i] = batchItem{Status: e.status, Error: e}
			case it.Err != nil:
				ie := itemError(it.Err)
				results[i] = batchItem{Status: ie.status, Error: ie}
			default:
				results[i] = batchItem{Status: http.StatusOK, local: it, part: gr.p}
			}
		}
	}
	done := make(chan struct{}, len(remotes))
	for _, rm := range remotes {
		go func() {
			defer func() { done <- struct{}{} }()
			s.forwardBatch(r, rm.base, b, rm.idx, results)
		}()
	}
	for range remotes {
		<-done
	}
	out := bufPool.Get().(*[]byte)
	buf := append(s.appendBatch((*out)[:0], results, sel), '\n')
	w.Header()["Content-Type"] = jsonContentType
	_, _ = w.Write(buf)
	if cap(buf) <= 1<<20 { // a rare huge answer is not kept
		*out = buf
		bufPool.Put(out)
	}
}

// partGroup is the entities of a batch in one partition, and their read.
type partGroup struct {
	p   int32
	idx []int // indexes into the batch's ids, in request order
	req *service.ReadRequest
	e   *apiError // the read's outcome (readLocal)
}

// groupByPartition sorts the valid ids of a batch into their partitions (of n); an
// invalid id gets its error in results instead.
func (s *Server) groupByPartition(ids []string, n int32, results []batchItem) []partGroup {
	parts := make([]int32, len(ids))
	order := make([]int, 0, len(ids))
	for i, id := range ids {
		if e := entityID(id); e != nil {
			results[i] = batchItem{Status: e.status, Error: e}
			continue
		}
		parts[i] = PartitionOf(id, n)
		order = append(order, i)
	}
	slices.SortStableFunc(order, func(a, b int) int { return int(parts[a]) - int(parts[b]) })
	var groups []partGroup
	for k := 0; k < len(order); {
		j := k + 1
		for j < len(order) && parts[order[j]] == parts[order[k]] {
			j++
		}
		groups = append(groups, partGroup{p: parts[order[k]], idx: order[k:j:j]})
		k = j
	}
	return groups
}

// appendBatch appends the batch answer as encoding/json writes batchResponse (without
// the trailing newline).
func (s *Server) appendBatch(dst []byte, results []batchItem, sel []int) []byte {
	dst = append(dst, `{"results":[`...)
	for i := range results {
		it := &results[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"status":`...)
		dst = strconv.AppendInt(dst, int64(it.Status), 10)
		switch {
		case it.local != nil:
			dst = append(dst, `,"velocity":`...)
			dst = s.appendLookup(dst, it.local, it.part, sel)
		case it.Velocity != nil:
			dst = append(dst, `,"velocity":`...)
			dst = appendVelocity(dst, it.Velocity)
		}
		if it.Error != nil {
			dst = append(dst, `,"error":`...)
			dst = appendAPIError(dst, it.Error)
		}
		dst = append(dst, '}')
	}
	return append(dst, ']', '}')
}

// appendAPIError appends e as encoding/json encodes it.
func appendAPIError(dst []byte, e *apiError) []byte {
	dst = append(dst, `{"code":`...)
	dst = appendJSONString(dst, e.Code)
	dst = append(dst, `,"message":`...)
	dst = appendJSONString(dst, e.Msg)
	if e.From != nil {
		dst = appendField(dst, "from", *e.From)
	}
	if e.To != nil {
		dst = appendField(dst, "to", *e.To)
	}
	return append(dst, '}')
}

// parseBatchFast decodes the common form of a batch body (see the top of this file);
// ok=false means "not decided here", never "invalid".
func parseBatchFast(body string) (b batchBody, ok bool) {
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return b, false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return b, skipSpace(body, i+1) == len(body)
	}
	var seenIDs, seenAt, seenWindows bool
	for {
		key, j, ok := plainString(body, i)
		if !ok {
			return b, false
		}
		if i = skipSpace(body, j); i == len(body) || body[i] != ':' {
			return b, false
		}
		i = skipSpace(body, i+1)
		switch {
		case key == "entity_ids" && !seenIDs:
			seenIDs = true
			if b.EntityIDs, j, ok = plainStrings(body, i); !ok {
				return b, false
			}
		case key == "windows" && !seenWindows:
			seenWindows = true
			if b.Windows, j, ok = plainStrings(body, i); !ok || len(b.Windows) == 0 {
				// An empty list encoding/json leaves as an empty non-nil slice, the
				// same selection as none; decodeStrict has it.
				return b, false
			}
		case key == "at" && !seenAt:
			seenAt = true
			if j, ok = plainTime(body, i); !ok {
				return b, false
			}
			b.At = []byte(body[i:j])
		default: // unknown, or repeated (decodeStrict decides what that means)
			return b, false
		}
		i = skipSpace(body, j)
		if i == len(body) {
			return b, false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
			continue
		case '}':
			return b, skipSpace(body, i+1) == len(body)
		}
		return b, false
	}
}

// skipSpace skips JSON whitespace from i.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at i made only of printable ASCII without escapes
// (so its value is its bytes) and returns its value and the index after it.
func plainString(s string, i int) (v string, next int, ok bool) {
	if i == len(s) || s[i] != '"' {
		return "", i, false
	}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			return s[i+1 : j], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", i, false
		}
	}
	return "", i, false
}

// plainStrings reads a JSON array of plain strings (plainString) at i.
func plainStrings(s string, i int) (vs []string, next int, ok bool) {
	if i == len(s) || s[i] != '[' {
		return nil, i, false
	}
	i = skipSpace(s, i+1)
	vs = []string{}
	if i < len(s) && s[i] == ']' {
		return vs, i + 1, true
	}
	for {
		v, j, ok := plainString(s, i)
		if !ok {
			return nil, i, false
		}
		vs = append(vs, v)
		if i = skipSpace(s, j); i == len(s) {
			return nil, i, false
		}
		switch s[i] {
		case ',':
			i = skipSpace(s, i+1)
			continue
		case ']':
			return vs, i + 1, true
		}
		return nil, i, false
	}
}

// plainTime reads, at i, a JSON integer (-?(0|[1-9][0-9]*), no fraction or exponent)
// or a plain string, and returns the index after it.
func plainTime(s string, i int) (next int, ok bool) {
	if i < len(s) && s[i] == '"' {
		_, j, ok := plainString(s, i)
		return j, ok
	}
	j := i
	if j < len(s) && s[j] == '-' {
		j++
	}
	switch {
	case j == len(s) || s[j] < '0' || s[j] > '9':
		return i, false
	case s[j] == '0':
		j++
	default:
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
	}
	if j < len(s) && (s[j] == '.' || s[j] == 'e' || s[j] == 'E' || (s[j] >= '0' && s[j] <= '9')) {
		return i, false // a fraction, an exponent, or a leading zero's digits
	}
	return j, true
}
