"""The README's local S3 quick start, run as written: its one command starts moto's S3
server (on a free port instead of 5000), and its shell block writes a dataset there, reads
it through the cache, verifies it and streams it again from the cache."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.integration.servers import free_port, wait_for_port

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Quick start against a local S3"


def _blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_the_readme_quick_start_runs_against_the_moto_server_it_starts(tmp_path):
    server_line, script = _blocks()
    command = server_line.split("&&", 1)[1].split("#", 1)[0].strip()
    assert command == "moto_server -H 127.0.0.1 -p 5000"
    port = free_port()
    args = shlex.split(command.replace("5000", str(port)))
    moto = Path(sys.executable).parent / args[0]
    server = subprocess.Popen(
        [str(moto) if moto.exists() else args[0], *args[1:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, process=server)
        script = script.replace("127.0.0.1:5000", f"127.0.0.1:{port}")
        script = script.replace("/tmp/fsspec-shards-quickstart", str(tmp_path / "cache"))
        env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        done = subprocess.run(
            ["bash", "-e", "-c", script.replace("python -", f"{sys.executable} -")],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    assert "1000 samples; 1000 read; 10 shards" in done.stdout
    assert "verified 10 shards against manifest s3://demo/train/SHA256SUMS: 10 ok" in done.stdout
    assert "cache hit rate      100% of shards (10 of 10 cached already)" in done.stdout
