"""What a KV codec costs in accuracy and buys in bytes, on a trained model
(SmolLM2-135M-Instruct, scripts/smollm2_model.sh) and real text.

The model runs in transformers on the CPU, computing in float32 (--dtype bfloat16:
as vLLM's CPU engine; there the model's own argmax moves with the order of its
bf16 sums, a noise floor of about 98 % agreement that hides a codec's effect),
its KV stored as bf16 as vLLM keeps it. A context's KV goes through the codec
exactly as dpukv.kv_codec stores it in vLLM:
cut into vLLM's CPU blocks of 128 tokens ([kv_heads, K|V, 128, head_dim]), two
blocks a 256-token chunk, each chunk encoded with the shape the connector uses
(connector/codec.py: row_slabs) and decoded by the client library into the blocks'
rows (the decode a load runs). The model then goes on from that KV.

- Agreement: per prompt (a 512-token context, then the prompt's next token), the
  greedy continuation of gen tokens with the uncompressed KV; then, for each
  codec, the same tokens fed after the codec's KV (teacher forcing): the fraction
  of positions whose next token (argmax) is the uncompressed one's.
- Perplexity: held-out text in windows of 1024 tokens (stride 512): the first 512
  tokens' KV through the codec, the next 512 scored on it.
- Bytes per token: the encoded chunks' bytes over their tokens (all layers).

Texts, all in Debian's base-files (/usr/share/common-licenses; verbatim copies of
these licences are permitted): prompts from GPL-2, LGPL-2.1, Apache-2.0, MPL-2.0,
MPL-1.1, GFDL-1.3, GPL-1, Artistic, CC0-1.0; perplexity on GPL-3 and LGPL-3, which
no prompt reads.

  bench_kv_quality.py PACKAGE_DIR [--prompts 200] [--gen 32] [--ppl-tokens 8192]
                      [--codecs none,lossless,int8,int4] [--check [CODECS]] [--json]

--check exits 1 when a codec (of CODECS; default all) misses issue 48's targets (lossless: identical; int8:
>= 1.9x fewer bytes, >= 99 % agreement, perplexity within +1 %; int4: >= 3.5x,
>= 95 %, +5 %). Run with the vLLM venv's python (it has transformers); every sample
(per prompt, per window) is in the --json output."""
import argparse
import json
import math
import os
import sys
import time

LICENSES = "/usr/share/common-licenses"
PROMPT_TEXTS = ("GPL-2", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "MPL-1.1", "GFDL-1.3", "GPL-1",
                "Artistic", "CC0-1.0")
HELD_OUT = ("GPL-3", "LGPL-3")
BLOCK, CHUNK, CONTEXT, WINDOW = 128, 256, 512, 1024
TARGETS = {"lossless": (1.0, 1.0, 0.0), "int8": (1.9, 0.99, 0.01), "int4": (3.5, 0.95, 0.05)}


def model_dir():
    import subprocess
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    p = subprocess.run([os.path.join(src, "scripts", "smollm2_model.sh"), "--find"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("no SmolLM2 model here: scripts/deps.sh --test (or scripts/smollm2_model.sh) "
                 "makes it")
    return p.stdout.strip()


class KvRoundTrip:
    """A context's KV through a codec as the connector stores it in vLLM's blocks."""

    def __init__(self, torch, native, codec_mod, kv_heads, head_dim):
        self.torch, self.native = torch, native
        self.kvh, self.hd = kv_heads, head_dim
        # A vLLM CPU block row: [kv_heads, 128, 2 * head_dim] seen as BHNC.
        self.slabs, self.tokens, self.channels = codec_mod.row_slabs("BHNC", kv_heads, BLOCK,
                                                                     2 * head_dim)
        self.row_bytes = kv_heads * 2 * BLOCK * head_dim * 2
        self.codes = codec_mod.CODECS
        self.flags = {name: codec_mod.codec_flags(name, "BHNC", 2 * head_dim)
                      for name in self.codes}

    def __call__(self, codec, k, v):
        """k, v: [1, kv_heads, S, head_dim] (S a multiple of 256): the decoded pair
        (in k's dtype; stored as bf16, as vLLM keeps it) and the encoded bytes."""
        torch = self.torch
        dt = k.dtype
        k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
        s = k.shape[2]
        blocks = s // BLOCK
        rows = torch.stack([k[0].view(self.kvh, blocks, BLOCK, self.hd),
                            v[0].view(self.kvh, blocks, BLOCK, self.hd)], dim=2)
        rows = rows.permute(1, 0, 2, 3, 4).contiguous()  # [blocks, heads, K|V, 128, hd]
        if codec == "none":
            return k.to(dt), v.to(dt), rows.numel() * 2
        out = torch.empty_like(rows)
        per = CHUNK // BLOCK
        slot = self.native.kv_encode_bound(self.codes[codec], self.slabs * per, self.tokens,
                                           self.channels, self.flags[codec], per * self.row_bytes)
        enc = torch.empty((blocks // per) * slot, dtype=torch.uint8)
        offsets, total = [], 0
        for c in range(blocks // per):
            src = rows[c * per:(c + 1) * per]
            total += self.native.kv_encode(self.codes[codec], 1, self.slabs * per, self.tokens,
                                           self.channels, self.flags[codec], src.data_ptr(),
                                           per * self.row_bytes, enc.data_ptr() + c * slot, slot)
            offsets.append(c * slot)
        addrs = torch.tensor([out[b].data_ptr() for b in range(blocks)], dtype=torch.int64)
        st = self.native.kv_decode_rows(enc.data_ptr(), offsets, [slot] * len(offsets),
                                        addrs.data_ptr(), per, per, self.row_bytes)
        assert st == ["SUCCESS"] * len(offsets), st
        out = out.permute(1, 0, 2, 3, 4)  # [heads, blocks, K|V, 128, hd]
        k2 = out[:, :, 0].reshape(1, self.kvh, s, self.hd)
        v2 = out[:, :, 1].reshape(1, self.kvh, s, self.hd)
        return k2.to(dt), v2.to(dt), total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package_dir")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--ppl-tokens", type=int, default=8192)
    ap.add_argument("--codecs", default="none,lossless,int8,int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the model's compute (the KV is stored as bf16 either way)")
    ap.add_argument("--check", nargs="?", const="lossless,int8,int4", default="",
                    help="exit 1 when these codecs (default: all) miss their targets")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, a.package_dir)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from dpukv import _native as native
    from dpukv.connector import codec as codec_mod

    codecs = a.codecs.split(",")
    for c in codecs:
        codec_mod.check_codec(c)
    if "none" not in codecs:
        codecs.insert(0, "none")  # the reference
    torch.set_num_threads(a.threads)
    path = model_dir()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, a.dtype)).eval()
    cfg = model.config
    rt = KvRoundTrip(torch, native, codec_mod, cfg.num_key_value_heads,
                     cfg.hidden_size // cfg.num_attention_heads)

    def cache_of(past, codec, stats):
        c = DynamicCache()
        for l, layer in enumerate(past.layers):
            k, v, nbytes = rt(codec, layer.keys, layer.values)
            stats[codec] = stats.get(codec, 0) + nbytes
            c.update(k, v, l)
        return c

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    # Prompts: windows of CONTEXT + 1 tokens spread over the prompt texts.
    stream = []
    for name in PROMPT_TEXTS:
        with open(os.path.join(LICENSES, name)) as f:
            stream += tok(f.read()).input_ids
    span = CONTEXT + 1
    stride = max((len(stream) - span) // max(a.prompts - 1, 1), 1)
    starts = [i * stride for i in range(a.prompts) if i * stride + span <= len(stream)]
    agree = {c: [] for c in codecs}
    # The noise floor: the uncompressed KV's teacher-forced argmax against its own
    # greedy tokens (the same KV, another order of bf16 computation).
    floor = []
    enc_bytes, enc_tokens = {}, 0
    t0 = time.time()
    with torch.no_grad():
        for i, s0 in enumerate(starts):
            ids = torch.tensor([stream[s0:s0 + span]])
            out = model(input_ids=ids[:, :CONTEXT], use_cache=True)
            past = out.past_key_values
            # The greedy continuation with the uncompressed KV.
            ref = cache_of(past, "none", {})
            x, gen = ids[:, CONTEXT:], []
            for _ in range(a.gen):
                o = model(input_ids=x, past_key_values=ref, use_cache=True)
                x = o.logits[:, -1:].argmax(-1)
                gen.append(int(x))
            feed = torch.cat([ids[:, CONTEXT:], torch.tensor([gen[:-1]])], dim=1)
            base = None
            for c in codecs:
                kv = cache_of(past, c, enc_bytes)
                pred = model(input_ids=feed, past_key_values=kv).logits[0].argmax(-1)
                if c == "none":
                    base = pred
                    floor.append((pred == torch.tensor(gen)).float().mean().item())
                agree[c].append((pred == base).float().mean().item())
            enc_tokens += CONTEXT
            if (i + 1) % 20 == 0:
                log(f"  {i + 1}/{len(starts)} prompts, {time.time() - t0:.0f} s")

        # Perplexity on held-out text.
        held = []
        for name in HELD_OUT:
            with open(os.path.join(LICENSES, name)) as f:
                held += tok(f.read()).input_ids
        nll = {c: [] for c in codecs}
        w0 = 0
        scored = 0
        while w0 + WINDOW + 1 <= len(held) and scored < a.ppl_tokens:
            ids = torch.tensor([held[w0:w0 + WINDOW + 1]])
            past = model(input_ids=ids[:, :CONTEXT], use_cache=True).past_key_values
            targets = ids[0, CONTEXT + 1:]
            for c in codecs:
                logits = model(input_ids=ids[:, CONTEXT:WINDOW],
                               past_key_values=cache_of(past, c, {})).logits[0].float()
                lp = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
                nll[c].append(-lp.sum().item())
            scored += len(targets)
            w0 += WINDOW - CONTEXT
        log(f"  perplexity: {scored} tokens in {len(nll['none'])} windows, "
            f"{time.time() - t0:.0f} s")

    raw_per_token = enc_bytes["none"] / enc_tokens
    results, failed = [], []
    base_ppl = math.exp(sum(nll["none"]) / scored)
    for c in codecs:
        bpt = enc_bytes[c] / enc_tokens
        ppl = math.exp(sum(nll[c]) / scored)
        row = {"codec": c, "prompts": len(starts), "gen_tokens": a.gen,
               "agreement": sum(agree[c]) / len(agree[c]),
               "perplexity": ppl, "baseline_perplexity": base_ppl,
               "perplexity_ratio": ppl / base_ppl, "ppl_tokens": scored,
               "noise_floor_agreement": sum(floor) / len(floor), "dtype": a.dtype,
               "bytes_per_token": bpt, "baseline_bytes_per_token": raw_per_token,
               "compression": raw_per_token / bpt,
               "samples": {"agreement": agree[c], "window_nll": nll[c]}}
        results.append(row)
        if c in TARGETS and c in a.check.split(","):
            ratio, agr, dppl = TARGETS[c]
            ok = (row["compression"] >= ratio and row["agreement"] >= agr and
                  row["perplexity_ratio"] <= 1 + dppl + 1e-12)
            if not ok:
                failed.append(c)
    if a.json:
        print(json.dumps({"bench": "kv_quality", "results": results}))
    else:
        print(f"SmolLM2-135M-Instruct ({a.dtype}), {len(starts)} prompts x {a.gen} generated tokens, "
              f"perplexity on {scored} held-out tokens; the uncompressed KV agrees with its "
              f"own greedy tokens at {100 * sum(floor) / len(floor):.2f}% (the noise floor)")
        print(f"{'codec':<10}{'bytes/token':>12}{'vs bf16':>9}{'agreement':>11}"
              f"{'perplexity':>12}{'vs none':>9}")
        for r in results:
            print(f"{r['codec']:<10}{r['bytes_per_token']:>12.0f}{r['compression']:>8.2f}x"
                  f"{100 * r['agreement']:>10.2f}%{r['perplexity']:>12.3f}"
                  f"{100 * (r['perplexity_ratio'] - 1):>+8.2f}%")
    if a.check and failed:
        print(f"bench_kv_quality: {', '.join(failed)} missed the targets", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
