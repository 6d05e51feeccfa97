"""TensorRT-LLM adapter: decoding fields from decisions, private export, YAML that round-trips."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.artifacts import Reason, sha256_hex
from dspark_calibrate.artifacts._export_trtllm import TRTLLM_FILES, export_trtllm, validate_trtllm
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.admission import AdmissionDecision, AdmissionPolicy, admit
from dspark_calibrate.runtime_plugin.trtllm import (
    CONFIDENCE_FIELDS,
    EXPORTED_FILES,
    PACKAGE_DIR,
    check_options,
    decoding_fields,
    dump_options_yaml,
    llm_api_options,
    load_options_yaml,
    static_decoding_fields,
    to_decoding_config,
    write_options_yaml,
)
from tests.factories import make_fingerprint
from tests.runtime_plugin.bundles import LATER, make_bundle
from tests.signing import make_root, make_signers

SELECTOR = "5" * 64


def fake_export(
    report: Any,
    out_dir: Path,
    *,
    selector_identity: str,
    live_fingerprint: Any = None,
    overwrite: bool = False,
    pin_ok: bool = True,
) -> None:
    """Creates ``out_dir`` with the four deployment files, the receipt pinning the other three."""
    if out_dir.exists():
        assert overwrite
        shutil.rmtree(out_dir)
    out_dir.mkdir()
    files = {
        "sts.json": b'{"sts_temperatures":[1.1,1.2,1.3,1.4,1.5],"temperatures":[1.1,1.2,1.3,1.4,1.5]}',
        "sps_table.json": b'{"schema_version":2}',
        "live_fingerprint.json": json.dumps(report.fingerprint.trtllm_fields(), sort_keys=True).encode(),
    }
    for name, data in files.items():
        (out_dir / name).write_bytes(data)
    digest = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    body = {
        "admitted": True,
        "sps_cost_table_sha256": digest["sps_table.json"] if pin_ok else "0" * 64,
        "live_engine_fingerprint_sha256": digest["live_fingerprint.json"],
        "calibration_result_sha256": digest["sts.json"],
        "selector_identity_sha256": selector_identity,
    }
    (out_dir / "admission_receipt.json").write_bytes(
        json.dumps({"schema_version": 1, "admission": body}, sort_keys=True).encode()
    )


@pytest.fixture(scope="module")
def bundle_and_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("trtllm")
    keys = make_signers(tmp / "keys", 1)
    return make_bundle(tmp / "bundle", keys), make_root(keys)


@pytest.fixture(scope="module")
def admitted(bundle_and_root: tuple[Path, Any]) -> AdmissionDecision:
    bundle, root = bundle_and_root
    decision = admit(bundle, root, live=make_fingerprint(), policy=AdmissionPolicy(), now=LATER)
    assert decision.active, decision.message
    return decision


@pytest.fixture(scope="module")
def refused(bundle_and_root: tuple[Path, Any]) -> AdmissionDecision:
    bundle, root = bundle_and_root
    return admit(bundle, root, live=make_fingerprint(gpu="B300"), policy=AdmissionPolicy(), now=LATER)


def test_inactive_decision_gives_static_fields(refused: AdmissionDecision) -> None:
    assert refused.active is False
    options = decoding_fields(refused, selector_identity=SELECTOR, exporter=fake_export)
    assert options.active is False
    assert dict(options.fields) == static_decoding_fields()
    assert options.fields["enable_confidence_scheduling"] is False
    assert all(options.fields[f] is None for f in CONFIDENCE_FIELDS)
    assert options.reason_code == refused.reason_code
    assert options.export_dir is None and not options.files
    assert options.max_draft_len == 5  # the live K, for the static speculative config


def test_happy_path_activates_with_exactly_the_exported_files(
    admitted: AdmissionDecision, tmp_path: Path
) -> None:
    out = tmp_path / "deploy"
    options = decoding_fields(admitted, selector_identity=SELECTOR, out_dir=out, exporter=export_trtllm)
    assert options.active, options.message
    package = out / PACKAGE_DIR
    assert options.export_dir == package
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert sorted(p.name for p in package.iterdir()) == sorted(TRTLLM_FILES)
    paths = {k: Path(v) for k, v in options.fields.items() if k.endswith("_path")}
    assert paths == {k: package / name for k, name in EXPORTED_FILES.items()}
    receipt = (package / "admission_receipt.json").read_bytes()
    assert options.fields["confidence_admission_receipt_sha256"] == sha256_hex(receipt)
    assert (
        validate_trtllm({n: (package / n).read_bytes() for n in TRTLLM_FILES}, selector_identity=SELECTOR)
        == []
    )
    # the merged options agree with the exporter's own YAML, field for field
    ours = options.llm_api_options()["speculative_config"]
    theirs = load_options_yaml((package / "extra_llm_api_options.yaml").read_text())["speculative_config"]
    assert ours == theirs
    # exporting again replaces the package atomically
    again = decoding_fields(admitted, selector_identity=SELECTOR, out_dir=out, exporter=export_trtllm)
    assert again.active and again.fields == options.fields


def test_default_export_directory_is_a_fresh_private_temp_dir(admitted: AdmissionDecision) -> None:
    a = decoding_fields(admitted, selector_identity=SELECTOR, exporter=fake_export)
    b = decoding_fields(admitted, selector_identity=SELECTOR, exporter=fake_export)
    assert a.export_dir is not None and b.export_dir is not None and a.export_dir != b.export_dir
    assert stat.S_IMODE(a.export_dir.parent.stat().st_mode) == 0o700


def _refuse(*args: Any, **kw: Any) -> None:
    raise ConfigError("bundle is missing the drain guard")


def _bad_pin(report: Any, out_dir: Path, **kw: Any) -> None:
    fake_export(report, out_dir, pin_ok=False, **kw)


def _partial(report: Any, out_dir: Path, **kw: Any) -> None:
    fake_export(report, out_dir, **kw)
    (out_dir / "sts.json").unlink()


@pytest.mark.parametrize(
    ("case", "kwargs", "field"),
    [
        ("no-selector-identity", {"selector_identity": None}, "selector_identity"),
        ("selector-identity-not-hex", {"selector_identity": "XYZ"}, "selector_identity"),
        ("exporter-refuses", {"exporter": _refuse}, "export"),
        ("receipt-pins-other-files", {"exporter": _bad_pin}, "export"),
        ("exporter-missing-a-file", {"exporter": _partial}, "export"),
    ],
)
def test_export_failures_fall_back_to_static(
    admitted: AdmissionDecision, tmp_path: Path, case: str, kwargs: dict[str, Any], field: str
) -> None:
    args: dict[str, Any] = {"selector_identity": SELECTOR, "exporter": fake_export, "out_dir": tmp_path / "x"}
    args.update(kwargs)
    options = decoding_fields(admitted, **args)
    assert options.active is False
    assert options.reason_code == f"{Reason.EXPORT_FAILED.value}:{field}"
    assert dict(options.fields) == static_decoding_fields()


def test_real_exporter_refusing_falls_back(admitted: AdmissionDecision, tmp_path: Path) -> None:
    # A live fingerprint the exporter binds again: a changed engine field makes it refuse.
    from dataclasses import replace

    moved = replace(admitted, live_fingerprint=make_fingerprint(source_head="0badc0de"))
    options = decoding_fields(
        moved, selector_identity=SELECTOR, out_dir=tmp_path / "x", exporter=export_trtllm
    )
    assert options.reason_code == "EXPORT_FAILED:export"
    assert not (tmp_path / "x" / PACKAGE_DIR).exists()


def test_existing_directory_must_be_private(admitted: AdmissionDecision, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    options = decoding_fields(admitted, selector_identity=SELECTOR, out_dir=shared, exporter=fake_export)
    assert options.reason_code == "EXPORT_FAILED:export"
    assert not any(shared.iterdir())  # nothing written where others can read


def test_llm_api_options_merge_and_clear() -> None:
    base = {
        "kv_cache_config": {"free_gpu_memory_fraction": 0.8},
        "speculative_config": {
            "decoding_type": "DSpark",
            "max_draft_len": 5,
            "enable_confidence_scheduling": True,
            "confidence_sts_path": "/stale/sts.json",
            "confidence_admission_receipt_sha256": "0" * 64,
        },
    }
    static = llm_api_options(static_decoding_fields(), base, max_draft_len=5)
    assert static["kv_cache_config"] == {"free_gpu_memory_fraction": 0.8}
    assert static["speculative_config"] == {
        "decoding_type": "DSpark",
        "max_draft_len": 5,
        "enable_confidence_scheduling": False,
    }
    assert base["speculative_config"]["confidence_sts_path"] == "/stale/sts.json"  # base untouched
    fields = {"enable_confidence_scheduling": True, "confidence_sts_path": "/x/sts.json"}
    active = llm_api_options(fields, {"speculative_config": {"max_draft_len": 4}}, max_draft_len=5)
    assert active == {
        "speculative_config": {
            "decoding_type": "DSpark",
            "max_draft_len": 5,  # the verified K wins when scheduling is on
            "enable_confidence_scheduling": True,
            "confidence_sts_path": "/x/sts.json",
        }
    }
    with pytest.raises(ConfigError, match="Eagle"):
        llm_api_options(static_decoding_fields(), {"speculative_config": {"decoding_type": "Eagle"}})


def test_yaml_round_trip(admitted: AdmissionDecision, refused: AdmissionDecision, tmp_path: Path) -> None:
    base = {"max_batch_size": 64, "speculative_config": {"decoding_type": "DSpark", "max_draft_len": 5}}
    for decision in (admitted, refused):
        options = decoding_fields(decision, selector_identity=SELECTOR, exporter=fake_export)
        merged = options.llm_api_options(base)
        text = dump_options_yaml(merged)
        assert load_options_yaml(text) == merged
        path = write_options_yaml(tmp_path / "extra_llm_api_options.yaml", merged)
        assert load_options_yaml(path.read_text()) == merged
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        section = merged["speculative_config"]
        assert section["enable_confidence_scheduling"] is decision.active
        decode_fields = [f for f in CONFIDENCE_FIELDS if f != "confidence_mixed_evidence"]
        assert all((f in section) is decision.active for f in decode_fields)
        assert "confidence_mixed_evidence" not in section  # no mixed evidence in these bundles


def test_load_options_yaml_refuses_non_mappings() -> None:
    assert load_options_yaml("") == {}
    with pytest.raises(ConfigError):
        load_options_yaml("- a\n- b\n")
    with pytest.raises(ConfigError):
        load_options_yaml("a: [\n")


#: (id, base options, the key the error names): shapes no DSpark fields can be merged into.
UNMERGEABLE = [
    ("top-level-list", [1, 2], "mapping at the top"),
    ("speculative-config-list", {"speculative_config": [1, 2]}, "speculative_config must be a mapping"),
    ("speculative-config-string", {"speculative_config": "DSpark"}, "speculative_config must be a mapping"),
    ("speculative-config-int-key", {"speculative_config": {1: 2}}, "speculative_config keys"),
    ("int-option-name", {1: "x"}, "option names"),
    ("other-decoding-type", {"speculative_config": {"decoding_type": "Eagle"}}, "decoding_type"),
]


@pytest.mark.parametrize(("name", "base", "named"), UNMERGEABLE, ids=[c[0] for c in UNMERGEABLE])
def test_merge_refuses_what_it_cannot_merge_into(name: str, base: Any, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        check_options(base, "base.yaml")
    with pytest.raises(ConfigError, match=named):
        llm_api_options(static_decoding_fields(), base, max_draft_len=5)


def test_null_speculative_config_is_created() -> None:
    merged = llm_api_options(static_decoding_fields(), {"speculative_config": None}, max_draft_len=5)
    assert merged["speculative_config"]["decoding_type"] == "DSpark"


def test_tensorrt_llm_classes_only_when_importable() -> None:
    import importlib.util

    if importlib.util.find_spec("tensorrt_llm") is None:
        assert to_decoding_config(static_decoding_fields()) is None
