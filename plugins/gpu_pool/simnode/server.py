"""Simulated GPU nodes: embedded asyncssh servers on loopback, for the demo (no root, no sshd).

A :class:`SimNode` is a real SSH server on ``127.0.0.1`` with its own host key that accepts
one client key. Each exec request runs as ``bash -c <command>`` under the current user,
with the node's fake ``nvidia-smi`` first on ``PATH`` (:mod:`gpu_pool.simnode.gpus`) and
``GPU_POOL_SIM_NODE=<name>``. To the runner, the probe and the trigger it is an ordinary
SSH node behind an ordinary Airflow connection (:attr:`SimNode.conn_uri`, host key pinned).

Processes started by a command belong to this machine: several simulated nodes share one
filesystem and one process table, so job directories must be unique (they are: job ids
carry a random suffix).

Run a fleet from a shell (prints one ``AIRFLOW_CONN_<ID>=<uri>`` line per node, then
serves until interrupted)::

    python -m gpu_pool.simnode.server --root /tmp/simfleet node-a:A100:4 node-b:T4:2

In a container (docker-compose.yaml) a node listens on all addresses at a fixed port, is
reached by its service name, accepts the deployment's one client key and keeps its host key
across restarts::

    python -m gpu_pool.simnode.server --root /fleet --listen 0.0.0.0 --port 2222 \
        --advertise gpu-node-1 --client-key /fleet/keys/client_ed25519 \
        --write-json /fleet/nodes/gpu-node-1.json gpu-node-1:A100:4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncssh

from gpu_pool.simnode.gpus import SimGpu, sim_gpus, write_node_dir


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True  # authentication required: the client key below

    def password_auth_supported(self) -> bool:
        return False


def _load_or_create_key(path: Path | None) -> asyncssh.SSHKey:
    """The ed25519 key in ``path``, created there (mode 600) if missing; a fresh one for
    ``None``. A persistent host key keeps a container's node trusted across restarts."""
    if path is not None and path.exists():
        return asyncssh.read_private_key(str(path))
    key = asyncssh.generate_private_key("ssh-ed25519")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        key.write_private_key(str(path))
        path.chmod(0o600)
    return key


class SimNode:
    """One simulated node; :meth:`start` it, use :attr:`conn_uri`, :meth:`stop` it."""

    def __init__(self, name: str, root: Path, gpus: Sequence[SimGpu], *,
                 client_key_file: Path | None = None, listen: str = "127.0.0.1",
                 port: int = 0, advertise: str | None = None,
                 host_key_file: Path | None = None) -> None:
        self.name = name
        self.node_dir = root / name
        self.gpus = tuple(gpus)
        self.bin_dir = write_node_dir(self.node_dir, self.gpus)
        host_key = _load_or_create_key(host_key_file)
        self._host_key = host_key
        self.host_key = host_key.export_public_key().decode().strip()
        self.host_key = " ".join(self.host_key.split()[:2])
        if client_key_file is None:
            client_key_file = self.node_dir / "client_ed25519"
        client = _load_or_create_key(client_key_file)
        self.client_key_file = client_key_file
        self._authorized = asyncssh.import_authorized_keys(client.export_public_key().decode())
        self.listen = listen
        self.host = advertise or listen  # the name clients reach it by
        self.port = port
        self.user = getpass.getuser()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None

    @property
    def conn_id(self) -> str:
        return f"gpu_node_{self.name.replace('-', '_')}"

    @property
    def known_hosts(self) -> Path:
        return self.node_dir / "known_hosts"

    @property
    def conn_uri(self) -> str:
        extra = {"key_file": str(self.client_key_file), "host_key": self.host_key,
                 "known_hosts": str(self.known_hosts), "look_for_keys": "false"}
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in extra.items())
        return f"ssh://{quote(self.user)}@{self.host}:{self.port}/?{query}"

    def write_gpus(self, gpus: Sequence[SimGpu], *, raw_output: str | None = None) -> None:
        """Change what this node's ``nvidia-smi`` reports."""
        self.gpus = tuple(gpus)
        write_node_dir(self.node_dir, self.gpus, raw_output=raw_output)

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command
        if not command:
            process.stderr.write(b"simulated node: only commands, no interactive shell\n")
            process.exit(1)
            return
        env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               "GPU_POOL_SIM_NODE": self.name}
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
            cwd=os.path.expanduser("~"))
        stdout, stderr = await proc.communicate()
        process.stdout.write(stdout)
        process.stderr.write(stderr)
        code = proc.returncode if proc.returncode is not None else 255
        process.exit(code if code >= 0 else 128 - code)  # killed by signal N: 128 + N

    async def _serve(self) -> None:
        self._server = await asyncssh.create_server(
            _Server, self.listen, self.port, server_host_keys=[self._host_key],
            authorized_client_keys=self._authorized, process_factory=self._handle,
            encoding=None, allow_scp=False, agent_forwarding=False, x11_forwarding=False)
        self.port = self._server.sockets[0].getsockname()[1]

    def start(self) -> SimNode:
        """Serve from a background thread; returns once the port is listening."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"simnode-{self.name}")
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        self.known_hosts.write_text(f"[{self.host}]:{self.port} {self.host_key}\n")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def close() -> None:
            self._server.close()
            await self._server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None


@contextlib.contextmanager
def sim_fleet(root: Path, specs: Sequence[tuple[str, str, int]], *,
              listen: str = "127.0.0.1", port: int = 0, advertise: str | None = None,
              client_key_file: Path | None = None) -> Iterator[dict[str, SimNode]]:
    """Start one :class:`SimNode` per ``(name, model, gpu count)``; stop them on exit.

    ``port`` 0 takes free ports; another number is the first node's, the next ones follow.
    """
    root.mkdir(parents=True, exist_ok=True)
    nodes: dict[str, SimNode] = {}
    try:
        for i, (name, model, count) in enumerate(specs):
            nodes[name] = SimNode(
                name, root, sim_gpus(model, count, seed=name), client_key_file=client_key_file,
                listen=listen, port=port + i if port else 0, advertise=advertise,
                host_key_file=root / name / "host_ed25519" if port else None).start()
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


def airflow_env(nodes: dict[str, SimNode]) -> dict[str, str]:
    """``AIRFLOW_CONN_<ID>`` variables, one per node."""
    return {f"AIRFLOW_CONN_{n.conn_id.upper()}": n.conn_uri for n in nodes.values()}


def _parse_spec(text: str) -> tuple[str, str, int]:
    name, model, count = text.split(":")
    return name, model, int(count)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve simulated GPU nodes over SSH.")
    parser.add_argument("--root", type=Path, required=True, help="directory for node state")
    parser.add_argument("--write-json", type=Path, help="write {node: connection URI} here")
    parser.add_argument("--listen", default="127.0.0.1",
                        help="address to bind (0.0.0.0 in a container; default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0,
                        help="the first node's port, the next nodes' follow (default: free "
                             "ports); a fixed port also keeps each node's host key in --root")
    parser.add_argument("--advertise", help="host name clients use (default: --listen)")
    parser.add_argument("--client-key", type=Path,
                        help="the one client key every node accepts (created if missing)")
    parser.add_argument("nodes", nargs="+", type=_parse_spec, help="name:model:gpus")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with sim_fleet(args.root, args.nodes, listen=args.listen, port=args.port,
                   advertise=args.advertise, client_key_file=args.client_key) as nodes:
        for key, value in airflow_env(nodes).items():
            print(f"{key}={value}", flush=True)
        if args.write_json:
            args.write_json.write_text(json.dumps(
                {n.name: {"conn_id": n.conn_id, "uri": n.conn_uri} for n in nodes.values()},
                indent=1))
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
