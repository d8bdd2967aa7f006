"""What every command needs: the store (from ``--db`` or the usual places) and the policy."""

from __future__ import annotations

import argparse
import os
from functools import cache

from sqlalchemy.engine import make_url

from gpu_pool.model import Policy


def display_url(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy understands: show nothing of it
        return "<unparseable URL>"


@cache
def policy() -> Policy:
    """The policy in force. Defaults for now; a policy file is a later issue."""
    return Policy()


def open_store(args: argparse.Namespace, *, migrate: bool = True):  # noqa: ANN201 - Store
    """The store for this command; migrated on first use so no command meets an empty schema."""
    from gpu_pool.store import Store, resolve_db_url

    url = resolve_db_url(getattr(args, "db", None) or None)
    store = Store.from_url(url)
    if migrate and not os.environ.get("GPU_POOL_NO_AUTO_MIGRATE"):
        store.migrate()
    return store
