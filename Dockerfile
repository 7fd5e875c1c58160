# syntax=docker/dockerfile:1
# velocity-consumer: a static binary in a distroless image that runs as a non-root user.
#
#   docker build -t velocity-consumer .
#   docker run --rm -e VELOCITY_BROKERS=kafka:9092 velocity-consumer         # `run`, the live service
#   docker run --rm velocity-consumer demo                                    # any other command
#
# docker-compose.yml wires it to a Kafka broker and Prometheus.

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/velocity-consumer ./cmd/velocity-consumer \
 && mkdir -p /out/state

# distroless static: no shell, no libc, CA certificates and tzdata only; user nonroot (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/velocity-consumer /velocity-consumer
# The file checkpoint store's directory, owned by the runtime user so that a named volume
# mounted here starts writable.
COPY --from=build --chown=65532:65532 /out/state /var/lib/velocity
USER 65532:65532
ENV VELOCITY_CHECKPOINT_STORE=file:///var/lib/velocity \
    VELOCITY_METRICS_ADDR=:9090
VOLUME ["/var/lib/velocity"]
EXPOSE 9090
ENTRYPOINT ["/velocity-consumer"]
CMD ["run"]
