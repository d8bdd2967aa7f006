"""The SSH runner against real OpenSSH sshd nodes on loopback (see tests/sshd/fleet.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import paramiko
import pytest
from tests.sshd.fleet import Fleet, SshNode

from gpu_pool.model import Outcome
from gpu_pool.remote.job import JobPlacement, JobState, RemoteJob, job_environment, make_job_id
from gpu_pool.remote.runner import RemoteJobRunner

pytestmark = pytest.mark.slow


def group_processes(node: SshNode, pgid: int) -> list[str]:
    """Live processes of a group as the node's own ps sees them (over the OpenSSH client).

    Zombies are left out: they run nothing and hold no GPU; this container's pid 1 may
    never reap the orphans of a killed group.
    """
    result = node.sh(f"ps -eo pgid=,stat=,pid=,args= | awk '$1 == {pgid} && $2 !~ /^Z/'")
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line.strip()]


def new_job(base_dir: str, name: str = "req") -> RemoteJob:
    return RemoteJob(make_job_id(name), base_dir)


@pytest.fixture
def runner(sshd_fleet: Fleet) -> RemoteJobRunner:
    with RemoteJobRunner(sshd_fleet["node-a"].conn_id) as r:
        yield r


def test_command_sees_exactly_its_gpus_and_output_reaches_the_caller(
        runner: RemoteJobRunner, base_dir: str) -> None:
    job = new_job(base_dir)
    env = job_environment(JobPlacement("node-a", (1, 3), "d.t.1@run", allocation_id="7"), job)
    lines: list[str] = []
    command = ("python3 -c 'import json, os; print(json.dumps({k: v for k, v in "
               "os.environ.items() if k.startswith((\"CUDA\", \"GPU_POOL\"))}))'; "
               "nvidia-smi --query-gpu=index,name --format=csv,noheader; echo last")
    result = runner.run(command, job, env, on_output=lines.append, poll_interval=0.2)
    assert (result.outcome, result.exit_code) == (Outcome.SUCCESS, 0)
    seen = json.loads(lines[0])
    assert seen["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert {k: v for k, v in seen.items() if k != "GPU_POOL_TEST_NODE"} == env
    assert lines[1] == "0, NVIDIA A100-SXM4-80GB"  # the node's fake nvidia-smi is on PATH
    assert lines[-1] == "last"


def test_remote_exit_status_decides_the_outcome(runner: RemoteJobRunner, base_dir: str) -> None:
    job = new_job(base_dir)
    result = runner.run("echo partial; exit 3", job, {}, poll_interval=0.2)
    assert (result.outcome, result.exit_code, result.killed_reason) == (Outcome.FAILED, 3, None)


@pytest.mark.parametrize("value", ["'; touch {m}; '", "$(touch {m})", "`touch {m}`",
                                   "\"; touch {m}; \"", "a\ntouch {m}"])
def test_hostile_values_do_not_inject_over_ssh(runner: RemoteJobRunner, base_dir: str,
                                               sshd_fleet: Fleet, value: str) -> None:
    marker = Path(base_dir) / "pwned"
    hostile = value.format(m=marker)
    job = new_job(base_dir, hostile)
    env = job_environment(JobPlacement(hostile, (0,), hostile, allocation_id=hostile), job,
                          {"NOTE": hostile})
    lines: list[str] = []
    result = runner.run('printf "%s|%s|%s" "$NOTE" "$GPU_POOL_NODE" "$GPU_POOL_REQUEST"',
                        job, env, on_output=lines.append, poll_interval=0.2)
    assert result.outcome is Outcome.SUCCESS
    assert "\n".join(lines) == "|".join([hostile] * 3)
    assert not marker.exists()
    assert sshd_fleet["node-a"].sh(f"test -e {marker}").returncode == 1


def test_kill_kills_the_whole_process_group_on_the_node(
        runner: RemoteJobRunner, base_dir: str, sshd_fleet: Fleet) -> None:
    node = sshd_fleet["node-a"]
    job = new_job(base_dir)
    # A child that ignores SIGTERM forces the SIGKILL step; a grandchild must die too.
    command = "trap '' TERM; (sleep 301 &) ; sleep 302 & sleep 303; wait"
    pgid = runner.start(command, job, {})
    deadline = time.monotonic() + 30
    while len(group_processes(node, pgid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(group_processes(node, pgid)) >= 3
    assert runner.kill(job, grace_s=0.5) == "killed"
    assert group_processes(node, pgid) == []
    result = runner.wait(job, poll_interval=0.2)
    assert (result.outcome, result.exit_code, result.killed_reason) == (
        Outcome.CANCELLED, 137, "cancelled")


def test_a_cooperative_job_is_terminated_within_the_grace_period(
        runner: RemoteJobRunner, base_dir: str, sshd_fleet: Fleet) -> None:
    job = new_job(base_dir)
    pgid = runner.start("sleep 300", job, {})
    assert runner.kill(job, grace_s=5) == "terminated"
    assert group_processes(sshd_fleet["node-a"], pgid) == []
    assert runner.wait(job, poll_interval=0.2).exit_code == 143
    assert runner.kill(job, grace_s=1) == "absent"  # idempotent


def test_the_time_limit_kills_the_group_on_the_node(
        runner: RemoteJobRunner, base_dir: str, sshd_fleet: Fleet) -> None:
    job = new_job(base_dir)
    started = time.monotonic()
    pgid = runner.start("trap '' TERM; sleep 300 & sleep 300", job, {}, time_limit_s=1,
                        kill_grace_s=0.5)
    # Nobody polls or kills from here: the node's own watchdog must end the job.
    deadline = time.monotonic() + 60
    while runner.poll(job).state is JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
    status = runner.poll(job)
    elapsed = time.monotonic() - started
    # SIGKILL (137) once the TERM trap is set; on a loaded machine the TERM may land first.
    assert (status.state, status.killed_reason) == (JobState.EXITED, "time_limit")
    assert status.exit_code in (137, 143)
    assert 1 <= elapsed < 60  # generous: the shared CI machine can be heavily loaded
    assert group_processes(sshd_fleet["node-a"], pgid) == []
    result = runner.wait(job)
    assert result.outcome is Outcome.TIMED_OUT


def test_a_job_whose_monitor_died_is_lost(runner: RemoteJobRunner, base_dir: str,
                                          sshd_fleet: Fleet) -> None:
    job = new_job(base_dir)
    pgid = runner.start("sleep 300", job, {})
    node = sshd_fleet["node-a"]
    assert node.sh(f"kill -KILL $(cat {job.path('monitor.pid')}) -- -{pgid}").returncode == 0
    deadline = time.monotonic() + 30
    while runner.poll(job).state is JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    assert runner.poll(job).state is JobState.LOST
    assert runner.wait(job).outcome is Outcome.FAILED


def test_two_nodes_are_two_connections(sshd_fleet: Fleet, base_dir: str) -> None:
    job = new_job(base_dir)
    with RemoteJobRunner(sshd_fleet["node-b"].conn_id) as runner:
        lines: list[str] = []
        result = runner.run("echo $GPU_POOL_TEST_NODE; nvidia-smi -L | wc -l", job, {},
                            on_output=lines.append, poll_interval=0.2)
    assert result.succeeded and lines == ["node-b", "2"]


def test_an_unreachable_node_raises(sshd_fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    node = sshd_fleet["node-a"]
    uri = node.conn_uri.replace(f":{node.port}/", ":1/")
    monkeypatch.setenv("AIRFLOW_CONN_GPU_NODE_GONE", uri)
    with RemoteJobRunner("gpu_node_gone", conn_timeout=2, conn_retry_attempts=1) as runner, \
            pytest.raises(OSError):
        runner.exec("true")


def test_a_dropped_connection_is_reopened_for_polls_but_not_for_a_start(
        runner: RemoteJobRunner, base_dir: str) -> None:
    """The socket under the cached connection dies while a job runs (a node's sshd restarted,
    a NAT timeout): the next poll opens a new connection and the job is still watched to its
    end; a start is never sent twice (it raises, or goes once over a new connection)."""
    job = new_job(base_dir)
    runner.start("sleep 1; echo done", job, {})
    first = runner._client().get_transport()
    first.sock.shutdown(2)  # paramiko does not know yet: the next channel open fails
    lines: list[str] = []
    result = runner.wait(job, on_output=lines.append, poll_interval=0.2)
    assert result.succeeded and lines == ["done"]
    assert runner._client().get_transport() is not first
    runner._client().get_transport().sock.shutdown(2)
    again = new_job(base_dir, "again")
    marker = f"{base_dir}/again-ran"
    try:  # paramiko may or may not have seen the socket die: reconnect first, or raise
        runner.start(f"echo once >> {marker}", again, {})
    except (OSError, EOFError, paramiko.SSHException):
        assert runner.poll(again).state is JobState.MISSING  # reconnected; nothing started
    else:
        assert runner.wait(again, poll_interval=0.2).succeeded
        assert runner.exec(f"cat {marker}")[1] == "once\n"  # sent once, never resent
