"""One version, written once: project(stsa VERSION ...) in CMakeLists.txt. The module reports it
(stsa.__version__, from the generated stsa/version.hpp), and a pip install's metadata
(pyproject.toml reads it from CMakeLists.txt) says the same."""

import importlib.metadata
import pathlib
import re

import stsa

CMAKELISTS = pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt"


def test_the_module_reports_the_projects_version():
    written = re.search(r"project\(stsa VERSION ([0-9]+\.[0-9]+\.[0-9]+)", CMAKELISTS.read_text()).group(1)
    assert stsa.__version__ == written


def test_a_pip_install_has_the_modules_version():
    try:
        installed = importlib.metadata.distribution("stsa")
    except importlib.metadata.PackageNotFoundError:
        return  # the build tree's package (PYTHONPATH), not an installed one: nothing to compare
    if pathlib.Path(installed.locate_file("stsa/__init__.py")).resolve() != pathlib.Path(stsa.__file__).resolve():
        return  # another install than the one imported
    assert installed.version == stsa.__version__
