"""``tests/prereqs.sh``: what ``make test`` makes sure of before any test runs.

Run as a user who cannot install (``nobody`` when the suite runs as root), with a PATH that
hides ``sshd``, it must stop with one line naming the missing piece and the exact command
that installs it, and exit 1; with everything there it exits 0. The Makefile runs it before
pytest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "prereqs.sh"
SEARCH = os.environ.get("PATH", os.defpath).split(os.pathsep) + ["/usr/sbin", "/sbin"]


@pytest.fixture
def bin_root() -> Iterator[Path]:
    """A folder ``nobody`` can read (pytest's own tmp folders are private to their user)."""
    root = Path(tempfile.mkdtemp(prefix="gpu-pool-prereqs-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def _path_without(root: Path, hidden: set[str]) -> str:
    """A one-folder PATH holding links to every program on the real PATH but ``hidden``."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for folder in SEARCH:
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            link = bin_dir / entry.name
            if entry.name in hidden or link.exists() or not os.access(entry.path, os.X_OK):
                continue
            link.symlink_to(entry.path)
    bin_dir.chmod(0o755)
    return str(bin_dir)


def _run_unprivileged(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The script as a user who cannot install: ``nobody`` if we are root, else ourselves."""
    command = ["bash", str(SCRIPT), *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to run the check as nobody"
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    return subprocess.run(command, cwd=REPO, env={"PATH": path, "HOME": "/tmp"},
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_user_who_cannot_install_is_told_what_is_missing_and_how_to_get_it(
        bin_root: Path) -> None:
    done = _run_unprivileged(_path_without(bin_root, {"sshd"}))
    assert done.returncode == 1, done
    missing = [line for line in done.stdout.splitlines() if line.startswith("missing:")]
    assert missing == [
        "missing: the OpenSSH server (sshd), for the tests' GPU nodes on loopback; install it "
        "with: sudo apt-get install -y openssh-server"], done.stdout
    assert "cannot install" in done.stdout or "--check" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr == ""


def test_every_missing_program_gets_its_own_line(bin_root: Path) -> None:
    done = _run_unprivileged(_path_without(bin_root, {"sshd", "chromium", "ssh-keygen"}),
                             "--check")
    assert done.returncode == 1
    lines = [line for line in done.stdout.splitlines() if line.startswith("missing:")]
    assert [line.rsplit(" ", 1)[-1] for line in lines] == [
        "openssh-server", "openssh-client", "chromium"], done.stdout


def test_check_passes_on_a_machine_that_has_everything(bin_root: Path) -> None:
    done = _run_unprivileged(_path_without(bin_root, set()), "--check")
    assert (done.returncode, done.stdout) == (0, ""), done


def test_a_bad_argument_is_refused() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "--install-everything"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "unknown argument '--install-everything'; expected nothing or --check" in done.stderr


@pytest.mark.parametrize("target", ["test"])
def test_make_test_checks_the_machine_before_pytest(target: str) -> None:
    done = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True,
                          check=True)
    lines = done.stdout.splitlines()
    prereqs = next(i for i, line in enumerate(lines) if "tests/prereqs.sh" in line)
    pytest_at = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert prereqs < pytest_at, done.stdout
