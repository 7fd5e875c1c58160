package kafkaconn

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const secret = "s3cr3t-Pa55"

func TestOptionsValidation(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	pw := NewSecret(secret)
	tests := []struct {
		name  string
		cfg   Config
		nopts int    // options returned when valid
		err   string // substring of the error; "" = valid
	}{
		{"zero value is PLAINTEXT", Config{}, 0, ""},
		{"tls alone", Config{TLS: TLS{Enabled: true}}, 1, ""},
		{"a CA file implies TLS", Config{TLS: TLS{CAFile: notPEM}}, 0, "--tls-ca-file"},
		{"missing CA file", Config{TLS: TLS{CAFile: filepath.Join(dir, "nope.pem")}}, 0, "--tls-ca-file"},
		{"cert without key", Config{TLS: TLS{CertFile: "c.pem"}}, 0, "--tls-cert-file needs --tls-key-file"},
		{"key without cert", Config{TLS: TLS{KeyFile: "k.pem"}}, 0, "--tls-key-file needs --tls-cert-file"},
		{"SCRAM-SHA-512 over TLS", Config{TLS: TLS{Enabled: true}, SASL: SASL{Mechanism: "SCRAM-SHA-512", Username: "u", Password: pw}}, 2, ""},
		{"SCRAM-SHA-256, any case", Config{SASL: SASL{Mechanism: "scram-sha-256", Username: "u", Password: pw}}, 1, ""},
		{"PLAIN", Config{SASL: SASL{Mechanism: "PLAIN", Username: "u", Password: pw}}, 1, ""},
		{"unknown mechanism", Config{SASL: SASL{Mechanism: "GSSAPI", Username: "u", Password: pw}}, 0, "--sasl-mechanism"},
		{"mechanism without user", Config{SASL: SASL{Mechanism: "PLAIN", Password: pw}}, 0, "needs --sasl-username"},
		{"mechanism without password", Config{SASL: SASL{Mechanism: "PLAIN", Username: "u"}}, 0, "VELOCITY_SASL_PASSWORD"},
		{"credentials without mechanism", Config{SASL: SASL{Username: "u", Password: pw}}, 0, "--sasl-mechanism is not"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := tt.cfg.Options()
			if tt.err == "" {
				if err != nil || len(opts) != tt.nopts {
					t.Fatalf("Options() = %d opts, %v; want %d, nil", len(opts), err, tt.nopts)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("Options() error %v, want one containing %q", err, tt.err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error %q carries the password", err)
			}
		})
	}
}

// A Config printed any way (a log field, %+v in an error) shows no password.
func TestSecretNeverPrints(t *testing.T) {
	c := Config{SASL: SASL{Mechanism: "SCRAM-SHA-512", Username: "svc", Password: NewSecret(secret)}, TLS: TLS{Enabled: true}}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if out := fmt.Sprintf(f, c); strings.Contains(out, secret) {
			t.Errorf("%s of Config prints the password: %s", f, out)
		}
	}
	if s := c.Summary(); s != `SASL_SSL (SCRAM-SHA-512 as "svc")` {
		t.Errorf("Summary() = %q", s)
	}
	if c.SASL.Password.Reveal() != secret {
		t.Error("Reveal lost the value")
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content, want, err string
	}{
		{"trailing newline from echo is dropped", secret + "\n", secret, ""},
		{"CRLF is dropped", secret + "\r\n", secret, ""},
		{"inner spaces are kept", "a b \n", "a b ", ""},
		{"empty file", "\n", "", "is empty"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, fmt.Sprint(i))
			if err := os.WriteFile(p, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := ReadSecretFile("--sasl-password-file", p)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "--sasl-password-file") {
					t.Fatalf("error %v, want %q naming the flag", err, tt.err)
				}
				return
			}
			if err != nil || s.Reveal() != tt.want {
				t.Fatalf("got %q, %v; want %q", s.Reveal(), err, tt.want)
			}
		})
	}
	if _, err := ReadSecretFile("--sasl-password-file", filepath.Join(dir, "missing")); err == nil ||
		!strings.Contains(err.Error(), "--sasl-password-file") {
		t.Fatalf("missing file: %v", err)
	}
}

// The TLS config verifies the server's certificate and name by default; the
// error hints name the flag to change.
func TestTLSVerification(t *testing.T) {
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := srv.Listener.Addr().String() // 127.0.0.1, which the test certificate names
	tests := []struct {
		name string
		tls  TLS
		hint string // "" = handshake succeeds
	}{
		{"trusted CA, matching address", TLS{CAFile: ca}, ""},
		{"system roots do not know the test CA", TLS{Enabled: true}, "--tls-ca-file"},
		{"server name checked by default", TLS{CAFile: ca, ServerName: "kafka.other.test"}, "--tls-server-name"},
		{"name the certificate carries", TLS{CAFile: ca, ServerName: "example.com"}, ""},
		{"insecure skip verify accepts anything", TLS{InsecureSkipVerify: true, ServerName: "kafka.other.test"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.tls.Config()
			if err != nil {
				t.Fatal(err)
			}
			if c.MinVersion != tls.VersionTLS12 {
				t.Fatalf("MinVersion %x, want TLS 1.2", c.MinVersion)
			}
			conn, err := tls.Dial("tcp", addr, c)
			if tt.hint == "" {
				if err != nil {
					t.Fatalf("handshake: %v", err)
				}
				conn.Close()
				return
			}
			if err == nil {
				conn.Close()
				t.Fatal("handshake succeeded, want a verification failure")
			}
			if got := Explain(err).Error(); !strings.Contains(got, tt.hint) {
				t.Fatalf("Explain(%v) = %q, want a hint naming %s", err, got, tt.hint)
			}
		})
	}
}

func TestWarnings(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of a warning; "" = none
	}{
		{"TLS + SCRAM", Config{TLS: TLS{Enabled: true}, SASL: SASL{Mechanism: "SCRAM-SHA-512"}}, ""},
		{"PLAIN in the clear", Config{SASL: SASL{Mechanism: "PLAIN"}}, "in the clear"},
		{"skip verify", Config{TLS: TLS{InsecureSkipVerify: true}}, "not checked"},
	}
	for _, tt := range tests {
		w := strings.Join(tt.cfg.Warnings(), "; ")
		if (tt.want == "") != (w == "") || !strings.Contains(w, tt.want) {
			t.Errorf("%s: warnings %q, want %q", tt.name, w, tt.want)
		}
	}
}
