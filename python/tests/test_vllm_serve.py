"""`vllm serve` with dpukv as its KV connector, configured by the README's own line
(issue 35): the `--kv-transfer-config` is read out of README.md, its socket set to
an agent this test starts, and the server is vLLM's CLI (`vllm serve`, run as
`python -m vllm.entrypoints.cli.main serve`, what the console script calls: a venv
made elsewhere and moved keeps a stale path in its scripts) on vLLM's CPU platform
over the tiny Llama of the engine test (config.json and seeded random weights, no
tokenizer: prompts are token ids).

An OpenAI completions request with prompt token ids stores the prompt's whole
chunks in dpukv; the same request again is served from dpukv (vLLM's own prefix
cache is off, so a hit can only come from the connector: the agent counts the
chunk retrieves) with the same tokens; and with another prompt's KV stored under
its keys by this test, with other tokens (the check can fail).

test_vllm_serve.py PYTHON PACKAGE_DIR DPUKV_BIN (PYTHON: the interpreter of the
venv scripts/deps.sh --test made with vLLM)."""
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

PY, PKG, BIN = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "..", "..", "README.md")
sys.path.insert(0, HERE)
from test_vllm_engine import (kill, poison, start_agent, stat, tiny_layouts, tokens,  # noqa: E402
                              workspace)


def readme_serve_line():
    """The README's `vllm serve MODEL --kv-transfer-config '...'` line, as words."""
    with open(README) as f:
        lines = [l.strip() for l in f if l.strip().startswith("vllm serve MODEL ")]
    assert len(lines) == 1, f"README.md should show one `vllm serve MODEL` line, not {lines}"
    words = shlex.split(lines[0])
    assert words[:3] == ["vllm", "serve", "MODEL"] and words[3] == "--kv-transfer-config", words
    return words


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def serve(cmd, port, log_path):
    """`vllm serve` (cmd) started, once it answers /health; its output in log_path."""
    return healthy(launch(cmd, log_path), port)


def launch(cmd, log_path, **env_vars):
    """`vllm serve` (cmd) started, its output in log_path, env_vars added to its
    environment: (process, log), for healthy(). Several started before the first
    waited on load their models at once."""
    log = open(log_path, "w+")
    env = dict(os.environ, PYTHONPATH=PKG, PYTHONDONTWRITEBYTECODE="1",
               VLLM_LOGGING_LEVEL="WARNING", **env_vars)
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log


def healthy(launched, port):
    """The server of launch() once it answers /health on port."""
    server, log = launched
    deadline = time.monotonic() + 900  # a server start on a busy 2-core machine
    while True:
        if server.poll() is not None:
            log.seek(0)
            sys.stderr.write(log.read()[-8000:])
            raise AssertionError(f"vllm serve exited ({server.returncode}) before it served")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            stop(server)
            raise AssertionError("vllm serve never became healthy")
        time.sleep(0.2)


def stop(server):
    if server is not None and server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main():
    tmp, model, sock = workspace("dpukv-vllm-serve-")
    words = readme_serve_line()
    config = json.loads(words[4])
    config["kv_connector_extra_config"]["dpukv.socket"] = sock  # the README's line, here
    port = free_port()
    cmd = [PY, "-m", "vllm.entrypoints.cli.main", "serve", model, "--kv-transfer-config",
           json.dumps(config)] + words[5:] + [
        "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init", "--dtype", "bfloat16", "--max-model-len", "4096",
        "--enforce-eager", "--seed", "0", "--max-num-seqs", "4",
        "--kv-cache-memory-bytes", str(256 << 20), "--no-enable-prefix-caching"]
    agent = start_agent(sock)
    server = None
    try:
        server = serve(cmd, port, os.path.join(tmp, "serve.log"))
        prompt = tokens(7, 600)  # 2 whole 256-token chunks and a tail
        body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
                "return_token_ids": True}
        first = post(port, "/v1/completions", body)
        deadline = time.monotonic() + 60
        # 2 whole chunks and the partial third, of 2 layers (stored asynchronously).
        while stat(sock)["chunks"] < 3 * 2:
            assert time.monotonic() < deadline, stat(sock)
            time.sleep(0.05)
        s1 = stat(sock)
        second = post(port, "/v1/completions", body)
        s2 = stat(sock)
        got = [c["token_ids"] for c in (first["choices"][0], second["choices"][0])]
        assert len(got[0]) == 8 and got[0] == got[1], (first, second)
        assert s2["retrieves"] - s1["retrieves"] == 3 * 2, (s1, s2)
        # The check can fail: another prompt's KV under this prompt's keys.
        other = tokens(8, 600)
        post(port, "/v1/completions", dict(body, prompt=other))
        while stat(sock)["chunks"] < 2 * 3 * 2:
            assert time.monotonic() < deadline + 60, stat(sock)
            time.sleep(0.05)
        layouts, chunk_bytes = tiny_layouts()
        poison(sock, model, layouts, prompt, other, chunk_bytes)
        third = post(port, "/v1/completions", body)["choices"][0]["token_ids"]
        assert third != got[0], ("another prompt's KV gave the same tokens: this check "
                                 "cannot fail", third)
        print(f"vllm.serve: ok: `vllm serve` with the README's --kv-transfer-config; the "
              f"second completions request loaded {s2['retrieves'] - s1['retrieves']} chunks "
              f"from dpukv, same tokens {got[0]}; with another prompt's KV in its chunks "
              f"{third}")
    finally:
        stop(server)
        kill(agent)


if __name__ == "__main__":
    main()
