#!/usr/bin/env python3
"""Parse a Prometheus text-format page (stdin) with the reference parser
(prometheus_client.parser, Debian's python3-prometheus-client) and print
what it found as JSON: {"families": {name: {"type": t, "help": h}},
"samples": [[name, {label: value}, value], ...]}. A page the parser rejects
makes it exit 1 with the parser's message on stderr."""
import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    text = sys.stdin.read()
    families, samples = {}, []
    try:
        for fam in text_string_to_metric_families(text):
            families[fam.name] = {"type": fam.type, "help": fam.documentation}
            for s in fam.samples:
                v = s.value
                samples.append([s.name, dict(s.labels), v if math.isfinite(v) else str(v)])
    except Exception as e:  # the parser's error is the test's failure message
        print("parse_metrics: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        return 1
    json.dump({"families": families, "samples": samples}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
