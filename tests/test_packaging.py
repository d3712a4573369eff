"""The package's metadata as setuptools reads it from pyproject.toml: no deprecated form (setuptools warns
that the TOML table form of `license` stops building on 2027-02-18), and the license an SPDX expression."""
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_metadata_has_no_deprecated_field_and_an_spdx_license(monkeypatch):
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution
    from setuptools.warnings import SetuptoolsDeprecationWarning
    monkeypatch.chdir(ROOT)  # the readme and the packages are found from the project's root
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    deprecated = [str(w.message) for w in caught if issubclass(w.category, SetuptoolsDeprecationWarning)]
    assert deprecated == []
    assert dist.metadata.license_expression == "MIT"
