"""Whether an engine's suite can run here: the mark that skips its tests
where the engine (vLLM, SGLang) is not installed in this interpreter,
naming the script that builds its venv."""

from __future__ import annotations

import pytest


def skip_without(have: bool, engine: str, env_script: str) -> pytest.MarkDecorator:
    """A skipif mark: skip unless have (the suite's imports of the engine
    succeeded)."""
    return pytest.mark.skipif(not have, reason=f"{engine} is not installed in this interpreter "
                              f"({env_script} builds the venv)")
