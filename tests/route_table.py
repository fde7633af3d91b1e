"""Every route the app serves, read from the routers the app includes (``ROUTER_MODULES``).

``app.routes`` cannot be walked for this: FastAPI wraps each included router in an object without
a ``path``, and a test that filtered on ``route.path`` silently checked nothing.
"""

from __future__ import annotations

import importlib


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route of every included router, HEAD/OPTIONS left out."""
    from moeproxy.service.app import ROUTER_MODULES

    return {
        (method, route.path)
        for name in ROUTER_MODULES
        for route in importlib.import_module(name).router.routes
        for method in route.methods - {"HEAD", "OPTIONS"}
    }
