package refwm

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

// queued is an event in the sorted run, with its arrival number for tie-breaks.
type queued struct {
	ev  Event
	seq uint64
}

// before reports whether the heap entry comes before a run entry in (EventTime, Offset,
// arrival) order.
func (a *item) before(q *queued) bool {
	if a.t != q.ev.EventTime {
		return a.t < q.ev.EventTime
	}
	if a.off != q.ev.Offset {
		return a.off < q.ev.Offset
	}
	return a.seq < q.seq
}

// eventRing is the sorted run: a growable FIFO ring of events that arrived in order.
// It reuses its backing array, so steady state allocates nothing.
type eventRing struct {
	buf  []queued // len is 0 or a power of two
	head int
	n    int
}

func (r *eventRing) push(q queued) {
	if r.n == len(r.buf) {
		size := 2 * len(r.buf)
		if size == 0 {
			size = 16
		}
		buf := make([]queued, size)
		for i := 0; i < r.n; i++ {
			buf[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
		}
		r.buf, r.head = buf, 0
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = q
	r.n++
}

// presize gives an empty ring room for n events at once (see idShard.presize).
func (r *eventRing) presize(n int) {
	if r.n == 0 && n > len(r.buf) {
		r.buf, r.head = make([]queued, pow2AtLeast(n)), 0
	}
}

func (r *eventRing) front() *queued { return &r.buf[r.head] }

func (r *eventRing) back() *queued { return &r.buf[(r.head+r.n-1)&(len(r.buf)-1)] }

func (r *eventRing) at(i int) *queued { return &r.buf[(r.head+i)&(len(r.buf)-1)] }

// pop removes the front event, zeroing its slot so its strings can be collected.
func (r *eventRing) pop() Event {
	q := &r.buf[r.head]
	ev := q.ev
	*q = queued{}
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return ev
}

func (s *Stage) push(ev *Event, seq uint64) {
	var slot int32
	if n := len(s.free); n > 0 {
		slot = s.free[n-1]
		s.free = s.free[:n-1]
		s.slab[slot] = *ev
	} else {
		slot = int32(len(s.slab))
		s.slab = append(s.slab, *ev)
	}
	s.heap = append(s.heap, item{t: ev.EventTime, off: ev.Offset, seq: seq, slot: slot})
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
