"""Build hook for the one wheel that carries kvtier's binaries.

pyproject.toml is the package's metadata; this file only adds what
scripts/wheel.sh asks for through the environment, so a plain
``pip install ./clients/python`` (no such variables) builds exactly what
pyproject.toml says: a pure wheel with no binaries and no console scripts.

KVTIER_WHEEL_BINARIES=DIR (set only by scripts/wheel.sh, for its own build)
    DIR holds the static binaries ``kvtierd`` and ``kvtier``. They are copied
    into the build's ``kvtier_bin/bin/`` (never into the source tree), the
    console scripts ``kvtierd`` and ``kvtier`` (kvtier_bin's execv shims) are
    declared, and the wheel is tagged for a platform, not ``any``.
KVTIER_WHEEL_PLAT=TAG
    The wheel's platform tag (e.g. linux_aarch64 for binaries built with
    GOARCH=arm64); default: this machine's.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

BINARIES_ENV = "KVTIER_WHEEL_BINARIES"
PLAT_ENV = "KVTIER_WHEEL_PLAT"
NAMES = ("kvtierd", "kvtier")


def staged_binaries(stage: str) -> list:
    """The binaries in stage, each checked present and executable."""
    paths = [os.path.join(stage, name) for name in NAMES]
    missing = [p for p in paths if not os.access(p, os.X_OK)]
    if missing:
        raise SystemExit(f"{BINARIES_ENV}={stage}: no executable {', '.join(missing)}")
    return paths


class build_py_with_binaries(build_py):
    """build_py, then the staged binaries into the build's kvtier_bin/bin."""

    def run(self):
        super().run()
        out = os.path.join(self.build_lib, "kvtier_bin", "bin")
        os.makedirs(out, exist_ok=True)
        for src in staged_binaries(os.environ[BINARIES_ENV]):
            dst = os.path.join(out, os.path.basename(src))
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755)


class BinaryDistribution(Distribution):
    """A distribution with platform content: install puts the packages in
    platlib, which is the platform wheel's root (pure ones go to .data/purelib)."""

    def has_ext_modules(self):
        return True


def platform_bdist_wheel():
    # NB: imported only for the platform build: setuptools ≥ 70.1 has it,
    # older ones take it from the wheel package; the plain build needs neither.
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel

    class platform_wheel(bdist_wheel):
        """A py3-none-<platform> wheel: any Python 3, no ABI, this platform's
        binaries (they are static Go executables, so no libc tag)."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", os.environ.get(PLAT_ENV) or plat

    return platform_wheel


if os.environ.get(BINARIES_ENV):
    staged_binaries(os.environ[BINARIES_ENV])
    setup(
        distclass=BinaryDistribution,
        cmdclass={"build_py": build_py_with_binaries, "bdist_wheel": platform_bdist_wheel()},
        entry_points={"console_scripts": [f"{name} = kvtier_bin:{name}" for name in NAMES]},
    )
else:
    setup()
