from __future__ import annotations

from pydantic import BaseModel


class WhoAmI(BaseModel):
    project: str
    project_id: int
