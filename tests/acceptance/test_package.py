"""The release files: a wheel and an sdist of the distribution ``dibs-sql`` build, pass ``twine check``, and the
wheel installs into a clean virtual environment where ``import dibs``, a claim and the ``dibs`` command work.

The build and the installs fetch what they need (hatchling, the wheel's dependencies) from the package index.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTION = "dibs-sql"
STEP_SECONDS = 600

SMOKE = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import sqlalchemy as sa

    import dibs

    assert Path(dibs.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), dibs.__file__
    engine = dibs.create_engine(f"sqlite:///{sys.argv[1]}")
    metadata = sa.MetaData()
    rows = sa.Table("rows", metadata, sa.Column("id", sa.Integer, primary_key=True), sa.Column("owner", sa.Text))
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(rows.insert(), [{"id": n} for n in range(3)])
    first = dibs.claim(engine, rows, where=rows.c.owner.is_(None), set={"owner": "a"}, limit=2, order_by="id")
    second = dibs.claim(engine, rows, where=rows.c.owner.is_(None), set={"owner": "b"}, limit=2, order_by="id")
    assert [row.id for row in first] == [0, 1] and [row.id for row in second] == [2], (first, second)
    print("claimed", len(first) + len(second))
    """
)


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command``; fail the test with its output if it exits non-zero."""
    # The clean environment must not see this checkout or this virtual environment.
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=STEP_SECONDS, env=env, check=False
    )
    if result.returncode != 0:
        output = result.stdout[-4000:] + result.stderr[-4000:]
        pytest.fail(f"`{' '.join(command)}` exited {result.returncode}:\n{output}")
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)], out)
    return out


def test_wheel_and_sdist_build_and_pass_twine_check(dist: Path) -> None:
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    built = sorted(path.name for path in dist.iterdir())
    assert len(wheels) == 1, built
    assert len(sdists) == 1, built
    assert wheels[0].name.startswith("dibs_sql-"), wheels[0].name
    assert sdists[0].name.startswith("dibs_sql-"), sdists[0].name
    run([sys.executable, "-m", "twine", "check", "--strict", *map(str, [*wheels, *sdists])], dist)


def test_wheel_holds_the_package_under_its_import_name(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
        headers = archive.read(metadata).decode()
        entry_points = archive.read(metadata.replace("METADATA", "entry_points.txt")).decode()
    assert f"\nName: {DISTRIBUTION}\n" in headers
    assert "dibs/__init__.py" in names
    assert "dibs/py.typed" in names, "the wheel tells type checkers that dibs is typed"
    assert not [name for name in names if name.startswith("tests/")], "the tests are not part of the wheel"
    assert "dibs = dibs.cli:main" in entry_points
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(name.endswith("/src/dibs/__init__.py") for name in names)
    assert not [name for name in names if "/benchmarks/results/" in name], "benchmark results are not shipped"


def test_wheel_installs_in_a_clean_venv_and_works(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"{wheel}[cli]"], tmp_path)
    shown = run([str(python), "-m", "pip", "show", DISTRIBUTION], tmp_path)
    assert f"Name: {DISTRIBUTION}" in shown.stdout
    script = tmp_path / "smoke.py"
    script.write_text(SMOKE, encoding="utf-8")
    smoke = run([str(python), str(script), str(tmp_path / "smoke.sqlite")], tmp_path)
    assert "claimed 3" in smoke.stdout
    helped = run([str(venv / "bin" / "dibs"), "--help"], tmp_path)
    assert "Usage: dibs" in helped.stdout
    assert "worker" in helped.stdout
    version = run([str(venv / "bin" / "dibs"), "--version"], tmp_path)
    assert version.stdout.strip().startswith("dibs ")
