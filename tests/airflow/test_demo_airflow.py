"""The README's main command: ``gpu-pool demo --airflow`` runs for real, start to finish.

It starts ``airflow standalone`` on a simulated fleet (embedded SSH servers), triggers the
example DAGs of ``dags/`` and must see every GPU task placed, run and released, with a
ledger row each; the folder it wipes must be one it made.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.airflow.harness import free_port

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

GPU_POOL = str(Path(sys.executable).with_name("gpu-pool"))


def _background() -> None:
    """What a shell does to a job started with ``&``: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_airflow_demo_places_runs_and_releases_every_gpu_task(tmp_path: Path) -> None:
    """Run as a user would leave it in the background (``--keep-running &``), then stopped
    with SIGTERM: every task placed, run and released; the api-server on 127.0.0.1 only;
    parallelism sized to the machine; and nothing the demo started outlives it."""
    import psutil

    from gpu_pool.cli.airflow_demo import demo_parallelism

    home, port = tmp_path / "demo", free_port()
    demo = subprocess.Popen([GPU_POOL, "demo", "--airflow", "--home", str(home), "--port",
                             str(port), "--timeout", "480", "--keep-running"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_background)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 540
    while not any("Airflow keeps running" in line for line in lines):
        assert demo.poll() is None, "".join(lines)[-4000:]
        assert time.monotonic() < deadline, "".join(lines)[-4000:]
        time.sleep(1)
    tree = psutil.Process(demo.pid).children(recursive=True)
    listening = {c.laddr.ip for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert listening == {"127.0.0.1"}
    scheduler = next(p for p in tree if "scheduler" in " ".join(p.cmdline()))
    assert scheduler.environ()["AIRFLOW__CORE__PARALLELISM"] == str(demo_parallelism())
    started = time.monotonic()
    demo.send_signal(signal.SIGTERM)
    assert demo.wait(90) == 0
    reader.join(10)
    stopped_in = time.monotonic() - started
    left = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], [p.cmdline() for p in left]
    print(f"stopped {len(tree)} processes in {stopped_in:.1f} s")
    out = "".join(lines)
    assert "got SIGTERM: stopping Airflow" in out
    placed = re.findall(r"placed  (\S+) on (\S+) GPU ([\d,]+)", out)
    # The trigger gives the GPUs back as the remote job ends, before the task concludes.
    released = re.findall(r"released (\S+): remote job ended \(success\)", out)
    assert len(placed) == 10 and sorted(p[0] for p in placed) == sorted(released)
    assert "waits   example_gpu_sweep.trial_" in out  # the sweep outgrows the fleet
    assert "10 GPU tasks placed, run over SSH and released; 10 ledger rows" in out
    assert "GPUs still held: 0" in out
    for name, node, _ in placed:  # the summary names the same placement as Airflow's TI
        task = name.rsplit(".", 1)[0]
        assert re.search(rf"{re.escape(task)}\s+success\s+GpuPool\s+gpu://{node}/", out), task


def test_airflow_demo_refuses_to_wipe_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("precious")
    done = subprocess.run([GPU_POOL, "demo", "--airflow", "--home", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert f"home: got '{tmp_path}'" in done.stderr or "home:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "thesis.tex").read_text() == "precious"


def test_airflow_demo_refuses_a_host_that_is_not_an_address(tmp_path: Path) -> None:
    done = subprocess.run([GPU_POOL, "demo", "--airflow", "--home", str(tmp_path / "d"),
                           "--host", "every-interface"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "host: got 'every-interface'; expected an IP address to listen on" in done.stderr
    assert "Traceback" not in done.stderr
