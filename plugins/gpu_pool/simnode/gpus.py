"""Simulated GPUs of a simulated node, and the node directory that holds them.

A *node directory* is what makes a shell account look like a GPU host:

* ``gpus.json`` — the simulated devices (:class:`SimGpu`) and compute processes;
* ``bin/nvidia-smi`` — a launcher for :mod:`gpu_pool.simnode.nvidia_smi` bound to that
  ``gpus.json``. Put ``bin`` first on a session's ``PATH`` and ``nvidia-smi`` answers with
  the simulated devices in the real CSV format.

Names and memory sizes are what real cards report (``nvidia-smi --query-gpu=name,memory.total``),
so the probe parses simulated and real output with the same code.
"""

from __future__ import annotations

import json
import shlex
import sys
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

# Our model name -> (name nvidia-smi reports, memory.total in MiB it reports).
REPORTED_MODELS: dict[str, tuple[str, int]] = {
    "T4": ("Tesla T4", 15360),
    "A10": ("NVIDIA A10", 23028),
    "L4": ("NVIDIA L4", 23034),
    "A30": ("NVIDIA A30", 24576),
    "L40S": ("NVIDIA L40S", 46068),
    "V100M16": ("Tesla V100-SXM2-16GB", 16160),
    "V100M32": ("Tesla V100-SXM2-32GB", 32768),
    "A100-40G": ("NVIDIA A100-SXM4-40GB", 40960),
    "A100": ("NVIDIA A100-SXM4-80GB", 81920),
    "H100": ("NVIDIA H100 80GB HBM3", 81559),
    "H200": ("NVIDIA H200", 143771),
}


@dataclass(frozen=True)
class SimGpu:
    """One simulated device, as ``nvidia-smi`` reports it."""

    index: int
    name: str
    memory_total_mib: int
    memory_used_mib: int = 0
    utilization_pct: int = 0
    temperature_c: int = 35
    uuid: str = ""


@dataclass(frozen=True)
class SimProcess:
    """A compute process on a simulated GPU (``--query-compute-apps``)."""

    gpu_uuid: str
    pid: int
    used_memory_mib: int


def sim_gpus(model: str, count: int, *, seed: str = "") -> tuple[SimGpu, ...]:
    """``count`` idle devices of one of :data:`REPORTED_MODELS`, with stable UUIDs."""
    if model not in REPORTED_MODELS:
        raise ValueError(f"model {model!r}: expected one of {', '.join(REPORTED_MODELS)}")
    name, memory = REPORTED_MODELS[model]
    return tuple(
        SimGpu(index=i, name=name, memory_total_mib=memory,
               uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}/{model}/{i}")))
        for i in range(count)
    )


def write_node_dir(directory: Path, gpus: tuple[SimGpu, ...],
                   processes: tuple[SimProcess, ...] = (), *, raw_output: str | None = None) -> Path:
    """Create (or refresh) a node directory; returns its ``bin`` folder for ``PATH``.

    ``raw_output``, when given, is printed verbatim for every ``--query-gpu`` call: the way
    to simulate a broken driver (``"Unable to determine the device handle..."``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    state = {"gpus": [asdict(g) for g in gpus], "processes": [asdict(p) for p in processes],
             "raw_output": raw_output}
    state_file = directory / "gpus.json"
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(state_file)
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    launcher = bin_dir / "nvidia-smi"
    script = Path(__file__).with_name("nvidia_smi.py")
    launcher.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(script))} "
        f"--state {shlex.quote(str(state_file))} \"$@\"\n"
    )
    launcher.chmod(0o755)
    return bin_dir
