"""Redaction quality and speed on a labelled JSONL set (shared/bench/redaction-dev.jsonl format).

Each record is ``{"id", "text", "spans": [{"start", "end", "label", ...}], "source"}``. Scores
(shared/bench/README.md): per gold label, spans caught (at least half of their characters
redacted); character precision (redacted characters inside any gold span, whatever its label,
over all redacted characters); the share of span-free records in which anything was redacted;
throughput in messages/s on ~1.8 kB messages (consecutive records joined), single core.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from memstream.consumers.bench.args import data_file
from memstream.pipeline.redact import Redactor

KEY = b"memstream-bench-redaction-key"
TENANT = "bench"
TARGETS = {
    "EMAIL": 0.99, "IBAN": 0.99, "IP_ADDRESS": 0.99, "US_SSN": 0.99, "CREDIT_CARD": 0.99,
    "PHONE": 0.95, "API_KEY": 0.90, "PRIVATE_KEY": 0.98, "PASSWORD": 0.85,
}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        type=data_file,
        default="../shared/bench/redaction-dev.jsonl",
        help="a redaction JSONL file (default: ../shared/bench/redaction-dev.jsonl)",
    )
    p.add_argument("--message-bytes", type=int, default=1800, help="size of throughput messages")
    p.add_argument("--seconds", type=float, default=3.0, help="minimum throughput run time")
    p.add_argument(
        "--show-misses", type=int, default=0, metavar="N",
        help="print up to N missed spans and N false positives per label (development aid)",
    )  # fmt: skip


def load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def score(records: list[dict[str, Any]], redactor: Redactor, show: int = 0) -> dict[str, Any]:
    gold: Counter[str] = Counter()
    caught: Counter[str] = Counter()
    found: Counter[str] = Counter()
    inside = redacted_chars = negatives = touched = 0
    misses: dict[str, list[str]] = {}
    for rec in records:
        text: str = rec["text"]
        out = redactor.redact(text, TENANT)
        mask = bytearray(len(text))
        for s in out.spans:
            mask[s.start : s.end] = b"\x01" * (s.end - s.start)
            found[s.label] += 1
        in_gold = bytearray(len(text))
        for g in rec["spans"]:
            in_gold[g["start"] : g["end"]] = b"\x01" * (g["end"] - g["start"])
            n = g["end"] - g["start"]
            hit = sum(mask[g["start"] : g["end"]])
            gold[g["label"]] += 1
            if n and hit * 2 >= n:
                caught[g["label"]] += 1
            elif show:
                ctx = text[max(0, g["start"] - 40) : g["start"]]
                val = text[g["start"] : g["end"]][:80]
                misses.setdefault(g["label"], []).append(f"{ctx!r} >> {val!r}")
        redacted_chars += sum(mask)
        inside += sum(m & g for m, g in zip(mask, in_gold, strict=True))
        if show:
            for s in out.spans:
                if not any(in_gold[s.start : s.end]):
                    ctx = text[max(0, s.start - 40) : s.start]
                    fp = f"{ctx!r} >> {text[s.start : s.end][:80]!r}"
                    misses.setdefault("FP:" + s.label, []).append(fp)
        if not rec["spans"]:
            negatives += 1
            touched += bool(out.spans)
    return {
        "labels": {k: {"gold": gold[k], "caught": caught[k]} for k in sorted(gold)},
        "found": dict(found),
        "char_precision": inside / redacted_chars if redacted_chars else 1.0,
        "negatives": negatives,
        "negatives_touched": touched / negatives if negatives else 0.0,
        "misses": misses,
    }


def messages(records: list[dict[str, Any]], size: int) -> list[str]:
    """Consecutive record texts joined by newlines into messages of about ``size`` bytes."""
    out: list[str] = []
    buf: list[str] = []
    n = 0
    for rec in records:
        k = len(rec["text"].encode()) + 1
        if buf and n + k > size * 1.1:
            out.append("\n".join(buf))
            buf, n = [], 0
        buf.append(rec["text"])
        n += k
        if n >= size:
            out.append("\n".join(buf))
            buf, n = [], 0
    if buf:
        out.append("\n".join(buf))
    return out


def throughput(msgs: list[str], redactor: Redactor, seconds: float) -> dict[str, float]:
    done = 0
    nbytes = 0
    started = time.perf_counter()
    while True:
        for m in msgs:
            redactor.redact(m, TENANT)
            nbytes += len(m.encode())
        done += len(msgs)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
    return {
        "msgs_per_s": done / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        "avg_bytes": nbytes / done,
    }


def main(args: argparse.Namespace) -> int:
    records = load(args.data)
    started = time.perf_counter()
    redactor = Redactor(key=KEY)
    build_s = time.perf_counter() - started
    result = score(records, redactor, args.show_misses)
    speed = throughput(messages(records, args.message_bytes), redactor, args.seconds)
    print(
        f"\nRedaction on {args.data.name}: {len(records)} records, {result['negatives']} span-free"
    )
    print(f"{'label':<18}{'gold':>6}{'caught':>8}{'recall':>8}{'target':>8}")
    for label, v in sorted(result["labels"].items(), key=lambda kv: -kv[1]["gold"]):
        recall = v["caught"] / v["gold"] if v["gold"] else 0.0
        target = TARGETS.get(label)
        mark = (
            "" if target is None else f"{target:>8.2f}" + (" ok" if recall >= target else " MISS")
        )
        print(f"{label:<18}{v['gold']:>6}{v['caught']:>8}{recall:>8.3f}{mark}")
    print(f"character precision        {result['char_precision']:.4f}  (target 0.97)")
    print(
        f"span-free records touched  {result['negatives_touched']:.4f}  "
        f"({round(result['negatives_touched'] * result['negatives'])}/{result['negatives']}, "
        "target <= 0.02)"
    )
    print(
        f"throughput                 {speed['msgs_per_s']:,.0f} msgs/s"
        f" at {speed['avg_bytes']:,.0f} B"
        f" ({speed['mb_per_s']:.2f} MB/s, single core; target >= 1,500)"
    )
    print(
        f"redactor build             {build_s * 1000:.0f} ms, gitleaks rules skipped: "
        f"{len(redactor.gitleaks_skipped)}"
    )
    print(f"redacted spans by label    {dict(sorted(result['found'].items()))}")
    for key, lines in sorted(result["misses"].items()):
        print(f"\n-- {key} ({len(lines)})")
        for line in lines[: args.show_misses]:
            print("   ", line)
    if args.json:
        print(
            json.dumps(
                {
                    "labels": result["labels"],
                    "char_precision": round(result["char_precision"], 4),
                    "negatives_touched": round(result["negatives_touched"], 4),
                    "msgs_per_s": round(speed["msgs_per_s"], 1),
                }
            )
        )
    return 0


if __name__ == "__main__":  # python -m memstream.consumers.bench.redaction --data ...
    import sys

    _parser = argparse.ArgumentParser(prog="memstream bench redaction", description=__doc__)
    _parser.add_argument("--json", action="store_true", help="print one JSON object last")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
