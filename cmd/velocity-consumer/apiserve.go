package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/pkg/api"
	"github.com/velocity-consumer/velocity-consumer/pkg/service"
)

// apiFlags are the query API's flags (issue 23, docs/api.md).
type apiFlags struct {
	addr      string
	advertise string
	tokenFile string
	tlsCert   string
	tlsKey    string
	peerCA    string
}

func (a *apiFlags) register(e *envFlags, defAddr string) {
	e.String(&a.addr, "api-addr", defAddr, "listen address of the query API (GET /v1/entities/{id}/velocity ...; see docs/api.md), e.g. :8081; empty disables it.\nA listener of its own, apart from --metrics-addr, because it carries entity data")
	e.String(&a.advertise, "api-advertise", "", "the URL other instances reach this one's query API at, advertised through the consumer group (this client's Kafka client id); default http(s)://<hostname>:<port of --api-addr>, or the listen host when it is not a wildcard")
	e.String(&a.tokenFile, "api-token-file", "", "file holding a bearer token the query API requires (Authorization: Bearer <token>); every instance of a group needs the same one, since requests are forwarded with the caller's token")
	e.String(&a.tlsCert, "api-tls-cert", "", "PEM certificate for HTTPS on --api-addr (with --api-tls-key)")
	e.String(&a.tlsKey, "api-tls-key", "", "PEM private key of --api-tls-cert")
	e.String(&a.peerCA, "api-peer-ca", "", "PEM CA bundle that other instances' API certificates are checked against when forwarding over HTTPS (default: the system roots)")
}

// apiSetup is the validated form of apiFlags.
type apiSetup struct {
	on        bool
	scheme    string // http or https
	host      string // of --api-addr
	advertise string
	token     string
	tls       *tls.Config
	peers     *http.Client
}

func (a *apiFlags) setup() (apiSetup, error) {
	var s apiSetup
	if a.addr == "" {
		for flag, v := range map[string]string{"api-advertise": a.advertise, "api-token-file": a.tokenFile, "api-tls-cert": a.tlsCert, "api-tls-key": a.tlsKey, "api-peer-ca": a.peerCA} {
			if v != "" {
				return s, fmt.Errorf("--%s (%s) needs --api-addr (VELOCITY_API_ADDR): the query API is off", flag, envName(flag))
			}
		}
		return s, nil
	}
	s.on = true
	host, _, err := net.SplitHostPort(a.addr)
	if err != nil {
		return s, fmt.Errorf("--api-addr (VELOCITY_API_ADDR) %q: want host:port or :port (%v)", a.addr, err)
	}
	if a.tokenFile != "" {
		b, err := os.ReadFile(a.tokenFile)
		if err != nil {
			return s, fmt.Errorf("--api-token-file (VELOCITY_API_TOKEN_FILE): %w", err)
		}
		if s.token = strings.TrimSpace(string(b)); s.token == "" {
			return s, fmt.Errorf("--api-token-file (VELOCITY_API_TOKEN_FILE) %s is empty", a.tokenFile)
		}
	}
	if (a.tlsCert == "") != (a.tlsKey == "") {
		return s, errors.New("--api-tls-cert and --api-tls-key (VELOCITY_API_TLS_CERT, VELOCITY_API_TLS_KEY) go together")
	}
	scheme := "http"
	if a.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(a.tlsCert, a.tlsKey)
		if err != nil {
			return s, fmt.Errorf("--api-tls-cert/--api-tls-key: %w", err)
		}
		s.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		scheme = "https"
	}
	peerTLS := &tls.Config{MinVersion: tls.VersionTLS12}
	if a.peerCA != "" {
		pem, err := os.ReadFile(a.peerCA)
		if err != nil {
			return s, fmt.Errorf("--api-peer-ca (VELOCITY_API_PEER_CA): %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return s, fmt.Errorf("--api-peer-ca (VELOCITY_API_PEER_CA) %s holds no PEM certificate", a.peerCA)
		}
		peerTLS.RootCAs = pool
	}
	s.peers = &http.Client{Transport: &http.Transport{
		TLSClientConfig: peerTLS, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute, ForceAttemptHTTP2: true,
	}}
	s.advertise, s.scheme, s.host = a.advertise, scheme, host
	if s.advertise != "" {
		if err := s.checkAdvertise(); err != nil {
			return s, err
		}
	}
	return s, nil
}

// listen opens the API's listener on addr and, unless --api-advertise gave it,
// derives the advertised URL from the port it got (so :0 works, as in the demo).
func (s *apiSetup) listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--api-addr (VELOCITY_API_ADDR) %s: %w", addr, err)
	}
	if s.advertise == "" {
		host := s.host
		if host == "" || host == "0.0.0.0" || host == "::" {
			if host, err = os.Hostname(); err != nil {
				ln.Close()
				return nil, fmt.Errorf("--api-advertise: cannot derive it (%v); set it", err)
			}
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		s.advertise = s.scheme + "://" + net.JoinHostPort(host, port)
		if err := s.checkAdvertise(); err != nil {
			ln.Close()
			return nil, err
		}
	}
	if s.tls != nil {
		ln = tls.NewListener(ln, s.tls)
	}
	return ln, nil
}

func (s *apiSetup) checkAdvertise() error {
	u, err := url.Parse(s.advertise)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return fmt.Errorf("--api-advertise (VELOCITY_API_ADVERTISE) %q: want http(s)://host:port", s.advertise)
	}
	s.advertise = strings.TrimSuffix(s.advertise, "/")
	return nil
}

// clientOpt makes the service's Kafka clients advertise the API address: the
// consumer's client id is what the other members read from DescribeGroups.
func (s apiSetup) clientOpt() []kgo.Opt {
	if !s.on {
		return nil
	}
	return []kgo.Opt{kgo.ClientID(api.ClientID(s.advertise))}
}

// serveAPI serves the query API on ln (from listen) until stop is called. svcs are
// the process's services: [0] the input's, whose features are the in-place group
// named inPlace ("" under no definition, or the default name), then one per
// re-keyed group (Config.Merge names it); each group's partitions are located in
// its own consumer group, over its own input topic (the group's repartition
// topic).
func serveAPI(ctx context.Context, ln net.Listener, s apiSetup, svcs []*service.Service, inPlace string, reg prometheus.Registerer, log *zap.Logger) (stop func(), err error) {
	var routers []*api.Router
	for _, svc := range svcs {
		cfg := svc.Config()
		router, err := api.NewRouter(cfg.Brokers, cfg.ClientOpts, cfg.Group, cfg.InputTopic)
		if err != nil {
			ln.Close()
			return nil, err
		}
		routers = append(routers, router)
	}
	acfg := api.Config{Backend: svcs[0], Locator: routers[0], Token: s.token, Peers: s.peers, Registerer: reg, Log: log, Group: inPlace}
	for i, svc := range svcs[1:] {
		acfg.Groups = append(acfg.Groups, api.Group{Name: svc.Config().Merge.Name, Backend: svc, Locator: routers[i+1]})
	}
	srv, err := api.New(acfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	rctx, rcancel := context.WithCancel(ctx)
	var routing sync.WaitGroup
	for _, router := range routers {
		routing.Go(func() { router.Run(rctx) })
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 15 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("query API server stopped", zap.Error(err))
		}
	}()
	log.Info("serving the query API", zap.String("addr", ln.Addr().String()), zap.String("advertised", s.advertise),
		zap.Bool("tls", s.tls != nil), zap.Bool("token", s.token != ""))
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		rcancel()
		routing.Wait()
	}, nil
}
