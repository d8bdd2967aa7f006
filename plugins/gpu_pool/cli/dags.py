"""``gpu-pool dags``: the DAGs gpu-pool ships, for an install without the source tree.

The maintenance DAGs (quota alerts, reclaim sweep, node probe, ledger snapshot) and the two
example DAGs live inside the package (``gpu_pool/dags``), so a wheel carries them.
``gpu-pool dags list`` names them; ``gpu-pool dags install FOLDER`` copies them into an
Airflow dags folder. A file already there with other content is never overwritten
silently: the command refuses, naming the files, unless ``--force``; an identical file is
left as it is (so running it again after an upgrade copies only what changed).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
from pathlib import Path

from gpu_pool.cli import add_command, add_group
from gpu_pool.cli.output import emit
from gpu_pool.errors import SpecError

PACKAGED = Path(__file__).resolve().parents[1] / "dags"
MAINTENANCE = ("gpu_pool_quota_alerts", "gpu_pool_reclaim_sweep", "gpu_pool_node_probe",
               "gpu_pool_ledger_snapshot")
EXAMPLES = ("example_gpu_training", "example_gpu_sweep")


def register(subparsers: argparse._SubParsersAction) -> None:
    group = add_group(subparsers, "dags", "the maintenance and example DAGs gpu-pool ships")
    add_command(group, "list", "the DAG files in the package").set_defaults(func=list_dags)
    p = add_command(group, "install", "copy the DAG files into an Airflow dags folder")
    p.add_argument("folder", metavar="FOLDER", help="the Airflow dags folder ([core] dags_folder)")
    p.add_argument("--maintenance-only", action="store_true",
                   help="only the four maintenance DAGs, not the examples")
    p.add_argument("--force", action="store_true",
                   help="overwrite files of the same name that differ")
    p.set_defaults(func=install)


def _files(maintenance_only: bool) -> list[Path]:
    names = MAINTENANCE if maintenance_only else (*MAINTENANCE, *EXAMPLES)
    return [PACKAGED / f"{name}.py" for name in names]


def list_dags(args: argparse.Namespace) -> int:
    rows = [{"dag_file": p.name, "kind": "maintenance" if p.stem in MAINTENANCE else "example",
             "path": str(p)} for p in _files(False)]
    emit(args.json, rows, ["dag_file", "kind", "path"])
    return 0


def install(args: argparse.Namespace) -> int:
    folder = Path(args.folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise SpecError("folder", str(folder), "a directory (the Airflow dags folder)")
    sources = _files(args.maintenance_only)
    clash = [s.name for s in sources
             if (folder / s.name).exists() and not filecmp.cmp(s, folder / s.name, shallow=False)]
    if clash and not args.force:
        raise SpecError("folder", str(folder),
                        "a folder without other files named " + ", ".join(clash)
                        + " (pass --force to overwrite them)")
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in sources:
        target = folder / s.name
        if target.exists() and filecmp.cmp(s, target, shallow=False):
            rows.append({"dag_file": s.name, "action": "unchanged"})
            continue
        action = "replaced" if target.exists() else "copied"
        shutil.copyfile(s, target)
        rows.append({"dag_file": s.name, "action": action})
    emit(args.json, rows, ["dag_file", "action"])
    return 0
