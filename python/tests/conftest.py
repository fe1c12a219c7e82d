"""pytest fixtures for tests of the dpukv package against real agents.

DPUKV_PY_PACKAGE_DIR names the folder that holds the dpukv package under test (the
build's python/ folder: the package with its compiled client), DPUKV_BIN the dpukv
binary that runs the agents. ctest sets both (tests/python_pytest.sh)."""
import os
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.environ["DPUKV_PY_PACKAGE_DIR"])


@pytest.fixture
def agent_socket():
    """A real agent process of its own (64 MiB, 1 MiB chunks); its socket path."""
    tmp = tempfile.mkdtemp(prefix="dpukv-pytest-")
    sock = os.path.join(tmp, "agent.sock")
    proc = subprocess.Popen([os.environ["DPUKV_BIN"], "--log-level", "warning", "agent",
                             "--socket", sock, "--memory-bytes", "64M", "--max-chunk-size", "1M",
                             "--metrics-port", "0"])
    try:
        # As long as the machine takes, while the agent lives.
        while not os.path.exists(sock):
            assert proc.poll() is None, "the agent exited before it listened"
            time.sleep(0.05)
        yield sock
    finally:
        proc.terminate()
        proc.wait()
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
