"""vLLM's own engine with dpukv as its KV connector (issue 35, first part): a tiny
Llama written here (config.json and seeded random weights, random_llama.py), on vLLM's CPU
platform, each run a new engine process (vllm_engine_run.py), against a dpukv
agent this test starts. Nothing from a hub, no tokenizer: prompts are token ids.

  1. a run without the connector gives the reference tokens;
  2. a run with the connector stores the prompts' whole chunks in dpukv and gives
     the same tokens;
  3. a new engine process finds them in dpukv (the agent's retrieves, and vLLM's
     cached tokens), and gives the same tokens again;
  4. a batch of a full hit, a partial hit (the same first chunks, then others)
     and a miss gives the tokens of the same batch without the connector;
  5. the same tokens under two tenants' cache_salt never share KV; engines in two
     of the agent's tenants (by group id) never load each other's chunks, and two
     engines of one tenant share;
  6. a failed load under either kv_load_failure_policy: recompute gives the same
     tokens, fail ends the request cleanly;
  7. preemption under a small KV space (vLLM's count says it happened): the same
     tokens as without the connector under the same space;
  8. one engine through its agent's life (a session: batches sent one by one): the
     agent killed before a batch (misses, the same tokens), restarted under the
     engine (its hits come back), killed during a batch; under recompute every
     request gets the reference tokens, under vLLM's default policy each gets them
     or ends with finish reason error; never other tokens, never a hang;
  9. the token checks can fail: a prompt whose chunks hold another prompt's KV
     (stored under its keys by this test) gives other tokens.

test_vllm_engine.py PYTHON PACKAGE_DIR DPUKV_BIN (PYTHON: the interpreter of the
venv scripts/deps.sh --test made with vLLM; tests/vllm_engine_test.sh finds it)."""
import json
import os
import select
import subprocess
import sys
import tempfile
import time

PY, PKG, BIN = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 512

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
          "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "vocab_size": VOCAB, "max_position_embeddings": 4096,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
          "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1,
          "eos_token_id": 2}


def tokens(seed, n):
    """n token ids of a seeded sequence (not 0-2: pad, bos, eos)."""
    x, out = seed * 2654435761 + 1, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        out.append(3 + (x >> 33) % (VOCAB - 3))
    return out


def stat(sock):
    out = subprocess.run([BIN, "stat", "--socket", sock, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def run(model, sock, prompts, opts=None, full=False, gid=None):
    """One engine process; with gid, under that group id only (setpriv), which puts
    it in the agent's tenant of that group."""
    env = dict(os.environ, PYTHONPATH=PKG, VLLM_LOGGING_LEVEL="WARNING",
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [PY, os.path.join(HERE, "vllm_engine_run.py"), model, sock or "none",
           json.dumps(prompts), json.dumps(opts or {})]
    if gid is not None:
        cmd = ["setpriv", f"--regid={gid}", "--clear-groups"] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-8000:])
        raise AssertionError(f"the engine run failed (exit {p.returncode})")
    got = json.loads(lines[-1][len("RESULT "):])
    return got if full else got["outputs"]


class Session:
    """One engine process kept up across batches (vllm_engine_run.py's "-" mode), so
    the test can kill and restart the agent under it."""

    def __init__(self, model, sock, opts, log):
        env = dict(os.environ, PYTHONPATH=PKG, VLLM_LOGGING_LEVEL="WARNING",
                   PYTHONDONTWRITEBYTECODE="1")
        self.p = subprocess.Popen([PY, os.path.join(HERE, "vllm_engine_run.py"), model, sock,
                                   "-", json.dumps(opts)], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log)
        self.log = log
        # Lines are cut from raw reads here: a buffered readline after select() can
        # take two lines into its buffer, and select() then never sees the second
        # (the test waited for a READY the engine had printed: a hang, 1 run in 3).
        self.pending = b""
        self.line("READY")

    def has_output(self):
        """Whether a whole line is already here or the engine has written more."""
        return (b"\n" in self.pending or
                bool(select.select([self.p.stdout], [], [], 0)[0]))

    def line(self, prefix, deadline_s=900):
        """The next stdout line starting with prefix (others skipped), waited for while
        the engine lives: a hang fails here, not in ctest's timeout."""
        deadline = time.monotonic() + deadline_s
        while True:
            while b"\n" in self.pending:
                raw, self.pending = self.pending.split(b"\n", 1)
                text = raw.decode(errors="replace")
                if text.startswith(prefix):
                    return text[len(prefix):]
            if select.select([self.p.stdout], [], [], 1.0)[0]:
                got = os.read(self.p.stdout.fileno(), 1 << 16)
                if not got:
                    self.log.seek(0)
                    sys.stderr.write(self.log.read()[-8000:])
                    raise AssertionError(f"the engine exited ({self.p.wait()})")
                self.pending += got
            assert time.monotonic() < deadline, f"the engine gave no {prefix} line: a hang"

    def send(self, prompts):
        self.p.stdin.write((json.dumps(prompts) + "\n").encode())
        self.p.stdin.flush()

    def result(self):
        return json.loads(self.line("RESULT "))["outputs"]

    def generate(self, prompts):
        self.send(prompts)
        return self.result()

    def close(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=300) == 0, "the engine did not exit cleanly"


# Two tenants by group (issue 46): engines run as root under one of these group
# ids are in team-a or team-b; every other engine here is in root's own tenant.
TENANT_GIDS = {"team-a": 4301, "team-b": 4302}


def start_agent(sock):
    """An agent listening at sock (a killed one's socket file replaced)."""
    if os.path.exists(sock):
        os.unlink(sock)
    rules = []
    for name, gid in TENANT_GIDS.items():
        rules += ["--tenant", f"{name} gid:{gid}"]
    agent = subprocess.Popen([BIN, "--log-level", "warning", "agent", "--socket", sock,
                              "--memory-bytes", "256M", "--metrics-port", "0"] + rules)
    while not os.path.exists(sock):  # as long as a busy machine takes
        assert agent.poll() is None, "the agent exited before it listened"
        time.sleep(0.05)
    return agent


def kill(agent):
    if agent.poll() is None:
        agent.kill()
    agent.wait()


def workspace(prefix):
    """A folder with the tiny Llama (config.json and seeded random weights,
    random_llama.py) and a socket path for the agent: (folder, model folder, socket)."""
    from random_llama import write_random_llama
    tmp = tempfile.mkdtemp(prefix=prefix)
    model = os.path.join(tmp, "tiny-llama")
    write_random_llama(model, CONFIG)
    return tmp, model, os.path.join(tmp, "agent.sock")


def poison(sock, name, layouts, into, source, chunk_bytes, chunk=256):
    """Stores prompt source's whole chunks under prompt into's keys, every layer:
    what a connector that loaded another prompt's KV would serve. The chunks
    replaced (per layer)."""
    sys.path.insert(0, PKG)
    import dpukv
    mid = dpukv.model_id(name)
    k_into = dpukv.chunk_keys_layers(mid, list(into), chunk, False, 1, 0, layouts)
    k_src = dpukv.chunk_keys_layers(mid, list(source), chunk, False, 1, 0, layouts)
    whole = min(len(k_into[0]), len(k_src[0]))
    assert whole >= 1, (len(into), len(source))
    client = dpukv.Client(sock, model=mid)
    staging = client.alloc_staging(whole * chunk_bytes)
    offs, lens = [c * chunk_bytes for c in range(whole)], [chunk_bytes] * whole
    for l in range(len(layouts)):
        assert client.retrieve(staging, k_src[l][:whole], offs, lens) == ["SUCCESS"] * whole
        client.remove(k_into[l][:whole])
        assert client.store(staging, k_into[l][:whole], offs, lens) == ["SUCCESS"] * whole
    client.close()
    return whole


def tiny_layouts():
    """The tiny Llama's chunk key layouts, as the adapter keys vLLM 0.32's caches
    (BHNC: K and V in a row of 2 x head_dim), and its chunk bytes."""
    sys.path.insert(0, PKG)
    from dpukv.connector.layout import layer_layouts
    kvh = CONFIG["num_key_value_heads"]
    hd = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    layouts = layer_layouts("bfloat16", CONFIG["num_hidden_layers"], kvh, 2 * hd, "BHNC")
    return layouts, 256 * kvh * 2 * hd * 2


def main():
    tmp, model, sock = workspace("dpukv-vllm-engine-")
    agent = start_agent(sock)
    try:
        # Two prompts of 3 whole 256-token chunks and a tail, one short one; a
        # prompt with a's first two chunks, one of nothing stored, one for tenants.
        a, b, short = tokens(1, 800), tokens(2, 700), tokens(3, 40)
        partial, miss, salted = a[:512] + tokens(4, 300), tokens(5, 600), tokens(6, 600)
        # The reference: every prompt without the connector, in one engine (a
        # request's greedy tokens do not depend on its batch here: the rows below
        # compare runs of other batches with it, and they agree).
        ref = [r["tokens"] for r in run(model, None, [a, b, short, partial, miss, salted])]
        want = dict(zip(("a", "b", "short", "partial", "miss", "salted"), ref))

        def same(got, names):
            assert [r["tokens"] for r in got] == [want[n] for n in names], (got, names, want)

        # Stored, of 2 layers: 3 + 2 whole chunks and each prompt's partial last
        # chunk (the short prompt's is all it has); the salted prompt's 2 + 1 chunks
        # under tenant-a's salt.
        same(run(model, sock, [a, b, short, {"tokens": salted, "salt": "tenant-a"}]),
             ["a", "b", "short", "salted"])
        s = stat(sock)
        assert s["stores"] == (4 + 3 + 1 + 3) * 2 and s["chunks"] == (4 + 3 + 1 + 3) * 2, s

        second = run(model, sock, [a, b, short])  # a new engine process
        same(second, ["a", "b", "short"])
        s2 = stat(sock)
        # Each a full hit: all of the prompt but its last token.
        assert s2["retrieves"] - s["retrieves"] == (4 + 3 + 1) * 2, (s, s2)
        assert [r["cached"] for r in second] == [799, 699, 39], second

        # A full hit, a partial hit and a miss in one batch.
        same(run(model, sock, [a, partial, miss]), ["a", "partial", "miss"])
        s3 = stat(sock)
        # The full hit at least (the partial one may find its prefix in vLLM's own
        # cache, filled by the full hit in the same step).
        assert s3["retrieves"] - s2["retrieves"] >= 3 * 2, (s2, s3)

        # The same tokens under two tenants' cache_salt never share KV: a miss under
        # tenant-b's, found under tenant-a's.
        s4 = s3
        for salt, loads in (("tenant-b", 0), ("tenant-a", 3 * 2)):
            same(run(model, sock, [{"tokens": salted, "salt": salt}]), ["salted"])
            s5 = stat(sock)
            assert s5["retrieves"] - s4["retrieves"] == loads, (salt, s4, s5)
            s4 = s5
        # Engines of two tenants of the agent (issue 46; by group id, as root, since the
        # venv is root's): team-b's engine loads nothing of what team-a's stored, a
        # second engine of team-a loads all of it, tokens always the reference's.
        tenants_note = "tenants by group skipped (not root)"
        if os.geteuid() == 0:
            shared = tokens(21, 600)  # 2 whole chunks and a partial one: 6 over 2 layers
            ref_shared = [r["tokens"] for r in run(model, None, [shared])]
            loads = []
            for who in ("team-a", "team-b", "team-a"):
                before = stat(sock)["retrieves"]
                got = run(model, sock, [shared], gid=TENANT_GIDS[who])
                assert [r["tokens"] for r in got] == ref_shared, (who, got)
                loads.append(stat(sock)["retrieves"] - before)
            assert loads == [0, 0, 3 * 2], f"chunk loads by team-a, team-b, team-a: {loads}"
            rows = {t["name"]: t["chunks"] for t in stat(sock)["tenants"]}
            assert rows.get("team-a") == 6 and rows.get("team-b") == 6, rows
            tenants_note = (f"tenants by group: chunk loads {loads} (team-a, team-b, team-a "
                            f"again), {rows['team-a']} + {rows['team-b']} chunks kept apart")
        s4 = stat(sock)
        # A load that fails (here: every hit older than a 1 us lease when it is loaded)
        # under both of vLLM's kv_load_failure_policy values: "recompute" gives the
        # tokens of a run without the connector; "fail" (vLLM's default) ends the
        # request with finish reason "error" and no tokens. Never wrong tokens.
        lapsed = {"extra": {"dpukv.lease_ms": 0.001}}
        same(run(model, sock, [a], dict(lapsed, policy="recompute")), ["a"])
        got = run(model, sock, [a], dict(lapsed, policy="fail"))
        assert got[0]["tokens"] == [] and got[0]["finish"] == "error", got
        assert stat(sock)["retrieves"] == s4["retrieves"]  # nothing was loaded

        # Preemption under a small KV space (about 2k tokens for three 600-token prompts
        # decoding 200 each): vLLM preempts, the preempted request is looked up and
        # loaded again on resumption; the tokens are those without the connector under
        # the same space, up to a step where that run's top two tokens tie (within
        # 0.25 nats, bf16 logits tie exactly now and then): there the resumed request,
        # which loads the prompt's KV as first computed where vLLM alone recomputes it
        # (bf16 sums in another order), may take the other one. KV from the wrong
        # blocks leaves the tokens where they are not tied (test 9: at once).
        small = {"kv_bytes": 1 << 20, "max_model_len": 1024, "max_tokens": 200, "margins": True}
        pre = [tokens(11, 600), tokens(12, 600), tokens(13, 600)]
        ref_pre = run(model, None, pre, small, full=True)
        assert ref_pre["preemptions"] >= 1, ref_pre["preemptions"]
        before = stat(sock)["retrieves"]
        got_pre = run(model, sock, pre, small, full=True)
        assert got_pre["preemptions"] >= 1, got_pre["preemptions"]
        ties = []
        for g, r in zip(got_pre["outputs"], ref_pre["outputs"]):
            assert len(g["tokens"]) == len(r["tokens"]), (g, r)
            d = next((i for i, (x, y) in enumerate(zip(g["tokens"], r["tokens"])) if x != y),
                     None)
            assert d is None or r["margins"][d] <= 0.25, (d, r["margins"][d], g, r)
            ties.append(d)
        preempted_loads = stat(sock)["retrieves"] - before

        # One engine through its agent's life, under both failure policies.
        log = open(os.path.join(tmp, "session.log"), "w+")
        notes = []
        for policy in ("recompute", None):
            # vLLM's own prefix cache off: a hit in this long-lived engine can only
            # come from dpukv.
            opts = dict({"policy": policy} if policy else {}, prefix_caching=False)
            sess = Session(model, sock, opts, log)
            ok = ["a", "b"]
            # Killed before a batch: every lookup a miss, the same tokens.
            kill(agent)
            same(sess.generate([a, b]), ok)
            # Restarted under the engine (an empty cache): the connectors reconnect,
            # the batch stores, and a batch after that is served from the new agent.
            agent = start_agent(sock)
            deadline = time.monotonic() + 300
            while stat(sock)["retrieves"] < 3 * 2:
                same(sess.generate([a]), ["a"])
                assert time.monotonic() < deadline, ("no hits from the restarted agent",
                                                     stat(sock))
            # Killed during a batch of hits: once its loads began (the agent counted
            # retrieves), or after the batch if it was quicker than that.
            r0 = stat(sock)["retrieves"]
            sess.send([a, b, partial])
            during = False
            while not sess.has_output():
                if stat(sock)["retrieves"] > r0:
                    during = True
                    break
            kill(agent)
            got = sess.result()
            for r, name in zip(got, ["a", "b", "partial"]):
                if policy == "recompute" or r["finish"] != "error":
                    assert r["tokens"] == want[name], (policy, name, r)
                else:
                    assert r["tokens"] == [], (policy, name, r)
            errors = sum(r["finish"] == "error" for r in got)
            same(sess.generate([a, partial]), ["a", "partial"])  # and on, without it
            sess.close()
            agent = start_agent(sock)
            notes.append(f"{policy or 'fail (default)'}: killed "
                         f"{'during' if during else 'after'} the batch, {errors} ended "
                         f"with error")
        # The token checks above can fail: the same check against a run that loads
        # another prompt's KV (b's chunks stored under a's keys) reports it.
        sess = Session(model, sock, {"prefix_caching": False}, log)
        same(sess.generate([a, b]), ["a", "b"])
        deadline = time.monotonic() + 300  # stored asynchronously
        while stat(sock)["chunks"] < (4 + 3) * 2:
            assert time.monotonic() < deadline, stat(sock)
            time.sleep(0.05)
        layouts, chunk_bytes = tiny_layouts()
        replaced = poison(sock, model, layouts, a, b, chunk_bytes)
        r0 = stat(sock)["retrieves"]
        poisoned = sess.generate([a])[0]["tokens"]
        sess.close()
        assert stat(sock)["retrieves"] > r0, "the poisoned chunks were not loaded"
        assert poisoned != want["a"], ("another prompt's KV gave the same tokens: the "
                                       "token checks of this test cannot fail", poisoned)
        print(f"vllm.engine: with b's KV in a's first {replaced} chunks, a gave {poisoned}, "
              f"not {want['a']}")
        print(f"vllm.engine: ok: 3 prompts stored and found again by a new engine "
              f"process, a mixed batch, tenants' salts kept apart, {tenants_note}, "
              f"tokens equal to runs "
              f"without the connector; {s4['retrieves']} chunk retrieves; preemption "
              f"({got_pre['preemptions']} preempted, {preempted_loads} chunk loads, first "
              f"differences at ties: {ties}); "
              f"agent killed and restarted under one engine: {'; '.join(notes)}")
    finally:
        kill(agent)


if __name__ == "__main__":
    main()
