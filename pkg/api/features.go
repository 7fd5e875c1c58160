package api

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
)

// A feature definition's features (docs/api.md, "Features under a definition"):
// GET /v1/entities/{entity_id}/features, served only when the Backend runs a
// definition (FeatureSource). Without one the path is unknown, as it always was: the
// server's answers are byte for byte those of a server that never heard of it.
//
// The answer names every value as the definition's output record names its field:
// "features" holds the <feature>_<window> fields, in the record's order, with null
// for a min or max over a window no matching event falls in; "exact" holds the
// <feature>_exact field of each distinct count. It is written by hand, as the
// velocity answer is (encode.go), from heads built once per definition.

// FeatureSource is implemented by a Backend that runs a feature definition
// (*service.Service does). Features nil means none: the features endpoint is off.
type FeatureSource interface {
	Features() *feature.Spec
	// Definition names the definition ("<label>@<hash>"), as the velocity.definition
	// header of its outputs does.
	Definition() string
}

// featureText is what a features answer needs of the definition, built once.
type featureText struct {
	spec *feature.Spec
	def  []byte   // `,"definition":"…"`
	vals [][]byte // per value column: `"<name>":`, the first with `,"features":{` before it
	exct [][]byte // per distinct count: `"<name>_exact":`, the first with `},"exact":{` before it
}

func newFeatureText(spec *feature.Spec, definition string) *featureText {
	ft := &featureText{spec: spec}
	ft.def = appendJSONString([]byte(`,"definition":`), definition)
	for _, c := range spec.Columns() {
		var b []byte
		switch {
		case c.Window >= 0 && len(ft.vals) == 0:
			b = []byte(`,"features":{`)
		case c.Window >= 0:
			b = []byte(`,`)
		case len(ft.exct) == 0:
			b = []byte(`,"exact":{`)
		default:
			b = []byte(`,`)
		}
		// Names are Avro names ([A-Za-z_][A-Za-z0-9_]*): nothing to escape.
		b = append(append(append(b, '"'), c.Name...), '"', ':')
		if c.Window >= 0 {
			ft.vals = append(ft.vals, b)
		} else {
			ft.exct = append(ft.exct, b)
		}
	}
	return ft
}

// appendFeatures appends the answer of a local features lookup (see the top of
// this file) for item it of partition p.
func (s *Server) appendFeatures(dst []byte, it *service.ReadItem, p int32) []byte {
	return appendFeaturesOf(dst, s.feats, nil, it, p)
}

// appendFeaturesOf is appendFeatures for the group of ft; groupHead, if not nil,
// is the answer's first field (featGroup.head: `"group":"<name>",`).
func appendFeaturesOf(dst []byte, ft *featureText, groupHead []byte, it *service.ReadItem, p int32) []byte {
	dst = append(dst, '{')
	dst = append(dst, groupHead...)
	dst = append(dst, `"entity_id":`...)
	dst = appendJSONString(dst, it.Entity)
	dst = append(dst, `,"known":`...)
	dst = strconv.AppendBool(dst, it.Info.Known)
	dst = appendField(dst, "partition", int64(p))
	dst = appendField(dst, "as_of", it.Info.AsOf)
	dst = append(dst, `,"as_of_time":"`...)
	dst = time.UnixMilli(it.Info.AsOf).UTC().AppendFormat(dst, time.RFC3339Nano) // nothing in it to escape
	dst = append(dst, '"')
	dst = appendField(dst, "last_offset", it.Info.LastOffset)
	dst = appendField(dst, "pending", int64(it.Info.Pending))
	dst = append(dst, `,"at_range":{"from":`...)
	dst = strconv.AppendInt(dst, it.Info.From, 10)
	dst = appendField(dst, "to", it.Info.To)
	dst = append(dst, '}')
	dst = append(dst, ft.def...)
	row := it.Row
	for c, head := range ft.vals {
		dst = append(dst, head...)
		if row.Null[c] {
			dst = append(dst, "null"...)
		} else {
			dst = strconv.AppendInt(dst, row.Values[c], 10)
		}
	}
	dst = append(dst, '}') // a definition has a feature, and a feature a window: vals is not empty
	if len(ft.exct) == 0 {
		dst = append(dst, `,"exact":{`...)
	}
	for d, head := range ft.exct {
		dst = append(dst, head...)
		dst = strconv.AppendBool(dst, row.Exact[d])
	}
	return append(dst, '}', '}')
}

// features serves GET /v1/entities/{entity_id}/features (g the in-place group,
// withGroup false) and GET /v1/groups/{group}/entities/{key}/features (withGroup:
// the answer names the group): the entity's features at as_of in group g, read and
// routed exactly as a velocity lookup is, in g's service and consumer group.
func (s *Server) features(w http.ResponseWriter, r *http.Request, g *featGroup, escID string, withGroup bool) {
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
	p, e := partitionOn(g.loc, id)
	if e != nil {
		writeError(w, e)
		return
	}
	// As in velocity: back to the pool only once answered.
	req := g.getReq()
	item.Row = req.Items[0].Row
	req.Items[0] = item
	switch e := s.readOn(r.Context(), g.backend, p, req); {
	case e == errNotHere:
		base, e := s.ownerOn(r, g.backend, g.loc, p)
		if e != nil {
			writeError(w, e)
			return
		}
		s.forwardOn(w, r, g.loc, base, nil)
	case e != nil:
		writeError(w, e)
	case req.Items[0].Err != nil:
		writeError(w, itemError(req.Items[0].Err))
	default:
		var head []byte
		if withGroup {
			head = g.head
		}
		bp := bufPool.Get().(*[]byte)
		b := append(appendFeaturesOf((*bp)[:0], g.feats, head, &req.Items[0], p), '\n')
		w.Header()["Content-Type"] = jsonContentType
		_, _ = w.Write(b)
		*bp = b
		bufPool.Put(bp)
		g.reqPool.Put(req)
	}
}
