"""docker-compose.yaml validates with Debian's docker-compose (no Docker engine needed: images
are neither pulled nor built here) and has the shape a platform team expects: pinned images,
health checks, named volumes, secrets only from .env, two schedulers, the profiles."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SECRETS = ("POSTGRES_PASSWORD", "GPU_POOL_DB_PASSWORD", "AIRFLOW_FERNET_KEY",
           "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY", "AIRFLOW_ADMIN_PASSWORD",
           "AIRFLOW_VIEWER_PASSWORD", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD",
           "GRAFANA_ADMIN_PASSWORD")


def compose(env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is missing: tests/prereqs.sh installs Debian's package"
    return subprocess.run([binary, "--project-directory", str(REPO), "-f",
                           str(REPO / "docker-compose.yaml"), "--env-file", str(env_file),
                           *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    """.env.example with every empty secret filled, as an operator's .env would be."""
    lines = []
    for line in (REPO / ".env.example").read_text().splitlines():
        key, sep, value = line.partition("=")
        lines.append(f"{key}=secret-{key.lower()}" if sep and not value else line)
    path = tmp_path / ".env"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_file_validates_with_every_profile(env_file: Path) -> None:
    for profiles in ([], ["--profile", "celery"], ["--profile", "celery", "--profile",
                                                   "observability"]):
        done = compose(env_file, *profiles, "config", "-q")
        assert done.returncode == 0, done.stderr


def test_a_missing_secret_is_refused_by_name(env_file: Path) -> None:
    text = env_file.read_text()
    for secret in ("AIRFLOW_FERNET_KEY", "GPU_POOL_DB_PASSWORD"):
        env_file.write_text(re.sub(rf"^{secret}=.*$", f"{secret}=", text, flags=re.M))
        done = compose(env_file, "config", "-q")
        assert done.returncode != 0
        assert f"set {secret} in .env" in done.stderr


def test_the_stack_has_the_shape_of_a_deployment(env_file: Path) -> None:
    done = compose(env_file, "--profile", "celery", "--profile", "observability", "config")
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load(done.stdout)
    services = cfg["services"]
    assert {"postgres", "minio", "minio-init", "airflow-init", "airflow-apiserver",
            "airflow-scheduler", "airflow-scheduler-2", "airflow-dag-processor",
            "airflow-triggerer", "gpu-node-1", "gpu-node-2", "gpu-node-3", "redis",
            "airflow-worker", "statsd-exporter", "prometheus", "grafana",
            "airflow-demo-runs"} == set(services)
    one_shot = {"minio-init", "airflow-init", "airflow-demo-runs"}
    for name, svc in services.items():
        image = svc["image"]
        assert re.search(r":[\w.\-]+$", image) and not image.endswith(":latest"), name
        if name not in one_shot:
            assert "healthcheck" in svc, f"{name} has no health check"
    for name in ("airflow-scheduler", "airflow-scheduler-2"):
        assert services[name]["command"] in ("scheduler", ["scheduler"])
    assert set(cfg["volumes"]) >= {"postgres-data", "minio-data", "dags", "fleet"}
    init = services["airflow-init"]["depends_on"]
    assert all(init[f"gpu-node-{i}"]["condition"] == "service_healthy" for i in (1, 2, 3))
    assert init["minio-init"]["condition"] == "service_completed_successfully"
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-triggerer"):
        assert services[name]["depends_on"]["airflow-init"]["condition"] == \
            "service_completed_successfully"
    runs = services["airflow-demo-runs"]
    assert runs["depends_on"]["airflow-scheduler"]["condition"] == "service_healthy"
    assert "airflow dags trigger" in " ".join(runs["command"])
    assert services["redis"].get("profiles") == ["celery"]
    assert services["airflow-worker"]["command"] in ("celery worker", ["celery", "worker"])
    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"].endswith("GpuPool:gpu_pool.executor.GpuPoolExecutor")
    assert "mc version enable local/gpu-pool" in " ".join(services["minio-init"]["entrypoint"])


def test_secrets_come_only_from_the_uncommitted_env_file() -> None:
    text = (REPO / "docker-compose.yaml").read_text()
    for secret in SECRETS:
        assert re.search(rf"\$\{{{secret}(:\?[^}}]*)?\}}", text), secret
    assert not re.search(r"(PASSWORD|SECRET|FERNET_KEY)\w*:\s*['\"]?[A-Za-z0-9]", text)
    assert ".env" in (REPO / ".gitignore").read_text().splitlines()
    example = dict(line.split("=", 1) for line in (REPO / ".env.example").read_text()
                   .splitlines() if line and not line.startswith("#"))
    assert set(SECRETS) <= set(example)


def test_the_image_installs_gpu_pool_from_a_wheel() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "pip wheel" in dockerfile and "airflow_gpu_pool-*.whl" in dockerfile
    assert not re.search(r"pip install[^\n]*\s-e\s", dockerfile)
    assert re.search(r"^FROM apache/airflow:\$\{AIRFLOW_VERSION\}", dockerfile, re.M)
    assert re.search(r"^ARG AIRFLOW_VERSION=3\.3\.\d+$", dockerfile, re.M)


def test_the_dashboard_reads_only_metrics_the_exporter_makes() -> None:
    """Every metric the Grafana dashboard queries is a name deploy/statsd-mapping.yml gives
    one of gpu-pool's StatsD metrics (gpu_pool.telemetry), and every one of those is mapped."""
    import json

    from gpu_pool import telemetry

    mapping = yaml.safe_load((REPO / "deploy/statsd-mapping.yml").read_text())["mappings"]
    made = {m["name"] for m in mapping}
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/gpu-pool.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(dashboard["panels"]) >= 6 and all(p["targets"] for p in dashboard["panels"])
    read = {m for e in exprs for m in re.findall(r"\b(gpu_pool_[a-z_]+)\b", e)}
    assert read and read <= made, read - made
    documented = set(re.findall(r"``gpu_pool\.([a-z_]+)", telemetry.__doc__))
    sent = {f"airflow.gpu_pool.{name}" for name in documented}
    globbed = [m["match"] for m in mapping]
    for name in sent:  # each documented metric (its first part) matches one rule
        assert any(re.fullmatch(g.replace(".", r"\.").replace("*", r"[^.]+"),
                                name if "*" not in g else name + ".x" * g.count("*"))
                   for g in globbed), name
    provisioning = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/"
                                   "gpu-pool.yml").read_text())
    assert provisioning["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
