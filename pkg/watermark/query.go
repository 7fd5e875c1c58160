package watermark

// Read-only questions for the query API's preview (pkg/pipeline's Preview). Neither
// changes the stage: no dedupe slot is reserved or written, no id expires, the idle
// clock does not move, nothing is released.

// Seen reports whether Offer would now refuse an event with this id as a duplicate:
// the id was accepted within the dedupe horizon.
func (s *Stage) Seen(eventID string) bool {
	if !s.dedupe {
		return false
	}
	t0, found := s.ids.get(hashID(eventID), &s.ring)
	return found && s.live(t0)
}

// EachPending calls fn for every event waiting in the reorder buffer, in no particular
// order, until fn returns false. O(pending); fn must not keep ev.
func (s *Stage) EachPending(fn func(ev *Event) bool) {
	for i := range s.run.n {
		if !fn(&s.run.at(i).ev) {
			return
		}
	}
	for _, it := range s.heap {
		if !fn(&s.slab[it.slot]) {
			return
		}
	}
}
