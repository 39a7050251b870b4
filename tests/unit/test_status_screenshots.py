"""The status page's screenshots in docs/ (scripts/status-screenshots) show a device's paths,
not the temporary folders of the tests that take them."""

from __future__ import annotations

from pathlib import Path

from tests.integration.status_repo import neutral_paths


def test_screenshots_show_no_temporary_test_paths(tmp_path: Path) -> None:
    shown = neutral_paths(f"local repositories {tmp_path / 'models'}, store ({tmp_path}/state)")
    assert str(tmp_path) not in shown
    assert shown == (
        "local repositories /var/lib/edge-appliance/models, store (/var/lib/edge-appliance/state)"
    )
