"""Named job errors (the app turns a ServiceError into a JSON ``detail`` with its status)."""

from __future__ import annotations

from moeproxy.service.errors import NotFound, ServiceError


class JobNotFound(NotFound):
    def __init__(self, job_id: object):
        super().__init__(f"job {job_id} not found")


class JobConflict(ServiceError):
    """The request cannot be honoured in the current state (an open job exists, the cap is reached,
    the run has no model, the job has finished)."""

    status_code = 409


class NoModelUri(JobConflict):
    def __init__(self, run_id: int):
        super().__init__(
            f"run {run_id} has no model_uri: set the checkpoint the workers should read with "
            f"PATCH /api/v1/runs/{run_id} {{\"model_uri\": ...}} first"
        )


class OpenJobExists(JobConflict):
    def __init__(self, job_id: int, run_id: int):
        super().__init__(f"job {job_id} is already open for run {run_id} and its model_uri; cancel it first")
        self.job_id = job_id


class OpenJobCapReached(JobConflict):
    def __init__(self, cap: int):
        super().__init__(
            f"the project has {cap} open jobs (MOEPROXY_JOB_MAX_OPEN_PER_PROJECT={cap}): "
            "wait for one to finish or cancel one"
        )


class JobFinished(JobConflict):
    def __init__(self, job_id: int, state: str):
        super().__init__(f"job {job_id} has already finished ({state}); nothing to cancel")
