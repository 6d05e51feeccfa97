"""``dspark-calibrate schema validate``: the shipped JSON Schemas accept the files the tool writes,
reject each way of breaking them (one row per way), never touch the network, and agree with the
key lists the code writes and reads.

The files are the demo's (``dspark-calibrate demo``); tests/test_demo.py validates every one of them.
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.artifacts import DOCUMENT_SCHEMAS, schema_registry, validate_document
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.schemas import (
    ADMISSION_PREDICTION_KEYS,
    ADMISSION_SUMMARY_KEYS,
    ARTIFACT_KINDS,
    JSON_SCHEMAS,
    MIXED_ADMISSION_SUMMARY_KEYS,
    MIXED_COST_SUMMARY_KEYS,
    json_schema,
)

runner = CliRunner()
APP = build_calibrate_app()
W = dict[str, Path]


@pytest.fixture(scope="module")
def world(demo_run: tuple[Path, dict[str, Any]]) -> W:
    """The demo's output: a signed bundle with mixed evidence, its trust root and its package."""
    out, _ = demo_run
    return {"d": out, "bundle": out / "bundle", "root": out / "trust-root.json", "trtllm": out / "trtllm"}


def _every_file(w: W) -> list[Path]:
    return sorted([*w["bundle"].rglob("*.json"), *w["trtllm"].glob("*.json"), w["root"]])


def test_the_tools_own_files_validate(world: W) -> None:
    files = _every_file(world)
    r = runner.invoke(APP, ["schema", "validate", *map(str, files), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["error"] is None
    schemas = {Path(e["path"]).name: e["schema"] for e in doc["files"]}
    assert schemas["bundle.dsse.json"] == "dsse-envelope" and schemas["trust-root.json"] == "trust-root"
    assert schemas["admission_receipt.json"] == "admission-receipt"
    assert schemas["sps_table.json"] == "trtllm-sps-table"
    assert all(e["payload"] == "statement" for e in doc["files"] if e["schema"] == "dsse-envelope")
    human = runner.invoke(APP, ["schema", "validate", *map(str, files)])
    assert human.exit_code == 0 and human.stdout.count("VALID") == len(files)


# ---------------------------------------------------------------------------------------------
# One row per way to be wrong
# ---------------------------------------------------------------------------------------------


def _edit_json(name: str, edit: Callable[[Any], None]) -> Callable[[W, Path], Path]:
    def make(w: W, tmp: Path) -> Path:
        src = next(p for p in _every_file(w) if p.name == name)
        doc = json.loads(src.read_bytes())
        edit(doc)
        out = tmp / name
        out.write_text(json.dumps(doc), encoding="utf-8")
        return out

    return make


def _edit_payload(name: str, edit: Callable[[Any], None]) -> Callable[[W, Path], Path]:
    """Change the signed statement inside an envelope (the schema checks shape, not signatures)."""

    def payload(envelope: Any) -> None:
        statement = json.loads(base64.b64decode(envelope["payload"]))
        edit(statement)
        envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()

    return _edit_json(name, payload)


def _raw(name: str, data: bytes) -> Callable[[W, Path], Path]:
    def make(w: W, tmp: Path) -> Path:
        out = tmp / name
        out.write_bytes(data)
        return out

    return make


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value

    return edit


def _drop(path: tuple[Any, ...]) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        for key in path[:-1]:
            doc = doc[key]
        del doc[path[-1]]

    return edit


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[W, Path], Path]
    code: int
    says: str
    extra: tuple[str, ...] = ()


CASES: list[Case] = [
    Case("receipt flag not a boolean", _edit_json("admission_receipt.json", _set(("admission", "admitted"), "yes")), 1, "$.admission.admitted"),
    Case("receipt without policy steps", _edit_json("admission_receipt.json", _set(("admission", "policy_steps"), 0)), 1, "$.admission.policy_steps"),
    Case("sps table with an unknown key", _edit_json("sps_table.json", _set(("notes",), "x")), 1, "'notes' was unexpected"),
    Case("sps cost table not starting at 0", _edit_json("sps_table.json", lambda d: d["cost_tables"][next(iter(d["cost_tables"]))]["token_counts"].__setitem__(0, 5)), 1, "token_counts[0]"),
    Case("live fingerprint with a null", _edit_json("live_fingerprint.json", _set(("gpu",), None)), 1, "$.gpu"),
    Case("sts temperature not positive", _edit_json("sts.json", _set(("sts_temperatures", 0), 0.0)), 1, "$.sts_temperatures[0]"),
    Case("trust root threshold 0", _edit_json("trust-root.json", _set(("signed", "roles", "targets", "threshold"), 0)), 1, "$.signed.roles.targets.threshold"),
    Case("envelope without signatures", _edit_json("bundle.dsse.json", _set(("signatures",), [])), 1, "$.signatures"),
    Case("admission summary flag not a boolean", _edit_payload("admission.parquet.dsse.json", _set(("predicate", "summary", "admitted"), "yes")), 1, "payload.predicate.summary.admitted"),
    Case("admission summary objective unknown", _edit_payload("admission.parquet.dsse.json", _set(("predicate", "summary", "objective"), "speed")), 1, "payload.predicate.summary.objective"),
    Case("calibration summary without k", _edit_payload("calibration.parquet.dsse.json", _drop(("predicate", "summary", "k"))), 1, "payload.predicate.summary"),
    Case("manifest without the calibration member", _edit_payload("bundle.dsse.json", _drop(("predicate", "members", "calibration"))), 1, "payload.predicate.members"),
    Case("mixed manifest without its admission", _edit_payload("mixed.dsse.json", _drop(("predicate", "members", "mixed-admission"))), 1, "payload.predicate.members"),
    Case("mixed admission gate not a boolean", _edit_payload("mixed-admission.parquet.dsse.json", _set(("predicate", "summary", "gates", "accuracy_pass"), 1)), 1, "payload.predicate.summary.gates.accuracy_pass"),
    Case("mixed cost file with a nine-rank geometry", _edit_json("mixed_costs.json", lambda d: d["cells"][0]["geometry"]["actual_rank_rows"].append(1)), 1, "actual_rank_rows"),
    Case("statement of an unknown predicate type", _edit_payload("cost-table.parquet.dsse.json", _set(("predicateType",), "https://example.com/x")), 1, "payload.predicateType"),
    Case("payload not base64", _edit_json("cost-table.parquet.dsse.json", _set(("payload",), "%%%")), 1, "$.payload"),
    Case("sts forced to the receipt schema", _edit_json("sts.json", lambda d: None), 1, "admission", ("--schema", "admission-receipt")),
    Case("json of another tool", _raw("other.json", b'{"name": "x"}'), 2, "no shipped schema recognises it"),
    Case("not json", _raw("broken.json", b"{nope"), 2, "not valid UTF-8 JSON"),
    Case("NaN", _raw("nan.json", b'{"sts_temperatures": [NaN]}'), 2, "JSON literal NaN is not allowed"),
    Case("duplicate key", _raw("dup.json", b'{"sts_temperatures": [1.0], "sts_temperatures": [2.0]}'), 2, "duplicate JSON key"),
    Case("not utf-8", _raw("latin.json", b'{"a": "\xe9"}'), 2, "not valid UTF-8 JSON"),
    Case("missing file", lambda w, tmp: tmp / "absent.json", 2, "cannot read"),
    Case("a directory", lambda w, tmp: tmp, 2, "cannot read"),
    Case("unknown --schema", _edit_json("sts.json", lambda d: None), 2, "is not a shipped schema", ("--schema", "bogus")),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_schema_validate_refuses(world: W, tmp_path: Path, case: Case) -> None:
    path = case.make(world, tmp_path)
    args = ["schema", "validate", str(path), *case.extra]
    r = runner.invoke(APP, args)
    assert r.exit_code == case.code, (case.id, r.stdout, r.stderr)
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit))
    assert "VALID" not in r.stdout
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines and case.says in " ".join(lines), (case.id, lines)
    j = runner.invoke(APP, [*args, "--json"])
    assert j.exit_code == case.code
    doc = json.loads(j.stdout)
    assert doc["ok"] is False and doc["error"] and doc["message"] and doc["fix"], doc


def test_one_invalid_and_one_unknown_file_exit_2(world: W, tmp_path: Path) -> None:
    """Unknown or unreadable wins over invalid: the run could not check everything it was given."""
    bad = _edit_json("sts.json", _set(("sts_temperatures",), []))(world, tmp_path)
    other = _raw("other.json", b"{}")(world, tmp_path)
    r = runner.invoke(APP, ["schema", "validate", str(bad), str(other), str(world["root"]), "--json"])
    assert r.exit_code == 2
    statuses = [e["status"] for e in json.loads(r.stdout)["files"]]
    assert statuses == ["invalid", "unknown", "valid"]


def test_schema_list_names_every_document_schema() -> None:
    r = runner.invoke(APP, ["schema", "list", "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert [s["name"] for s in doc["schemas"]] == list(DOCUMENT_SCHEMAS)
    for name in ("fit-report", "build", "admission-receipt", "trtllm-mixed-costs", "trtllm-mixed-admission"):
        assert name in DOCUMENT_SCHEMAS
    assert Path(doc["directory"], "predicate.schema.json").is_file()


# ---------------------------------------------------------------------------------------------
# Offline, and in agreement with the code
# ---------------------------------------------------------------------------------------------


def test_validation_never_touches_the_network(world: W, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the network was used")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    schema_registry.cache_clear()
    r = runner.invoke(APP, ["schema", "validate", *map(str, _every_file(world))])
    assert r.exit_code == 0, r.output
    # A reference to a schema that is not shipped fails to resolve; it is never fetched.
    import referencing.exceptions

    with pytest.raises(referencing.exceptions.Unresolvable):
        schema_registry().resolver().lookup("https://dspark-calibrate.dev/schemas/nothing/v1")


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


@pytest.mark.parametrize("name", JSON_SCHEMAS)
def test_every_schema_is_valid_and_its_references_resolve(name: str) -> None:
    from jsonschema import Draft202012Validator

    schema = json_schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$id"] == f"https://dspark-calibrate.dev/schemas/{name}/v1"
    resolver = schema_registry().resolver(base_uri=schema["$id"])
    for ref in _refs(schema):
        resolver.lookup(ref)  # raises when a reference points nowhere


def test_schemas_agree_with_the_key_lists_of_the_code() -> None:
    admission = json_schema("admission-summary")
    assert admission["required"] == list(ADMISSION_SUMMARY_KEYS)
    optional = set(admission["properties"]) - set(ADMISSION_SUMMARY_KEYS)
    assert optional == set(ADMISSION_PREDICTION_KEYS)
    mixed = json_schema("mixed-summaries")["$defs"]
    assert set(mixed["mixed-cost-table"]["required"]) == set(MIXED_COST_SUMMARY_KEYS)
    assert set(mixed["mixed-admission"]["required"]) == set(MIXED_ADMISSION_SUMMARY_KEYS)
    assert set(json_schema("predicate")["properties"]["kind"]["enum"]) == set(ARTIFACT_KINDS)


def test_the_stated_prediction_keys_are_optional_and_checked(world: W) -> None:
    envelope = json.loads((world["bundle"] / "admission.parquet.dsse.json").read_bytes())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    summary = statement["predicate"]["summary"]
    assert validate_document(statement, schema="statement").ok  # what build writes
    for key in ADMISSION_PREDICTION_KEYS:
        summary.pop(key)
    assert validate_document(statement, schema="statement").ok  # older bundles state none of them
    summary.update(
        objective="latency", regime="arrival-bound", regime_source="arrival times in the workload",
        planner="host planner", mixed_share=0.4,
    )  # fmt: skip
    assert validate_document(statement, schema="statement").ok
    summary["mixed_share"] = 1.5
    assert not validate_document(statement, schema="statement").ok
