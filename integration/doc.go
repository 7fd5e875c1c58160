// Package integration holds the tests that run against a real Apache Kafka broker and
// the checks of the container files (Dockerfile, docker-compose.yml) against the binary.
//
// The tests carry the build tag "integration", so `go test ./...` does not build them:
//
//	go test -tags integration ./integration/...   # finds or starts a broker, see kafkatest
//	make test                                     # unit tests, then these on a real broker
//
// Package kafkatest finds the broker; every test takes its own topics, group ids and
// transactional ids from it, so tests run in parallel on one broker.
package integration
