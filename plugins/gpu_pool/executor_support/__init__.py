"""What the GPU pool executor needs beyond Airflow's executor interface.

``naming``
    the store request name of a task instance try, and the ``gpu://`` external executor id.
``cycle``
    one placement cycle (admit, snapshot, plan, apply, release) over the store and the
    engine; it knows nothing of Airflow.
``airflow_reads``
    the few metadata-database reads the executor makes (task states, asset events).
"""
