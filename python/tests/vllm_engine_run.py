"""One run of vLLM's own engine (LLM, on vLLM's CPU platform) over a tiny Llama the
test wrote (config.json and seeded random weights, random_llama.py), prompts given as token ids, greedy. Run by
test_vllm_engine.py, one process per run, as a new engine process would be:

  vllm_engine_run.py MODEL_DIR SOCKET|none PROMPTS_JSON|- [OPTIONS_JSON]

SOCKET: the connector configured by kv_transfer_config as the README shows it;
"none": no connector. Prints one JSON line: per prompt, its output token ids and
vLLM's num_cached_tokens, and its finish reason. PROMPTS_JSON "-": a session: one
engine, a batch of prompts per line of stdin, a RESULT line for each, until stdin
ends (the test does things to the agent between batches). OPTIONS_JSON: "extra"
(more kv_connector_extra_config), "policy" (kv_load_failure_policy), "kv_bytes"
(the KV space), "max_model_len", "max_tokens", "prefix_caching" (false: vLLM's own
prefix cache off, so that every hit comes from the connector), "margins" (true: per
generated token, its logprob's lead over the runner-up's)."""
import json
import sys


def main():
    model, socket, prompts = sys.argv[1], sys.argv[2], sys.argv[3]
    opts = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    from vllm import LLM, SamplingParams

    kw = {}
    if socket != "none":
        from vllm.config import KVTransferConfig
        extra = dict({"dpukv.socket": socket}, **opts.get("extra", {}))
        more = {"kv_load_failure_policy": opts["policy"]} if "policy" in opts else {}
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="DpukvConnectorV1", kv_connector_module_path="dpukv.vllm",
            kv_role="kv_both", kv_connector_extra_config=extra, **more)
    # A small KV space (vLLM's CPU default takes 92 % of the RAM), eager mode (no
    # graphs to compile on a 2-core machine); statistics on, for the preemption count.
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=opts.get("max_model_len", 4096), enforce_eager=True, seed=0,
              max_num_seqs=8, kv_cache_memory_bytes=opts.get("kv_bytes", 256 << 20),
              disable_log_stats=False, enable_prefix_caching=opts.get("prefix_caching", True),
              **kw)
    params = SamplingParams(max_tokens=opts.get("max_tokens", 8), temperature=0.0,
                            detokenize=False, logprobs=2 if opts.get("margins") else None)

    def margins(o):
        """Per generated token, how far its logprob is above the runner-up's."""
        out = []
        for step in o.outputs[0].logprobs or []:
            top = sorted((lp.logprob for lp in step.values()), reverse=True)
            out.append(top[0] - top[1] if len(top) > 1 else float("inf"))
        return out

    def preemptions():
        for m in llm.get_metrics():
            if m.name == "vllm:num_preemptions":
                return int(getattr(m, "value", 0))
        return 0

    def generate(batch):
        # A prompt: its token ids, or {"tokens": [...], "salt": cache_salt}.
        outs = llm.generate([{"prompt_token_ids": p} if isinstance(p, list) else
                             {"prompt_token_ids": p["tokens"], "cache_salt": p["salt"]}
                             for p in batch], params, use_tqdm=False)
        print("RESULT " + json.dumps({
            "preemptions": preemptions(),
            "outputs": [{"tokens": list(o.outputs[0].token_ids), "cached": o.num_cached_tokens or 0,
                         "finish": str(o.outputs[0].finish_reason), "margins": margins(o)}
                        for o in outs]}), flush=True)

    if prompts != "-":
        generate(json.loads(prompts))
        return
    print("READY", flush=True)
    for line in sys.stdin:
        generate(json.loads(line))


if __name__ == "__main__":  # vLLM starts its engine processes by spawn
    main()
