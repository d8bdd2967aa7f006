"""The README's main command: ``gpu-pool demo`` tells the whole story on a fresh store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpu_pool.cli import main


def test_demo_places_explains_and_releases(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    assert main(["--db", url, "demo"]) == 0
    out = capsys.readouterr().out
    assert "Fleet: 6 nodes, 36 GPUs" in out
    assert "vision-huge refused at submission: gpus: got 16; expected at most 8 per node" in out
    cycle1, cycle2 = out.split("Cycle 1")[1].split("Cycle 2")
    # The high-priority 8-GPU finetune is placed on a card it accepts.
    assert "nlp-finetune-llama" in cycle1 and "placed on" in cycle1.split("nlp-finetune-llama")[1].splitlines()[0]
    # Reasons are sentences, with codes a reader understands.
    assert "data" in cycle1.split("research-ablation")[1].splitlines()[0].lower()
    assert "expired" in cycle1.split("research-pretrain-7b")[1].splitlines()[0]
    # The critical request submitted last is placed in the next cycle.
    assert "placed on" in cycle2.split("nlp-hotfix-eval")[1].splitlines()[0]
    assert "Ledger: 2 finished allocations" in out


def test_demo_runs_as_the_installed_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("gpu-pool")
    done = subprocess.run([str(script), "--db", f"sqlite:///{tmp_path / 'd.db'}", "demo"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Who holds what now" in done.stdout


def test_demo_alerts_arrive_in_local_files(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """The demo's teams are notified through files, so nothing tries to leave the machine."""
    import json
    import re

    assert main(["--db", f"sqlite:///{tmp_path / 'demo.db'}", "demo"]) == 0
    out = capsys.readouterr().out
    assert "Quota alerts (2026-12-01 09:30 UTC): 2 sent, 0 failed" in out
    files = dict(re.findall(r"  -> (\S+\.jsonl): (.+)", out))
    assert sorted(Path(f).name for f in files) == ["research.jsonl", "vision.jsonl"]
    for path, title in files.items():
        (line,) = Path(path).read_text().splitlines()
        assert json.loads(line)["blocks"][0]["text"]["text"] == title
    assert "example.com" not in out
