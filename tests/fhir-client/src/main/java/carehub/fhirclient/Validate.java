package carehub.fhirclient;

import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.context.support.DefaultProfileValidationSupport;
import ca.uhn.fhir.validation.FhirValidator;
import ca.uhn.fhir.validation.ResultSeverityEnum;
import ca.uhn.fhir.validation.SingleValidationMessage;
import ca.uhn.fhir.validation.ValidationResult;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;
import org.hl7.fhir.common.hapi.validation.support.CommonCodeSystemsTerminologyService;
import org.hl7.fhir.common.hapi.validation.support.InMemoryTerminologyServerValidationSupport;
import org.hl7.fhir.common.hapi.validation.support.SnapshotGeneratingValidationSupport;
import org.hl7.fhir.common.hapi.validation.support.ValidationSupportChain;
import org.hl7.fhir.common.hapi.validation.validator.FhirInstanceValidator;

/**
 * Validates FHIR R4 JSON files with HAPI's FhirInstanceValidator, offline, configured as
 * RoundTrip's is (the R4 StructureDefinitions, common code systems, in-memory terminology;
 * extensions and profiles it does not know are not errors). Arguments: directories (every *.json
 * in them, sorted) or files. Prints one line per file, "PASS name" or "FAIL name: errors", and
 * "N passed, N failed"; exits 1 on any failure. api/fhir's Synthea test runs it on every resource
 * carehub returned for a Synthea patient (mvn exec:java@validate).
 */
public final class Validate {
  private Validate() {}

  public static void main(String[] args) throws IOException {
    FhirContext ctx = FhirContext.forR4();
    ValidationSupportChain chain = new ValidationSupportChain(
        new DefaultProfileValidationSupport(ctx),
        new CommonCodeSystemsTerminologyService(ctx),
        new InMemoryTerminologyServerValidationSupport(ctx),
        new SnapshotGeneratingValidationSupport(ctx));
    FhirInstanceValidator module = new FhirInstanceValidator(chain);
    module.setAnyExtensionsAllowed(true);
    FhirValidator validator = ctx.newValidator().registerValidatorModule(module);

    List<Path> files = new ArrayList<>();
    for (String a : args) {
      Path p = Path.of(a);
      if (Files.isDirectory(p)) {
        try (Stream<Path> s = Files.list(p)) {
          s.filter(f -> f.toString().endsWith(".json")).sorted().forEach(files::add);
        }
      } else {
        files.add(p);
      }
    }
    int passed = 0, failed = 0;
    for (Path f : files) {
      String line = check(validator, f);
      System.out.println(line);
      if (line.startsWith("PASS ")) {
        passed++;
      } else {
        failed++;
      }
    }
    System.out.println(passed + " passed, " + failed + " failed");
    System.exit(failed == 0 ? 0 : 1);
  }

  /** "PASS name", or "FAIL name: errors" (warnings about unknown code systems do not fail). */
  private static String check(FhirValidator validator, Path f) {
    String name = f.getFileName().toString();
    List<String> errors = new ArrayList<>();
    try {
      ValidationResult r = validator.validateWithResult(Files.readString(f, StandardCharsets.UTF_8));
      for (SingleValidationMessage m : r.getMessages()) {
        if (m.getSeverity() == ResultSeverityEnum.ERROR || m.getSeverity() == ResultSeverityEnum.FATAL) {
          errors.add(m.getLocationString() + ": " + m.getMessage());
        }
      }
    } catch (IOException e) {
      errors.add("unreadable: " + e.getMessage());
    } catch (RuntimeException e) { // HAPI's DataFormatException and its other refusals of the input
      errors.add("unparseable: " + e.getMessage());
    }
    return errors.isEmpty() ? "PASS " + name : "FAIL " + name + ": " + String.join("; ", errors);
  }
}
