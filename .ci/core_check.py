"""Run in a venv holding only torch and gpufeed's core install (.ci/core_install.sh): the core
commands work, and each extra's feature without it is one line naming `pip install 'gpufeed[X]'`."""

from __future__ import annotations

import glob
import importlib.util
import subprocess
import sys
from pathlib import Path

PY = sys.executable
GPUFEED = [PY, "-m", "gpufeed"]
TRAIN = (
    "import torch\n"
    "m = torch.nn.Linear(4, 2)\n"
    "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
    "for x in torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8):\n"
    "    m(x).sum().backward()\n"
    "    opt.step()\n"
    "    opt.zero_grad()\n"
)


def run(*cmd: str, ok: bool = True) -> subprocess.CompletedProcess:
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if (cp.returncode == 0) != ok or "Traceback" in cp.stderr:
        sys.exit(f"FAILED: {' '.join(cmd)} (exit {cp.returncode})\n{cp.stdout}\n{cp.stderr}")
    shown = " ".join(cmd[2:] if cmd[:3] == (PY, "-m", "gpufeed") else cmd)
    print(f"ok: {shown.splitlines()[0][:100]}")
    return cp


def one_line_naming(cp: subprocess.CompletedProcess, extra: str) -> None:
    lines = [line for line in cp.stderr.splitlines() if line.strip()]
    want = f"pip install 'gpufeed[{extra}]'"
    if len(lines) != 1 or want not in lines[0]:
        sys.exit(f"FAILED: expected one line naming {want}, got:\n{cp.stderr}")


def main() -> None:
    run(PY, "-m", "gpufeed", "--help")
    run(str(Path(PY).with_name("gpufeed")), "--help")  # the console script
    run(*GPUFEED, "profile", "--out", "runs", "--", PY, "-c", TRAIN)
    (rundir,) = glob.glob("runs/*")
    run(*GPUFEED, "show", rundir)
    run(*GPUFEED, "report", rundir)
    run(*GPUFEED, "ls", "runs")
    run(*GPUFEED, "rules")
    run(*GPUFEED, "trace", rundir)
    one_line_naming(run(*GPUFEED, "export", rundir, "--tensorboard", "tb", ok=False), "tensorboard")
    one_line_naming(run(*GPUFEED, "index", "s3://bucket/train-0.tar", ok=False), "s3")
    from gpufeed.extras import EXTRAS, MissingExtra, require

    for extra, (module, _) in EXTRAS.items():
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            continue  # came with torch or the core
        try:
            require(extra)
        except MissingExtra as e:
            if f"pip install 'gpufeed[{extra}]'" not in str(e) or "\n" in str(e):
                sys.exit(f"FAILED: the error for a missing {extra} extra: {e}")
            print(f"ok: without gpufeed[{extra}]: {e}")
        else:
            sys.exit(f"FAILED: require({extra!r}) passed without {module}")


if __name__ == "__main__":
    main()
