"""Property-based run of the whole gpu-pool API (schemathesis from its OpenAPI schema).

Schemathesis generates requests for every operation of ``/gpu-pool/openapi.json`` — valid
and invalid parameters and bodies — and sends them to the real api-server as ``olga`` (op
role: allowed to change the fleet, so the write paths run too). No response may be a 5xx.
This module runs after the content checks of ``test_api`` and ``test_page`` because its
writes change the seeded store.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


@pytest.fixture(scope="module")
def api_schema(fleet_server):
    return schemathesis.openapi.from_url(f"{fleet_server.base}/gpu-pool/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_no_request_gets_a_server_error(case, fleet_server):
    response = case.call(base_url=f"{fleet_server.base}/gpu-pool",
                         headers={"Authorization": f"Bearer {fleet_server.token('olga')}"},
                         timeout=60)
    assert response.status_code < 500, (case.method, case.formatted_path, case.query,
                                        case.body, response.text)
    assert response.status_code != 401, response.text
