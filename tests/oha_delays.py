"""Reads the per-request records `oha --latency-correction --db-url FILE` stores (SQLite, table
`oha`: `start_latency_correction` when a request was due, `start` when oha sent it, `end` when the
answer was read, seconds) and prints one JSON line with the nearest-rank percentiles, in seconds,
of three delays per request:

* `fromSend`: end - start, what the server and the network took;
* `corrected`: end - start_latency_correction, what a client sending on schedule would see;
* `sendDelay`: start - start_latency_correction, how late oha itself sent.

    python oha_delays.py FILE
"""

import json
import math
import sqlite3
import sys


def percentiles(values):
    values.sort()
    if not values:
        return {}

    def rank(p):
        i = min(max(math.ceil(p * len(values)), 1), len(values))
        return values[i - 1]

    return {"p50": rank(0.5), "p99": rank(0.99), "p99.9": rank(0.999), "max": values[-1]}


def main():
    path = sys.argv[1]
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = db.execute("SELECT start_latency_correction, start, end FROM oha").fetchall()
    except sqlite3.Error as err:
        sys.exit(f"{path}: {err}")
    if not rows:
        sys.exit(f"{path}: no requests recorded")
    print(
        json.dumps(
            {
                "requests": len(rows),
                "fromSend": percentiles([end - start for _, start, end in rows]),
                "corrected": percentiles([end - due for due, _, end in rows]),
                "sendDelay": percentiles([start - due for due, start, _ in rows]),
            }
        )
    )


if __name__ == "__main__":
    main()
