// Package registry connects velocity-consumer to a schema registry that speaks
// the Confluent REST API (franz-go pkg/sr) and handles the Confluent wire
// format: a magic byte 0, the schema id as 4 bytes big-endian, then the Avro
// binary body.
//
// On the input side, Decoder resolves each record's writer schema by id
// (cached: one registry call per id for the life of the process) and decodes
// it with a codec decoder built for that writer schema. A value without the
// prefix, or with an id the registry says does not exist, is rejected as a
// decode dead letter; a registry that cannot be reached is never a reason to
// dead-letter: Decoder implements codec.Preparer so that the service holds the
// partition and retries. On the output side, RegisterOutput registers (or
// finds) our VelocityFeatures schema under the configured subject and returns
// the 5-byte prefix every features value then starts with.
//
// It is not for Avro itself (pkg/codec) nor for Kafka clients.
package registry

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/velocity-consumer/velocity-consumer/internal/retry"
	"github.com/velocity-consumer/velocity-consumer/pkg/kafkaconn"
)

// Config is how to reach the registry.
type Config struct {
	// URLs of the registry; the client tries them in order.
	URLs []string
	// Username and Password for HTTP basic auth; both or neither.
	Username string
	Password kafkaconn.Secret
	// TLS for https URLs (nil = the system's roots). The service passes the
	// brokers' TLS settings, so one --tls-ca-file serves both.
	TLS *tls.Config
	// RequestTimeout bounds one registry call. Default 10s.
	RequestTimeout time.Duration
}

// NewClient returns a registry client for cfg.
func NewClient(cfg Config) (*sr.Client, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("--schema-registry: no URL")
	}
	for _, u := range cfg.URLs {
		pu, err := url.Parse(u)
		if err != nil {
			// url's errors quote the input, which may hold a password.
			return nil, errors.New("--schema-registry: a URL does not parse; want http://HOST:PORT or https://HOST:PORT")
		}
		if (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return nil, fmt.Errorf("--schema-registry %q: want an http:// or https:// URL", pu.Redacted())
		}
		if pu.User != nil {
			// The client would echo the URL, and so the password, in its errors.
			return nil, fmt.Errorf("--schema-registry %s: put credentials in --schema-registry-username and its password file, not in the URL", pu.Redacted())
		}
	}
	if (cfg.Username == "") != cfg.Password.IsZero() {
		return nil, errors.New("--schema-registry-username and its password (--schema-registry-password-file or VELOCITY_SCHEMA_REGISTRY_PASSWORD) go together")
	}
	timeout := cfg.RequestTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     cfg.TLS,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	opts := []sr.ClientOpt{
		sr.URLs(cfg.URLs...),
		sr.HTTPClient(&http.Client{Transport: tr, Timeout: timeout}),
		sr.UserAgent("velocity-consumer"),
	}
	if cfg.Username != "" {
		opts = append(opts, sr.BasicAuth(cfg.Username, cfg.Password.Reveal()))
	}
	return sr.NewClient(opts...)
}

// Subject naming strategies, as Confluent's serializers name them.
const (
	StrategyTopic       = "topic"        // <topic>-value
	StrategyRecord      = "record"       // <record full name>
	StrategyTopicRecord = "topic-record" // <topic>-<record full name>
)

// Subject returns the subject for the value schema of records named
// recordFullName on topic under strategy ("" means topic).
func Subject(strategy, topic, recordFullName string) (string, error) {
	switch strategy {
	case "", StrategyTopic:
		return topic + "-value", nil
	case StrategyRecord:
		return recordFullName, nil
	case StrategyTopicRecord:
		return topic + "-" + recordFullName, nil
	}
	return "", fmt.Errorf("--schema-subject-strategy %q: want topic, record or topic-record", strategy)
}

// RecordFullName returns namespace.name of an Avro record schema.
func RecordFullName(schema string) (string, error) {
	var s struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
	if err := json.Unmarshal([]byte(schema), &s); err != nil {
		return "", fmt.Errorf("parse schema: %w", err)
	}
	if s.Name == "" {
		return "", errors.New("schema has no name")
	}
	if s.Namespace == "" || strings.Contains(s.Name, ".") {
		return s.Name, nil
	}
	return s.Namespace + "." + s.Name, nil
}

// HeaderSize is the length of the wire-format prefix.
const HeaderSize = 5

// AppendHeader appends the wire-format prefix for schema id to dst.
func AppendHeader(dst []byte, id int) []byte {
	dst = append(dst, 0)
	return binary.BigEndian.AppendUint32(dst, uint32(id))
}

// RegisterOutput registers schema under subject, or finds it if the registry
// already has it (registering an identical schema is idempotent in the
// Confluent API and returns the existing id), and returns its id and the
// prefix for values written with it. A registry that refuses the schema, for
// instance as incompatible with the subject's previous version, or refuses our
// credentials, is an error the operator must resolve; it is returned at once,
// with the registry's message. A registry that cannot be reached or answers
// 5xx or 429 (restarting, overloaded) is asked again, 100 ms after the first
// failure and up to every 2 s, until ctx ends: a process that starts during a
// registry's restart waits for it instead of exiting.
func RegisterOutput(ctx context.Context, cl *sr.Client, subject, schema string) (id int, header []byte, err error) {
	var ss sr.SubjectSchema
	err = retry.Do(ctx, 2*time.Second, unavailable, func() (err error) {
		ss, err = cl.CreateSchema(ctx, subject, sr.Schema{Schema: schema, Type: sr.TypeAvro})
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("register the output schema under subject %q: %w", subject, err)
	}
	return ss.ID, AppendHeader(nil, ss.ID), nil
}

// unavailable reports whether err says the registry could not answer now (not
// reachable, 5xx, 429) rather than no: a 4xx answer (incompatible schema,
// credentials refused, bad request) is a fact a retry does not change.
func unavailable(err error) bool {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		return re.StatusCode >= 500 || re.StatusCode == http.StatusTooManyRequests
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// transient reports whether err from the registry may go away by itself: the
// registry unreachable, timing out, answering 5xx, rate-limiting, or refusing
// our credentials (an operator fixes those without the data being wrong).
// Only the registry's own "schema not found" (error code 40403) is a fact
// about the data: a bare 404 is as likely a wrong --schema-registry path,
// which must not dead-letter every record.
func transient(err error) bool {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		return re.ErrorCode != sr.ErrSchemaNotFound.Code
	}
	return true
}
