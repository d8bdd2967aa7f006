"""Simulated GPU nodes: a fake ``nvidia-smi`` and an embedded SSH server.

* :mod:`gpu_pool.simnode.gpus` — simulated devices and the node directory holding them;
* :mod:`gpu_pool.simnode.nvidia_smi` — the fake ``nvidia-smi`` (real CSV format);
* :mod:`gpu_pool.simnode.server` — :class:`SimNode`, an asyncssh server on loopback that
  runs each command with ``bash`` and the node's fake ``nvidia-smi`` first on ``PATH``, so
  the demo's fleet needs neither root nor sshd. It is a normal SSH node for the runner.
"""
