import copy
import json

import pytest
from moeproxy.signatures.errors import InvalidLibrary
from moeproxy.signatures.fingerprint import (
    FORMAT_VERSION,
    library_from_dict,
    load_library,
    resolve_library_path,
    save_library,
)


def test_round_trip(tmp_path, synthetic_library):
    target = save_library(synthetic_library, tmp_path / "lib", manifest={"command": "test"})
    back = load_library(tmp_path / "lib")
    assert back.to_dict() == synthetic_library.to_dict() or json.loads(target.read_text()) == back.to_dict()
    assert [f.id for f in back.fingerprints] == [f.id for f in synthetic_library.fingerprints]
    manifest = json.loads((tmp_path / "lib" / "manifest.json").read_text())
    assert manifest["fingerprints"] == len(back.fingerprints) and len(manifest["library_sha256"]) == 64
    # a second save of what was loaded is byte-identical
    again = save_library(back, tmp_path / "again")
    assert again.read_text() == target.read_text()


def test_every_fingerprint_keeps_its_expectations(synthetic_library):
    doc = synthetic_library.to_dict()
    back = library_from_dict(json.loads(json.dumps(doc)))
    for a, b in zip(synthetic_library.fingerprints, back.fingerprints, strict=True):
        assert a.affected_metrics == b.affected_metrics
        for m in a.metrics:
            assert a.metrics[m].direction == b.metrics[m].direction
            assert len(a.metrics[m].traces) == len(b.metrics[m].traces)


def _doc(synthetic_library):
    return copy.deepcopy(synthetic_library.to_dict())


def _first_metric(doc, i=1):
    fp = doc["fingerprints"][i]
    return fp, next(iter(fp["metrics"]))


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.pop("format_version"), "format_version"),
        (lambda d: d.update(format_version=FORMAT_VERSION + 1), "format_version"),
        (lambda d: d.update(fingerprints={}), "fingerprints"),
        (lambda d: d["fingerprints"][2].update(fault_class="cosmic_rays"), "fingerprints[2].fault_class"),
        (lambda d: d["fingerprints"][2].update(family="routing" if d["fingerprints"][2]["family"] != "routing"
                                               else "numerical"), "fingerprints[2].family"),
        (lambda d: d["fingerprints"][1].pop("metrics"), "fingerprints[1].metrics"),
        (lambda d: d["fingerprints"][3].update(id=d["fingerprints"][0]["id"]), "fingerprints[3].id"),
        (lambda d: d["params"].update(alpha=2.0), "params"),
        (lambda d: d["params"].update(colour=1), "params.colour"),
        (lambda d: d["calibration"].update(strong_threshold=1.5), "calibration.strong_threshold"),
    ],
)
def test_validation_names_the_bad_field(synthetic_library, mutate, path):
    doc = _doc(synthetic_library)
    mutate(doc)
    with pytest.raises(InvalidLibrary) as err:
        library_from_dict(doc)
    assert err.value.path == path


@pytest.mark.parametrize(
    ("field", "value", "suffix"),
    [("direction", 2, "direction"), ("role", "maybe", "role"), ("nonfinite_rate", 1.5, "nonfinite_rate"),
     ("traces", [[0.1, "x"]], "traces[0][1]"), ("traces", "abc", "traces"), ("source", 3, "source"),
     ("drift", 2, "drift"), ("drift", True, "drift")],
)
def test_validation_names_the_bad_metric_field(synthetic_library, field, value, suffix):
    doc = _doc(synthetic_library)
    fp, metric = _first_metric(doc)
    fp["metrics"][metric][field] = value
    with pytest.raises(InvalidLibrary) as err:
        library_from_dict(doc)
    assert err.value.path == f"fingerprints[1].metrics.{metric}.{suffix}"


def test_unreadable_files(tmp_path):
    with pytest.raises(InvalidLibrary, match="no such file"):
        load_library(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidLibrary, match="not JSON"):
        load_library(bad)


def test_leave_one_class_out(synthetic_library):
    loco = synthetic_library.without_class("stale_weight_sync")
    assert "stale_weight_sync" not in loco.fault_classes
    assert len(loco.fingerprints) == len(synthetic_library.fingerprints) - 1


def test_the_shipped_library_loads_and_is_proxy_generated():
    from moeproxy.signatures.fingerprint import shipped_library_dir

    lib = load_library(shipped_library_dir())
    assert "healthy" in lib.fault_classes and len(lib.fault_classes) == 11
    assert all(f.provenance.get("source") == "proxy" for f in lib.fingerprints)
    assert all(f.provenance.get("proxy_report") for f in lib.fingerprints)  # built on a proxy checkpoint
    manifest = json.loads((shipped_library_dir() / "manifest.json").read_text())
    assert manifest["command"].startswith("moeproxy fingerprints generate")
    import hashlib

    digest = hashlib.sha256((shipped_library_dir() / "fingerprints.json").read_bytes()).hexdigest()
    assert digest == manifest["library_sha256"]


def test_the_signature_library_reads_no_environment(monkeypatch, tmp_path):
    """Settings live in the service and the CLI (issue 15): MOEPROXY_FINGERPRINTS reaches the
    library only as an argument, so a pure call loads what it is given or the shipped library."""
    import ast
    import re
    from pathlib import Path

    from moeproxy.signatures.fingerprint import shipped_library_dir

    monkeypatch.setenv("MOEPROXY_FINGERPRINTS", str(tmp_path / "elsewhere.json"))
    from moeproxy.config import get_settings

    get_settings.cache_clear()
    try:
        assert resolve_library_path() == shipped_library_dir() / "fingerprints.json"
        from moeproxy.cli.fingerprints import library_path

        assert library_path(None) == tmp_path / "elsewhere.json"  # the CLI passes the setting in
    finally:
        get_settings.cache_clear()
    package = Path(resolve_library_path().parent.parent)
    for source in package.glob("*.py"):
        tree = ast.parse(source.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {"os", "moeproxy.config", "pydantic_settings"} & names, source.name
        assert not re.search(r"os\.environ|getenv\(", source.read_text()), source.name


def test_a_library_built_before_a_name_was_canonical_matches_runs_under_the_new_name():
    """response_length/max became response_length_max (TRL's completions/max_length): fingerprints
    built under the old name (the first shipped library's, and any user library of that time) are
    read under the new one, so a TRL run and a verl run both reach them."""
    import json

    from moeproxy.signatures.canonical import RunMetrics, canonicalise
    from moeproxy.signatures.fingerprint import library_from_dict, resolve_library_path

    doc = json.loads(resolve_library_path(None).read_text())
    # The shipped library is built under the new name now: write it back under the old one.
    for f in doc["fingerprints"]:
        if "response_length_max" in f["metrics"]:
            f["metrics"]["response_length/max"] = f["metrics"].pop("response_length_max")
    assert any("response_length/max" in f["metrics"] for f in doc["fingerprints"])  # the stored names
    lib = library_from_dict(doc)
    names = {m for f in lib.fingerprints for m in f.metrics}
    assert "response_length_max" in names and "response_length/max" not in names
    steps = [{"step": k, "values": {"completions/max_length": 40.0 + k, "completions/clipped_ratio": 0.1}}
             for k in range(5)]
    trl = canonicalise(RunMetrics.from_steps(steps, framework="trl"))
    verl = canonicalise(RunMetrics.from_steps(
        [{"step": k, "values": {"response_length/max": 40.0 + k, "response_length/clip_ratio": 0.1}} for k in range(5)],
        framework="verl"))
    assert set(trl.metrics) == set(verl.metrics) == {"response_length_max", "length_clip_ratio"}


def test_a_layer_adds_its_fingerprints_over_the_library_and_brings_its_calibration(synthetic_library):
    from dataclasses import replace

    from moeproxy.signatures.features import SignatureParams
    from moeproxy.signatures.fingerprint import Calibration, FingerprintLibrary

    base = synthetic_library.without_class("router_corruption")
    own = synthetic_library.of_class("router_corruption")[0]
    redone = replace(synthetic_library.of_class("healthy")[0], provenance={"source": "proxy", "model": "m"})
    layer = FingerprintLibrary((own, redone), base.params, Calibration(0.7, "layer", 4), {"command": "job 7"})
    combined = base.layered(layer)
    assert {f.id for f in combined.fingerprints} == {f.id for f in base.fingerprints} | {own.id}
    assert len(combined.fingerprints) == len(base.fingerprints) + 1  # the healthy one was replaced
    assert combined.get(redone.id).provenance["model"] == "m"
    assert combined.calibration.strong_threshold == 0.7 and combined.generator["layer"] == {"command": "job 7"}
    assert base.layered(FingerprintLibrary((), base.params)).fingerprints == base.fingerprints
    with pytest.raises(InvalidLibrary, match="signature parameters"):
        base.layered(FingerprintLibrary((own,), SignatureParams(alpha=0.1)))
