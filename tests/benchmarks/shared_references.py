"""The gradient check's reference steps shared between experiments (rank/references.py)
against each experiment making its own: the first trials of the experiments given, in
order, in one study (the first makes the references, the others read them where they
ask for the same step), then each of the others alone in a study of its own. Prints
each trial's gradient check and wall, both ways, and the sums.

    .venv/bin/python tests/benchmarks/shared_references.py --preset default \\
        bert-ddp-torchrun-gloo-r2-t1 bert-ddp-torchrun-ccl-r2-t1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from workflow_scripts import envs, trial  # noqa: E402
from workflow_scripts.study import load_study  # noqa: E402


def first_trial(spec: dict, env: dict, study: Path) -> dict:
    out = study / "records" / spec["id"] / "trial0.json"
    log = study / "logs" / f"{spec['id']}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    rec = trial.run(trial.Trial(spec, env, out, log), trial.Noise(max_retries=0))
    assert rec["status"] == "ok", rec.get("error")
    check = rec["gradient_check"]
    assert check["ok"], check
    return {
        "check": check["check_s"],
        "wall": rec["trial_wall_s"],
        "shared": ",".join(
            f"{k}<-{v}" for k, v in check["comparison"].get("shared_references", {}).items()
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="default")
    p.add_argument("--envs-root", default=str(REPO / ".venvs"))
    p.add_argument("experiments", nargs="+")
    args = p.parse_args()
    study = load_study(yaml.safe_load((REPO / "config.yaml").read_text()), str(REPO),
                       {"preset": args.preset})  # fmt: skip
    specs = {e["id"]: dict(e) for e in study.experiments}
    built: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in (specs[e] for e in args.experiments):
            name = spec["env"]
            if name not in built:
                lock, root = REPO / "envs" / f"{name}.txt", Path(args.envs_root)
                with open(Path(tmp) / f"{name}.log", "w") as log:
                    built[name] = envs.build(name, lock, root, sys.executable, "uv", log)
        shared, alone = {}, {}
        for e in args.experiments:
            shared[e] = first_trial(specs[e], built[specs[e]["env"]], Path(tmp) / "shared")
            print(f"  shared {e}: {shared[e]}", flush=True)
        for e in args.experiments[1:]:
            alone[e] = first_trial(specs[e], built[specs[e]["env"]], Path(tmp) / f"alone-{e}")
            print(f"  alone  {e}: {alone[e]}", flush=True)
    print(f"{'experiment':34} {'check s':>8} {'alone':>8} {'wall s':>8} {'alone':>8}  shared")
    for e in args.experiments:
        a = alone.get(e, shared[e])
        print(f"{e:34} {shared[e]['check']:8.1f} {a['check']:8.1f} {shared[e]['wall']:8.1f} "
              f"{a['wall']:8.1f}  {shared[e]['shared'] or '-'}")  # fmt: skip
    later = args.experiments[1:]
    for key in ("check", "wall"):
        s = sum(shared[e][key] for e in later)
        a = sum(alone[e][key] for e in later)
        print(f"the {len(later)} after the first, {key}: {s:.1f} s shared against {a:.1f} s "
              f"alone ({s / a:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
