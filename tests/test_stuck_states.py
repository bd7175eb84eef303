"""No stuck states: a save_pretrained killed in the middle of its swap is repaired by the next save,
or brought back whole when that save fails. (A run's own faults: test_train_run, test_train_resume.)"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py

import vitzoo


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def same_model(a, b) -> bool:
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        return a.config == b.config and torch.equal(a.eval()(x), b.eval()(x))




# ------------------------------------------------------------------ a crash between the two renames of a swap
def crash_in_the_swap(directory: Path, seed: int) -> None:
    """save_pretrained over an earlier save in another process, killed (os._exit) between the swap's
    two renames: the earlier save is moved aside, the new one not yet in place."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from hub_testing import tiny
        import vitzoo.io as io
        renames, real = [], os.rename
        def rename(src, dst):
            renames.append(src)
            if len(renames) == 2:
                os._exit(9)  # killed between the two renames
            real(src, dst)
        io.os.rename = rename
        tiny({seed}).save_pretrained({str(directory)!r})
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 9, result.stderr


def test_a_crash_between_the_two_renames_of_a_swap_is_recovered_at_the_next_save(tmp_path):
    """The directory is missing after the crash; loading it says where the earlier save is; the next
    save puts the new model in place and leaves no staging or moved-aside directory behind."""
    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    crash_in_the_swap(tmp_path / "saved", seed=1)
    assert not (tmp_path / "saved").exists()
    with pytest.raises(FileNotFoundError, match=r"an interrupted save left the earlier one in .*\.saved\..*\.old"):
        vitzoo.from_pretrained(tmp_path / "saved")
    second = tiny(2)
    second.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert same_model(vitzoo.from_pretrained(tmp_path / "saved"), second)


def test_a_crash_in_the_swap_then_a_failed_save_brings_the_earlier_save_back(tmp_path):
    """When the next save fails, the directory holds the earlier save again (restored from where the
    crash left it), whole and loadable."""
    from vitzoo.errors import ConfigError

    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    crash_in_the_swap(tmp_path / "saved", seed=1)
    with pytest.raises(ConfigError):
        tiny(3).save_pretrained(tmp_path / "saved", card={"metrics": {"accuracy": None}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert same_model(vitzoo.from_pretrained(tmp_path / "saved"), first)


# ------------------------------------------------------------------ a NaN before the first checkpoint


# ------------------------------------------------------------------ resuming a finished run
