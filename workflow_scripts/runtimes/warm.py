"""A warm interpreter per environment: a server process that has imported torch (and
what the run's model needs: torchvision, or transformers and its model class) and
forks a fresh process for each run, so that a trial does not pay the interpreter's
start and those imports (2-4 s of a trial's wall here, the same on every machine).

Each run is still a process of its own (the unit of noise and of failure): forked
from the server, in a session of its own, with the run's variables, working folder,
output (the trial's log) and thread count, then running its script as ``__main__``
as ``python -u script ...`` would. The server itself never starts a thread: it
imports torch with ``OMP_NUM_THREADS=1`` so that OpenMP's pool is first made in the
forked process, at the thread count a fresh process of the run would pick
(:func:`fresh_threads`, asked once of a fresh process per environment, variables and
CPUs). A variable that only a fresh process can take up (anything read when a library
loads: ``LD_PRELOAD``, ``KMP_*``, ``MALLOC_CONF`` ...) is part of the server's
identity: a run with other values gets a server of its own.

Used by the trial policy for a single-process run of the local runtime (launcher
``none``) outside SLURM where ``warm_interpreter: true`` (off by default: a forked
ResNet-50 trial measured slower than a fresh one); a server that cannot start, or
a run it cannot take, starts cold, as before (said in the trial's log). A server
exits after ``IDLE_S`` without a run, when the study's Snakemake is gone, when its
socket is gone, or when the study starts a third (the one it used least lately is
retired: a server holds 0.3-0.5 GB). Standard library only (and ``sysinfo``), on both sides.

    python -u -c "$SERVER" SOCKET OWNER MODULE...   (the server, started by a run)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import sysinfo

#: variables that may differ between the runs of one server: read by the run after it
#: started (the compile caches, where its processes register shared memory), or
#: applied by the fork itself (the thread count, :func:`_child`)
PER_RUN = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "OMP_NUM_THREADS", "STUDY_RUN_PIDS_DIR")
IDLE_S = 120.0
#: servers a study keeps at most (the ones it used last): a vision and a text library,
#: say; each holds 0.3-0.5 GB of its own
SERVERS = 2
READY_S = 180.0
#: a run with these starts fresh: a preloaded allocator's heap is the run's own
#: (every other variable the server is started with: :func:`identity`)
NOT_WARM = ("LD_PRELOAD",)
SOURCES = Path(__file__).resolve().parent.parent  # workflow_scripts
#: the server's program (``-c``: the module is then imported once, not run as ``-m``)
SERVER = "import sys; from workflow_scripts.runtimes import warm; sys.exit(warm.main(sys.argv[1:]))"


def preload(model: str) -> tuple[str, ...]:
    """What a server for a run of ``model`` imports: torch and the model's library (its
    model class for a transformers model; torchvision's models for the small CNN too,
    which needs none: one server for the vision runs); ``module:attribute`` loads an
    attribute."""
    from ..workloads import libraries

    return ("torch", *(libraries(model) or ("torchvision.models",)))


def enabled(on: bool, runtime: str) -> bool:
    """Whether one-process trials are forked at all: ``warm_interpreter`` on, the
    runtime local (a container or a SLURM job step starts its own process)."""
    return bool(on) and runtime == "local" and not sysinfo.slurm_job()


def candidate(spec) -> bool:
    """Whether a trial of ``spec`` is one the trial policy forks from a warm
    interpreter where its runtime is local (one process started by no launcher, on the
    CPUs it was given): the estimate's rule too."""
    if spec.get("cpus") or spec.get("comm_cpu") or int(spec.get("nodes") or 1) != 1:
        return False
    return (spec.get("launcher") or "none") == "none" and int(spec.get("ranks") or 1) == 1


def eligible(cmd: list[str], env: dict[str, str]) -> str | None:
    """Why ``cmd`` cannot start warm (None: it can): it must be ``python -u script.py
    ...`` with nothing a fork cannot take up."""
    if len(cmd) < 3 or cmd[1] != "-u" or not cmd[2].endswith(".py"):
        return "not a python script run"
    try:
        with open(cmd[0], "rb") as exe:  # an interpreter, not a script standing in for one
            if exe.read(4) != b"\x7fELF":
                return f"{cmd[0]} is not an interpreter's executable"
    except OSError as exc:
        return f"{cmd[0]}: {exc}"
    for key in NOT_WARM:
        if env.get(key):
            return f"{key} is set"
    return None


def _sources_digest() -> str:
    """The code a server has loaded: a server from before an edit is not reused."""
    h = hashlib.sha256()
    for path in sorted(SOURCES.rglob("*.py")):
        with contextlib.suppress(OSError):
            st = path.stat()
            h.update(f"{path}:{st.st_mtime_ns}:{st.st_size};".encode())
    return h.hexdigest()


def identity(python: str, modules: tuple[str, ...], env: dict[str, str]) -> str:
    """What makes two runs share a server: the interpreter, what it imports, the code,
    the CPUs, and every variable but those of :data:`PER_RUN` and the study's own
    (``STUDY_*``: read by its code when the run needs them, never on import)."""
    fixed = {k: v for k, v in env.items() if k not in PER_RUN and not k.startswith("STUDY_")}
    cpus = sorted(os.sched_getaffinity(0))
    blob = json.dumps([python, list(modules), _sources_digest(), cpus, sorted(fixed.items())])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def folder() -> Path:
    where = Path(tempfile.gettempdir()) / f"study-warm-{os.getuid()}"
    where.mkdir(mode=0o700, exist_ok=True)
    return where


def fresh_threads(python: str, env: dict[str, str], key: str) -> int:
    """The intra-op thread count a fresh process of ``python`` picks with ``env`` on
    this process's CPUs (torch's own rule: OMP_NUM_THREADS, MKL's, else the cores),
    asked of one once per key and kept."""
    known = folder() / f"{key}.threads"
    with contextlib.suppress(OSError, ValueError):
        return int(known.read_text())
    out = subprocess.run(
        [python, "-c", "import torch; print(torch.get_num_threads())"],
        env=env, capture_output=True, text=True, timeout=READY_S, check=True,
    )  # fmt: skip
    threads = int(out.stdout.split()[-1])
    known.write_text(str(threads))
    return threads


class WarmProcess:
    """A run forked by a server, seen as :class:`subprocess.Popen` sees a child: its
    ``pid`` (also its process group), ``poll``, ``wait`` and ``returncode``. Its exit
    status comes over the connection; a server gone meanwhile leaves only the process
    to watch (its status then reads 1, said in the log)."""

    def __init__(self, conn: socket.socket, pid: int, log_fd: int):
        self.conn, self.pid, self.returncode = conn, pid, None
        self._log_fd = log_fd
        self._buf = b""

    def _read(self, timeout: float | None) -> None:
        if b"\n" not in self._buf:
            ready, _, _ = select.select([self.conn], [], [], timeout)
            if not ready:
                return
            chunk = self.conn.recv(4096)
            if not chunk:  # the server is gone: the run goes on, reparented; wait for it
                self.conn.close()
                while _alive(self.pid):
                    time.sleep(0.2)
                os.write(self._log_fd, b"[warm] its server ended first: exit status unknown\n")
                self.returncode = 1
                return
            self._buf += chunk
        if b"\n" in self._buf:
            self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["returncode"])
            self.conn.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("warm run", timeout)
            self._read(left)
        return self.returncode


def _alive(pid: int) -> bool:
    fields = sysinfo.proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def start(
    python: str,
    modules: tuple[str, ...],
    cmd: list[str],
    env: dict[str, str],
    cwd: str,
    log_fd: int,
    tell_fd: int | None = None,
    owner: tuple[int, str] | None = None,
) -> WarmProcess | str:
    """Run ``cmd`` (``python -u script ...``) forked from a server for ``python`` and
    ``modules`` (started if none is up): the process, or why it could not (then the
    caller starts it cold). ``tell_fd``: where the run writes its process group first
    (the watchdog's input), as a cold run does before its program. ``owner``: the
    process (PID, start time) whose end ends the server (the study's Snakemake)."""
    why = eligible(cmd, env)
    if why:
        return why
    key = identity(python, modules, env)
    try:
        threads = (
            int(env["OMP_NUM_THREADS"])
            if env.get("OMP_NUM_THREADS", "").isdigit()
            else fresh_threads(python, env, key)
        )
        conn = _connect(python, modules, env, key, owner)
        request = {"argv": cmd[2:], "env": env, "cwd": cwd, "threads": threads}
        fds = [log_fd] + ([tell_fd] if tell_fd is not None else [])
        socket.send_fds(conn, [struct.pack("!I", len(fds))], fds)
        body = json.dumps(request).encode()
        conn.sendall(struct.pack("!Q", len(body)) + body)
        reply = b""
        while b"\n" not in reply:
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("the server closed the connection")
            reply += chunk
        line, rest = reply.split(b"\n", 1)
        answer = json.loads(line)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if "pid" not in answer:
        conn.close()
        return answer.get("error", "no process")
    proc = WarmProcess(conn, int(answer["pid"]), log_fd)
    proc._buf = rest
    return proc


def _connect(
    python: str, modules: tuple[str, ...], env: dict, key: str, owner: tuple[int, str] | None
) -> socket.socket:
    """A connection to the server of ``key``, started first where none answers (one
    starter at a time: a lock beside the socket). A new server retires the owner's
    server used least lately where it has ``SERVERS`` already."""
    where = folder()
    path = where / f"{key}.sock"
    with contextlib.suppress(OSError):
        return _used(where, key, _dial(path))
    with open(where / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):
            return _used(where, key, _dial(path))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        mine = "-" if owner is None else f"{owner[0]}:{owner[1]}"
        _retire_others(where, key, mine)
        server_env = {**env, "OMP_NUM_THREADS": "1"}
        with open(where / f"{key}.log", "ab") as log:
            server = subprocess.Popen(
                [python, "-u", "-c", SERVER, str(path), mine, *modules],
                env=server_env, cwd=str(SOURCES.parent), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if server.poll() is not None:
                tail = (where / f"{key}.log").read_bytes()[-400:].decode(errors="replace")
                raise OSError(f"the server exited ({server.returncode}): {tail.strip()}")
            with contextlib.suppress(OSError):
                conn = _dial(path)
                (where / f"{key}.pid").write_text(
                    f"{server.pid} {sysinfo.start_time(server.pid)} {mine}"
                )
                return conn
            time.sleep(0.05)
        server.kill()
        raise OSError(f"the server did not answer within {READY_S:g} s")


def _used(where: Path, key: str, conn: socket.socket) -> socket.socket:
    """A server just reached: its PID file's time says when it was last used."""
    with contextlib.suppress(OSError):
        os.utime(where / f"{key}.pid")
    return conn


def _retire_others(where: Path, key: str, owner: str) -> None:
    """SIGTERM to the servers of ``owner`` but the ``SERVERS - 1`` used last (a server
    retires: it takes no more runs and exits once its runs ended); the files of
    servers long gone go too."""
    mine = []
    for pidfile in where.glob("*.pid"):
        if pidfile.stem == key:
            continue
        with contextlib.suppress(OSError, ValueError):
            pid, started, whose = pidfile.read_text().split()
            if sysinfo.start_time(int(pid)) != started:
                pidfile.unlink()
            elif whose == owner and owner != "-":
                mine.append((pidfile.stat().st_mtime, int(pid), pidfile))
    for _, pid, pidfile in sorted(mine)[: max(0, len(mine) - (SERVERS - 1))]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
            pidfile.unlink()
    old = time.time() - 86400
    for stale in where.iterdir():
        with contextlib.suppress(OSError):
            if stale.suffix != ".sock" and stale.stem != key and stale.stat().st_mtime < old:
                stale.unlink()


def _dial(path: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        raise
    return conn


# ---------------------------------------------------------------------------
# The server


def _load(modules: list[str]) -> None:
    import importlib

    from ..workloads import import_libraries

    import_libraries(modules)
    importlib.import_module("workflow_scripts.rank.harness")
    importlib.import_module("workflow_scripts.rank.trainer")
    import gc

    gc.collect()
    gc.freeze()  # the forks' collections leave the imports' objects (and their pages) alone


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _owner_gone(owner: str) -> bool:
    if owner == "-":
        return False
    pid, started = owner.split(":")
    return sysinfo.start_time(int(pid)) != started


def serve(path: Path, owner: str, modules: list[str], idle_s: float = IDLE_S) -> int:
    """Import ``modules``, then fork a run for each request on the socket at ``path``
    until ``idle_s`` without one, the socket gone or replaced, ``owner`` (PID:start
    time, or -) gone, or a SIGTERM (retired): then exit once its runs ended."""
    t0 = time.perf_counter()
    _load(modules)
    if _threads() != 1:
        print(f"[warm] {_threads()} threads after the imports: a fork would lose them")
        return 3
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    inode = path.stat().st_ino
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    retired = []
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: retired.append(True))
    signal.set_wakeup_fd(wake_w)
    print(f"[warm] ready in {time.perf_counter() - t0:.1f} s: {' '.join(modules)}", flush=True)
    running: dict[int, socket.socket] = {}
    last = time.monotonic()
    while True:
        waiting = [wake_r] if listener is None else [listener, wake_r]
        ready, _, _ = select.select(waiting, [], [], 1.0)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        _reap(running)
        if listener is not None and listener in ready and not retired:
            conn, _ = listener.accept()
            last = time.monotonic()
            _take(conn, listener, (wake_r, wake_w), running)
        if running:
            last = time.monotonic()
        end = retired or time.monotonic() - last > idle_s or _owner_gone(owner)
        if listener is not None and (end or not _same(path, inode)):
            listener.close()  # no more runs: a client finds no server and starts one
            listener = None
            if _same(path, inode):
                with contextlib.suppress(OSError):
                    path.unlink()
        if listener is None and not running:
            return 0


def _same(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except OSError:
        return False


def _reap(running: dict[int, socket.socket]) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                code = os.waitstatus_to_exitcode(status)
                conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
            conn.close()


def _take(conn: socket.socket, listener, wake, running: dict) -> None:
    """One request: the fds and the run's description; fork; answer with its PID."""
    try:
        conn.settimeout(30)
        head, fds, _, _ = socket.recv_fds(conn, 4, 2)
        (size,) = struct.unpack("!Q", _exactly(conn, 8))
        request = json.loads(_exactly(conn, size))
        conn.settimeout(None)
    except (OSError, ValueError, struct.error) as exc:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"error": f"bad request: {exc}"}).encode() + b"\n")
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(request, fds, [conn, listener, *wake])
    for fd in fds:
        os.close(fd)
    running[pid] = conn
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise OSError("short request")
        data += chunk
    return data


MADV_POPULATE_WRITE = 23  # Linux 5.14


def _own_pages() -> None:
    """Take a private copy now of the server's written memory (the imports' objects):
    a region at least half written, copied whole before the run, not page by page
    while it runs (copy-on-write faults in its first steps, measured: 3 % of a
    bert-tiny trial's throughput after 2 warm-up steps). The run then holds its own
    copy, as a fresh process holds its imports'. Without the call (Linux < 5.14):
    copied on write, as they come."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    region = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) > 1 and len(head[1]) == 4:
                start, end = (int(x, 16) for x in head[0].split("-"))
                region = (start, end) if head[1][1] == "w" and head[1][3] == "p" else None
            elif region and head[0] == "Anonymous:":
                start, end = region
                if int(head[1]) * 1024 * 2 >= end - start:
                    if libc.madvise(start, end - start, MADV_POPULATE_WRITE) != 0:
                        return  # not on this kernel: copy-on-write as before
                region = None


def _child(request: dict, fds: list[int], close: list) -> None:
    """The forked run: never returns."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        for item in close:
            with contextlib.suppress(OSError):
                item.close() if hasattr(item, "close") else os.close(item)
        if len(fds) > 1:  # the watchdog's input: this run's process group, first
            with contextlib.suppress(OSError):
                os.write(fds[1], b"%d\n" % os.getpgrp())
            os.close(fds[1])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[0], 2)
        os.close(fds[0])
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _own_pages()
        from ..rank import tempdirs

        tempdirs.inherit()  # (the server's folders are the server's)
        import torch

        torch.set_num_threads(int(request["threads"]))
        import runpy

        sys.argv = list(request["argv"])
        sys.path[0] = str(Path(sys.argv[0]).resolve().parent)
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a run's failure is its own, never the server's
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main(argv: list[str]) -> int:
    """The server: ``SOCKET OWNER MODULE...``."""
    return serve(Path(argv[0]), argv[1], argv[2:])
