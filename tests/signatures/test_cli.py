import json

import pytest
from moeproxy.signatures.fingerprint import save_library
from moeproxy.signatures.synthetic import synthetic_run
from typer.testing import CliRunner

from moeproxy.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def library_dir(tmp_path_factory, synthetic_library):
    d = tmp_path_factory.mktemp("lib")
    save_library(synthetic_library, d, manifest={"command": "tests"})
    return d


def _write_jsonl(path, run):
    lines = []
    for item in run.to_steps():
        # JSON NaN/Infinity literals, as the reproduction traces write them
        lines.append(json.dumps({"step": item["step"], "values": {
            k: (float(v.replace("Infinity", "inf")) if isinstance(v, str) else v) for k, v in item["values"].items()}}))
    path.write_text("\n".join(lines) + "\n")


def test_triage_file_json(tmp_path, library_dir):
    p = tmp_path / "run.jsonl"
    _write_jsonl(p, synthetic_run("gradient_overflow", seed=21, steps=60, onset=22))
    assert "NaN" in p.read_text() and "Infinity" in p.read_text()
    res = runner.invoke(app, ["triage", str(p), "--library", str(library_dir), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert set(d) == {"run_id", "evaluated_at", "candidates", "verdict", "siblings"}
    assert d["candidates"][0]["fault_class"] == "gradient_overflow"


def test_triage_rest_body_with_framework_prints_ranking(tmp_path, library_dir):
    run = synthetic_run("lr_misconfiguration", seed=22, steps=60, onset=22)
    p = tmp_path / "body.json"
    p.write_text(json.dumps({"framework": "verl", "steps": run.to_steps()}))
    res = runner.invoke(app, ["triage", str(p), "--library", str(library_dir)])
    assert res.exit_code == 0, res.output
    assert "1. lr_misconfiguration" in res.stdout and "likely lr_misconfiguration" in res.stdout


def test_triage_lora_reads_the_lr_against_loras_range(tmp_path, library_dir):
    run = synthetic_run("healthy", seed=23, steps=60)
    steps = run.to_steps()
    for item in steps:
        item["values"]["actor/lr"] = 2e-4
    p = tmp_path / "lora.json"
    p.write_text(json.dumps({"framework": "verl", "steps": steps}))
    rules = _rules_by_flags(p, library_dir, [], ["--lora"])
    assert "lr_level" in rules[()] and "lr_level" not in rules[("--lora",)]


def _rules_by_flags(path, library_dir, *flags: list[str]) -> dict[tuple[str, ...], set[str]]:
    """The whole-run rules ``moeproxy triage`` finds in ``path`` under each set of flags."""
    rules = {}
    for flag in flags:
        res = runner.invoke(app, ["triage", str(path), "--library", str(library_dir), "--json", "--details", *flag])
        assert res.exit_code == 0, res.output
        rules[tuple(flag)] = {f["rule"] for f in json.loads(res.stdout)["findings"]}
    return rules


def test_triage_kl_coef_states_what_a_file_does_not_log(tmp_path, library_dir):
    run = synthetic_run("healthy", seed=24, steps=60)
    p = tmp_path / "beta.json"
    p.write_text(json.dumps({"framework": "trl", "steps": run.to_steps()}))
    rules = _rules_by_flags(p, library_dir, [], ["--kl-coef", "0.04"], ["--kl-coef", "-0.04"])
    assert "kl_coef_negative" in rules[("--kl-coef", "-0.04")]
    assert "kl_coef_negative" not in rules[()] | rules[("--kl-coef", "0.04")]
    res = runner.invoke(app, ["triage", str(p), "--library", str(library_dir), "--kl-coef", "minus"])
    assert res.exit_code == 2
    # A run file that carries its config (POST /runs's, as benchmarks/trl_runs.py exports it) says it itself.
    with_config = tmp_path / "with-config.json"
    with_config.write_text(json.dumps({"framework": "trl", "config": {"training_args": {"beta": -0.04}},
                                       "steps": run.to_steps()}))
    res = runner.invoke(app, ["triage", str(with_config), "--library", str(library_dir), "--json", "--details"])
    assert res.exit_code == 0, res.output
    assert "kl_coef_negative" in {f["rule"] for f in json.loads(res.stdout)["findings"]}


def test_triage_learning_rate_states_the_configured_lr_a_file_does_not_carry(tmp_path, library_dir):
    run = synthetic_run("healthy", seed=25, steps=60)
    steps = run.to_steps()
    for k, step in enumerate(steps):  # a warm-up 100x the run: the LR climbs to 1% of 1e-6
        step["values"]["learning_rate"] = 1e-6 * (k + 1) / (100 * len(steps))
    p = tmp_path / "warmup.json"
    p.write_text(json.dumps({"framework": "trl", "steps": steps}))
    rules = _rules_by_flags(p, library_dir, [], ["--learning-rate", "1e-6"], ["--learning-rate", "1e-8"])
    assert "lr_never_reached" in rules[("--learning-rate", "1e-6")]
    assert "lr_never_reached" not in rules[()] | rules[("--learning-rate", "1e-8")]
    res = runner.invoke(app, ["triage", str(p), "--library", str(library_dir), "--learning-rate", "-1"])
    assert res.exit_code == 2


def test_load_config_reads_a_documents_config_only(tmp_path):
    from moeproxy.signatures.canonical import load_config

    doc = tmp_path / "run.json"
    doc.write_text(json.dumps({"steps": [], "config": {"beta": 0.1}}))
    assert load_config(doc) == {"beta": 0.1}
    jsonl = tmp_path / "run.jsonl"
    jsonl.write_text('{"step": 0, "values": {"kl": 0.1}}\n{"step": 1, "values": {"kl": 0.2}}\n')
    assert load_config(jsonl) is None
    for text in ('{"steps": [], "config": [1, 2]}', '{"steps": []', "not json"):
        doc.write_text(text)
        assert load_config(doc) is None
    assert load_config(tmp_path / "missing.json") is None


def test_triage_user_errors_exit_2_without_traceback(tmp_path, library_dir):
    res = runner.invoke(app, ["triage", str(tmp_path / "missing.jsonl"), "--library", str(library_dir)])
    assert res.exit_code == 2 and "no such file" in res.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": "x", "values": {}}\n')
    res = runner.invoke(app, ["triage", str(bad), "--library", str(library_dir)])
    assert res.exit_code == 2 and "step must be an integer" in res.stderr
    res = runner.invoke(app, ["triage"])
    assert res.exit_code == 2


def test_fingerprints_list_show_validate(tmp_path, library_dir):
    res = runner.invoke(app, ["fingerprints", "list", "--library", str(library_dir), "--json"])
    assert res.exit_code == 0
    rows = json.loads(res.stdout)["fingerprints"]
    assert {r["fault_class"] for r in rows} >= {"healthy", "stale_weight_sync"}
    res = runner.invoke(app, ["fingerprints", "show", "stale_weight_sync", "--library", str(library_dir)])
    assert res.exit_code == 0 and "rollout_train_logp_diff" in res.stdout
    res = runner.invoke(app, ["fingerprints", "validate", str(library_dir), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["valid"] is True
    doc = json.loads((library_dir / "fingerprints.json").read_text())
    doc["fingerprints"][0]["metrics"][next(iter(doc["fingerprints"][0]["metrics"]))]["direction"] = 5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    res = runner.invoke(app, ["fingerprints", "validate", str(bad)])
    assert res.exit_code == 2 and "fingerprints[0].metrics." in res.stderr and ".direction" in res.stderr


def test_consistency_command(tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    _write_jsonl(a, synthetic_run("stale_weight_sync", seed=23, steps=60, onset=20))
    _write_jsonl(b, synthetic_run("stale_weight_sync", seed=24, steps=60, onset=20, scale=3.0))
    res = runner.invoke(app, ["consistency", str(a), str(a), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["verdict"] == "consistent"
    res = runner.invoke(app, ["consistency", str(a), str(b)])
    assert res.exit_code == 0 and res.stdout.split(":")[0] in ("consistent", "partially consistent")


def test_triage_run_id_reads_the_service_over_http(library_dir):
    """--run ID: the metrics come from GET /api/v1/runs/{id}/metrics (column form, non-finite as
    strings), through a real socket (a stand-in HTTP server speaking the SPEC section 5 shapes)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    run = synthetic_run("gradient_overflow", seed=31, steps=60, onset=22)
    columns = {}
    for item in run.to_steps():
        for name, value in item["values"].items():
            col = columns.setdefault(name, {"steps": [], "values": []})
            col["steps"].append(item["step"])
            col["values"].append(value)
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != "Bearer tok":
                body, code = {"detail": "bad token"}, 401
            elif self.path == "/api/v1/runs/7":
                body, code = {"id": 7, "name": "job-7", "framework": "verl"}, 200
            elif self.path.startswith("/api/v1/runs/7/metrics"):
                body, code = {"metrics": columns}, 200
            else:
                body, code = {"detail": "not found"}, 404
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        res = runner.invoke(app, ["triage", "--run", "7", "--url", url, "--token", "tok",
                                  "--library", str(library_dir), "--json"])
        assert res.exit_code == 0, res.output
        d = json.loads(res.stdout)
        assert d["run_id"] == 7 and d["candidates"][0]["fault_class"] == "gradient_overflow"
        assert ("/api/v1/runs/7", "Bearer tok") in seen
        res = runner.invoke(app, ["triage", "--run", "8", "--url", url, "--token", "tok",
                                  "--library", str(library_dir)])
        assert res.exit_code == 2 and "404" in res.stderr
        res = runner.invoke(app, ["triage", "--run", "7", "--url", url, "--token", "wrong",
                                  "--library", str(library_dir)])
        assert res.exit_code == 2 and "401" in res.stderr
    finally:
        server.shutdown()
        server.server_close()


def _trace_dir(d, fault_class, variant, params, runs):
    """A directory in the reproduction engine's output format (docs/reproduction.md)."""
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({
        "format": "moeproxy.reproduction.manifest/1", "backend": "local", "model": {"name": "stand-in"},
        "proxy_report": {"method": "three_view", "keep": 4}, "steps": 40,
        "fault": {"class": fault_class, "variant": variant, "params": params}, "seeds": sorted(runs)}))
    for seed, run in runs.items():
        _write_jsonl(d / f"{fault_class}-seed{seed}.jsonl", run)


def test_fingerprints_build_from_engine_trace_dirs_with_shared_twins(tmp_path):
    seeds = (0, 1)
    healthy = tmp_path / "traces" / "healthy"
    _trace_dir(healthy, "healthy", "none", {"onset": 0}, {s: synthetic_run("healthy", steps=40, seed=s) for s in seeds})
    dirs = [healthy]
    for c, v in (("stale_weight_sync", "skip_from_onset"), ("lr_misconfiguration", "lr_multiplier")):
        d = tmp_path / "traces" / c
        _trace_dir(d, c, v, {"onset": 12}, {s: synthetic_run(c, steps=40, onset=12, seed=s) for s in seeds})
        dirs.append(d)
    out = tmp_path / "lib"
    res = runner.invoke(app, ["fingerprints", "build", *map(str, dirs), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["fingerprints"] == 3 and 0 < report["strong_threshold"] < 1  # leave-one-seed-out
    doc = json.loads((out / "fingerprints.json").read_text())
    stale = next(f for f in doc["fingerprints"] if f["fault_class"] == "stale_weight_sync")
    assert stale["provenance"]["n_twins"] == 2  # twins taken from the healthy directory
    assert stale["metrics"]["rollout_train_logp_diff"]["role"] == "affected"
    assert stale["metrics"]["rollout_train_logp_diff"]["onset_lag"] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "leave-one-seed-out" in manifest["calibration"]["method"]
