# The one image for Sluice brokers and the operator: `sluice broker ...` / `sluice operator ...`
# (the Helm chart passes the subcommand as the container's args).
#
# One image, not a slim broker image beside an operator image: in Kubernetes the brokers keep
# the cluster's metadata in MetadataDocument objects (--metadata=kubernetes://NAMESPACE), so the
# broker needs the `kubernetes` client package as much as the operator does; only Kopf (about
# 2 MB with its aiohttp) is the operator's alone. A second image would save almost nothing and
# double what users pull, tag and scan.
#
# Build it with Docker (BuildKit, the default builder since Docker 23; older engines need
# DOCKER_BUILDKIT=1 for the RUN --mount below):
#
#   docker build -t sluice:0.1.0 .
#   kind load docker-image sluice:0.1.0 --name sluice     # for the kind cluster of tools/kind/
#
# or without a registry or Docker engine, as the project's machines do, from a local Debian base
# (mmdebstrap, then buildah/podman): tools/k8s-node/build-image.sh passes
# --build-arg BASE=localhost/sluice-base:bookworm. Any base with python3 (3.11+) and its venv
# module works; python:3.11-slim is the default for Docker users.
#
# Brokers keep RocksDB on the volume mounted at /var/lib/sluice; the container runs as the
# unprivileged user 10001 with a read-only root filesystem (the chart's securityContext), so the
# bytecode is compiled here and Python writes none at run time.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A virtual environment: the same layout on python:3.11-slim and on a Debian base (whose system
# Python refuses pip installs), and one directory to copy into the final stage.
# Behind a TLS-intercepting proxy pip needs the proxy's CA: pass a CA bundle as the build secret
# "ca-bundle" (docker build --secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt); it is
# mounted for the pip steps only and never stored in a layer. Without it pip uses its own CAs.
# First the dependencies alone (read from pyproject.toml), a layer that only a change of them
# rebuilds; then the project itself, without dependencies.
COPY pyproject.toml /src/
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python3 -m venv /opt/sluice \
    && python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + p["optional-dependencies"]["kubernetes"]))' > /src/requirements.txt \
    && /opt/sluice/bin/pip install --no-compile -r /src/requirements.txt
# Bytecode now, so that a read-only root filesystem costs no compile at each start. Compiled
# from / and not from the source tree: there, operator/ (a plain folder) would sit on sys.path
# ahead of the standard library's operator module.
WORKDIR /
RUN /opt/sluice/bin/python -m compileall -q -j 0 /opt/sluice
COPY setup.py README.md /src/
COPY sluice /src/sluice
COPY broker /src/broker
COPY operator /src/operator
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && /opt/sluice/bin/pip install --no-compile --no-deps /src \
    && /opt/sluice/bin/pip uninstall -y -q pip setuptools \
    && rm -rf /src \
    && /opt/sluice/bin/python -m compileall -q -j 0 /opt/sluice/lib/*/site-packages/sluice

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/sluice/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY --from=build /opt/sluice /opt/sluice
RUN groupadd --gid 10001 sluice \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/sluice sluice \
    && mkdir -p /var/lib/sluice && chown 10001:10001 /var/lib/sluice \
    && sluice --help > /dev/null

WORKDIR /var/lib/sluice
USER 10001:10001
EXPOSE 9092 8080
ENTRYPOINT ["sluice"]
CMD ["--help"]
