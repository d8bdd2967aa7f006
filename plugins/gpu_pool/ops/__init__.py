"""The fleet's chores, as core functions that know nothing of Airflow.

``alerts`` (quota expiry, runs past expiry, budgets), ``reclaim`` (dead and idle holds,
foreign processes), ``snapshot`` (ledger and state to object storage), ``report`` (the
monthly per-team report), over ``records`` (the ops tables) and ``config`` (settings).
Each takes the store, the object store and channels as arguments and ``now`` from the caller.
"""
