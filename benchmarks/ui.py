"""Triage page render time: the runs list with 1,000 runs and the page of a 5,000-step x 20-metric run.

Target (issue 8): <= 1 s server time each.  Server time is measured in-process through the app
(FastAPI TestClient: routing, the database reads, the plot data, Jinja rendering, the response
body) without a network hop; medians of repeats.  The evaluation shown on the page is made by the
real signature engine beforehand (its own latency is reported separately, it does not run on the
page).  Data are synthetic: 1,000 runs each with a stored evaluation of 11 ranked classes, and one
run of 5,000 steps x 20 verl-named metrics (NaN/inf included) ingested through the repository.

    OMP_NUM_THREADS=1 python benchmarks/ui.py [--backends sqlite,postgres] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

N_RUNS = 1000
N_STEPS = 5000
N_METRICS = 20
OPERATOR_TOKEN = "ui-benchmark-operator"  # MOEPROXY_UI_TOKEN of the benchmark's app
PG_URL = os.environ.get("MOEPROXY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def build_library(path: Path) -> Path:
    from moeproxy.signatures.api import FingerprintLibrary, save_library
    from moeproxy.signatures.build import build_fingerprint
    from moeproxy.signatures.synthetic import synthetic_run

    classes = (
        "healthy",
        "rollout_logp_precision",
        "gradient_overflow",
        "lr_misconfiguration",
        "stale_weight_sync",
        "reward_fault",
        "kl_misconfiguration",
        "routing_mismatch",
    )
    twins = [synthetic_run("healthy", steps=60, seed=s) for s in (1, 2)]
    fps = [
        build_fingerprint(
            c, [synthetic_run(c, steps=60, seed=s) for s in (1, 2)], [] if c == "healthy" else twins
        )
        for c in classes
    ]
    return save_library(FingerprintLibrary(tuple(fps)), path)


def metric_names() -> list[str]:
    from moeproxy.signatures.synthetic import METRICS

    extra = [f"timing_s/stage_{i}" for i in range(N_METRICS - len(METRICS))]
    return [*METRICS, *extra][:N_METRICS]


def big_run_batch():
    from moeproxy.service.metrics.codec import ParsedBatch
    from moeproxy.signatures.synthetic import synthetic_run

    run = synthetic_run("gradient_overflow", steps=N_STEPS, onset=3000, seed=7)
    rng = np.random.default_rng(0)
    series = {name: s.values for name, s in run.series.items()}
    for name in metric_names():
        series.setdefault(name, 1.0 + 0.1 * rng.standard_normal(N_STEPS))
    by_step = {step: {name: float(series[name][step]) for name in metric_names()} for step in range(N_STEPS)}
    return ParsedBatch(by_step=by_step, names=tuple(metric_names()), points=N_STEPS * N_METRICS), series


def candidates_json(rng) -> list[dict]:
    from moeproxy.reproduction.catalogue import FAULT_CLASSES

    scores = np.sort(rng.uniform(0, 1, len(FAULT_CLASSES)))[::-1]
    return [
        {
            "fault_class": name,
            "family": fault.family,
            "score": round(float(score), 4),
            "strength": "strong" if score >= 0.6 else "weak",
            "evidence": [
                f"training/rollout_probs_diff_mean jumped x{rng.uniform(2, 20):.1f} at step {rng.integers(10, 900)}",
                "KL rising after it",
            ],
        }
        for name, fault, score in zip(FAULT_CLASSES, FAULT_CLASSES.values(), scores, strict=True)
    ]


def populate(db, library_path: Path) -> tuple[int, float]:
    """1,000 evaluated runs in 5 projects, then the big run (evaluated by the real engine)."""
    from moeproxy.service.metrics import repository as metrics
    from moeproxy.service.runs.models import Run
    from moeproxy.service.tokens.repository import get_or_create_project
    from moeproxy.service.triage.engine import SignatureEngine
    from moeproxy.service.triage.models import TriageEvaluation
    from moeproxy.service.triage.repository import outcome_key
    from moeproxy.service.triage.schemas import TriageCandidate
    from moeproxy.service.triage.service import compute, load_input, save
    from moeproxy.service.db import utcnow

    rng = np.random.default_rng(0)
    with db.scope() as s:
        projects = [get_or_create_project(s, f"team-{i}") for i in range(5)]
        runs = [
            Run(
                project_id=projects[i % 5].id,
                name=f"grpo-run-{i:04d}",
                framework="verl",
                model="Qwen3-30B-A3B",
            )
            for i in range(N_RUNS)
        ]
        s.add_all(runs)
        s.flush()
        now = utcnow()
        for run in runs:
            cands = candidates_json(rng)
            s.add(
                TriageEvaluation(
                    run_id=run.id,
                    first_evaluated_at=now,
                    evaluated_at=now,
                    evaluations=1,
                    last_step=999,
                    verdict=f"likely {cands[0]['fault_class']}",
                    top_class=cands[0]["fault_class"],
                    top_score=cands[0]["score"],
                    top_strength=cands[0]["strength"],
                    outcome_key=outcome_key("v", [TriageCandidate(**c) for c in cands]),
                    candidates=cands,
                    details={},
                )
            )
        big = Run(project_id=projects[0].id, name="big-5000x20", framework="verl", model="Qwen3-30B-A3B")
        s.add(big)
        s.flush()
        batch, _series = big_run_batch()
        metrics.ingest(s, big, batch)
        big_id = big.id
    engine = SignatureEngine(library_path)
    engine.warm()
    with db.scope() as s:
        data = load_input(s, s.get(Run, big_id))
    t0 = time.perf_counter()
    result = compute(engine, data)
    evaluation_s = time.perf_counter() - t0
    with db.scope() as s:
        save(
            s,
            result,
            data,
            type("S", (), {"slack_webhook_url": None, "webhook_url": None, "public_url": ""})(),
        )
    return big_id, evaluation_s


def timed(client, url: str, repeats: int) -> dict:
    times, size = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        response = client.get(url, follow_redirects=False)
        times.append(time.perf_counter() - t0)
        # 200 itself, not the login page after a redirect: the pages need a login (issue 16)
        assert response.status_code == 200, (response.status_code, response.text[:300])
        size = len(response.content)
    return {
        "url": url,
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "bytes": size,
        "repeats": repeats,
    }


def bench_backend(backend: str, library_path: Path, repeats: int) -> dict:
    from fastapi.testclient import TestClient

    from moeproxy import migrations
    from moeproxy.config import Settings
    from moeproxy.service.app import create_app
    from moeproxy.service.db import Database

    schema = None
    if backend == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp(prefix='moeproxy-ui-bench-')}/bench.db"
    else:
        import psycopg
        from sqlalchemy.engine import make_url

        schema = f"bench_ui_{uuid.uuid4().hex[:8]}"
        u = make_url(PG_URL)
        with psycopg.connect(
            host=u.host, port=u.port, user=u.username, dbname=u.database, autocommit=True
        ) as c:
            c.execute(f'CREATE SCHEMA "{schema}"')
        url = u.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )
    try:
        migrations.upgrade(url)
        db = Database(url)
        t0 = time.perf_counter()
        big_id, evaluation_s = populate(db, library_path)
        populate_s = time.perf_counter() - t0
        app = create_app(Settings(database_url=url, fingerprints=library_path, ui_token=OPERATOR_TOKEN), database=db)
        with TestClient(app) as client:
            login = client.post("/login", data={"token": OPERATOR_TOKEN}, follow_redirects=False)
            assert login.status_code == 303, login.text[:300]  # the operator sees every project's runs
            client.get("/")  # first request: template compilation, imports
            client.get(f"/runs/{big_id}")
            figures = {
                "runs_list_1000_in_one_page": timed(client, "/?per_page=1000", repeats),
                "runs_list_default_page_of_50": timed(client, "/", repeats),
                "runs_list_filtered_by_project": timed(client, "/?project=team-3&per_page=1000", repeats),
                "run_page_5000_steps_x_20_metrics": timed(client, f"/runs/{big_id}", repeats),
            }
        db.dispose()
        return {
            "backend": backend,
            "populate_s": round(populate_s, 2),
            "engine_evaluation_5000x20_s": round(evaluation_s, 3),
            **figures,
        }
    finally:
        if schema is not None:
            import psycopg
            from sqlalchemy.engine import make_url

            u = make_url(PG_URL)
            with psycopg.connect(
                host=u.host, port=u.port, user=u.username, dbname=u.database, autocommit=True
            ) as c:
                c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "ui.json"))
    args = parser.parse_args()
    library_path = build_library(Path(tempfile.mkdtemp(prefix="moeproxy-ui-bench-lib-")))
    results = []
    for backend in args.backends.split(","):
        result = bench_backend(backend.strip(), library_path, args.repeats)
        results.append(result)
        print(
            f"[{result['backend']}] engine evaluation of the 5,000x20 run: {result['engine_evaluation_5000x20_s']} s"
        )
        for key, value in result.items():
            if isinstance(value, dict):
                ok = "ok" if value["median_s"] <= 1.0 else "MISSED"
                print(
                    f"[{result['backend']}] {key}: median {value['median_s']} s "
                    f"(min {value['min_s']}, max {value['max_s']}), {value['bytes']:,} bytes  [{ok} <= 1 s]"
                )
    out = {
        "benchmark": "ui",
        "target": "<= 1 s server time per page",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg": [round(x, 2) for x in os.getloadavg()],
        },
        "sizes": {"runs": N_RUNS, "steps": N_STEPS, "metrics": N_METRICS},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
