// Package api is the query API's HTTP server: an entity's velocity from the live
// state of the partition that holds it, on request (issue 23, docs/api.md, the
// OpenAPI document in api/openapi.yaml).
//
// Any instance answers for any entity. The server finds the entity's partition as
// Kafka's default partitioner does (murmur2.go), asks its own service for it
// (pkg/service's Read, served on the partition's goroutine), and when this instance
// does not run that partition forwards the request once to the owner the consumer
// group names (router.go). A partition being restored or moved, whose owner has no
// worker yet, gets 503 with Retry-After: never an answer from a previous owner's
// state.
//
// Nothing a request carries can change state: lookups and previews are reads (see
// pkg/pipeline/query.go). Entity ids appear in responses only: never in logs or
// metric labels.
package api

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	apispec "github.com/velocity-consumer/velocity-consumer/api"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// Backend is what the server needs of the live service (*service.Service).
type Backend interface {
	Read(ctx context.Context, p int32, req *service.ReadRequest) error
	GroupMember() (memberID string, ok bool)
	Specs() []window.Spec
}

// Config configures a Server.
type Config struct {
	Backend Backend
	Locator Locator
	// Token, if not empty, is the bearer token every request but the OpenAPI
	// document's must carry (Authorization: Bearer <token>). Forwarded requests
	// carry the caller's, so all instances share one token.
	Token string
	// Peers is the client that forwards to other instances (its TLS config must
	// trust their certificates); nil = a default client.
	Peers *http.Client
	// Registerer gets the API's metrics; nil = none.
	Registerer prometheus.Registerer
	Log        *zap.Logger
	// ReadTimeout bounds the wait for a partition's answer; default 2s.
	ReadTimeout time.Duration

	// Group names the in-place group, Backend's features (a FeatureSource), on the
	// group routes (groups.go): the definition's `group`, default "entity".
	Group string
	// Groups are the definition's re-keyed groups, in definition order, each
	// computed by a service of its own and routed by its own consumer group.
	Groups []Group
}

// Limits of a request.
const (
	MaxBatch       = service.MaxReadItems // entity ids in one batch
	maxBodyBytes   = 1 << 20
	retryAfterSecs = "1"
	forwardedHdr   = "X-Velocity-Forwarded"
)

// Server serves the API. Create it with New; it is an http.Handler.
type Server struct {
	cfg    Config
	specs  []window.Spec
	byName map[string]int
	log    *zap.Logger
	peers  *http.Client

	allWindows []int     // every window, in order: the selection of most lookups
	windowHead [][]byte  // by window: the constant start of its part of an answer (encode.go)
	reqPool    sync.Pool // *service.ReadRequest of one lookup item

	// With a feature definition (FeatureSource): its answers' text. nil feats: the
	// features endpoints do not exist.
	feats *featureText
	// groups are the feature groups (groups.go): [0] the in-place group (Backend),
	// then Config.Groups in order; byGroup indexes them by name. Empty without a
	// definition.
	groups  []*featGroup
	byGroup map[string]int
	txnPool sync.Pool // *txnCall

	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	forwarded *prometheus.CounterVec
	// The series each request updates, resolved once: WithLabelValues hashes its
	// labels and formats the status code on every call.
	latencyOf  [numOps]prometheus.Observer
	requestsOf [numOps][600]atomic.Pointer[prometheus.Counter] // by status code, filled on first use
}

// op is an endpoint, the "op" label of the API's metrics.
type op int

const (
	opOpenAPI op = iota
	opBatch
	opVelocity
	opPreview
	opFeatures
	opGroupFeatures
	opTransaction
	opGroups
	opOther
	numOps
)

var opNames = [numOps]string{"openapi", "batch", "velocity", "preview", "features", "group_features", "transaction", "groups", "other"}

// requestCounter is the requests_total series of (o, code).
func (s *Server) requestCounter(o op, code int) prometheus.Counter {
	if code < 0 || code >= len(s.requestsOf[o]) {
		return s.requests.WithLabelValues(opNames[o], strconv.Itoa(code))
	}
	slot := &s.requestsOf[o][code]
	if c := slot.Load(); c != nil {
		return *c
	}
	c := s.requests.WithLabelValues(opNames[o], strconv.Itoa(code))
	slot.Store(&c) // a race stores the same series twice
	return c
}

// New makes a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil || cfg.Locator == nil {
		return nil, errors.New("api: Backend and Locator are required")
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 2 * time.Second
	}
	s := &Server{cfg: cfg, specs: cfg.Backend.Specs(), byName: map[string]int{}, log: cfg.Log, peers: cfg.Peers}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.peers == nil {
		s.peers = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}}
	}
	for i, sp := range s.specs {
		s.byName[sp.Name] = i
		s.allWindows = append(s.allWindows, i)
	}
	s.windowHead = windowHeads(s.specs)
	if err := s.setGroups(); err != nil {
		return nil, err
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "velocity_api_requests_total", Help: "Query API requests by operation and HTTP status.",
	}, []string{"op", "code"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "velocity_api_request_seconds", Help: "Query API request duration by operation, forwarding included.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	}, []string{"op"})
	s.forwarded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "velocity_api_forwarded_total", Help: "Query API requests (or batch parts) forwarded to the partition's owner, by outcome.",
	}, []string{"outcome"})
	for o := range numOps {
		s.latencyOf[o] = s.latency.WithLabelValues(opNames[o])
	}
	if r := cfg.Registerer; r != nil {
		for _, c := range []prometheus.Collector{s.requests, s.latency, s.forwarded} {
			if err := r.Register(c); err != nil {
				return nil, fmt.Errorf("api: metrics: %w", err)
			}
		}
	}
	return s, nil
}

// apiError is the JSON error body: {"error": {"code", "message", ...}}.
type apiError struct {
	status int
	Code   string `json:"code"`
	Msg    string `json:"message"`
	From   *int64 `json:"from,omitempty"` // at_out_of_range: the range that is answerable
	To     *int64 `json:"to,omitempty"`
}

func errf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, Code: code, Msg: fmt.Sprintf(format, args...)}
}

func unavailable(format string, args ...any) *apiError {
	return errf(http.StatusServiceUnavailable, "unavailable", format, args...)
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

// writerPool recycles statusWriters: one per request would be the handler's only
// allocation on a lookup's path besides net/http's own.
var writerPool = sync.Pool{New: func() any { return new(statusWriter) }}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// ServeHTTP routes by hand rather than with http.ServeMux, whose path cleaning would
// redirect ids such as "." or "a/../b" instead of answering for them.
func (s *Server) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	w := writerPool.Get().(*statusWriter)
	*w = statusWriter{ResponseWriter: rw, code: http.StatusOK}
	o := s.route(w, r)
	code := w.code
	*w = statusWriter{}
	writerPool.Put(w)
	s.requestCounter(o, code).Inc()
	s.latencyOf[o].Observe(time.Since(start).Seconds())
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) op {
	path := r.URL.EscapedPath()
	switch {
	case path == "/v1/openapi.yaml":
		if !s.method(w, r, http.MethodGet) {
			return opOpenAPI
		}
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(apispec.OpenAPI)
		return opOpenAPI
	case path == "/v1/velocity:batch":
		if s.method(w, r, http.MethodPost) && s.authorized(w, r) {
			s.batch(w, r)
		}
		return opBatch
	case s.feats != nil && path == "/v1/transaction/features":
		if s.method(w, r, http.MethodPost) && s.authorized(w, r) {
			s.transaction(w, r)
		}
		return opTransaction
	case s.feats != nil && path == "/v1/groups":
		if s.method(w, r, http.MethodGet) && s.authorized(w, r) {
			s.listGroups(w)
		}
		return opGroups
	case s.feats != nil && strings.HasPrefix(path, "/v1/groups/"):
		if o, ok := s.routeGroup(w, r, path[len("/v1/groups/"):]); ok {
			return o
		}
	case strings.HasPrefix(path, "/v1/entities/"):
		rest := path[len("/v1/entities/"):]
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			break
		}
		escID, action := rest[:i], rest[i+1:]
		switch action {
		case "velocity":
			if s.method(w, r, http.MethodGet) && s.authorized(w, r) {
				s.velocity(w, r, escID)
			}
			return opVelocity
		case "velocity:preview":
			if s.method(w, r, http.MethodPost) && s.authorized(w, r) {
				s.preview(w, r, escID)
			}
			return opPreview
		case "features":
			if s.feats == nil {
				break // no definition: the path is unknown, as it always was
			}
			if s.method(w, r, http.MethodGet) && s.authorized(w, r) {
				s.features(w, r, s.groups[0], escID, false)
			}
			return opFeatures
		}
	}
	writeError(w, errf(http.StatusNotFound, "not_found", "no such endpoint; see /v1/openapi.yaml"))
	return opOther
}

func (s *Server) method(w http.ResponseWriter, r *http.Request, want string) bool {
	if r.Method == want {
		return true
	}
	w.Header().Set("Allow", want)
	writeError(w, errf(http.StatusMethodNotAllowed, "method_not_allowed", "use %s", want))
	return false
}

func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.cfg.Token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="velocity"`)
	writeError(w, errf(http.StatusUnauthorized, "unauthorized", "a valid bearer token is required"))
	return false
}

// jsonContentType is shared by every response's header map (net/http only reads it),
// saving Header.Set's slice per response.
var jsonContentType = []string{"application/json"}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfterSecs)
	}
	writeJSON(w, e.status, map[string]*apiError{"error": e})
}

// ---- input ----

// entityID checks an id from a path segment or a body.
func entityID(id string) *apiError {
	switch {
	case id == "":
		return errf(http.StatusBadRequest, "invalid_entity_id", "entity_id is empty")
	case len(id) > codec.MaxEntityIDBytes:
		return errf(http.StatusBadRequest, "invalid_entity_id", "entity_id is %d bytes, over the limit of %d", len(id), codec.MaxEntityIDBytes)
	case !utf8.ValidString(id):
		return errf(http.StatusBadRequest, "invalid_entity_id", "entity_id is not valid UTF-8")
	}
	return nil
}

func pathEntity(esc string) (string, *apiError) {
	id, err := url.PathUnescape(esc)
	if err != nil {
		return "", errf(http.StatusBadRequest, "invalid_entity_id", "entity_id is not a valid percent-encoded path segment")
	}
	return id, entityID(id)
}

// maxTimeText bounds a time's text, as the OpenAPI document does (maxLength): an
// RFC 3339 time with nanoseconds and an offset is 35 bytes, milliseconds at most 20.
const maxTimeText = 64

// parseTime reads an event time: integer Unix milliseconds or RFC 3339.
func parseTime(field, v string) (int64, *apiError) {
	switch {
	case v == "":
		return 0, errf(http.StatusBadRequest, "invalid_"+field, "%s is empty", field)
	case len(v) > maxTimeText:
		// Leading zeros would make a longer integer valid; the document says 64 at most.
		return 0, errf(http.StatusBadRequest, "invalid_"+field, "%s is over %d bytes", field, maxTimeText)
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return checkTime(field, ms)
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return 0, errf(http.StatusBadRequest, "invalid_"+field, "%s must be Unix milliseconds or an RFC 3339 time", field)
	}
	sec := t.Unix()
	if sec > math.MaxInt64/1000 || sec < math.MinInt64/1000 {
		return 0, errf(http.StatusBadRequest, "invalid_"+field, "%s is out of range", field)
	}
	return checkTime(field, t.UnixMilli())
}

func checkTime(field string, ms int64) (int64, *apiError) {
	if ms > pipeline.MaxTime || ms < -pipeline.MaxTime {
		return 0, errf(http.StatusBadRequest, "invalid_"+field, "%s is out of range (±2^62 ms)", field)
	}
	return ms, nil
}

// jsonTime reads a time given in a JSON body as a number or a string.
func jsonTime(field string, raw json.RawMessage) (int64, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, errf(http.StatusBadRequest, "invalid_"+field, "%s is not a valid string", field)
		}
		if _, err := strconv.ParseInt(s, 10, 64); err == nil {
			return 0, errf(http.StatusBadRequest, "invalid_"+field, "%s as a string must be RFC 3339; give milliseconds as a number", field)
		}
		return parseTime(field, s)
	}
	ms, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, errf(http.StatusBadRequest, "invalid_"+field, "%s must be an integer number of Unix milliseconds or an RFC 3339 string", field)
	}
	return checkTime(field, ms)
}

// windows picks the windows to report: all, or those named (comma-separated, repeated).
func (s *Server) windows(names []string) ([]int, *apiError) {
	if len(names) == 0 {
		return s.allWindows, nil
	}
	var idx []int
	seen := map[int]bool{}
	for _, v := range names {
		for _, n := range strings.Split(v, ",") {
			i, ok := s.byName[strings.TrimSpace(n)]
			if !ok {
				known := make([]string, len(s.specs))
				for j, sp := range s.specs {
					known[j] = sp.Name
				}
				return nil, errf(http.StatusBadRequest, "unknown_window", "unknown window %q; configured: %s", truncate(n, 32), strings.Join(known, ", "))
			}
			if !seen[i] {
				seen[i] = true
				idx = append(idx, i)
			}
		}
	}
	if idx == nil {
		return s.allWindows, nil // shared: callers only read it
	}
	return idx, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// decodeBody reads a JSON object into v, strictly: unknown fields, trailing data and
// over-long bodies are errors.
func decodeBody(r *http.Request, v any) ([]byte, *apiError) {
	body, e := readBody(r, nil)
	if e != nil {
		return nil, e
	}
	return body, decodeStrict(body, v)
}

// readBody reads the request's body into buf[:0] (growing it), refusing one over
// maxBodyBytes.
func readBody(r *http.Request, buf []byte) ([]byte, *apiError) {
	body, err := readAllInto(buf[:0], r.Body, r.ContentLength, maxBodyBytes+1)
	if err != nil {
		return nil, errf(http.StatusBadRequest, "invalid_body", "cannot read the body")
	}
	if len(body) > maxBodyBytes {
		return nil, errf(http.StatusRequestEntityTooLarge, "body_too_large", "the body is over %d bytes", maxBodyBytes)
	}
	return body, nil
}

// readAllInto is io.ReadAll appending to dst, sized at once by a known length, of
// at most limit bytes (io.LimitReader's, without allocating one per request).
func readAllInto(dst []byte, rd io.Reader, length, limit int64) ([]byte, error) {
	if length > 0 && length < limit {
		dst = slices.Grow(dst, int(length)+1) // +1: the read that sees EOF
	}
	start := len(dst)
	for {
		left := limit - int64(len(dst)-start)
		if left <= 0 {
			return dst, nil
		}
		if len(dst) == cap(dst) {
			dst = slices.Grow(dst, max(512, cap(dst)))
		}
		end := min(cap(dst), len(dst)+int(min(left, int64(cap(dst)))))
		n, err := rd.Read(dst[len(dst):end])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// decodeStrict decodes body, one JSON object, into v: unknown fields and trailing
// data are errors.
func decodeStrict(body []byte, v any) *apiError {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errf(http.StatusBadRequest, "invalid_body", "the body is not the JSON object this endpoint takes: %s", jsonErr(err))
	}
	if dec.More() {
		return errf(http.StatusBadRequest, "invalid_body", "data after the JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errf(http.StatusBadRequest, "invalid_body", "data after the JSON object")
	}
	return nil
}

// jsonErr describes a decode error without echoing the input (which may hold ids).
func jsonErr(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %q must be %s", te.Field, te.Type)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + truncate(strings.TrimPrefix(err.Error(), "json: unknown field "), 40)
	case errors.Is(err, io.EOF):
		return "empty body"
	}
	return "malformed JSON"
}

// ---- output ----

type windowJSON struct {
	Window   string `json:"window"`
	WindowMs int64  `json:"window_ms"`
	BucketMs int64  `json:"bucket_ms"`
	Count    int64  `json:"count"`
	SumMinor int64  `json:"sum_minor"`
	MinMinor int64  `json:"min_minor"`
	MaxMinor int64  `json:"max_minor"`
}

type rangeJSON struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

type velocityJSON struct {
	EntityID   string       `json:"entity_id"`
	Known      bool         `json:"known"`
	Partition  int32        `json:"partition"`
	AsOf       int64        `json:"as_of"`
	AsOfTime   string       `json:"as_of_time"`
	LastOffset int64        `json:"last_offset"`
	Pending    int          `json:"pending"`
	AtRange    rangeJSON    `json:"at_range"`
	Windows    []windowJSON `json:"windows"`
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

func (s *Server) velocityOf(it *service.ReadItem, p int32, sel []int) velocityJSON {
	v := velocityJSON{
		EntityID: it.Entity, Known: it.Info.Known, Partition: p,
		AsOf: it.Info.AsOf, AsOfTime: msTime(it.Info.AsOf), LastOffset: it.Info.LastOffset, Pending: it.Info.Pending,
		AtRange: rangeJSON{it.Info.From, it.Info.To}, Windows: make([]windowJSON, 0, len(sel)),
	}
	for _, i := range sel {
		sp, a := s.specs[i], it.Aggs[i]
		v.Windows = append(v.Windows, windowJSON{sp.Name, sp.WindowMs, sp.BucketMs, a.Count, a.Sum, a.Min, a.Max})
	}
	return v
}

// itemError maps a lookup's error to the API's.
func itemError(err error) *apiError {
	var re *pipeline.AsOfRangeError
	switch {
	case errors.As(err, &re):
		e := errf(http.StatusUnprocessableEntity, "at_out_of_range", "at %d is outside what this partition can answer exactly: %d to %d", re.AsOf, re.From, re.To)
		e.From, e.To = &re.From, &re.To
		return e
	case errors.Is(err, window.ErrNotRetained):
		return errf(http.StatusUnprocessableEntity, "at_not_retained", "at is before the bucket of this entity's newest counted event in some window, whose older buckets are no longer held")
	case errors.Is(err, window.ErrInput):
		return errf(http.StatusBadRequest, "invalid_request", "invalid input")
	case errors.Is(err, pipeline.ErrNoFeatures):
		// An owner that runs no definition answers the path itself (404 not_found);
		// this is the same answer for a partition served here without one.
		return errf(http.StatusNotFound, "not_found", "no such endpoint; see /v1/openapi.yaml")
	}
	return errf(http.StatusInternalServerError, "internal", "lookup failed")
}

// ---- reading a partition ----

// readLocal asks this instance's service for partition p. It returns nil when
// answered, or why not: errNotHere (forward), or an error to give the caller.
func (s *Server) readLocal(ctx context.Context, p int32, req *service.ReadRequest) *apiError {
	return s.readOn(ctx, s.cfg.Backend, p, req)
}

// readOn is readLocal of backend be (a group's service).
func (s *Server) readOn(ctx context.Context, be Backend, p int32, req *service.ReadRequest) *apiError {
	req.Timeout = s.cfg.ReadTimeout
	return readError(be.Read(ctx, p, req), p)
}

// readError maps a service's answer to a read of p to readLocal's.
func readError(err error, p int32) *apiError {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, service.ErrNotOwned):
		return errNotHere
	case errors.Is(err, service.ErrBusy):
		return unavailable("partition %d is busy; retry", p)
	case errors.Is(err, service.ErrTooManyItems):
		return errf(http.StatusRequestEntityTooLarge, "too_many_entities", "at most %d entities per request", MaxBatch)
	default:
		return unavailable("partition %d did not answer in time", p)
	}
}

var errNotHere = &apiError{status: http.StatusMisdirectedRequest, Code: "not_here"}

// owner decides where a request for p that this instance cannot answer goes: the
// owner's URL, or the 503 to give.
func (s *Server) owner(r *http.Request, p int32) (string, *apiError) {
	return s.ownerOn(r, s.cfg.Backend, s.cfg.Locator, p)
}

// ownerOn is owner in the consumer group of backend be, whose partitions loc
// locates (a group's).
func (s *Server) ownerOn(r *http.Request, be Backend, loc Locator, p int32) (string, *apiError) {
	if r.Header.Get(forwardedHdr) != "" {
		// Forwarded once already: the sender's table is stale or p is moving.
		return "", unavailable("partition %d is being restored or moved", p)
	}
	me, _ := be.GroupMember()
	o, ok, stable := loc.Owner(p)
	switch {
	case !ok || !stable:
		loc.Poke()
		return "", unavailable("partition %d is being assigned (the group is rebalancing)", p)
	case o.MemberID == me:
		return "", unavailable("partition %d is being restored on this instance", p)
	case o.URL == "":
		return "", unavailable("partition %d's owner does not serve the API (its --api-addr is off)", p)
	}
	return o.URL, nil
}

// forward sends the request to the owner at base and copies its answer back.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, base string, body []byte) {
	s.forwardOn(w, r, s.cfg.Locator, base, body)
}

// forwardOn is forward for a partition that loc locates (a group's).
func (s *Server) forwardOn(w http.ResponseWriter, r *http.Request, loc Locator, base string, body []byte) {
	resp, err := s.forwardRequest(r.Context(), r.Method, base+r.URL.RequestURI(), r.Header.Get("Authorization"), body)
	if err != nil {
		s.forwarded.WithLabelValues("failed").Inc()
		loc.Poke()
		s.log.Warn("query API: cannot reach the partition's owner", zap.String("owner", base), zap.Error(err))
		writeError(w, unavailable("the partition's owner is unreachable"))
		return
	}
	defer resp.Body.Close()
	s.forwarded.WithLabelValues("ok").Inc()
	for _, h := range []string{"Content-Type", "Retry-After", "WWW-Authenticate", "Allow"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (s *Server) forwardRequest(ctx context.Context, method, u, auth string, body []byte) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*s.cfg.ReadTimeout)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set(forwardedHdr, "1")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.peers.Do(req)
	if err != nil {
		cancel()
		// A *url.Error names the URL, whose path holds the entity id: the callers log
		// this error, and ids never go to logs.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = fmt.Errorf("%s to %s: %w", method, req.URL.Host, ue.Err)
		}
		return nil, err
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func (s *Server) partitionOf(id string) (int32, *apiError) { return partitionOn(s.cfg.Locator, id) }

// partitionOn is the partition of id on the topic loc locates.
func partitionOn(loc Locator, id string) (int32, *apiError) {
	n, ok := loc.Partitions()
	if !ok {
		loc.Poke()
		return 0, unavailable("the input topic's partitions are not known yet")
	}
	return PartitionOf(id, n), nil
}

// ---- endpoints ----

// velocity serves GET /v1/entities/{entity_id}/velocity.
func (s *Server) velocity(w http.ResponseWriter, r *http.Request, escID string) {
	id, e := pathEntity(escID)
	if e != nil {
		writeError(w, e)
		return
	}
	var q url.Values
	if r.URL.RawQuery != "" {
		q = r.URL.Query()
	}
	item := service.ReadItem{Entity: id, UseDefault: true}
	if at, ok := q["at"]; ok {
		if len(at) != 1 {
			writeError(w, errf(http.StatusBadRequest, "invalid_at", "give at once"))
			return
		}
		if item.AsOf, e = parseTime("at", at[0]); e != nil {
			writeError(w, e)
			return
		}
		item.UseDefault = false
	}
	sel, e := s.windows(q["window"])
	if e != nil {
		writeError(w, e)
		return
	}
	p, e := s.partitionOf(id)
	if e != nil {
		writeError(w, e)
		return
	}
	// A request goes back to the pool only once answered: after a timeout the
	// worker may still write to it.
	req, _ := s.reqPool.Get().(*service.ReadRequest)
	if req == nil {
		req = service.NewReadRequest(1, len(s.specs))
	}
	item.Aggs = req.Items[0].Aggs
	req.Items[0] = item
	req.Specs = nil
	switch e := s.readLocal(r.Context(), p, req); {
	case e == errNotHere:
		base, e := s.owner(r, p)
		if e != nil {
			writeError(w, e)
			return
		}
		s.forward(w, r, base, nil)
	case e != nil:
		writeError(w, e)
	case req.Items[0].Err != nil:
		writeError(w, itemError(req.Items[0].Err))
	default:
		bp := bufPool.Get().(*[]byte)
		b := append(s.appendLookup((*bp)[:0], &req.Items[0], p, sel), '\n')
		w.Header()["Content-Type"] = jsonContentType
		_, _ = w.Write(b)
		*bp = b
		bufPool.Put(bp)
		s.reqPool.Put(req) // answered: the worker is done with it
	}
}

type previewBody struct {
	AmountMinor *json.Number    `json:"amount_minor"`
	EventTime   json.RawMessage `json:"event_time"`
	EventID     json.RawMessage `json:"event_id"` // absent, or a string: null is refused
}

// isNull reports whether a field was given as JSON null (which no field takes).
func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

type featuresJSON struct {
	EventID         *string      `json:"event_id"`
	EntityID        string       `json:"entity_id"`
	EventTime       int64        `json:"event_time"`
	Windows         []windowJSON `json:"windows"`
	MsSincePrevious *int64       `json:"ms_since_previous"`
	Late            bool         `json:"late"`
	SourceTopic     string       `json:"source_topic"`
	SourcePartition int32        `json:"source_partition"`
	SourceOffset    int64        `json:"source_offset"`
}

type previewJSON struct {
	EntityID   string        `json:"entity_id"`
	Partition  int32         `json:"partition"`
	Outcome    string        `json:"outcome"`
	Detail     string        `json:"detail,omitempty"`
	Waits      bool          `json:"waits"`
	Features   *featuresJSON `json:"features"`
	AsOf       int64         `json:"as_of"`
	LastOffset int64         `json:"last_offset"`
	Pending    int           `json:"pending"`
}

// preview serves POST /v1/entities/{entity_id}/velocity:preview.
func (s *Server) preview(w http.ResponseWriter, r *http.Request, escID string) {
	id, e := pathEntity(escID)
	if e != nil {
		writeError(w, e)
		return
	}
	var b previewBody
	body, e := decodeBody(r, &b)
	if e != nil {
		writeError(w, e)
		return
	}
	tx := codec.Transaction{EntityID: id, EventID: "preview"}
	if b.AmountMinor == nil {
		writeError(w, errf(http.StatusBadRequest, "invalid_amount_minor", "amount_minor is required"))
		return
	}
	amount, err := strconv.ParseInt(b.AmountMinor.String(), 10, 64)
	if err != nil || amount < 0 || amount > codec.MaxAmountMinor {
		writeError(w, errf(http.StatusBadRequest, "invalid_amount_minor", "amount_minor must be an integer from 0 to 10^15"))
		return
	}
	tx.AmountMinor = amount
	if b.EventTime == nil {
		writeError(w, errf(http.StatusBadRequest, "invalid_event_time", "event_time is required"))
		return
	}
	if tx.EventTime, e = jsonTime("event_time", b.EventTime); e != nil {
		writeError(w, e)
		return
	}
	var eventID *string
	if b.EventID != nil {
		var id string
		if isNull(b.EventID) || json.Unmarshal(b.EventID, &id) != nil {
			writeError(w, errf(http.StatusBadRequest, "invalid_event_id", "event_id must be a string"))
			return
		}
		if l := len(id); l == 0 || l > codec.MaxEventIDBytes || !utf8.ValidString(id) {
			writeError(w, errf(http.StatusBadRequest, "invalid_event_id", "event_id must be 1 to %d bytes of UTF-8", codec.MaxEventIDBytes))
			return
		}
		tx.EventID, eventID = id, &id
	}
	p, e := s.partitionOf(id)
	if e != nil {
		writeError(w, e)
		return
	}
	pv := &pipeline.Preview{}
	req := service.NewReadRequest(1, len(s.specs))
	req.Items[0].Entity, req.Items[0].Preview, req.Items[0].Tx, req.Items[0].HasEventID = id, pv, tx, eventID != nil
	switch e := s.readLocal(r.Context(), p, req); {
	case e == errNotHere:
		base, e := s.owner(r, p)
		if e != nil {
			writeError(w, e)
			return
		}
		s.forward(w, r, base, body)
		return
	case e != nil:
		writeError(w, e)
		return
	}
	info := req.Items[0].Info
	out := previewJSON{EntityID: id, Partition: p, Outcome: "features", Detail: pv.Detail, Waits: pv.Waits,
		AsOf: info.AsOf, LastOffset: info.LastOffset, Pending: info.Pending}
	if pv.Outcome != "" {
		out.Outcome = string(pv.Outcome)
	} else {
		f := &pv.Features
		fj := &featuresJSON{EventID: eventID, EntityID: id, EventTime: f.EventTime, Late: f.Late,
			SourceTopic: f.SourceTopic, SourcePartition: f.SourcePartition, SourceOffset: f.SourceOffset}
		if f.HasPrevious {
			gap := f.MsSincePrevious
			fj.MsSincePrevious = &gap
		}
		for _, wa := range f.Windows {
			fj.Windows = append(fj.Windows, windowJSON{wa.Name, wa.WindowMs, wa.BucketMs, wa.Count, wa.SumMinor, wa.MinMinor, wa.MaxMinor})
		}
		out.Features = fj
	}
	writeJSON(w, http.StatusOK, out)
}

type batchBody struct {
	EntityIDs []string        `json:"entity_ids"`
	At        json.RawMessage `json:"at,omitempty"`
	Windows   []string        `json:"windows,omitempty"`
	// nullWindows records a "windows": null, which is refused (the schema says array).
	nullWindows bool
}

// UnmarshalJSON decodes a batch body strictly: unknown fields refused (the caller's
// decoder does that for the outer object), and windows null told apart from absent.
func (b *batchBody) UnmarshalJSON(data []byte) error {
	type plain struct {
		EntityIDs *[]json.RawMessage `json:"entity_ids"`
		At        json.RawMessage    `json:"at"`
		Windows   json.RawMessage    `json:"windows"`
	}
	var p plain
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return err
	}
	if p.EntityIDs != nil {
		b.EntityIDs = make([]string, len(*p.EntityIDs))
		for i, raw := range *p.EntityIDs {
			// A null would decode as "", an id that is merely empty: refuse it.
			if isNull(raw) || json.Unmarshal(raw, &b.EntityIDs[i]) != nil {
				return &json.UnmarshalTypeError{Value: "entity id", Type: reflect.TypeFor[string](), Field: "entity_ids"}
			}
		}
	}
	b.At = p.At
	if p.Windows != nil {
		if isNull(p.Windows) {
			b.nullWindows = true
			return nil
		}
		if err := json.Unmarshal(p.Windows, &b.Windows); err != nil {
			return err
		}
	}
	return nil
}

type batchItem struct {
	Status   int           `json:"status"`
	Velocity *velocityJSON `json:"velocity,omitempty"`
	Error    *apiError     `json:"error,omitempty"`
	// local, instead of Velocity, is a lookup answered here (written by
	// appendLookup for partition part).
	local *service.ReadItem
	part  int32
}

type batchResponse struct {
	Results []batchItem `json:"results"`
}

// forwardBatch asks the owner at base for the entities idx of b and fills their
// results (each index is written by one goroutine only).
func (s *Server) forwardBatch(r *http.Request, base string, b batchBody, idx []int, results []batchItem) {
	sub := batchBody{At: b.At, Windows: b.Windows, EntityIDs: make([]string, len(idx))}
	for j, i := range idx {
		sub.EntityIDs[j] = b.EntityIDs[i]
	}
	body, _ := json.Marshal(sub)
	fail := func(e *apiError) {
		for _, i := range idx {
			results[i] = batchItem{Status: e.status, Error: e}
		}
	}
	resp, err := s.forwardRequest(r.Context(), http.MethodPost, base+"/v1/velocity:batch", r.Header.Get("Authorization"), body)
	if err != nil {
		s.forwarded.WithLabelValues("failed").Inc()
		s.cfg.Locator.Poke()
		s.log.Warn("query API: cannot reach a partition's owner", zap.String("owner", base), zap.Error(err))
		fail(unavailable("the partition's owner is unreachable"))
		return
	}
	defer resp.Body.Close()
	s.forwarded.WithLabelValues("ok").Inc()
	if resp.StatusCode != http.StatusOK {
		var eb struct {
			Error *apiError `json:"error"`
		}
		if json.NewDecoder(io.LimitReader(resp.Body, maxBodyBytes)).Decode(&eb) == nil && eb.Error != nil {
			eb.Error.status = resp.StatusCode
			fail(eb.Error)
			return
		}
		fail(unavailable("the partition's owner answered %d", resp.StatusCode))
		return
	}
	var got batchResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16*maxBodyBytes)).Decode(&got); err != nil || len(got.Results) != len(idx) {
		fail(unavailable("the partition's owner gave an unreadable answer"))
		return
	}
	for j, i := range idx {
		it := got.Results[j]
		if it.Error != nil {
			it.Error.status = it.Status
		}
		results[i] = it
	}
}
