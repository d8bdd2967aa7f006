"""The openb trace loader: the committed excerpt loads; every bad cell names file, line, column."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_pool.errors import SpecError
from gpu_pool.sim.trace import load_nodes, load_tasks, load_trace

DATA = Path(__file__).resolve().parents[1] / "data"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
              "creation_time,deletion_time,scheduled_time\n")
GOOD_POD = "p0,1000,1024,1,500,,LS,Running,0,10,0\n"


def test_excerpt_loads() -> None:
    trace = load_trace(DATA / "openb_nodes_excerpt.csv", DATA / "openb_pods_excerpt.csv")
    assert len(trace.nodes) == 102 and trace.total_gpus == 498
    assert len(trace.tasks) == 400
    spec = load_tasks(DATA / "openb_pods_gpuspec_excerpt.csv")
    assert sum(1 for t in spec if t.gpu_spec) == 40
    assert any(t.gpu_milli < 1000 and t.num_gpu == 1 for t in trace.tasks)


def test_five_column_task_files_load(tmp_path: Path) -> None:
    path = tmp_path / "multigpu.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,8,1000\n")
    (task,) = load_tasks(path)
    assert task.num_gpu == 8 and task.creation_time is None and task.gpu_spec == frozenset()


@pytest.mark.parametrize(
    ("rows", "where", "field", "fragment"),
    [
        ("p0,1000,1024,1,abc,,LS,Running,0,10,0\n", ":2:5", "gpu_milli", "an integer"),
        ("p0,-5,1024,1,500,,LS,Running,0,10,0\n", ":2:2", "cpu_milli", "an integer >= 0"),
        ("p0,1000,1024,1,1200,,LS,Running,0,10,0\n", ":2:5", "gpu_milli", "1..1000"),
        ("p0,1000,1024,2,500,,LS,Running,0,10,0\n", ":2:5", "gpu_milli", "1000..1000"),
        ("p0,1000,1024,9,1000,,LS,Running,0,10,0\n", ":2:4", "num_gpu", "0..8"),
        ("p0,1000,1024,1,1000,H900,LS,Running,0,10,0\n", ":2:6", "gpu_spec", "T4"),
        ("p0,1000,1024,1,1000,T4|X1,LS,Running,0,10,0\n", ":2:6", "gpu_spec", "'|'"),
        ("p0,1000,1024,1,1000,,Gold,Running,0,10,0\n", ":2:7", "qos", "Guaranteed"),
        ("p0,1000,1024,1,1000,,LS,Running,9,3,9\n", ":2:10", "deletion_time", ">= creation"),
        ("p0,1000,1024,1,1000,,LS,Running,1.5,3,1\n", ":2:9", "creation_time", "integer"),
        (GOOD_POD + "p1,1000,1024,1,1000\n", ":3:6", "gpu_spec", "a value in column 6"),
        (GOOD_POD + ",1000,1024,1,1000,,LS,Running,0,10,0\n", ":3:1", "name", "a task name"),
    ],
)
def test_bad_task_rows(tmp_path: Path, rows: str, where: str, field: str, fragment: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + rows)
    with pytest.raises(SpecError) as caught:
        load_tasks(path)
    error = caught.value
    assert error.where == f"{path}{where}"
    assert error.field == field
    assert fragment in str(error)


def test_missing_task_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,num_gpu,gpu_milli\np0,1,1,1000\n")
    with pytest.raises(SpecError) as caught:
        load_tasks(path)
    assert caught.value.field == "memory_mib" and caught.value.where == f"{path}:1"


@pytest.mark.parametrize(
    ("rows", "where", "field"),
    [
        ("n0,64000,262144,2,Z100\n", ":2:5", "model"),
        ("n0,64000,262144,2,\n", ":2:5", "model"),
        ("n0,64000,262144,two,T4\n", ":2:4", "gpu"),
        ("n0,64000,262144,2,T4\nn0,64000,262144,2,T4\n", ":3:1", "sn"),
        ("n0,64000,-1,2,T4\n", ":2:3", "memory_mib"),
    ],
)
def test_bad_node_rows(tmp_path: Path, rows: str, where: str, field: str) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(NODE_HEADER + rows)
    with pytest.raises(SpecError) as caught:
        load_nodes(path)
    assert caught.value.where == f"{path}{where}" and caught.value.field == field


def test_empty_and_headerless_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(SpecError, match="header"):
        load_nodes(empty)
    only_header = tmp_path / "nodes.csv"
    only_header.write_text(NODE_HEADER)
    with pytest.raises(SpecError, match="at least one node"):
        load_nodes(only_header)
