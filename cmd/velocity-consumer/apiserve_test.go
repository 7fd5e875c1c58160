package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns their paths.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "velocity api test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestAPITLS: with a certificate the listener speaks HTTPS, the advertised URL says
// so, and the peers' client (trusting --api-peer-ca) reaches it.
func TestAPITLS(t *testing.T) {
	cert, key := selfSigned(t)
	a := apiFlags{addr: "127.0.0.1:0", tlsCert: cert, tlsKey: key, peerCA: cert}
	s, err := a.setup()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := s.listen(a.addr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.advertise, "https://127.0.0.1:") {
		t.Fatalf("advertised %q", s.advertise)
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	}()
	defer ln.Close()
	resp, err := s.peers.Get(s.advertise + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("got %q", b)
	}
	// Plain HTTP to it fails; an untrusting client fails.
	if resp, err := http.Get("http://" + ln.Addr().String() + "/"); err == nil && resp.StatusCode == 200 {
		t.Fatal("plain HTTP answered")
	}
	if _, err := http.Get(s.advertise + "/"); err == nil {
		t.Fatal("a client without the CA trusted the certificate")
	}
}

func TestAPIFlagErrors(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	cert, _ := selfSigned(t)
	for _, tc := range []struct {
		a    apiFlags
		want string
	}{
		{apiFlags{tokenFile: "x"}, "needs --api-addr"},
		{apiFlags{addr: "nonsense"}, "want host:port"},
		{apiFlags{addr: ":0", tokenFile: empty}, "is empty"},
		{apiFlags{addr: ":0", tokenFile: "/does/not/exist"}, "api-token-file"},
		{apiFlags{addr: ":0", tlsCert: cert}, "go together"},
		{apiFlags{addr: ":0", advertise: "ftp://x"}, "want http(s)://host:port"},
		{apiFlags{addr: ":0", peerCA: empty}, "no PEM certificate"},
	} {
		if _, err := tc.a.setup(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.a, err, tc.want)
		}
	}
	tok := filepath.Join(t.TempDir(), "tok")
	_ = os.WriteFile(tok, []byte("  s3cret \n"), 0o600)
	s, err := (&apiFlags{addr: ":0", tokenFile: tok, advertise: "http://10.0.0.5:8081/"}).setup()
	if err != nil || s.token != "s3cret" || s.advertise != "http://10.0.0.5:8081" {
		t.Fatalf("%+v %v", s, err)
	}
}
