"""Copies the top-level rules/ and dashboards/ into the wheel (trainsentry/data/)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithAssets(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).parent
        for name in ("rules", "dashboards"):
            src = root / name
            if src.is_dir():
                dst = Path(self.build_lib) / "trainsentry" / "data" / name
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("tests"))


setup(cmdclass={"build_py": BuildPyWithAssets})
