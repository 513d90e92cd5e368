"""How much of the bad-manifest corpus (``tests/api/corpus.py``) admission refuses.

For each category of the corpus (the review's examples, types, units, bombs, injections,
traversal, bounds, enums, cross-field rules) prints how many manifests the generated CRD's
schema alone refuses, the schema plus its CEL rules (evaluated with cel-python, as the API
server would), and ``chunktune validate``; and how many of those name the field the manifest
broke. Also times ``validate`` per manifest. Run from the repository root::

    PYTHONPATH=operator python bench/admission.py
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.api.admission import _schema as crd_schema
from tests.api.admission import cel_errors, names, schema_errors
from tests.api.corpus import CORPUS

from chunktune.api.reader import validate


def main() -> int:
    rows: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
    seconds = 0.0
    for bad in CORPUS:
        m = bad.manifest()
        schema = schema_errors(m)
        cel = cel_errors(crd_schema(), m)
        t0 = time.perf_counter()
        problems = validate(m)
        seconds += time.perf_counter() - t0
        row = rows[bad.id.split("-", 1)[0]]
        row[0] += 1
        row[1] += bool(schema)
        row[2] += bool(schema or cel)
        row[3] += any(names(p, bad.field) for p, _ in schema + cel)
        row[4] += bool(problems)
        row[5] += any(names(p, bad.field) for p, _ in problems)
    total = [sum(r[i] for r in rows.values()) for i in range(6)]
    head = f"{'category':<10} {'n':>4} {'schema':>7} {'+CEL':>6} {'on field':>9} " \
           f"{'validate':>9} {'on field':>9}"
    print(head)
    print("-" * len(head))
    for name, r in [*sorted(rows.items()), ("total", total)]:
        print(f"{name:<10} {r[0]:>4} {r[1]:>7} {r[2]:>6} {r[3]:>9} {r[4]:>9} {r[5]:>9}")
    n = total[0]
    print(f"\nCRD (schema + CEL) refuses {total[2]}/{n} = {total[2] / n:.1%}; "
          f"chunktune validate refuses {total[4]}/{n} = {total[4] / n:.1%} "
          f"({total[5]} naming the field); validate takes {seconds / n * 1000:.1f} ms per "
          f"manifest")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
