"""Finding and recording library layers (``library_layers``). Functions take a session; never commit."""

from __future__ import annotations

from moeproxy.service.loop.models import LibraryLayer
from sqlalchemy import select
from sqlalchemy.orm import Session


def newest_layer(session: Session, project_id: int, model_uri: str | None) -> LibraryLayer | None:
    """The layer triage reads for a run of ``model_uri`` in the project: the newest one written."""
    if not model_uri:
        return None
    return session.scalar(
        select(LibraryLayer)
        .where(LibraryLayer.project_id == project_id, LibraryLayer.model_uri == model_uri)
        .order_by(LibraryLayer.version.desc(), LibraryLayer.id.desc())
        .limit(1)
    )


def record_layer(session: Session, *, project_id: int, model_uri: str, model_key: str, version: int, path: str,
                 job_id: int | None, fingerprints: int, strong_threshold: float) -> LibraryLayer:
    """The row of a layer a job wrote; the same (model key, version) twice returns the first row
    (a job retried after it wrote its layer)."""
    row = session.scalar(select(LibraryLayer).where(LibraryLayer.model_key == model_key,
                                                    LibraryLayer.version == version))
    if row is not None:
        return row
    row = LibraryLayer(project_id=project_id, model_uri=model_uri, model_key=model_key, version=version, path=path,
                       job_id=job_id, fingerprints=fingerprints, strong_threshold=strong_threshold)
    session.add(row)
    session.flush()
    return row
