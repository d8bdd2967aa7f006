"""gpu-pool: Airflow as the scheduler of a shared GPU fleet reachable over SSH.

Layout: ``model`` and ``spec`` (the domain and its validation), ``engine`` (the pure
OR-Tools placement engine), ``store`` (the SQL store), ``cli`` (the ``gpu-pool`` command),
``sim`` (the trace simulator), and the Airflow adapters (``executor``, ``operators``,
``decorators``, ``plugin``).
"""

__version__ = "0.1.0"
