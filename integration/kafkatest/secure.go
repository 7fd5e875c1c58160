package kafkatest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SecureBroker is a private broker with a SASL_SSL listener beside its PLAINTEXT one,
// as a managed cluster would have: TLS with a certificate from a CA made for the test,
// and SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 users. The PLAINTEXT listener
// (Addr) is for the test's own set-up, such as creating topics.
type SecureBroker struct {
	*PrivateBroker
	// SASLAddr is the SASL_SSL listener, 127.0.0.1:port; its certificate names
	// 127.0.0.1 and localhost.
	SASLAddr string
	// CAFile is the PEM certificate of the CA that signed the broker's certificate.
	CAFile string
	// OtherCAFile is a CA that signed nothing the broker has: trusting only it fails.
	OtherCAFile string
	// ScramUser/ScramPassword exist for SCRAM-SHA-256 and SCRAM-SHA-512 (created at
	// format time); PlainUser/PlainPassword for PLAIN (in the listener's JAAS config).
	ScramUser, ScramPassword string
	PlainUser, PlainPassword string
	// Authorizer is set when the broker runs KRaft's StandardAuthorizer
	// (StartSecureBroker with WithAuthorizer): see WithAuthorizer.
	Authorizer bool
}

// SecureOption changes how StartSecureBroker configures the broker.
type SecureOption func(*secureOptions)

type secureOptions struct{ authorizer bool }

// WithAuthorizer turns on KRaft's StandardAuthorizer with no ACLs and
// allow.everyone.if.no.acl.found=false: on the SASL_SSL listener a principal may do
// only what ACLs grant it, as on a managed cluster. The super user is the PLAINTEXT
// (and controller) listener's principal, User:ANONYMOUS, which the broker itself
// needs between its roles and which tests use only for set-up: topics, SCRAM users
// (AddScramUser) and ACLs, through Addr. ScramUser and PlainUser start with no ACLs.
func WithAuthorizer() SecureOption { return func(o *secureOptions) { o.authorizer = true } }

// StartSecureBroker starts a SecureBroker for t alone and stops it when t ends. The
// certificates are generated here with crypto/x509 (no keytool); the broker reads them
// as a PEM key store. It skips or fails like StartPrivateBroker.
func StartSecureBroker(t testing.TB, opts ...SecureOption) *SecureBroker {
	t.Helper()
	var o secureOptions
	for _, f := range opts {
		f(&o)
	}
	dir := t.TempDir()
	sb := &SecureBroker{
		ScramUser: "velocity-scram", ScramPassword: "scram-" + randomHex(8),
		PlainUser: "velocity-plain", PlainPassword: "plain-" + randomHex(8),
		CAFile: filepath.Join(dir, "ca.pem"), OtherCAFile: filepath.Join(dir, "other-ca.pem"),
		Authorizer: o.authorizer,
	}
	keystore := filepath.Join(dir, "broker-keystore.pem")
	if err := writeCerts(sb.CAFile, sb.OtherCAFile, keystore); err != nil {
		t.Fatalf("kafkatest: certificates: %v", err)
	}
	props := filepath.Join(dir, "sasl-ssl.properties")
	sb.PrivateBroker = startPrivateBroker(t, 1, func(ports []int, _ string) []string {
		port, cport, sport := ports[0], ports[1], ports[2]
		sb.SASLAddr = "127.0.0.1:" + strconv.Itoa(sport)
		// Later keys win in a properties file, so these replace the script's listeners.
		conf := fmt.Sprintf(`listeners=PLAINTEXT://127.0.0.1:%[1]d,CONTROLLER://127.0.0.1:%[2]d,SASL_SSL://127.0.0.1:%[3]d
advertised.listeners=PLAINTEXT://127.0.0.1:%[1]d,SASL_SSL://127.0.0.1:%[3]d
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_%[4]s="%[5]s";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PEM
ssl.keystore.location=%[6]s
`, port, cport, sport, sb.PlainUser, sb.PlainPassword, keystore)
		if o.authorizer {
			conf += `authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS
`
		}
		if err := os.WriteFile(props, []byte(conf), 0o600); err != nil {
			t.Fatalf("kafkatest: %v", err)
		}
		return []string{
			"KAFKA_EXTRA_PROPERTIES=" + props,
			"KAFKA_SCRAM_CREDENTIALS=" +
				fmt.Sprintf("SCRAM-SHA-512=[name=%s,password=%s]\nSCRAM-SHA-256=[name=%s,password=%s]",
					sb.ScramUser, sb.ScramPassword, sb.ScramUser, sb.ScramPassword),
		}
	})
	// All listeners open together, but wait for this one too rather than assume it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", sb.SASLAddr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kafkatest: SASL_SSL listener %s: %v", sb.SASLAddr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sb
}

// writeCerts writes a CA, an unrelated second CA, and a key store for the broker:
// its PKCS#8 key followed by its certificate, signed by the first CA, for 127.0.0.1
// and localhost.
func writeCerts(caFile, otherCAFile, keystore string) error {
	ca, caKey, err := newCA("velocity test CA")
	if err != nil {
		return err
	}
	other, _, err := newCA("unrelated test CA")
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	ks := append(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	for f, b := range map[string][]byte{
		caFile:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}),
		otherCAFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: other.Raw}),
		keystore:    ks,
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// AddScramUser creates a SCRAM-SHA-512 user with a random password on a running
// SecureBroker, through the super user's PLAINTEXT listener, and returns the password
// once the SASL_SSL listener accepts it (credentials reach the listener through the
// metadata log, a moment after the controller has them).
func (sb *SecureBroker) AddScramUser(t testing.TB, user string) string {
	t.Helper()
	password := "scram-" + randomHex(8)
	ctx := Context(t, 30*time.Second)
	adm := kadm.NewClient(Client(t, sb.Addr))
	res, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{
		User: user, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: password,
	}})
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("kafkatest: create SCRAM user %s: %v", user, err)
	}
	pem, err := os.ReadFile(sb.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	for {
		cl, err := kgo.NewClient(kgo.SeedBrokers(sb.SASLAddr), kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
			kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha512Mechanism()))
		if err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = cl.Ping(pctx)
		cancel()
		cl.Close()
		if err == nil {
			return password
		}
		if ctx.Err() != nil {
			t.Fatalf("kafkatest: SCRAM user %s not accepted by the SASL_SSL listener: %v", user, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
