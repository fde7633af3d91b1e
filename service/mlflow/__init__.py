"""MLflow-compatible ingestion: enough of MLflow's tracking REST API (``/api/2.0/mlflow/...``)
that an unchanged MLflow client — verl's or TRL's MLflow logger, or plain ``mlflow.start_run()``
and ``mlflow.log_metrics`` — with ``MLFLOW_TRACKING_URI=http://host:port/mlflow`` and
``MLFLOW_TRACKING_TOKEN=<moeproxy token>`` sends its metrics here.

Mapping: an MLflow experiment is a namespace of runs inside the token's project; an MLflow run
is a moeproxy run named ``<experiment>/<run name>`` (plain ``<run name>`` in the Default
experiment), so a restarted job that reuses its run name resumes its run as with ``POST
/api/v1/runs``.  Metrics go through the same idempotent ingestion as ``/api/v1`` (and wake live
triage the same way).  Errors answer in MLflow's shape (``error_code``, ``message``).  Imports
service parts only.
"""
