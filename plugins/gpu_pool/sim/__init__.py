"""The trace simulator: the placement engine and the published baselines over real traces,
in virtual time.

``trace`` reads the Alibaba openb CSVs, ``fleet`` referees capacity, ``baselines`` holds
random / firstfit / bestfit / fgd, ``engine_policy`` drives :mod:`gpu_pool.engine`,
``packing`` is the FGD packing protocol, ``replay`` a working cluster over time, ``runner``
what the CLI and the report share.
"""
