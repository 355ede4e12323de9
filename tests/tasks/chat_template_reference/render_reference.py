#!/usr/bin/env python3
"""Reference renderings of chat templates with the real jinja2, set up the way
transformers' chat_template_utils.py sets it up (the test oracle for kappa's
tasks/jinja interpreter; transformers itself is not needed).

transformers (_compile_jinja_template / render_jinja_template /
apply_chat_template) renders with:
  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[AssistantTracker, jinja2.ext.loopcontrols])
  env.filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)
  env.globals["raise_exception"] raises jinja2.exceptions.TemplateError(message)
  env.globals["strftime_now"] = datetime.now().strftime(format)
  template.render(messages=..., tools=None, documents=None,
                  add_generation_prompt=..., **{**special_tokens_map, **kwargs})
where special_tokens_map holds the tokenizer's bos/eos/unk/sep/pad/cls/mask
tokens and additional_special_tokens that are set and non-empty.

Usage:
  render_reference.py chat --manifest templates.json --cases cases.json \
      --hf-dir DIR --fixture-dir DIR --out expected.json
  render_reference.py engine --cases engine_cases.json --check   (exit 1 on a mismatch)
  render_reference.py engine --cases engine_cases.json --fill    (rewrite the expectations)
"""
import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKENS_ATTRIBUTES = [
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens",
]


class AssistantTracker(Extension):
    """transformers' {% generation %} ... {% endgeneration %}: a CallBlock that
    returns its body (the index tracking is inactive for tokenize=False)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_environment(trim_blocks=True):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=trim_blocks, lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_content(value):
    """A tokenizer_config.json special token: a string or an AddedToken object."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def load_model_dir(model_dir):
    """(template source, special_tokens_map) of a Hugging Face model directory."""
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    config = {}
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    template = config.get("chat_template")
    if isinstance(template, list):
        template = {entry["name"]: entry["template"] for entry in template}["default"]
    if template is None:
        with open(os.path.join(model_dir, "chat_template.jinja"), encoding="utf-8") as f:
            template = f.read()
    special_tokens = {}
    for attr in SPECIAL_TOKENS_ATTRIBUTES:
        value = config.get(attr)
        if attr == "additional_special_tokens":
            value = [token_content(v) for v in value] if value else None
        else:
            value = token_content(value)
        if value:
            special_tokens[attr] = value
    return template, special_tokens


def render(compiled, messages, add_generation_prompt, special_tokens, context):
    """apply_chat_template(tokenize=False): {"output": text} or {"error": ...}."""
    kwargs = dict(context)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    template_kwargs = {**special_tokens, **kwargs}
    try:
        text = compiled.render(messages=messages, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **template_kwargs)
        return {"output": text}
    except Exception as e:  # The template's own failure is the expected result.
        return {"error": {"type": type(e).__name__, "message": str(e)}}


def resolve_dir(spec, hf_dir, fixture_dir):
    kind, name = spec.split(":", 1)
    return os.path.join(hf_dir if kind == "hf" else fixture_dir, name)


def run_chat(args):
    with open(args.manifest, encoding="utf-8") as f:
        manifest = json.load(f)["templates"]
    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    env = make_environment()
    results = []
    for template in manifest:
        source, special_tokens = load_model_dir(
            resolve_dir(template["dir"], args.hf_dir, args.fixture_dir))
        compiled = env.from_string(source)  # transformers caches the compiled template too
        for index, case in enumerate(cases):
            context = {**template.get("context", {}), **case.get("context", {})}
            for add_generation_prompt in (True, False):
                result = render(compiled, case["messages"], add_generation_prompt,
                                special_tokens, context)
                results.append({"template": template["name"], "case": index,
                                "case_name": case["name"],
                                "add_generation_prompt": add_generation_prompt, **result})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "results": results}, f,
                  ensure_ascii=False, indent=1)
    errors = sum(1 for r in results if "error" in r)
    print(f"{len(results)} renderings ({errors} template errors) -> {args.out}")
    return 0


def engine_result(env, case):
    """One engine case: the template rendered with its variables."""
    try:
        return {"output": env.from_string(case["template"]).render(**case.get("context", {}))}
    except Exception as e:
        return {"error": {"type": type(e).__name__, "message": str(e)}}


def run_engine(args):
    with open(args.cases, encoding="utf-8") as f:
        document = json.load(f)
    env = make_environment()
    mismatches = 0
    for case in document["cases"]:
        if case.get("kappa_only"):
            continue  # A kappa refusal of something jinja2 accepts; checked in C++ only.
        actual = engine_result(env, case)
        expected = {k: case[k] for k in ("output", "error") if k in case}
        if args.fill:
            case.pop("output", None)
            case.pop("error", None)
            case.update(actual)
        elif actual != expected:
            mismatches += 1
            print(f"MISMATCH {case['name']}: jinja2 gives {json.dumps(actual, ensure_ascii=False)},"
                  f" the fixture says {json.dumps(expected, ensure_ascii=False)}")
    if args.fill:
        with open(args.cases, "w", encoding="utf-8") as f:
            json.dump(document, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"filled {len(document['cases'])} engine cases")
        return 0
    checked = sum(1 for c in document["cases"] if not c.get("kappa_only"))
    print(f"{checked} engine cases checked against jinja2 {jinja2.__version__}: "
          f"{mismatches} mismatches")
    return 1 if mismatches else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    chat = sub.add_parser("chat")
    chat.add_argument("--manifest", required=True)
    chat.add_argument("--cases", required=True)
    chat.add_argument("--hf-dir", required=True)
    chat.add_argument("--fixture-dir", required=True)
    chat.add_argument("--out", required=True)
    engine = sub.add_parser("engine")
    engine.add_argument("--cases", required=True)
    mode = engine.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--fill", action="store_true")
    args = parser.parse_args()
    return run_chat(args) if args.mode == "chat" else run_engine(args)


if __name__ == "__main__":
    sys.exit(main())
