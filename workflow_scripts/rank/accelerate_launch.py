"""Entry script of launcher ``accelerate``: write the trial's Accelerate config file (and
an mpirun hostfile) to a temporary folder, then run ``accelerate launch --config_file``
on the harness, as a user of Accelerate starts a script. The ranks find the config and
the launch command in ``STUDY_ACCELERATE_LAUNCH`` and put them in the record.

    accelerate_launch.py --program run_trial.py --spec-json '{...}' --out result.json
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def shown(cmd: list[str]) -> str:
    """The launch command as the record shows it (the spec's JSON elided)."""
    out = list(cmd)
    if "--spec-json" in out:
        out[out.index("--spec-json") + 1] = "SPEC"
    return shlex.join(out)


def main(argv: list[str]) -> int:
    from workflow_scripts import launchers
    from workflow_scripts.experiment import Spec

    program = argv[argv.index("--program") + 1]
    args = [a for i, a in enumerate(argv) if a != "--program" and argv[i - 1] != "--program"]
    spec = Spec(json.loads(args[args.index("--spec-json") + 1]))
    launcher = launchers.get("accelerate")
    with tempfile.TemporaryDirectory(prefix="study-accelerate-") as tmp:
        hostfile = Path(tmp) / "hostfile"
        hostfile.write_text("localhost\n")
        config = launcher.config(spec, str(hostfile))
        path = Path(tmp) / "accelerate_config.json"
        path.write_text(json.dumps(config, indent=2) + "\n")
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path),
               program, *args]  # fmt: skip
        launch = {"command": shown(["accelerate", "launch", *cmd[3:]]), "config": config}
        print(f"accelerate config: {json.dumps(config)}", file=sys.stderr, flush=True)
        env = dict(os.environ, STUDY_ACCELERATE_LAUNCH=json.dumps(launch))
        return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
