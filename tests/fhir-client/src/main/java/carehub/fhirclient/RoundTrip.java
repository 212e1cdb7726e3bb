package carehub.fhirclient;

import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.context.support.DefaultProfileValidationSupport;
import ca.uhn.fhir.rest.api.EncodingEnum;
import ca.uhn.fhir.rest.api.MethodOutcome;
import ca.uhn.fhir.rest.client.api.IGenericClient;
import ca.uhn.fhir.rest.client.interceptor.BearerTokenAuthInterceptor;
import ca.uhn.fhir.rest.server.exceptions.BaseServerResponseException;
import ca.uhn.fhir.validation.FhirValidator;
import ca.uhn.fhir.validation.ResultSeverityEnum;
import ca.uhn.fhir.validation.SingleValidationMessage;
import ca.uhn.fhir.validation.ValidationResult;
import java.util.ArrayList;
import java.util.Date;
import java.util.List;
import org.hl7.fhir.common.hapi.validation.support.CommonCodeSystemsTerminologyService;
import org.hl7.fhir.common.hapi.validation.support.InMemoryTerminologyServerValidationSupport;
import org.hl7.fhir.common.hapi.validation.support.SnapshotGeneratingValidationSupport;
import org.hl7.fhir.common.hapi.validation.support.ValidationSupportChain;
import org.hl7.fhir.common.hapi.validation.validator.FhirInstanceValidator;
import org.hl7.fhir.instance.model.api.IBaseResource;
import org.hl7.fhir.r4.model.Bundle;
import org.hl7.fhir.r4.model.CapabilityStatement;
import org.hl7.fhir.r4.model.CodeableConcept;
import org.hl7.fhir.r4.model.Coding;
import org.hl7.fhir.r4.model.Enumerations;
import org.hl7.fhir.r4.model.IdType;
import org.hl7.fhir.r4.model.Observation;
import org.hl7.fhir.r4.model.OperationOutcome;
import org.hl7.fhir.r4.model.Patient;
import org.hl7.fhir.r4.model.Quantity;
import org.hl7.fhir.r4.model.Reference;
import org.hl7.fhir.r4.model.RiskAssessment;

/**
 * HAPI FHIR's generic client against a live carehub node: create, read, search with paging,
 * conditional create and transactions; every resource the node answers is validated against the
 * R4 StructureDefinitions by HAPI's FhirInstanceValidator. Arguments: base URL, API key, a run
 * tag, and optionally a patient id with a RiskAssessment to read. Prints one line per check and
 * "N passed, N failed"; exits 1 on any failure.
 */
public final class RoundTrip {
  private final FhirContext ctx = FhirContext.forR4();
  private final IGenericClient client;
  private final FhirValidator validator;
  private int passed, failed;

  private RoundTrip(String base, String key) {
    ctx.getRestfulClientFactory().setSocketTimeout(60_000);
    client = ctx.newRestfulGenericClient(base);
    client.setEncoding(EncodingEnum.JSON);
    client.registerInterceptor(new BearerTokenAuthInterceptor(key));
    ValidationSupportChain chain = new ValidationSupportChain(
        new DefaultProfileValidationSupport(ctx),
        new CommonCodeSystemsTerminologyService(ctx),
        new InMemoryTerminologyServerValidationSupport(ctx),
        new SnapshotGeneratingValidationSupport(ctx));
    FhirInstanceValidator module = new FhirInstanceValidator(chain);
    module.setAnyExtensionsAllowed(true);
    validator = ctx.newValidator().registerValidatorModule(module);
  }

  private void check(String name, boolean ok, String detail) {
    if (ok) {
      passed++;
      System.out.println("PASS " + name);
    } else {
      failed++;
      System.out.println("FAIL " + name + ": " + detail);
    }
  }

  /** Validates what the node served; errors (not warnings about unknown code systems) fail. */
  private void validate(String name, IBaseResource res) {
    ValidationResult r = validator.validateWithResult(res);
    List<String> errors = new ArrayList<>();
    for (SingleValidationMessage m : r.getMessages()) {
      if (m.getSeverity() == ResultSeverityEnum.ERROR || m.getSeverity() == ResultSeverityEnum.FATAL) {
        errors.add(m.getLocationString() + ": " + m.getMessage());
      }
    }
    check("valid R4 " + name, errors.isEmpty(), String.join("; ", errors) + "\n" + ctx.newJsonParser().encodeResourceToString(res));
  }

  private Patient patient(String family, String mrn) {
    Patient p = new Patient();
    p.addName().setFamily(family).addGiven("Grace");
    p.setGender(Enumerations.AdministrativeGender.FEMALE);
    p.addIdentifier().setSystem("urn:carehub-test:mrn").setValue(mrn);
    return p;
  }

  private Observation heartRate(String subject, double value, String ucum) {
    Observation o = new Observation();
    o.setStatus(Observation.ObservationStatus.FINAL);
    o.addCategory(new CodeableConcept().addCoding(new Coding("http://terminology.hl7.org/CodeSystem/observation-category", "vital-signs", "Vital Signs")));
    o.setCode(new CodeableConcept().addCoding(new Coding("http://loinc.org", "8867-4", "Heart rate")));
    o.setSubject(new Reference(subject));
    o.setEffective(new org.hl7.fhir.r4.model.DateTimeType(new Date()));
    o.setValue(new Quantity().setValue(value).setUnit("beats/minute").setSystem("http://unitsofmeasure.org").setCode(ucum));
    return o;
  }

  private void run(String tag, String riskPatient) {
    CapabilityStatement cs = client.capabilities().ofType(CapabilityStatement.class).execute();
    check("metadata is R4", "4.0.1".equals(cs.getFhirVersion().toCode()), cs.getFhirVersion().toCode());
    validate("CapabilityStatement", cs);

    // create, read
    MethodOutcome created = client.create().resource(patient("Hopper" + tag, "mrn-" + tag)).execute();
    IdType id = (IdType) created.getId();
    check("create 201 with id and version", Boolean.TRUE.equals(created.getCreated()) && id.getIdPart().startsWith("pat-") && "1".equals(id.getVersionIdPart()), String.valueOf(id));
    Patient read = client.read().resource(Patient.class).withId(id.getIdPart()).execute();
    check("read", ("Hopper" + tag).equals(read.getNameFirstRep().getFamily()), read.getIdElement().getValue());
    validate("Patient", read);

    // conditional create: the same identifier finds the patient
    MethodOutcome again = client.create().resource(patient("Other" + tag, "mrn-" + tag))
        .conditional().where(Patient.IDENTIFIER.exactly().systemAndCode("urn:carehub-test:mrn", "mrn-" + tag)).execute();
    check("conditional create finds the existing patient", !Boolean.TRUE.equals(again.getCreated()) && id.getIdPart().equals(again.getId().getIdPart()), String.valueOf(again.getId()));

    // search with paging
    for (int i = 0; i < 4; i++) {
      client.create().resource(patient("Paged" + tag, "paged-" + i + "-" + tag)).execute();
    }
    Bundle page = client.search().forResource(Patient.class).where(Patient.FAMILY.matches().value("Paged" + tag))
        .count(3).returnBundle(Bundle.class).execute();
    check("search total and first page", page.getTotal() == 4 && page.getEntry().size() == 3 && page.getLink(Bundle.LINK_NEXT) != null, page.getTotal() + " " + page.getEntry().size());
    validate("searchset Bundle", page);
    Bundle next = client.loadPage().next(page).execute();
    check("next page", next.getEntry().size() == 1 && next.getLink(Bundle.LINK_NEXT) == null, String.valueOf(next.getEntry().size()));

    // transaction: a patient and its observation
    Bundle tx = new Bundle().setType(Bundle.BundleType.TRANSACTION);
    tx.addEntry().setFullUrl("urn:uuid:0b5f2e3c-9a61-4d8e-b2a4-000000000001").setResource(patient("Tx" + tag, "tx-" + tag))
        .getRequest().setMethod(Bundle.HTTPVerb.POST).setUrl("Patient");
    tx.addEntry().setResource(heartRate("urn:uuid:0b5f2e3c-9a61-4d8e-b2a4-000000000001", 71, "/min"))
        .getRequest().setMethod(Bundle.HTTPVerb.POST).setUrl("Observation");
    Bundle resp = client.transaction().withBundle(tx).execute();
    check("transaction-response", resp.getType() == Bundle.BundleType.TRANSACTIONRESPONSE && resp.getEntry().size() == 2
        && resp.getEntry().get(1).getResponse().getStatus().startsWith("201"), ctx.newJsonParser().encodeResourceToString(resp));
    validate("transaction-response Bundle", resp);
    String txPatient = new IdType(resp.getEntry().get(0).getResponse().getLocation()).getIdPart();

    // a bad transaction: refused whole, an OperationOutcome naming the element, nothing stored
    Bundle bad = new Bundle().setType(Bundle.BundleType.TRANSACTION);
    bad.addEntry().setFullUrl("urn:uuid:0b5f2e3c-9a61-4d8e-b2a4-000000000002").setResource(patient("Refused" + tag, "refused-" + tag))
        .getRequest().setMethod(Bundle.HTTPVerb.POST).setUrl("Patient");
    bad.addEntry().setResource(heartRate("urn:uuid:0b5f2e3c-9a61-4d8e-b2a4-000000000002", 71, "kg"))
        .getRequest().setMethod(Bundle.HTTPVerb.POST).setUrl("Observation");
    try {
      client.transaction().withBundle(bad).execute();
      check("bad transaction refused", false, "accepted");
    } catch (BaseServerResponseException e) {
      OperationOutcome oo = (OperationOutcome) e.getOperationOutcome();
      boolean named = oo != null && oo.getIssue().stream().anyMatch(i -> i.getExpression().stream().anyMatch(x -> x.getValue().contains("valueQuantity")));
      check("bad transaction refused naming the element", e.getStatusCode() == 422 && named, e.getStatusCode() + " " + e.getMessage());
      if (oo != null) {
        validate("OperationOutcome", oo);
      }
    }
    Bundle refused = client.search().forResource(Patient.class).where(Patient.FAMILY.matches().value("Refused" + tag)).returnBundle(Bundle.class).execute();
    check("nothing of the refused transaction stored", refused.getTotal() == 0, String.valueOf(refused.getTotal()));

    // the observation, once the writer has stored it: search, read, validate
    Bundle obs = null;
    long deadline = System.currentTimeMillis() + 30_000;
    while (System.currentTimeMillis() < deadline) {
      obs = client.search().forResource(Observation.class).where(Observation.PATIENT.hasId(txPatient))
          .and(Observation.CODE.exactly().systemAndCode("http://loinc.org", "8867-4")).include(Observation.INCLUDE_PATIENT)
          .returnBundle(Bundle.class).execute();
      if (obs.getTotal() == 1) {
        break;
      }
      try {
        Thread.sleep(100); // polling the condition, bounded by the deadline
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
    check("observation searchable with its patient included", obs != null && obs.getTotal() == 1 && obs.getEntry().size() == 2, obs == null ? "none" : String.valueOf(obs.getTotal()));
    if (obs != null && obs.getTotal() == 1) {
      validate("Observation searchset with _include", obs);
      Observation o = client.read().resource(Observation.class).withId(obs.getEntryFirstRep().getResource().getIdElement().getIdPart()).execute();
      validate("Observation", o);
    }

    if (riskPatient != null) {
      Bundle ra = client.search().forResource(RiskAssessment.class).where(RiskAssessment.SUBJECT.hasId("Patient/" + riskPatient)).returnBundle(Bundle.class).execute();
      check("RiskAssessment search", ra.getTotal() >= 1, String.valueOf(ra.getTotal()));
      validate("RiskAssessment searchset", ra);
    }

    // an unknown resource id: 404 with an OperationOutcome
    try {
      client.read().resource(Patient.class).withId("pat-01jy0000000000000000000000").execute();
      check("unknown patient 404", false, "found");
    } catch (BaseServerResponseException e) {
      check("unknown patient 404", e.getStatusCode() == 404, String.valueOf(e.getStatusCode()));
      if (e.getOperationOutcome() != null) {
        validate("OperationOutcome (404)", e.getOperationOutcome());
      }
    }
  }

  public static void main(String[] args) {
    RoundTrip rt = new RoundTrip(args[0], args[1]);
    try {
      rt.run(args[2], args.length > 3 ? args[3] : null);
    } catch (RuntimeException e) {
      rt.check("round trip ran to the end", false, e.toString());
      e.printStackTrace();
    }
    System.out.println(rt.passed + " passed, " + rt.failed + " failed");
    System.exit(rt.failed == 0 ? 0 : 1);
  }
}
