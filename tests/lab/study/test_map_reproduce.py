"""``lit-prunedpo-study-map reproduce`` and ``compare``: a published map's stored command re-run on other seeds, and
one line per (cell, mode) verdict saying whether the new interval overlaps the published one.

The comparison is checked on the project's own records against the table docs/study-log.md drew by hand for the
control-variate cells' re-measure (the first win's size did not reproduce; the other verdicts did)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO
from lit_prunedpo_lab.study.map_cli import main as map_main
from lit_prunedpo_lab.study.map_reproduce import keep_spec, reproduction_argv, stored_argv, verdict_lines

STUDY = REPO / "docs" / "records" / "study"


def test_compare_says_the_first_wins_size_did_not_reproduce_and_the_rest_did(capsys):
    assert map_main(["compare", str(STUDY / "cv-map"), str(STUDY / "cv-map-30")]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines == [
        "near-duplicate-L16-head0.97-B8 stratified-coupled-exact-targets: published WIN 0.25x [0.20x-0.32x] vs "
        "vanilla@8, now WIN 0.56x [0.52x-0.63x] vs vanilla@3 (cost-matched): DOES NOT OVERLAP",
        "near-duplicate-L64-head0.97-B8 stratified-coupled-exact-targets: published WIN 0.54x [0.38x-0.79x] vs "
        "vanilla@3 (cost-matched), now WIN 0.55x [0.34x-0.90x] vs vanilla@3 (cost-matched): overlaps",
        "unrelated-L64-head0.25-B8 stratified-coupled-exact-targets: published TIE 1.00x [0.96x-1.06x] vs vanilla@8, "
        "now TIE 0.79x [0.57x-1.06x] vs vanilla@8: overlaps"]
    assert ("2 of 3 verdicts' intervals overlap the published ones; verdicts published 2 WIN, 0 LOSS, 1 TIE, now "
            "2 WIN, 0 LOSS, 1 TIE") in err
    assert map_main(["compare", str(STUDY / "cv-map2"), str(STUDY / "cv-map2-30")]) == 0
    assert capsys.readouterr().out.count(": overlaps") == 2


def _row(verdict, interval, name="c", mode="m"):
    text = " ".join("not reached" if v is None else f"{v:.2f}x" for v in interval)
    return {"name": name, "mode": mode, "loss_verdict": verdict, "loss_interval": list(interval), "loss_text": text,
            "loss_reference": "vanilla@8"}


@pytest.mark.parametrize("old, new, overlaps", [
    ((0.2, 0.3), (0.3, 0.5), True),            # touching intervals overlap
    ((0.2, 0.3), (0.31, 0.5), False),
    ((None, None), (None, None), True),        # both never reached the target
    ((0.45, None), (None, None), True),        # "0.45x-not reached" holds "not reached"
    ((0.5, 0.9), (None, None), False),         # a win's interval against one that never got there
])
def test_intervals_with_not_reached_count_it_as_infinite(old, new, overlaps):
    lines, misses = verdict_lines({"rows": [_row("TIE", old)]}, {"rows": [_row("TIE", new)]})
    assert len(lines) == 1 and misses == (not overlaps) and lines[0].endswith("overlaps" if overlaps else "OVERLAP")


def test_a_verdict_that_turned_is_said_and_unshared_rows_are_left_out():
    published = {"rows": [_row("WIN", (0.3, 0.6)), _row("TIE", (0.9, 1.1), name="only-published")]}
    new = {"rows": [_row("LOSS", (1.2, 1.6)), _row("TIE", (0.9, 1.1), name="only-new")]}
    lines, misses = verdict_lines(published, new)
    assert misses == 1 and len(lines) == 1 and lines[0].endswith("DOES NOT OVERLAP (the verdict turned)")


def test_compare_refuses_a_folder_without_a_map(tmp_path, capsys):
    assert map_main(["compare", str(STUDY / "cv-map"), str(tmp_path)]) == 2
    assert f"error: {tmp_path / 'map.json'} is corrupt or unreadable" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "map.json").write_text(json.dumps({"rows": [_row("TIE", (1, 1), name="elsewhere")]}))
    assert map_main(["compare", str(STUDY / "cv-map"), str(other)]) == 1
    assert "hold no (cell, mode) verdict in common" in capsys.readouterr().err


def test_the_stored_commands_of_the_records_point_at_the_kept_spec():
    default = stored_argv(STUDY / "map")  # the default map: no --spec, resumed when it was published
    assert "--spec" not in default and default[-2:] == ["--budget", "10.4"]
    hh = stored_argv(STUDY / "map-hh-rlhf")  # a built-in map by name
    assert hh[hh.index("--spec") + 1] == "hh-rlhf"
    cv = stored_argv(STUDY / "cv-map")  # it ran from a scratch path that is gone; the copy beside the records is read
    assert cv[cv.index("--spec") + 1] == str(STUDY / "cv-map" / "spec.yaml")


def test_a_map_fitted_to_its_time_limit_is_reproduced_with_the_budget_it_fitted(tmp_path):
    # map-long ran with --limit-minutes 95 and no --budget: on 5 seeds instead of 10 the same limit would fit a
    # budget about twice as long, other runs than the published ones
    long = stored_argv(STUDY / "map-long")
    assert long[long.index("--limit-minutes") + 1] == "95" and long[-2:] == ["--budget", "35.2"]
    assert stored_argv(STUDY / "map-long-head0.25").count("--budget") == 1  # its own --budget 35.2 is kept as is
    (tmp_path / "map.json").write_text(json.dumps({"command": "lit-prunedpo-study-map --limit-minutes 9 --out x",
                                                   "plan": {"limit_min": 9.0}}))
    with pytest.raises(ValueError, match=r"map.json: its command gives no --budget and its plan records none"):
        stored_argv(tmp_path)


def test_a_stored_spec_that_is_gone_and_not_kept_is_refused(tmp_path):
    (tmp_path / "map.json").write_text(json.dumps({"command": "lit-prunedpo-study-map --spec /gone/s.yaml --out x"}))
    with pytest.raises(ValueError, match=r"its spec '/gone/s.yaml' does not exist and no copy \(spec.yaml\) is kept"):
        stored_argv(tmp_path)
    (tmp_path / "map.json").write_text(json.dumps({"command": "lit-prunedpo-study --task edited"}))
    with pytest.raises(ValueError, match="it records no 'lit-prunedpo-study-map' command"):
        stored_argv(tmp_path)


def test_the_reproduction_replaces_seeds_and_folders_and_keeps_the_settings(tmp_path):
    stored = ["--spec", "s.yaml", "--budget", "12", "--seeds=0,1", "--tune-seeds", "100", "--out", "/old",
              "--work-dir", "/old-work", "--resume", "--quiet"]
    assert reproduction_argv(stored, [30, 31], None, tmp_path, False) == [
        "--spec", "s.yaml", "--budget", "12", "--tune-seeds", "100", "--seeds", "30,31", "--out", str(tmp_path)]
    assert reproduction_argv(stored, [30], [200], tmp_path, True)[-7:] == [
        "--seeds", "30", "--tune-seeds", "200", "--out", str(tmp_path), "--resume"]


def test_a_spec_file_is_kept_beside_the_records(tmp_path):
    assert keep_spec(None, tmp_path) is None and keep_spec("hh-rlhf", tmp_path) is None
    spec = tmp_path / "mine.yml"
    spec.write_text("modes: [position]\n")
    out = tmp_path / "out"
    out.mkdir()
    assert keep_spec(str(spec), out) == out / "spec.yaml" and (out / "spec.yaml").read_text() == spec.read_text()
    (tmp_path / "mine.json").write_text('{"modes": ["position"]}')
    assert keep_spec(str(tmp_path / "mine.json"), out) == out / "spec.json"
    assert keep_spec(str(out / "spec.yaml"), out) == out / "spec.yaml"  # its own copy: left as it is


@pytest.mark.slow
def test_reproduce_reruns_a_finished_map_on_other_seeds_and_compares(tmp_path, capsys):
    from test_map_cli import ARGS, SPEC

    spec = tmp_path / "scratch" / "tiny.json"
    spec.parent.mkdir()
    spec.write_text(json.dumps(SPEC))
    published = tmp_path / "published"
    assert map_main(["--spec", str(spec), "--out", str(published), "--jobs", "1", *ARGS]) == 0
    assert json.loads((published / "spec.json").read_text()) == SPEC  # the spec, kept with the records
    spec.unlink()  # the scratch path is gone: the reproduction reads the kept copy
    capsys.readouterr()
    again = tmp_path / "again"
    code = map_main(["reproduce", str(published), "--seeds", "5,6", "--out", str(again)])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "running: lit-prunedpo-study-map --spec " + str(published / "spec.json") in err
    payload = json.loads((again / "map.json").read_text())
    assert "--seeds 5,6" in payload["command"] and payload["unfinished"] == []
    line = out.splitlines()[-1]  # after the new map's own table
    assert line.startswith("near-duplicate-L8-head0.25-B4 position-coupled: published ")
    assert code == (0 if line.endswith(": overlaps") else 1)
    assert map_main(["reproduce", str(published), "--seeds", "5,6", "--out", str(published)]) == 2
    assert "is the published map itself" in capsys.readouterr().err
    assert Path(again / "spec.json").is_file()
