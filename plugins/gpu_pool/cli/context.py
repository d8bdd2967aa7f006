"""What every command needs: the store (from ``--db`` or the usual places) and the policy."""

from __future__ import annotations

import argparse
import os
from typing import Any

from sqlalchemy.engine import make_url

from gpu_pool.errors import SpecError
from gpu_pool.model import Policy


def display_url(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy understands: show nothing of it
        return "<unparseable URL>"


def policy(store: Any = None) -> Policy:
    """The policy in force: the open store's latest version (``gpu-pool policy``), or the
    defaults where no store is open (commands that only read a file)."""
    return Policy() if store is None else store.load_policy()


def open_store(args: argparse.Namespace, *, create: bool = False):  # noqa: ANN201 - Store
    """The store for this command.

    It must already exist (a typo in a production URL must not start a new, empty fleet)
    unless the command's job is to create one (``create``: ``db migrate``, ``demo``). An
    existing store of an older schema is upgraded in place.
    """
    from gpu_pool.store import Store, resolve_db_url

    given = getattr(args, "db", None)
    if given is not None and not given.strip():
        raise SpecError("db", given, "a store URL like sqlite:///path/to/gpu_pool.db or "
                        "postgresql://user@host/db (or leave --db out for the default)")
    url = resolve_db_url(given)
    store = Store.from_url(url, create=create)
    if not os.environ.get("GPU_POOL_NO_AUTO_MIGRATE"):
        store.migrate()
    return store
