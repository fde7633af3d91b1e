"""docker/ and helm/: files parse, every MOEPROXY_* name is a real setting, every chart value exists.

No Docker daemon or helm binary is available where the suite runs, so the chart's
templates are checked structurally: control lines dropped and expressions
replaced, each template must still be valid YAML of a Kubernetes object.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DOCKER, HELM = ROOT / "docker", ROOT / "helm"
ENV_NAME = re.compile(r"\bMOEPROXY_[A-Z0-9_]+\b")


def _known_env_names() -> set[str]:
    import typer.main

    from moeproxy.cli import app
    from moeproxy.config import Settings

    names = {f"MOEPROXY_{field.upper()}" for field in Settings.model_fields}
    command = typer.main.get_command(app)
    serve = command.commands["serve"]
    for param in serve.params:
        envvar = getattr(param, "envvar", None)
        if envvar:
            names.update([envvar] if isinstance(envvar, str) else envvar)
    return names


def _deploy_files() -> list[Path]:
    return sorted(p for p in [*DOCKER.rglob("*"), *HELM.rglob("*")] if p.is_file())


def test_every_env_name_is_a_setting_or_a_serve_option():
    known = _known_env_names()
    used = {name: path for path in _deploy_files() for name in ENV_NAME.findall(path.read_text())}
    assert used, "no MOEPROXY_* variables found in docker/ or helm/"
    unknown = {name: str(path.relative_to(ROOT)) for name, path in used.items() if name not in known}
    assert unknown == {}
    assert {"MOEPROXY_DATABASE_URL", "MOEPROXY_PUBLIC_URL", "MOEPROXY_SLACK_WEBHOOK_URL"} <= set(used)


def test_compose_runs_the_service_against_its_postgres():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "moeproxy", "ray-head", "worker"}
    env = services["moeproxy"]["environment"]
    url = env["MOEPROXY_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://") and "@postgres:5432/" in url
    pg = services["postgres"]["environment"]
    assert f"{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@" in url and url.endswith(f"/{pg['POSTGRES_DB']}")
    assert services["moeproxy"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["moeproxy"]["build"]["dockerfile"] == "docker/Dockerfile"


def test_dockerfile_copies_every_installed_package_and_serves():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\S+) ", dockerfile, flags=re.MULTILINE))
    setup_py = (ROOT / "setup.py").read_text()
    stage_folders = set(re.findall(r'"moeproxy\.\w+": "(\w+)"', setup_py))
    assert stage_folders and stage_folders | {"moeproxy"} <= copied
    assert re.search(r'^CMD \["moeproxy", "serve"\]', dockerfile, flags=re.MULTILINE)
    assert "/healthz" in dockerfile


def _values() -> dict:
    return yaml.safe_load((HELM / "values.yaml").read_text())


def test_chart_metadata():
    chart = yaml.safe_load((HELM / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "moeproxy" and chart["version"]


def test_every_chart_value_reference_exists():
    values = _values()
    for template in (HELM / "templates").iterdir():
        for ref in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            node = values
            for key in ref.split("."):
                assert isinstance(node, dict) and key in node, f"{template.name}: .Values.{ref} is not in values.yaml"
                node = node[key]


def _structural(text: str) -> str:
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("{{-", "{{/*")):
            continue  # control flow, includes with nindent, toYaml blocks
        lines.append(re.sub(r"\{\{.*?\}\}", "X", line))
    return "\n".join(lines)


@pytest.mark.parametrize("name, kind", [
    ("deployment.yaml", "Deployment"), ("service.yaml", "Service"),
    ("configmap.yaml", "ConfigMap"), ("secret.yaml", "Secret"),
    ("worker.yaml", "Deployment"), ("migrate-job.yaml", "Job"), ("raycluster.yaml", "RayCluster"),
])
def test_templates_are_kubernetes_objects(name, kind):
    doc = yaml.safe_load(_structural((HELM / "templates" / name).read_text()))
    assert doc["kind"] == kind and doc["metadata"]["name"]


def test_deployment_migrates_then_serves_with_probes():
    doc = yaml.safe_load(_structural((HELM / "templates" / "deployment.yaml").read_text()))
    spec = doc["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["command"] == ["moeproxy", "db", "upgrade"]
    container = spec["containers"][0]
    assert container["command"] == ["moeproxy", "serve", "--no-upgrade"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    refs = [next(iter(e.values())) for e in container["envFrom"]]
    assert any("name" in r for r in refs)


def test_compose_has_a_worker_on_the_ray_pool_sharing_the_data_volume():
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    worker, head, api = services["worker"], services["ray-head"], services["moeproxy"]
    assert worker["build"]["dockerfile"] == head["build"]["dockerfile"] == "docker/Dockerfile.worker"
    assert worker["environment"]["MOEPROXY_RAY_ADDRESS"] == "ray-head:6379"
    assert worker["environment"]["MOEPROXY_DATABASE_URL"] == api["environment"]["MOEPROXY_DATABASE_URL"]
    assert head["command"][:3] == ["ray", "start", "--head"] and "--port=6379" in head["command"]
    for service in (worker, head, api):  # proxies and layers written by the worker, read by the service
        assert "data:/data" in service["volumes"]


def test_the_worker_image_has_torch_and_ray_and_runs_the_worker():
    dockerfile = (DOCKER / "Dockerfile.worker").read_text()
    assert "torch==2.13.0" in dockerfile and '".[ml,ray]"' in dockerfile
    assert re.search(r'^CMD \["moeproxy", "worker"\]', dockerfile, flags=re.MULTILINE)
    copied = set(re.findall(r"^COPY (\S+) ", dockerfile, flags=re.MULTILINE))
    assert copied == set(re.findall(r"^COPY (\S+) ", (DOCKER / "Dockerfile").read_text(), flags=re.MULTILINE))


def test_the_worker_pods_ask_for_their_accelerators():
    worker = (HELM / "templates" / "worker.yaml").read_text()
    helpers = (HELM / "templates" / "_helpers.tpl").read_text()
    assert "moeproxy.acceleratorLimit" in worker and "moeproxy.rayAddress" in worker
    assert "nvidia.com/gpu:" in helpers and "huawei.com/Ascend910:" in helpers
    doc = yaml.safe_load(_structural(worker))
    container = doc["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["moeproxy", "worker"]
    assert {e["name"] for e in container["env"]} == {"MOEPROXY_JOB_LEASE_S", "MOEPROXY_RAY_ADDRESS",
                                                     "MOEPROXY_JOB_DEVICE"}
    # The reproductions run on the pool's accelerator (Settings.job_device takes cpu, cuda or npu).
    device = helpers[helpers.index('define "moeproxy.jobDevice"'):]
    assert re.search(r'eq \$kind "nvidia" -\}\}cuda', device) and re.search(r'eq \$kind "ascend" -\}\}npu', device)
    from moeproxy.config import Settings

    for value in ("cpu", "cuda", "npu"):
        assert Settings(job_device=value).job_device == value
    ray = (HELM / "templates" / "raycluster.yaml").read_text()
    assert '"NPU\\": %v' in ray  # Ascend workers start Ray with the NPU resource


def test_the_migration_job_runs_before_an_upgrade():
    doc = yaml.safe_load(_structural((HELM / "templates" / "migrate-job.yaml").read_text()))
    assert doc["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    assert doc["spec"]["template"]["spec"]["containers"][0]["command"] == ["moeproxy", "db", "upgrade"]
    assert doc["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_values_follow_the_values_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = __import__("json").loads((HELM / "values.schema.json").read_text())
    jsonschema.validate(_values(), schema)
    bad = {**_values(), "worker": {**_values()["worker"], "accelerator": "tpu"}}
    with pytest.raises(jsonschema.ValidationError, match="tpu"):
        jsonschema.validate(bad, schema)
