package kafkatest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

func image() string {
	if v := os.Getenv("KAFKA_IMAGE"); v != "" {
		return v
	}
	return DefaultImage
}

// dockerAnswers reports whether a Docker engine answers within dockerProbe. It first looks
// for any sign of an engine (DOCKER_HOST, a testcontainers override, a socket in a usual
// place) so that hosts without Docker pay nothing, then asks testcontainers' provider for
// its health with a deadline, because a half-configured engine can otherwise block.
func dockerAnswers() (bool, string) {
	if !dockerHinted() {
		return false, "no Docker engine (no DOCKER_HOST, no docker.sock)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), dockerProbe)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("testcontainers panicked: %v", r)
			}
		}()
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			done <- err
			return
		}
		done <- p.Health(ctx) // Health closes the provider
	}()
	select {
	case err := <-done:
		if err != nil {
			// testcontainers' errors span lines; the skip message is one.
			return false, "Docker engine does not answer: " + strings.Join(strings.Fields(err.Error()), " ")
		}
		return true, ""
	case <-ctx.Done():
		return false, fmt.Sprintf("Docker engine did not answer within %v", dockerProbe)
	}
}

func dockerHinted() bool {
	for _, v := range []string{"DOCKER_HOST", "TESTCONTAINERS_DOCKER_SOCKET_OVERRIDE", "TESTCONTAINERS_HOST_OVERRIDE"} {
		if os.Getenv(v) != "" {
			return true
		}
	}
	home, _ := os.UserHomeDir()
	socks := []string{
		"/var/run/docker.sock",
		filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "docker.sock"),
		filepath.Join(home, ".docker", "run", "docker.sock"),
		filepath.Join(home, ".docker", "desktop", "docker.sock"),
		filepath.Join(home, ".testcontainers.properties"),
		fmt.Sprintf("/run/user/%d/docker.sock", os.Getuid()),
		fmt.Sprintf("/run/user/%d/podman/podman.sock", os.Getuid()),
	}
	for _, s := range socks {
		if _, err := os.Stat(s); err == nil {
			return true
		}
	}
	return false
}

// advertisedFile is where startContainer writes the advertised listeners once it knows
// the host port Docker mapped; the container's entrypoint waits for it.
const advertisedFile = "/tmp/velocity-advertised-listeners"

// startContainer runs a single-node KRaft broker from the apache/kafka image with the same
// test settings as scripts/kafka-local.sh. The host port is only known after the container
// starts, so the entrypoint waits for a file with the advertised listeners, written by a
// post-start hook, before it runs the image's own start script. Clients use the EXTERNAL
// listener; the broker talks to itself on INTERNAL.
func startContainer() (addr string, stop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), containerTimeout)
	defer cancel()

	env := map[string]string{
		"KAFKA_NODE_ID":                                          "1",
		"KAFKA_PROCESS_ROLES":                                    "broker,controller",
		"KAFKA_LISTENERS":                                        "EXTERNAL://0.0.0.0:9092,INTERNAL://0.0.0.0:19092,CONTROLLER://0.0.0.0:9093",
		"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":                   "EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"KAFKA_INTER_BROKER_LISTENER_NAME":                       "INTERNAL",
		"KAFKA_CONTROLLER_LISTENER_NAMES":                        "CONTROLLER",
		"KAFKA_CONTROLLER_QUORUM_VOTERS":                         "1@localhost:9093",
		"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":                 "1",
		"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":                     "1",
		"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR":         "1",
		"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":                    "1",
		"KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS":             "1",
		"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
		"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR":            "1",
		"KAFKA_DEFAULT_REPLICATION_FACTOR":                       "1",
		"KAFKA_MIN_INSYNC_REPLICAS":                              "1",
		"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":                 "0",
		"KAFKA_LOG_CLEANER_BACKOFF_MS":                           "1000",
		"KAFKA_LOG_CLEANER_DEDUPE_BUFFER_SIZE":                   "4194304",
		"KAFKA_LOG_MESSAGE_TIMESTAMP_AFTER_MAX_MS":               "3153600000000",
		"KAFKA_LOG_RETENTION_MS":                                 "-1",
		"KAFKA_HEAP_OPTS":                                        "-Xms64m -Xmx512m -XX:+UseSerialGC",
	}
	var hostAddr string
	ctr, err := testcontainers.Run(ctx, image(),
		testcontainers.WithEnv(env),
		testcontainers.WithExposedPorts("9092/tcp"),
		testcontainers.WithEntrypoint("sh", "-c",
			`while [ ! -s `+advertisedFile+` ]; do sleep 0.1; done; `+
				`export KAFKA_ADVERTISED_LISTENERS="$(cat `+advertisedFile+`)"; exec /etc/kafka/docker/run`),
		testcontainers.WithLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostStarts: []testcontainers.ContainerHook{
				func(ctx context.Context, c testcontainers.Container) error {
					host, err := c.Host(ctx)
					if err != nil {
						return fmt.Errorf("container host: %w", err)
					}
					port, err := c.MappedPort(ctx, "9092/tcp")
					if err != nil {
						return fmt.Errorf("mapped port: %w", err)
					}
					hostAddr = fmt.Sprintf("%s:%s", host, port.Port())
					listeners := fmt.Sprintf("EXTERNAL://%s,INTERNAL://localhost:19092", hostAddr)
					return c.CopyToContainer(ctx, []byte(listeners), advertisedFile, 0o644)
				},
			},
		}),
	)
	stop = func() {
		if ctr == nil {
			return
		}
		if err := testcontainers.TerminateContainer(ctr); err != nil {
			fmt.Fprintf(os.Stderr, "kafkatest: terminate Kafka container: %v\n", err)
		}
	}
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("start %s: %w", image(), err)
	}
	if err := ping(hostAddr, 2*time.Minute); err != nil {
		stop()
		return "", nil, fmt.Errorf("%s container at %s: %w", image(), hostAddr, err)
	}
	// Without Main, testcontainers' reaper removes the container when the binary exits.
	return hostAddr, stop, nil
}
