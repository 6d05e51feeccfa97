"""``dspark-calibrate schema validate|list``: check JSON files against the shipped JSON Schemas.

``validate`` recognises any JSON file the tool writes (a DSSE envelope with its payload, the trust
root, the rollback state, the TensorRT-LLM package, the mixed evidence's result files,
fit-report.json, build.json, ...) and validates it offline: every schema is resolved from the
package, nothing is fetched. Exit codes: 0 every file valid, 1 any invalid, 2 any file unknown
(no shipped schema recognises it) or unreadable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    JsonFlag,
    command,
    err_console,
    exit_with,
    fail_usage,
    make_app,
    out_console,
    print_json,
)
from dspark_calibrate.errors import InvalidValueError

__all__ = ["register"]

#: The largest file validated, in bytes: the biggest file the tool writes (a mixed cost file of
#: 256 cells) is well under 1 MiB.
MAX_SCHEMA_FILE_BYTES = 64 << 20
#: Problems printed per invalid file without --verbose.
_SHOWN_PROBLEMS = 3

schema_app = make_app(None, "JSON Schemas of the files the tool writes: validate files offline, list them.")

FilesArgument = Annotated[
    list[Path],
    typer.Argument(
        help="JSON files the tool wrote (DSSE envelopes included: their payload is checked too).",
        metavar="FILE...",
        show_default=False,
    ),
]
SchemaOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="Validate against this schema instead of the recognised one (see `schema list`).",
        metavar="NAME",
        show_default=False,
    ),
]
VerboseFlag = Annotated[bool, typer.Option("--verbose", "-v", help="Print every problem, not the first three.")]


def _check_one(path: Path, schema: str | None) -> dict[str, Any]:
    """One file's outcome: ``{path, status, schema, problems, ...}``; status is valid, invalid,
    unknown or unreadable."""
    from dspark_calibrate.artifacts import FileTooLarge, read_regular_file, validate_bytes

    entry: dict[str, Any] = {"path": str(path), "schema": None, "problems": [], "payload": None}
    try:
        data = read_regular_file(path, MAX_SCHEMA_FILE_BYTES)
        report = validate_bytes(data, where=str(path), schema=schema, filename=path.name)
    except FileTooLarge as big:
        return {**entry, "status": "unreadable", "reason": f"{big.size} bytes is above the {MAX_SCHEMA_FILE_BYTES}-byte limit"}
    except OSError as exc:
        return {**entry, "status": "unreadable", "reason": f"cannot read ({exc.strerror or exc})"}
    except InvalidValueError as exc:
        return {**entry, "status": "unreadable", "reason": str(exc).removeprefix(f"{path}: ")}
    if not report.known:
        return {**entry, "status": "unknown", "reason": "no shipped schema recognises it"}
    problems = report.all_problems()
    return {
        **entry,
        "status": "valid" if report.ok else "invalid",
        "schema": report.schema,
        "payload": report.payload.schema if report.payload is not None else None,
        "problems": [p.to_dict() for p in problems],
    }


def _print_entry(entry: dict[str, Any], verbose: bool) -> None:
    path, status = escape(entry["path"]), entry["status"]
    if status == "valid":
        inner = f"; payload: {entry['payload']}" if entry["payload"] else ""
        out_console.print(f"[green]VALID[/] {path} ({entry['schema']}{inner})")
    elif status == "invalid":
        problems = entry["problems"]
        first = problems[0]
        err_console.print(
            f"[bold red]INVALID[/] {path} ({entry['schema']}): {escape(first['where'])}: {escape(first['message'])}"
        )
        shown = problems[1:] if verbose else problems[1:_SHOWN_PROBLEMS]
        for p in shown:
            err_console.print(f"  also {escape(p['where'])}: {escape(p['message'])}")
        if len(problems) > len(shown) + 1:
            err_console.print(f"  and {len(problems) - len(shown) - 1} more (--verbose prints them)")
    elif status == "unknown":
        err_console.print(
            f"[bold red]error:[/] {path}: {entry['reason']}; if dspark-calibrate wrote it, name its schema with "
            "--schema NAME (`dspark-calibrate schema list`)"
        )
    else:
        err_console.print(f"[bold red]error:[/] {path}: {escape(entry['reason'])}; give a JSON file the tool wrote")


#: The ``--json`` error of a run, by the worst status seen: (code, fix).
_ERRORS: dict[str, tuple[str, str]] = {
    "unreadable": ("IO_ERROR", "give JSON files the tool wrote"),
    "unknown": ("SCHEMA_UNKNOWN", "name the schema with --schema NAME (`dspark-calibrate schema list`)"),
    "invalid": ("SCHEMA_INVALID", "regenerate the file with the command that wrote it, or restore the original"),
}


def _document(entries: list[dict[str, Any]], code: int) -> dict[str, Any]:
    worst = next((s for s in _ERRORS if any(e["status"] == s for e in entries)), None)
    first = next((e for e in entries if e["status"] == worst), None)
    message = None
    if first is not None:
        detail = first["problems"][0] if first["problems"] else {"where": "", "message": first.get("reason", "")}
        message = f"{first['path']}: {detail['where'] + ': ' if detail['where'] else ''}{detail['message']}"
    return {
        "ok": code == EXIT_OK,
        "error": _ERRORS[worst][0] if worst else None,
        "message": message,
        "fix": _ERRORS[worst][1] if worst else None,
        "exit_code": code,
        "files": entries,
    }


@command(
    schema_app,
    "validate",
    "dspark-calibrate schema validate trtllm/*.json bundle/*.dsse.json",
    "dspark-calibrate schema validate opts-files/trtllm/admission_receipt.json --schema admission-receipt",
)
def validate(
    files: FilesArgument,
    schema: SchemaOption = None,
    verbose: VerboseFlag = False,
    json_out: JsonFlag = False,
) -> None:
    """Validate FILE... against the shipped JSON Schemas, offline (a DSSE envelope and its payload).

    Exit 0 every file valid, 1 any invalid, 2 any unknown or unreadable.
    """
    from dspark_calibrate.artifacts import DOCUMENT_SCHEMAS

    if schema is not None and schema not in DOCUMENT_SCHEMAS:
        fail_usage(f"--schema {schema!r} is not a shipped schema; choose one of {', '.join(DOCUMENT_SCHEMAS)}")
    entries = [_check_one(path, schema) for path in files]
    statuses = {e["status"] for e in entries}
    code = (
        EXIT_USAGE
        if statuses & {"unknown", "unreadable"}
        else EXIT_REJECTED
        if "invalid" in statuses
        else EXIT_OK
    )
    if json_out:
        print_json(_document(entries, code))
    else:
        for entry in entries:
            _print_entry(entry, verbose)
    exit_with(code)


@command(schema_app, "list", "dspark-calibrate schema list", "dspark-calibrate schema list --json")
def list_schemas(json_out: JsonFlag = False) -> None:
    """List the shipped JSON Schemas: name, title and where each file lives."""
    from dspark_calibrate.artifacts import DOCUMENT_SCHEMAS
    from dspark_calibrate.schemas import json_schema

    rows = [
        {"name": n, "title": json_schema(n)["title"], "id": json_schema(n)["$id"]} for n in DOCUMENT_SCHEMAS
    ]
    if json_out:
        print_json({"ok": True, "schemas": rows, "directory": str(_schema_dir())})
    else:
        out_console.print(f"JSON Schemas (draft 2020-12) in {_schema_dir()}:")
        for row in rows:
            out_console.print(f"  {row['name']:<38}{row['title']}")
    exit_with(EXIT_OK)


def _schema_dir() -> Path:
    from importlib import resources

    return Path(str(resources.files("dspark_calibrate.schemas")))


def register(app: typer.Typer) -> None:
    """Add the ``schema`` group to the app."""
    app.add_typer(schema_app, name="schema")
