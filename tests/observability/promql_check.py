#!/usr/bin/python3
"""Checks every PromQL expression of Stoker's Grafana dashboards and alert rules.

Offline (no --prometheus): lists the expressions and, with --known-metrics, checks that every
stoker_* metric they use is one the code exports (names found as string literals in the given
source files).
Live (--prometheus URL): evaluates each expression through /api/v1/query and fails on any error;
with --require-data also on an empty result (alert rules are checked without their final
threshold comparison, which is normally false). --allow-empty REGEX exempts matching expressions.

Standard library only (run with /usr/bin/python3).
"""

import argparse
import glob
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_DASHBOARDS = sorted(glob.glob(os.path.join(REPO, "deploy/grafana/dashboards/*.json")))
DEFAULT_RULES = [os.path.join(REPO, "deploy/prometheus/alerts.yml")]


class Expr:
    def __init__(self, source, name, text):
        self.source = source  # file
        self.name = name      # panel title / alert name
        self.text = text      # as written (may contain Grafana variables)

    def where(self):
        return f"{os.path.relpath(self.source, REPO)}: {self.name}"


def dashboard_exprs(path):
    with open(path) as f:
        dashboard = json.load(f)
    found = []

    def walk_panels(panels):
        for panel in panels or []:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append(Expr(path, f'panel "{panel.get("title")}" {target.get("refId", "")}',
                                      target["expr"]))
            walk_panels(panel.get("panels"))  # rows

    walk_panels(dashboard.get("panels"))
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and query:
            found.append(Expr(path, f'variable "{variable.get("name")}"', query))
    return found


def rule_exprs(path):
    """The `expr:` values of a Prometheus rules file: plain or quoted scalars and | / > blocks.

    A small reader for the subset of YAML rule files use, since the standard library has no YAML.
    """
    with open(path) as f:
        lines = f.read().splitlines()
    found = []
    name = "?"
    i = 0
    while i < len(lines):
        line = lines[i]
        named = re.match(r"^\s*(?:-\s+)?(alert|record):\s*(.+?)\s*$", line)
        if named:
            name = f"{named.group(1)} {named.group(2)}"
        m = re.match(r"^(\s*)(?:-\s+)?expr:\s*(.*?)\s*$", line)
        i += 1
        if not m:
            continue
        indent, value = len(m.group(1)), m.group(2)
        if value[:1] in ("|", ">"):
            block = []
            while i < len(lines) and (not lines[i].strip() or
                                      len(lines[i]) - len(lines[i].lstrip()) > indent):
                block.append(lines[i])
                i += 1
            width = min((len(l) - len(l.lstrip()) for l in block if l.strip()), default=0)
            joiner = "\n" if value[0] == "|" else " "
            value = joiner.join(l[width:] for l in block).strip()
        elif value[:1] in ("'", '"'):
            value = value[1:-1]
            if m.group(2)[0] == "'":
                value = value.replace("''", "'")
        found.append(Expr(path, name, value))
    return found


def substitute(text, rate_interval):
    """Replaces Grafana's variables with values Prometheus accepts."""
    builtins = {
        "__rate_interval": rate_interval, "__interval": rate_interval, "__range": "1h",
        "__range_s": "3600", "__range_ms": "3600000", "__interval_ms": "15000",
    }

    def replace(match):
        var = match.group(1) or match.group(2) or match.group(3)
        return builtins.get(var, ".*")  # dashboard variables are used with =~ and allValue .*

    text = re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", replace, text)
    # label_values(selector, label) and friends are Grafana functions: check their selector.
    m = re.match(r"^\s*(?:label_values|query_result)\((.*?)(?:,\s*\w+)?\)\s*$", text, re.S)
    if m:
        text = m.group(1)
    return text


def without_threshold(text):
    """`expr > 0.2` -> `expr`, so a rule's expression can be checked for data."""
    m = re.match(r"^(.*?)\s*(?:>=|<=|==|!=|>|<)\s*-?[0-9.]+(?:e[+-]?\d+)?\s*$", text, re.S | re.I)
    return m.group(1) if m else text


def metric_names(text):
    return set(re.findall(r"\bstoker_[a-z0-9_]+\b", text))


def known_metrics(files):
    names = set()
    for path in files:
        with open(path) as f:
            names |= set(re.findall(r'"(stoker_[a-z0-9_]+)"', f.read()))
    return names


def unknown_metrics(expr, exported):
    unknown = []
    for name in sorted(metric_names(expr.text)):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in exported and base not in exported:
            unknown.append(name)
    return unknown


def query(url, promql):
    """Returns (error or None, number of series/samples in the result)."""
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(full, timeout=30) as response:
            body = json.load(response)
    except urllib.error.HTTPError as e:
        try:
            body = json.load(e)
        except ValueError:
            return f"HTTP {e.code}", 0
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"cannot query {url}: {e}", 0
    if body.get("status") != "success":
        return f'{body.get("errorType")}: {body.get("error")}', 0
    data = body["data"]
    if data["resultType"] in ("vector", "matrix"):
        return None, len(data["result"])
    return None, 1  # scalar or string


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prometheus", help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--dashboard", action="append", help="dashboard JSON (repeatable)")
    parser.add_argument("--rules", action="append", help="alert rules file (repeatable)")
    parser.add_argument("--require-data", action="store_true",
                        help="fail on expressions with an empty result")
    parser.add_argument("--allow-empty", action="append", default=[], metavar="REGEX",
                        help="with --require-data, expressions matching REGEX may be empty")
    parser.add_argument("--rate-interval", default="1m", help="value of $__rate_interval")
    parser.add_argument("--known-metrics", nargs="+", metavar="SOURCE",
                        help="fail on stoker_* names not exported as string literals in SOURCE")
    parser.add_argument("--list", action="store_true", help="print the expressions")
    args = parser.parse_args()

    exprs = []
    for path in args.dashboard or DEFAULT_DASHBOARDS:
        exprs += dashboard_exprs(path)
    for path in args.rules or DEFAULT_RULES:
        exprs += rule_exprs(path)
    if not exprs:
        print("promql_check: no expressions found", file=sys.stderr)
        return 1

    failures = []
    if args.known_metrics:
        exported = known_metrics(args.known_metrics)
        for expr in exprs:
            for name in unknown_metrics(expr, exported):
                failures.append(f"{expr.where()}: {name} is not exported by {args.known_metrics}")

    for expr in exprs:
        promql = substitute(expr.text, args.rate_interval)
        if args.list:
            print(f"# {expr.where()}\n{promql}\n")
        if not args.prometheus:
            continue
        error, count = query(args.prometheus, promql)
        if error:
            failures.append(f"{expr.where()}: {error}\n    {promql}")
            continue
        if not args.require_data or any(re.search(r, expr.text) for r in args.allow_empty):
            status = f"{count} series"
        else:
            checked = without_threshold(promql)
            error, count = query(args.prometheus, checked) if checked != promql else (None, count)
            if error or count == 0:
                failures.append(f"{expr.where()}: {error or 'empty result'}\n    {checked}")
                continue
            status = f"{count} series"
        print(f"ok   {expr.where()} ({status})")

    mode = "evaluated" if args.prometheus else "read"
    print(f"promql_check: {len(exprs)} expressions {mode}, {len(failures)} problems")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
