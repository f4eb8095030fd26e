"""Re-time published benchmarks with their stored commands, in place, and print what moved.

    python lab/scripts/retime-benches.py docs/records/bench/quickstart docs/records/bench/hh-body ...

Each folder's ``bench.json`` names the command that wrote it; that command runs again (same preset, modes, steps,
threads, output folder) and overwrites the folder. Printed per folder: the load the new rounds ran under, and per
configuration (and TRL peer) the old and new median step time and speedup against vanilla (and against each peer),
so that what moved can be corrected in the pages and the old figures kept in the changelog. Run it on a quiet
machine, nothing else heavy beside it: the bench's ratios are of arms alternated in the same minutes, its absolute
seconds are not comparable across days. A command that names no ``--threads`` takes torch's default, which
``OMP_NUM_THREADS`` changes: the script says when the re-run's device or threads differ from the stored run's.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _rows(payload: dict) -> dict[str, dict]:
    rows = {f"{r['mode']}/{r['reference']}/{r['scorer']}/{r.get('prompt', 'shared')}": r for r in payload["results"]}
    rows.update({f"peer {p['name']}": p for p in payload.get("peers") or []})
    return rows


def _ratios(row: dict) -> str:
    keys = ["speedup", *sorted(k for k in row if k.startswith("speedup_vs_") and k != "speedup_vs_peer")]
    return " ".join(f"{k.removeprefix('speedup_')}={row[k]:.2f}x" for k in keys if row.get(k) is not None)


def retime(folder: Path) -> None:
    old = json.loads((folder / "bench.json").read_text())
    argv = shlex.split(old["command"])
    if Path(argv[0]).name != "lit-prunedpo-bench":
        raise SystemExit(f"{folder}/bench.json: its command is not a lit-prunedpo-bench run: {old['command']}")
    subprocess.run([sys.executable, "-m", "lit_prunedpo_lab.bench.cli", *argv[1:]], cwd=REPO, check=True)
    new = json.loads((folder / "bench.json").read_text())
    load = new.get("load") or {}
    print(f"## {folder}: load average {load.get('loadavg_mean')}, wall/CPU {load.get('wall_per_cpu')}")
    if old.get("device_name") != new.get("device_name"):  # e.g. OMP_NUM_THREADS set where the command names none
        print(f"**not the same device or threads**: was {old.get('device_name')}, now {new.get('device_name')}")
    before, after = _rows(old), _rows(new)
    for name, row in after.items():
        was = before.get(name, {})
        print(f"- {name}: step {was.get('step_time_s', float('nan')):.3f} -> {row['step_time_s']:.3f} s; "
              f"was {_ratios(was) or '-'}; now {_ratios(row) or '-'}")
    sys.stdout.flush()


def main(folders: list[str]) -> None:
    if not folders:
        raise SystemExit(__doc__)
    for folder in folders:
        retime(REPO / folder if not Path(folder).is_absolute() else Path(folder))


if __name__ == "__main__":
    main(sys.argv[1:])
