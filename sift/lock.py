"""Output folders: checked writable before any work, and guarded by a lock file holding the owner's PID.

``OutputLock(folder)`` takes ``<folder>/.sift.lock`` with ``fcntl.flock`` (released by the kernel when its
owner dies, however it dies) and writes ``pid host command time`` into it. A second command on the same
folder fails at once with one line naming the owner; after the owner died, the next command takes over.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from sift.errors import SiftError

LOCK_NAME = ".sift.lock"


def ensure_writable(folder: str | Path, what: str = "output_dir") -> Path:
    """Create ``folder`` (and parents) if needed and prove a file can be written there; SiftError otherwise.

    Only the folders this call creates are new; nothing that existed is touched beyond a probe file."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".sift-write-probe-{os.getpid()}"
        with open(probe, "w") as fh:
            fh.write("ok")
        probe.unlink()
    except OSError as e:
        raise SiftError(f"{what} {folder}: not writable ({e.strerror or e})") from None
    return folder


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputLock:
    """Exclusive use of an output folder by one process (re-entrant within that process)."""

    _held: dict[str, int] = {}  # resolved lock path -> depth, for nested stages of one process

    def __init__(self, folder: str | Path, command: str | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.command = command or Path(sys.argv[0]).name
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        key = str(self.path.resolve()) if self.path.parent.exists() else str(self.path.absolute())
        if OutputLock._held.get(key):
            OutputLock._held[key] += 1
            self._key = key
            return self
        ensure_writable(self.folder)
        key = str(self.path.resolve())
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = self._owner_line(fd)
                os.close(fd)
                raise SiftError(f"{self.folder} is in use by another sift command ({owner}); wait for it to finish "
                                f"or choose another output folder") from None
            # the file may have been removed and recreated by a previous owner between open and flock
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        prev = self._owner_line(fd)
        if prev and "pid" in prev:
            print(f"sift: taking over {self.folder} (its previous owner, {prev}, is no longer running)",
                  file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} host {socket.gethostname()} command {self.command} "
                     f"started {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
        os.fsync(fd)
        self._fd, self._key = fd, key
        OutputLock._held[key] = 1
        return self

    @staticmethod
    def _owner_line(fd: int) -> str:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            return os.read(fd, 512).decode(errors="replace").strip()
        except OSError:
            return ""

    def release(self) -> None:
        key = getattr(self, "_key", None)
        if key is None or not OutputLock._held.get(key):
            return
        OutputLock._held[key] -= 1
        if OutputLock._held[key] > 0 or self._fd is None:
            return
        del OutputLock._held[key]
        try:
            os.ftruncate(self._fd, 0)  # the folder is free; the empty file stays (removing it would race)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def owner_pid(folder: str | Path) -> int | None:
    """The PID written in ``folder``'s lock file while a live process holds it, else None."""
    p = Path(folder) / LOCK_NAME
    try:
        words = p.read_text().split()
    except OSError:
        return None
    if len(words) >= 2 and words[0] == "pid" and words[1].isdigit() and _pid_alive(int(words[1])):
        return int(words[1])
    return None
