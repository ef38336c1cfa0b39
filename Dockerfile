# syntax=docker/dockerfile:1
# One image for every trainsentry process: operator, gateway, report CronJob, CLI.
# torch is not in it: the training-side probe is installed into the training image instead
# (pip install "trainsentry[probe]").
#
# Base image pinned by version. Pin the digest too when you publish, e.g.
#   docker buildx imagetools inspect python:3.11.14-slim-bookworm --format '{{json .Manifest.Digest}}'
# and build with --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest>
# (no digest is written here: this repository was prepared without registry access).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: the wheel of this repository (setup.py copies rules/ and dashboards/ into it) and
# a virtualenv with it and its dependencies (the versions of constraints.txt) from wheels only.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml setup.py README.md constraints.txt ./
COPY trainsentry ./trainsentry
COPY rules ./rules
COPY dashboards ./dashboards
RUN python -m pip wheel --constraint constraints.txt --wheel-dir /wheels . \
 && python -m venv /opt/trainsentry \
 && /opt/trainsentry/bin/pip install --no-index --find-links /wheels --only-binary :all: trainsentry \
 && /opt/trainsentry/bin/trainsentry --version

# --- runtime: the virtualenv only, run as an unprivileged user.
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="trainsentry" \
      org.opencontainers.image.description="Monitoring, alerting and fault diagnosis for GPU training jobs on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/trainsentry/trainsentry"
RUN groupadd --system --gid 10001 trainsentry \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin trainsentry \
 && mkdir -p /var/lib/trainsentry \
 && chown 10001:10001 /var/lib/trainsentry
COPY --from=build /opt/trainsentry /opt/trainsentry
ENV PATH=/opt/trainsentry/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /var/lib/trainsentry
USER 10001:10001
EXPOSE 9095
ENTRYPOINT ["trainsentry"]
CMD ["--help"]
