"""Pure stage logic: extract, redact, dedupe, fuse. No I/O, no clock, no environment."""
