"""Reproduction jobs (issue 18, items 2-3): the ``reproduction_jobs`` table, its API, the jobs
created automatically when triage stays weak, and the queue that workers claim them from.

A job's work itself (build the proxy, reproduce the candidate classes on the pool, extend the
library, re-triage) is the executor's, ``moeproxy.service.jobs.executor.execute(job, ctx)``, which
the worker imports only when it runs a job.  This package must not import the executor at load
time, nor torch or Ray.
"""
