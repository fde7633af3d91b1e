"""The triage object of SPEC section 5, as the API returns it and as evaluations are stored."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Strength = Literal["strong", "weak"]


class TriageCandidate(BaseModel):
    model_config = ConfigDict(extra="allow")  # the engine may add fields (distances, onsets): keep them

    fault_class: str
    family: str
    score: float = Field(ge=0.0, le=1.0)
    strength: Strength
    evidence: list[str] = Field(default_factory=list)


class TriageSiblingNote(BaseModel):
    """Top candidates within a small margin of each other on the same evidence, and what would
    separate them (``moeproxy.signatures.siblings.SiblingNote``)."""

    classes: list[str]
    scores: list[float]
    shared_evidence: list[str] = Field(
        default_factory=list, description="logged metrics the tied classes' evidence rests on in common"
    )
    separate_by: list[str] = Field(
        default_factory=list,
        description='metrics to log ("log X"), metrics to look at ("look at X"), then tests',
    )
    text: str


class ClassHistory(BaseModel):
    fault_class: str
    first_likely_at: datetime | None = None
    first_likely_step: int | None = None
    first_top_at: datetime | None = None
    first_top_step: int | None = None
    last_score: float
    last_strength: Strength


class TriageResponse(BaseModel):
    """``GET /api/v1/runs/{id}/triage``: ranked candidates, ``healthy`` included as a class."""

    run_id: int
    evaluated_at: datetime
    candidates: list[TriageCandidate]
    verdict: str
    siblings: list[TriageSiblingNote] = Field(default_factory=list)  # empty when the top has no tie
    last_step: int | None = None
    evaluations: int = 1  # evaluations folded into the stored outcome this response comes from
    history: list[ClassHistory] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)  # engine extras (plots: change points, shapes)
