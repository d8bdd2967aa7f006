"""The pure job-command builders, executed by a local bash (no SSH needed to test quoting)."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_pool.errors import SpecError
from gpu_pool.remote.allocation import ENV_JSON, NodeSlot, RemoteAllocation
from gpu_pool.remote.job import (
    JobPlacement,
    JobState,
    JobStatus,
    RemoteJob,
    RemoteJobError,
    _exports,
    build_kill_command,
    build_poll_command,
    build_start_command,
    job_environment,
    make_job_id,
    parse_kill_output,
    parse_poll_output,
    parse_start_output,
    split_poll_output,
)

HOSTILE = [
    "'; touch {marker}; echo '",
    '"; touch {marker}; echo "',
    "$(touch {marker})",
    "`touch {marker}`",
    "x\ntouch {marker}\n",
    "a b\tc; touch {marker} &",
    "\\'$(touch {marker})\\'",
]


def bash(script: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          timeout=timeout, check=False)


def wait_done(job: RemoteJob, timeout: float = 30) -> JobStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = parse_poll_output(bash(build_poll_command(job)).stdout)
        if status.done:
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job.job_id} still running after {timeout}s")


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_environment_values_arrive_verbatim_and_run_nothing(
        template: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    value = template.format(marker=marker)
    job = RemoteJob(make_job_id("req"), base_dir=str(tmp_path / "jobs"))
    placement = JobPlacement(node=value, gpu_indices=(0, 2), request=value,
                             allocation_id=value)
    env = job_environment(placement, job, {"TASK_NOTE": value})
    out = tmp_path / "seen"
    command = f"printf '%s\\0' \"$TASK_NOTE\" \"$GPU_POOL_NODE\" \"$GPU_POOL_REQUEST\" > {out}"
    start = bash(build_start_command(command, job, env))
    assert start.returncode == 0, start.stderr
    assert parse_start_output(start.stdout, job) > 1
    status = wait_done(job)
    assert (status.state, status.exit_code) == (JobState.EXITED, 0)
    assert out.read_bytes().split(b"\0")[:3] == [value.encode()] * 3
    assert not marker.exists()


def test_the_command_is_interpreted_once_as_written(tmp_path: Path) -> None:
    job = RemoteJob(make_job_id("req"), base_dir=str(tmp_path / "jobs"))
    command = "echo '$HOME' \"it's\" $((6*7)); echo err >&2; exit 7"
    assert bash(build_start_command(command, job, {})).returncode == 0
    status = wait_done(job)
    assert (status.exit_code, status.log_size) == (7, len("$HOME it's 42\nerr\n"))
    assert Path(job.path("log")).read_text() == "$HOME it's 42\nerr\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True),
                       st.text(st.characters(blacklist_characters="\x00",
                                             blacklist_categories=("Cs",)), max_size=40),
                       max_size=4))
def test_exports_round_trip_any_value(env: dict[str, str]) -> None:
    script = _exports(env) + "".join(f"printf '%s\\0' \"${name}\"\n" for name in env)
    result = subprocess.run(["bash", "-c", script], capture_output=True, check=True)
    assert result.stdout.split(b"\0")[:-1] == [v.encode() for v in env.values()]


def test_job_environment_exports_the_allocation() -> None:
    job = RemoteJob("j1", "/srv/jobs")
    env = job_environment(JobPlacement("node-a", (1, 3), "r1", gpu_milli=250,
                                       allocation_id="a-9"), job)
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3" == env["GPU_POOL_GPUS"]
    assert env["GPU_POOL_ALLOCATION"] == "gpu://node-a/1,3@250m"
    assert (env["GPU_POOL_GPU_MILLI"], env["GPU_POOL_ALLOCATION_ID"]) == ("250", "a-9")
    assert env["GPU_POOL_JOB_DIR"] == "/srv/jobs/j1"


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "GPU_POOL_NODE", "1X", "A-B",
                                  "A;touch x", "", "X Y"])
def test_bad_or_reserved_environment_names_are_refused(name: str) -> None:
    with pytest.raises(SpecError) as info:
        job_environment(JobPlacement("n", (0,), "r"), RemoteJob("j"), {name: "v"})
    assert info.value.field == "environment"


@pytest.mark.parametrize(("job_id", "base_dir"), [
    ("../etc", "/tmp/x"), ("a b", "/tmp/x"), ("a;b", "/tmp/x"), ("$(x)", "/tmp/x"),
    ("ok", "relative"), ("ok", "/tmp/../etc"), ("ok", "/tmp/x y"), ("ok", "/"),
    ("ok", "/tmp/$(x)"), ("", "/tmp/x"),
])
def test_unsafe_job_paths_are_refused(job_id: str, base_dir: str) -> None:
    with pytest.raises(SpecError):
        RemoteJob(job_id, base_dir)


def test_make_job_id_is_safe_for_any_parts() -> None:
    job_id = make_job_id("dag/1;rm -rf", "$(task)", "run 2")
    RemoteJob(job_id)  # valid
    assert job_id != make_job_id("dag/1;rm -rf", "$(task)", "run 2")


def test_a_second_start_of_the_same_job_is_refused(tmp_path: Path) -> None:
    job = RemoteJob("dup", str(tmp_path))
    assert bash(build_start_command("true", job, {})).returncode == 0
    second = bash(build_start_command("echo again", job, {}))
    assert second.returncode != 0
    wait_done(job)
    assert Path(job.path("log")).read_text() == ""


def test_local_kill_stops_the_whole_group(tmp_path: Path) -> None:
    job = RemoteJob("k", str(tmp_path))
    command = "trap '' TERM; sleep 300 & sleep 300"
    pgid = parse_start_output(bash(build_start_command(command, job, {})).stdout, job)
    assert bash(f"kill -0 -- -{pgid}").returncode == 0
    result = bash(build_kill_command(job, grace_s=0.3, reason="cancelled"))
    assert parse_kill_output(result.stdout) == "killed"
    live = bash(f"ps -eo pgid=,stat= | awk '$1 == {pgid} && $2 !~ /^Z/'").stdout
    assert live.strip() == ""
    status = wait_done(job)
    assert (status.exit_code, status.killed_reason) == (137, "cancelled")


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu-pool-status missing\n", JobStatus(JobState.MISSING)),
    ("gpu-pool-status - 1 1 12 - -\n", JobStatus(JobState.RUNNING, None, True, 12)),
    ("gpu-pool-status - 0 1 12 - -\n", JobStatus(JobState.RUNNING, None, False, 12)),
    ("gpu-pool-status - 0 0 12 - -\n", JobStatus(JobState.LOST, None, False, 12)),
    ("motd\ngpu-pool-status 0 0 0 5 - 1764579600.123456789\n",
     JobStatus(JobState.EXITED, 0, False, 5, None, 1764579600.123456789)),
    ("gpu-pool-status 143 0 0 5 time_limit 1764579600\n",
     JobStatus(JobState.EXITED, 143, False, 5, "time_limit", 1764579600.0)),
    ("gpu-pool-status 0 0 0 5 - .\n", JobStatus(JobState.EXITED, 0, False, 5)),  # no date
])
def test_parse_poll_output(text: str, expected: JobStatus) -> None:
    assert parse_poll_output(text) == expected


@pytest.mark.parametrize("text", ["", "hello", "gpu-pool-status 1 2",
                                  "gpu-pool-status x 0 0 1 - -", "gpu-pool-status - a b c - -",
                                  "gpu-pool-status 0 0 0 5 -"])
def test_malformed_poll_output_is_an_error(text: str) -> None:
    with pytest.raises(RemoteJobError):
        parse_poll_output(text)


def test_kill_reason_must_be_a_plain_word() -> None:
    with pytest.raises(SpecError):
        build_kill_command(RemoteJob("j"), reason="x; rm -rf /")


def test_empty_command_is_refused() -> None:
    with pytest.raises(SpecError) as info:
        build_start_command("  ", RemoteJob("j"), {})
    assert info.value.field == "command"


def test_task_allocation_env_round_trip() -> None:
    alloc = RemoteAllocation("r1", (NodeSlot("node-a", "gpu_node_a", (0, 1), 1000, "a1"),
                                  NodeSlot("node-b", "gpu_node_b", (2, 3), 1000, "a2")))
    env = alloc.to_env()
    assert RemoteAllocation.from_env(env) == alloc
    assert alloc.external_id == "gpu://node-a/0,1+node-b/2,3"
    flat = {k: v for k, v in env.items() if k != ENV_JSON}
    with pytest.raises(SpecError) as info:  # a gang without its per-node slots
        RemoteAllocation.from_env(flat)
    assert info.value.field == ENV_JSON
    single = RemoteAllocation("r1", alloc.slots[:1])
    assert RemoteAllocation.from_env(
        {k: v for k, v in single.to_env().items() if k != ENV_JSON}) == single
    ranks = [(p.node, p.node_rank, p.node_count) for p in alloc.placements()]
    assert ranks == [("node-a", 0, 2), ("node-b", 1, 2)]
    assert RemoteAllocation.from_env({}) is None
    with pytest.raises(SpecError):
        RemoteAllocation.from_env({ENV_JSON: "{not json"})
    with pytest.raises(SpecError):
        RemoteAllocation.from_env({"GPU_POOL_NODE": "n", "GPU_POOL_SSH_CONN_ID": "c",
                                 "GPU_POOL_GPU_INDICES": "0,x"})




def test_one_round_trip_poll_returns_status_then_log(tmp_path: Path) -> None:
    job = RemoteJob("p", str(tmp_path))
    # The log may itself contain the status tag: only the first one is the status.
    assert bash(build_start_command("printf 'gpu-pool-status 9 9 9 9 x\\nhello\\n'", job,
                                    {})).returncode == 0
    wait_done(job)
    raw = subprocess.run(["bash", "-c", build_poll_command(job, 0)], capture_output=True,
                         check=True).stdout
    status, log = split_poll_output(raw)
    assert (status.state, status.exit_code, status.log_size) == (JobState.EXITED, 0, 32)
    assert log == b"gpu-pool-status 9 9 9 9 x\nhello\n"
    raw = subprocess.run(["bash", "-c", build_poll_command(job, 26, 3)], capture_output=True,
                         check=True).stdout
    assert split_poll_output(raw)[1] == b"hel"
    with pytest.raises(RemoteJobError):
        split_poll_output(b"motd only\n")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
               min_size=1, max_size=60))
def test_the_command_survives_every_level_of_nesting(tmp_path: Path, value: str) -> None:
    job = RemoteJob(make_job_id("prop"), str(tmp_path))
    command = f"printf '%s' {shlex.quote(value)}"  # what an author would write to print it
    assert bash(build_start_command(command, job, {})).returncode == 0
    assert wait_done(job).exit_code == 0
    assert Path(job.path("log")).read_bytes() == value.encode()


def test_the_watchdog_keeps_trying_until_the_job_is_gone(tmp_path: Path) -> None:
    """A leader that records its pid late (a loaded node) is still stopped at the limit."""
    job = RemoteJob("late", str(tmp_path))
    out = bash(build_start_command("sleep 300", job, {}, time_limit_s=3, kill_grace_s=0.2))
    pgid = parse_start_output(out.stdout, job)
    pid_file = Path(job.path("pid"))
    pid_file.rename(pid_file.with_suffix(".hidden"))  # as if not yet written
    time.sleep(4.5)  # the deadline passes while the watchdog cannot find the group
    assert bash(f"kill -0 -- -{pgid}").returncode == 0
    pid_file.with_suffix(".hidden").rename(pid_file)
    status = wait_done(job)
    assert (status.exit_code, status.killed_reason) == (143, "time_limit")


def test_a_start_that_times_out_leaves_nothing_running(tmp_path: Path) -> None:
    job = RemoteJob("slow", str(tmp_path / "jobs"))
    marker = tmp_path / "ran"
    result = bash(build_start_command(f"touch {marker}; sleep 300", job, {}, start_timeout_s=0))
    assert result.returncode == 1 and "did not start in 0s; cancelled" in result.stderr
    status = wait_done(job)  # the monitor records the leader's refusal
    assert (status.exit_code, marker.exists()) == (125, False)


@pytest.mark.parametrize(("text", "metrics", "problem"), [
    ("", {}, None),
    ('{"val_loss": 0.5, "steps": 1200}', {"val_loss": 0.5, "steps": 1200.0}, None),
    ("not json", {}, "not JSON"),
    ("[1, 2]", {}, "got a JSON list; expected an object"),
    ('{"ok": 1, "bad": "high", "flag": true}', {"ok": 1.0}, "'bad': got 'high'"),
    ('{"nan": NaN}', {}, "'nan': got nan; expected a finite number"),
    ('{"' + "k" * 65 + '": 1}', {}, "a name of 1 to 64 characters"),
])
def test_parse_metrics(text: str, metrics: dict, problem: str | None) -> None:
    from gpu_pool.remote.job import parse_metrics

    got, problems = parse_metrics(text, "node-a:/jobs/j/metrics.json")
    assert got == metrics
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p and p.startswith("node-a:/jobs/j/metrics.json") for p in problems)


def test_metrics_file_is_exported_and_read_quoted() -> None:
    from gpu_pool.remote.job import build_metrics_read_command

    job = RemoteJob("j1", "/srv/jobs")
    env = job_environment(JobPlacement("node-a", (0,), "r"), job)
    assert env["GPU_POOL_METRICS_FILE"] == "/srv/jobs/j1/metrics.json"
    assert build_metrics_read_command(job) == (
        "head -c 65536 /srv/jobs/j1/metrics.json 2>/dev/null || true")


def test_a_waiting_poll_returns_as_the_job_ends_with_its_end_time(tmp_path: Path) -> None:
    """The node records when the job ended; a poll that waits sees it within a tenth of a
    second instead of at its next interval."""
    job = RemoteJob("ends", str(tmp_path))
    assert bash(build_start_command("sleep 1.5", job, {})).returncode == 0
    asked = time.time()
    status = parse_poll_output(bash(build_poll_command(job, wait_s=30)).stdout)
    answered = time.time()
    assert (status.state, status.exit_code) == (JobState.EXITED, 0)
    assert status.ended_at is not None
    assert asked < status.ended_at < answered <= status.ended_at + 0.5, (
        asked, status.ended_at, answered)
    # A job already over answers at once, with the same end time.
    again = time.time()
    assert parse_poll_output(bash(build_poll_command(job, wait_s=30)).stdout) == status
    assert time.time() - again < 1


def test_a_waiting_poll_of_a_lost_job_does_not_wait(tmp_path: Path) -> None:
    job = RemoteJob("lost", str(tmp_path))
    Path(job.job_dir).mkdir()
    Path(job.path("log")).write_text("")
    Path(job.path("monitor.pid")).write_text("999999")  # a monitor long gone, no exit status
    began = time.monotonic()
    status = parse_poll_output(bash(build_poll_command(job, wait_s=30)).stdout)
    assert status.state is JobState.LOST and time.monotonic() - began < 2
