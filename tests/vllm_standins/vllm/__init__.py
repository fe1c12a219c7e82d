"""STAND-INS for the parts of vLLM that dpukv's adapter (python/dpukv/vllm/) and
its contract test (python/tests/test_vllm_contract.py) touch, for machines where vLLM
cannot be installed. Written from vLLM's source (vllm-project/vllm: base.py at
13f4ad0f55b08ca1d37d1459f50ce950feaeb547, v1/core/sched/output.py at
00e8f1fd0936d138370d01dbe1b4f8e12baf63b1): same module paths, names, fields and
signatures, none of vLLM's behaviour beyond what those classes themselves do.
They are not vLLM; where vLLM is importable the test uses the real modules."""
STANDIN = True
