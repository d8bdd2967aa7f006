#!/usr/bin/env bash
# Runs once, on the first start of an empty PostgreSQL volume (docker-entrypoint-initdb.d):
# the gpu-pool store gets a database and a role of its own beside Airflow's.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v pw="$GPU_POOL_DB_PASSWORD" <<'SQL'
CREATE ROLE gpu_pool LOGIN PASSWORD :'pw';
CREATE DATABASE gpu_pool OWNER gpu_pool;
SQL
