package fhir_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/kernel/ids"
	"carehub/storage/demo"
)

// m2Repo is the Maven repository the FHIR client project resolves from (make fhir-client-deps
// fills it; later runs are offline).
func m2Repo() string {
	if d := os.Getenv("CAREHUB_M2_REPO"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "carehub", "m2")
}

// TestHAPIClientRoundTrip runs HAPI FHIR's generic client (tests/fhir-client, one JVM) against a
// live node: create, read, search with paging, conditional create, a transaction and a refused
// one, _include, a RiskAssessment NEWS2 wrote; every resource the node returns is validated
// against the R4 StructureDefinitions by HAPI's FhirInstanceValidator.
func TestHAPIClientRoundTrip(t *testing.T) {
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		testenv.Missing(t, "mvn not found (the FHIR client suite needs Java 17 and Maven): run make test-deps")
		return
	}
	repo := m2Repo()
	if _, err := os.Stat(filepath.Join(repo, "ca", "uhn", "hapi", "fhir", "hapi-fhir-client")); err != nil {
		testenv.Missing(t, "HAPI FHIR is not in %s: run make fhir-client-deps (or make test-deps)", repo)
		return
	}
	s := servertest.Start(t)
	key := s.DemoKey()

	// A RiskAssessment to read: NEWS2 of the demo's deteriorating patient qualifies for a report.
	var agent string
	if err := s.Pool().QueryRow(t.Context(), `select id from agents where name = $1`, demo.Ward7AgentName).Scan(&agent); err != nil {
		t.Fatal(err)
	}
	g := s.GraphQL(key, `mutation($a: ID!, $p: String!) { runAgent(agentId: $a, patientId: $p) { status } }`,
		map[string]any{"a": agent, "p": demo.DeterioratingPatientID})
	if !strings.Contains(string(g.Data), "COMPLETED") {
		t.Fatalf("runAgent: %s %v", g.Data, g.Errors)
	}
	var reports int
	if err := s.Pool().QueryRow(t.Context(), `select count(*) from reports where patient_id = $1`, demo.DeterioratingPatientID).Scan(&reports); err != nil || reports == 0 {
		t.Fatalf("no report for the deteriorating patient: %d %v", reports, err)
	}

	args := strings.Join([]string{s.URL + "/fhir/R4", key, fmt.Sprint(time.Now().UnixNano()), ids.FHIR(demo.DeterioratingPatientID)}, " ")
	cmd := exec.CommandContext(t.Context(), mvn, "-B", "-q", "-o", "-Dmaven.repo.local="+repo, "-f", "../../tests/fhir-client/pom.xml",
		"compile", "exec:java", "-Dexec.args="+args)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("HAPI FHIR client:\n%s", out.String())
	if err != nil {
		t.Fatalf("the FHIR client round trip failed: %v", err)
	}
	if !strings.Contains(out.String(), " passed, 0 failed") {
		t.Fatalf("no summary line")
	}
}
