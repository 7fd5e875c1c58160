package kafkatest

import (
	"net"
	"sync"
)

// A Link is a network path from some clients to every node of a cluster that a test
// can cut and heal, as a network partition would, without root or a firewall: each
// node has a listener of its own for the link, advertised at the address of a proxy
// in the test process that forwards to it, so a client that bootstraps through the
// link (Addr) reaches every node through the link's proxies and through nothing
// else. While the link is cut, the proxies forward nothing in either direction and
// connect nothing new: requests and their answers stall in the sockets, as on a path
// that drops every packet, until the client's own timeouts close its connections.
// Healing it lets what is still connected flow again and new connections through.
type Link struct {
	Addr    string // bootstrap list through this link
	proxies []*proxy
}

// Cut stops every byte through the link.
func (l *Link) Cut() {
	for _, p := range l.proxies {
		p.setCut(true)
	}
}

// CutNodes stops every byte through the link to the nodes of the given indexes (0 for
// the cluster's first node, whose node.id is 1), and to those only: a partial network
// partition, in which the client still reaches the other nodes. Indexes past the
// cluster's nodes are ignored.
func (l *Link) CutNodes(nodes ...int) {
	for _, i := range nodes {
		if i >= 0 && i < len(l.proxies) {
			l.proxies[i].setCut(true)
		}
	}
}

// Heal lets the link carry traffic again, to every node.
func (l *Link) Heal() {
	for _, p := range l.proxies {
		p.setCut(false)
	}
}

// proxy forwards every connection to its listen address to target, except while cut.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cut    bool
	healed chan struct{} // closed when a cut ends; replaced by each cut
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// listenProxy opens a proxy's listening socket on a free port of 127.0.0.1; it
// forwards nothing until started with serve.
func listenProxy() (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, healed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.healed)
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cut == p.cut || p.closed {
		return
	}
	p.cut = cut
	if cut {
		p.healed = make(chan struct{})
	} else {
		close(p.healed)
	}
}

// pass returns once the proxy is not cut (true), or once it is closed (false).
func (p *proxy) pass() bool {
	for {
		p.mu.Lock()
		closed, cut, h := p.closed, p.cut, p.healed
		p.mu.Unlock()
		if closed {
			return false
		}
		if !cut {
			return true
		}
		<-h // closed by Heal, or by close
	}
}

// serve forwards connections until close.
func (p *proxy) serve(target string) {
	p.target = target
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			if !p.track(c) {
				c.Close()
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.forward(c)
			}()
		}
	}()
}

// track records c so that close can end it; false once closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// forward connects client to the target once the proxy is not cut, then copies both
// ways, each chunk waiting for the proxy not to be cut, until either side closes.
func (p *proxy) forward(client net.Conn) {
	defer p.untrack(client)
	if !p.pass() {
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		server.Close()
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if !p.pass() {
					return
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return // EOF, or a side closed
			}
		}
	}
	go cp(server, client)
	go cp(client, server)
	<-done // one side is done: end both
	client.Close()
	server.Close()
	<-done
}

// close stops the proxy and every connection through it, and waits for them.
func (p *proxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	if p.cut {
		p.cut = false
		close(p.healed) // wakes the waiters, who then see closed
	}
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
