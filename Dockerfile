# The kvscope image: the CLI (`kvscope collect | plan | serve | simulate | …`) on Python 3.11.
# docker-compose.yml builds it as kvscope:<version> for its sim, migrate, collector, planner
# and api services; each service's command is a kvscope subcommand and its arguments.
#   docker build -t kvscope:0.1.0 .
#   docker run --rm kvscope:0.1.0 simulate --list
# Every dependency has manylinux wheels for CPython 3.11 (psycopg[binary] bundles libpq), so
# no compiler or system library is installed. No HEALTHCHECK here: what is healthy depends
# on the subcommand, so docker-compose.yml gives each service its own.

# ---- build: kvscope and its dependencies installed into a virtualenv
FROM python:3.11.13-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/kvscope
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY collector ./collector
COPY store ./store
COPY planner ./planner
COPY dashboards ./dashboards
COPY api ./api
COPY kvscope ./kvscope
RUN /opt/kvscope/bin/pip install . \
    && /opt/kvscope/bin/kvscope version

# ---- run: the virtualenv alone (same base image and path), nothing of the source tree
FROM python:3.11.13-slim-bookworm
ENV PATH=/opt/kvscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg
COPY --from=build /opt/kvscope /opt/kvscope
RUN groupadd --gid 10001 kvscope \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin kvscope \
    && install -d -o 10001 -g 10001 /var/lib/kvscope
# /var/lib/kvscope: the collector's state (its spool of windows a store outage refused and
# its roll-up checkpoints, KVSCOPE_STATE_DIR); a named volume there inherits this owner
USER 10001:10001
WORKDIR /home/kvscope
# `python` is the virtualenv's (PATH): the compose healthchecks import kvscope's dependencies
ENTRYPOINT ["kvscope"]
CMD ["--help"]
