#!/usr/bin/env python3
"""The kappa metric names that Prometheus rules and Grafana dashboards query.

Usage:
  python3 deploy/tools/metric_names.py [--families] FILE...

  FILE: Prometheus rule files (YAML: deploy/prometheus/rules.yml) and Grafana
  dashboards (JSON: deploy/grafana/dashboards/kappa.json); the kind is told
  by the extension (.json is a dashboard, anything else a rule file).

Prints the sorted, unique metric names starting with `kappa_` that the PromQL
expressions in those files select, one per line:
  * rule files: the `expr:` fields (single-line, quoted, multi-line plain and
    `|`/`>` block scalars);
  * rule files also: the PromQL of `query "..."` calls in alert annotation
    templates ({{ with query "kappa_learner_entropy" }}...{{ end }});
  * dashboards: every "expr" field anywhere in the JSON (panel targets,
    annotation queries, including annotation "target" objects).
Only PromQL is read: the rest of annotation/summary text, label values ("..." and '...'
strings in the expressions) and PromQL `#` comments are ignored, so a name
mentioned in prose or a label value (job="kappa-learner") is never printed.
Recording-rule outputs are not printed: every name defined by `record:` in
the given rule files, and every name with a colon (the level:metric:ops
convention), since Prometheus computes them rather than scraping them.

--families maps histogram sample names to their family: a trailing
`_bucket`, `_sum` or `_count` is stripped (kappa_teacher_score_seconds_bucket
-> kappa_teacher_score_seconds). The result is what a scrape of the services
must declare with `# TYPE <name> ...` (counters keep their `_total`, as the
0.0.4 text format names them).

Exit status: 0; 2 on bad usage, an unreadable file or a file without a single
expression (a wrong path should not pass as "uses no metric").

Standard library only (no PyYAML): the rule files are read line by line,
which is enough for the block layout Prometheus rule files use.
"""

import json
import re
import sys

# A PromQL metric identifier: letters, digits, underscores and colons, not
# preceded by an identifier character, a digit (5m), `$` (Grafana variables)
# or a dot.
IDENT = re.compile(r"(?<![A-Za-z0-9_:$.])[A-Za-z_:][A-Za-z0-9_:]*")
KEY_LINE = re.compile(r"^(?P<indent>\s*)(?P<dash>-\s+)?(?P<key>expr|record):(?:\s+(?P<value>.*?))?\s*$")
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")
# `query "PROMQL"` in a Go template (the quotes escaped inside a YAML
# double-quoted scalar).
TEMPLATE_QUERY = re.compile(r'\{\{[^}]*?\bquery\s+(\\?)"(.*?)\1"')


def strip_strings_and_comments(promql):
    """PromQL with string literals blanked and # comments removed."""
    out = []
    i = 0
    n = len(promql)
    while i < n:
        c = promql[i]
        if c in "\"'`":
            j = i + 1
            while j < n and promql[j] != c:
                j += 2 if (promql[j] == "\\" and c != "`") else 1
            out.append('""')
            i = j + 1
        elif c == "#":
            while i < n and promql[i] != "\n":
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def names_in(promql):
    return set(IDENT.findall(strip_strings_and_comments(promql)))


def unquote_yaml_scalar(value):
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def yaml_fields(text):
    """(key, value) for every `expr:` and `record:` field of a rule file."""
    lines = text.splitlines()
    fields = []
    i = 0
    while i < len(lines):
        m = KEY_LINE.match(lines[i])
        i += 1
        if not m:
            continue
        key_column = len(m.group("indent")) + len(m.group("dash") or "")
        value = m.group("value") or ""
        # The value's continuation: block scalar content or the further lines
        # of a plain/quoted multi-line scalar, all indented past the key.
        body = []
        while i < len(lines):
            line = lines[i]
            if line.strip() and len(line) - len(line.lstrip()) <= key_column:
                break
            body.append(line)
            i += 1
        if value[:1] in ("|", ">"):
            content = "\n".join(body)
        else:
            if value.startswith("#"):
                value = ""
            content = unquote_yaml_scalar(" ".join([value] + [b.strip() for b in body]).strip())
        fields.append((m.group("key"), content))
    return fields


def json_exprs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from json_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from json_exprs(item)


def main(argv):
    args = argv[1:]
    families = False
    if args and args[0] == "--families":
        families = True
        args = args[1:]
    if not args or any(a.startswith("-") for a in args):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    used = set()
    recorded = set()
    for path in args:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            sys.stderr.write(f"metric_names: {e}\n")
            return 2
        if path.endswith(".json"):
            try:
                exprs = list(json_exprs(json.loads(text)))
            except ValueError as e:
                sys.stderr.write(f"metric_names: {path}: invalid JSON: {e}\n")
                return 2
        else:
            exprs = []
            for key, value in yaml_fields(text):
                if key == "record":
                    recorded.add(unquote_yaml_scalar(value.strip()))
                else:
                    exprs.append(value)
            exprs += [m.group(2).replace('\\"', '"') for m in TEMPLATE_QUERY.finditer(text)]
        if not exprs:
            sys.stderr.write(f"metric_names: {path}: no expr field found\n")
            return 2
        for expr in exprs:
            used |= names_in(expr)
    names = {n for n in used if n.startswith("kappa_") and ":" not in n and n not in recorded}
    if families:
        names = {HISTOGRAM_SUFFIX.sub("", n) for n in names}
    for name in sorted(names):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
