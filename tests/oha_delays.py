"""Reads the per-request records `oha --latency-correction --db-url FILE` stores (SQLite, table
`oha`: `start_latency_correction` when a request was due, `start` when oha sent it, `end` when the
answer was read, seconds) and prints one JSON line with the nearest-rank percentiles, in seconds,
of these delays per request:

* `fromSend`: end - start, what the server and the network took;
* `corrected`: end - start_latency_correction, what a client sending on schedule would see;
* `sendDelay`: start - start_latency_correction, how late the request was sent, which is
* `connectionWait`: the part of it during which every one of the CONNECTIONS connections had a
  request in flight (oha sends a connection's next request only when its answer is in: waiting
  for the server), plus
* `ohaDelay`: the rest, when a connection was free and oha had not sent yet (the load tool's
  own lateness: its threads did not run).

    python oha_delays.py FILE CONNECTIONS
"""

import bisect
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


def busy_intervals(rows, connections):
    """The intervals during which `connections` requests or more were in flight."""
    events = sorted(
        [(end, -1) for _, _, end in rows] + [(start, 1) for _, start, _ in rows]
    )
    intervals, in_flight, began = [], 0, None
    for time, step in events:
        in_flight += step
        if in_flight >= connections and began is None:
            began = time
        elif in_flight < connections and began is not None:
            intervals.append((began, time))
            began = None
    if began is not None:
        intervals.append((began, math.inf))
    return intervals


def connection_wait(due, sent, intervals, starts):
    """How long after `due` (and before `sent`) every connection was busy."""
    i = bisect.bisect_right(starts, due) - 1
    if i < 0 or intervals[i][1] <= due:
        return 0.0
    return max(0.0, min(intervals[i][1], sent) - due)


def main():
    if len(sys.argv) != 3 or not sys.argv[2].isdigit() or int(sys.argv[2]) < 1:
        sys.exit("usage: oha_delays.py FILE CONNECTIONS")
    path, connections = sys.argv[1], int(sys.argv[2])
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = db.execute("SELECT start_latency_correction, start, end FROM oha").fetchall()
    except sqlite3.Error as err:
        sys.exit(f"{path}: {err}")
    if not rows:
        sys.exit(f"{path}: no requests recorded")
    intervals = busy_intervals(rows, connections)
    starts = [a for a, _ in intervals]
    waits = [connection_wait(due, sent, intervals, starts) for due, sent, _ in rows]
    print(
        json.dumps(
            {
                "requests": len(rows),
                "fromSend": percentiles([end - start for _, start, end in rows]),
                "corrected": percentiles([end - due for due, _, end in rows]),
                "sendDelay": percentiles([start - due for due, start, _ in rows]),
                "connectionWait": percentiles(list(waits)),
                "ohaDelay": percentiles(
                    [max(0.0, start - due - w) for (due, start, _), w in zip(rows, waits)]
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
