"""Boundary validation: what each accepted form means, and what each refusal says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_pool.errors import SpecError
from gpu_pool.model import Gpu, Node, PriorityClass
from gpu_pool.spec import (
    parse_cpu_milli,
    parse_datetime,
    parse_duration,
    parse_memory_mib,
    parse_nodes_document,
    parse_request,
    parse_team,
)


@pytest.mark.parametrize(("text", "mib"), [
    (512, 512), ("512", 512), ("512M", 512), ("512MiB", 512), ("16G", 16384),
    ("16GB", 16384), ("16GiB", 16384), ("1.5G", 1536), ("1T", 1048576), ("2048K", 2),
])
def test_memory_units(text: object, mib: int) -> None:
    assert parse_memory_mib(text, "memory") == mib


@pytest.mark.parametrize("bad", ["", "lots", "16 gigs", "-1G", -5, 1.5, True, "G16"])
def test_memory_refusals_name_the_field(bad: object) -> None:
    with pytest.raises(SpecError) as error:
        parse_memory_mib(bad, "min_gpu_memory")
    assert error.value.field == "min_gpu_memory"
    assert "16GiB" in str(error.value)


@pytest.mark.parametrize(("text", "delta"), [
    ("6h", timedelta(hours=6)), ("90m", timedelta(minutes=90)), ("1h30m", timedelta(minutes=90)),
    ("45s", timedelta(seconds=45)), ("2d", timedelta(days=2)), (3600, timedelta(hours=1)),
    ("3600", timedelta(hours=1)), (timedelta(minutes=5), timedelta(minutes=5)),
])
def test_durations(text: object, delta: timedelta) -> None:
    assert parse_duration(text, "time_limit") == delta


@pytest.mark.parametrize("bad", ["0", 0, "-1h", "soon", "", "h", timedelta(0), float("nan")])
def test_duration_refusals(bad: object) -> None:
    with pytest.raises(SpecError, match="time_limit: got .*; expected a positive duration"):
        parse_duration(bad, "time_limit")


@pytest.mark.parametrize(("value", "milli"), [(8, 8000), (0.5, 500), ("500m", 500), ("2", 2000)])
def test_cpu(value: object, milli: int) -> None:
    assert parse_cpu_milli(value) == milli


def test_naive_times_are_utc() -> None:
    assert parse_datetime("2026-12-31", "expires_at") == datetime(2026, 12, 31, tzinfo=UTC)
    assert parse_datetime("2026-12-31T18:00:00Z", "x").hour == 18


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+00:01", "9999-12-31T23:59:59-00:01"])
def test_a_time_that_leaves_the_calendar_in_utc_is_a_spec_error(value: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_datetime(value, "expires_at")
    assert err.value.field == "expires_at" and value in str(err.value)


@pytest.mark.parametrize(("fields", "shape"), [
    ({"gpus": 4}, (1, 4, 1000)),
    ({"gpu_share": 250}, (1, 1, 250)),
    ({"nodes": 2, "gpus_per_node": 8}, (2, 8, 1000)),
    ({"nodes": 2, "gpus": 16}, (2, 8, 1000)),
    ({"nodes": 2, "gpus": 16, "gpus_per_node": 8}, (2, 8, 1000)),
])
def test_request_shapes(fields: dict, shape: tuple[int, int, int]) -> None:
    r = parse_request({"name": "r", "team": "t", **fields})
    assert (r.nodes, r.gpus, r.gpu_milli) == shape


@pytest.mark.parametrize(("fields", "field"), [
    ({"nodes": 2, "gpus": 3}, "gpus"),
    ({"nodes": 2, "gpus": 10, "gpus_per_node": 4}, "gpus"),
    ({"gpu_share": 250, "gpus": 2}, "gpus"),
    ({"gpu_share": 250, "nodes": 2}, "gpu_share"),
    ({"dataset_zone": "eu"}, "dataset"),
    ({"gpuz": 2}, "gpuz"),
    ({"data_ready": "maybe"}, "data_ready"),
])
def test_request_contradictions_are_refused(fields: dict, field: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_request({"name": "r", "team": "t", **fields})
    assert error.value.field == field


def test_defaults_batch_is_preemptible() -> None:
    r = parse_request({"name": "r", "team": "t", "priority": "BATCH"})
    assert r.priority is PriorityClass.BATCH and r.preemptible
    assert not parse_request({"name": "r", "team": "t"}).preemptible


def test_fleet_bound_names_the_largest_node() -> None:
    fleet = [Node("big", tuple(Gpu(i, "A100", 81920) for i in range(8)), 1000, 1000),
             Node("small", (Gpu(0, "T4", 16384),), 1000, 1000)]
    with pytest.raises(SpecError, match="at most 8 per node .*'big'"):
        parse_request({"name": "r", "team": "t", "gpus": 9}, nodes=fleet)
    with pytest.raises(SpecError, match="nodes: got 2; expected at most 1"):
        parse_request({"name": "r", "team": "t", "nodes": 2, "gpus_per_node": 4}, nodes=fleet)


def test_nodes_document_gpu_memory_from_catalog_or_override() -> None:
    nodes = parse_nodes_document(
        "nodes:\n  - {name: a, gpu_model: a100, gpus: 2}\n"
        "  - {name: b, gpu_model: T4, gpus: 1, gpu_memory: 15GiB, state: draining}\n")
    assert [g.memory_mib for g in nodes[0].gpus] == [81920, 81920]
    assert nodes[0].gpu_model == "A100"
    assert nodes[1].gpus[0].memory_mib == 15360 and nodes[1].state == "draining"


@given(st.integers(min_value=1, max_value=999))
def test_any_valid_share_round_trips(milli: int) -> None:
    r = parse_request({"name": "r", "team": "t", "gpu_share": milli})
    assert r.is_share and r.total_gpu_milli == milli


@given(st.integers().filter(lambda v: v < 1 or v > 999))
def test_any_share_outside_the_range_is_refused(milli: int) -> None:
    with pytest.raises(SpecError) as error:
        parse_request({"name": "r", "team": "t", "gpu_share": milli})
    assert error.value.field == "gpu_share"


@pytest.mark.parametrize("target", ["https://hooks.example.com/T0/B1", "conn:vision_slack",
                                    "file:///var/log/gpu-pool/vision.jsonl"])
def test_team_webhook_targets_the_channels_deliver_to(target: str) -> None:
    assert parse_team({"name": "vision", "notify_webhook": target}).notify_webhook == target


@pytest.mark.parametrize("target", ["ftp://x/y", "file://relative/path", "conn:", "hooks"])
def test_team_webhook_refuses_what_no_channel_takes(target: str) -> None:
    with pytest.raises(SpecError, match=r"^notify_webhook: got .*; expected an http:// or "
                                        r"https:// URL, conn:<Airflow connection id>"):
        parse_team({"name": "vision", "notify_webhook": target})
