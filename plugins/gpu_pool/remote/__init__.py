"""Running GPU jobs on nodes over SSH.

* :mod:`gpu_pool.remote.job` — pure command builders and parsers (the wrapper that runs a
  command in its own process group with ``CUDA_VISIBLE_DEVICES`` exported inside it; poll,
  log, kill and cleanup commands);
* :mod:`gpu_pool.remote.allocation` — how the executor hands an allocation to a task
  process (``GPU_POOL_*`` environment variables);
* :mod:`gpu_pool.remote.runner` — :class:`RemoteJobRunner`, the sync SSH runner over the
  Airflow SSH provider's ``SSHHook``.
"""
