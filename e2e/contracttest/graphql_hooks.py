"""Schemathesis hooks of TestGraphQLFuzz (loaded through graphql.toml)."""

import json

import graphql
from hypothesis import strategies as st

import schemathesis
from schemathesis.graphql import nodes


def _field(name, value):
    return graphql.ObjectFieldNode(name=graphql.NameNode(value=name), value=value)


# JSON (input, config, payload arguments): any JSON value, written as a GraphQL literal. Strings
# hold no U+0000 (refused everywhere, as in REST) and numbers are finite doubles, what a JSON
# document can hold and every store takes.
_json_scalar = st.one_of(
    st.booleans().map(nodes.Boolean),
    st.integers(min_value=-(2**53), max_value=2**53).map(nodes.Int),
    st.floats(allow_nan=False, allow_infinity=False).map(nodes.Float),
    st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"])).map(nodes.String),
)
# A null is written by the generator itself where the argument is nullable (JSON, not JSON!): the
# strategy draws it only inside lists and objects.
_json_containers = st.recursive(st.one_of(_json_scalar, st.just(nodes.Null)), lambda inner: st.one_of(
    st.lists(inner, max_size=4).map(nodes.List),
    st.dictionaries(st.from_regex(r"\A[_A-Za-z][_0-9A-Za-z]{0,15}\Z"), inner, max_size=4).map(
        lambda d: nodes.Object([_field(k, v) for k, v in d.items()])),
), max_leaves=8)
schemathesis.graphql.scalar("JSON", st.one_of(_json_scalar, _json_containers.filter(lambda n: n is not nodes.Null)))


# Answers about the request's target rather than failures of the server: the GraphQL forms of
# REST's 404, 403, 409 and 429, which Schemathesis counts as server errors because they carry a
# path (they come from a resolver). INTERNAL, and an error without a code, remain failures.
_ANSWERS = {"NOT_FOUND", "FORBIDDEN", "CONFLICT", "RATE_LIMITED", "UNAUTHENTICATED", "UNAVAILABLE"}


def _errors(response):
    try:
        errors = json.loads(response.content).get("errors") or []
    except (ValueError, AttributeError):
        return None
    if not all(isinstance(e, dict) and isinstance(e.get("extensions"), dict) for e in errors):
        return None
    return errors


def _code(error):
    return error["extensions"].get("code")


def _refused_by_rule(error):
    """A refusal of a value that GraphQL's type system allows but a rule stated in the schema's
    descriptions does not. The GraphQL schema language has types and nullability only: a limit's
    range (limit: 1 to 100), a name's length, an environment's pattern, a URL's scheme are
    written in descriptions, and a resolver's refusal of a value outside them is BAD_USER_INPUT
    with a path and the fields at fault (the GraphQL form of REST's 422 VALIDATION_FAILED).
    Refusals before execution (no path) are the query budget's: the cost, depth and document
    limits of docs/LIMITS.md, which no schema can express either. A query the schema itself does
    not admit would be a validation error without extensions.cost and stays a failure."""
    if _code(error) != "BAD_USER_INPUT":
        return False
    if error.get("path"):
        return True
    ext = error["extensions"]
    return "cost" in ext or "maxDepth" in ext or "depth" in error.get("message", "")


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """Keep every failure but GraphQL errors that are answers (_ANSWERS) or refusals of values by
    a rule the schema's descriptions state (_refused_by_rule)."""
    if failure.code not in ("ST113", "ST206"):
        return True
    errors = _errors(response)
    if not errors:
        return True
    return not all(_code(e) in _ANSWERS or _refused_by_rule(e) for e in errors)
