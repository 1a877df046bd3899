"""The wheel: installed next to distributions that own the top-level names `store` and
`pipeline` (as PyPI's packages of those names do), amdflash keeps working and leaves them
alone; a `store.py` in the working directory changes nothing. Built and installed offline."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = sorted(out.glob(f"{source.name.replace('-', '_')}-*.whl"))
    return wheel


def _stand_in(root: Path, name: str) -> Path:
    """A distribution named `name` whose top-level package is `name`, like the one on PyPI."""
    src = root / name
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f'OWNER = "the {name} distribution"\n')
    (src / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "9.9"\n[tool.setuptools]\npackages = ["{name}"]\n')
    return src


@pytest.mark.slow
def test_the_wheel_installs_beside_store_and_pipeline_and_runs(tmp_path):
    source = tmp_path / "amdflash"           # a copy: building leaves nothing in the working tree
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("pipeline", "stages", "store"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    built = [_wheel(source, wheels), _wheel(_stand_in(tmp_path / "src", "store"), wheels),
             _wheel(_stand_in(tmp_path / "src", "pipeline"), wheels)]
    names = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(built[0])], capture_output=True, text=True,
                           check=True).stdout
    assert "amdflash/pipeline/cli/main.py" in names and "amdflash/70-amdflash.rules" in names
    assert not any(line.split()[0].split("/")[0] in ("pipeline", "stages", "store")
                   for line in names.splitlines()[1:] if line.strip())

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # amdflash's dependencies come from the test environment (a path, not its .pth files). A
    # non-editable amdflash installed there is visible through it too, so pip must install the
    # wheel regardless (--ignore-installed); this venv's own site-packages come first on sys.path.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # store and pipeline first, then amdflash on top of them: nothing of theirs may change.
    for wheel in (built[1], built[2], built[0]):
        subprocess.run([*PIP, "--python", str(python), "install", "--no-deps", "--no-index", "--ignore-installed",
                        "-q", str(wheel)], check=True, capture_output=True, timeout=300)

    work = tmp_path / "work"
    work.mkdir()
    (work / "store.py").write_text("raise SystemExit('a stray store.py was imported')\n")
    (work / "pipeline.py").write_text("raise SystemExit('a stray pipeline.py was imported')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["AMDFLASH_DB"] = str(tmp_path / "audit.sqlite")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(env_dir / "bin" / "amdflash"), *argv], capture_output=True, text=True,
                              cwd=work, env=env, timeout=120)

    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("amdflash ")
    assert run("sim", "create", "board", "--transport", "ideal", "--seed", "5").returncode == 0
    info = run("info", "--board", "sim:board", "-q")
    assert info.returncode == 0, info.stderr
    assert "JEDEC capture c8 60 15" in info.stdout
    where = subprocess.run([str(python), "-c", "import amdflash.pipeline.cli.main as c, store, pipeline; "
                            "print(c.__file__); print(store.OWNER); print(pipeline.OWNER)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, check=True).stdout.splitlines()
    assert where[0].startswith(str(site)) and where[1:] == ["the store distribution", "the pipeline distribution"]
