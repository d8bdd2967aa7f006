"""``gpu-pool dags``: the DAG files the package ships, copied into an Airflow dags folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_pool.cli import main
from gpu_pool.cli.dags import EXAMPLES, MAINTENANCE, PACKAGED


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--json", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_names_the_packaged_files(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "dags", "list")
    rows = json.loads(out)
    assert code == 0
    assert {r["dag_file"] for r in rows} == {f"{n}.py" for n in (*MAINTENANCE, *EXAMPLES)}
    assert all(Path(r["path"]).is_file() and Path(r["path"]).parent == PACKAGED for r in rows)
    assert PACKAGED.parent.name == "gpu_pool"  # inside the package, so a wheel carries them


def test_install_copies_then_leaves_identical_files_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "airflow" / "dags"  # created if missing
    code, out, _ = run(capsys, "dags", "install", str(folder), "--maintenance-only")
    assert code == 0
    assert {r["action"] for r in json.loads(out)} == {"copied"}
    assert sorted(p.stem for p in folder.iterdir()) == sorted(MAINTENANCE)
    for name in MAINTENANCE:
        assert (folder / f"{name}.py").read_bytes() == (PACKAGED / f"{name}.py").read_bytes()
    code, out, _ = run(capsys, "dags", "install", str(folder))
    actions = {r["dag_file"]: r["action"] for r in json.loads(out)}
    assert code == 0
    assert {actions[f"{n}.py"] for n in MAINTENANCE} == {"unchanged"}
    assert {actions[f"{n}.py"] for n in EXAMPLES} == {"copied"}


def test_install_refuses_to_overwrite_a_changed_file_unless_forced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "gpu_pool_node_probe.py"
    mine.write_text("# the operator's own edit\n")
    other = tmp_path / "unrelated.py"
    other.write_text("x = 1\n")
    code, out, err = run(capsys, "dags", "install", str(tmp_path))
    assert code == 2 and out == ""
    assert "folder" in err and str(tmp_path)[:40] in err and "gpu_pool_node_probe.py" in err
    assert "--force" in err and "Traceback" not in err
    assert mine.read_text() == "# the operator's own edit\n"  # nothing was touched
    assert not (tmp_path / "gpu_pool_quota_alerts.py").exists()
    code, out, _ = run(capsys, "dags", "install", str(tmp_path), "--force")
    actions = {r["dag_file"]: r["action"] for r in json.loads(out)}
    assert code == 0 and actions["gpu_pool_node_probe.py"] == "replaced"
    assert mine.read_bytes() == (PACKAGED / "gpu_pool_node_probe.py").read_bytes()
    assert other.read_text() == "x = 1\n"


def test_install_into_a_file_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "dags"
    target.write_text("not a folder")
    code, _, err = run(capsys, "dags", "install", str(target))
    assert code == 2
    assert "folder" in err and "a directory" in err and "Traceback" not in err
