"""What the GPU pool executor needs beyond Airflow's executor interface, one step a module.

``naming``
    the store request name of a task instance try, and the ``gpu://`` external executor id.
``admission``
    admit newly queued workloads as store requests (adopting one the store already has).
``cycle``
    one placement cycle (admit, snapshot, plan, apply, release) over the store and the
    engine; it knows nothing of Airflow.
``starting``
    start a placed workload's task process with its allocation in the environment.
``watching``
    reap task processes, watch deferred, rescheduled and adopted tasks, stop dispossessed
    ones, reconcile allocations nobody watches.
``preemption``
    stop preempted remote jobs with grace (detached kills from a thread pool, an outbox in
    the store), and let a preempted deferred task's resume conclude at once.
``airflow_reads``
    the few metadata-database reads the executor makes (task states, asset events).
``release``
    give a task's GPUs back the moment its remote job ends.
"""
