"""Quota alerts: the pure planner, and delivery through the ops tables to real SMTP/HTTP."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpu_pool.model import (
    Allocation,
    LedgerEntry,
    OffPeak,
    OffPeakWindow,
    Outcome,
    Policy,
    PriorityClass,
    Purpose,
    Quota,
    Request,
    Team,
)
from gpu_pool.notify import EmailChannel, TeamChannels
from gpu_pool.ops.alerts import deliver_alerts, plan_alerts
from gpu_pool.ops.config import OpsConfig
from gpu_pool.ops.records import NoticeKey

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
CFG = OpsConfig()


def quota(days_left: float, qid: str = "q1", team: str = "vision", model: str | None = None,
          budget: float | None = None, start_days_ago: float = 30) -> Quota:
    return Quota(team, Purpose.TRAINING, 4, NOW - start_days_ago * DAY, NOW + days_left * DAY,
                 gpu_model=model, gpu_hour_budget=budget, id=qid)


def alloc(name: str, team: str = "vision", gpus: int = 2, started_h: float = 10,
          ends_in: timedelta | None = None, model: str = "A100") -> Allocation:
    return Allocation(name, "n1", tuple(range(gpus)), 1000, 0, 0, team, Purpose.TRAINING,
                      PriorityClass.NORMAL, model, NOW - timedelta(hours=started_h),
                      ends_by=None if ends_in is None else NOW + ends_in)


def kinds(alerts) -> list[tuple[str, int]]:
    return [(a.key.kind, a.key.threshold) for a in alerts]


@pytest.mark.parametrize(("days_left", "expected", "covered"), [
    (20, [], []),
    (15, [("quota_expiring", 15)], []),
    (10, [("quota_expiring", 15)], []),
    (5, [("quota_expiring", 7)], [15]),
    (0.5, [("quota_expiring", 1)], [7, 15]),
])
def test_expiry_thresholds(days_left: float, expected: list, covered: list) -> None:
    alerts = plan_alerts([quota(days_left)], [], [], [], CFG, NOW)
    assert kinds(alerts) == expected
    if alerts:
        assert sorted(k.threshold for k in alerts[0].covers) == covered
        assert "refuses new work" in alerts[0].notice.body


def test_renewal_and_extension_stop_warnings() -> None:
    old = quota(5)
    renewal = Quota("vision", Purpose.TRAINING, 4, old.expires_at, NOW + 200 * DAY, id="q2")
    assert plan_alerts([old, renewal], [], [], [], CFG, NOW) == []
    extended = quota(60)
    assert plan_alerts([extended], [], [], [], CFG, NOW) == []
    # a successor that starts after a gap does not count as a renewal
    late = Quota("vision", Purpose.TRAINING, 4, old.expires_at + DAY, NOW + 200 * DAY, id="q3")
    assert kinds(plan_alerts([old, late], [], [], [], CFG, NOW)) == [("quota_expiring", 7)]


def test_expired_quota_says_new_work_is_refused() -> None:
    (alert,) = plan_alerts([quota(-2)], [], [], [], CFG, NOW)
    assert alert.key.kind == "quota_expired"
    assert "refused" in alert.notice.subject and "refused from now on" in alert.notice.body
    assert plan_alerts([quota(-30)], [], [], [], CFG, NOW) == []  # long gone: no news


def test_running_and_queued_tasks_past_expiry() -> None:
    q = quota(3)
    long_run = alloc("vision-long", ends_in=5 * DAY)
    short_run = alloc("vision-short", ends_in=DAY)
    queued = Request("vision-queued", "vision", estimated_runtime=4 * DAY)
    quick = Request("vision-quick", "vision", estimated_runtime=timedelta(hours=2))
    other = Request("nlp-x", "nlp", estimated_runtime=40 * DAY)  # no quota: nothing to say
    alerts = plan_alerts([q], [], [long_run, short_run], [queued, quick, other], CFG, NOW)
    past = {a.key.subject: a for a in alerts if a.key.kind == "run_past_expiry"}
    assert set(past) == {"vision-long", "vision-queued"}
    assert "is running" in past["vision-long"].notice.body
    assert "is queued" in past["vision-queued"].notice.body
    expiring = next(a for a in alerts if a.key.kind == "quota_expiring")
    assert "vision-long" in expiring.notice.body


def test_budget_thresholds() -> None:
    q = quota(20, budget=100.0)
    done = LedgerEntry("a1", "r1", "vision", Purpose.TRAINING, "n1", "A100", 4,
                       NOW - 20 * 3600 * timedelta(seconds=1), NOW - timedelta(hours=1),
                       Outcome.SUCCESS)  # 4 GPUs x 19 h = 76 GPU-h
    before = LedgerEntry("a0", "r0", "vision", Purpose.TRAINING, "n1", "A100", 4,
                         NOW - 40 * DAY, NOW - 35 * DAY, Outcome.SUCCESS)  # before the window
    assert plan_alerts([q], [done, before], [], [], CFG, NOW) == []
    running = alloc("r2", gpus=2, started_h=3)  # + 6 GPU-h = 82%
    (a,) = plan_alerts([q], [done, before], [running], [], CFG, NOW)
    assert (a.key.kind, a.key.threshold, a.covers) == ("budget", 80, ())
    busy = alloc("r3", gpus=4, started_h=6)  # + 24 GPU-h = 106%
    (b,) = plan_alerts([q], [done], [running, busy], [], CFG, NOW)
    assert b.key.threshold == 100 and sorted(k.threshold for k in b.covers) == [80, 90]
    assert "budget is spent" in b.notice.body


def test_delivery_is_once_per_quota_and_threshold(records, smtp_server, webhook) -> None:
    teams = [Team("vision", notify_email="vision@example.org", notify_webhook=webhook.url),
             Team("nlp", notify_email="nlp@example.org")]
    channels = TeamChannels(email=EmailChannel(smtp_server.host, smtp_server.port))
    quotas = [quota(5), quota(10, qid="q9", team="nlp")]
    first = deliver_alerts(plan_alerts(quotas, [], [], [], CFG, NOW), teams, records, channels,
                           NOW)
    assert len(first.sent) == 2 and not first.failed
    assert {tuple(rc) for rc, _ in smtp_server.messages} == {("vision@example.org",),
                                                             ("nlp@example.org",)}
    assert len(webhook.posts) == 1 and webhook.posts[0]["gpu_pool"]["team"] == "vision"
    # a rerun the same day, and one a day later (still inside the same thresholds)
    for later in (NOW, NOW + DAY):
        again = deliver_alerts(plan_alerts(quotas, [], [], [], CFG, later), teams, records,
                               channels, later)
        assert again.sent == () and len(again.already) == 2
    assert len(smtp_server.messages) == 2 and len(webhook.posts) == 1
    # vision's quota crosses 1 day, nlp's 7: one new notice each; nothing repeats
    near = NOW + 4.7 * DAY
    third = deliver_alerts(plan_alerts(quotas, [], [], [], CFG, near), teams, records, channels,
                           near)
    assert sorted((k.subject, k.threshold) for k, _ in third.sent) == [("q1", 1), ("q9", 7)]
    statuses = {(n["subject"], n["threshold"]): n["status"] for n in records.notices()}
    assert statuses == {("q1", 15): "covered", ("q1", 7): "sent", ("q1", 1): "sent",
                        ("q9", 15): "sent", ("q9", 7): "sent"}
    assert len(smtp_server.messages) == 4


def test_failed_delivery_is_retried_next_run(records, webhook) -> None:
    teams = [Team("vision", notify_webhook=webhook.url)]
    channels = TeamChannels(email=None)
    alerts = plan_alerts([quota(5)], [], [], [], CFG, NOW)
    webhook.status = 503
    failed = deliver_alerts(alerts, teams, records, channels, NOW)
    assert failed.sent == () and "HTTP 503" in failed.failed[0][1]
    assert records.notices() == []  # the claim was given back
    webhook.status = 200
    retried = deliver_alerts(alerts, teams, records, channels, NOW)
    assert len(retried.sent) == 1 and len(webhook.posts) == 1


def test_a_file_webhook_gets_one_json_line_per_notice(records, tmp_path) -> None:
    target = tmp_path / "vision.jsonl"
    teams = [Team("vision", notify_webhook=f"file://{target}")]
    done = deliver_alerts(plan_alerts([quota(5)], [], [], [], CFG, NOW), teams, records,
                          TeamChannels(email=None), NOW)
    assert [ch for _, ch in done.sent] == [("webhook",)]
    (line,) = target.read_text().splitlines()
    notice = json.loads(line)
    assert notice["gpu_pool"]["team"] == "vision" and "expires" in notice["text"]


def test_an_unwritable_file_webhook_fails_clearly_and_is_retried(records, tmp_path) -> None:
    teams = [Team("vision", notify_webhook=f"file://{tmp_path}/missing-folder/v.jsonl")]
    failed = deliver_alerts(plan_alerts([quota(5)], [], [], [], CFG, NOW), teams, records,
                            TeamChannels(email=None), NOW)
    (_, error), = failed.failed
    assert error == (f"webhook file {tmp_path}/missing-folder/v.jsonl could not be written: "
                     "No such file or directory")
    assert records.notices() == []  # the claim was given back: the next run tries again


# ------------------------------------------------------------- the notice before the peak

BERLIN = Policy(off_peak=OffPeak((OffPeakWindow(20, 8),), "Europe/Berlin"))
PEAK = datetime(2026, 12, 2, 7, 0, tzinfo=UTC)  # 08:00 in Berlin (UTC+1 in December)


def off_peak_alloc(name: str, team: str, node: str = "n1", preemptible: bool = True,
                   off_peak: bool = True, grace: timedelta | None = None) -> Allocation:
    return Allocation(name, node, (0,), 1000, 0, 0, team, Purpose.PRETRAINING,
                      PriorityClass.BATCH, "A100", PEAK - timedelta(hours=8),
                      ends_by=PEAK - timedelta(minutes=5) if not preemptible else None,
                      preemptible=preemptible, off_peak=off_peak, grace=grace)


OFF_PEAK_WORK = [off_peak_alloc("cv-gang", "cv", "n1"), off_peak_alloc("cv-gang", "cv", "n2"),
                 off_peak_alloc("cv-short", "cv", preemptible=False),
                 off_peak_alloc("nlp-own", "nlp", off_peak=False),
                 off_peak_alloc("vis-pre", "vision", grace=timedelta(seconds=30))]


@pytest.mark.parametrize(("before_peak", "teams"), [
    (timedelta(minutes=20), ["cv", "vision"]),
    (timedelta(minutes=30), ["cv", "vision"]),   # exactly the notice
    (timedelta(minutes=31), []),                 # not yet
    (timedelta(minutes=-1), []),                 # the peak has come: the plan preempts
])
def test_off_peak_notice_window(before_peak: timedelta, teams: list[str]) -> None:
    alerts = plan_alerts([], [], OFF_PEAK_WORK, [], CFG, PEAK - before_peak, BERLIN)
    assert [a.notice.team for a in alerts] == teams
    assert all(a.key == NoticeKey("off_peak_ending", a.notice.team, 0, PEAK.isoformat())
               for a in alerts)


def test_off_peak_notice_lists_tasks_peak_and_fate() -> None:
    cv, vision = plan_alerts([], [], OFF_PEAK_WORK, [], CFG, PEAK - timedelta(minutes=20),
                             BERLIN)
    assert cv.notice.subject == "[gpu-pool] cv: 2 off-peak tasks end at the peak, 08:00 " \
                                "Europe/Berlin"
    assert "in 20 min" in cv.notice.body
    assert "  - cv-gang on n1: preempted at 08:00 with 120 s grace" in cv.notice.body
    assert "  - cv-short on n1: not preemptible: must end before the peak (its time limit " \
           "ends 06:55 UTC)" in cv.notice.body
    assert "vis-pre on n1: preempted at 08:00 with 30 s grace" in vision.notice.body
    assert dict(cv.notice.facts)["task_names"] == "cv-gang,cv-short"


def test_off_peak_notice_is_sent_once_per_team_and_peak(records, webhook) -> None:
    teams = [Team("cv", notify_webhook=webhook.url), Team("vision")]
    channels = TeamChannels(email=None)
    for minutes in (25, 10):  # two runs inside the notice window
        now = PEAK - timedelta(minutes=minutes)
        deliver_alerts(plan_alerts([], [], OFF_PEAK_WORK, [], CFG, now, BERLIN), teams, records,
                       channels, now)
    assert len(webhook.posts) == 1
    assert webhook.posts[0]["gpu_pool"]["kind"] == "off_peak_ending"
    assert "cv-gang" in webhook.posts[0]["text"]
    # The next night's peak is a new notice.
    tomorrow = PEAK + DAY - timedelta(minutes=10)
    deliver_alerts(plan_alerts([], [], OFF_PEAK_WORK, [], CFG, tomorrow, BERLIN), teams,
                   records, channels, tomorrow)
    assert len(webhook.posts) == 2
