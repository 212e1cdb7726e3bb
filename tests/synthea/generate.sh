#!/usr/bin/env bash
# Generates the Synthea patients api/fhir's TestSyntheaTransactions loads: Synthea 3.3.0 from
# Maven Central (tests/synthea/pom.xml, resolved into CAREHUB_M2_REPO), a fixed seed, a fixed
# reference date and FHIR R4 output only (transaction Bundles, one per patient, and the hospital
# and practitioner Bundles), base R4 without US Core profiles (the offline validator has R4's
# StructureDefinitions, not US Core's).
#
#   tests/synthea/generate.sh [OUT_DIR]     default $CAREHUB_SYNTHEA_DIR or ~/.cache/carehub/synthea
#
# SYNTHEA_PATIENTS is how many living patients (default 3, what the tests load; the Bulk Data
# benchmark asks for 1,000 in a directory of its own).
#
# OUT_DIR/fhir holds the Bundles. A stamp of this script and the pom makes a second run a no-op;
# change either and the patients are made again. The same seed and options give the same patients.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${CAREHUB_SYNTHEA_DIR:-$HOME/.cache/carehub/synthea}}
m2=${CAREHUB_M2_REPO:-$HOME/.cache/carehub/m2}
java=${JAVA:-java}

patients=${SYNTHEA_PATIENTS:-3}
[[ $patients =~ ^[1-9][0-9]*$ ]] || { echo "generate.sh: SYNTHEA_PATIENTS=$patients is not a count" >&2; exit 1; }

# What decides the patients: Synthea's version (the pom), this script (its options), the count.
stamp=$( (cat "$here/pom.xml" "$here/generate.sh" && echo "$patients") | sha256sum | cut -d' ' -f1)
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] && [ -d "$out/fhir" ]; then
	exit 0
fi

command -v mvn >/dev/null || { echo "generate.sh: mvn not found (Java 17 and Maven: make test-deps)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$m2" -f "$here/pom.xml" dependency:build-classpath -Dmdep.outputFile="$tmp/classpath" >"$tmp/mvn.log" 2>&1 || { cat "$tmp/mvn.log" >&2; exit 1; }

rm -rf "$out/fhir" "$out/stamp" "$out/synthea.log" # what this script wrote there, nothing else
mkdir -p "$out"
# -s/-cs: the population's and the clinicians' seeds; -r: the reference date (today's otherwise);
# -p living patients (3 unless SYNTHEA_PATIENTS) aged 1 to 40 (a few hundred entries each), Massachusetts (Synthea's own
# demographics). Every other exporter off.
(cd "$tmp" && "$java" -Xmx2g -cp "$(cat "$tmp/classpath")" App \
	-s 42 -cs 42 -r 20250101 -p "$patients" -a 1-40 \
	--exporter.baseDirectory="$out" \
	--exporter.fhir.export=true --exporter.fhir.transaction_bundle=true --exporter.fhir.use_us_core_ig=false \
	--exporter.hospital.fhir.export=true --exporter.practitioner.fhir.export=true \
	--exporter.fhir_stu3.export=false --exporter.fhir_dstu2.export=false --exporter.fhir.bulk_data=false \
	--exporter.ccda.export=false --exporter.csv.export=false --exporter.text.export=false \
	--exporter.metadata.export=false --exporter.clinical_note.export=false \
	--generate.only_alive_patients=true \
	Massachusetts) >"$out/synthea.log" 2>&1 || { tail -20 "$out/synthea.log" >&2; exit 1; }
ls "$out"/fhir/*.json >/dev/null
echo "$stamp" >"$out/stamp"
grep -E '^[0-9]+ -- |^Records:' "$out/synthea.log" >&2 || true
