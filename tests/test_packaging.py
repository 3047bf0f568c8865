"""environment.yml (conda) and pyproject.toml (pip) ask for the same packages."""

import pathlib

import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _norm(req: str) -> tuple[str, str]:
    r = Requirement(req.split("#")[0].strip())
    return r.name.lower().replace("_", "-"), str(r.specifier)


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_norm(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_block = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_norm(r) for r in pip_block if not r.startswith("-")}
    assert listed == wanted
    assert "-e ." in pip_block and any(str(d).startswith("python") for d in env["dependencies"])


def test_cli_entry_point_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["simlib"] == "simlib.cli:main"
