"""One real Airflow api-server with the gpu-pool plugin, shared by the API and page tests.

The server runs in a temporary AIRFLOW_HOME with the SimpleAuthManager and three users
(``alice`` admin, ``olga`` op, ``bob`` viewer; passwords in a passwords file), the plugin
loaded from a thin file in the home's plugins folder, and ``GPU_POOL_DB_URL`` pointing at a
SQLite store seeded by :mod:`seed`. Starting it costs ~30 s, so it is session-scoped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from seed import seed  # noqa: E402

from gpu_pool.store import Store  # noqa: E402

USERS = {"alice": ("admin", "alice-pass-1"), "olga": ("op", "olga-pass-1"),
         "bob": ("viewer", "bob-pass-1"), "carol": ("user", "carol-pass-1")}
PLUGIN_FILE = "from gpu_pool.plugin import GpuPoolPlugin  # noqa: F401\n"


@dataclass
class FleetServer:
    base: str
    home: Path
    store: Store
    seeded: dict[str, Any]
    tokens: dict[str, str] = field(default_factory=dict)

    def token(self, user: str) -> str:
        if user not in self.tokens:
            resp = httpx.post(f"{self.base}/auth/token",
                              json={"username": user, "password": USERS[user][1]}, timeout=30)
            resp.raise_for_status()
            self.tokens[user] = resp.json()["access_token"]
        return self.tokens[user]

    def client(self, user: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token(user)}"} if user else {}
        return httpx.Client(base_url=f"{self.base}/gpu-pool", headers=headers, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(home: Path, db_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    (home / "plugins").mkdir(parents=True)
    (home / "dags").mkdir()
    (home / "plugins" / "gpu_pool_plugin.py").write_text(PLUGIN_FILE)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({u: p for u, (_, p) in USERS.items()}))
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                                       "simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, (r, _) in
                                                             USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__API_AUTH__JWT_SECRET": "gpu-pool-ui-tests-secret-0123456789abcdef",
        "AIRFLOW__API__SECRET_KEY": "gpu-pool-ui-tests-secret",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "GPU_POOL_DB_URL": db_url,
    })
    return env


@pytest.fixture(scope="session")
def fleet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    root = tmp_path_factory.mktemp("fleet")
    db_url = f"sqlite:///{root / 'store.db'}"
    store = Store.from_url(db_url)
    store.migrate()
    seeded = seed(store, datetime.now(UTC))
    home = root / "airflow"
    env = _environment(home, db_url)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=300)
    port = _free_port()
    log = (root / "api-server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"api-server exited ({proc.returncode}): "
                                   + (root / "api-server.log").read_text()[-3000:])
            try:
                if httpx.get(f"{base}/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("api-server not up after 180 s: "
                                   + (root / "api-server.log").read_text()[-3000:])
            time.sleep(1)
        yield FleetServer(base=base, home=home, store=store, seeded=seeded)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        store.close()
