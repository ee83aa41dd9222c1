"""Schemathesis hooks for tests/openapi_contract.rs.

The OpenAPI document states every rule of the request bodies but one, which JSON Schema cannot
state: a pod's container names are unique (containers and init containers together, as the API
server requires; an unnamed container is named container-<index>, init-container-<index> in a
v1.Pod). Generated bodies that break it are not sent: the agent refuses them with a 400 naming
the field, which its own tests check. And `GET /v1/hugepages?watch=true` is not generated: its
answer is a stream (the test's agent ends each after a second or two, so the few schemathesis's
coverage phase sends, which no hook filters, are checked for their status and content type); the
agent's own tests (agent/src/api/tests/watch.rs, tests/watch.rs) read the stream. Nothing else is
filtered, and no failure is ever dropped.
"""

import schemathesis


def _names(containers, unnamed):
    if not isinstance(containers, list):
        return []
    return [
        (c.get("name") or f"{unnamed}-{i}") if isinstance(c, dict) else None
        for i, c in enumerate(containers)
    ]


def _container_names(body):
    if not isinstance(body, dict):
        return []
    spec = body.get("spec")
    if "spec" not in body:
        return _names(body.get("containers"), "container")
    if not isinstance(spec, dict):
        return []
    return _names(spec.get("initContainers"), "init-container") + _names(
        spec.get("containers"), "container"
    )


@schemathesis.hook
def filter_body(context, body):
    names = [n for n in _container_names(body) if isinstance(n, str)]
    return len(names) == len(set(names))


@schemathesis.hook
def filter_query(context, query):
    if not isinstance(query, dict):
        return True
    return str(query.get("watch")).lower() not in ("true", "1")
