"""The ``library_layers`` table: one row per library layer a job wrote for a project's model.

The files are the layer (``<data dir>/libraries/<model key>/v<N>/``, written once by
``pipeline.run_loop``); the row says whose it is and for which ``model_uri``, so triage of a run of
that model reads the newest layer over the base library.  Layers are per project: one project's
reproductions never change another's verdicts.
"""

from __future__ import annotations

from datetime import datetime

from moeproxy.service.db import Base, UTCDateTime, utcnow
from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column


class LibraryLayer(Base):
    __tablename__ = "library_layers"
    __table_args__ = (
        Index("ix_library_layers_project_id_model_uri", "project_id", "model_uri"),
        UniqueConstraint("model_key", "version", name="uq_library_layers_model_key_version"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    model_uri: Mapped[str] = mapped_column(Text)
    model_key: Mapped[str] = mapped_column(String(64))  # pipeline.model_key: the weights' hash
    version: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)  # the layer's directory (fingerprints.json, manifest.json)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("reproduction_jobs.id", ondelete="SET NULL"))
    fingerprints: Mapped[int] = mapped_column(Integer)
    strong_threshold: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
