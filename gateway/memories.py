"""Routes (filled in by the following commits)."""

from fastapi import APIRouter

router = APIRouter()
