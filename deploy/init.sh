#!/usr/bin/env bash
# The compose stack's one-shot init service (airflow-init): migrates both databases, writes
# the UI users' passwords, creates the connections (store, object storage, one per GPU
# node), registers the nodes and the demo teams, and installs gpu-pool's DAGs. Idempotent:
# `docker compose up` runs it on every start.
set -euo pipefail
: "${AIRFLOW_ADMIN_PASSWORD:?set it in .env}" "${AIRFLOW_VIEWER_PASSWORD:?set it in .env}"
: "${MINIO_ROOT_USER:?set it in .env}" "${MINIO_ROOT_PASSWORD:?set it in .env}"

airflow db migrate
gpu-pool db migrate

python - <<'PY'
import json, os
path = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump({"admin": os.environ["AIRFLOW_ADMIN_PASSWORD"],
               "viewer": os.environ["AIRFLOW_VIEWER_PASSWORD"]}, f)
os.chmod(path, 0o600)
PY

replace_conn() {  # replace_conn ID ARGS...: connections are rewritten on every start
  airflow connections delete "$1" >/dev/null 2>&1 || true
  airflow connections add "$@" >/dev/null
}
for f in /fleet/nodes/*.json; do  # written by each gpu-node service when it listens
  python -c 'import json, sys
for n in json.load(open(sys.argv[1])).values(): print(n["conn_id"], n["uri"])' "$f" |
  while read -r conn_id uri; do replace_conn "$conn_id" --conn-uri "$uri"; done
done
replace_conn gpu_pool_s3 --conn-type aws --conn-login "$MINIO_ROOT_USER" \
  --conn-password "$MINIO_ROOT_PASSWORD" \
  --conn-extra '{"endpoint_url": "http://minio:9000", "bucket": "gpu-pool", "prefix": "compose"}'

gpu-pool nodes import /opt/gpu-pool/deploy/fleet.yaml --replace
for team in nlp vision; do gpu-pool team add "$team"; done
gpu-pool quota list --json | python -c 'import json, sys; sys.exit(0 if json.load(sys.stdin) else 1)' || {
  expires=$(date -u -d '+365 days' +%Y-%m-%dT00:00:00Z)
  gpu-pool quota set --team nlp --purpose training --gpus 4 --expires "$expires"
  gpu-pool quota set --team vision --purpose training --gpus 2 --expires "$expires"
  gpu-pool quota set --team nlp --purpose inference --gpus 1 --expires "$expires"
  gpu-pool quota set --team vision --purpose pretraining --gpus 1 --expires "$expires"
}
gpu-pool dags install /opt/airflow/dags
echo "gpu-pool: init done"
