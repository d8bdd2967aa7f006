"""Fleet chores by hand: ``alerts run``, ``reclaim``, ``ledger export``, ``report``.

The same core calls as the DAGs (:mod:`gpu_pool.ops.runs`). Settings come from
``--config JSON`` (the keys of :mod:`gpu_pool.ops.config`). Channels and the object store
come from Airflow connections (``gpu_pool_smtp``, ``gpu_pool_s3``, or those named in the
config); ``--smtp-host``/``--smtp-port`` name an unauthenticated relay instead. No secret is
ever taken from the command line.
"""

from __future__ import annotations

import argparse
from datetime import UTC, date, datetime
from pathlib import Path

from gpu_pool import limits
from gpu_pool.cli import add_command, add_group
from gpu_pool.cli.context import open_store, policy
from gpu_pool.cli.output import emit
from gpu_pool.errors import shown
from gpu_pool.notify.channels import EmailChannel, TeamChannels
from gpu_pool.ops.config import OpsConfig
from gpu_pool.spec import check_output_folder, parse_email, parse_int, parse_text

ACTOR = "cli"


def register(subparsers: argparse._SubParsersAction) -> None:
    alerts = add_group(subparsers, "alerts", "quota expiry and budget notices")
    p = add_command(alerts, "run", "send due quota notices (each once per quota and threshold)")
    _config_arg(p)
    p.add_argument("--dry-run", action="store_true", help="show the notices, send nothing")
    p.add_argument("--smtp-host", help="an SMTP relay without login (else the Airflow "
                                       "connection from the config)")
    p.add_argument("--smtp-port", default="25")
    p.add_argument("--smtp-from", default="gpu-pool@localhost")
    p.set_defaults(func=alerts_run)

    p = add_command(subparsers, "reclaim", "release GPUs of finished tasks; flag idle holds")
    _config_arg(p)
    p.add_argument("--liveness", choices=("airflow-db", "none"), default="airflow-db",
                   help="how to tell whether a task still runs: Airflow's metadata database, "
                        "or none (release nothing, only report idle holds)")
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.set_defaults(func=reclaim_run)

    ledger = add_group(subparsers, "ledger", "the usage ledger")
    p = add_command(ledger, "export", "write ledger and state snapshots to object storage")
    _config_arg(p)
    p.add_argument("--day", action="append", type=_day, metavar="YYYY-MM-DD",
                   help="export exactly this day (repeatable); default: every day due")
    p.set_defaults(func=ledger_export)

    p = add_command(subparsers, "report", "the monthly per-team usage report")
    _config_arg(p)
    p.add_argument("--month", type=_month, help="YYYY-MM (default: last month)")
    p.add_argument("--out", type=Path, help="also write report.md and the CSVs here")
    p.add_argument("--upload", action="store_true", help="write it to object storage too")
    p.set_defaults(func=report_run)


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="JSON", help="ops settings as a JSON object")


def _date_in_years(value: str, text: str, what: str) -> date:
    """``text`` as a date from EARLIEST to LATEST; an argparse type error naming ``value``."""
    expected = f"{what} from {limits.EARLIEST:%Y} to {limits.LATEST.year - 1}"
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {shown(value)}; expected {expected}") from None
    if not limits.EARLIEST.date() <= day < limits.LATEST.date():
        raise argparse.ArgumentTypeError(f"got {shown(value)}; expected {expected}")
    return day


def _day(value: str) -> date:
    return _date_in_years(value, value, "a date YYYY-MM-DD")


def _month(value: str) -> str:
    # Only YYYY-MM: fromisoformat reads more forms ('2026-1201' + '-01' among them).
    _date_in_years(value, f"{value}-01" if len(value) == 7 else "", "a month YYYY-MM")
    return value


def _config(args: argparse.Namespace) -> OpsConfig:
    return OpsConfig.from_json(args.config)


def _now() -> datetime:
    return datetime.now(UTC)


def alerts_run(args: argparse.Namespace) -> int:
    from gpu_pool.ops import alerts, runs

    config, store, now = _config(args), open_store(args), _now()
    if args.dry_run:
        quotas = store.list_quotas()
        since = min((q.valid_from for q in quotas), default=now)
        planned = alerts.plan_alerts(quotas, store.ledger(since=since, until=now),
                                     store.active_allocations(), store.pending_requests(),
                                     config, now)
        emit(args.json, [{"kind": a.key.kind, "subject": a.key.subject,
                          "threshold": a.key.threshold, "team": a.notice.team,
                          "title": a.notice.subject} for a in planned],
             ("kind", "subject", "threshold", "team", "title"), empty="no notices due")
        return 0
    if args.smtp_host is not None:
        channels = TeamChannels(EmailChannel(
            parse_text(args.smtp_host, "smtp-host", max_chars=253, spaces=False,
                       what="a host name"),
            parse_int(args.smtp_port, "smtp-port", minimum=1, maximum=65535),
            parse_email(args.smtp_from, "smtp-from", local=True), use_ssl=False))
    else:
        from gpu_pool.ops.airflow_adapters import team_channels

        channels = team_channels(config)
    result = runs.run_alerts(store, channels, config, now)
    rows = ([{"kind": k.kind, "subject": k.subject, "threshold": k.threshold,
              "status": "sent via " + ",".join(ch)} for k, ch in result.sent]
            + [{"kind": k.kind, "subject": k.subject, "threshold": k.threshold,
                "status": "failed: " + err} for k, err in result.failed])
    emit(args.json, rows, ("kind", "subject", "threshold", "status"),
         empty=f"no new notices ({len(result.already)} already sent)")
    return 1 if result.failed else 0


def reclaim_run(args: argparse.Namespace) -> int:
    from gpu_pool.ops import reclaim, runs
    from gpu_pool.ops.records import engine_of
    from gpu_pool.ops.storeviews import gpu_samples, task_links

    config, store, now = _config(args), open_store(args), _now()
    if args.liveness == "airflow-db":
        from gpu_pool.ops.airflow_adapters import metadata_liveness as liveness
    else:
        def liveness(links):  # noqa: ANN001, ANN202 - the Liveness signature
            return {name: None for name in links}
    if args.dry_run:
        from datetime import timedelta

        allocations = store.active_allocations()
        engine = engine_of(store)
        links = task_links(engine, sorted({a.request_name for a in allocations}))
        plan = reclaim.plan_sweep(
            allocations, liveness(links),
            gpu_samples(engine, now - timedelta(minutes=config.idle_minutes), now), (),
            config, now)
        rows = ([{"action": "would release", "task": h.request_name,
                  "why": f"task is {h.state}"} for h in plan.dead]
                + [{"action": "idle", "task": h.request_name,
                    "why": f"idle since {h.idle_since:%H:%M}"} for h in plan.idle])
        emit(args.json, rows, ("action", "task", "why"),
             empty=f"nothing to reclaim ({len(plan.kept)} holds alive)")
        return 0
    channels = None
    if args.liveness == "airflow-db":  # Airflow is configured here: notify through it too
        from gpu_pool.ops.airflow_adapters import team_channels

        channels = team_channels(config)
    result = runs.run_sweep(store, liveness, channels, config, now, actor=ACTOR)
    emit(args.json, [{"action": r.action, "task": r.request_name, "node": r.node,
                      "gpus": r.gpus, "held_s": r.held_seconds, "why": r.reason}
                     for r in result.records],
         ("action", "task", "node", "gpus", "held_s", "why"),
         empty=f"nothing to reclaim ({len(result.plan.kept)} holds alive)")
    return 0


def ledger_export(args: argparse.Namespace) -> int:
    from gpu_pool.ops import runs
    from gpu_pool.ops.airflow_adapters import object_store

    config, store, now = _config(args), open_store(args), _now()
    done = runs.run_snapshots(store, object_store(config), config, now, days=args.day)
    # The ledger's key shows where this export went (an exported_at= folder of its own on a
    # bucket without versioning).
    emit(args.json, [{"period": d.period.isoformat(), "ledger_rows": d.ledger_rows,
                      "objects": len(d.keys), "ledger_object": d.keys[0]} for d in done],
         ("period", "ledger_rows", "objects", "ledger_object"), empty="nothing to export")
    return 0


def report_run(args: argparse.Namespace) -> int:
    from gpu_pool.ops import report, runs

    config, now = _config(args), _now()
    if args.out is not None:
        check_output_folder(args.out, "out")
    store = open_store(args)
    month = args.month or runs.previous_month(now)
    if args.upload:
        from gpu_pool.ops.airflow_adapters import object_store

        built, _ = runs.run_report(store, object_store(config), month, policy(store), now)
    else:
        built = runs.build_monthly_report(store, month, policy(store))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(report.to_markdown(built))
        built.teams.to_csv(args.out / "teams.csv", index=False)
        built.top_tasks.to_csv(args.out / "top_tasks.csv", index=False)
        built.rightsizing.to_csv(args.out / "rightsizing.csv", index=False)
        (args.out / "gpu_hours.png").write_bytes(report.plot_png(built))
    rows = built.teams.to_dict("records")
    emit(args.json, rows, ("team", "tasks", "gpu_hours", "cost", "utilisation_pct",
                           "quota_used_gpu_hours", "guaranteed_gpu_hours",
                           "idle_gpu_hours_reclaimed", "rightsizing_gpu_hours_saved"),
         empty=f"no usage in {month}")
    return 0
