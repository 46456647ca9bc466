# rollout-proxy's container image, in two stages on Debian 12 (bookworm):
#   build    Debian's own Rust (rustc-web and cargo-web, 1.96, from bookworm-security) with
#            cmake and libclang for llama.cpp: the release binary, and the default model
#            fetched ahead (so the image serves it without network access).
#   runtime  bookworm-slim with the binary, the bundled templates and the default model; runs
#            as the user `rollout` (uid 10001), keeps sessions in the volume /data, listens on
#            0.0.0.0:9000 and checks its own /health.
#
#   docker build --build-arg ROLLOUT_PROXY_COMMIT=$(git rev-parse --short=12 HEAD) -t rollout-proxy .
#   docker run -p 9000:9000 -v rollout-data:/data rollout-proxy
#   docker run -p 9000:9000 rollout-proxy serve --data-dir /data --tokenizer /models/qwen \
#       --backend http://gpu1:8000 --backend-type vllm
#
# podman builds it the same way; scripts/check-image.sh builds it and smoke-tests it.

FROM debian:bookworm-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates cargo-web cmake g++ libclang-dev make python3 python3-pip rustc-web \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The commit `--version` prints (the build context has no .git).
ARG ROLLOUT_PROXY_COMMIT=unknown
# The crates and the build are cache mounts: a rebuild compiles only what changed (the binary
# is copied out: a cache mount is not part of the image). A network that re-signs TLS (a
# company proxy) needs its root certificates for the crates and the model: pass them as the
# build secret `ca` (--secret id=ca,src=/etc/ssl/certs/ca-certificates.crt); they are used by
# this step alone and are not kept in the image.
RUN --mount=type=cache,target=/root/.cargo/registry \
    --mount=type=cache,target=/src/target \
    --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then \
        export CARGO_HTTP_CAINFO=/run/secrets/ca PIP_CERT=/run/secrets/ca; \
    fi \
    && ROLLOUT_PROXY_COMMIT="$ROLLOUT_PROXY_COMMIT" cargo build --release --locked \
    && install -D -s target/release/rollout-proxy /out/usr/local/bin/rollout-proxy \
    && ROLLOUT_PROXY_CACHE=/out/opt/rollout-proxy/models \
        /out/usr/local/bin/rollout-proxy fetch-default-model
COPY templates /out/usr/share/rollout-proxy/templates

FROM debian:bookworm-slim AS runtime
# curl for the health check, the system's root certificates for https image URLs; apt's
# lists and caches are not kept.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /data --no-create-home rollout \
    && mkdir /data && chown rollout:rollout /data
COPY --from=build /out/ /
ENV ROLLOUT_PROXY_HOST=0.0.0.0 \
    ROLLOUT_PROXY_CACHE=/opt/rollout-proxy/models
USER rollout
WORKDIR /data
VOLUME /data
EXPOSE 9000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${ROLLOUT_PROXY_PORT:-9000}/health" >/dev/null || exit 1
ENTRYPOINT ["rollout-proxy"]
CMD ["serve", "--data-dir", "/data"]
