# syntax=docker/dockerfile:1
# carehub's container image: the binary on distroless (glibc), run as a non-root user, with the
# ONNX Runtime library that serves models in-process (docs/MODELS.md). Every role (api, ingest,
# processors) and the migration job run this image; the role is the command line.
# The image has no embedded Postgres or Kafka: give it --database-url, --kafka-brokers and
# --clickhouse-url (or CAREHUB_DATABASE_URL, …). Run it with a read-only root filesystem and a
# writable /tmp (deploy/compose and deploy/helm do).
#
#   docker build -t carehub:dev --build-arg VERSION=$(git describe --always) --build-arg REVISION=$(git rev-parse HEAD) .

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
# The git commit (carehub_build_info{revision}): .git is not in the build context.
ARG REVISION=
# The ONNX Runtime library, from the onnxruntime wheel on PyPI as `make onnxruntime-deps` takes
# it (the version the Go binding's headers name); the binary loads it at run time.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip unzip && rm -rf /var/lib/apt/lists/* && \
    ONNXRUNTIME_DIR=/out/onnxruntime PYTHON=python3 deploy/local/onnxruntime/fetch.sh
# cgo for the runtime's C API; paths trimmed, symbols stripped.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/carehub ./cmd/carehub

# distroless/cc: glibc and libstdc++ (for the runtime), CA certificates, time zones and a
# nonroot user (65532), no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/carehub /usr/local/bin/carehub
COPY --from=build /out/onnxruntime/libonnxruntime.so /usr/local/lib/carehub/libonnxruntime.so
USER 65532:65532
ENV CAREHUB_HTTP_ADDR=0.0.0.0:8080 \
    CAREHUB_ONNXRUNTIME_LIB=/usr/local/lib/carehub/libonnxruntime.so \
    CAREHUB_LOG_FORMAT=json \
    CAREHUB_DATA_DIR=/tmp/carehub
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/carehub", "health", "--url", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/usr/local/bin/carehub"]
CMD ["serve", "--seed", "none"]
