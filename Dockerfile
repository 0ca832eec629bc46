# effectlog: CLI, projector, recovery and reconciler in one image.
#   docker build -t effectlog .
#   docker run --rm effectlog --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Install the package from pyproject.toml: the three packages and the Avro schemas
# (effectlog/schemas is a symlink to ../schemas, so both are copied).
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas/ ./schemas/
COPY effectlog/ ./effectlog/
COPY projections/ ./projections/
COPY consumers/ ./consumers/
RUN pip install . \
    && cd / && rm -rf /src \
    && effectlog --help > /dev/null
WORKDIR /

# Non-root; the state directory is private (0700) and owned by the service user, so a
# named volume mounted on it starts with the same owner and mode.
RUN groupadd --system --gid 10001 effectlog \
    && useradd --system --uid 10001 --gid effectlog --home-dir /var/lib/effectlog \
       --shell /usr/sbin/nologin effectlog \
    && mkdir -p /var/lib/effectlog/state \
    && chown -R effectlog:effectlog /var/lib/effectlog \
    && chmod 0700 /var/lib/effectlog /var/lib/effectlog/state

USER effectlog
WORKDIR /var/lib/effectlog
ENV EFFECTLOG_LOG=sqlite:////var/lib/effectlog/log.db \
    EFFECTLOG_STATE=/var/lib/effectlog/state

# Prometheus /metrics and /healthz of `effectlog serve`.
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4)"]

ENTRYPOINT ["effectlog"]
# Recovery and the reconciler need your provider: run `serve --provider SPEC` instead.
CMD ["serve", "--no-recovery"]
