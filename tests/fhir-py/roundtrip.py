"""Two Python FHIR clients nobody at carehub wrote against a live node: fhirpy (Beda Software)
and fhirclient (SMART on FHIR). Each creates a Patient and an Observation, reads them, searches
with paging and follows the next links over several pages, creates conditionally (fhirpy's
get_or_create: the query string on POST [type]) and posts a batch and a transaction Bundle to the
base as these clients do (POST [base]/, a trailing slash). Every response the node gives, whatever
the client, is parsed with an R4 model library: fhir.resources 6.4.0, FHIR 4.0.1.

    python roundtrip.py BASE_URL API_KEY RUN_TAG

Prints one line per check, "PASS name" or "FAIL name: detail", then "N passed, N failed";
exits 1 on any failure. api/fhir's TestPythonClients runs it (tests/fhir-py, make fhir-py-deps).
"""

import json
import sys
import time
import traceback
import uuid

import fhir.resources
import requests
from fhir.resources import construct_fhir_element
from fhirclient import server as smart_server
from fhirclient.models import bundle as smart_bundle
from fhirclient.models import observation as smart_observation
from fhirclient.models import patient as smart_patient
from fhirclient.server import FHIRNotFoundException
from fhirpy import SyncFHIRClient
from fhirpy.base.exceptions import ResourceNotFound

# Every HTTP response either client receives (both send through requests.Session.send).
RESPONSES = []
_send = requests.Session.send


def _recording_send(self, request, **kwargs):
    response = _send(self, request, **kwargs)
    RESPONSES.append((request.method, request.url, response.status_code, response.content))
    return response


requests.Session.send = _recording_send


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def step(self, name, fn):
        """Runs one step; an exception the client raises is that step's failure, and the run goes
        on with the next."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a client's exception is the finding
            where = traceback.extract_tb(e.__traceback__)[-1]
            self.check(f"{name}: ran", False, f"{type(e).__name__}: {' '.join(str(e).split())[:1500]} (at {where.filename}:{where.lineno}; {last_exchange()})")
            return None

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"PASS {name}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}", flush=True)
        return ok


def last_exchange():
    """The last request and its answer's status, for a failure's detail."""
    if not RESPONSES:
        return "no request sent"
    method, url, status, _ = RESPONSES[-1]
    return f"last: {method} {url} -> {status}"


def patient(family, mrn):
    return {
        "resourceType": "Patient",
        "name": [{"family": family, "given": ["Ada"]}],
        "gender": "female",
        "birthDate": "1961-04-12",
        "identifier": [{"system": "urn:carehub-test:mrn", "value": mrn}],
    }


def heart_rate(subject, value):
    return {
        "resourceType": "Observation",
        "status": "final",
        "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category", "code": "vital-signs"}]}],
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}]},
        "subject": {"reference": subject},
        "effectiveDateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "valueQuantity": {"value": value, "unit": "beats/minute", "system": "http://unitsofmeasure.org", "code": "/min"},
    }


def eventually(fn, timeout=30.0):
    """Polls fn until it returns a truthy value: carehub acknowledges an Observation once its log
    holds it, before a search sees it."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def not_found_is_none(read):
    """read(), or None where the client raised for a 404 (fhirpy's ResourceNotFound, fhirclient's
    FHIRNotFoundException)."""
    try:
        return read()
    except (ResourceNotFound, FHIRNotFoundException):
        return None


def bundle_entries(kind, tag):
    """A Bundle of a Patient and its Observation, the Observation referring to the Patient by
    its urn:uuid (resolved in a transaction; in a batch the Observation names a stored one)."""
    full = f"urn:uuid:{uuid.uuid4()}"
    return full, {
        "resourceType": "Bundle",
        "type": kind,
        "entry": [
            {"fullUrl": full, "resource": patient(f"{kind.capitalize()}{tag}", f"{kind}-{tag}"), "request": {"method": "POST", "url": "Patient"}},
            {"resource": heart_rate(full, 74), "request": {"method": "POST", "url": "Observation"}},
        ],
    }


def run_fhirpy(c, base, key, tag):
    client = SyncFHIRClient(base, authorization=f"Bearer {key}")

    # create, read
    p = client.resource("Patient", **{k: v for k, v in patient(f"Py{tag}", f"py-{tag}").items() if k != "resourceType"})
    p.save()
    c.check("fhirpy: create Patient", bool(p.id) and p["meta"]["versionId"] == "1", p.serialize())
    got = client.reference("Patient", p.id).to_resource()
    c.check("fhirpy: read Patient", got["name"][0]["family"] == f"Py{tag}", got.serialize())
    o = client.resource("Observation", **{k: v for k, v in heart_rate(f"Patient/{p.id}", 72).items() if k != "resourceType"})
    o.save()
    c.check("fhirpy: create Observation", bool(o.id), o.serialize())
    # carehub acknowledges an Observation once its log holds it: a read may 404 for a moment.
    t0 = time.monotonic()
    obs = eventually(lambda: not_found_is_none(lambda: client.reference("Observation", o.id).to_resource()))
    c.check(f"fhirpy: read Observation (readable after {(time.monotonic() - t0) * 1000:.0f} ms)", obs is not None and obs["valueQuantity"]["value"] == 72 and obs["subject"]["reference"] == f"Patient/{p.id}",
            obs.serialize() if obs else None)

    # search with paging: 7 patients, 3 a page, the client follows the next links
    for i in range(7):
        client.resource("Patient", **{k: v for k, v in patient(f"PyPaged{tag}", f"py-paged-{i}-{tag}").items() if k != "resourceType"}).save()
    before = len(RESPONSES)
    found = client.resources("Patient").search(family=f"PyPaged{tag}").limit(3).fetch_all()
    pages = len(RESPONSES) - before
    ids = [r.id for r in found]
    c.check("fhirpy: search follows next links over 3 pages", len(ids) == 7 and len(set(ids)) == 7 and pages == 3,
            f"{len(ids)} resources ({len(set(ids))} distinct) in {pages} pages")
    total = c.step("fhirpy: count", lambda: client.resources("Patient").search(family=f"PyPaged{tag}").count())
    if total is not None:
        c.check("fhirpy: count (_count=0&_totalMethod=count)", total == 7, str(total))
    seen = eventually(lambda: client.resources("Observation").search(patient=p.id, code="http://loinc.org|8867-4").fetch())
    c.check("fhirpy: search Observation by patient and code", len(seen) == 1 and seen[0].id == o.id, str([r.id for r in seen]))

    c.step("fhirpy: get_or_create", lambda: fhirpy_get_or_create(c, client, p, tag))
    for kind in ("batch", "transaction"):
        c.step(f"fhirpy: {kind}", lambda kind=kind: post_bundle(
            c, "fhirpy", lambda b: client.execute("", method="post", data=b),
            lambda pat, oid: [dict(r) for r in client.resources("Observation").search(patient=pat, _id=oid).fetch()], kind, p.id, tag))


def fhirpy_get_or_create(c, client, p, tag):
    # conditional create by query string: POST Patient?identifier=... finds the patient
    again, created = client.resources("Patient").search(identifier=f"urn:carehub-test:mrn|py-{tag}").get_or_create(
        client.resource("Patient", **{k: v for k, v in patient(f"PyOther{tag}", f"py-{tag}").items() if k != "resourceType"}))
    c.check("fhirpy: get_or_create finds the existing patient", not created and again.id == p.id,
            f"created={created} id={again.id}, the existing one {p.id} ({last_exchange()})")
    fresh, created = client.resources("Patient").search(identifier=f"urn:carehub-test:mrn|py-new-{tag}").get_or_create(
        client.resource("Patient", **{k: v for k, v in patient(f"PyNew{tag}", f"py-new-{tag}").items() if k != "resourceType"}))
    c.check("fhirpy: get_or_create creates a missing patient", created and fresh.id and fresh.id != p.id, f"created={created} id={fresh.id}")
    dupes = client.resources("Patient").search(identifier=f"urn:carehub-test:mrn|py-{tag}").fetch_all()
    c.check("fhirpy: get_or_create made no duplicate", len(dupes) == 1, str([r.id for r in dupes]))


def run_fhirclient(c, base, key, tag):
    srv = smart_server.FHIRServer(None, base_uri=base)
    srv.session.headers["Authorization"] = f"Bearer {key}"

    # create, read
    ret = smart_patient.Patient(patient(f"Smart{tag}", f"smart-{tag}")).create(srv)
    pid = (ret or {}).get("id")
    c.check("fhirclient: create Patient", bool(pid), json.dumps(ret))
    p = smart_patient.Patient.read(pid, srv)
    c.check("fhirclient: read Patient", p.name[0].family == f"Smart{tag}", json.dumps(p.as_json()))
    ret = smart_observation.Observation(heart_rate(f"Patient/{pid}", 81)).create(srv)
    oid = (ret or {}).get("id")
    c.check("fhirclient: create Observation", bool(oid), json.dumps(ret))
    t0 = time.monotonic()
    o = eventually(lambda: not_found_is_none(lambda: smart_observation.Observation.read(oid, srv)))
    c.check(f"fhirclient: read Observation (readable after {(time.monotonic() - t0) * 1000:.0f} ms)", o is not None and float(o.valueQuantity.value) == 81 and o.subject.reference == f"Patient/{pid}",
            json.dumps(o.as_json() if o else None))

    c.step("fhirclient: search", lambda: fhirclient_search(c, srv, tag))
    for kind in ("batch", "transaction"):
        c.step(f"fhirclient: {kind}", lambda kind=kind: post_bundle(
            c, "fhirclient", lambda b: srv.post_json("", b).json(),
            lambda pat, oid: [r.as_json() for r in smart_observation.Observation.where(struct={"patient": pat, "_id": oid}).perform_resources_iter(srv)],
            kind, pid, tag))


def fhirclient_search(c, srv, tag):
    # search with paging over several pages
    for i in range(5):
        smart_patient.Patient(patient(f"SmartPaged{tag}", f"smart-paged-{i}-{tag}")).create(srv)
    pages = list(smart_patient.Patient.where(struct={"family": f"SmartPaged{tag}", "_count": "2"}).perform_iter(srv))
    ids = [e.resource.id for b in pages for e in (b.entry or [])]
    c.check("fhirclient: search follows next links over 3 pages", len(pages) == 3 and len(ids) == 5 and len(set(ids)) == 5,
            f"{len(ids)} resources ({len(set(ids))} distinct) in {len(pages)} pages")


def post_bundle(c, client, post, search, kind, stored_patient, tag):
    """Posts a batch or transaction of a Patient and an Observation to the base with the client's
    own call; in a transaction the Observation names the new Patient by its urn:uuid, in a batch
    the stored one. Then the Observation is searched for by its patient."""
    _, bundle = bundle_entries(kind, f"{client}{tag}")
    if kind == "batch":
        bundle["entry"][1]["resource"]["subject"]["reference"] = f"Patient/{stored_patient}"
    res = post(bundle)
    entries = res.get("entry", [])
    statuses = [e.get("response", {}).get("status", "") for e in entries]
    ok = res.get("type") == f"{kind}-response" and len(statuses) == 2 and all(s.startswith("201") for s in statuses)
    c.check(f"{client}: {kind} Bundle posted to the base", ok, json.dumps(res)[:800])
    if not ok:
        return
    subject = stored_patient if kind == "batch" else entries[0]["response"]["location"].split("/_history")[0].split("/")[-1]
    obs = entries[1]["response"]["location"].split("/_history")[0].split("/")[-1]
    found = eventually(lambda: search(subject, obs))
    c.check(f"{client}: the {kind}'s Observation is stored for {'the stored' if kind == 'batch' else 'its new'} Patient",
            len(found) == 1 and found[0]["subject"]["reference"] == f"Patient/{subject}", json.dumps(found)[:600])


def parse_all(c):
    """Every response body, of both clients, parsed as an R4 resource by fhir.resources."""
    bad = []
    parsed = 0
    for method, url, status, content in RESPONSES:
        try:
            doc = json.loads(content)
            construct_fhir_element(doc["resourceType"], doc)
            parsed += 1
        except Exception as e:  # noqa: BLE001 - any failure to parse is the finding
            bad.append(f"{method} {url} -> {status}: {type(e).__name__}: {str(e)[:400]} body {content[:200]!r}")
    c.check(f"every response parses as FHIR {fhir.resources.__fhir_version__} (fhir.resources {fhir.resources.__version__}): {parsed} of {len(RESPONSES)}",
            not bad and parsed > 0, "\n  ".join(bad))


def main():
    base, key, tag = sys.argv[1], sys.argv[2], sys.argv[3]
    c = Checks()
    c.step("fhirpy", lambda: run_fhirpy(c, base, key, tag))
    c.step("fhirclient", lambda: run_fhirclient(c, base, key, tag))
    parse_all(c)
    print(f"{c.passed} passed, {c.failed} failed")
    sys.exit(0 if c.failed == 0 else 1)


if __name__ == "__main__":
    main()
