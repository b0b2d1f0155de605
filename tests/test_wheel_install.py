"""The user's way in: the wheel `python -m build` makes, installed into a fresh venv,
runs `corral demo` from that venv's own `bin/corral`, with nothing from the checkout.
Its version (the wheel's name, the installed metadata, `corral.__version__` and
`corral --version`) has one source: `__version__` in corral/__init__.py.

Offline and fast: the wheel is built without build isolation (the dev extra has
`build` and `setuptools`), installed with --no-deps, and its dependencies come from
the dev venv's site-packages through a path line in a .pth file. A path line adds
the directory only: the .pth files inside it (the checkout's editable-install
finder among them) are not processed, and the probe below checks that they were not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import corral

ROOT = Path(__file__).resolve().parents[1]

# Where each installed package's files live in the checkout (pyproject.toml's package-dir).
SOURCE_DIRS = {
    "corral": ROOT / "corral",
    "corral/actors": ROOT / "actors",
    "corral/mailbox": ROOT / "mailbox",
    "corral/sandbox": ROOT / "sandbox",
    "corral/supervisor": ROOT / "supervisor",
}

PROBE = """
import importlib.metadata, json, sys
import corral, corral.supervisor, corral.actors, corral.sandbox
print(json.dumps({
    "files": [corral.__file__, corral.supervisor.__file__, corral.actors.__file__, corral.sandbox.__file__],
    "version": corral.__version__,
    "metadata_version": importlib.metadata.version("corral"),
    "path": sys.path,
    "modules": sorted(sys.modules),
}))
"""


def _expected_wheel_files() -> set[str]:
    """Every file of every package in the checkout, as the wheel must hold it."""
    expected: set[str] = set()
    for prefix, source in SOURCE_DIRS.items():
        for path in source.rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            relative = path.relative_to(source)
            # corral/ itself holds the other packages' install names, not their sources.
            if prefix == "corral" and relative.parts[0] in {"actors", "mailbox", "sandbox", "supervisor"}:
                continue
            expected.add(f"{prefix}/{relative.as_posix()}")
    return expected


def _build(out: Path) -> tuple[Path, str]:
    build = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    log = build.stdout + build.stderr
    assert build.returncode == 0, log[-3000:]
    (wheel,) = out.glob("corral-*.whl")
    assert len(list(out.glob("corral-*.tar.gz"))) == 1, sorted(p.name for p in out.iterdir())
    return wheel, log


def _fresh_venv(where: Path, wheel: Path) -> Path:
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         "--disable-pip-version-check", str(wheel)],
        check=True, timeout=120, capture_output=True,
    )
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    dev_site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "corral_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(dev_site)))
    return venv


def _user_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


def test_the_wheel_installs_into_a_fresh_venv_and_runs_the_demo(short_tmp: Path) -> None:
    wheel, log = _build(short_tmp / "dist")
    # No packaging warnings (the byte-compiling notes come from PYTHONDONTWRITEBYTECODE, not from corral).
    warnings = [line for line in log.splitlines() if "warn" in line.lower() and "byte-compiling" not in line]
    assert not warnings, "\n".join(warnings)
    assert wheel.name.startswith(f"corral-{corral.__version__}-")
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    missing = _expected_wheel_files() - in_wheel
    assert not missing, f"pyproject.toml's packages or package-data leave these out: {sorted(missing)}"

    venv = _fresh_venv(short_tmp, wheel)
    env = _user_env(venv)
    away = short_tmp / "elsewhere"  # not the checkout: `python -m` puts the cwd first on sys.path
    away.mkdir()
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], cwd=away, env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout)
    for file in seen["files"]:
        assert Path(file).is_relative_to(venv), f"{file} is not the venv's"
    assert seen["version"] == seen["metadata_version"] == corral.__version__
    assert str(ROOT) not in seen["path"]
    assert not [m for m in seen["modules"] if m.startswith("__editable__")], "the checkout's finder was loaded"
    version = subprocess.run([str(venv / "bin" / "corral"), "--version"], cwd=away, env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    assert version.stdout.strip() == f"corral {corral.__version__}", version.stdout + version.stderr

    demo = subprocess.run([str(venv / "bin" / "corral"), "demo", "--quiet", "--dir", str(short_tmp / "d")],
                          cwd=away, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "final reply: Launch plan ready" in demo.stdout
    assert (short_tmp / "d" / "project" / "summary" / "launch.md").is_file()
    # The demo stops its own supervisor; short_tmp fails the test if any process remains.


def test_the_readme_shows_the_quickstart_as_it_is() -> None:
    """The README's first screen quotes examples/quickstart.py, which the example tests run."""
    quickstart = (ROOT / "examples" / "quickstart.py").read_text()
    assert f"```python\n{quickstart}```" in (ROOT / "README.md").read_text()
