"""Start real OpenSSH ``sshd`` "GPU nodes" on loopback, each with a fake ``nvidia-smi``.

:func:`start_fleet` starts one ``sshd -D -e -f <config>`` per node, unprivileged port,
its own host key and ``authorized_keys`` in a temp dir; one client key serves them all.
Each node's sessions get ``PATH=<node>/bin:...`` (sshd ``SetEnv``), where
``<node>/bin/nvidia-smi`` reports the node's simulated GPUs (:mod:`gpu_pool.simnode`).

Use from any test::

    from tests.sshd.fleet import start_fleet
    with start_fleet(tmp_path, [("node-a", "A100", 4), ("node-b", "T4", 2)]) as fleet:
        node = fleet["node-a"]
        node.conn_uri            # an Airflow connection URI (host key pinned)
        os.environ.update(fleet.airflow_env())   # AIRFLOW_CONN_<ID> for every node

The connection extras pin the host key (``host_key``, used by the sync ``SSHHook``) and a
``known_hosts`` file (used by ``SSHHookAsync``); no host-key check is ever skipped.
Needs the ``openssh-server`` and ``openssh-client`` packages (``sshd``, ``ssh-keygen``).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from gpu_pool.simnode.gpus import SimGpu, sim_gpus, write_node_dir

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class SshNode:
    """One running sshd node."""

    name: str
    host: str
    port: int
    user: str
    key_file: Path
    known_hosts: Path
    host_key: str  # "ssh-ed25519 AAAA..."
    node_dir: Path
    gpus: tuple[SimGpu, ...]
    pid: int

    @property
    def conn_id(self) -> str:
        return f"gpu_node_{self.name.replace('-', '_')}"

    @property
    def conn_uri(self) -> str:
        extra = {"key_file": str(self.key_file), "host_key": self.host_key,
                 "known_hosts": str(self.known_hosts), "look_for_keys": "false"}
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in extra.items())
        return f"ssh://{quote(self.user)}@{self.host}:{self.port}/?{query}"

    def write_gpus(self, gpus: Sequence[SimGpu], *, raw_output: str | None = None) -> None:
        """Change what this node's ``nvidia-smi`` reports."""
        write_node_dir(self.node_dir, tuple(gpus), raw_output=raw_output)

    def sh(self, command: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
        """Run a command on the node with the OpenSSH client (an independent check)."""
        return subprocess.run(
            ["ssh", "-p", str(self.port), "-i", str(self.key_file), "-o", "BatchMode=yes",
             "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
             "-o", "IdentitiesOnly=yes", f"{self.user}@{self.host}", command],
            capture_output=True, text=True, timeout=timeout, check=False)


@dataclass
class Fleet:
    nodes: dict[str, SshNode] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __getitem__(self, name: str) -> SshNode:
        return self.nodes[name]

    def airflow_env(self) -> dict[str, str]:
        """``AIRFLOW_CONN_<ID>`` variables, one per node."""
        return {f"AIRFLOW_CONN_{n.conn_id.upper()}": n.conn_uri for n in self.nodes.values()}

    def stop_node(self, name: str) -> None:
        """Stop one node's sshd (it becomes unreachable)."""
        node = self.nodes[name]
        for proc in self.processes:
            if proc.pid == node.pid and proc.poll() is None:
                proc.terminate()
                proc.wait(5)

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {proc.stderr.read()!r}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on port {port} within {timeout}s")


@contextlib.contextmanager
def start_fleet(root: Path, specs: Sequence[tuple[str, str, int]]) -> Iterator[Fleet]:
    """Start one sshd per ``(name, model, gpu count)``; stop them all on exit."""
    if not os.path.exists(SSHD):
        raise RuntimeError("sshd not found on PATH or in /usr/sbin: sudo apt-get install -y "
                           "openssh-server (tests/prereqs.sh does it for make test)")
    if os.geteuid() == 0:  # sshd run as root wants its privilege-separation directory
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    client_key = root / "client_ed25519"
    client_pub = _keygen(client_key)
    fleet = Fleet()
    user = getpass.getuser()
    try:
        for name, model, count in specs:
            node_dir = root / name
            node_dir.mkdir()
            gpus = sim_gpus(model, count, seed=name)
            bin_dir = write_node_dir(node_dir, gpus)
            host_key = _keygen(node_dir / "host_ed25519")
            (node_dir / "authorized_keys").write_text(client_pub + "\n")
            port = _free_port()
            known_hosts = node_dir / "known_hosts"
            known_hosts.write_text(f"[127.0.0.1]:{port} {host_key}\n")
            config = node_dir / "sshd_config"
            config.write_text("\n".join([
                f"Port {port}", "ListenAddress 127.0.0.1",
                f"HostKey {node_dir / 'host_ed25519'}",
                f"AuthorizedKeysFile {node_dir / 'authorized_keys'}",
                f"PidFile {node_dir / 'sshd.pid'}",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes", "PermitRootLogin prohibit-password",
                "UsePAM no", "StrictModes no", "MaxStartups 100:30:200", "MaxSessions 100",
                f"SetEnv PATH={bin_dir}:{BASE_PATH} GPU_POOL_TEST_NODE={name}",
                "LogLevel ERROR", "",
            ]))
            proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            fleet.processes.append(proc)
            _wait_listening(port, proc)
            fleet.nodes[name] = SshNode(
                name=name, host="127.0.0.1", port=port, user=user, key_file=client_key,
                known_hosts=known_hosts, host_key=host_key, node_dir=node_dir, gpus=gpus,
                pid=proc.pid)
        (root / "fleet.json").write_text(json.dumps(
            {n.name: n.conn_uri for n in fleet.nodes.values()}, indent=1))
        yield fleet
    finally:
        fleet.stop()
