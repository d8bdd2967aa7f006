"""Tests of the Airflow adapters: executor support and end to end on a real scheduler."""
