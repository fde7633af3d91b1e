"""Run inside the verl virtual environment (.ci/verl_venv): verl's own ``Tracking`` logging five
steps to a moeproxy server, through its ``mlflow`` backend pointed at ``/mlflow`` and through
``MoeproxyTracking`` registered as one more backend, the way docs/frameworks/verl.md says.

    python log_with_verl.py URL TOKEN

Prints one JSON line: the verl and MLflow versions used.
"""

from __future__ import annotations

import json
import math
import os
import sys


def main(url: str, token: str) -> None:
    os.environ["MLFLOW_TRACKING_URI"] = f"{url}/mlflow"
    os.environ["MLFLOW_TRACKING_TOKEN"] = token
    import mlflow
    import verl
    from verl.utils.tracking import Tracking

    from moeproxy.integrations import MoeproxyTracking

    config = {"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}}, "algorithm": {"adv_estimator": "grpo"}}
    tracking = Tracking(project_name="qwen3-grpo", experiment_name="verl-real", default_backend=["mlflow"],
                        config=config)
    tracking.logger["moeproxy"] = MoeproxyTracking("qwen3-grpo", "verl-real-moeproxy", config=config, url=url,
                                                   token=token, flush_interval_s=0.1)
    for step in range(1, 6):
        tracking.log({"critic/score/mean": 0.1 * step, "actor/ppo_kl": 0.001 * step,
                      "actor/grad_norm": math.nan if step == 4 else 1.5, "response_length/mean": 100.0 + step},
                     step=step)
    tracking.finish()
    tracking.logger["moeproxy"].finish()  # verl's finish() knows only its own backends
    print(json.dumps({"verl": verl.__version__, "mlflow": mlflow.__version__}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
