"""TaskFlow decorators of gpu-pool: ``@task.gpu`` (:mod:`gpu_pool.decorators.gpu`)."""
