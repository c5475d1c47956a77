"""The FastStream worker app: stage subscribers, responders, embedded stack (composition root)."""
