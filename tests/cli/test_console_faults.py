"""The fault table: every console command of the pyprojects' ``[project.scripts]`` (the library's, the lab's) ends
the same way on the same faults.

All of them go through one runner (:func:`lit_prunedpo.cli.user_errors.run_command`); each row of :data:`TABLE` drives
one installed command: a bad flag (exit 2, one ``error:`` line naming it), Ctrl-C and SIGTERM while it sets up real
work (exit 130 / 143, one ``interrupted (...)`` line, no traceback), and a full disk at its output file (exit 1, one
line naming the file, nothing half-written left). A command added to pyproject without a row fails
:func:`test_the_table_has_a_row_for_every_entry_point`. The full disk is injected in-process (:func:`disk_full_at`):
a real small disk (a tmpfs) needs root.

The default run: the table against pyproject, every entry point through the runner, the bad flags, the runner's
own cases. ``pytest -m slow``: the signals (subprocesses, signalled as a terminal does: the whole process group) and
the full disks.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import importlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from helpers import REPO

from lit_prunedpo.full_disk import DiskFull
from lit_prunedpo.cli.user_errors import Terminated, run_command

BAD_FLAG = "--no-such-flag"
INTERRUPTED = re.compile(r"^interrupted \((Ctrl-C|SIGTERM)\)", re.MULTILINE)
QUICKSTART, CACHED = str(REPO / "configs/quickstart.yaml"), str(REPO / "configs/cached.yaml")


@dataclass(frozen=True)
class Row:
    """How to drive one command. ``main``: the function its entry point runs ("module:function");
    ``bad``: arguments holding :data:`BAD_FLAG`; ``work``: arguments of real work (minutes long) writing under the
    given folder; ``signal_at``: seconds after its start to signal it, or None: at its first line of output (its
    imports done); ``full``: arguments that write under the given folder, and the file whose writes fail."""

    main: str
    bad: tuple[str, ...]
    work: Callable[[Path], list[str]]
    full: Callable[[Path], tuple[list[str], str]]
    signal_at: float | None = None
    sub: tuple[str, ...] = ()
    """The subcommand that reaches ``main`` (``lit-prunedpo-lab bench``)."""


def _cache_args(out: Path) -> list[str]:
    return ["--config", CACHED, f"--model.reference.init_args.path={out / 'ref.safetensors'}",
            f"--trainer.default_root_dir={out}"]


TABLE: dict[str, Row] = {
    # signalled at its first line (the seed, set as the CLI builds the model), a second before the fit takes SIGTERM
    # over (a stop saved, status 0: tests/test_signals.py)
    "lit-prunedpo": Row("lit_prunedpo.cli:main", ("fit", BAD_FLAG),
                        lambda out: ["fit", "--config", QUICKSTART, f"--trainer.default_root_dir={out}"],
                        lambda out: (["configs", "--copy", str(out)], "quickstart.yaml")),
    "lit-prunedpo-cache": Row("lit_prunedpo.cli.cache:main", (BAD_FLAG,), _cache_args,
                              lambda out: ([*_cache_args(out), "--data.init_args.max_rows=64"], "ref.safetensors")),
    "lit-prunedpo-bench": Row("lit_prunedpo_lab.bench.cli:main", (BAD_FLAG,),
                              lambda out: ["--preset", "quickstart", "--out", str(out)],
                              lambda out: (["--preset", "small", "--quiet", "--out", str(out)], "bench.json")),
    "lit-prunedpo-bench-scaling": Row(
        "lit_prunedpo_lab.bench.scaling_cli:main", (BAD_FLAG,), lambda out: ["--out", str(out)],
        lambda out: (["--real-shapes-only", "--quiet", "--out", str(out)], "scaling.json")),
    "lit-prunedpo-study": Row(
        "lit_prunedpo_lab.study.cli:main", (BAD_FLAG,),
        lambda out: ["--task", "quickstart", "--quick", "--out", str(out)],
        lambda out: (["--task", "quickstart", "--quick", "--out", str(out)], "progress.jsonl")),
    "lit-prunedpo-study-map": Row("lit_prunedpo_lab.study.map_cli:main", (BAD_FLAG,),
                                  lambda out: ["--quick", "--out", str(out)],
                                  lambda out: (["--quick", "--out", str(out)], "progress.jsonl")),
    "lit-prunedpo-lab": Row("lit_prunedpo_lab.bench.cli:main", ("bench", BAD_FLAG),
                            lambda out: ["bench", "--preset", "quickstart", "--out", str(out)],
                            lambda out: (["bench", "--preset", "small", "--quiet", "--out", str(out)], "bench.json"),
                            sub=("bench",)),
    "lit-prunedpo-paper": Row(
        "lit_prunedpo_lab.study.paper_cli:main", ("cell", "--task", "quickstart", "--out", "x", BAD_FLAG),
        lambda out: ["cell", "--task", "quickstart", "--out", str(out)],
        lambda out: (["cell", "--task", "quickstart", "--quiet", "--out", str(out)], "cell.json")),
}


def entry_points() -> dict[str, str]:
    """``[project.scripts]`` of the library's pyproject and the lab's (``lab/pyproject.toml``): command ->
    "module:function"."""
    found = {}
    for pyproject in (REPO / "pyproject.toml", REPO / "lab" / "pyproject.toml"):
        found.update(tomllib.loads(pyproject.read_text())["project"]["scripts"])
    return found


def load(target: str) -> Callable[..., object]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def installed(command: str) -> list[str]:
    """The command line of ``command``: its installed script, or where its distribution is not installed (the lab's,
    in a checkout where ``.[test]`` installs the library alone) what that script runs, its entry point."""
    path = Path(sys.executable).parent / command
    if path.exists():
        return [str(path)]
    module, _, name = entry_points()[command].partition(":")
    assert module.startswith("lit_prunedpo_lab."), f"{command} is not installed in this environment: pip install -e ."
    return [sys.executable, "-c", f"import sys; sys.argv[0] = {command!r}; from {module} import {name}; "
                                  f"sys.exit({name}())"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LIT_PRUNEDPO_TRACEBACK"}
    return {**env, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}


# ---------------------------------------------------------------------------------------------- the table itself
def test_the_table_has_a_row_for_every_entry_point():
    assert set(TABLE) == set(entry_points()), "a command of pyproject's [project.scripts] without a row here (or a " \
        "row of a command that is gone): add its row to TABLE"


@pytest.mark.parametrize("command", sorted(TABLE))
def test_every_entry_point_goes_through_the_runner(command, monkeypatch, capsys):
    module, _, name = TABLE[command].main.partition(":")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), name, interrupted)
    monkeypatch.setattr(sys, "argv", [command, *TABLE[command].sub, "--out", "somewhere"])
    monkeypatch.delenv("LIT_PRUNEDPO_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as stop:
        load(entry_points()[command])()
    err = capsys.readouterr().err
    assert stop.value.code == 130 and INTERRUPTED.search(err) and len(err.splitlines()) == 1, err


# ---------------------------------------------------------------------------------------------- bad flags
@pytest.fixture(scope="module")
def bad_flag_runs() -> dict[str, subprocess.CompletedProcess]:
    """Every command with its bad flag, side by side (each spends seconds importing)."""
    started = {c: subprocess.Popen([*installed(c), *row.bad], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=_env()) for c, row in TABLE.items()}
    return {c: subprocess.CompletedProcess(p.args, p.wait(timeout=120), *p.communicate()) for c, p in started.items()}


@pytest.mark.parametrize("command", sorted(TABLE))
def test_a_bad_flag_is_one_error_line_naming_it_and_status_2(command, bad_flag_runs):
    run = bad_flag_runs[command]
    said = [line for line in run.stderr.splitlines() if "error:" in line]
    assert run.returncode == 2 and len(said) == 1 and BAD_FLAG in said[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr


# ---------------------------------------------------------------------------------------------- the runner
def _ends(main: Callable[[], object], kept=None) -> tuple[object, str]:
    """(the exit status, or what ``main`` returned; stderr) of ``main`` run through the runner."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return run_command(main, kept=kept), err.getvalue()
        except SystemExit as stop:
            return stop.code, err.getvalue()


def _raises(error: BaseException) -> Callable[[], None]:
    def main() -> None:
        raise error
    return main


@pytest.fixture(autouse=False)
def no_traceback_env(monkeypatch):
    monkeypatch.delenv("LIT_PRUNEDPO_TRACEBACK", raising=False)


@pytest.mark.usefixtures("no_traceback_env")
def test_the_runner_says_an_interrupt_what_was_kept_and_exits_130_or_143():
    kept = "records.jsonl keeps finished designs; rerun with --resume to continue"
    assert _ends(_raises(KeyboardInterrupt()), kept) == (130, f"interrupted (Ctrl-C): {kept}\n")
    assert _ends(_raises(KeyboardInterrupt()), lambda: None) == (130, "interrupted (Ctrl-C)\n")
    assert _ends(_raises(Terminated()), lambda: kept) == (143, f"interrupted (SIGTERM): {kept}\n")

    def lightning_after_a_ctrl_c() -> None:  # a fit's second Ctrl-C: Lightning's own handling ends with sys.exit(1)
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            sys.exit(1)

    assert _ends(lightning_after_a_ctrl_c) == (130, "interrupted (Ctrl-C)\n")


@pytest.mark.usefixtures("no_traceback_env")
def test_a_sigterm_raises_where_the_program_is_and_the_handlers_are_left_as_they_were():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    cleaned = []

    def main() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            cleaned.append(True)  # a lock released, a partial file removed

    assert _ends(main, "kept") == (143, "interrupted (SIGTERM): kept\n") and cleaned
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before

    def lightning_wraps_it() -> None:  # during a fit Lightning's handler calls the one it found: the fit stops itself
        ours = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda signum, frame: ours(signum, frame))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)

    assert _ends(lightning_wraps_it) == (None, "")

    def a_fit_stopped_by_sigterm() -> None:  # ignores the rest of a scheduler's burst while the process exits
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    try:
        assert _ends(a_fit_stopped_by_sigterm) == (None, "") and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before[1])


@pytest.mark.usefixtures("no_traceback_env")
def test_a_full_disk_is_one_line_naming_the_file_and_exits_1(tmp_path):
    path = tmp_path / "bench.json"
    full = OSError(errno.ENOSPC, "No space left on device", str(path))
    assert _ends(_raises(full)) == (1, f"error: cannot write {path}: disk full (ENOSPC: No space left on device)\n")
    said = f"reference cache {path}: disk full (ENOSPC: No space left on device) while writing it"
    assert _ends(_raises(DiskFull(said, errno.ENOSPC))) == (1, f"error: {said}\n")
    wrapped = RuntimeError("safetensors: I/O error: No space left on device (os error 28)")  # Rust's, no errno
    assert _ends(_raises(wrapped))[0] == 1


@pytest.mark.usefixtures("no_traceback_env")
def test_exits_and_statuses_pass_through_and_bugs_keep_their_traceback():
    assert _ends(lambda: 2) == (2, "") and _ends(lambda: None) == (None, "")
    assert _ends(_raises(SystemExit(2))) == (2, "")
    assert _ends(_raises(SystemExit("lit-prunedpo-cache: no cache to build"))) == (
        "lit-prunedpo-cache: no cache to build", "")
    with pytest.raises(RuntimeError, match="a bug"):  # raised outside the package: its traceback stays (status 1)
        run_command(_raises(RuntimeError("a bug")))
    with pytest.raises(ValueError):
        run_command(_raises(ValueError("raised outside the package")))


def test_every_traceback_is_shown_on_request(monkeypatch):
    monkeypatch.setenv("LIT_PRUNEDPO_TRACEBACK", "1")
    for error in (KeyboardInterrupt(), Terminated(), OSError(errno.ENOSPC, "No space left on device", "f")):
        with pytest.raises(type(error)):
            run_command(_raises(error))


# ---------------------------------------------------------------------------------------------- signals
class Signalled:
    """One command started in a process group of its own (SIGINT at its default, as at a terminal), its output
    read as it comes, and the group signalled at the row's moment."""

    def __init__(self, command: str, signum: int, out: Path) -> None:
        self.row, self.signum = TABLE[command], signum
        self.proc = subprocess.Popen([*installed(command), *self.row.work(out)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=_env(), start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.started, self.lines, self.spoke = time.monotonic(), [], threading.Event()
        self.alive_when_signalled: bool | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self.spoke.set()

    def due(self) -> bool:
        waited = time.monotonic() - self.started
        if self.row.signal_at is not None:
            return waited >= self.row.signal_at
        return self.spoke.is_set() or waited >= 60

    def send(self) -> None:
        self.alive_when_signalled = self.proc.poll() is None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, self.signum)

    def finish(self) -> tuple[int, str]:
        status = self.proc.wait(timeout=120)
        self.reader.join(timeout=10)
        return status, "".join(self.lines)


def _signal_all(signum: int, root: Path) -> dict[str, tuple[bool, int, str]]:
    runs = {c: Signalled(c, signum, root / c) for c in TABLE}
    waiting = dict(runs)
    while waiting:
        for command in [c for c, run in waiting.items() if run.due()]:
            waiting.pop(command).send()
        time.sleep(0.05)
    return {c: (run.alive_when_signalled, *run.finish()) for c, run in runs.items()}


@pytest.fixture(scope="module")
def signalled(tmp_path_factory) -> dict[int, dict[str, tuple[bool, int, str]]]:
    """Every command signalled while it sets up, SIGINT's and SIGTERM's rounds one after the other (seven processes
    importing torch at once are enough for two cores)."""
    root = tmp_path_factory.mktemp("signalled")
    return {signum: _signal_all(signum, root / signum.name) for signum in (signal.SIGINT, signal.SIGTERM)}


@pytest.mark.slow
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("command", sorted(TABLE))
def test_a_signal_while_setting_up_is_one_line_and_128_plus_the_signal(command, signum, status, signalled):
    alive, returncode, out = signalled[signum][command]
    assert alive, f"{command} ended before it was signalled: give its row longer work\n{out[-2000:]}"
    assert returncode == status and "Traceback" not in out, out[-3000:]
    what = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert len(said := INTERRUPTED.findall(out)) == 1 and said[0] == what, out[-3000:]


# ---------------------------------------------------------------------------------------------- a full disk
def _fails(path: str | os.PathLike, name: str) -> bool:
    """Whether ``path`` is the file ``name`` or a temporary sibling it is written as (``name.partial-PID``,
    ``.stem.PID.tmp.suffix``)."""
    base, stem = os.path.basename(os.fsdecode(path)), name.split(".")[0]
    return base.startswith(name) or base.startswith(f".{stem}.")


def _full(path: str | os.PathLike) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(path))


@contextlib.contextmanager
def disk_full_at(name: str, monkeypatch) -> Iterator[None]:
    """Writes of the file ``name`` (or of its temporary siblings) fail as on a full disk: ``open`` for writing
    raises; ``os.write`` writes half of its bytes, then raises (half a file on the disk, as a real one leaves); the
    safetensors writer (Rust, past Python's ``open``) writes half the file, then raises."""
    from lit_prunedpo.reference import store

    real_open, real_os_open, real_write, real_save = builtins.open, os.open, os.write, store.save_file
    written: dict[int, list] = {}  # fd -> [path, half written yet]

    def fake_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wax+") and _fails(file, name):
            raise _full(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        fd = real_os_open(path, flags, *args, **kwargs)
        if flags & (os.O_WRONLY | os.O_RDWR) and _fails(path, name):
            written[fd] = [path, False]
        return fd

    def fake_write(fd, data):
        if fd not in written:
            return real_write(fd, data)
        if not written[fd][1] and len(data) > 1:
            written[fd][1] = True
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise _full(written[fd][0])

    def fake_save(tensors, filename, metadata=None):
        if not _fails(filename, name):
            return real_save(tensors, filename, metadata=metadata)
        Path(filename).write_bytes(b"\0" * 100)
        raise _full(filename)

    for owner, attr, fake in ((builtins, "open", fake_open), (io, "open", fake_open), (os, "open", fake_os_open),
                              (os, "write", fake_write), (store, "save_file", fake_save)):
        monkeypatch.setattr(owner, attr, fake)
    yield
    monkeypatch.undo()


def _whole_or_absent(path: Path) -> bool:
    if not path.exists():
        return True
    if path.suffix == ".jsonl":  # a journal: every line a record (the one that did not fit cut back off)
        return all(json.loads(line) is not None for line in path.read_text().splitlines())
    return False


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(TABLE))
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_no_half_file(command, tmp_path, monkeypatch, capsys):
    args, name = TABLE[command].full(tmp_path / "out")
    monkeypatch.setattr(sys, "argv", [command, *args])
    monkeypatch.delenv("LIT_PRUNEDPO_TRACEBACK", raising=False)
    entry = load(entry_points()[command])
    with disk_full_at(name, monkeypatch):
        try:
            status = entry()
        except SystemExit as stop:
            status = stop.code
    err = capsys.readouterr().err
    if isinstance(status, str):  # SystemExit("message"): Python prints it, status 1
        status, err = 1, err + status + "\n"
    target = tmp_path / "out" / name
    said = [line for line in err.splitlines() if "disk full" in line]
    assert status == 1 and len(said) == 1 and str(target) in said[0] and "Traceback" not in err, err[-3000:]
    assert _whole_or_absent(target), target.read_bytes()[:200]
    left = [p.name for p in (tmp_path / "out").rglob("*") if ".partial-" in p.name or ".tmp" in p.name]
    assert not left, f"half-written files left: {left}"


def test_a_signal_while_an_interrupted_command_exits_does_not_kill_it():
    # a second Ctrl-C that comes while the interpreter ends (torch's teardown takes a while) ended the process by
    # SIGINT's default action (status -2) or with a KeyboardInterrupt traceback, instead of the first one's 130
    code = ("import atexit, os, signal, time\nfrom lit_prunedpo.cli.user_errors import run_command\n"
            "def late():\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(0.2)\n    print('survived')\n"
            "atexit.register(late)\n"
            "def main():\n    raise KeyboardInterrupt\n"
            "run_command(main, kept='nothing')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (done.returncode, done.stdout, done.stderr) == (130, "survived\n", "interrupted (Ctrl-C): nothing\n")
