"""The closed loop's work (issue 18): proxy, reproductions and a per-model library layer for a weak
match (``pipeline``). The jobs that carry it out (queue, workers, API) live in ``service.jobs``."""
