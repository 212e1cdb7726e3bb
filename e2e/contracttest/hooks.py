"""Schemathesis hooks of TestOpenAPIFuzz (loaded through schemathesis.toml)."""

import json
import zoneinfo
from datetime import datetime, timezone

import schemathesis


def _error(response):
    """The error envelope's {code, message, details}, or None."""
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    return error if isinstance(error, dict) else None


def _time(value):
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None


def _opaque_cursor(case, response, error):
    """A cursor is opaque: only the meta.cursor of an earlier page of the same listing is valid,
    and any other string is 400 INVALID_REQUEST (DECISIONS §3). The document states the cursor's
    alphabet, but no JSON Schema can say which strings a listing issued, so the fuzzer draws
    cursors the document allows (or takes one from another listing's answer) that the server
    cannot accept."""
    return (response.status_code == 400 and "cursor" in (case.query or {})
            and error["message"].startswith("invalid cursor"))


# The operations that take a time range: from (or since, its synonym, DECISIONS §8) to to.
_RANGES = {"/v1/events", "/v1/events/export", "/v1/events/stats", "/v1/audit", "/v1/audit/export"}


def _start(case):
    """The range's start as sent: from, else since."""
    query = case.query or {}
    return _time(query.get("from")) or _time(query.get("since"))


def _inverted(case):
    """Whether the range the fuzzer sent ends at or before its start; without an end it ends now."""
    start, end = _start(case), _time((case.query or {}).get("to"))
    if end is None and "to" not in (case.query or {}):
        end = datetime.now(timezone.utc)
    return start is not None and end is not None and end <= start


def _synonyms_disagree(case, response, error):
    """from and since name one thing (DECISIONS §8); the document states each, and no schema can
    say that both given must be equal: two different times are 400 naming the rule."""
    query = case.query or {}
    return (response.status_code == 400 and case.operation.path in _RANGES
            and "since is a synonym of from" in error["message"]
            and _time(query.get("from")) != _time(query.get("since")))


def _cross_parameter(case, response, error):
    """Rules between query parameters, which JSON Schema cannot state of each one, each 422
    naming the parameter; only an answer whose every field is one of them, really broken by the
    values the fuzzer sent, is excused:
    - to before the range's start (for statistics, not after it);
    - statistics: top with bucket (top ranks totals over the whole range, not per bucket);
    - statistics: more than 10080 buckets, which depends on from, to (now when absent) and
      bucket together, and on the clock;
    - statistics: a timeZone of the IANA shape the document states that the zone database does
      not hold (which names it holds is data, not a pattern; Python's copy of it is the evidence)."""
    fields = (error.get("details") or {}).get("fields") or {}
    if response.status_code != 422 or case.operation.path not in _RANGES or not fields:
        return False
    query = case.query or {}
    stats = case.operation.path == "/v1/events/stats"
    excused = {
        "to": _inverted(case),
        "top": stats and "top" in query and "bucket" in query,
        "bucket": stats and "buckets over this range" in str(fields.get("bucket")),
        "timeZone": stats and query.get("timeZone") not in zoneinfo.available_timezones(),
    }
    return all(excused.get(name, False) for name in fields)


def _observation_profile(case, response, error):
    """Observations are taken entry by entry: each is validated against carehub's vital-sign
    profile of FHIR Observation (a LOINC code it knows, a unit of that code, a plausible value,
    a subject, an effective time at most an hour ahead of the server's clock) and a refused one
    is listed in details.rejected, with 422 when none was taken. The document states the body's
    shape and the Bundle's (type, entry); the profile is FHIR's own, in FHIR's language, not in
    this document's JSON Schema."""
    rejected = (error.get("details") or {}).get("rejected")
    return (response.status_code == 422 and case.operation.path == "/v1/observations"
            and isinstance(rejected, list) and len(rejected) > 0)


def _runtime_refusal(case, response, error):
    """Which vital signs an invocation needs depends on the runtime of the deployment it names
    (NEWS2 scores other signs than qSOFA), which is state on the server, not in the request: the
    document lists the signs and their plausible ranges, and the runtime's refusal of a complete
    and plausible-looking set it cannot score is 422 naming vitals."""
    fields = (error.get("details") or {}).get("fields") or {}
    return (response.status_code == 422 and case.operation.path == "/v1/deployments/{id}/invoke"
            and error["message"] == "the runtime could not score this input" and set(fields) == {"vitals"})


def _model_refusal(case, response, error):
    """Whether a file is a model carehub can serve is ONNX Runtime's judgement of its bytes (a
    protobuf it can load, float32 tensors), which no schema of a binary body can state: bytes it
    cannot load are 422 naming model. A model named by URL is as the host that URL names allows:
    an address carehub may reach (the webhook rule, applied to what the name resolves to) that
    serves the file; otherwise 422 naming url."""
    fields = (error.get("details") or {}).get("fields") or {}
    return (response.status_code == 422 and case.operation.path == "/v1/assets/{id}/model"
            and set(fields) in ({"model"}, {"url"}))


_EXCUSED = (_opaque_cursor, _cross_parameter, _synonyms_disagree, _observation_profile, _runtime_refusal, _model_refusal)


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """Keep every failure but a positive-acceptance one (ST202) that is one of the refusals
    above: each is a rule the document states in words because no schema can."""
    if failure.code != "ST202":
        return True
    error = _error(response)
    if error is None or not isinstance(error.get("message"), str):
        return True
    return not any(excused(case, response, error) for excused in _EXCUSED)
