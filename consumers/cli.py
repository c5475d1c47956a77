"""Worker-side CLI verbs, registered into ``memstream`` through the ``memstream.cli``
entry-point group (so the agent SDK's CLI never imports the workers)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dev``, ``worker``, ``bench ...``, ``doctor`` ... to the ``memstream`` CLI."""
    from memstream.consumers.admin import register as register_admin
    from memstream.consumers.bench import register as register_bench
    from memstream.consumers.creds import register as register_creds
    from memstream.consumers.dlq import register as register_dlq
    from memstream.consumers.doctor import register as register_doctor
    from memstream.consumers.keys import register as register_keys
    from memstream.consumers.ops import register as register_ops
    from memstream.consumers.run import register as register_run
    from memstream.consumers.webconsole import register as register_console

    register_run(sub)
    register_bench(sub)
    register_ops(sub)
    register_keys(sub)
    register_dlq(sub)
    register_console(sub)
    register_creds(sub)
    register_doctor(sub)
    register_admin(sub)
