"""Run by test_reschedule_keeps_try in a fresh AIRFLOW_HOME: what the scheduler's DAG-run
step does with a GPU task rescheduled after a preemption, next to one up for retry.

Prints one JSON object: {"<state before>": [state after, try_number after], ...}.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

DAG_FILE = '''
from datetime import datetime, timedelta
from airflow.sdk import DAG, BaseOperator

class Train(BaseOperator):
    def execute(self, context):
        pass

with DAG("d", schedule=None, start_date=datetime(2026, 1, 1)):
    Train(task_id="train", retries=2, retry_delay=timedelta(0))
'''


def main(folder: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils import db
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    db.initdb()
    (folder / "d.py").write_text(DAG_FILE)
    with create_session() as session:
        session.add(DagBundleModel(name="b"))
    sync_bag_to_db(DagBag(dag_folder=str(folder)), "b", None)
    now = datetime.now(UTC)
    result = {}
    for i, before in enumerate((TaskInstanceState.UP_FOR_RESCHEDULE,
                                TaskInstanceState.UP_FOR_RETRY)):
        with create_session() as session:
            dag = SerializedDagModel.get_dag("d", session=session)
            when = now + timedelta(seconds=i)
            run = dag.create_dagrun(run_id=f"r{i}", run_after=when, logical_date=when,
                                    data_interval=(when, when), run_type=DagRunType.MANUAL,
                                    triggered_by=DagRunTriggeredByType.TEST,
                                    state=DagRunState.RUNNING, session=session)
            ti = run.get_task_instance("train", session=session)
            ti.try_number, ti.state = 1, before  # try 1 was preempted / failed
            ti.end_date = now - timedelta(minutes=1)
            session.flush()
            run.dag = dag
            # What the scheduler does for each running DAG run (_schedule_dag_run).
            schedulable, _ = run.update_state(session=session, execute_callbacks=False)
            run.schedule_tis(schedulable, session=session)
            session.flush()
            session.refresh(ti)
            result[str(before)] = [str(ti.state), ti.try_number]
    print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
