"""Checks grammars with xgrammar, the engine SGLang and vLLM enforce grammars with.

Usage: xgrammar_check.py CASES.json
CASES.json: [{"name", "grammar", "accept": [text, ...], "reject": [text, ...]}]. Each grammar must
parse, every `accept` text must be a complete match and no `reject` text one. Prints one line
per failure and exits 1 if any.

xgrammar imports torch and transformers at the top of modules that parsing and matching do not
use; they are stood in for by empty modules. tvm_ffi is imported first, so that it sees no torch.
"""
import json
import sys
import types

import tvm_ffi  # noqa: F401  (before the stand-ins)


class _Anything:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()

    def __getitem__(self, key):
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)


for name in ["torch", "torch.nn", "torch.nn.functional", "torch.utils",
             "torch.utils.cpp_extension", "torch.library", "transformers"]:
    module = types.ModuleType(name)
    module.__getattr__ = lambda attribute: _Anything()
    module.__path__ = []
    sys.modules.setdefault(name, module)

import xgrammar  # noqa: E402
from xgrammar.testing import _is_grammar_accept_string  # noqa: E402

failures = []
cases = json.load(open(sys.argv[1]))
for case in cases:
    try:
        grammar = xgrammar.Grammar.from_ebnf(case["grammar"], root_rule_name="root")
    except Exception as error:  # the parser raises RuntimeError with its message
        failures.append(f"{case['name']}: does not parse: {error}")
        continue
    for text in case.get("accept", []):
        if not _is_grammar_accept_string(grammar, text):
            failures.append(f"{case['name']}: rejects {text!r}")
    for text in case.get("reject", []):
        if _is_grammar_accept_string(grammar, text):
            failures.append(f"{case['name']}: accepts {text!r}")
for failure in failures:
    print(failure)
print(f"{len(cases)} grammars, {len(failures)} failures", file=sys.stderr)
sys.exit(1 if failures else 0)
