"""Triggers of gpu-pool: :class:`~gpu_pool.triggers.remote_job.GpuRemoteJobTrigger`."""
