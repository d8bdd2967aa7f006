"""Run remote jobs on one node over SSH, through the Airflow SSH provider's ``SSHHook``.

A :class:`RemoteJobRunner` holds one SSH connection to one node (one Airflow connection
per node: ``ssh_conn_id``; credentials come only from that connection and are never
logged). It sends the commands of :mod:`gpu_pool.remote.job`:

* :meth:`~RemoteJobRunner.start` — start a job detached; returns its pgid;
* :meth:`~RemoteJobRunner.poll` — a :class:`~gpu_pool.remote.job.JobStatus`;
* :meth:`~RemoteJobRunner.read_log` — new output since an offset;
* :meth:`~RemoteJobRunner.kill` — SIGTERM the group, grace period, SIGKILL;
* :meth:`~RemoteJobRunner.wait` / :meth:`~RemoteJobRunner.run` — poll to the end, streaming
  output to a callback and killing the job at its time limit.

The remote exit status decides the outcome (:class:`JobResult`). The executor and the
operator's non-deferrable path use this class; the trigger uses the same builders over
``SSHHookAsync``.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gpu_pool.model import Outcome
from gpu_pool.remote.job import (
    DEFAULT_KILL_GRACE_S,
    JobState,
    JobStatus,
    RemoteJob,
    RemoteJobError,
    build_cleanup_command,
    build_kill_command,
    build_log_read_command,
    build_poll_command,
    build_start_command,
    parse_kill_output,
    parse_poll_output,
    parse_start_output,
    split_poll_output,
)

if TYPE_CHECKING:
    import paramiko
    from airflow.providers.ssh.hooks.ssh import SSHHook


@dataclass(frozen=True)
class JobResult:
    """How a job ended: ``outcome`` is decided by the remote exit status and the kill reason."""

    job: RemoteJob
    outcome: Outcome
    exit_code: int | None
    killed_reason: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome is Outcome.SUCCESS


def outcome_of(status: JobStatus) -> Outcome:
    """Success only for exit status 0 of a job nobody killed; a job killed for a more urgent
    one (``preempted``) is PREEMPTED: its task is requeued, not failed."""
    if status.killed_reason == "time_limit":
        return Outcome.TIMED_OUT
    if status.killed_reason == "preempted":
        return Outcome.PREEMPTED
    if status.killed_reason is not None:
        return Outcome.CANCELLED
    if status.state is JobState.EXITED and status.exit_code == 0:
        return Outcome.SUCCESS
    return Outcome.FAILED


class RemoteJobRunner:
    """Start, watch and stop remote jobs on the node of ``ssh_conn_id``."""

    def __init__(self, ssh_conn_id: str, *, command_timeout: float = 60.0,
                 conn_timeout: int = 10, conn_retry_attempts: int = 2,
                 channel_open_timeout: float = 15.0) -> None:
        self.ssh_conn_id = ssh_conn_id
        self.command_timeout = command_timeout
        self.channel_open_timeout = channel_open_timeout
        self.conn_timeout = conn_timeout
        self.conn_retry_attempts = conn_retry_attempts

    @cached_property
    def hook(self) -> SSHHook:
        from airflow.providers.ssh.hooks.ssh import SSHHook

        return SSHHook(ssh_conn_id=self.ssh_conn_id, conn_timeout=self.conn_timeout,
                       keepalive_interval=30, conn_retry_attempts=self.conn_retry_attempts)

    def _client(self) -> paramiko.SSHClient:
        return self.hook.get_conn()  # cached by the hook while its transport is alive

    def exec(self, command: str, timeout: float | None = None, *,
             idempotent: bool = False) -> tuple[int, str, str]:
        """Run one short command; (exit status, stdout, stderr). Quiet: commands carry env."""
        status, out, err = self._exec_bytes(command, timeout, idempotent=idempotent)
        return status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def _exec_bytes(self, command: str, timeout: float | None, *,
                    idempotent: bool) -> tuple[int, bytes, bytes]:
        """One command on its own channel, closed after; an idempotent one (a poll, a log
        read) is sent again once on a fresh connection when the channel cannot be opened or
        the connection drops — a node's sshd that stalls one channel must not fail a task."""
        import paramiko

        timeout = timeout or self.command_timeout
        for attempt in (1, 2):
            try:
                transport = self._client().get_transport()
                if transport is None or not transport.is_active():
                    raise paramiko.SSHException("SSH session not active")
                chan = transport.open_session(timeout=min(self.channel_open_timeout, timeout))
                try:
                    chan.settimeout(timeout)
                    chan.exec_command(command)
                    out = chan.makefile("rb", -1).read()
                    err = chan.makefile_stderr("rb", -1).read()
                    return chan.recv_exit_status(), out, err
                finally:
                    chan.close()
            except (paramiko.SSHException, EOFError, OSError):
                if not idempotent or attempt == 2:
                    raise
                self.close()  # drop the cached connection; the hook opens a new one
        raise AssertionError("unreachable")

    def start(self, command: str, job: RemoteJob, env: Mapping[str, str], *,
              time_limit_s: float | None = None,
              kill_grace_s: float = DEFAULT_KILL_GRACE_S) -> int:
        """Start the job; returns its pgid on the node."""
        script = build_start_command(command, job, env, time_limit_s=time_limit_s,
                                     kill_grace_s=kill_grace_s, start_timeout_s=60.0)
        status, out, err = self.exec(script, timeout=90.0)  # outlasts the start timeout
        if status != 0:
            raise RemoteJobError(f"job {job.job_id} did not start on {self.ssh_conn_id}: "
                                 f"exit status {status}: {err.strip()[-500:]}")
        return parse_start_output(out, job)

    def poll(self, job: RemoteJob) -> JobStatus:
        _, out, _ = self.exec(build_poll_command(job), idempotent=True)
        return parse_poll_output(out)

    def poll_with_log(self, job: RemoteJob, offset: int,
                      max_bytes: int = 65536) -> tuple[JobStatus, bytes]:
        """The status and the log from ``offset`` (read after the status), in one round trip."""
        _, out, _ = self._exec_bytes(build_poll_command(job, offset, max_bytes), None,
                                     idempotent=True)
        return split_poll_output(out)

    def read_log(self, job: RemoteJob, offset: int, max_bytes: int = 65536) -> tuple[bytes, int]:
        """(bytes read, new offset)."""
        _, data, _ = self._exec_bytes(build_log_read_command(job, offset, max_bytes), None,
                                      idempotent=True)
        return data, offset + len(data)

    def kill(self, job: RemoteJob, *, reason: str = "cancelled",
             grace_s: float = DEFAULT_KILL_GRACE_S, detach: bool = False) -> str:
        """``absent``, ``terminated``, ``killed``, ``survived`` (or ``sent`` with ``detach``)."""
        _, out, _ = self.exec(build_kill_command(job, grace_s=grace_s, reason=reason,
                                                 detach=detach),
                              timeout=grace_s + 30)
        return parse_kill_output(out)

    def cleanup(self, job: RemoteJob) -> None:
        self.exec(build_cleanup_command(job))

    def wait(self, job: RemoteJob, *, on_output: Callable[[str], Any] | None = None,
             poll_interval: float = 1.0, time_limit_s: float | None = None,
             kill_grace_s: float = DEFAULT_KILL_GRACE_S,
             clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], Any] = time.sleep) -> JobResult:
        """Poll until the job ends; stream its output line by line to ``on_output``.

        ``time_limit_s`` counts from this call; past it the job is killed (``time_limit``).
        """
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        offset = 0
        deadline = None if time_limit_s is None else clock() + time_limit_s
        while True:
            status, data = self.poll_with_log(job, offset)
            offset += len(data)
            while True:  # stream the log; drain it all once the job has ended
                if on_output is not None and data:
                    pending += decoder.decode(data)
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        on_output(line)
                if len(data) < 65536:
                    break
                data, offset = self.read_log(job, offset)
            if status.done:
                pending += decoder.decode(b"", final=True)
                if on_output is not None and pending:
                    on_output(pending)
                return JobResult(job, outcome_of(status), status.exit_code,
                                 status.killed_reason)
            if deadline is not None and clock() >= deadline:
                self.kill(job, reason="time_limit", grace_s=kill_grace_s)
                deadline = None  # the next polls collect the exit status
                continue
            sleep(poll_interval)

    def run(self, command: str, job: RemoteJob, env: Mapping[str, str], *,
            on_output: Callable[[str], Any] | None = None, poll_interval: float = 1.0,
            time_limit_s: float | None = None,
            kill_grace_s: float = DEFAULT_KILL_GRACE_S) -> JobResult:
        """Start the job and wait for it (the node enforces the time limit too)."""
        self.start(command, job, env, time_limit_s=time_limit_s, kill_grace_s=kill_grace_s)
        return self.wait(job, on_output=on_output, poll_interval=poll_interval,
                         time_limit_s=time_limit_s, kill_grace_s=kill_grace_s)

    def close(self) -> None:
        client = self.hook.client
        if client is not None:
            client.close()
            self.hook.client = None

    def __enter__(self) -> RemoteJobRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
