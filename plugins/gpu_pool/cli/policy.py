"""Policy commands: ``policy show``, ``set``, ``check``, ``history``, ``diff``, ``restore``.

The sharing policy is a YAML document (:mod:`gpu_pool.policy_file`) versioned in the store
(:mod:`gpu_pool.store.policy`). Every refusal is one line and exit 2, and leaves the store
as it was: a document is validated whole before anything is written.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from gpu_pool.cli import add_command, add_group
from gpu_pool.cli.context import open_store
from gpu_pool.cli.output import emit, emit_object
from gpu_pool.errors import NotFoundError, SpecError
from gpu_pool.policy_file import (
    KEYS,
    changed_keys,
    check_document,
    load_document,
    merge_assignments,
    parse_policy,
    policy_values,
)
from gpu_pool.spec import parse_int, parse_text, read_input_file
from gpu_pool.store.policy import diff_counts, unified_diff


def register(subparsers: argparse._SubParsersAction) -> None:
    group = add_group(subparsers, "policy", "the sharing policy: headroom, off-peak, "
                      "borrowing, preemption, weights (versioned)")
    add_command(group, "show", "every value in force and where it comes from").set_defaults(
        func=show)
    p = add_command(group, "set", "set the whole policy from a YAML file, or single keys "
                    "(key=value ...) merged onto the document in force")
    p.add_argument("items", nargs="+", metavar="FILE|KEY=VALUE")
    p.add_argument("--comment", help="why (kept in the history)")
    p.add_argument("--actor", help="who sets it (default: the login name)")
    p.set_defaults(func=set_policy)
    p = add_command(group, "check", "validate a policy file; nothing is written")
    p.add_argument("file", type=Path)
    p.set_defaults(func=check)
    add_command(group, "history", "every version: who, when, why, lines added/removed"
                ).set_defaults(func=history)
    p = add_command(group, "diff", "the unified diff between two versions (0: the defaults)")
    p.add_argument("a")
    p.add_argument("b")
    p.set_defaults(func=diff)
    p = add_command(group, "restore", "make an older version's document the policy again "
                    "(as a new version)")
    p.add_argument("version")
    p.add_argument("--comment", help="why (kept in the history)")
    p.add_argument("--actor", help="who restores it (default: the login name)")
    p.set_defaults(func=restore)


def _actor(args: argparse.Namespace) -> str:
    if args.actor is not None:
        return parse_text(args.actor, "actor", max_chars=200, spaces=False)
    try:
        return getpass.getuser() or "cli"
    except (OSError, KeyError):  # no login name in a container
        return "cli"


def _version(value: str, field: str) -> int:
    text = value.strip()
    return parse_int(text[1:] if text[:1] in ("v", "V") else text, field, minimum=0,
                     maximum=2**31 - 1, hint="a policy version like 3 or v3 (0: the defaults)")


def _comment(args: argparse.Namespace) -> str | None:
    return None if args.comment is None else parse_text(args.comment, "comment")


CELL_CHARS = 72


def _cell(value: Any) -> str:
    """A table cell of a value; a long one is cut (``--json`` shows it whole)."""
    text = json.dumps(value, separators=(", ", ": ")) if isinstance(value, dict | list) \
        else str(value)
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 3] + "..."


def _document(store: Any, version: int, field: str) -> str:
    """The document of ``version``; an unknown version is bad input (exit 2)."""
    try:
        return store.policy_document(version)
    except NotFoundError as error:
        known = ", ".join(f"v{v.version}" for v in store.policy_history(20)) or "none yet"
        raise SpecError(field, f"v{version}", f"a version that was set ({known}) or 0 for "
                        "the defaults") from error


def show(args: argparse.Namespace) -> int:
    store = open_store(args)
    latest, sources = store.policy_sources()
    values = policy_values(store.load_policy())
    rows = [{"key": k, "value": values[k],
             "source": "default" if sources[k] is None else sources[k].label} for k in KEYS]
    if args.json:
        emit_object(True, {"version": 0 if latest is None else latest.version,
                           "set_by": None if latest is None else latest.actor,
                           "set_at": None if latest is None else latest.created_at,
                           "values": rows})
        return 0
    title = ("policy: defaults (no version set)" if latest is None
             else f"policy {latest.label}" + (f": {latest.comment}" if latest.comment else ""))
    sys.stdout.write(title + " (long values cut; --json shows them whole)\n")
    emit(False, [{**r, "value": _cell(r["value"])} for r in rows], ("key", "value", "source"))
    return 0


def set_policy(args: argparse.Namespace) -> int:
    comment, actor = _comment(args), _actor(args)
    if len(args.items) == 1 and "=" not in args.items[0]:
        source = args.items[0]
        document = read_input_file(source, "file")
        check_document(document, source)
        store = open_store(args)
    else:
        store = open_store(args)
        current = store.policy_document(store.policy_version())
        merged = merge_assignments(current, args.items)
        parse_policy(merged)  # the whole document, before anything is written
        document = yaml.safe_dump(merged, sort_keys=False, default_flow_style=False,
                                  allow_unicode=True)
    before = store.load_policy()
    number = store.set_policy(document, actor, comment)
    after = store.load_policy()
    emit_object(args.json, {"policy": f"v{number}", "by": actor,
                            "changed": changed_keys(before, after)})
    return 0


def check(args: argparse.Namespace) -> int:
    document = read_input_file(args.file, "file")
    policy = check_document(document, str(args.file))
    data = load_document(document)
    emit_object(args.json, {"file": str(args.file), "valid": True,
                            "keys_set": sorted(data), "keys_default": len(KEYS) - len(data),
                            "differs_from_defaults": changed_keys(parse_policy({}), policy)})
    return 0


def history(args: argparse.Namespace) -> int:
    store = open_store(args)
    rows = []
    previous = ""
    for v in store.policy_history():
        added, removed = diff_counts(unified_diff(previous, v.document, "a", "b"))
        previous = v.document
        rows.append({"version": v.version, "by": v.actor, "at": v.created_at,
                     "comment": v.comment or (f"restored v{v.restored_from}"
                                              if v.restored_from else None),
                     "lines": f"+{added} -{removed}"})
    emit(args.json, rows, ("version", "by", "at", "comment", "lines"),
         empty="no policy versions (the defaults are in force)")
    return 0


def diff(args: argparse.Namespace) -> int:
    a, b = _version(args.a, "a"), _version(args.b, "b")
    store = open_store(args)
    text = unified_diff(_document(store, a, "a"), _document(store, b, "b"), f"v{a}", f"v{b}")
    if args.json:
        emit_object(True, {"a": a, "b": b, "diff": text})
    else:
        sys.stdout.write(text or f"v{a} and v{b} are the same document\n")
    return 0


def restore(args: argparse.Namespace) -> int:
    version = _version(args.version, "version")
    if version == 0:
        raise SpecError("version", args.version, "a version that was set, 1 or more (to go "
                        "back to the defaults, set an empty document: {})")
    comment, actor = _comment(args), _actor(args)
    store = open_store(args)
    before = store.load_policy()
    _document(store, version, "version")
    number = store.restore_policy(version, actor, comment)
    emit_object(args.json, {"policy": f"v{number}", "restored": f"v{version}", "by": actor,
                            "changed": changed_keys(before, store.load_policy())})
    return 0
