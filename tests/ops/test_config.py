"""Ops settings: defaults, valid overrides, and bad values refused with field and fix."""

from __future__ import annotations

import pytest

from gpu_pool.errors import SpecError
from gpu_pool.ops.config import OpsConfig


def test_defaults_match_the_policy() -> None:
    from gpu_pool.model import Policy

    cfg = OpsConfig.from_json(None)
    assert cfg.alert_days == Policy().alert_days and cfg.budget_alert_pcts == (80, 90, 100)


def test_overrides() -> None:
    cfg = OpsConfig.from_json('{"alert_days": [3, 30, 3], "idle_util_pct": 10, '
                              '"idle_action": "end", "s3_conn_id": "minio"}')
    assert cfg.alert_days == (30, 3) and cfg.idle_util_pct == 10.0
    assert (cfg.idle_action, cfg.s3_conn_id) == ("end", "minio")


@pytest.mark.parametrize(("text", "field", "expected"), [
    ('{"alert_day": [1]}', "gpu_pool_ops.alert_day", "one of the keys"),
    ('{"alert_days": []}', "gpu_pool_ops.alert_days", "non-empty list of integers from 1 to 3,650"),
    ('{"alert_days": [0, 7]}', "gpu_pool_ops.alert_days", "integers from 1 to"),
    ('{"budget_alert_pcts": "80"}', "gpu_pool_ops.budget_alert_pcts", "list"),
    ('{"idle_minutes": -1}', "gpu_pool_ops.idle_minutes", "an integer from 0 to 525,600"),
    ('{"idle_minutes": true}', "gpu_pool_ops.idle_minutes", "an integer from 0 to 525,600"),
    ('{"idle_util_pct": 101}', "gpu_pool_ops.idle_util_pct", "0 to 100"),
    ('{"idle_action": "kill"}', "gpu_pool_ops.idle_action", "warn or end"),
    ('{"catchup_max_periods": 0}', "gpu_pool_ops.catchup_max_periods", "an integer from 1 to 36,500"),
    ('{"smtp_conn_id": ""}', "gpu_pool_ops.smtp_conn_id", "Airflow connection id"),
    ('[1, 2]', "gpu_pool_ops", "a JSON object"),
    ('{nope', "gpu_pool_ops", "a JSON object"),
])
def test_bad_settings(text: str, field: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        OpsConfig.from_json(text)
    assert info.value.field == field and expected in info.value.expected
