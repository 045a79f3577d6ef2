# syntax=docker/dockerfile:1
# One image for the operator (`triton-operator run`) and the `triton-operator sync` init container.
# Build from the repository root:
#   docker build -t ghcr.io/triton-operator/triton-operator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- builder: the locked dependencies (hash-checked), then the project, into a venv ----
# requirements/*.lock pin every distribution with its sha256 (`make lock` writes them): two builds
# install the same files. The build lock (setuptools, wheel, pip) builds the project's wheel in a
# venv of its own, whose pip installs into the runtime venv (made without pip): the runtime lock
# and the wheel, nothing else.
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY requirements/build.lock requirements/runtime.lock ./requirements/
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps -r requirements/build.lock \
 && python -m venv --without-pip /opt/venv \
 && /opt/build/bin/pip --python /opt/venv/bin/python install --require-hashes --no-deps -r requirements/runtime.lock
COPY pyproject.toml README.md ./
COPY operator/src ./operator/src
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/build/bin/pip --python /opt/venv/bin/python install --no-deps --no-index /wheels/*.whl \
 && /opt/build/bin/pip --python /opt/venv/bin/python check \
 && /opt/venv/bin/triton-operator --help >/dev/null

# ---- runtime: the venv only, no compilers, no wheels, non-root ----
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="triton-operator" \
      org.opencontainers.image.description="Kubernetes operator for NVIDIA Triton Inference Server" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=builder /opt/venv /opt/venv
# 65532 is the conventional "nonroot" uid/gid; the chart runs with a read-only root filesystem
# and an emptyDir at /tmp.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["triton-operator"]
CMD ["run", "--all-namespaces"]
