# syntax=docker/dockerfile:1
# carehub's container image: one static binary on distroless, run as a non-root user. Every role
# (api, ingest, processors) and the migration job run this image; the role is the command line.
# The image has no embedded Postgres or Kafka: give it --database-url, --kafka-brokers and
# --clickhouse-url (or CAREHUB_DATABASE_URL, …). Run it with a read-only root filesystem and a
# writable /tmp (deploy/compose and deploy/helm do).
#
#   docker build -t carehub:dev --build-arg VERSION=$(git describe --always) .

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
# Static (no cgo), paths trimmed, symbols stripped: the binary needs nothing of the image.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/carehub ./cmd/carehub

# distroless/static: CA certificates, time zones and a nonroot user (65532), no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/carehub /usr/local/bin/carehub
USER 65532:65532
ENV CAREHUB_HTTP_ADDR=0.0.0.0:8080 \
    CAREHUB_LOG_FORMAT=json \
    CAREHUB_DATA_DIR=/tmp/carehub
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/carehub", "health", "--url", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/usr/local/bin/carehub"]
CMD ["serve", "--seed", "none"]
