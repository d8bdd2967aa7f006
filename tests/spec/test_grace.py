"""The per-task preemption grace: parsed with its bound, carried from the operator."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpu_pool.errors import SpecError
from gpu_pool.operators.request_spec import request_spec
from gpu_pool.spec import parse_request


@pytest.mark.parametrize(("value", "seconds"), [(90, 90.0), ("2m", 120.0), ("1h", 3600.0),
                                                (timedelta(seconds=5), 5.0)])
def test_grace_is_a_bounded_duration(value: object, seconds: float) -> None:
    request = parse_request({"name": "r", "team": "nlp", "grace": value})
    assert request.grace == timedelta(seconds=seconds)
    assert parse_request({"name": "r", "team": "nlp"}).grace is None  # the policy's


@pytest.mark.parametrize("value", [0, -5, "61m", "soon", 0.5, True])
def test_a_bad_grace_names_the_field_and_the_bound(value: object) -> None:
    with pytest.raises(SpecError) as caught:
        parse_request({"name": "r", "team": "nlp", "grace": value})
    assert caught.value.field == "grace"
    assert "3600s" in str(caught.value) and "SIGTERM" in str(caught.value)


def test_the_task_spec_carries_grace_in_seconds() -> None:
    assert request_spec("t", {"team": "nlp", "grace": "90s"})["grace"] == 90.0
    with pytest.raises(SpecError, match="task 't'"):
        request_spec("t", {"team": "nlp", "grace": "2h"})
