"""``dspark-verify --emit-trtllm-options`` / ``--fail-open-to-static``: the launcher's runtime form."""

from __future__ import annotations

import json
import os
import stat
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.artifacts._export_trtllm import TRTLLM_FILES, export_trtllm
from dspark_calibrate.cli.verify import verify_app
from dspark_calibrate.cli.verify_runtime import default_export_dir
from dspark_calibrate.runtime_plugin import trtllm
from dspark_calibrate.runtime_plugin.trtllm import CONFIDENCE_FIELDS, load_options_yaml
from tests.factories import make_fingerprint
from tests.runtime_plugin.bundles import make_bundle
from tests.runtime_plugin.test_trtllm import SELECTOR
from tests.signing import make_root, make_signers

runner = CliRunner()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("cli")
    keys = make_signers(tmp / "keys", 1)
    issued = datetime.now(UTC) - timedelta(minutes=1)  # the CLI reads the real clock
    bundle = make_bundle(tmp / "bundle", keys, issued_at=issued)
    root = tmp / "root.json"
    root.write_bytes(make_root(keys, expires=issued + timedelta(days=365)).to_bytes())
    live = tmp / "live.json"
    live.write_text(json.dumps(make_fingerprint().to_dict()))
    other = tmp / "other-live.json"
    other.write_text(json.dumps(make_fingerprint(gpu="B300").to_dict()))
    return {"bundle": bundle, "root": root, "live": live, "other": other}


@pytest.fixture(autouse=True)
def exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real exporter, reached through its module until artifacts lists it among its public names.
    monkeypatch.setattr(trtllm, "_default_exporter", lambda: export_trtllm)


def invoke(d: dict[str, Path], *extra: str, live: str = "live") -> Any:
    args = [str(d["bundle"]), "--trust-root", str(d["root"]), "--expect-fingerprint", str(d[live]), *extra]
    return runner.invoke(verify_app, args)


def test_admitted_writes_active_options(deployment: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "opts.yaml"
    result = invoke(deployment, "--emit-trtllm-options", str(out), "--selector-identity", SELECTOR, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["active"] is True and report["decision"]["reason_code"] == "OK"
    section = load_options_yaml(out.read_text())["speculative_config"]
    assert section["enable_confidence_scheduling"] is True
    files = tmp_path / "opts-files" / trtllm.PACKAGE_DIR
    assert Path(section["confidence_sps_table_path"]) == files / "sps_table.json"
    assert sorted(p.name for p in files.iterdir()) == sorted(TRTLLM_FILES)


@pytest.mark.parametrize(("fail_open", "code"), [(False, 1), (True, 0)])
def test_rejection_writes_static_options(
    deployment: dict[str, Path], tmp_path: Path, fail_open: bool, code: int
) -> None:
    out = tmp_path / "opts.yaml"
    flags = ["--fail-open-to-static"] if fail_open else []
    result = invoke(
        deployment, "--emit-trtllm-options", str(out), "--selector-identity", SELECTOR, *flags, live="other"
    )
    assert result.exit_code == code, result.output
    assert "FINGERPRINT_MISMATCH:gpu" in result.output
    section = load_options_yaml(out.read_text())["speculative_config"]
    assert section == {"decoding_type": "DSpark", "max_draft_len": 5, "enable_confidence_scheduling": False}


def test_missing_bundle_fails_open(deployment: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "opts.yaml"
    args = [
        str(tmp_path / "nope"),
        "--trust-root",
        str(deployment["root"]),
        "--emit-trtllm-options",
        str(out),
        "--fail-open-to-static",
    ]
    result = runner.invoke(verify_app, args)
    assert result.exit_code == 0, result.output
    assert load_options_yaml(out.read_text())["speculative_config"]["enable_confidence_scheduling"] is False


def test_missing_selector_identity_is_a_usage_error(deployment: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "opts.yaml"
    result = invoke(deployment, "--emit-trtllm-options", str(out))  # no --selector-identity
    assert result.exit_code == 2
    assert "--selector-identity" in result.stderr and "EXACT_SPS_SELECTOR_IDENTITY_SHA256" in result.stderr
    assert not out.exists()


def test_export_failure_fails_open_loudly(deployment: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "opts.yaml"
    result = invoke(deployment, "--emit-trtllm-options", str(out), "--fail-open-to-static")
    assert result.exit_code == 0
    assert "EXPORT_FAILED:selector_identity" in result.output
    assert load_options_yaml(out.read_text())["speculative_config"]["enable_confidence_scheduling"] is False


@pytest.mark.parametrize(("fail_open", "code"), [(False, 2), (True, 0)])
def test_bad_live_option(deployment: dict[str, Path], tmp_path: Path, fail_open: bool, code: int) -> None:
    out = tmp_path / "opts.yaml"
    args = [
        str(deployment["bundle"]),
        "--trust-root",
        str(deployment["root"]),
        "--live-ladder",
        "8,x",
        "--emit-trtllm-options",
        str(out),
        *(["--fail-open-to-static"] if fail_open else []),
    ]
    result = runner.invoke(verify_app, args)
    assert result.exit_code == code, result.output
    assert out.exists() is fail_open


def test_unwritable_output_is_an_io_error(deployment: dict[str, Path], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke(
        deployment,
        "--emit-trtllm-options",
        str(blocker / "opts.yaml"),
        "--fail-open-to-static",
        "--selector-identity",
        SELECTOR,
        "--trtllm-dir",
        str(tmp_path / "files"),
    )
    assert result.exit_code == 2


def test_base_options_are_merged(deployment: dict[str, Path], tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(
        "max_batch_size: 64\nspeculative_config:\n  decoding_type: DSpark\n  max_draft_len: 5\n"
        "  confidence_sts_path: /stale/sts.json\n"
    )
    out = tmp_path / "opts.yaml"
    result = invoke(
        deployment,
        "--emit-trtllm-options",
        str(out),
        "--base-options",
        str(base),
        "--fail-open-to-static",
        live="other",
    )
    assert result.exit_code == 0
    merged = load_options_yaml(out.read_text())
    assert merged["max_batch_size"] == 64
    assert merged["speculative_config"] == {
        "decoding_type": "DSpark",
        "max_draft_len": 5,
        "enable_confidence_scheduling": False,
    }
    assert not any(f in merged["speculative_config"] for f in CONFIDENCE_FIELDS)


def test_runtime_form_takes_one_bundle(deployment: dict[str, Path], tmp_path: Path) -> None:
    args = [
        str(deployment["bundle"]),
        str(deployment["bundle"]),
        "--trust-root",
        str(deployment["root"]),
        "--emit-trtllm-options",
        str(tmp_path / "o.yaml"),
    ]
    assert runner.invoke(verify_app, args).exit_code == 2


def test_plain_verify_is_unchanged(deployment: dict[str, Path]) -> None:
    result = invoke(deployment)
    assert result.exit_code == 0, result.output
    assert "VALID" in result.output


def test_a_bundle_without_mixed_evidence_is_not_a_missing_member(
    deployment: dict[str, Path], tmp_path: Path
) -> None:
    """Built without --mixed-sweep: decode is admitted, mixed steps run native, and the command
    says so plainly (no warning, no missing-member code) and names the folder of exported files."""
    out = tmp_path / "opts.yaml"
    result = invoke(deployment, "--emit-trtllm-options", str(out), "--selector-identity", SELECTOR)
    assert result.exit_code == 0, result.output
    assert "MIXED NATIVE" not in result.stderr and "BUNDLE_MEMBER_MISSING" not in result.output
    assert "mixed: " in result.stderr and "built without mixed evidence" in result.stderr
    assert f"wrote {out} and the files it names in {tmp_path / 'opts-files'}/" in " ".join(result.stderr.split())
    doc = json.loads(
        invoke(
            deployment, "--emit-trtllm-options", str(tmp_path / "o2.yaml"), "--selector-identity", SELECTOR, "--json"
        ).stdout
    )
    assert doc["decision"]["mixed"]["reason_code"] == "MIXED_ABSENT"


# --- hardening, round two: hostile base options, output paths, anything failing after admission ---

#: (id, --base-options content, what the error names): each once exhausted or crashed the parser
#: or the merge (a traceback, and no options written even under --fail-open-to-static).
BAD_BASE_OPTIONS = [
    ("speculative-config-a-list", "speculative_config: [1, 2]\n", "speculative_config"),
    ("speculative-config-a-string", "speculative_config: DSpark\n", "speculative_config"),
    ("nested-2000-deep", "a: " + "[" * 2000 + "]" * 2000 + "\n", "nest"),
    ("integer-of-5000-digits", "max_batch_size: " + "9" * 5000 + "\n", "digit"),
    ("list-of-1-mib", "batch_sizes: [" + "1, " * 350_000 + "1]\n", "limit"),
    ("list-of-150-kib", "batch_sizes: [" + "1, " * 50_000 + "1]\n", "nodes"),
    (
        "alias-bomb",
        "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
        + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n" for i in range(7)
        ),
        "nodes",
    ),
    ("repeated-key", "max_batch_size: 1\nmax_batch_size: 2\n", "repeats"),
    ("not-a-mapping", "- a\n- b\n", "mapping"),
    ("other-decoding-type", "speculative_config:\n  decoding_type: Eagle\n", "decoding_type"),
    ("not-utf8", "max_batch_size: \xff\n", "UTF-8"),
]


def _base(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "base.yaml"
    path.write_bytes(content.encode("latin-1"))
    return path


@pytest.mark.parametrize(("name", "content", "named"), BAD_BASE_OPTIONS, ids=[c[0] for c in BAD_BASE_OPTIONS])
def test_bad_base_options_exit_2_cleanly(
    deployment: dict[str, Path], tmp_path: Path, name: str, content: str, named: str
) -> None:
    base, out = _base(tmp_path, content), tmp_path / "opts.yaml"
    started = time.monotonic()
    result = invoke(
        deployment,
        "--emit-trtllm-options",
        str(out),
        "--selector-identity",
        SELECTOR,
        "--base-options",
        str(base),
    )
    assert time.monotonic() - started < 10
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    assert str(base) in result.stderr and named in result.stderr, result.stderr
    assert not out.exists()


@pytest.mark.parametrize(("name", "content", "named"), BAD_BASE_OPTIONS, ids=[c[0] for c in BAD_BASE_OPTIONS])
def test_bad_base_options_fail_open_to_static(
    deployment: dict[str, Path], tmp_path: Path, name: str, content: str, named: str
) -> None:
    base, out = _base(tmp_path, content), tmp_path / "opts.yaml"
    result = invoke(
        deployment,
        "--emit-trtllm-options",
        str(out),
        "--selector-identity",
        SELECTOR,
        "--base-options",
        str(base),
        "--fail-open-to-static",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert isinstance(result.exception, SystemExit) or result.exception is None
    assert json.loads(result.stdout)["error"] == "CONFIG_INVALID:base_options"
    section = load_options_yaml(out.read_text())["speculative_config"]
    assert section["enable_confidence_scheduling"] is False
    assert not any(f in section for f in CONFIDENCE_FIELDS)


@pytest.mark.parametrize(("name", "content", "named"), BAD_BASE_OPTIONS, ids=[c[0] for c in BAD_BASE_OPTIONS])
def test_export_refuses_bad_base_options_cleanly(
    deployment: dict[str, Path], tmp_path: Path, name: str, content: str, named: str
) -> None:
    from dspark_calibrate.cli import build_calibrate_app

    base = _base(tmp_path, content)
    args = ["export", "trtllm", str(deployment["bundle"]), "--trust-root", str(deployment["root"])]
    args += ["--selector-identity", SELECTOR, "--out", str(tmp_path / "pkg"), "--base-options", str(base)]
    result = runner.invoke(build_calibrate_app(), args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert str(base) in result.stderr and named in result.stderr, result.stderr


def _char_device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # /dev/full's numbers


#: (id, make OUT): paths that are not a regular file; a rename over them would replace them.
NOT_A_FILE = [
    ("character-device", _char_device),
    ("fifo", lambda p: os.mkfifo(p)),
    ("directory", lambda p: p.mkdir()),
    ("symlink-out-of-its-directory", lambda p: p.symlink_to(p.parent.parent / "elsewhere.yaml")),
    ("symlink-to-a-fifo", lambda p: (os.mkfifo(p.with_name("f")), p.symlink_to(p.with_name("f")))),
]


@pytest.mark.parametrize("fail_open", [False, True])
@pytest.mark.parametrize(("name", "make"), NOT_A_FILE, ids=[c[0] for c in NOT_A_FILE])
def test_output_that_is_not_a_regular_file_is_refused(
    deployment: dict[str, Path], tmp_path: Path, name: str, make: Any, fail_open: bool
) -> None:
    out = tmp_path / "d" / "opts.yaml"
    out.parent.mkdir()
    make(out)
    before = os.lstat(out)
    state = tmp_path / "state" / "rollback.json"
    flags = ["--fail-open-to-static"] if fail_open else []
    result = invoke(
        deployment,
        "--emit-trtllm-options",
        str(out),
        "--selector-identity",
        SELECTOR,
        "--state",
        str(state),
        *flags,
    )
    assert result.exit_code == 2, result.output
    assert "--emit-trtllm-options" in result.stderr
    assert "regular file" in result.stderr or "symlink" in result.stderr or "directory" in result.stderr
    after = os.lstat(out)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)  # untouched
    assert not default_export_dir(out).exists() and not state.exists()  # nothing exported or admitted


def test_symlink_within_its_directory_is_written_through(deployment: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "opts.v2.yaml"
    out = tmp_path / "opts.yaml"
    out.symlink_to(target.name)
    result = invoke(deployment, "--emit-trtllm-options", str(out), "--selector-identity", SELECTOR)
    assert result.exit_code == 0, result.output
    assert out.is_symlink() and load_options_yaml(target.read_text())["speculative_config"]


def test_whatever_fails_after_admission_leaves_static_options(
    deployment: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale OUT from an earlier admitted run must never survive: under --fail-open-to-static the
    static options are on disk before anything can fail."""
    out = tmp_path / "opts.yaml"
    assert (
        invoke(deployment, "--emit-trtllm-options", str(out), "--selector-identity", SELECTOR).exit_code == 0
    )
    assert load_options_yaml(out.read_text())["speculative_config"]["enable_confidence_scheduling"] is True

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the exporter's disk vanished")

    monkeypatch.setattr(trtllm, "decoding_fields", crash)
    result = invoke(
        deployment,
        "--emit-trtllm-options",
        str(out),
        "--selector-identity",
        SELECTOR,
        "--fail-open-to-static",
    )
    assert isinstance(result.exception, RuntimeError)  # an unforeseen failure still propagates
    section = load_options_yaml(out.read_text())["speculative_config"]
    assert section["enable_confidence_scheduling"] is False
    assert not any(f in section for f in CONFIDENCE_FIELDS)


def test_bad_trust_root_fails_open_to_static(deployment: dict[str, Path], tmp_path: Path) -> None:
    out, root = tmp_path / "opts.yaml", tmp_path / "root.json"
    root.write_text('{"signed": ')
    args = [
        str(deployment["bundle"]),
        "--trust-root",
        str(root),
        "--expect-fingerprint",
        str(deployment["live"]),
    ]
    result = runner.invoke(verify_app, [*args, "--emit-trtllm-options", str(out), "--fail-open-to-static"])
    assert result.exit_code == 0, result.output
    assert "TRUST_ROOT_INVALID" in result.stderr
    assert load_options_yaml(out.read_text())["speculative_config"]["enable_confidence_scheduling"] is False
