package kafkatest

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestLinkCutsAndHeals: a link's proxy forwards both ways; while cut, nothing
// crosses it, neither on a connection made before nor on one made during the
// cut; once healed, both carry what was held and new data again.
func TestLinkCutsAndHeals(t *testing.T) {
	echo := echoServer(t)
	p, err := listenProxy()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	p.serve(echo)
	l := &Link{Addr: p.addr(), proxies: []*proxy{p}}

	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", l.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	// roundTrip sends line and reports whether its echo came back within d.
	roundTrip := func(c net.Conn, r *bufio.Reader, line string, d time.Duration) bool {
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(d))
		got, err := r.ReadString('\n')
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return false
			}
			t.Fatalf("read: %v", err)
		}
		if got != line+"\n" {
			t.Fatalf("echo %q, want %q", got, line)
		}
		return true
	}
	// expect reads the echo of a line sent earlier.
	expect := func(c net.Conn, r *bufio.Reader, line string) {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if got, err := r.ReadString('\n'); err != nil || got != line+"\n" {
			t.Fatalf("after the heal: %q, %v; want %q", got, err, line)
		}
	}

	before, rb := dial()
	if !roundTrip(before, rb, "open", 5*time.Second) {
		t.Fatal("no echo through an open link")
	}
	l.Cut()
	if roundTrip(before, rb, "held", 300*time.Millisecond) {
		t.Fatal("an echo crossed a cut link on a connection made before the cut")
	}
	during, rd := dial()
	if roundTrip(during, rd, "new", 300*time.Millisecond) {
		t.Fatal("an echo crossed a cut link on a connection made during the cut")
	}
	l.Heal()
	expect(before, rb, "held")
	expect(during, rd, "new")
	if !roundTrip(before, rb, "again", 5*time.Second) {
		t.Fatal("no echo after the heal")
	}
}

// TestLinkClosedWhileCut: a test that ends during a cut closes its proxies; a
// heal (or another cut) after that does nothing, and a connection waiting on
// the cut is ended.
func TestLinkClosedWhileCut(t *testing.T) {
	p, err := listenProxy()
	if err != nil {
		t.Fatal(err)
	}
	p.serve("127.0.0.1:1") // never dialled: the link is cut before any connection
	l := &Link{Addr: p.addr(), proxies: []*proxy{p}}
	l.Cut()
	c, err := net.Dial("tcp", l.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.close()
	l.Heal()
	l.Cut()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection through a closed proxy read data")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a connection waiting on the cut was not ended when the proxy closed")
	}
}

// echoServer serves, until the test ends, connections that send every line back.
func echoServer(t *testing.T) string {
	t.Helper()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return echo.Addr().String()
}

// TestLinkCutsSomeNodes: a partial cut stops the paths to the nodes named and
// to those only; a heal opens them all again.
func TestLinkCutsSomeNodes(t *testing.T) {
	l := &Link{}
	for range 3 {
		p, err := listenProxy()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.close)
		p.serve(echoServer(t))
		l.proxies = append(l.proxies, p)
	}
	// passes reports whether a line sent to node i now comes back within d.
	passes := func(i int, d time.Duration) bool {
		c, err := net.Dial("tcp", l.proxies[i].addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(d))
		got, err := bufio.NewReader(c).ReadString('\n')
		return err == nil && got == "ping\n"
	}
	l.CutNodes(1, 7) // 7: no such node
	for i, want := range []bool{true, false, true} {
		if got := passes(i, 300*time.Millisecond); got != want {
			t.Errorf("node %d during a cut of node 1 only: passes %v, want %v", i, got, want)
		}
	}
	l.Heal()
	for i := range 3 {
		if !passes(i, 5*time.Second) {
			t.Errorf("node %d after the heal: no echo", i)
		}
	}
}
