"""bench/openb_report.py end to end on the trace excerpt: every section is rendered from
runs it made, the share-level table has a row per level with its LP bound, and a rerun
renders from the cache alone."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
BENCH = Path(__file__).resolve().parents[2] / "bench" / "openb_report.py"


def _report():  # noqa: ANN202 - the bench module
    spec = importlib.util.spec_from_file_location("openb_report", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_report_on_the_excerpt_with_share_levels(tmp_path: Path) -> None:
    traces = tmp_path / "traces" / "excerpt"
    traces.mkdir(parents=True)
    shutil.copy(DATA / "openb_nodes_excerpt.csv", traces / "openb_node_list_gpu_node.csv")
    shutil.copy(DATA / "openb_pods_excerpt.csv", traces / "openb_pod_list_default.csv")
    out = tmp_path / "out"
    argv = ["--traces", str(tmp_path / "traces"), "--out", str(out), "--seeds", "1",
            "--batch", "10", "--share-levels", "0.6,1.0", "--fleet-fraction", "1.0"]
    report = _report()
    assert report.main(argv) == 0
    text = (out / "openb.md").read_text()
    table = text[text.index("## Packing at growing GPU sharing"):text.index("## Replay")]
    rows = [line for line in table.splitlines() if re.match(r"\| \d+\.\d%", line)]
    levels = [float(r.split("|")[1].strip().rstrip("%")) for r in rows]
    assert len(levels) == 3 and levels[0] < 60 <= levels[1] < 61 and levels[2] == 100
    for row in rows:
        # engine, fgd, bestfit, engine --batch 10, bound
        values = [float(c.strip()) for c in row.split("|")[2:7]]
        assert values[4] <= min(values[:4])  # no policy below the bound
    assert (out / "packing_sharing_levels.png").stat().st_size > 0
    assert "| LP bound (no policy can go below it) |" in text
    # A rerun renders the same report from the cache alone.
    assert _report().main([*argv, "--cached-only"]) == 0
    assert (out / "openb.md").read_text() == text


def test_bad_share_levels_are_refused_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        _report().main(["--traces", str(tmp_path), "--out", str(tmp_path / "out"),
                        "--share-levels", "0.4,1.5"])
    assert "--share-levels" in str(err.value) and "'0.4,1.5'" in str(err.value)
    assert not (tmp_path / "out").exists()
