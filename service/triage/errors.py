"""Named triage errors (the app turns a ServiceError into a JSON ``detail`` with its status)."""

from __future__ import annotations

from moeproxy.service.errors import ServiceError


class LibraryUnavailable(ServiceError):
    """The fingerprint library could not be loaded (MOEPROXY_FINGERPRINTS, or the shipped one)."""

    status_code = 503

    def __init__(self, reason: str):
        super().__init__(f"the fingerprint library is not available: {reason}; set MOEPROXY_FINGERPRINTS")
