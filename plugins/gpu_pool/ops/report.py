"""The monthly per-team usage report, computed with pandas from plain frames.

Inputs
------
ledger      :func:`gpu_pool.ops.snapshot.ledger_frame` rows of the month (by ``ended_at``);
            ``metrics`` (JSON) may carry ``gpu_util_mean_pct`` and ``gpu_mem_peak_mib``,
            what the task's GPUs did while held.
quotas      the store's quotas (guaranteed GPUs, validity window).
reclaims    :class:`gpu_pool.ops.records.ReclaimRecord` rows of the month.
moves       :class:`gpu_pool.ops.crosszone.Move` rows: the cross-zone moves that ended in
            the month, with what the engine expected and whether they paid.

Terms
-----
utilisation of what was held
    GPU-hour-weighted mean of ``gpu_util_mean_pct`` over the entries that report it.
quota used vs guaranteed
    GPU-hours used under a quota's team/purpose/model in the month, against its
    guarantee: ``gpus`` × the hours of the month it was valid.
right-sizing finding
    An entry whose peak GPU memory (plus 10% headroom) fits a cheaper model of the policy
    (saving: the cost difference), or whose mean utilisation says fewer GPUs would have
    served (saving: the GPU-hours of the GPUs it did not need).

cross-zone move paid
    The home zone had no room for the task for at least as long as its data took to move
    (:mod:`gpu_pool.ops.crosszone`: measured from the holds on record, ``unknown`` while
    the home zone has not had room and the transfer time has not yet passed).

Outputs (:func:`write_report`): ``report/month=YYYY-MM/report.md``, ``teams.csv``,
``top_tasks.csv``, ``rightsizing.csv``, ``cross_zone.csv`` and ``gpu_hours.png``,
overwritten by a rerun.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import pandas as pd

from gpu_pool.model import Policy, Quota
from gpu_pool.objectstore import ObjectStore, export_key
from gpu_pool.ops import crosszone
from gpu_pool.ops.records import ReclaimRecord

MEM_HEADROOM = 1.10
TARGET_UTIL_PCT = 70.0
LOW_UTIL_PCT = 35.0


def month_bounds(month: str) -> tuple[datetime, datetime]:
    first = date.fromisoformat(f"{month}-01")
    nxt = date(first.year + first.month // 12, first.month % 12 + 1, 1)
    return (datetime(first.year, first.month, 1, tzinfo=UTC),
            datetime(nxt.year, nxt.month, 1, tzinfo=UTC))


def _metric(raw: str, name: str) -> float | None:
    value = json.loads(raw or "{}").get(name)
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class MonthlyReport:
    month: str
    teams: pd.DataFrame
    top_tasks: pd.DataFrame
    rightsizing: pd.DataFrame
    quotas: pd.DataFrame
    cross_zone: pd.DataFrame = field(default_factory=lambda: cross_zone_frame(()))


CROSS_ZONE_COLUMNS = ["request", "team", "from_zone", "to_zone", "size_gib", "started_at",
                      "transfer_s", "expected_wait_saved_s", "actual_wait_saved_s",
                      "home_room_at", "paid"]


def cross_zone_frame(moves: Sequence[crosszone.Move]) -> pd.DataFrame:
    """One row per cross-zone move (an infinite expected saving stays ``inf``)."""
    rows = [{"request": m.request, "team": m.team, "from_zone": m.from_zone,
             "to_zone": m.to_zone, "size_gib": m.size_gib,
             "started_at": m.started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
             "transfer_s": float(m.transfer_s),
             "expected_wait_saved_s": float(m.expected_wait_saved_s),
             "actual_wait_saved_s": float(m.actual_wait_saved_s),
             "home_room_at": (m.home_room_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
                              if m.home_room_at else "not seen"),
             "paid": m.paid} for m in moves]
    return pd.DataFrame(rows, columns=CROSS_ZONE_COLUMNS)


def right_size(ledger: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    rows = []
    for e in ledger.itertuples(index=False):
        peak = _metric(e.metrics, "gpu_mem_peak_mib")
        util = _metric(e.metrics, "gpu_util_mean_pct")
        current = policy.model_info(e.gpu_model) if e.gpu_model else None
        if peak is not None and current is not None:
            smaller = sorted((m for m in policy.gpu_models
                              if m.memory_mib >= peak * MEM_HEADROOM
                              and m.price_per_gpu_hour < current.price_per_gpu_hour),
                             key=lambda m: m.price_per_gpu_hour)
            if smaller and smaller[0].memory_mib < current.memory_mib:
                best = smaller[0]
                rows.append({"team": e.team, "task": e.request_name, "gpu_model": e.gpu_model,
                             "finding": f"peak {peak:.0f} MiB fits {best.name} "
                                        f"({best.memory_mib} MiB)",
                             "suggested": best.name, "gpu_hours": e.gpu_hours,
                             "gpu_hours_saved": 0.0,
                             "cost_saved": e.gpu_hours * (current.price_per_gpu_hour
                                                          - best.price_per_gpu_hour)})
        if util is not None and e.gpus > 1 and util < LOW_UTIL_PCT:
            needed = max(1, math.ceil(e.gpus * util / TARGET_UTIL_PCT))
            if needed < e.gpus:
                per_gpu = e.gpu_hours / e.gpus
                rows.append({"team": e.team, "task": e.request_name, "gpu_model": e.gpu_model,
                             "finding": f"mean utilisation {util:.0f}% on {e.gpus:g} GPUs: "
                                        f"{needed} would do",
                             "suggested": f"{needed} GPUs", "gpu_hours": e.gpu_hours,
                             "gpu_hours_saved": per_gpu * (e.gpus - needed),
                             "cost_saved": per_gpu * (e.gpus - needed) * e.price_per_gpu_hour})
    return pd.DataFrame(rows, columns=["team", "task", "gpu_model", "finding", "suggested",
                                       "gpu_hours", "gpu_hours_saved", "cost_saved"])


def quota_usage(ledger: pd.DataFrame, quotas: Sequence[Quota], month: str) -> pd.DataFrame:
    lo, hi = month_bounds(month)
    rows = []
    for q in quotas:
        start, end = max(q.valid_from, lo), min(q.expires_at, hi)
        hours = max(0.0, (end - start).total_seconds() / 3600)
        if hours <= 0:
            continue
        mask = (ledger["team"] == q.team) & (ledger["purpose"] == str(q.purpose))
        if q.gpu_model is not None:
            mask &= ledger["gpu_model"] == q.gpu_model
        used = float(ledger.loc[mask, "gpu_hours"].sum())
        guaranteed = q.gpus * hours
        rows.append({"team": q.team, "purpose": str(q.purpose), "model": q.gpu_model or "any",
                     "guaranteed_gpu_hours": guaranteed, "used_gpu_hours": used,
                     "used_pct": 100 * used / guaranteed if guaranteed else 0.0})
    return pd.DataFrame(rows, columns=["team", "purpose", "model", "guaranteed_gpu_hours",
                                       "used_gpu_hours", "used_pct"])


def build_report(month: str, ledger: pd.DataFrame, quotas: Sequence[Quota],
                 reclaims: Sequence[ReclaimRecord], policy: Policy,
                 top_n: int = 5, moves: Sequence[crosszone.Move] = ()) -> MonthlyReport:
    led = ledger.copy()
    led["util"] = [_metric(m, "gpu_util_mean_pct") for m in led["metrics"]]
    led["util"] = pd.to_numeric(led["util"], errors="coerce")
    led["util_weight"] = led["gpu_hours"].where(led["util"].notna(), 0.0)
    led["util_x"] = led["util"].fillna(0.0) * led["util_weight"]
    teams = led.groupby("team").agg(tasks=("request_name", "nunique"),
                                    gpu_hours=("gpu_hours", "sum"), cost=("cost", "sum"),
                                    util_x=("util_x", "sum"), util_w=("util_weight", "sum"))
    teams["utilisation_pct"] = (teams["util_x"] / teams["util_w"]).where(teams["util_w"] > 0)
    teams = teams.drop(columns=["util_x", "util_w"])
    reclaimed = pd.DataFrame([{"team": r.team, "idle": r.idle_gpu_hours} for r in reclaims
                              if r.team], columns=["team", "idle"])
    idle = reclaimed.groupby("team")["idle"].sum().astype(float)
    teams["idle_gpu_hours_reclaimed"] = idle.reindex(teams.index, fill_value=0.0)
    usage = quota_usage(led, quotas, month)
    per_team = usage.groupby("team")[["guaranteed_gpu_hours", "used_gpu_hours"]].sum()
    teams = teams.join(per_team.rename(columns={"used_gpu_hours": "quota_used_gpu_hours"}))
    sizing = right_size(led, policy)
    teams["rightsizing_gpu_hours_saved"] = sizing.groupby("team")["gpu_hours_saved"].sum()
    teams["rightsizing_cost_saved"] = sizing.groupby("team")["cost_saved"].sum()
    for col in ("guaranteed_gpu_hours", "quota_used_gpu_hours", "rightsizing_gpu_hours_saved",
                "rightsizing_cost_saved"):
        teams[col] = pd.to_numeric(teams[col], errors="coerce").astype(float).fillna(0.0)
    top = (led.groupby(["team", "request_name"], as_index=False)[["gpu_hours", "cost"]].sum()
           .sort_values(["team", "gpu_hours", "request_name"], ascending=[True, False, True])
           .groupby("team").head(top_n).reset_index(drop=True))
    return MonthlyReport(month, teams.reset_index(), top, sizing, usage,
                         cross_zone_frame(moves))


def _md_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "_none_\n"
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                                       for v in row) + " |")
    return "\n".join(lines) + "\n"


def to_markdown(report: MonthlyReport) -> str:
    parts = [f"# GPU usage report, {report.month}\n", "## Teams\n", _md_table(report.teams)]
    moves = report.cross_zone
    paid = int((moves["paid"] == "yes").sum())
    lost = int((moves["paid"] == "no").sum())
    parts += ["\n## Cross-zone moves\n\n",
              f"{len(moves)} moves, {moves['transfer_s'].sum() / 3600:.1f} h of transfer: "
              f"{paid} paid, {lost} did not, {len(moves) - paid - lost} not known yet. "
              "A move paid when its home zone had no room for it for at least as long as "
              "its data took to move (measured from the holds on record).\n\n",
              _md_table(moves)]
    for team in report.teams["team"]:
        parts.append(f"\n## {team}\n")
        parts.append("\n### Top tasks\n")
        parts.append(_md_table(report.top_tasks[report.top_tasks["team"] == team]))
        parts.append("\n### Quotas\n")
        parts.append(_md_table(report.quotas[report.quotas["team"] == team]))
        parts.append("\n### Right-sizing\n")
        parts.append(_md_table(report.rightsizing[report.rightsizing["team"] == team]))
    return "".join(parts)


def plot_png(report: MonthlyReport) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(report.teams["team"])
    ax.bar(names, report.teams["gpu_hours"], label="GPU-hours used")
    ax.bar(names, report.teams["guaranteed_gpu_hours"], fill=False, edgecolor="black",
           label="guaranteed")
    ax.set_title(f"GPU-hours per team, {report.month}")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def write_report(objstore: ObjectStore, report: MonthlyReport, now: datetime) -> list[str]:
    """The report's files under ``report/month=YYYY-MM/`` (under an ``exported_at=`` folder
    of their own where the bucket keeps no history, so a rerun replaces nothing), and each
    team's rows under ``by_team/team=<team>/year=<YYYY>/report/month=YYYY-MM/``."""
    folder = f"report/month={report.month}"
    exported_at = None if objstore.keeps_history() else now

    def key(name: str) -> str:
        return export_key(folder, name, exported_at)

    by_team = []
    year = report.month[:4]
    for team in sorted(str(t) for t in report.teams.get("team", [])):
        team_folder = f"by_team/team={team}/year={year}/report/month={report.month}"
        for name, frame in (("teams.csv", report.teams), ("top_tasks.csv", report.top_tasks),
                            ("rightsizing.csv", report.rightsizing)):
            rows = frame[frame["team"] == team] if "team" in frame.columns else frame.iloc[0:0]
            by_team.append(objstore.put_bytes(export_key(team_folder, name, exported_at),
                                              rows.to_csv(index=False).encode(), "text/csv"))
    return [
        objstore.put_bytes(key("report.md"), to_markdown(report).encode(), "text/markdown"),
        objstore.put_bytes(key("teams.csv"), report.teams.to_csv(index=False).encode(),
                           "text/csv"),
        objstore.put_bytes(key("top_tasks.csv"),
                           report.top_tasks.to_csv(index=False).encode(), "text/csv"),
        objstore.put_bytes(key("rightsizing.csv"),
                           report.rightsizing.to_csv(index=False).encode(), "text/csv"),
        objstore.put_bytes(key("cross_zone.csv"),
                           report.cross_zone.to_csv(index=False).encode(), "text/csv"),
        objstore.put_bytes(key("gpu_hours.png"), plot_png(report), "image/png"),
        *by_team,
    ]
