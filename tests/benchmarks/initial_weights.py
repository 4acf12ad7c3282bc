"""A trial whose model's initial weights are read from the study's ``initial-weights``
folder against the same trial that draws them (rank/initial_weights.py): its setup
(``setup_s``, which builds the model), the gradient check (which builds it again where
it makes a reference), the process's wall and the trial's, in ABBA rounds on this
machine, with the median ratio and its distribution-free 95 % interval (pairs of
neighbours in the ABBA order). A drawing trial starts from an empty folder, so it also
pays for keeping what it drew (as the first build of a study does); the gradient
check's references are made once, before the rounds, and read by every trial after.

    .venv/bin/python tests/benchmarks/initial_weights.py --env-json results/envs/upstream.json \\
        --preset default --experiment bert-base --rounds 3 --set steps=2 warmup_steps=1
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks import experiment_args  # noqa: E402
from workflow_scripts.rank import initial_weights  # noqa: E402


def trial(spec: dict, env_json: str, read: bool, where: Path, n: int) -> dict:
    out, log = where / "records" / f"r{n}" / "trial0.json", where / f"r{n}.log"
    kept = initial_weights.folder(out)
    if not read:
        shutil.rmtree(kept, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "workflow_scripts.trial", "--spec-json", json.dumps(spec),
         "--env-json", env_json, "--out", str(out), "--log", str(log), "--max-retries", "0"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok", rec.get("error")
    m = rec["metrics"]
    assert m["initial_weights"] == ("read" if read else "drawn"), m["initial_weights"]
    return {
        "setup": m["setup_s"] - (m.get("libraries_s") or 0),
        "check": m.get("grad_check_s") or 0.0,
        "process": rec["provenance"]["process_wall_s"],
        "wall": wall,
        "first loss": rec["losses"][0],
    }


def main() -> int:
    args, spec = experiment_args.parse(__doc__.splitlines()[0], "default", "bert-base", 3)
    got: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        # not counted: the gradient check's references, which every trial after it reads
        trial(spec, args.env_json, False, Path(tmp), 0)
        n = 1
        for r in range(args.rounds):
            for read in (False, True, True, False) if r % 2 == 0 else (True, False, False, True):
                got[read].append(x := trial(spec, args.env_json, read, Path(tmp), n))
                print(
                    f"  {n:3d} {'read ' if read else 'drawn'} setup {x['setup']:6.2f} s  "
                    f"check {x['check']:6.2f} s  process {x['process']:6.2f} s",
                    flush=True,
                )
                n += 1
    losses = {x["first loss"] for xs in got.values() for x in xs}
    print(
        f"{args.experiment} ({args.preset}), {len(got[True])} trials each, ABBA; "
        f"first losses: {sorted(losses)}"
    )
    figures = (("setup", "setup, less imports (s)"), ("check", "gradient check (s)"),
               ("process", "process wall (s)"), ("wall", "trial wall (s)"))  # fmt: skip
    experiment_args.print_pairs(got[True], got[False], figures, ("read", "drawn"), 24)
    return 0


if __name__ == "__main__":
    sys.exit(main())
