"""The browser test's own Chromium launcher (tests/cdp.py): a start that never writes its
DevTools port is killed and tried again, and the error names every try with its log."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from .cdp import Browser


async def test_a_browser_that_never_answers_is_tried_again_then_named(tmp_path: Path) -> None:
    fake = tmp_path / "chromium"
    fake.write_text('#!/bin/sh\necho "started with $1"\nexec sleep 30\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    profile = tmp_path / "profile"
    with pytest.raises(AssertionError) as error:
        async with Browser.launch(str(fake), [], profile, timeout=0.3, attempts=2):
            pytest.fail("a browser that wrote no port was used")
    message = str(error.value)
    assert message.count("wrote no") == 2
    assert "try 1:" in message and "try 2:" in message
    assert "started with --headless=new" in message  # each try's log, from an emptied profile
