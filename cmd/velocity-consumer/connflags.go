package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/kafkaconn"
	"github.com/velocity-consumer/velocity-consumer/pkg/registry"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// The two passwords that may come from the environment. They are not flags:
// a password on the command line shows in ps and in shell history, so the
// flags name a file and the variable is the alternative for secret stores
// that inject environment variables.
const (
	envSASLPassword     = "VELOCITY_SASL_PASSWORD"
	envRegistryPassword = "VELOCITY_SCHEMA_REGISTRY_PASSWORD"
)

// connFlags are the connection flags shared by run and replay: TLS and SASL to
// the brokers, and the schema registry.
type connFlags struct {
	tls                   kafkaconn.TLS
	saslMechanism         string
	saslUser, saslPwdFile string

	registryURL, registryUser, registryPwdFile string
	subjectStrategy                            string

	compression, hopCompression string
}

func (c *connFlags) register(e *envFlags) {
	e.Bool(&c.tls.Enabled, "tls", false, "connect to the brokers over TLS (implied by any --tls-* flag)")
	e.String(&c.tls.CAFile, "tls-ca-file", "", "PEM file of the CA certificates to trust for the brokers and the schema registry (default: the system's)")
	e.String(&c.tls.CertFile, "tls-cert-file", "", "PEM client certificate, for brokers that require mutual TLS (with --tls-key-file)")
	e.String(&c.tls.KeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	e.String(&c.tls.ServerName, "tls-server-name", "", "name the brokers' certificates must carry, if not the host in --brokers")
	e.Bool(&c.tls.InsecureSkipVerify, "tls-insecure-skip-verify", false, "do not verify the brokers' certificates (tests only: anyone on the path can read and alter the traffic)")
	e.String(&c.saslMechanism, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: no SASL)")
	e.String(&c.saslUser, "sasl-username", "", "SASL user name")
	e.String(&c.saslPwdFile, "sasl-password-file", "", "file holding the SASL password (or set "+envSASLPassword+"; there is no password flag, so it never shows in ps)")
	e.String(&c.registryURL, "schema-registry", "", "schema registry URL(s), comma-separated (Confluent API): input values are read in the Confluent wire format\nand features are written in it under a registered schema (empty: plain Avro both ways)")
	e.String(&c.registryUser, "schema-registry-username", "", "schema registry basic-auth user")
	e.String(&c.registryPwdFile, "schema-registry-password-file", "", "file holding the schema registry password (or set "+envRegistryPassword+")")
	e.String(&c.compression, "compression", "lz4", "compression of the batches this process produces: lz4, zstd, snappy, gzip or none (none saves CPU when the broker is on the same host)")
	e.String(&c.hopCompression, "hop-compression", "none", "compression of the batches of hop records a re-keyed group's first stage produces (docs/repartition.md): the\nsame choices; none by default, as only this deployment reads them and compressing them cost 14-18 % of the CPU")
	e.String(&c.subjectStrategy, "schema-subject-strategy", registry.StrategyTopic, "subject of the output schema: topic (<output-topic>-value), record (io.velocity.v1.VelocityFeatures) or topic-record (<output-topic>-io.velocity.v1.VelocityFeatures)")
}

// password reads a secret from file, or else from the environment variable;
// both at once is an error, as the user cannot tell which one wins.
func password(fileFlag, file, env string) (kafkaconn.Secret, error) {
	v, inEnv := os.LookupEnv(env)
	switch {
	case file != "" && inEnv && v != "":
		return kafkaconn.Secret{}, fmt.Errorf("%s and %s are both set: give the password one way", fileFlag, env)
	case file != "":
		return kafkaconn.ReadSecretFile(fileFlag, file)
	}
	return kafkaconn.NewSecret(v), nil
}

// kafka validates the TLS and SASL flags.
func (c *connFlags) kafka() (kafkaconn.Config, error) {
	pwd, err := password("--sasl-password-file", c.saslPwdFile, envSASLPassword)
	if err != nil {
		return kafkaconn.Config{}, err
	}
	k := kafkaconn.Config{TLS: c.tls, SASL: kafkaconn.SASL{Mechanism: c.saslMechanism, Username: c.saslUser, Password: pwd}}
	if _, err := k.Options(); err != nil {
		return kafkaconn.Config{}, err
	}
	if _, err := c.compressor(); err != nil {
		return kafkaconn.Config{}, err
	}
	return k, nil
}

// options are the options of every Kafka client: the connection's, then the
// producers' compression.
func (c *connFlags) options(k kafkaconn.Config) ([]kgo.Opt, error) {
	opts, err := k.Options()
	if err != nil {
		return nil, err
	}
	comp, err := c.compressor()
	if err != nil {
		return nil, err
	}
	return append(opts, comp), nil
}

// compressor is the producers' compression option: --compression for features
// and dead letters, --hop-compression for hop records.
func (c *connFlags) compressor() (kgo.Opt, error) {
	if _, err := sink.Compression(c.compression); err != nil {
		return nil, fmt.Errorf("--compression (VELOCITY_COMPRESSION): %w", err)
	}
	if _, err := sink.Compression(c.hopCompression); err != nil {
		return nil, fmt.Errorf("--hop-compression (VELOCITY_HOP_COMPRESSION): %w", err)
	}
	return sink.Compressor(c.compression, c.hopCompression)
}

// validate checks the connection flags without logging anything, for a
// command that turns out not to connect.
func (c *connFlags) validate() error {
	k, err := c.kafka()
	if err != nil {
		return err
	}
	_, err = c.options(k)
	return err
}

// clientOpts returns the franz-go options for the flags and logs the
// connection's shape once (protocol, mechanism, user; never a password).
func (c *connFlags) clientOpts(log *zap.Logger) ([]kgo.Opt, kafkaconn.Config, error) {
	k, err := c.kafka()
	if err != nil {
		return nil, k, err
	}
	opts, err := c.options(k)
	if err != nil {
		return nil, k, err
	}
	log.Info("kafka connection", zap.String("security", k.Summary()), zap.String("tls_ca_file", k.TLS.CAFile))
	for _, w := range k.Warnings() {
		log.Warn(w)
	}
	return opts, k, nil
}

// registryClient returns the registry client, or nil without --schema-registry.
// The brokers' TLS settings (the CA file, a client certificate) apply to an
// https registry too, except the brokers' --tls-server-name.
func (c *connFlags) registryClient(k kafkaconn.Config) (*sr.Client, error) {
	if c.registryURL == "" {
		if c.registryUser != "" || c.registryPwdFile != "" {
			return nil, errors.New("--schema-registry-username and --schema-registry-password-file need --schema-registry")
		}
		return nil, nil
	}
	pwd, err := password("--schema-registry-password-file", c.registryPwdFile, envRegistryPassword)
	if err != nil {
		return nil, err
	}
	t := k.TLS
	t.ServerName = ""
	tc, err := t.Config()
	if err != nil {
		return nil, err
	}
	return registry.NewClient(registry.Config{URLs: splitList(c.registryURL), Username: c.registryUser, Password: pwd, TLS: tc})
}

// outputSubject is the subject the features schema (schema: ours, or a
// definition's generated one) is registered under.
func (c *connFlags) outputSubject(outputTopic, schema string) (string, error) {
	name, err := registry.RecordFullName(schema)
	if err != nil {
		return "", err
	}
	return registry.Subject(c.subjectStrategy, outputTopic, name)
}

// setupRegistry registers (or finds) the output schema and returns the input
// decoder and the features prefix. The decoder's waits end with ctx.
// schema is the output schema (ours, or a definition's generated one); compile
// builds the decoder of each writer schema the records name (nil: our codec).
func setupRegistry(ctx context.Context, cl *sr.Client, subject, schema string, compile registry.Compile, limits codec.Limits, log *zap.Logger) (*registry.Decoder, []byte, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	id, prefix, err := registry.RegisterOutput(rctx, cl, subject, schema)
	if err != nil {
		return nil, nil, fmt.Errorf("--schema-registry: %w (is the registry up, and do the URL and credentials match?)", err)
	}
	log.Info("schema registry", zap.String("output_subject", subject), zap.Int("output_schema_id", id))
	if compile == nil {
		return registry.NewDecoder(ctx, cl, limits), prefix, nil
	}
	return registry.NewDecoderWith(ctx, cl, limits, compile), prefix, nil
}
