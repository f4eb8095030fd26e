"""Row builders and file writers shared by the data tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Sequence


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write rows in the format the file ending names (.json array, .jsonl, .jsonl.gz, .parquet, .csv)."""
    name = path.name
    if name.endswith(".jsonl.gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif name.endswith(".json"):
        path.write_text(json.dumps(list(rows)))
    elif name.endswith((".parquet", ".csv")):
        import datasets

        ds = datasets.Dataset.from_list(list(rows))
        ds.to_parquet(str(path)) if name.endswith(".parquet") else ds.to_csv(str(path), index=False)
    else:
        raise ValueError(f"no writer for {path}")
    return path


def explicit_rows(n: int) -> list[dict[str, str]]:
    """``n`` distinct explicit-prompt pairs of varied lengths."""
    return [
        {
            "prompt": f"Question {i}: " + "why? " * (i % 7),
            "chosen": f"Good answer {i}." + " more" * (i % 11),
            "rejected": f"Bad answer {i}." + " less" * (i % 5),
        }
        for i in range(n)
    ]


def implicit_rows(n: int) -> list[dict[str, str]]:
    """``n`` HH-RLHF style full dialogues."""
    rows = []
    for r in explicit_rows(n):
        prompt = f"\n\nHuman: {r['prompt']}\n\nAssistant:"
        rows.append({"chosen": prompt + " " + r["chosen"], "rejected": prompt + " " + r["rejected"]})
    return rows


def conversational_rows(n: int) -> list[dict[str, Any]]:
    """``n`` conversational pairs: message lists."""
    return [
        {
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "chosen": [{"role": "assistant", "content": r["chosen"]}],
            "rejected": [{"role": "assistant", "content": r["rejected"]}],
        }
        for r in explicit_rows(n)
    ]


def implicit_conversational_rows(n: int) -> list[dict[str, Any]]:
    """The pairs of :func:`conversational_rows` as whole conversations without a prompt column (TRL's
    implicit-prompt conversational format)."""
    return [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]}
            for r in conversational_rows(n)]


#: A minimal chat template: each message on its own line, tagged with its role.
SIMPLE_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
