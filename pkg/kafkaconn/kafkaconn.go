// Package kafkaconn turns the settings for reaching a production Kafka cluster
// (TLS and SASL) into franz-go client options, and the same TLS settings into a
// *tls.Config for other clients of the deployment such as the schema registry.
//
// It is the one place where connection secrets are handled. Passwords are read
// from files or from the environment by the caller and kept in a Secret, whose
// String and GoString print a placeholder, so that a Config logged by mistake,
// an error message or a %v never carries the password. Errors name the flag a
// user has to change (--tls-ca-file, --sasl-mechanism, ...).
//
// It is not for choosing brokers, topics or client tuning: callers add their
// own options beside the ones Options returns.
package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Secret is a password that does not print itself. Reveal returns the value.
type Secret struct{ v string }

// NewSecret wraps s.
func NewSecret(s string) Secret { return Secret{v: s} }

// Reveal returns the secret; call it only where the value is handed to a client.
func (s Secret) Reveal() string { return s.v }

// IsZero reports whether no secret was given.
func (s Secret) IsZero() bool { return s.v == "" }

// String prints a placeholder, never the value.
func (s Secret) String() string {
	if s.v == "" {
		return ""
	}
	return "[redacted]"
}

// GoString prints a placeholder for %#v, never the value.
func (s Secret) GoString() string { return s.String() }

// ReadSecretFile reads a password from path, without the trailing newline that
// editors and `echo` leave. flag names the setting for the error message.
func ReadSecretFile(flag, path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		// The *PathError names the file, not its content.
		return Secret{}, fmt.Errorf("%s: %w", flag, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return Secret{}, fmt.Errorf("%s: %s is empty", flag, path)
	}
	return Secret{v: s}, nil
}

// TLS is the TLS side of a connection. The zero value means no TLS.
type TLS struct {
	// Enabled turns TLS on; setting any file below implies it.
	Enabled bool
	// CAFile is a PEM bundle of the CAs to trust instead of the system pool.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and key (mutual TLS);
	// both or neither.
	CertFile, KeyFile string
	// ServerName overrides the name the server's certificate must carry;
	// default: the host of the address dialled.
	ServerName string
	// InsecureSkipVerify accepts any server certificate. For tests only: it
	// leaves the connection open to an active attacker.
	InsecureSkipVerify bool
}

// On reports whether TLS is requested, explicitly or by a file setting.
func (t TLS) On() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify
}

// Config builds the *tls.Config, or nil when TLS is off. TLS 1.2 is the
// minimum: older versions are broken and no current broker needs them.
func (t TLS) Config() (*tls.Config, error) {
	if !t.On() {
		return nil, nil
	}
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, documented as test-only
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca-file %s: no PEM certificate in it", t.CAFile)
		}
		c.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert-file %s / --tls-key-file %s: %w", t.CertFile, t.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case t.CertFile != "":
		return nil, errors.New("--tls-cert-file needs --tls-key-file (the client certificate's private key)")
	case t.KeyFile != "":
		return nil, errors.New("--tls-key-file needs --tls-cert-file (the client certificate)")
	}
	return c, nil
}

// SASL mechanisms Options accepts, spelled as Kafka spells them.
const (
	MechanismPlain       = "PLAIN"
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
)

// SASL is the authentication side. The zero value means no SASL.
type SASL struct {
	Mechanism string // PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (case-insensitive); "" = none
	Username  string
	Password  Secret
}

// Mechanism builds the franz-go mechanism, or nil when SASL is off.
func (s SASL) mechanism() (sasl.Mechanism, error) {
	mech := strings.ToUpper(strings.TrimSpace(s.Mechanism))
	if mech == "" {
		if s.Username != "" || !s.Password.IsZero() {
			return nil, errors.New("--sasl-username or a SASL password is set but --sasl-mechanism is not: give PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
		}
		return nil, nil
	}
	if s.Username == "" {
		return nil, fmt.Errorf("--sasl-mechanism %s needs --sasl-username", mech)
	}
	if s.Password.IsZero() {
		return nil, fmt.Errorf("--sasl-mechanism %s needs a password: --sasl-password-file or VELOCITY_SASL_PASSWORD", mech)
	}
	user, pass := s.Username, s.Password.Reveal()
	switch mech {
	case MechanismPlain:
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	case MechanismScramSHA256:
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case MechanismScramSHA512:
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("--sasl-mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
}

// Config is everything needed to reach the cluster beyond its addresses.
type Config struct {
	TLS  TLS
	SASL SASL
}

// Options returns the franz-go options for c: a TLS dialer and a SASL
// mechanism, each only if configured. The result is empty for a PLAINTEXT
// cluster. SASL without TLS is allowed (SASL_PLAINTEXT on a private network)
// but sends PLAIN passwords in the clear; Warnings says so.
func (c Config) Options() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	tc, err := c.TLS.Config()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	mech, err := c.SASL.mechanism()
	if err != nil {
		return nil, err
	}
	if mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, nil
}

// Warnings lists settings that work but weaken the connection, for the
// startup log.
func (c Config) Warnings() []string {
	var w []string
	if c.TLS.InsecureSkipVerify {
		w = append(w, "--tls-insecure-skip-verify: the brokers' certificates are not checked; use it only in tests")
	}
	if !c.TLS.On() && strings.EqualFold(strings.TrimSpace(c.SASL.Mechanism), MechanismPlain) {
		w = append(w, "--sasl-mechanism PLAIN without --tls sends the password in the clear")
	}
	return w
}

// Summary describes c for a startup log line: the security protocol, the
// mechanism and the user, never a password.
func (c Config) Summary() string {
	proto := "PLAINTEXT"
	switch {
	case c.TLS.On() && c.SASL.Mechanism != "":
		proto = "SASL_SSL"
	case c.TLS.On():
		proto = "SSL"
	case c.SASL.Mechanism != "":
		proto = "SASL_PLAINTEXT"
	}
	if c.SASL.Mechanism != "" {
		return fmt.Sprintf("%s (%s as %q)", proto, strings.ToUpper(c.SASL.Mechanism), c.SASL.Username)
	}
	return proto
}

// Check dials the cluster once with opts and reports an error that says what
// to fix: an authentication failure names the credentials, a TLS failure the
// CA or server name. Callers use it at start so a misconfiguration fails fast
// instead of retrying forever inside the client.
func Check(ctx context.Context, opts []kgo.Opt) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return Explain(err)
	}
	return nil
}

// Explain adds a hint naming the flags to an error from reaching the brokers.
func Explain(err error) error {
	if err == nil {
		return nil
	}
	var (
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		certErr     *tls.CertificateVerificationError
	)
	msg := err.Error()
	switch {
	case errors.As(err, &unknownAuth) || errors.As(err, &certErr) && errors.As(certErr.Err, &unknownAuth):
		return fmt.Errorf("%w (the brokers' certificate is not signed by a trusted CA: check --tls-ca-file)", err)
	case errors.As(err, &hostErr):
		return fmt.Errorf("%w (the brokers' certificate does not name the host dialled: check --brokers or --tls-server-name)", err)
	case strings.Contains(msg, "SASL_AUTHENTICATION_FAILED") || strings.Contains(msg, "Authentication failed"):
		return fmt.Errorf("%w (check --sasl-username, the password in --sasl-password-file or VELOCITY_SASL_PASSWORD, and --sasl-mechanism)", err)
	case strings.Contains(msg, "UNSUPPORTED_SASL_MECHANISM"):
		return fmt.Errorf("%w (the brokers do not enable this --sasl-mechanism)", err)
	case strings.Contains(msg, "plaintext connection speaking to a tls endpoint"):
		return fmt.Errorf("%w (the listener at --brokers speaks TLS: add --tls, and --tls-ca-file if its CA is private)", err)
	case strings.Contains(msg, "first record does not look like a TLS handshake") || strings.Contains(msg, "tls:"):
		return fmt.Errorf("%w (TLS handshake failed: does the listener at --brokers speak TLS, and does --tls match it?)", err)
	}
	return err
}
