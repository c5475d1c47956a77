"""Wire models and settings shared by every part of memstream (pydantic + stdlib only)."""
