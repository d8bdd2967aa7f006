"""Property-based run of the whole gpu-pool API (schemathesis from its OpenAPI schema).

Schemathesis generates requests for every operation of ``/gpu-pool/openapi.json`` — valid
(positive) and invalid (negative) parameters and bodies — and they go to the real
api-server as ``olga`` (op role: allowed to change the fleet, so the write paths run too).
No response may be a 5xx, and none a 401 (the token is valid). This module runs after the
content checks of ``test_api`` and ``test_page`` because its writes change the seeded store.

Schemathesis' own pytest plugin (``from_fixture``) does not run under pytest 9, so the
operations are driven with hypothesis directly from ``APIOperation.as_strategy``.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
EXAMPLES = 20


@pytest.fixture(scope="module")
def api_schema(fleet_server):
    spec = httpx.get(f"{fleet_server.base}/gpu-pool/openapi.json", timeout=60).json()
    return schemathesis.openapi.from_dict(spec)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_generated_request_gets_a_server_error(fleet_server, api_schema, mode):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 10
    base = f"{fleet_server.base}/gpu-pool"
    headers = {"Authorization": f"Bearer {fleet_server.token('olga')}"}
    seen: dict[int, int] = {}

    for operation in operations:
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case):
            response = case.call(base_url=base, headers=headers, timeout=60)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (case.method, case.formatted_path, case.query,
                                                case.body, response.text)
            assert response.status_code != 401, response.text

        check()
    assert sum(seen.values()) >= len(operations)
    if mode is GenerationMode.NEGATIVE:
        assert any(400 <= code < 500 for code in seen), seen
    else:
        assert seen.get(200, 0) > 0, seen
