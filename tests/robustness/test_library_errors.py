"""Library errors at the file boundary become one line (issue 46, class G): a write that the
disk refuses inside a library's own writer (safetensors raises SafetensorError, not an OSError)
is `export`'s one line with exit 2 and nothing left behind. The refusal is real: the export runs
under a file-size limit (RLIMIT_FSIZE, its signal ignored), so the write fails in safetensors'
own code as on a full disk."""

from __future__ import annotations

import pytest

from harness import python_c

_EXPORT_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from gpt2_tui import main
sys.exit(main(["export", sys.argv[1], "--hf", sys.argv[2]]))
"""


def test_a_write_the_disk_refuses_inside_safetensors_is_one_line(trained_runs, tmp_path):
    pytest.importorskip("safetensors")
    run = trained_runs.copy("micro-2", tmp_path / "run")
    out = tmp_path / "out" / "hf"
    out.parent.mkdir()
    res = python_c(_EXPORT_LIMITED, run, out, timeout=300)
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "could not be written" in err and "free space" in err, err
    assert list(out.parent.iterdir()) == []  # no half export, no temp directory
