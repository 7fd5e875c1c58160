// Package srtest serves franz-go's fake schema registry (pkg/sr/srfake) on a
// real loopback HTTP listener that a test can take down (connection refused)
// and bring back on the same address with its schemas intact: the outage the
// registry decoder must wait out. It is for tests only.
package srtest

import (
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// Server is a restartable fake registry.
type Server struct {
	Reg  *srfake.Registry
	addr string
	mu   sync.Mutex
	srv  *http.Server
}

// Start serves a new fake registry on a free loopback port until the test ends.
func Start(t testing.TB, opts ...srfake.Option) *Server {
	t.Helper()
	s := &Server{Reg: srfake.New(opts...)}
	t.Cleanup(s.Reg.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	s.serve(l)
	t.Cleanup(s.Down)
	return s
}

// URL is the registry's base URL.
func (s *Server) URL() string { return "http://" + s.addr }

func (s *Server) serve(l net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = &http.Server{Handler: s.Reg.Handler(), ReadHeaderTimeout: time.Second}
	go s.srv.Serve(l) //nolint:errcheck // ends with ErrServerClosed
}

// Down closes the listener: clients get connection refused.
func (s *Server) Down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Close()
		s.srv = nil
	}
}

// Up serves again on the same address; a no-op while serving. It reports a
// failure with t.Errorf, so it may be called from a goroutine other than the
// test's.
func (s *Server) Up(t testing.TB) {
	s.mu.Lock()
	serving := s.srv != nil
	s.mu.Unlock()
	if serving {
		return
	}
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		t.Errorf("srtest: serve the registry again on %s: %v", s.addr, err)
		return
	}
	s.serve(l)
}
