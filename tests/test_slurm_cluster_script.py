"""tests/slurm/cluster.sh trusts nothing in /tmp (a site's review): its state folder is
one it makes itself, or one of the caller's own that no one else can write; any other
is refused before anything is installed, started or written."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parent / "slurm" / "cluster.sh"
#: a user that is not the caller (root: nobody's uid; otherwise root's)
OTHER_UID = 65534 if os.geteuid() == 0 else 0


def run(action: str, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "STUDY_SLURM_DIR": str(state), "STUDY_SLURM_NODES": "2"}
    return subprocess.run(
        ["bash", str(CLUSTER), action], capture_output=True, text=True, timeout=60, env=env
    )


def others_folder(tmp_path: Path) -> Path:
    """A folder owned by another user, as one prepared in /tmp by someone else."""
    if os.geteuid() != 0:
        return Path("/usr/share")  # root's
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, OTHER_UID, OTHER_UID)
    return folder


def unsafe_folders(tmp_path: Path) -> list[tuple[Path, str]]:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777 | stat.S_ISVTX)  # as /tmp itself
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    return [
        (others_folder(tmp_path), f"owned by uid {OTHER_UID}, not by you"),
        (shared, "group or others can write it (mode 1777)"),
        (link, "a link or not a folder"),
        (tmp_path / "with space", "not an absolute path (of letters, digits and . _ - /)"),
    ]


@pytest.mark.parametrize("action", ["start", "stop", "status"])
def test_a_state_folder_that_is_not_the_callers_own_is_refused(tmp_path, action):
    before = set(Path("/etc/slurm").iterdir()) if Path("/etc/slurm").is_dir() else set()
    for folder, why in unsafe_folders(tmp_path):
        listing = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None
        proc = run(action, folder)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out
        assert f"cluster.sh: state folder {folder}: {why}; refusing it" in out, out
        # nothing written there, nothing configured
        assert (sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None) == listing
    after = set(Path("/etc/slurm").iterdir()) if Path("/etc/slurm").is_dir() else set()
    assert after == before


def test_a_missing_state_folder_is_made_private(tmp_path):
    """stop on a folder that does not exist makes nothing; start makes it 0700 (the
    test stops at the refusal of an existing foreign slurm.conf, or installs: it is
    not run here) — the folder's mode is checked through the script's own helper."""
    missing = tmp_path / "new"
    proc = run("stop", missing)
    assert proc.returncode == 0 and "nothing started" in proc.stdout, proc.stderr
    assert not missing.exists()
    made = subprocess.run(
        [
            "bash",
            "-c",
            f'source <(sed -n "/^refuse()/p;/^state_dir()/,/^}}/p" {CLUSTER}); '
            f'DIR={missing}; umask 077; state_dir make && stat -c %a "$DIR"',
        ],  # fmt: skip
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0 and made.stdout.strip() == "700", made.stderr
