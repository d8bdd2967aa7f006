"""The ``gpu-pool`` command line.

Each command module (``fleet``, ``workload``, ``demo``, ``simulate``, ``ops``, ``policy``,
``governance``, ``dags``)
defines ``register(subparsers)``, adding its parsers with ``func=handler`` where
``handler(args) -> int``. :func:`main` owns the contract with the shell:

* exit 0 on success, 2 on bad input (a :class:`~gpu_pool.errors.SpecError` or an argparse
  usage error), 1 on any other failure;
* a user never sees a traceback: errors print as one ``gpu-pool: error: ...`` line
  (set ``GPU_POOL_DEBUG=1`` to get the traceback too); a usage error too is one line, which
  names the command and the flag and points to ``--help``;
* every value from the shell is validated by :mod:`gpu_pool.spec` (bounded numbers, decoded
  text, files checked before any work), the same rules as every other way in.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from gpu_pool.errors import GpuPoolError, SpecError

COMMAND_MODULES = ("fleet", "workload", "demo", "simulate", "ops", "policy", "governance",
                   "dags")


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one clear line (it already does) and never a traceback."""

    def error(self, message: str) -> None:  # noqa: D102 - argparse API
        # One line, as every other refusal: the usage block would make it a dozen.
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, metavar="URL",
                        help="store URL (default: $GPU_POOL_DB_URL, the Airflow connection "
                             "gpu_pool_db, else a SQLite file under $AIRFLOW_HOME)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON instead of a table")
    parser = _Parser(prog="gpu-pool", parents=[common],
                     description="Schedule a shared GPU fleet from Airflow.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    subparsers.common = common  # type: ignore[attr-defined]  # command modules reuse it
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"gpu_pool.cli.{name}")
        except ModuleNotFoundError as error:
            if error.name == f"gpu_pool.cli.{name}":
                continue  # an optional part not installed in this build
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help (0) or a usage error (2, its line already printed)
        return done.code if isinstance(done.code, int) else 2
    # Defaults here, not in the parsers: the flags are shared by every subcommand parser,
    # and a default set on one of them would override a value given before the command.
    for name, default in (("db", None), ("json", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        return int(args.func(args) or 0)
    except SpecError as error:
        print(f"gpu-pool: error: {error}", file=sys.stderr)
        return 2
    except GpuPoolError as error:
        print(f"gpu-pool: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # the last line of defence: no traceback for users
        if os.environ.get("GPU_POOL_DEBUG"):
            traceback.print_exc()
        print(f"gpu-pool: error: {type(error).__name__}: {error} "
              "(set GPU_POOL_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def add_command(subparsers: argparse._SubParsersAction, name: str, help_text: str,
                **kwargs: object) -> argparse.ArgumentParser:
    """A subcommand parser that also accepts the global ``--db`` and ``--json``."""
    # argparse %-formats help strings (not descriptions): a bare % in a help text crashed
    # `--help` of the parent command.
    return subparsers.add_parser(name, help=help_text.replace("%", "%%"), description=help_text,
                                 parents=[subparsers.common], **kwargs)  # type: ignore[attr-defined]


def add_group(subparsers: argparse._SubParsersAction, name: str,
              help_text: str) -> argparse._SubParsersAction:
    """A command with subcommands of its own (``gpu-pool nodes import ...``)."""
    parser = add_command(subparsers, name, help_text)
    group = parser.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND",
                                  parser_class=_Parser)
    group.required = True
    group.common = subparsers.common  # type: ignore[attr-defined]
    return group
