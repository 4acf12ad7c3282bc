"""A trial whose model's initial weights are read from the study's ``initial-weights``
folder against the same trial that draws them (rank/initial_weights.py): its setup
(``setup_s``, which builds the model), the gradient check (which builds it again where
it makes a reference), the process's wall and the trial's, in ABBA rounds on this
machine, with the median ratio and its distribution-free 95 % interval (pairs of
neighbours in the ABBA order). A drawing trial starts from an empty folder, so it also
pays for keeping what it drew (as the first build of a study does).

    .venv/bin/python tests/benchmarks/initial_weights.py --env-json results/envs/upstream.json \\
        --preset default --experiment bert-base --rounds 3 --set steps=2 warmup_steps=1
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from tests.benchmarks.harness_overhead import paired_estimate  # noqa: E402
from workflow_scripts.rank import initial_weights  # noqa: E402
from workflow_scripts.study import load_study  # noqa: E402


def trial(spec: dict, env_json: str, read: bool, where: Path, n: int) -> dict:
    out, log = where / "records" / f"r{n}" / "trial0.json", where / f"r{n}.log"
    kept = initial_weights.folder(out)
    if not read:
        shutil.rmtree(kept, ignore_errors=True)
    shutil.rmtree(where / "gradcheck-references", ignore_errors=True)  # (made each time)
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-json", required=True)
    p.add_argument("--preset", default="default")
    p.add_argument("--experiment", default="bert-base")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="experiment fields to change (YAML values), e.g. steps=2")  # fmt: skip
    args = p.parse_args()
    study = load_study(yaml.safe_load((REPO / "config.yaml").read_text()), str(REPO),
                       {"preset": args.preset})  # fmt: skip
    spec = {e["id"]: dict(e) for e in study.experiments}[args.experiment]
    spec.update({k: yaml.safe_load(v) for k, v in (f.split("=", 1) for f in args.set)})
    got: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for r in range(args.rounds):
            for read in (False, True, True, False) if r % 2 == 0 else (True, False, False, True):
                if read and not initial_weights.folder(Path(tmp) / "records/x/t.json").is_dir():
                    trial(spec, args.env_json, False, Path(tmp), n)  # (what the reads read)
                    n += 1
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
    for key, what in (("setup", "setup, less imports (s)"), ("check", "gradient check (s)"),
                      ("process", "process wall (s)"), ("wall", "trial wall (s)")):  # fmt: skip
        a = [x[key] for x in got[True]]
        b = [x[key] for x in got[False]]
        est = paired_estimate([x / y for x, y in zip(a, b)])  # neighbours in ABBA order
        print(f"  {what:24} read median {sorted(a)[len(a) // 2]:8.2f}  drawn median "
              f"{sorted(b)[len(b) // 2]:8.2f}  read/drawn {est['median']:.3f} "
              f"[{est['ci95'][0]:.3f}-{est['ci95'][1]:.3f}]")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
