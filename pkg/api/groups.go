package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
)

// Feature groups (docs/api.md, "Several groups"): under a definition with re-keyed
// groups (docs/repartition.md) every group is its own service, with its own
// partitions and its own consumer group, so each group's key is routed like an
// entity id, but in that group's topic and group:
//
//   - GET /v1/groups/{group}/entities/{key}/features: one group's features of one
//     key, the features endpoint's answer with the group's name first. The in-place
//     group is a group like the others, by its name (the definition's `group`,
//     "entity" by default).
//   - POST /v1/transaction/features, body {"keys": {"card": "…", "device": "…"},
//     "at": …}: every named group's features of its key, one call for the several
//     keys of one transaction. Each key is read at its own owner: the local reads are
//     handed to their workers all at once (Submitter) and waited for together, the
//     rest go to their owners, one forwarded call per owner for all the groups it
//     owns, at once.
//   - GET /v1/groups: the groups' names.
//
// Without a definition none of these paths exist (404 not_found, as any unknown
// path). The transaction call's hot path (every key local, the body in the common
// form) allocates nothing: the body is parsed by hand (parseTxnFast) into a pooled
// call whose keys are substrings of the pooled body buffer, and the answer is
// written by hand (appendFeaturesOf).

// Group is a re-keyed group the server answers for: its name, the service that
// computes it (Backend, a FeatureSource with Features set: the group's spec) and
// the locator of its partitions' owners (its repartition topic, in its consumer
// group).
type Group struct {
	Name    string
	Backend Backend
	Locator Locator
}

// Submitter is a Backend whose reads can be handed over and waited for apart
// (*service.Service): the transaction call hands every local group's read to its
// worker before it waits for any. A Backend without it is read group after group.
type Submitter interface {
	Submit(p int32, req *service.ReadRequest) error
	Wait(ctx context.Context, req *service.ReadRequest) error
}

// featGroup is one group as the server serves it.
type featGroup struct {
	name    string
	backend Backend
	submit  Submitter // nil: backend only reads whole (Read)
	loc     Locator
	feats   *featureText
	head    []byte    // `"group":"<name>",`: the group answer's first field
	reqPool sync.Pool // *service.ReadRequest of one features item of this group
}

func newFeatGroup(name string, be Backend, loc Locator, ft *featureText) *featGroup {
	g := &featGroup{name: name, backend: be, loc: loc, feats: ft}
	g.submit, _ = be.(Submitter)
	g.head = append(appendJSONString([]byte(`"group":`), name), ',')
	return g
}

// getReq is a request of one features item of g, from its pool.
func (g *featGroup) getReq() *service.ReadRequest {
	req, _ := g.reqPool.Get().(*service.ReadRequest)
	if req == nil {
		req = service.NewReadRequest(1, 0)
		req.Items[0].Row = feature.NewRow(g.feats.spec)
	}
	req.Specs = nil
	return req
}

// setGroups sets up the features endpoints' groups from the configuration.
func (s *Server) setGroups() error {
	fs, ok := s.cfg.Backend.(FeatureSource)
	if !ok || fs.Features() == nil {
		if len(s.cfg.Groups) > 0 {
			return errors.New("api: re-keyed Groups need a Backend that runs a feature definition")
		}
		return nil
	}
	s.feats = newFeatureText(fs.Features(), fs.Definition())
	name := s.cfg.Group
	if name == "" {
		name = definition.DefaultGroup
	}
	s.groups = []*featGroup{newFeatGroup(name, s.cfg.Backend, s.cfg.Locator, s.feats)}
	s.byGroup = map[string]int{name: 0}
	for _, g := range s.cfg.Groups {
		gfs, ok := g.Backend.(FeatureSource)
		switch {
		case g.Name == "":
			return errors.New("api: a group has no name")
		case g.Locator == nil || g.Backend == nil:
			return fmt.Errorf("api: group %s: Backend and Locator are required", g.Name)
		case !ok || gfs.Features() == nil:
			return fmt.Errorf("api: group %s: its Backend runs no feature definition", g.Name)
		}
		if _, dup := s.byGroup[g.Name]; dup {
			return fmt.Errorf("api: two groups are named %s", g.Name)
		}
		s.byGroup[g.Name] = len(s.groups)
		s.groups = append(s.groups, newFeatGroup(g.Name, g.Backend, g.Locator, newFeatureText(gfs.Features(), gfs.Definition())))
	}
	n := len(s.groups)
	s.txnPool.New = func() any { return &txnCall{slots: make([]txnSlot, n)} }
	return nil
}

// groupNames lists the groups, for messages.
func (s *Server) groupNames() string {
	names := make([]string, len(s.groups))
	for i, g := range s.groups {
		names[i] = g.name
	}
	return strings.Join(names, ", ")
}

func (s *Server) unknownGroup(name string) *apiError {
	return errf(http.StatusNotFound, "unknown_group", "no group %q in the definition; its groups are %s", truncate(name, 40), s.groupNames())
}

// routeGroup routes rest, the path after /v1/groups/: {group}/entities/{key}/features
// (ok false: not that shape, an unknown path).
func (s *Server) routeGroup(w http.ResponseWriter, r *http.Request, rest string) (op, bool) {
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return 0, false
	}
	name, tail := rest[:i], rest[i+1:]
	escID, ok := strings.CutPrefix(tail, "entities/")
	if !ok {
		return 0, false
	}
	j := strings.IndexByte(escID, '/')
	if j < 0 || escID[j+1:] != "features" {
		return 0, false
	}
	// The group's names are told only to an authorized caller.
	if !s.method(w, r, http.MethodGet) || !s.authorized(w, r) {
		return opGroupFeatures, true
	}
	gi, ok := s.byGroup[name]
	if !ok {
		writeError(w, s.unknownGroup(name))
		return opGroupFeatures, true
	}
	s.features(w, r, s.groups[gi], escID[:j], true)
	return opGroupFeatures, true
}

// listGroups serves GET /v1/groups.
func (s *Server) listGroups(w http.ResponseWriter) {
	b := append([]byte(`{"groups":[`), nil...)
	for i, g := range s.groups {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = appendJSONString(b, g.name)
		b = append(b, `,"in_place":`...)
		if i == 0 {
			b = append(b, "true"...)
		} else {
			b = append(b, "false"...)
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	b = append(b, s.feats.def...)
	b = append(b, '}', '\n')
	w.Header()["Content-Type"] = jsonContentType
	_, _ = w.Write(b)
}

// ---- the transaction call ----

// maxTxnKeys bounds the entries of a transaction call's keys: more than a
// definition has groups (definition.MaxGroups re-keyed ones and the in-place one),
// with room for names an older or newer definition has.
const maxTxnKeys = 16

// txnKey is one entry of the body's keys.
type txnKey struct {
	name, key string
	none      bool // null or "": the transaction has no key for the group
}

// txnSlot is one group's part of a transaction call.
type txnSlot struct {
	asked  bool
	key    string
	p      int32
	req    *service.ReadRequest // local read (nil: none)
	sent   bool                 // handed to the group's Submitter, not yet waited for
	done   bool                 // answered here: req.Items[0] holds the answer
	remote string               // the owner it is forwarded to
	raw    []byte               // the owner's entry for it
	e      *apiError
}

// txnCall is one transaction call's state, pooled.
type txnCall struct {
	keys    [maxTxnKeys]txnKey
	nkeys   int
	at      []byte // the body's at, raw JSON; nil when absent
	slots   []txnSlot
	unknown []string // names the definition does not have, in request order
}

func (c *txnCall) reset() {
	c.keys, c.nkeys, c.at, c.unknown = [maxTxnKeys]txnKey{}, 0, nil, c.unknown[:0]
	for i := range c.slots {
		c.slots[i] = txnSlot{}
	}
}

// bytesString is b as a string without a copy: b must not change while the string
// is in use (the body buffer goes back to its pool only once every read that saw
// its keys has been answered).
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// transaction serves POST /v1/transaction/features.
func (s *Server) transaction(w http.ResponseWriter, r *http.Request) {
	bp := bodyPool.Get().(*[]byte)
	raw, e := readBody(r, *bp)
	if e != nil {
		*bp = (*bp)[:0]
		bodyPool.Put(bp)
		writeError(w, e)
		return
	}
	c := s.txnPool.Get().(*txnCall)
	c.reset()
	recycle := s.transactionOf(w, r, c, raw)
	// The keys are substrings of raw: it is reused only when no worker can still
	// read them (recycle: every local read was answered).
	if recycle {
		*bp = raw[:0]
		bodyPool.Put(bp)
		c.reset()
		s.txnPool.Put(c)
	}
}

// transactionOf answers the call of body raw; recycle false means a read was
// given up on (timeout, gone caller), whose worker may still read the keys.
func (s *Server) transactionOf(w http.ResponseWriter, r *http.Request, c *txnCall, raw []byte) (recycle bool) {
	if !parseTxnFast(bytesString(raw), c) {
		c.reset()
		if e := parseTxnStrict(raw, c); e != nil {
			writeError(w, e)
			return true
		}
	}
	useDefault, asOf := true, int64(0)
	if c.at != nil {
		var e *apiError
		if asOf, e = jsonTime("at", c.at); e != nil {
			writeError(w, e)
			return true
		}
		useDefault = false
	}
	for _, k := range c.keys[:c.nkeys] {
		gi, ok := s.byGroup[k.name]
		switch {
		case !ok:
			c.unknown = append(c.unknown, k.name)
		case k.none:
			// No key for the group: left out, as the pipeline leaves the record out.
		default:
			sl := &c.slots[gi]
			sl.asked, sl.key, sl.e = true, k.key, entityID(k.key)
		}
	}
	// Hand every local read over first; then wait for them together.
	recycle = true
	for gi, g := range s.groups {
		sl := &c.slots[gi]
		if !sl.asked || sl.e != nil {
			continue
		}
		if sl.p, sl.e = partitionOn(g.loc, sl.key); sl.e != nil {
			continue
		}
		sl.req = g.getReq()
		sl.req.Items[0] = service.ReadItem{Entity: sl.key, AsOf: asOf, UseDefault: useDefault, Row: sl.req.Items[0].Row}
		sl.req.Timeout = s.cfg.ReadTimeout
		var err error
		if g.submit == nil {
			err = g.backend.Read(r.Context(), sl.p, sl.req)
			sl.done = err == nil
		} else if err = g.submit.Submit(sl.p, sl.req); err == nil {
			sl.sent = true
			continue
		}
		s.settle(sl, err, &recycle)
	}
	for gi, g := range s.groups {
		if sl := &c.slots[gi]; sl.sent {
			sl.sent = false
			err := g.submit.Wait(r.Context(), sl.req)
			sl.done = err == nil
			s.settle(sl, err, &recycle)
		}
	}
	var remotes []string
	for gi, g := range s.groups {
		sl := &c.slots[gi]
		switch {
		case sl.done && sl.req.Items[0].Err != nil:
			sl.e = itemError(sl.req.Items[0].Err)
		case sl.e == errNotHere:
			if sl.remote, sl.e = s.ownerOn(r, g.backend, g.loc, sl.p); sl.e == nil && !contains(remotes, sl.remote) {
				remotes = append(remotes, sl.remote)
			}
		}
	}
	switch len(remotes) {
	case 0:
	case 1:
		s.forwardTxn(r, c, remotes[0])
	default:
		var wg sync.WaitGroup
		for _, base := range remotes {
			wg.Go(func() { s.forwardTxn(r, c, base) })
		}
		wg.Wait()
	}
	out := bufPool.Get().(*[]byte)
	buf := append(s.appendTxn((*out)[:0], c), '\n')
	w.Header()["Content-Type"] = jsonContentType
	_, _ = w.Write(buf)
	if cap(buf) <= 1<<20 {
		*out = buf
		bufPool.Put(out)
	}
	for gi, g := range s.groups {
		if sl := &c.slots[gi]; sl.req != nil {
			g.reqPool.Put(sl.req) // settled: no worker holds it
		}
	}
	return recycle
}

// settle records the outcome err of a slot's local read. A read given up on (a
// timeout, the caller gone) may still be held by its worker: its request is
// dropped, not pooled, and so is the body its key is a substring of (recycle).
func (s *Server) settle(sl *txnSlot, err error, recycle *bool) {
	sl.e = readError(err, sl.p)
	if err != nil && !errors.Is(err, service.ErrNotOwned) && !errors.Is(err, service.ErrBusy) && !errors.Is(err, service.ErrTooManyItems) {
		*recycle = false
		sl.req = nil
	}
}

func contains(ss []string, s string) bool {
	for _, v := range ss {
		if v == s {
			return true
		}
	}
	return false
}

// appendTxn appends the transaction call's answer: {"groups": {name: entry}}, the
// groups in definition order, then the unknown names in request order; an entry is
// {"status": 200, "features": <the group endpoint's answer>} or {"status": …,
// "error": {…}}.
func (s *Server) appendTxn(dst []byte, c *txnCall) []byte {
	dst = append(dst, `{"groups":{`...)
	first := true
	sep := func() {
		if !first {
			dst = append(dst, ',')
		}
		first = false
	}
	for gi, g := range s.groups {
		sl := &c.slots[gi]
		if !sl.asked {
			continue
		}
		sep()
		dst = appendJSONString(dst, g.name)
		dst = append(dst, ':')
		switch {
		case sl.e != nil:
			dst = appendErrorEntry(dst, sl.e)
		case sl.raw != nil:
			dst = append(dst, sl.raw...)
		default:
			dst = append(dst, `{"status":200,"features":`...)
			dst = appendFeaturesOf(dst, g.feats, g.head, &sl.req.Items[0], sl.p)
			dst = append(dst, '}')
		}
	}
	for _, name := range c.unknown {
		sep()
		dst = appendJSONString(dst, name)
		dst = append(dst, ':')
		dst = appendErrorEntry(dst, s.unknownGroup(name))
	}
	return append(dst, '}', '}')
}

func appendErrorEntry(dst []byte, e *apiError) []byte {
	dst = append(dst, `{"status":`...)
	dst = strconv.AppendInt(dst, int64(e.status), 10)
	dst = append(dst, `,"error":`...)
	dst = appendAPIError(dst, e)
	return append(dst, '}')
}

// forwardTxn asks the owner at base for the groups of c forwarded to it, one call
// for all of them, and fills their entries (each slot is written by one goroutine
// only: the one of its owner).
func (s *Server) forwardTxn(r *http.Request, c *txnCall, base string) {
	body := []byte(`{"keys":{`)
	var mine []int
	for gi, g := range s.groups {
		if sl := &c.slots[gi]; sl.e == nil && sl.remote == base {
			if len(mine) > 0 {
				body = append(body, ',')
			}
			body = appendJSONString(body, g.name)
			body = append(body, ':')
			body = appendJSONString(body, sl.key)
			mine = append(mine, gi)
		}
	}
	body = append(body, '}')
	if c.at != nil {
		body = append(append(body, `,"at":`...), c.at...)
	}
	body = append(body, '}')
	fail := func(e *apiError) {
		for _, gi := range mine {
			c.slots[gi].e = e
		}
	}
	resp, err := s.forwardRequest(r.Context(), http.MethodPost, base+"/v1/transaction/features", r.Header.Get("Authorization"), body)
	if err != nil {
		s.forwarded.WithLabelValues("failed").Inc()
		for _, gi := range mine {
			s.groups[gi].loc.Poke()
		}
		s.log.Warn("query API: cannot reach a group partition's owner", zap.String("owner", base), zap.Error(err))
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
	var got struct {
		Groups map[string]json.RawMessage `json:"groups"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16*maxBodyBytes)).Decode(&got); err != nil {
		fail(unavailable("the partition's owner gave an unreadable answer"))
		return
	}
	for _, gi := range mine {
		entry, ok := got.Groups[s.groups[gi].name]
		var st struct {
			Status int `json:"status"`
		}
		if !ok || json.Unmarshal(entry, &st) != nil || st.Status < 100 || st.Status > 599 {
			c.slots[gi].e = unavailable("the partition's owner gave an unreadable answer")
			continue
		}
		c.slots[gi].raw = entry
	}
}

// parseTxnFast decodes the common form of a transaction body into c: an object of
// "keys" (an object of names to plain strings or null; at most maxTxnKeys, no name
// twice) and an optional "at" (an integer or a plain string), each at most once.
// ok=false means "not decided here", never "invalid": parseTxnStrict decides. What
// it accepts it decodes as parseTxnStrict does (FuzzTxnBody checks the two agree).
func parseTxnFast(body string, c *txnCall) bool {
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return false
	}
	i = skipSpace(body, i+1)
	var seenKeys, seenAt bool
	for {
		key, j, ok := plainString(body, i)
		if !ok {
			return false
		}
		if i = skipSpace(body, j); i == len(body) || body[i] != ':' {
			return false
		}
		i = skipSpace(body, i+1)
		switch {
		case key == "keys" && !seenKeys:
			seenKeys = true
			if j, ok = parseKeysFast(body, i, c); !ok {
				return false
			}
		case key == "at" && !seenAt:
			seenAt = true
			if j, ok = plainTime(body, i); !ok {
				return false
			}
			c.at = unsafe.Slice(unsafe.StringData(body[i:j]), j-i) // read only
		default:
			return false
		}
		i = skipSpace(body, j)
		if i == len(body) {
			return false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
			continue
		case '}':
			return seenKeys && skipSpace(body, i+1) == len(body)
		}
		return false
	}
}

// parseKeysFast reads the keys object at i (see parseTxnFast).
func parseKeysFast(s string, i int, c *txnCall) (next int, ok bool) {
	if i == len(s) || s[i] != '{' {
		return i, false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return i + 1, true
	}
	for {
		name, j, ok := plainString(s, i)
		if !ok || c.nkeys == maxTxnKeys {
			return i, false
		}
		for _, k := range c.keys[:c.nkeys] {
			if k.name == name {
				return i, false
			}
		}
		if i = skipSpace(s, j); i == len(s) || s[i] != ':' {
			return i, false
		}
		i = skipSpace(s, i+1)
		k := txnKey{name: name}
		if strings.HasPrefix(s[i:], "null") {
			k.none, j = true, i+4
		} else if k.key, j, ok = plainString(s, i); !ok {
			return i, false
		}
		k.none = k.none || k.key == ""
		c.keys[c.nkeys] = k
		c.nkeys++
		if i = skipSpace(s, j); i == len(s) {
			return i, false
		}
		switch s[i] {
		case ',':
			i = skipSpace(s, i+1)
			continue
		case '}':
			return i + 1, true
		}
		return i, false
	}
}

// parseTxnStrict decodes a transaction body into c with encoding/json, refusing
// (400) what is not the documented object: unknown fields, a field or a name given
// twice, keys missing or not an object of strings and nulls, more than maxTxnKeys
// names, trailing data.
func parseTxnStrict(body []byte, c *txnCall) *apiError {
	bad := func(format string, args ...any) *apiError {
		return errf(http.StatusBadRequest, "invalid_body", "the body is not the JSON object this endpoint takes: "+format, args...)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		if err != nil {
			return bad("%s", jsonErr(err))
		}
		return bad("not an object")
	}
	var seenKeys, seenAt bool
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad("%s", jsonErr(err))
		}
		switch field, _ := tok.(string); {
		case field == "keys" && !seenKeys:
			seenKeys = true
			if e := parseKeysStrict(dec, c, bad); e != nil {
				return e
			}
		case field == "at" && !seenAt:
			seenAt = true
			var at json.RawMessage
			if err := dec.Decode(&at); err != nil {
				return bad("%s", jsonErr(err))
			}
			c.at = at
		case field == "keys" || field == "at":
			return bad("%s given twice", field)
		default:
			return bad("unknown field %s", truncate(field, 40))
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return bad("%s", jsonErr(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("data after the JSON object")
	}
	if !seenKeys {
		return errf(http.StatusBadRequest, "invalid_body", "keys is required: an object of group names to keys")
	}
	return nil
}

func parseKeysStrict(dec *json.Decoder, c *txnCall, bad func(string, ...any) *apiError) *apiError {
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return bad("keys must be an object of group names to keys")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad("%s", jsonErr(err))
		}
		name, _ := tok.(string)
		for _, k := range c.keys[:c.nkeys] {
			if k.name == name {
				return bad("group %q named twice in keys", truncate(name, 40))
			}
		}
		if c.nkeys == maxTxnKeys {
			return errf(http.StatusBadRequest, "too_many_keys", "at most %d names in keys", maxTxnKeys)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return bad("%s", jsonErr(err))
		}
		k := txnKey{name: name}
		if isNull(v) {
			k.none = true
		} else if json.Unmarshal(v, &k.key) != nil {
			return bad("the key of group %q must be a string or null", truncate(name, 40))
		}
		k.none = k.none || k.key == ""
		c.keys[c.nkeys] = k
		c.nkeys++
	}
	if _, err := dec.Token(); err != nil {
		return bad("%s", jsonErr(err))
	}
	return nil
}
