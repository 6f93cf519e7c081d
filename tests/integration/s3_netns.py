"""The S3 endpoint scenarios of ``test_s3_endpoints.py``, run inside a network namespace
with only loopback (an endpoint from an AWS config file must never reach a real cloud).

``python -m tests.integration.s3_netns run WORKDIR`` starts two moto processes (A and B:
one key, other bytes), runs each scenario's reads in fresh processes (a new run, as a user
would start one; the same ``cache_dir``) and prints the results as JSON. ``read`` is one
such reader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration import servers

KEY = f"{servers.BUCKET}/same/key.bin"
URL = f"s3://{KEY}"
BYTES = {"A": b"bytes of endpoint A", "B": b"bytes of endpoint B, longer"}
KEYS = {"key": "testing", "secret": "testing"}


class _Moto(servers._SubprocessServer):
    name = "moto"

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", servers.LOOPBACK, "-p", str(port)]

    @property
    def endpoint(self) -> str:
        return f"http://{servers.LOOPBACK}:{self.port}"


def read(arguments: dict) -> dict:
    """One run's read of ``URL``: the bytes (or the error), and where the key says it lives."""
    import fsspec

    from fsspec_shards.storage.backends import backend_location

    fs = fsspec.filesystem(
        "wds",
        target_protocol="s3",
        target_options=arguments["options"],
        cache_dir=arguments["cache_dir"],
        transport=arguments["transport"],
        retries=1,
        timeout=5,
    )
    found = {"location": backend_location(fs.fs)}
    try:
        found["data"] = fs.cat_file(URL).decode()
    except OSError as error:
        found["error"] = type(error).__name__
    transport = fs.download_transport
    spec = getattr(getattr(transport, "fast", None), "spec", None)
    if spec is not None:
        found["obstore"] = {name: spec.config.get(name) for name in ("endpoint", "region")}
    found["stats"] = {k: fs.cache_stats()[k] for k in ("hits", "misses")}
    return found


def _reader(workdir: Path, step: dict) -> dict:
    config = workdir / f"config-{step['name']}"
    config.write_text(step.get("config", ""))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(config), AWS_SHARED_CREDENTIALS_FILE=str(workdir / "none"))
    env.update(AWS_EC2_METADATA_DISABLED="true", **step.get("env", {}))
    arguments = {
        "options": step.get("options", KEYS),
        "cache_dir": str(workdir / step["cache"]),
        "transport": step.get("transport", "fsspec"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.s3_netns", "read", json.dumps(arguments)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode:
        raise RuntimeError(f"reader {step['name']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _scenarios(a: str, b: str) -> dict[str, list[dict]]:
    def points_at(endpoint: str, extra: str = "") -> str:
        return f"[default]\nendpoint_url = {endpoint}\n{extra}"

    scenarios: dict[str, list[dict]] = {}
    for transport in ("fsspec", "obstore"):
        scenarios[f"config file A then B, {transport}"] = [
            {"config": points_at(a), "transport": transport},
            {"config": points_at(b), "transport": transport},
        ]
        scenarios[f"ignored endpoint, {transport}"] = [
            {"env": {"AWS_ENDPOINT_URL": a}, "transport": transport},
            {
                "env": {"AWS_ENDPOINT_URL": a, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"},
                "config": "[default]\nregion = eu-west-3\n",
                "transport": transport,
            },
        ]
        scenarios[f"profile endpoint, {transport}"] = [
            {"config": points_at(a, f"[profile b]\nendpoint_url = {b}\n"), "transport": transport},
            {
                "config": points_at(a, f"[profile b]\nendpoint_url = {b}\n"),
                "options": {**KEYS, "profile": "b"},
                "transport": transport,
            },
        ]
    scenarios["config region signs obstore"] = [
        {"config": points_at(a, "region = eu-west-3\n"), "transport": "obstore"},
    ]
    return scenarios


def run(workdir: Path) -> dict[str, list[dict]]:
    """Every scenario's reads, in order, against two fresh moto processes."""
    import s3fs

    started = []
    try:
        for name in ("A", "B"):
            server = _Moto(workdir / f"moto-{name}").start()
            started.append(server)
            fs = s3fs.S3FileSystem(endpoint_url=server.endpoint, skip_instance_cache=True, **KEYS)
            fs.mkdir(servers.BUCKET)
            fs.pipe(KEY, BYTES[name])
        a, b = (server.endpoint for server in started)
        results = {}
        for number, (scenario, steps) in enumerate(_scenarios(a, b).items()):
            results[scenario] = [
                _reader(workdir, {**step, "name": f"{number}-{i}", "cache": f"cache-{number}"})
                for i, step in enumerate(steps)
            ]
        results["endpoints"] = {"A": a, "B": b}
        return results
    finally:
        for server in started:
            server.stop()


if __name__ == "__main__":
    if sys.argv[1] == "read":
        print(json.dumps(read(json.loads(sys.argv[2]))))
    else:
        print(json.dumps(run(Path(sys.argv[2]))))
