package watermark

// item is one heap entry. The event itself stays put in the slab: sifting moves 32-byte
// keys instead of whole events, which keeps a 100 000-event heap cache-friendlier.
type item struct {
	t    int64
	off  int64
	seq  uint64
	slot int32
}

func (a *item) less(b *item) bool {
	if a.t != b.t {
		return a.t < b.t
	}
	if a.off != b.off {
		return a.off < b.off
	}
	return a.seq < b.seq
}

// before reports whether the heap entry comes strictly before a staged event in
// (EventTime, Offset) order; on a tie the staged event, which arrived first, wins.
func (a *item) before(ev *Event) bool {
	return a.t < ev.EventTime || a.t == ev.EventTime && a.off < ev.Offset
}

func (s *Stage) push(ev *Event) {
	var slot int32
	if n := len(s.free); n > 0 {
		slot = s.free[n-1]
		s.free = s.free[:n-1]
		s.slab[slot] = *ev
	} else {
		slot = int32(len(s.slab))
		s.slab = append(s.slab, *ev)
	}
	s.heap = append(s.heap, item{t: ev.EventTime, off: ev.Offset, seq: s.seq, slot: slot})
	s.seq++
	s.up(len(s.heap) - 1)
}

func (s *Stage) pop() Event {
	h := s.heap
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	s.heap = h[:n]
	if n > 1 {
		s.down(0)
	}
	ev := s.slab[top.slot]
	s.slab[top.slot] = Event{}
	s.free = append(s.free, top.slot)
	if n == 0 {
		// Empty buffer: start the slab over so it does not fragment forever.
		s.slab = s.slab[:0]
		s.free = s.free[:0]
	}
	return ev
}

func (s *Stage) up(j int) {
	h := s.heap
	x := h[j]
	for j > 0 {
		i := (j - 1) / 2
		if !x.less(&h[i]) {
			break
		}
		h[j] = h[i]
		j = i
	}
	h[j] = x
}

func (s *Stage) down(i int) {
	h := s.heap
	n := len(h)
	x := h[i]
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if r := j + 1; r < n && h[r].less(&h[j]) {
			j = r
		}
		if !h[j].less(&x) {
			break
		}
		h[i] = h[j]
		i = j
	}
	h[i] = x
}
