# gpu-pool on the official Airflow image, installed the way a user installs it: a wheel built
# from this checkout (migrations and DAGs ship inside it), never an editable source tree.
#
#   docker build -t gpu-pool:0.1.0 .        (docker-compose.yaml builds it for every service)
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY plugins ./plugins
RUN pip wheel --no-cache-dir --no-deps -w /dist .

FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION
ARG PYTHON_VERSION
COPY --from=wheel /dist/ /tmp/dist/
# Airflow pinned to the image's own version, its constraints keeping the providers in step.
RUN pip install --no-cache-dir \
      "apache-airflow==${AIRFLOW_VERSION}" /tmp/dist/airflow_gpu_pool-*.whl \
      --constraint "https://raw.githubusercontent.com/apache/airflow/constraints-${AIRFLOW_VERSION}/constraints-${PYTHON_VERSION}.txt"
COPY --chown=airflow:root deploy/ /opt/gpu-pool/deploy/
