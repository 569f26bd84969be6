# The one image for Sluice brokers and the operator: `sluice broker ...` / `sluice operator ...`
# (the Helm chart passes the subcommand as the container's args).
#
# Plain on purpose: the base image and pip, nothing else. It cannot be built on the project's
# development and CI machines (they have no Docker engine); build it where Docker runs:
#
#   docker build -t sluice:0.1.0 .
#   kind load docker-image sluice:0.1.0 --name sluice     # for the kind cluster of tools/kind/
#
# Brokers keep RocksDB on the volume mounted at /var/lib/sluice; the container runs as the
# unprivileged user 10001 with a read-only root filesystem (the chart's securityContext), so the
# bytecode is compiled here and Python writes none at run time.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY sluice ./sluice
COPY broker ./broker
COPY operator ./operator
RUN pip install ".[kubernetes]" \
    && python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && rm -rf /src \
    && groupadd --gid 10001 sluice \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/sluice sluice \
    && mkdir -p /var/lib/sluice && chown 10001:10001 /var/lib/sluice

WORKDIR /var/lib/sluice
USER 10001:10001
EXPOSE 9092 8080
ENTRYPOINT ["sluice"]
CMD ["--help"]
