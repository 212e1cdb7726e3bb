"""Schemathesis hooks of TestOpenAPIFuzz (loaded through schemathesis.toml)."""

import json

import schemathesis


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """Keep every failure but the refusal of a cursor this listing never issued.

    A cursor is opaque: only the meta.cursor of an earlier page of the same listing is valid, and
    any other string is 400 INVALID_REQUEST (DECISIONS §3). No JSON Schema can say which strings a
    listing issued, so the fuzzer draws cursors the document allows (or takes one from another
    listing's answer) that the server cannot accept. That refusal is the contract, not a failure.
    """
    if failure.code != "ST202" or response.status_code != 400 or "cursor" not in (case.query or {}):
        return True
    try:
        message = json.loads(response.content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return True
    return not message.startswith("invalid cursor")
